"""The routing table the controller publishes, as pure functions of what it knows: which versions serve with which
weights, where each is served, and the table in force (docs/routing.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from agentflow.llm.routing import Route, RoutingTable
from agentflow.rollout.backends import Endpoint, Version


@dataclass(frozen=True)
class TableContext:
    """What a table names besides its routes."""

    deployment: str
    stable: str = ""
    canary: str = ""  # "" until the canary is ready
    latest: str = ""
    pin_endpoint: str = ""
    fleet_endpoint: str = ""  # "" while the fleet holds nothing
    fleet_versions: tuple[str, ...] = ()
    fleet_model: str = ""
    ttl_s: float = 0.0  # 0: the table never expires


def anchor(serving: dict[Version, int], stable: Version | None) -> Version:
    """Where most trajectories go (the stable version on a tie): it takes the share of a version without an
    endpoint, and without its own endpoint no table is built."""
    return max(serving, key=lambda v: (serving[v], v == stable))


def build_table(serving: dict[Version, int], endpoints: dict[Version, Endpoint], context: TableContext, *,
                anchor_version: Version, reason: str, now_ms: int) -> RoutingTable:
    """The table for ``serving`` ({version: weight} in route order); a version missing from ``endpoints`` is left out
    and its weight goes to ``anchor_version``, which must be in ``endpoints``."""
    missing = sum(weight for version, weight in serving.items() if version not in endpoints)
    routes = tuple(Route(v.name, endpoints[v].url, endpoints[v].model, w + missing * (v == anchor_version))
                   for v, w in serving.items() if v in endpoints)
    return RoutingTable(
        deployment=context.deployment, routes=routes, stable=context.stable, canary=context.canary,
        latest=context.latest, pin_endpoint=context.pin_endpoint, decided_at_unix_ms=now_ms, reason=reason,
        expires_at_unix_ms=now_ms + int(context.ttl_s * 1000) if context.ttl_s else 0,
        fleet_endpoint=context.fleet_endpoint, fleet_versions=context.fleet_versions, fleet_model=context.fleet_model)


def changes_routing(last: RoutingTable | None, table: RoutingTable) -> bool:
    """Whether ``table`` routes differently from ``last`` (its time and reason aside)."""
    def what(t: RoutingTable):
        return t.routes, t.stable, t.canary, t.latest, t.fleet_versions

    return last is None or what(last) != what(table)


def renewal(last: RoutingTable | None, ttl_s: float, now_ms: int) -> RoutingTable | None:
    """The table in force with a new expiry, once a third of its time to live has passed (None: not due)."""
    ttl_ms = int(ttl_s * 1000)
    if last is None or not ttl_ms or now_ms - last.decided_at_unix_ms < ttl_ms / 3:
        return None
    return replace(last, decided_at_unix_ms=now_ms, expires_at_unix_ms=now_ms + ttl_ms, reason="renewed")
