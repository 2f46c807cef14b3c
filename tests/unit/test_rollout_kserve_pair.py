"""Mode pair of the KServe backend (a stable and a canary InferenceService) with the real ``kubernetes`` client
against kmock's API emulator on 127.0.0.1.

There is no KServe controller in the emulator (tests/unit/kube_emulator.py): nothing reconciles an InferenceService,
starts pods or writes ``status``. The tests write status themselves, shaped as KServe writes it — ``Ready`` /
``PredictorReady`` conditions, ``observedGeneration`` (KServe copies the Knative Service's or the Deployment's),
``status.url`` and ``status.address.url`` (both modes), ``components.predictor.latestCreatedRevision`` /
``latestReadyRevision`` (Knative mode), ``modelStatus`` — see pkg/apis/serving/v1beta1/inference_service_status.go
and the ingress reconcilers in kserve/kserve. Also not checked here: admission webhooks, CRD schemas, RBAC (the
chart's Role is checked by tests/deploy), garbage collection through the owner reference.
"""

import pytest

from agentflow.rollout.backends import BackendError, UnknownVersion, Version
from agentflow.rollout.kserve.base import API_VERSION, GROUP, PLURAL, served_names
from agentflow.rollout.kserve.pair import KServePairBackend, merge_patch
from tests.unit.kube_emulator import KubeApi

NS, NAME = "agentflow", "agentflow-planner-llm"
CANARY_NAME = NAME + "-canary"
STABLE = Version("planner", "s3://models/planner/v0")
V1 = Version("v000001", "s3://models/planner/v000001")
V2 = Version("v000002", "s3://models/planner/v000002")
ARGS = ["--served-model-name=planner", "--max-model-len=4096"]
DOMAIN = "svc.cluster.local"


def isvc(mode="Knative"):
    return {"apiVersion": f"{GROUP}/{API_VERSION}", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": NS,
                         "labels": {"app.kubernetes.io/name": "agentflow", "app.kubernetes.io/instance": "agentflow",
                                    "app.kubernetes.io/component": "planner-llm",
                                    "app.kubernetes.io/managed-by": "Helm"},
                         "annotations": {"serving.kserve.io/deploymentMode": mode,
                                         "meta.helm.sh/release-name": "agentflow",
                                         "agentflow.dev/llm-role": "planner"}},
            "spec": {"predictor": {"minReplicas": 1, "maxReplicas": 1, "timeout": 150,
                                   "model": {"modelFormat": {"name": "vllm"}, "runtime": "agentflow-vllm",
                                             "storageUri": STABLE.uri, "args": list(ARGS)}}}}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def kube():
    with KubeApi() as k:
        yield k


def start(kube, mode="Knative"):
    _, code, _ = kube.api.create_namespaced_custom_object_with_http_info(GROUP, API_VERSION, NS, PLURAL, isvc(mode))
    assert code == 201
    ready(kube, NAME)


def backend(kube, **kwargs):
    return KServePairBackend(kube.api, NS, NAME, sleep=lambda s: None, openai_path="/v1", **kwargs)


def get(kube, name=NAME) -> dict:
    return kube.api.get_namespaced_custom_object(GROUP, API_VERSION, NS, PLURAL, name)


def exists(kube, name=CANARY_NAME) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        get(kube, name)
        return True
    except ApiException as e:
        assert e.status == 404
        return False


def write_status(kube, name, status: dict) -> None:
    """What the KServe controller would do (there is none here)."""
    kube.api.patch_namespaced_custom_object_status(GROUP, API_VERSION, NS, PLURAL, name, {"status": status})


