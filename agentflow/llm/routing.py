"""Routing by trajectory, in the caller: the planner's client follows its deployment's routing table.

The rollout controller publishes a table on ``planner.routing`` (compacted, one record per deployment): for each
live planner version its OpenAI-compatible endpoint, the model name to send and a weight (percent, summing to 100).
A trajectory's arm is fixed by its id: ``bucket(id)`` (0..99, a hash) falls into one route's band — the routes take
the buckets in table order, the canary first, so that a growing canary takes buckets from the stable version and a
trajectory id keeps its band. Every later planner call of the trajectory carries the version its first call was
served by (``Sampling.trajectory_version``: the memory service puts it on ``memory.updated``, the in-process loop
keeps it) and goes to that version while the table (or the pin endpoint) serves it — so no trajectory mixes
versions, whichever planner replica makes each call and however the weights change meanwhile.

A version withdrawn mid-trajectory (a rollback) is not served any more: the trajectory's remaining calls go where
its id routes now. It is then "mixed", and the controller leaves it out, rather than failing the user's query.

Pins (``Sampling.model_version``): ``latest`` names the table's most recently published version, any other pin a
version by name; each goes to that version's route, else to the table's ``pin_endpoint`` (a server that loads
every version, asked with the ``x-model-version-pin`` header), else the call is refused (``not_found``).

The rollout fleet (``fleet_endpoint``, ``fleet_versions``; ``agentflow.rollout.fleet``): a server that only pinned
calls use — training rollouts and evaluations, never users' traffic — holding the newest published versions, each
under its own model name. A pinned call goes there first when the fleet holds its version; ``latest`` there is the
newest published version once the fleet has loaded it, the newest one it holds until then (a bounded lag). An
unpinned trajectory never goes to the fleet, even for a version it holds.

Tables expire (``expires_at_unix_ms``; the controller renews them, ``RolloutSettings.routing_ttl_s``): a table past
its expiry means its controller is gone, and every call, pinned or not, goes to the stable version rather than
holding a canary split nobody watches. A failed call to another version's endpoint (the canary's server died) is
made again on the stable version within the same turn; the turn records the stable version, so the trajectory
counts as mixed and the controller leaves it out of the comparison.

The table is a trust boundary (whoever can write the topic could send planner calls, with their API key, anywhere):
a table is taken only whole and valid — weights that are integers summing to 100, unique versions, and every
endpoint matching one of the allowed URL patterns (``fnmatch``) — otherwise it is rejected, logged and counted,
and the previous table stays in force. Before any table arrives, calls go to the configured endpoint as before.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Sequence
from urllib.parse import urlsplit

from agentflow.errors import EngineError, EngineTimeout, InvalidInput, Reason
from agentflow.llm.base import Completion, Message, Sampling
from agentflow.llm.openai_engine import OpenAIEngine, OpenAIEngineConfig
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.versions import check_version_name, parse_version

log = logging.getLogger(__name__)

BUCKETS = 100
MAX_ROUTES = 16  # more live versions than this in one table is a bug upstream, not a canary
_CLIENTS = 16  # HTTP clients kept, one per (endpoint, model)


def bucket(key: str) -> int:
    """A trajectory id's bucket in 0..99 (stable across processes and releases: it must not depend on the hash seed)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % BUCKETS


def routing_key(deployment: str) -> str:
    """The record key (and envelope trajectory id) of a deployment's table on ``planner.routing``."""
    return f"routing:{deployment}"


@dataclass(frozen=True)
class Route:
    version: str
    endpoint: str  # OpenAI base URL, including /v1
    model: str
    weight: int  # percent of new trajectories


