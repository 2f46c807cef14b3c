"""The gateway's API keys (``agentflow.services.gateway.keys``): hashed entries with names and scopes, the older
plain-text form, and the limits of the names a query may carry (``flow.loop.check_query``)."""

from __future__ import annotations

import hashlib

import pytest

from agentflow.errors import InvalidInput
from agentflow.flow.loop import LoopConfig, check_query
from agentflow.proto.v1 import events_pb2
from agentflow.services.gateway.keys import KeyRing, PermissionDenied, Unauthenticated, new_key, parse_entry


def test_a_new_key_is_stored_only_as_its_hash_and_finds_its_caller():
    key, entry = new_key("driver", ["train", "solve"])
    assert key.startswith("afk_") and len(key) > 40 and key not in entry
    assert entry == f"driver:solve+train:sha256:{hashlib.sha256(key.encode()).hexdigest()}"  # scopes in one order
    other, other_entry = new_key("app", ["solve", "feedback", "delegate"])
    ring = KeyRing([entry, other_entry])
    caller = ring.caller(key)
    assert caller.name == "driver" and caller.scopes == {"solve", "train"}
    assert ring.caller(other).scopes == {"solve", "feedback", "delegate"}
    for wrong in ("", "afk_wrong", entry, key + "x", "k" * 10_000):
        with pytest.raises(Unauthenticated):
            ring.caller(wrong)


def test_a_caller_without_a_scope_is_told_which_it_needs():
    key, entry = new_key("app", ["solve"])
    caller = KeyRing([entry]).caller(key)
    caller.require("solve", "ask")
    with pytest.raises(PermissionDenied, match="'app' may not send ground truth: that needs the scope 'train'"):
        caller.require("train", "send ground truth")


def test_a_plain_text_key_keeps_working_with_solve_and_feedback():
    ring = KeyRing(["old-secret"])
    caller = ring.caller("old-secret")
    assert caller.scopes == {"solve", "feedback"}
    assert caller.name == "key-" + hashlib.sha256(b"old-secret").hexdigest()[:8]  # a stable name, not the key


def test_without_keys_everyone_is_anonymous_with_the_configured_scopes():
    assert KeyRing([]).caller("anything").name == "anonymous"
    assert KeyRing([]).caller("").scopes == {"solve", "feedback"}
    assert KeyRing([], ["solve", "train", "delegate"]).caller("").scopes == {"solve", "train", "delegate"}


@pytest.mark.parametrize("entry, message", [
    ("app:solve+admin:sha256:" + "0" * 64, "unknown scope"),
    ("bad name:solve:sha256:" + "0" * 64, "API key name"),
    ("", "empty"),
])
def test_bad_entries_are_refused_with_the_reason(entry, message):
    with pytest.raises(InvalidInput, match=message):
        parse_entry(entry)


def test_names_are_unique_and_new_keys_check_their_flags():
    _, entry = new_key("app", ["solve"])
    with pytest.raises(InvalidInput, match="unique"):
        KeyRing([entry, entry])
    with pytest.raises(InvalidInput, match="key name"):
        new_key("a/b", ["solve"])
    with pytest.raises(InvalidInput, match="--scopes"):
        new_key("app", [])
    with pytest.raises(InvalidInput, match="unknown scope"):
        KeyRing([], ["root"])


@pytest.mark.parametrize("fields", [
    dict(group_id="g" * 129), dict(group_id="g\n1"), dict(owner="o" * 129),
    dict(options=events_pb2.QueryOptions(planner_version="v1\r\nSet-Cookie: x")),
    dict(options=events_pb2.QueryOptions(planner_version="v\u00e9")),
    dict(options=events_pb2.QueryOptions(planner_version="v" * 129)),
    dict(options=events_pb2.QueryOptions(tools=["python"] * 33)),
    dict(options=events_pb2.QueryOptions(tools=["py thon"])),
])
def test_every_name_in_a_query_is_bounded(fields):
    with pytest.raises(InvalidInput):
        check_query(events_pb2.Query(query="What is 2 + 2?", **fields), LoopConfig())


def test_ordinary_names_pass():
    query = events_pb2.Query(query="What is 2 + 2?", group_id="q17/3fa2b 1", owner="app",
                             options=events_pb2.QueryOptions(planner_version="v000012", tools=["python", "search"]))
    assert check_query(query, LoopConfig()) == "What is 2 + 2?"
