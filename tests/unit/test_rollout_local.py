"""The local backend against a fake of serve-llm's admin API on 127.0.0.1 (tests/unit/rollout_admin_fake.py).

A logic test: the fake keeps versions and weights and applies the contract's checks, but loads no model and routes
no chat traffic; the end-to-end test against the real `agentflow serve-llm` comes with the server's admin API.
"""

import pytest

from agentflow.errors import InvalidInput
from agentflow.rollout.backends import (BackendError, Endpoint, LocalBackend, UnknownVersion, Version, VersionRejected,
                                        check_weights)
from tests.unit.rollout_admin_fake import FakeAdmin

STABLE = Version("v0", "file:///ckpt/v0")
CANARY = Version("v1", "file:///ckpt/v1")


@pytest.fixture
def admin():
    with FakeAdmin() as fake:
        yield fake


def backend(fake, **kwargs):
    return LocalBackend(fake.url + "/v1", sleep=lambda s: None, **kwargs)  # the /v1 suffix is dropped


def test_canary_steps_and_promotion(admin):
    b = backend(admin)
    assert [(v.name, v.weight) for v in b.status().versions] == [("v0", 100)]
    b.load_canary(CANARY, STABLE, 10)
    assert admin.weights() == {"v0": 90, "v1": 10}
    b.set_percent(CANARY, STABLE, 50)
    assert admin.weights() == {"v0": 50, "v1": 50}
    b.promote(CANARY, STABLE)
    assert admin.weights() == {"v1": 100, "v0": 0}  # the old stable stays loaded for the trajectories on it
    b.retire(STABLE)  # after the drain
    assert admin.weights() == {"v1": 100}
    assert [m for m, p, _ in admin.requests if p.startswith("/admin/versions/")] == ["DELETE"]
    assert b.endpoint(CANARY) == Endpoint(f"{b.target}/v1", "v1")  # one server: the version is the model name


def test_rollback_puts_all_traffic_back_and_retire_unloads_the_canary(admin):
    b = backend(admin)
    b.load_canary(CANARY, STABLE, 10)
    b.rollback(CANARY, STABLE)
    assert admin.weights() == {"v0": 100, "v1": 0}
    b.rollback(CANARY, STABLE)  # idempotent: nothing left to do
    assert admin.weights() == {"v0": 100, "v1": 0}
    b.retire(CANARY)
    b.retire(CANARY)  # idempotent
    assert admin.weights() == {"v0": 100}


def test_a_checkpoint_that_fails_to_load_is_rejected_and_stable_keeps_serving(admin):
    admin.bad_uris.add(CANARY.uri)
    with pytest.raises(VersionRejected, match="no config.json"):
        backend(admin).load_canary(CANARY, STABLE, 10)
    assert admin.weights() == {"v0": 100}


def test_a_name_taken_by_another_checkpoint_is_rejected(admin):
    admin.versions["v1"] = {"uri": "file:///elsewhere", "weight": 0}
    with pytest.raises(VersionRejected, match="already serves"):
        backend(admin).load_canary(CANARY, STABLE, 10)
    assert admin.weights() == {"v0": 100, "v1": 0}


def test_loading_again_after_a_lost_answer_is_harmless(admin):
    b = backend(admin)
    admin.versions["v1"] = {"uri": CANARY.uri, "weight": 0}  # loaded by an attempt whose answer was lost
    b.load_canary(CANARY, STABLE, 10)
    assert admin.weights() == {"v0": 90, "v1": 10}


def test_a_version_the_server_unloads_meanwhile_does_not_block_the_weights(admin):
    """The weights name only the versions that get traffic: an idle version the server unloads between the status
    read and the PUT (serve-llm's own eviction) is not in the map for the server to refuse."""
    admin.versions["v8"] = {"uri": "file:///ckpt/v8", "weight": 0}
    admin.unload_before_weights = ["v8"]
    backend(admin).load_canary(CANARY, STABLE, 50)
    assert admin.weights() == {"v0": 50, "v1": 50}


def test_unknown_versions_are_clear_errors(admin):
    b = backend(admin)
    with pytest.raises(UnknownVersion, match="stable version 'nope'"):
        b.load_canary(CANARY, Version("nope", "file:///x"), 10)
    with pytest.raises(UnknownVersion, match="does not serve 'v1'"):
        b.set_percent(CANARY, STABLE, 50)
    with pytest.raises(UnknownVersion, match="cannot roll back to 'nope'"):
        b.rollback(CANARY, Version("nope", "file:///x"))
    assert admin.weights() == {"v0": 100}


def test_a_version_name_outside_the_charset_is_refused_before_any_request(admin):
    with pytest.raises(InvalidInput, match="version name"):
        backend(admin).load_canary(Version("v1\r\nX-Injected: 1", CANARY.uri), STABLE, 10)
    assert admin.requests == [] and admin.weights() == {"v0": 100}


def test_weights_are_checked_before_sending():
    assert check_weights({"a": 60, "b": 40}) == {"a": 60, "b": 40}
    for bad in ({"a": 60, "b": 50}, {"a": 110, "b": -10}, {"a": 99.5, "b": 0.5}, {}, {"": 100}):
        with pytest.raises(InvalidInput):
            check_weights(bad)
    with pytest.raises(InvalidInput, match="canary percent"):
        LocalBackend("http://127.0.0.1:1").load_canary(CANARY, STABLE, 100)


def test_server_side_weight_refusal_is_reported_and_the_canary_is_unloaded(admin):
    b = backend(admin)
    original = admin.route

    def refuse_weights(method, path, body):
        if method == "PUT":
            return 400, {"error": "weights must sum to 100"}
        return original(method, path, body)

    admin.route = refuse_weights
    with pytest.raises(BackendError, match="refused weights.*sum to 100") as info:
        b.load_canary(CANARY, STABLE, 10)
    assert not info.value.retryable
    assert admin.weights() == {"v0": 100}  # no half-state: the canary was taken away again


def test_5xx_is_retried_then_reported_as_retryable(admin):
    b = backend(admin, retries=2)
    admin.inject = [503, 500]
    assert b.status().versions[0].name == "v0"  # two failures, then the third attempt answers
    admin.inject = [500, 500, 500]
    with pytest.raises(BackendError, match="failed 3 times") as info:
        b.status()
    assert info.value.retryable


def test_bearer_token():
    with FakeAdmin(token="s3cret") as fake:
        with pytest.raises(BackendError, match="HTTP 401") as info:
            backend(fake).status()
        assert not info.value.retryable
        assert backend(fake, token="s3cret").status().versions[0].weight == 100