@dataclass(frozen=True)
class RoutingTable:
    deployment: str
    routes: tuple[Route, ...]
    stable: str = ""
    canary: str = ""
    latest: str = ""  # most recently published version: what "latest" pins
    pin_endpoint: str = ""
    decided_at_unix_ms: int = 0
    reason: str = ""
    fleet_endpoint: str = ""  # the rollout fleet's OpenAI base URL ("": none)
    fleet_versions: tuple[str, ...] = ()  # loaded there now, newest first
    fleet_model: str = ""  # the fleet's one model name for every version ("": each version's own name)
    expires_at_unix_ms: int = 0  # stale after this: everything to the stable version (0: never)

    def stable_route(self) -> Route:
        """The stable version's route (the heaviest one when the table names no stable version it routes)."""
        return next((r for r in self.routes if r.version == self.stable), None) or \
            max(self.routes, key=lambda r: r.weight)

    def expired(self, now_ms: int) -> bool:
        return 0 < self.expires_at_unix_ms < now_ms

    def pick(self, key: str) -> Route:
        """The route of a trajectory's first call: its bucket's band (routes in table order)."""
        point, edge = bucket(key), 0
        for route in self.routes:
            edge += route.weight
            if point < edge:
                return route
        raise AssertionError("a checked table's weights cover every bucket")

    def find(self, version: str, *, pinned: bool = False) -> Route | None:
        """The route serving ``version`` ("latest": the newest published one): for a ``pinned`` call the fleet's when
        it holds the version; else the table's route; else the pin endpoint's when there is one; None when nothing
        serves it."""
        if version == "latest":
            version = self.latest or max((r.version for r in self.routes), key=lambda v: parse_version(v) or -1)
            if pinned and self.fleet_versions and version not in self.fleet_versions:
                version = self.fleet_versions[0]  # published, not loaded on the fleet yet: the newest it holds
        if pinned and version in self.fleet_versions:
            return Route(version, self.fleet_endpoint, self.fleet_model or version, 0)
        route = next((r for r in self.routes if r.version == version), None)
        if route is None and self.pin_endpoint:
            route = Route(version, self.pin_endpoint, "", 0)  # model "": the pin header selects the version
        return route

    def to_proto(self) -> pb.PlannerRouting:
        return pb.PlannerRouting(
            deployment=self.deployment, stable_version=self.stable, canary_version=self.canary,
            latest_version=self.latest, pin_endpoint=self.pin_endpoint, decided_at_unix_ms=self.decided_at_unix_ms,
            reason=self.reason, fleet_endpoint=self.fleet_endpoint, fleet_versions=self.fleet_versions,
            fleet_model=self.fleet_model, expires_at_unix_ms=self.expires_at_unix_ms,
            routes=[pb.PlannerRoute(version=r.version, endpoint=r.endpoint, model=r.model, weight=r.weight)
                    for r in self.routes])

    @classmethod
    def from_proto(cls, message: pb.PlannerRouting) -> RoutingTable:
        return cls(deployment=message.deployment, stable=message.stable_version, canary=message.canary_version,
                   latest=message.latest_version, pin_endpoint=message.pin_endpoint,
                   decided_at_unix_ms=message.decided_at_unix_ms, reason=message.reason,
                   fleet_endpoint=message.fleet_endpoint, fleet_versions=tuple(message.fleet_versions),
                   fleet_model=message.fleet_model, expires_at_unix_ms=message.expires_at_unix_ms,
                   routes=tuple(Route(r.version, r.endpoint, r.model, r.weight) for r in message.routes))


def check_table(table: RoutingTable, allowed_endpoints: Sequence[str] = ("*",)) -> RoutingTable:
    """``table`` if it can be followed as it is; otherwise ``InvalidInput`` saying why (nothing of it is used)."""
    if not table.deployment:
        raise InvalidInput("a routing table needs its deployment")
    if not table.routes or len(table.routes) > MAX_ROUTES:
        raise InvalidInput(f"a routing table needs 1 to {MAX_ROUTES} routes, got {len(table.routes)}")
    names = [r.version for r in table.routes]
    if len(set(names)) != len(names) or not all(names):
        raise InvalidInput(f"route versions must be named and unique, got {names}")
    for route in table.routes:
        if isinstance(route.weight, bool) or not isinstance(route.weight, int) or not 0 <= route.weight <= BUCKETS:
            raise InvalidInput(f"the weight of {route.version} must be an integer percent, got {route.weight!r}")
        _check_endpoint(route.endpoint, allowed_endpoints, route.version)
    total = sum(r.weight for r in table.routes)
    if total != BUCKETS:
        raise InvalidInput(f"route weights must sum to 100, got {total} "
                           f"({', '.join(f'{r.version} {r.weight}' for r in table.routes)})")
    if table.pin_endpoint:
        _check_endpoint(table.pin_endpoint, allowed_endpoints, "the pin endpoint")
    _check_fleet(table, allowed_endpoints)
    if table.expires_at_unix_ms < 0:
        raise InvalidInput(f"expires_at_unix_ms must not be negative, got {table.expires_at_unix_ms}")
    return table