def ready(kube, name, *, raw=False, reason="NewReplicaSetAvailable", revision="00001", observed=None):
    """Status as KServe writes it once ``name`` serves its current spec: Ready, its URLs (Standard mode: the
    predictor Service's address; Knative: the InferenceService's cluster-local host) and, in Knative mode, the
    revisions; in Standard mode PredictorReady carries the Deployment's condition reason."""
    obj = get(kube, name)
    generation = obj["metadata"]["generation"]
    host = f"{name}-predictor.{NS}.{DOMAIN}" if raw else f"{name}.{NS}.{DOMAIN}"
    status = {"observedGeneration": observed if observed is not None else generation,
              "url": f"http://{name}-{NS}.example.com" if raw else f"http://{name}.{NS}.example.com",
              "address": {"url": f"http://{host}"},
              "conditions": [{"type": "Ready", "status": "True"},
                             {"type": "PredictorReady", "status": "True", "reason": reason if raw else ""}],
              "modelStatus": {"transitionStatus": "UpToDate", "states": {"activeModelState": "Loaded"}}}
    if not raw:
        status["components"] = {"predictor": {"latestCreatedRevision": f"{name}-predictor-{revision}",
                                              "latestReadyRevision": f"{name}-predictor-{revision}"}}
    write_status(kube, name, status)


def requests(kube, method):
    return [path for m, path, _ in kube.emulator.log if m == method and not path.endswith("/status")]


