"""The KServe backend with the real ``kubernetes`` client against kmock's API emulator on 127.0.0.1.

What the emulator does not check (see tests/unit/kube_emulator.py): there is no KServe controller, so no revision
is created and no traffic is split — the tests write ``status`` themselves the way KServe would (the traffic
targets and their tag URLs as Knative reports them under ``status.components.predictor.traffic``); no admission or
CRD schema validation; no RBAC; no strategic-merge/JSON-patch semantics. What is real: the client's requests
(paths, merge-patch content type, resourceVersion guards), the merge semantics, 201/409/5xx answers.
"""

import pytest

from agentflow.rollout.backends import BackendError, Endpoint, UnknownVersion, Version
from agentflow.rollout.kserve.base import API_VERSION, GROUP, PLURAL, openai_url, served_names, with_served_name
from agentflow.rollout.kserve.canary import STABLE_URI_ANNOTATION, TAG_ROUTING_ANNOTATION, KServeBackend, isvc_status
from tests.unit.kube_emulator import KubeApi

NS, NAME = "agentflow", "agentflow-planner-llm"
STABLE = Version("planner", "s3://models/planner/v0")
CANARY = Version("v1", "s3://models/planner/v1")
ARGS = ["--served-model-name=planner", "--max-model-len=4096"]


def isvc(uri=STABLE.uri, args=ARGS):
    return {"apiVersion": f"{GROUP}/{API_VERSION}", "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {"predictor": {"minReplicas": 1, "timeout": 150,
                                   "model": {"modelFormat": {"name": "vllm"}, "runtime": "agentflow-vllm",
                                             "storageUri": uri, "args": list(args)}}}}


@pytest.fixture
def kube():
    with KubeApi() as k:
        _, code, _ = k.api.create_namespaced_custom_object_with_http_info(GROUP, API_VERSION, NS, PLURAL, isvc())
        assert code == 201
        yield k


def backend(kube, **kwargs):
    return KServeBackend(kube.api, NS, NAME, sleep=lambda s: None, **kwargs)


def spec(kube) -> dict:
    return kube.api.get_namespaced_custom_object(GROUP, API_VERSION, NS, PLURAL, NAME)["spec"]["predictor"]


def write_status(kube, status: dict) -> None:
    """What the KServe controller would do (there is none here)."""
    kube.api.patch_namespaced_custom_object_status(GROUP, API_VERSION, NS, PLURAL, NAME, {"status": status})


def generation(kube) -> int:
    return kube.api.get_namespaced_custom_object(GROUP, API_VERSION, NS, PLURAL, NAME)["metadata"]["generation"]


def test_canary_steps_and_promotion(kube):
    b = backend(kube)
    status = b.status()
    assert [(v.name, v.uri, v.weight) for v in status.versions] == [("planner", STABLE.uri, 100)]

    b.load_canary(CANARY, STABLE, 10)
    predictor = spec(kube)
    assert predictor["canaryTrafficPercent"] == 10
    assert predictor["model"]["storageUri"] == CANARY.uri
    # the canary revision reports its version as the response's model; clients keep asking for "planner"
    assert predictor["model"]["args"] == ["--served-model-name", "v1", "planner", "--max-model-len=4096"]
    assert predictor["timeout"] == 150 and predictor["model"]["runtime"] == "agentflow-vllm"  # the rest untouched
    status = b.status()
    assert [(v.name, v.weight) for v in status.versions] == [("v1", 10), ("", 90)]
    assert not status.canary_ready  # KServe has not reported the new revision yet

    write_status(kube, {"observedGeneration": generation(kube), "components": {"predictor": {
        "latestCreatedRevision": "agentflow-planner-llm-predictor-00002",
        "latestReadyRevision": "agentflow-planner-llm-predictor-00002",
        "latestRolledoutRevision": "agentflow-planner-llm-predictor-00001",
        "traffic": [{"latestRevision": True, "percent": 10, "revisionName": "agentflow-planner-llm-predictor-00002"},
                    {"latestRevision": False, "percent": 90, "tag": "prev",
                     "revisionName": "agentflow-planner-llm-predictor-00001"}]}},
        "conditions": [{"type": "Ready", "status": "True"}]})
    assert b.status().canary_ready

    b.set_percent(CANARY, STABLE, 50)
    assert spec(kube)["canaryTrafficPercent"] == 50
    b.promote(CANARY, STABLE)
    predictor = spec(kube)
    assert "canaryTrafficPercent" not in predictor  # 100 % to the latest revision
    assert predictor["model"]["storageUri"] == CANARY.uri
    assert [(v.name, v.weight) for v in b.status().versions] == [("v1", 100)]
    b.promote(CANARY, STABLE)  # idempotent: no second patch
    patches = [entry for entry in kube.emulator.log if entry[0] == "PATCH" and not entry[1].endswith("/status")]
    assert len(patches) == 3


