"""The routing table the controller publishes, from pure functions (agentflow/rollout/tables.py): the anchor takes
the share of a version without an endpoint, the order of the routes is the order of the serving versions, a table
changes only when its routing does, and a renewal comes once a third of the time to live has passed."""

import pytest

from agentflow.llm.routing import check_table
from agentflow.rollout.backends import Endpoint, Version
from agentflow.rollout.tables import TableContext, anchor, build_table, changes_routing, renewal

STABLE, CANARY, OLD = Version("v000002", "/s/2"), Version("v000003", "/s/3"), Version("v000001", "/s/1")
ENDPOINTS = {v: Endpoint(f"http://llm-{v.name}:8000/v1", v.name) for v in (STABLE, CANARY, OLD)}
CONTEXT = TableContext("planner", stable=STABLE.name, canary=CANARY.name, latest=CANARY.name, ttl_s=60)


@pytest.mark.parametrize("serving, stable, expected", [
    ({CANARY: 10, STABLE: 90}, STABLE, STABLE),
    ({CANARY: 50, STABLE: 50}, STABLE, STABLE),  # a tie: the stable version
    ({CANARY: 50, STABLE: 50}, None, CANARY),  # no stable known: the first of the heaviest
    ({CANARY: 75, STABLE: 25, OLD: 0}, STABLE, CANARY),
    ({STABLE: 100, OLD: 0}, STABLE, STABLE),
])
def test_the_anchor_is_where_most_trajectories_go(serving, stable, expected):
    assert anchor(serving, stable) == expected


@pytest.mark.parametrize("serving, known, weights", [
    ({CANARY: 10, STABLE: 90, OLD: 0}, (CANARY, STABLE, OLD), {"v000003": 10, "v000002": 90, "v000001": 0}),
    ({CANARY: 10, STABLE: 90}, (STABLE,), {"v000002": 100}),  # the canary's endpoint unknown yet
    ({CANARY: 75, STABLE: 25}, (CANARY,), {"v000003": 100}),
    ({CANARY: 50, STABLE: 50, OLD: 0}, (STABLE, OLD), {"v000002": 100, "v000001": 0}),
])
def test_a_share_without_an_endpoint_goes_to_the_anchor(serving, known, weights):
    endpoints = {v: ENDPOINTS[v] for v in known}
    table = build_table(serving, endpoints, CONTEXT, anchor_version=anchor(serving, STABLE), reason="r", now_ms=1000)
    assert {r.version: r.weight for r in table.routes} == weights
    assert [r.version for r in table.routes] == [v.name for v in serving if v in endpoints]  # in serving order
    assert table.expires_at_unix_ms == 61_000 and table.routes[0].endpoint == ENDPOINTS[next(iter(known))].url
    check_table(table)  # what callers accept


def test_a_table_changes_only_when_its_routing_does():
    serving = {CANARY: 10, STABLE: 90}
    first = build_table(serving, ENDPOINTS, CONTEXT, anchor_version=STABLE, reason="step", now_ms=1000)
    later = build_table(serving, ENDPOINTS, CONTEXT, anchor_version=STABLE, reason="tick", now_ms=9000)
    assert changes_routing(None, first) and not changes_routing(first, later)
    moved = build_table({CANARY: 25, STABLE: 75}, ENDPOINTS, CONTEXT, anchor_version=STABLE, reason="step",
                        now_ms=9000)
    assert changes_routing(first, moved)
    promoted = build_table(serving, ENDPOINTS, TableContext("planner", stable=CANARY.name), anchor_version=STABLE,
                           reason="promote", now_ms=9000)
    assert changes_routing(first, promoted)
    never = build_table(serving, ENDPOINTS, TableContext("planner"), anchor_version=STABLE, reason="r", now_ms=5)
    assert never.expires_at_unix_ms == 0


@pytest.mark.parametrize("ttl_s, age_ms, due", [(60, 19_999, False), (60, 20_000, True), (0, 10**9, False)])
def test_a_renewal_once_a_third_of_the_time_to_live_has_passed(ttl_s, age_ms, due):
    table = build_table({STABLE: 100}, ENDPOINTS, CONTEXT, anchor_version=STABLE, reason="step", now_ms=1000)
    renewed = renewal(table, ttl_s, 1000 + age_ms)
    assert (renewed is not None) == due and renewal(None, ttl_s, age_ms) is None
    if due:
        assert renewed.routes == table.routes and renewed.reason == "renewed"
        assert renewed.expires_at_unix_ms == 1000 + age_ms + ttl_s * 1000