def test_load_creates_the_canary_inference_service(kube):
    start(kube)
    b = backend(kube)
    assert [(v.name, v.uri, v.weight) for v in b.status().versions] == [("planner", STABLE.uri, 100)]
    b.load_canary(V1, STABLE, 10)
    canary = get(kube, CANARY_NAME)
    predictor = canary["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == V1.uri
    assert predictor["model"]["args"] == ["--served-model-name", "v000001", "planner", "--max-model-len=4096"]
    assert predictor["timeout"] == 150 and predictor["model"]["runtime"] == "agentflow-vllm"  # the stable's spec
    assert "canaryTrafficPercent" not in predictor
    meta = canary["metadata"]
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "agentflow-rollout"
    assert meta["labels"]["agentflow.dev/version"] == "v000001"
    assert meta["labels"]["app.kubernetes.io/component"] == "planner-llm"  # NetworkPolicies select it like the stable
    assert meta["annotations"]["serving.kserve.io/deploymentMode"] == "Knative"
    assert "meta.helm.sh/release-name" not in meta["annotations"]  # Helm does not own it
    assert meta["annotations"]["agentflow.dev/canary-of"] == NAME
    (owner,) = meta["ownerReferences"]
    assert owner["name"] == NAME and owner["uid"] == get(kube)["metadata"]["uid"]
    assert get(kube)["spec"]["predictor"]["model"]["storageUri"] == STABLE.uri  # the stable is untouched

    status = b.status()
    assert [(v.name, v.uri, v.weight) for v in status.versions] == [("planner", STABLE.uri, 100), ("v000001", V1.uri, 0)]
    assert not status.canary_ready and not status.canary_failure  # KServe has not reported it yet
    with pytest.raises(BackendError, match="no URL yet") as info:
        b.endpoint(V1)
    assert info.value.retryable
    ready(kube, CANARY_NAME)
    assert b.status().canary_ready
    assert b.endpoint(V1).url == f"http://{CANARY_NAME}.{NS}.{DOMAIN}/v1"
    assert b.endpoint(V1).model == "planner"  # the alias, which every version accepts
    assert b.endpoint(STABLE).url == f"http://{NAME}.{NS}.{DOMAIN}/v1"
    with pytest.raises(UnknownVersion):
        b.endpoint(V2)
    b.set_percent(V1, STABLE, 50)  # only checks: the weights live in the routing table
    with pytest.raises(UnknownVersion, match="not the canary"):
        b.set_percent(V2, STABLE, 50)


def test_retried_loads_are_idempotent(kube):
    start(kube)
    b = backend(kube)
    kube.emulator.fail("POST", 503, times=2)
    b.load_canary(V1, STABLE, 10)
    b.load_canary(V1, STABLE, 10)  # the controller retried: nothing more happens
    assert len(requests(kube, "POST")) == 3 + 1  # the stable's create, two 503s, one create
    assert not requests(kube, "PATCH") and not requests(kube, "DELETE")

    # an earlier attempt created it but its answer was lost: the create meets 409 and the object is ours
    b.retire(V1)  # a canary in progress is never retired
    assert exists(kube)
    b.rollback(V1, STABLE)
    b.retire(V1)
    assert not exists(kube)

    def concurrent_create(emulator):
        key = next(k for k in emulator.objects if k[2] == NAME)
        body = b._canary_object(dict(emulator.objects[key].raw), V1)
        body["metadata"].update(resourceVersion="999", uid="earlier", generation=1)
        emulator.objects[(key[0], NS, CANARY_NAME)] = body

    kube.call(lambda e: e.before_create.append(concurrent_create))
    b.load_canary(V1, STABLE, 10)
    assert get(kube, CANARY_NAME)["metadata"]["uid"] == "earlier"
    assert [code for m, _, code in kube.emulator.log if m == "POST"][-1] == 409


def test_conflicts_reread_and_retry(kube):
    start(kube)
    b = backend(kube, drain_s=0)
    b.load_canary(V1, STABLE, 10)
    ready(kube, CANARY_NAME)
    stable_key = kube.call(lambda e: next(k for k in e.objects if k[2] == NAME))
    canary_key = kube.call(lambda e: next(k for k in e.objects if k[2] == CANARY_NAME))
    # KServe updates the status between our read and our write: the guarded patch gets 409, re-reads, succeeds
    kube.call(lambda e: e.before_patch.append(lambda emulator: emulator.bump(canary_key)))
    b.promote(V1, STABLE)
    assert get(kube, CANARY_NAME)["metadata"]["annotations"]["agentflow.dev/promoted-at"]
    kube.call(lambda e: e.before_patch.append(lambda emulator: emulator.bump(stable_key)))
    b.retire(STABLE)
    assert get(kube)["spec"]["predictor"]["model"]["storageUri"] == V1.uri
    assert [code for m, path, code in kube.emulator.log if m == "PATCH" and not path.endswith("/status")] == [
        409, 200, 409, 200]
    # and the same for the delete (its preconditions carry the uid and resourceVersion read)
    ready(kube, NAME, revision="00002")
    kube.call(lambda e: e.before_delete.append(lambda emulator: emulator.bump(canary_key)))
    assert b.tidy(V1) is True
    assert [code for m, path, code in kube.emulator.log if m == "DELETE"] == [409, 200]
    assert not exists(kube)


def test_conflicts_that_never_end_change_nothing(kube):
    start(kube)
    b = backend(kube, retries=2)
    b.load_canary(V1, STABLE, 10)
    key = kube.call(lambda e: next(k for k in e.objects if k[2] == CANARY_NAME))
    kube.call(lambda e: e.before_patch.extend([lambda emulator: emulator.bump(key)] * 3))
    with pytest.raises(BackendError, match="kept changing") as info:
        b.promote(V1, STABLE)
    assert info.value.retryable
    assert "agentflow.dev/promoted-at" not in get(kube, CANARY_NAME)["metadata"]["annotations"]


def test_promote_retire_and_tidy_move_the_version_onto_the_stable(kube):
    """A promote keeps the old stable servable for its trajectories; retiring it moves the promoted version onto
    the stable InferenceService ("stable ← canary"); once that is ready the endpoint moves there, and after drain_s
    tidy deletes the canary InferenceService."""
    start(kube)
    clock = Clock()
    b = backend(kube, drain_s=30, clock=clock)
    b.load_canary(V1, STABLE, 10)
    ready(kube, CANARY_NAME)
    canary_url, stable_url = f"http://{CANARY_NAME}.{NS}.{DOMAIN}/v1", f"http://{NAME}.{NS}.{DOMAIN}/v1"

    b.promote(V1, STABLE)
    b.promote(V1, STABLE)  # idempotent
    assert len(requests(kube, "PATCH")) == 1
    assert get(kube)["spec"]["predictor"]["model"]["storageUri"] == STABLE.uri  # the old stable drains there
    assert [(v.name, v.weight) for v in b.status().versions] == [("v000001", 100), ("planner", 0)]
    assert b.endpoint(V1).url == canary_url and b.endpoint(STABLE).url == stable_url
    assert b.tidy(V1) is False and exists(kube)
    with pytest.raises(BackendError, match="waits") as info:  # the next version waits for the promotion to settle
        b.load_canary(V2, V1, 10)
    assert info.value.retryable

    b.retire(STABLE)  # the controller, drain_s after the promote
    predictor = get(kube)["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == V1.uri
    assert served_names(predictor["model"]["args"]) == ["v000001", "planner"]
    b.retire(STABLE)  # idempotent
    with pytest.raises(UnknownVersion):
        b.endpoint(STABLE)
    # the stable's status still describes the old model: the canary InferenceService keeps serving v1
    assert b.endpoint(V1).url == canary_url
    assert [(v.name, v.weight) for v in b.status().versions] == [("v000001", 100)]
    assert b.tidy(V1) is False and exists(kube)

    ready(kube, NAME, revision="00002")  # KServe rolled the stable onto v1
    assert b.endpoint(V1).url == stable_url
    assert b.tidy(V1) is False and exists(kube)  # the canary drains from now
    clock.now += 29
    assert b.tidy(V1) is False and exists(kube)
    clock.now += 2
    assert b.tidy(V1) is True and not exists(kube)
    assert b.tidy(V1) is True
    assert b.endpoint(V1).url == stable_url
    b.promote(V1, STABLE)  # a late retry changes nothing
    b.load_canary(V2, V1, 10)  # the next canary
    assert get(kube, CANARY_NAME)["spec"]["predictor"]["model"]["storageUri"] == V2.uri


def test_tidy_moves_the_version_when_no_retire_comes(kube):
    """A controller restarted during the drain may never retire the old stable: drain_s after the promote (the
    time is on the object), tidy or the next load does the move itself."""
    start(kube)
    clock = Clock()
    b = backend(kube, drain_s=30, clock=clock)
    b.load_canary(V1, STABLE, 10)
    ready(kube, CANARY_NAME)
    b.promote(V1, STABLE)
    restarted = backend(kube, drain_s=30, clock=clock)
    assert restarted.tidy(V1) is False and get(kube)["spec"]["predictor"]["model"]["storageUri"] == STABLE.uri
    clock.now += 31
    assert restarted.tidy(V1) is False and get(kube)["spec"]["predictor"]["model"]["storageUri"] == V1.uri
    with pytest.raises(BackendError, match="waits"):
        restarted.load_canary(V2, V1, 10)


def test_a_stale_ready_status_does_not_count_after_a_patch(kube):
    """KServe copies observedGeneration from the Knative Service / Deployment it drives, whose generations need not
    match the InferenceService's: right after the stable takes the promoted version over it may look reconciled and
    Ready while it still describes the old model. The backend waits until observedGeneration moves past its value
    before the patch (kept in an annotation)."""
    start(kube)
    ready(kube, NAME, observed=5)  # the Knative Service was updated more often than the InferenceService
    b = backend(kube, drain_s=0)
    b.load_canary(V1, STABLE, 10)
    ready(kube, CANARY_NAME)
    b.promote(V1, STABLE)
    b.retire(STABLE)
    assert get(kube)["metadata"]["generation"] == 2 and get(kube)["status"]["observedGeneration"] == 5
    assert b.endpoint(V1).url.startswith(f"http://{CANARY_NAME}.")
    assert b.tidy(V1) is False and exists(kube)
    ready(kube, NAME, revision="00002", observed=6)
    assert b.endpoint(V1).url.startswith(f"http://{NAME}.")
    assert b.tidy(V1) is True and not exists(kube)


def test_the_next_canary_replaces_a_settled_promotion_in_place(kube):
    start(kube)
    b = backend(kube, drain_s=0)
    b.load_canary(V1, STABLE, 10)
    ready(kube, CANARY_NAME)
    b.promote(V1, STABLE)
    b.retire(STABLE)
    ready(kube, NAME, revision="00002")
    uid = get(kube, CANARY_NAME)["metadata"]["uid"]
    b.load_canary(V2, V1, 10)  # the controller started v2 before tidying: the settled canary is reused
    canary = get(kube, CANARY_NAME)
    assert canary["metadata"]["uid"] == uid and canary["metadata"]["labels"]["agentflow.dev/version"] == "v000002"
    assert "agentflow.dev/promoted-at" not in canary["metadata"]["annotations"]
    assert served_names(canary["spec"]["predictor"]["model"]["args"]) == ["v000002", "planner"]
    status = b.status()
    assert not status.canary_ready  # patched: the status says nothing about v2 yet
    assert [(v.name, v.weight) for v in status.versions] == [("v000001", 100), ("v000002", 0)]
    ready(kube, CANARY_NAME, revision="00002")
    assert b.status().canary_ready


def test_an_older_canary_left_behind_is_replaced(kube):
    """A canary InferenceService holding a version nothing routes to (left by an older controller, say) is turned
    into the new canary by one patch, labels and spec as a fresh one would have."""
    start(kube)
    b = backend(kube)
    b.load_canary(V1, STABLE, 10)
    kube.api.patch_namespaced_custom_object(GROUP, API_VERSION, NS, PLURAL, CANARY_NAME,
                                            {"spec": {"predictor": {"minReplicas": 3}},
                                             "metadata": {"labels": {"stray": "x"}}})
    generation = get(kube, CANARY_NAME)["metadata"]["generation"]
    b.load_canary(V2, STABLE, 10)
    canary = get(kube, CANARY_NAME)
    assert canary["spec"]["predictor"]["model"]["storageUri"] == V2.uri
    assert canary["spec"]["predictor"]["minReplicas"] == 1 and "stray" not in canary["metadata"]["labels"]
    assert canary["metadata"]["generation"] == generation + 1
    assert canary["metadata"]["annotations"]["agentflow.dev/checkpoint-uri"] == V2.uri


def test_rollback_keeps_the_canary_until_it_is_retired(kube):
    start(kube)
    clock = Clock()
    b = backend(kube, drain_s=30, clock=clock)
    b.load_canary(V1, STABLE, 10)
    ready(kube, CANARY_NAME)
    b.rollback(V1, STABLE)
    b.rollback(V1, STABLE)  # idempotent
    assert len(requests(kube, "PATCH")) == 1 and not requests(kube, "DELETE")
    assert get(kube, CANARY_NAME)["metadata"]["annotations"]["agentflow.dev/rolled-back-at"]
    assert b.endpoint(V1).url.startswith(f"http://{CANARY_NAME}.")  # its trajectories finish on it
    status = b.status()
    assert [(v.name, v.weight) for v in status.versions] == [("planner", 100), ("v000001", 0)]
    assert status.canary_ready and not status.canary_failure
    with pytest.raises(UnknownVersion):
        b.set_percent(V1, STABLE, 50)
    assert b.tidy(STABLE) is False and exists(kube)  # it drains
    with pytest.raises(BackendError, match="drains") as info:  # the next canary waits for the drain...
        b.load_canary(V2, STABLE, 10)
    assert info.value.retryable
    b.retire(V1)
    assert not exists(kube)
    b.retire(V1)  # idempotent
    assert len(requests(kube, "DELETE")) == 1
    assert get(kube)["spec"]["predictor"]["model"]["storageUri"] == STABLE.uri
    with pytest.raises(UnknownVersion, match="cannot roll back"):
        b.rollback(V1, Version("v0", "s3://elsewhere"))


def test_a_rolled_back_canary_that_is_never_retired_goes_after_the_drain(kube):
    """A restarted controller may never retire it: drain_s after the rollback (the time is on the object) tidy deletes
    it, and the next load replaces it in place."""
    start(kube)
    clock = Clock()
    b = backend(kube, drain_s=30, clock=clock)
    b.load_canary(V1, STABLE, 10)
    b.rollback(V1, STABLE)
    assert b.tidy(STABLE) is False
    clock.now += 31
    assert b.tidy(STABLE) is True and not exists(kube)
    b.load_canary(V1, STABLE, 10)
    b.rollback(V1, STABLE)
    clock.now += 31
    b.load_canary(V2, STABLE, 10)
    canary = get(kube, CANARY_NAME)
    assert canary["spec"]["predictor"]["model"]["storageUri"] == V2.uri
    assert "agentflow.dev/rolled-back-at" not in canary["metadata"]["annotations"]


def test_retire_never_unloads_the_stable(kube):
    start(kube)
    b = backend(kube)
    b.retire(STABLE)
    b.load_canary(V1, STABLE, 10)
    b.promote(V1, STABLE)
    b.retire(V1)  # the promoted version is the stable now
    assert exists(kube) and get(kube)["spec"]["predictor"]["model"]["storageUri"] == STABLE.uri
    assert not requests(kube, "DELETE")


def test_a_canary_that_fails_to_load_is_reported(kube):
    start(kube)
    b = backend(kube)
    b.load_canary(V1, STABLE, 10)
    write_status(kube, CANARY_NAME, {"observedGeneration": 1, "modelStatus": {
        "transitionStatus": "BlockedByFailedLoad", "states": {"targetModelState": "FailedToLoad"},
        "lastFailureInfo": {"reason": "ModelLoadFailed", "message": "config.json not found in /mnt/models"}},
        "conditions": [{"type": "Ready", "status": "False"}]})
    status = b.status()
    assert "ModelLoadFailed" in status.canary_failure and "config.json" in status.canary_failure
    assert not status.canary_ready


def test_the_controller_rejects_a_canary_that_cannot_load(kube):
    """The controller on the pair backend: the canary InferenceService reports a failed load (status written here,
    as KServe would), the controller rejects the version, and once the drain is over retires it: the canary
    InferenceService is deleted."""
    from prometheus_client import CollectorRegistry

    from agentflow.proto.v1 import events_pb2 as pb
    from agentflow.rollout.controller import RolloutController
    from agentflow.rollout.metrics import RolloutMetrics
    from agentflow.rollout.settings import RolloutSettings
    from tests.unit.test_rollout_controller import Clock as ControllerClock

    start(kube)
    settings = RolloutSettings(backend="kserve", kserve_mode="pair", inference_service=NAME, namespace=NS,
                               drain_s=60)
    events, clock = [], ControllerClock()
    controller = RolloutController(settings, KServePairBackend.from_settings(settings, api=kube.api, clock=clock),
                                   sink=events.append, clock=clock, metrics=RolloutMetrics(CollectorRegistry()))
    controller.on_version(pb.PlannerVersion(version=V1.name, checkpoint_uri=V1.uri))
    assert controller.stable == STABLE and exists(kube)
    write_status(kube, CANARY_NAME, {"observedGeneration": 1, "conditions": [
        {"type": "LatestDeploymentReady", "status": "False", "reason": "RevisionFailed",
         "message": "Revision failed with message: container exited"}]})
    controller.tick()
    assert [e.rollout_decision.action for e in events] == ["canary", "reject"]
    assert "RevisionFailed" in events[-1].rollout_decision.reason
    assert exists(kube)  # trajectories on it finish there
    clock.now += 61
    controller.tick()
    assert not exists(kube)


def test_the_controller_promotes_and_the_routing_table_follows(kube):
    """The controller on the pair backend through a whole promotion, with the routing tables it publishes: the
    canary's InferenceService once ready; after the promote the old stable drains on its own InferenceService with
    weight 0; its retire moves the promoted version onto the stable InferenceService, the table follows once that is
    ready (status written here, as KServe would), and drain_s later tidy deletes the canary InferenceService."""
    from prometheus_client import CollectorRegistry

    from agentflow.llm.routing import RoutingTable
    from agentflow.proto.v1 import events_pb2 as pb
    from agentflow.rollout.controller import RolloutController
    from agentflow.rollout.metrics import RolloutMetrics
    from agentflow.rollout.settings import RolloutSettings
    from tests.unit.test_rollout_controller import Clock as ControllerClock
    from tests.unit.test_rollout_controller import record

    start(kube)
    settings = RolloutSettings(backend="kserve", kserve_mode="pair", inference_service=NAME, namespace=NS,
                               min_samples=20, reward_margin=0.1, kserve_openai_path="/v1", drain_s=60)
    events, tables, clock = [], [], ControllerClock()
    controller = RolloutController(settings, KServePairBackend.from_settings(settings, api=kube.api, clock=clock),
                                   sink=events.append, clock=clock, metrics=RolloutMetrics(CollectorRegistry()),
                                   routes=lambda envelope: tables.append(RoutingTable.from_proto(
                                       envelope.planner_routing)))
    stable_url, canary_url = f"http://{NAME}.{NS}.{DOMAIN}/v1", f"http://{CANARY_NAME}.{NS}.{DOMAIN}/v1"

    def routes():
        return {r.version: (r.endpoint, r.weight) for r in tables[-1].routes}

    controller.on_version(pb.PlannerVersion(version=V1.name, checkpoint_uri=V1.uri))
    assert exists(kube)
    assert routes() == {"planner": (stable_url, 100)}  # the canary is not ready yet
    ready(kube, CANARY_NAME)
    controller.tick()
    assert routes() == {V1.name: (canary_url, 10), "planner": (stable_url, 90)}
    for _ in range(2000):
        if "promote" in [e.rollout_decision.action for e in events]:
            break
        controller.on_trajectory(record(V1.name, reward=1.0))
        controller.on_trajectory(record("planner", reward=1.0))
    assert [e.rollout_decision.action for e in events] == ["canary", "step", "promote"]
    assert routes()[V1.name] == (canary_url, 100) and routes()["planner"][1] == 0  # the old stable drains
    assert get(kube)["spec"]["predictor"]["model"]["storageUri"] == STABLE.uri

    clock.now += 61
    controller.tick()  # the drain is over: the old stable is retired, the stable InferenceService takes v1 over
    assert get(kube)["spec"]["predictor"]["model"]["storageUri"] == V1.uri
    assert routes() == {V1.name: (canary_url, 100)}  # still the canary InferenceService: the stable is rolling
    ready(kube, NAME, revision="00002")
    controller.tick()
    assert routes() == {V1.name: (stable_url, 100)} and exists(kube)
    clock.now += 61
    controller.tick()
    assert not exists(kube)
    assert routes() == {V1.name: (stable_url, 100)}


def test_standard_mode(kube):
    """Standard (RawDeployment) mode: the canary copies the mode; its URL is the predictor Service's address
    (status.address.url); during a rolling update KServe keeps Ready True, so the Deployment's condition reason
    (PredictorReady) tells when the stable has finished rolling onto the promoted version."""
    start(kube, mode="Standard")
    ready(kube, NAME, raw=True)
    b = backend(kube, drain_s=0)
    b.load_canary(V1, STABLE, 10)
    assert get(kube, CANARY_NAME)["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    ready(kube, CANARY_NAME, raw=True)
    assert b.status().canary_ready
    assert b.endpoint(V1).url == f"http://{CANARY_NAME}-predictor.{NS}.{DOMAIN}/v1"
    assert b.endpoint(STABLE).url == f"http://{NAME}-predictor.{NS}.{DOMAIN}/v1"
    b.promote(V1, STABLE)
    b.retire(STABLE)
    ready(kube, NAME, raw=True, reason="MinimumReplicasAvailable")  # old pods still serve: rolling
    assert b.endpoint(V1).url.startswith(f"http://{CANARY_NAME}-predictor.")
    assert b.tidy(V1) is False
    ready(kube, NAME, raw=True)
    assert b.endpoint(V1).url.startswith(f"http://{NAME}-predictor.")
    assert b.tidy(V1) is True and not exists(kube)


def test_forbidden_names_the_verbs(kube):
    start(kube)
    b = backend(kube)
    kube.emulator.fail("POST", 403)
    with pytest.raises(BackendError, match="create and delete") as info:
        b.load_canary(V1, STABLE, 10)
    assert not info.value.retryable and info.value.reason == "permission_denied"
    assert not exists(kube)


def test_refuses_foreign_objects_and_unknown_stables(kube):
    start(kube)
    b = backend(kube)
    with pytest.raises(BackendError, match="not the stable") as info:
        b.load_canary(V1, Version("v0", "s3://elsewhere"), 10)
    assert not info.value.retryable
    foreign = isvc()
    foreign["metadata"].update(name=CANARY_NAME, labels={"team": "someone-else"})
    kube.api.create_namespaced_custom_object(GROUP, API_VERSION, NS, PLURAL, foreign)
    with pytest.raises(BackendError, match="not managed by the rollout controller") as info:
        b.load_canary(V1, STABLE, 10)
    assert not info.value.retryable
    b.rollback(V1, STABLE)
    b.retire(V1)
    assert b.tidy(STABLE) is True and exists(kube)  # never deleted
    with pytest.raises(UnknownVersion, match="not found"):
        KServePairBackend(kube.api, NS, "missing", sleep=lambda s: None).status()


def test_a_canary_still_being_deleted_is_waited_for(kube):
    """KServe's finalizer keeps a deleted InferenceService until it has cleaned up: the next canary is created
    once it is gone."""
    start(kube)
    b = backend(kube)
    b.load_canary(V1, STABLE, 10)
    kube.api.patch_namespaced_custom_object(GROUP, API_VERSION, NS, PLURAL, CANARY_NAME,
                                            {"metadata": {"finalizers": ["inferenceservice.finalizers"]}})
    b.rollback(V1, STABLE)
    b.retire(V1)
    assert get(kube, CANARY_NAME)["metadata"].get("deletionTimestamp")
    assert b.tidy(STABLE) is True and [v.name for v in b.status().versions] == ["planner"]
    with pytest.raises(BackendError, match="still being deleted") as info:
        b.load_canary(V2, STABLE, 10)
    assert info.value.retryable
    key = kube.call(lambda e: next(k for k in e.objects if k[2] == CANARY_NAME))
    kube.call(lambda e: e.release(key))
    b.load_canary(V2, STABLE, 10)
    assert get(kube, CANARY_NAME)["spec"]["predictor"]["model"]["storageUri"] == V2.uri


def test_from_settings(kube):
    from agentflow.rollout.kserve import KServeBackend, kserve_backend
    from agentflow.rollout.settings import RolloutSettings

    settings = RolloutSettings(backend="kserve", kserve_mode="pair", inference_service=NAME, namespace=NS,
                               served_model_name="planner", kserve_openai_path="/v1", retries=1,
                               request_timeout_s=3.0, drain_s=42)
    b = kserve_backend(settings, api=kube.api)
    assert isinstance(b, KServePairBackend)
    assert (b.namespace, b.name, b.canary_name, b.alias, b.openai_path, b.retries, b.timeout_s, b.drain_s) == (
        NS, NAME, CANARY_NAME, "planner", "/v1", 1, 3.0, 42)
    assert b.kind == "kserve" and b.target == f"{NS}/{NAME}"
    canary_mode = kserve_backend(RolloutSettings(backend="kserve", inference_service=NAME, namespace=NS),
                                 api=kube.api)
    assert type(canary_mode) is KServeBackend and canary_mode.openai_path == "/openai/v1"


def test_merge_patch():
    assert merge_patch({"a": 1, "b": {"c": 2, "d": 3}, "l": [1]}, {"a": 1, "b": {"c": 4}, "l": [1, 2], "n": 5}) == {
        "b": {"c": 4, "d": None}, "l": [1, 2], "n": 5}
    assert merge_patch({"a": {"b": 1}}, {"a": {"b": 1}}) == {}