def test_rollback_pins_traffic_and_restores_the_stable_model(kube):
    b = backend(kube)
    b.load_canary(CANARY, STABLE, 10)
    b.rollback(CANARY, STABLE)
    predictor = spec(kube)
    assert predictor["canaryTrafficPercent"] == 0  # all traffic on the previously rolled-out revision at once
    assert predictor["model"]["storageUri"] == STABLE.uri  # and the spec describes what serves
    assert served_names(predictor["model"]["args"]) == ["planner"]
    b.rollback(CANARY, STABLE)  # idempotent
    assert sum(1 for e in kube.emulator.log if e[0] == "PATCH") == 2

    # canaryTrafficPercent 0 would keep any later spec change from taking traffic: once the revision with the
    # restored model is ready, the backend drops it (until then the previous revision keeps 100 %)
    assert b.tidy(STABLE) is False and spec(kube)["canaryTrafficPercent"] == 0
    write_status(kube, {"observedGeneration": generation(kube), "components": {"predictor": {
        "latestCreatedRevision": "r3", "latestReadyRevision": "r3", "latestRolledoutRevision": "r1"}}})
    assert b.tidy(STABLE) is True and "canaryTrafficPercent" not in spec(kube)
    assert b.tidy(STABLE) is True


def test_conflict_rereads_and_retries_with_the_new_resource_version(kube):
    b = backend(kube)
    key = next(iter(kube.call(lambda e: list(e.objects))))
    # another writer (KServe updating status) moves the object on between our read and our patch
    kube.call(lambda e: e.before_patch.append(lambda emulator: emulator.bump(key)))
    b.load_canary(CANARY, STABLE, 10)
    assert [(m, code) for m, _, code in kube.emulator.log[1:]] == [
        ("GET", 200), ("PATCH", 409), ("GET", 200), ("PATCH", 200)]
    assert spec(kube)["canaryTrafficPercent"] == 10


def test_conflicts_that_never_end_give_a_clear_error_and_no_change(kube):
    b = backend(kube, retries=2)
    key = next(iter(kube.call(lambda e: list(e.objects))))
    kube.call(lambda e: e.before_patch.extend([lambda emulator: emulator.bump(key)] * 3))
    with pytest.raises(BackendError, match="kept changing") as info:
        b.load_canary(CANARY, STABLE, 10)
    assert info.value.retryable
    assert spec(kube)["model"]["storageUri"] == STABLE.uri and "canaryTrafficPercent" not in spec(kube)


def test_server_errors_are_retried_with_backoff(kube):
    sleeps = []
    b = KServeBackend(kube.api, NS, NAME, retries=3, backoff_s=0.1, sleep=sleeps.append)
    kube.emulator.fail("PATCH", 500, times=2)
    b.load_canary(CANARY, STABLE, 10)
    assert spec(kube)["canaryTrafficPercent"] == 10
    assert sleeps == [0.1, 0.2]