def _check_fleet(table: RoutingTable, allowed: Sequence[str]) -> None:
    fleet = table.fleet_versions
    if not (table.fleet_endpoint or fleet):
        return
    if not (table.fleet_endpoint and fleet):
        raise InvalidInput("a rollout fleet needs both its endpoint and the versions it holds")
    if len(fleet) > MAX_ROUTES or len(set(fleet)) != len(fleet):
        raise InvalidInput(f"the fleet's versions must be 1 to {MAX_ROUTES} unique names, got {list(fleet)[:20]}")
    for name in (*fleet, *([table.fleet_model] if table.fleet_model else [])):
        try:
            check_version_name(name)  # it becomes the model name of a request
        except InvalidInput as e:
            raise InvalidInput(f"the fleet's versions and model: {e}") from None
    if table.fleet_model and len(fleet) != 1:
        raise InvalidInput(f"a fleet that serves every version as {table.fleet_model!r} holds one version at a time, "
                           f"not {len(fleet)}")
    _check_endpoint(table.fleet_endpoint, allowed, "the rollout fleet")


def _check_endpoint(url: str, allowed: Sequence[str], what: str) -> None:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number (a host smuggled into it)
    except ValueError:
        raise InvalidInput(f"the endpoint of {what} has a bad port: {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise InvalidInput(f"the endpoint of {what} must be an http(s) URL without credentials, got {url!r}")
    if not any(fnmatch.fnmatchcase(url, pattern) for pattern in allowed):
        raise InvalidInput(f"the endpoint of {what}, {url}, is not an allowed endpoint "
                           f"(AGENTFLOW_PLANNER_ROUTING_ENDPOINTS: {', '.join(allowed) or 'none'})")


def default_allowed(endpoint: str) -> tuple[str, ...]:
    """Without a configured allow-list: only the configured endpoint's own origin."""
    parts = urlsplit(endpoint)
    return (f"{parts.scheme}://{parts.netloc}/*",) if parts.scheme and parts.netloc else ()


class RoutedEngine:
    """An ``Engine`` that sends each call where the deployment's routing table says (the module docstring).
    ``update`` takes a new table (from ``follow_routing``); ``table`` is the one in force (None: none yet, calls go
    to ``config``'s endpoint)."""

    supports_structured_output = True

    def __init__(self, config: OpenAIEngineConfig, deployment: str, *, allowed_endpoints: Sequence[str] = (),
                 transport=None, wait_s: float = 0.0):
        self.config, self.deployment, self.wait_s = config, deployment, wait_s
        self.allowed = tuple(allowed_endpoints) or default_allowed(config.endpoint)
        self.supports_structured_output = config.structured_output
        self.table: RoutingTable | None = None
        self.ready = threading.Event()  # set once a table is in force
        self._transport = transport  # tests: an httpx transport for every client
        self._fallback = self._new_client(config)
        self._clients: OrderedDict[tuple[str, str], OpenAIEngine] = OrderedDict()
        self._lock = threading.Lock()
        self._stop_following = threading.Event()
        from agentflow.llm.metrics import routing_metrics

        self.metrics = routing_metrics()

    def update(self, table: RoutingTable) -> bool:
        """Take ``table`` if it is this deployment's, valid and not older than the one in force; False otherwise
        (the one in force stays)."""
        if table.deployment != self.deployment:
            return False
        try:
            check_table(table, self.allowed)
        except InvalidInput as e:
            log.error("routing table of %s rejected, keeping the previous one: %s", self.deployment, e)
            self.metrics.tables.labels("rejected").inc()
            return False
        current = self.table
        if current is not None and table.decided_at_unix_ms < current.decided_at_unix_ms:
            self.metrics.tables.labels("stale").inc()
            return False
        self.table = table
        self.ready.set()
        self.metrics.tables.labels("accepted").inc()
        log.info("routing %s: %s (%s)", self.deployment,
                 ", ".join(f"{r.version} {r.weight}%" for r in table.routes), table.reason or "no reason given")
        return True

    def wait_for_table(self) -> bool:
        """Block up to ``wait_s`` for the first table (the planner's start: nothing is consumed before); False, with
        a warning, when none came, and calls go to the configured endpoint until one does."""
        if self.ready.wait(self.wait_s):
            return True
        log.warning("no routing table for deployment %s after %g s: calls go to %s until one arrives",
                    self.deployment, self.wait_s, self.config.endpoint)
        return False

    def route(self, key: str, sampling: Sampling) -> tuple[Route | None, str]:
        """The route of one call and how it was chosen (trajectory, pin, fleet, hash; expired: the table's controller
        stopped renewing it, so the stable version); (None, "fallback") without a table."""
        table = self.table
        if table is None:
            return None, "fallback"
        if table.expired(int(time.time() * 1000)):
            return table.stable_route(), "expired"
        pinned = bool(sampling.model_version)  # only pinned calls may go to the rollout fleet

        def how(route: Route, otherwise: str) -> str:
            return "fleet" if pinned and route.endpoint == table.fleet_endpoint else otherwise

        if sampling.trajectory_version and (route := table.find(sampling.trajectory_version, pinned=pinned)):
            return route, how(route, "trajectory")
        if pinned:
            route = table.find(sampling.model_version, pinned=True)
            if route is None:
                raise EngineError(f"planner version {sampling.model_version!r} is not served by deployment "
                                  f"{self.deployment} (it routes {', '.join(r.version for r in table.routes)})",
                                  reason=Reason.NOT_FOUND)
            return route, how(route, "pin")
        return table.pick(key or secrets.token_hex(8)), "hash"  # a call without a trajectory: anywhere by weight

    def complete(self, messages: Sequence[Message], sampling: Sampling, *, timeout: float,
                 json_schema: dict | None = None, key: str = "") -> Completion:
        route, how = self.route(key, sampling)
        self.metrics.calls.labels(how).inc()
        if route is None:
            return self._fallback.complete(messages, replace(sampling, trajectory_version=""), timeout=timeout,
                                           json_schema=json_schema, key=key)
        started = time.monotonic()
        try:
            return self._complete_on(route, messages, sampling, timeout, json_schema, key)
        except EngineTimeout:
            raise  # no time left for a second call
        except EngineError as e:
            stable = self.table.stable_route() if self.table is not None else None
            left = timeout - (time.monotonic() - started)
            if how not in ("hash", "trajectory") or stable is None or stable.version == route.version or left <= 0:
                raise  # a pinned call wants its version; the stable version's own failure is the caller's
            log.warning("%s (%s) failed, the turn goes to the stable version %s: %s", route.endpoint,
                        route.version, stable.version, e)
            self.metrics.fallbacks.inc()
            return self._complete_on(stable, messages, sampling, left, json_schema, key)

    def _complete_on(self, route: Route, messages, sampling: Sampling, timeout: float, json_schema, key: str):
        client = self._client(route)
        pinned = replace(sampling, model_version=route.version, trajectory_version="")
        completion = client.complete(messages, pinned, timeout=timeout, json_schema=json_schema, key=key)
        reported = completion.model_version
        if reported and reported not in (route.version, route.model):
            log.warning("%s answered as %r, the table named %r: recording what the server reported",
                        route.endpoint, reported, route.version)
            self.metrics.mismatches.inc()
            return completion
        completion.model_version = route.version
        return completion

    def _client(self, route: Route) -> OpenAIEngine:
        key = (route.endpoint, route.model or self.config.model)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = self._new_client(replace(self.config, endpoint=route.endpoint,
                                                                       model=key[1]))
                if len(self._clients) > _CLIENTS:
                    self._clients.popitem(last=False)[1].close()
            self._clients.move_to_end(key)
            return client

    def _new_client(self, config: OpenAIEngineConfig) -> OpenAIEngine:
        return OpenAIEngine(config, transport=self._transport)

    def follow(self, bus) -> RoutedEngine:
        """Follow the deployment's table on ``bus`` in a background thread (until ``close``)."""
        threading.Thread(target=follow_routing, args=(self, bus, self._stop_following), daemon=True,
                         name=f"follow-routing-{self.deployment}").start()
        return self

    def close(self) -> None:
        self._stop_following.set()
        with self._lock:
            clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in [self._fallback, *clients]:
            client.close()


def follow_routing(engine: RoutedEngine, bus, stop: threading.Event) -> None:
    """Until ``stop``: read ``planner.routing`` from its beginning and hand each of the deployment's tables to
    ``engine.update`` (a compacted topic: the newest record per deployment is the table in force)."""
    from agentflow.bus import topics
    from agentflow.bus.clients import Follower
    from agentflow.bus.codec import DecodeError

    wanted = routing_key(engine.deployment).encode()

    def handle(record) -> None:
        if record.key not in (None, wanted):
            return
        try:
            envelope = record.envelope()
        except DecodeError as e:
            log.error("undecodable record on %s at %d@%d: %s", topics.PLANNER_ROUTING, record.partition,
                      record.offset, e)
            engine.metrics.tables.labels("rejected").inc()
            return
        if envelope.WhichOneof("payload") == "planner_routing":
            engine.update(RoutingTable.from_proto(envelope.planner_routing))

    Follower(bus, [topics.PLANNER_ROUTING], handle, stop=stop, name="follow-routing", poll_s=0.2,
             on_connect=lambda: topics.ensure_topics(bus, [topics.PLANNER_ROUTING])).run()