def test_persistent_server_errors_leave_no_half_state(kube):
    b = backend(kube, retries=2)
    before = spec(kube)
    kube.emulator.fail("PATCH", 500, times=3)
    with pytest.raises(BackendError, match=r"failed 3 times \(last: HTTP 500.*nothing was changed") as info:
        b.load_canary(CANARY, STABLE, 10)
    assert info.value.retryable
    assert spec(kube) == before  # one merge patch per operation: never half applied
    kube.emulator.fail("GET", 503, times=3)
    with pytest.raises(BackendError, match="HTTP 503"):
        b.status()


def test_a_failed_canary_revision_is_reported(kube):
    b = backend(kube)
    b.load_canary(CANARY, STABLE, 10)
    write_status(kube, {"observedGeneration": generation(kube), "modelStatus": {
        "transitionStatus": "BlockedByFailedLoad",
        "lastFailureInfo": {"reason": "ModelLoadFailed", "message": "config.json not found in /mnt/models"}}})
    status = b.status()
    assert "ModelLoadFailed" in status.canary_failure and "config.json" in status.canary_failure
    assert not status.canary_ready


def test_refuses_to_canary_over_an_unknown_model_and_names_missing_objects(kube):
    b = backend(kube)
    with pytest.raises(BackendError, match="not the stable") as info:
        b.load_canary(CANARY, Version("v0", "s3://somewhere/else"), 10)
    assert not info.value.retryable
    with pytest.raises(UnknownVersion, match="not the canary"):
        b.set_percent(CANARY, STABLE, 50)
    with pytest.raises(UnknownVersion, match="not found"):
        KServeBackend(kube.api, NS, "missing", sleep=lambda s: None).status()
    assert "canaryTrafficPercent" not in spec(kube)


def test_served_name_arguments():
    assert served_names(["--served-model-name=planner", "--x"]) == ["planner"]
    assert served_names(["--a", "--served-model-name", "v3", "planner", "--b=1"]) == ["v3", "planner"]
    assert with_served_name(["--served-model-name=planner", "--b=1"], "v3", "planner") == [
        "--served-model-name", "v3", "planner", "--b=1"]
    assert with_served_name(["--served-model-name", "v3", "planner"], "planner", "planner") == [
        "--served-model-name", "planner"]


def test_status_reading():
    obj = isvc()
    obj["metadata"]["generation"] = 3
    obj["status"] = {"observedGeneration": 2, "conditions": [{"type": "LatestDeploymentReady", "status": "False",
                                                              "reason": "RevisionFailed"}]}
    assert isvc_status(obj).canary_failure == ""  # not reconciled yet: an old condition says nothing
    obj["status"]["observedGeneration"] = 3
    assert isvc_status(obj).canary_failure == "LatestDeploymentReady: RevisionFailed"


def test_the_controller_drives_an_inference_service(kube):
    """The controller on the KServe backend: a bad version is canaried, rolled back, and the rollback settled once
    the (test-written) status says the restored revision is ready."""
    from prometheus_client import CollectorRegistry

    from agentflow.proto.v1 import events_pb2 as pb
    from agentflow.rollout.controller import RolloutController
    from agentflow.rollout.metrics import RolloutMetrics
    from agentflow.rollout.settings import RolloutSettings
    from tests.unit.test_rollout_controller import Clock, record

    settings = RolloutSettings(backend="kserve", inference_service=NAME, namespace=NS, min_samples=20)
    events = []
    controller = RolloutController(settings, backend(kube), sink=events.append, clock=Clock(),
                                   metrics=RolloutMetrics(CollectorRegistry()))
    controller.on_version(pb.PlannerVersion(version="v1", checkpoint_uri=CANARY.uri))
    assert controller.stable == STABLE  # read from the InferenceService: served name "planner", its storageUri
    assert spec(kube)["canaryTrafficPercent"] == 10
    for _ in range(100):
        controller.on_trajectory(record("v1", reward=0.0))
        controller.on_trajectory(record("planner", reward=1.0))
    assert [e.rollout_decision.action for e in events] == ["canary", "rollback"]
    assert spec(kube)["canaryTrafficPercent"] == 0 and spec(kube)["model"]["storageUri"] == STABLE.uri
    controller.tick()  # the restored revision is not ready yet: nothing changes
    assert spec(kube)["canaryTrafficPercent"] == 0
    write_status(kube, {"observedGeneration": generation(kube), "components": {"predictor": {
        "latestCreatedRevision": "r3", "latestReadyRevision": "r3"}}})
    controller.tick()
    assert "canaryTrafficPercent" not in spec(kube)


# ------------------------------------------------------------------------------------------------- tag routing

PREDICTOR = f"{NAME}-predictor"
LOCAL = f"{NS}.svc.cluster.local"


def traffic_status(kube, *, latest_revision="00002", latest_created="00002", tags=("latest", "prev"), percent=10):
    """Status as KServe writes it while a canary runs with tag routing: Knative's traffic targets, the latest
    revision tagged ``latest`` (annotation serving.kserve.io/enable-tag-routing) and the previously rolled-out one
    ``prev``, each with its tag URL."""
    targets = []
    if "latest" in tags:
        targets.append({"tag": "latest", "latestRevision": True, "percent": percent,
                        "revisionName": f"{PREDICTOR}-{latest_revision}", "url": f"http://latest-{PREDICTOR}.{LOCAL}"})
    else:
        targets.append({"latestRevision": True, "percent": percent, "revisionName": f"{PREDICTOR}-{latest_revision}"})
    if "prev" in tags:
        targets.append({"tag": "prev", "latestRevision": False, "percent": 100 - percent,
                        "revisionName": f"{PREDICTOR}-00001", "url": f"http://prev-{PREDICTOR}.{LOCAL}"})
    write_status(kube, {"observedGeneration": generation(kube), "components": {"predictor": {
        "latestCreatedRevision": f"{PREDICTOR}-{latest_created}", "latestReadyRevision": f"{PREDICTOR}-{latest_revision}",
        "latestRolledoutRevision": f"{PREDICTOR}-00001", "url": f"http://{PREDICTOR}.{NS}.example.com",
        "address": {"url": f"http://{PREDICTOR}.{LOCAL}"}, "traffic": targets}}})


def test_endpoints_follow_the_tag_urls(kube):
    b = backend(kube)
    with pytest.raises(BackendError, match="no URL yet") as info:  # KServe has not reported anything yet
        b.endpoint(STABLE)
    assert info.value.retryable
    write_status(kube, {"observedGeneration": generation(kube), "components": {"predictor": {
        "latestCreatedRevision": f"{PREDICTOR}-00001", "latestReadyRevision": f"{PREDICTOR}-00001",
        "address": {"url": f"http://{PREDICTOR}.{LOCAL}"},
        "traffic": [{"latestRevision": True, "percent": 100, "revisionName": f"{PREDICTOR}-00001"}]}}})
    # no canary: the predictor's address, which sends everything to the latest revision
    assert b.endpoint(STABLE) == Endpoint(f"http://{PREDICTOR}.{LOCAL}/openai/v1", "planner")
    with pytest.raises(UnknownVersion):
        b.endpoint(CANARY)

    b.load_canary(CANARY, STABLE, 10)
    assert kube.api.get_namespaced_custom_object(GROUP, API_VERSION, NS, PLURAL, NAME)["metadata"]["annotations"][
        TAG_ROUTING_ANNOTATION] == "true"  # in the same patch as the canary
    with pytest.raises(BackendError, match="not reconciled") as info:
        b.endpoint(CANARY)
    assert info.value.retryable

    traffic_status(kube, tags=("prev",))  # tag routing off: only the previous revision is tagged
    with pytest.raises(BackendError, match=TAG_ROUTING_ANNOTATION) as info:
        b.endpoint(CANARY)
    assert info.value.retryable
    assert b.endpoint(STABLE).url == f"http://prev-{PREDICTOR}.{LOCAL}/openai/v1"

    traffic_status(kube, latest_revision="00001")  # the canary revision is still starting
    with pytest.raises(BackendError, match="not ready yet"):
        b.endpoint(CANARY)

    traffic_status(kube)
    assert b.endpoint(CANARY) == Endpoint(f"http://latest-{PREDICTOR}.{LOCAL}/openai/v1", "planner")
    assert b.endpoint(STABLE) == Endpoint(f"http://prev-{PREDICTOR}.{LOCAL}/openai/v1", "planner")
    with pytest.raises(UnknownVersion):
        b.endpoint(Version("v9", "s3://models/planner/v9"))

    # after a rollback the previous revision keeps all the traffic until tidy: the stable stays on "prev"
    b.rollback(CANARY, STABLE)
    traffic_status(kube, latest_revision="00003", latest_created="00003", percent=0)
    assert b.endpoint(STABLE).url == f"http://prev-{PREDICTOR}.{LOCAL}/openai/v1"
    with pytest.raises(UnknownVersion, match="rolled"):
        b.endpoint(CANARY)


def test_endpoint_after_a_promotion(kube):
    b = backend(kube, openai_path="/v1")
    b.load_canary(CANARY, STABLE, 10)
    traffic_status(kube)
    b.promote(CANARY, STABLE)
    write_status(kube, {"observedGeneration": generation(kube), "components": {"predictor": {
        "latestCreatedRevision": f"{PREDICTOR}-00002", "latestReadyRevision": f"{PREDICTOR}-00002",
        "address": {"url": f"http://{PREDICTOR}.{LOCAL}"},
        "traffic": [{"tag": "latest", "latestRevision": True, "percent": 100,
                     "revisionName": f"{PREDICTOR}-00002", "url": f"http://latest-{PREDICTOR}.{LOCAL}"}]}}})
    assert b.endpoint(CANARY) == Endpoint(f"http://{PREDICTOR}.{LOCAL}/v1", "planner")
    with pytest.raises(UnknownVersion):
        b.endpoint(STABLE)


def test_load_adds_the_tag_routing_annotation_once(kube):
    b = backend(kube)
    b.load_canary(CANARY, STABLE, 10)
    b.load_canary(CANARY, STABLE, 10)
    assert sum(1 for e in kube.emulator.log if e[0] == "PATCH") == 1
    # a canary loaded before the annotation existed gets it on the retried load, and nothing else changes
    kube.api.patch_namespaced_custom_object(GROUP, API_VERSION, NS, PLURAL, NAME,
                                            {"metadata": {"annotations": {TAG_ROUTING_ANNOTATION: None,
                                                                          STABLE_URI_ANNOTATION: None}}})
    before = spec(kube)
    b.load_canary(CANARY, STABLE, 10)
    assert spec(kube) == before
    annotations = kube.api.get_namespaced_custom_object(GROUP, API_VERSION, NS, PLURAL, NAME)["metadata"]["annotations"]
    assert annotations[TAG_ROUTING_ANNOTATION] == "true" and annotations[STABLE_URI_ANNOTATION] == STABLE.uri


def test_from_settings_and_urls(kube):
    from agentflow.rollout.settings import RolloutSettings

    settings = RolloutSettings(backend="kserve", inference_service=NAME, namespace=NS, served_model_name="agent",
                               retries=2, request_timeout_s=4.0, kserve_openai_path="/v1")
    b = KServeBackend.from_settings(settings, api=kube.api)
    assert (b.namespace, b.name, b.alias, b.openai_path, b.retries, b.timeout_s) == (NS, NAME, "agent", "/v1", 2, 4.0)
    assert b.status().versions[0].uri == STABLE.uri
    assert openai_url("http://h/", "/openai/v1/") == "http://h/openai/v1"
    assert openai_url("http://h", "") == "http://h"


def test_retire_changes_nothing(kube):
    """Knative routes nothing to a revision no traffic target names: there is nothing to unload."""
    b = backend(kube)
    b.load_canary(CANARY, STABLE, 10)
    b.promote(CANARY, STABLE)
    before = spec(kube)
    b.retire(STABLE)
    assert spec(kube) == before and sum(1 for e in kube.emulator.log if e[0] == "PATCH") == 2
