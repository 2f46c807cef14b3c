"""The KServe backend: canaries on one InferenceService (``serving.kserve.io/v1beta1``), through the official
``kubernetes`` client's ``CustomObjectsApi``.

KServe (Knative mode) splits a predictor's traffic between the latest ready revision and the last revision that was
rolled out with 100 %, by ``spec.predictor.canaryTrafficPercent``; changing the model (``storageUri``) creates a new
revision. So:

| operation | one JSON merge patch of ``spec.predictor`` |
|---|---|
| load_canary | ``model.storageUri`` = canary URI, ``model.args`` served name = canary version, ``canaryTrafficPercent`` = p |
| set_percent | ``canaryTrafficPercent`` = p |
| promote | ``canaryTrafficPercent`` removed (100 % to the latest revision) |
| rollback | ``canaryTrafficPercent`` = 0 (100 % back on the previous revision at once), ``storageUri`` and served name back to the stable version, so the spec describes what serves |
| tidy (after a rollback) | ``canaryTrafficPercent`` removed, once the revision with the restored model is ready |

Every patch carries the ``metadata.resourceVersion`` it was computed from: if anything changed the object in
between, the API server answers 409 Conflict and the operation re-reads the object and tries again. 5xx answers,
429 and connection errors are retried with doubling backoff, a bounded number of times, then a retryable
``BackendError`` says what failed. A patch is applied whole or not at all, so a failed operation leaves the
InferenceService exactly as it was (no half-state).

**Which version served a call.** vLLM reports the *first* ``--served-model-name`` as the response's ``model`` and
accepts every name in that list as the request's model, so the canary revision runs with ``--served-model-name
<version> <served_model_name>``: clients keep asking for ``planner``, and each response (and so each trajectory's
planner turns) names the version that produced it.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable

from agentflow.errors import InvalidInput
from agentflow.rollout.backends import (BackendError, BackendStatus, ServedVersion, UnknownVersion, Version,
                                        check_percent, check_version)

log = logging.getLogger(__name__)

GROUP, API_VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
SERVED_NAME_FLAG = "--served-model-name"
#: Conditions whose status "False" means the latest revision cannot serve.
_FAILURE_CONDITIONS = ("LatestDeploymentReady", "PredictorConfigurationReady")
_FAILED_TRANSITIONS = ("BlockedByFailedLoad", "InvalidSpec")


def served_names(args: list) -> list[str]:
    """The names given to ``--served-model-name`` in a container's args (``--flag=a`` or ``--flag a b``)."""
    names: list[str] = []
    taking = False
    for arg in args or []:
        arg = str(arg)
        if arg.startswith(SERVED_NAME_FLAG + "="):
            names, taking = [arg.split("=", 1)[1]], False
        elif arg == SERVED_NAME_FLAG:
            names, taking = [], True
        elif taking and not arg.startswith("-"):
            names.append(arg)
        else:
            taking = False
    return names


def with_served_name(args: list, version: str, alias: str) -> list[str]:
    """``args`` with any ``--served-model-name`` replaced by ``--served-model-name <version> <alias>``."""
    out: list[str] = []
    taking = False
    for arg in args or []:
        arg = str(arg)
        if arg.startswith(SERVED_NAME_FLAG + "="):
            taking = False
            continue
        if arg == SERVED_NAME_FLAG:
            taking = True
            continue
        if taking and not arg.startswith("-"):
            continue
        taking = False
        out.append(arg)
    names = [version] + ([alias] if alias and alias != version else [])
    return [SERVED_NAME_FLAG, *names, *out]


class KServeBackend:
    kind = "kserve"

    def __init__(self, api, namespace: str, name: str, *, served_model_name: str = "planner", retries: int = 4,
                 backoff_s: float = 0.2, timeout_s: float = 10.0, sleep: Callable[[float], None] = time.sleep):
        """``api``: a ``kubernetes.client.CustomObjectsApi``; ``name``: the InferenceService in ``namespace``."""
        if not name:
            raise InvalidInput("the kserve backend needs the InferenceService name (--isvc or "
                               "AGENTFLOW_ROLLOUT_INFERENCE_SERVICE)")
        if not namespace:
            raise InvalidInput("the kserve backend needs a namespace (--namespace or AGENTFLOW_ROLLOUT_NAMESPACE)")
        self.api, self.namespace, self.name = api, namespace, name
        self.alias = served_model_name
        self.retries, self.backoff_s, self.timeout_s, self._sleep = retries, backoff_s, timeout_s, sleep
        self.target = f"{namespace}/{name}"

    @classmethod
    def from_cluster(cls, namespace: str, name: str, **kwargs) -> KServeBackend:
        """In a pod: the service account's credentials; elsewhere: the current kubeconfig context."""
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            try:
                config.load_kube_config()
            except (config.ConfigException, OSError) as e:
                raise InvalidInput(f"no Kubernetes credentials for the kserve backend: not in a pod, and no usable "
                                   f"kubeconfig ({e})") from None
        return cls(client.CustomObjectsApi(), namespace, name, **kwargs)

    # --- the protocol -------------------------------------------------------------------------------------------------

    def status(self) -> BackendStatus:
        return isvc_status(self._get(), self.alias)

    def load_canary(self, canary: Version, stable: Version, percent: int) -> None:
        check_version(canary, "canary"), check_version(stable, "stable"), check_percent(percent)

        def patch(obj):
            predictor = _predictor(obj)
            model = predictor.get("model") or {}
            uri = model.get("storageUri")
            if uri == canary.uri and predictor.get("canaryTrafficPercent") == percent \
                    and served_names(model.get("args"))[:1] == [canary.name]:
                return None  # already done (a retried call)
            if uri != stable.uri:
                raise BackendError(f"{self.target} serves {uri!r}, not the stable {stable.name} ({stable.uri}); "
                                   f"refusing to start a canary over a version this controller does not know",
                                   retryable=False, reason="failed_precondition")
            return {"spec": {"predictor": {
                "canaryTrafficPercent": percent,
                "model": {"storageUri": canary.uri, "args": with_served_name(model.get("args"), canary.name,
                                                                              self.alias)}}}}

        self._patch(f"load {canary.name} at {percent}%", patch)

    def set_percent(self, canary: Version, stable: Version, percent: int) -> None:
        check_percent(percent)

        def patch(obj):
            predictor = _predictor(obj)
            self._expect_canary(predictor, canary)
            if predictor.get("canaryTrafficPercent") == percent:
                return None
            return {"spec": {"predictor": {"canaryTrafficPercent": percent}}}

        self._patch(f"set {canary.name} to {percent}%", patch)

    def promote(self, canary: Version, stable: Version) -> None:
        def patch(obj):
            predictor = _predictor(obj)
            self._expect_canary(predictor, canary)
            if predictor.get("canaryTrafficPercent") is None:
                return None
            return {"spec": {"predictor": {"canaryTrafficPercent": None}}}

        self._patch(f"promote {canary.name}", patch)

    def rollback(self, canary: Version, stable: Version) -> None:
        check_version(stable, "stable")

        def patch(obj):
            predictor = _predictor(obj)
            model = predictor.get("model") or {}
            if model.get("storageUri") == stable.uri and predictor.get("canaryTrafficPercent") in (0, None) \
                    and served_names(model.get("args"))[:1] in ([stable.name], []):
                return None
            return {"spec": {"predictor": {
                "canaryTrafficPercent": 0,
                "model": {"storageUri": stable.uri, "args": with_served_name(model.get("args"), stable.name,
                                                                              self.alias)}}}}

        self._patch(f"roll back {canary.name} to {stable.name}", patch)

    def tidy(self, stable: Version) -> bool:
        """After a rollback: once the revision that restored the stable model is ready, remove
        ``canaryTrafficPercent: 0`` (100 % goes to that revision) so that later spec changes take traffic again.
        True when there is nothing left to tidy."""
        state = {"done": True}

        def patch(obj):
            predictor = _predictor(obj)
            if predictor.get("canaryTrafficPercent") != 0 \
                    or (predictor.get("model") or {}).get("storageUri") != stable.uri:
                return None
            if not isvc_status(obj, self.alias).canary_ready:
                state["done"] = False  # the restored revision is not ready yet: the previous one keeps 100 %
                return None
            return {"spec": {"predictor": {"canaryTrafficPercent": None}}}

        self._patch(f"settle on {stable.name} after the rollback", patch)
        return state["done"]

    # --- plumbing ----------------------------------------------------------------------------------------------------

    def _expect_canary(self, predictor: dict, canary: Version) -> None:
        uri = (predictor.get("model") or {}).get("storageUri")
        if uri != canary.uri:
            raise UnknownVersion(f"{self.target} serves {uri!r}, not the canary {canary.name} ({canary.uri})")

    def _get(self) -> dict:
        return self._call("get", lambda: self.api.get_namespaced_custom_object(
            GROUP, API_VERSION, self.namespace, PLURAL, self.name, _request_timeout=self.timeout_s))

    def _patch(self, what: str, make_patch: Callable[[dict], dict | None]) -> None:
        """Read, compute the patch, send it guarded by the resourceVersion read; re-read and retry on 409."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(self.retries + 1):
            obj = self._get()
            body = make_patch(copy.deepcopy(obj))
            if body is None:
                log.info("%s: %s: nothing to change", self.target, what)
                return
            body["metadata"] = {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")}
            try:
                self._call(what, lambda: self.api.patch_namespaced_custom_object(
                    GROUP, API_VERSION, self.namespace, PLURAL, self.name, body, _request_timeout=self.timeout_s),
                    conflict_ok=True)
                log.info("%s: %s", self.target, what)
                return
            except ApiException as e:  # only a 409 comes through _call
                log.info("%s: %s: conflict (%s); re-reading (attempt %d)", self.target, what, e.reason, attempt + 1)
        raise BackendError(f"{self.target}: {what}: the object kept changing under us "
                           f"({self.retries + 1} conflicts); nothing was changed")

    def _call(self, what: str, call, *, conflict_ok: bool = False):
        """``call()`` with bounded retries on 5xx, 429 and connection errors; 409 re-raised when ``conflict_ok``."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as Urllib3Error

        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return call()
            except ApiException as e:
                if e.status == 409 and conflict_ok:
                    raise
                if e.status == 404:
                    raise UnknownVersion(f"InferenceService {self.target} not found") from None
                if e.status in (401, 403):
                    raise BackendError(f"{self.target}: {what}: forbidden (HTTP {e.status}); the controller's "
                                       f"Role must allow get and patch on this InferenceService", retryable=False,
                                       reason="permission_denied") from None
                if e.status is None or e.status >= 500 or e.status == 429:
                    last = f"HTTP {e.status} {e.reason}"
                    continue
                raise BackendError(f"{self.target}: {what}: HTTP {e.status} {e.reason}: {_body(e)}",
                                   retryable=False) from None
            except (Urllib3Error, OSError) as e:
                last = f"{type(e).__name__}: {e}"
                continue
        raise BackendError(f"{self.target}: {what} failed {self.retries + 1} times (last: {last}); nothing was "
                           f"changed")


def _predictor(obj: dict) -> dict:
    predictor = (obj.get("spec") or {}).get("predictor")
    if not isinstance(predictor, dict):
        raise BackendError("the InferenceService has no spec.predictor", retryable=False)
    return predictor


def _body(error) -> str:
    import json

    try:
        return json.loads(error.body).get("message", "")[:300]
    except (TypeError, ValueError, AttributeError):
        return str(error.body or "")[:300]


def isvc_status(obj: dict, alias: str = "") -> BackendStatus:
    """What serves, from an InferenceService object: the latest revision's version (first served name, else the
    alias) with ``canaryTrafficPercent`` (absent: 100), the previous revision with the rest; and whether the latest
    revision is ready or has failed (model status, deployment conditions)."""
    predictor = (obj.get("spec") or {}).get("predictor") or {}
    model = predictor.get("model") or {}
    names = served_names(model.get("args"))
    latest = names[0] if names else alias
    percent = predictor.get("canaryTrafficPercent")
    percent = 100 if percent is None else int(percent)
    versions = [ServedVersion(latest, model.get("storageUri") or "", percent)]
    if percent < 100:
        versions.append(ServedVersion("", "", 100 - percent))  # the previously rolled-out revision
    status = obj.get("status") or {}
    component = (status.get("components") or {}).get("predictor") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    reconciled = generation is None or observed is None or observed >= generation
    ready = bool(reconciled and component.get("latestReadyRevision")
                 and component.get("latestReadyRevision") == component.get("latestCreatedRevision"))
    failure = ""
    model_status = status.get("modelStatus") or {}
    if reconciled and model_status.get("transitionStatus") in _FAILED_TRANSITIONS:
        info = model_status.get("lastFailureInfo") or {}
        failure = f"{model_status['transitionStatus']}: {info.get('reason', '')} {info.get('message', '')}".strip()
    elif reconciled:
        for condition in status.get("conditions") or []:
            if condition.get("type") in _FAILURE_CONDITIONS and condition.get("status") == "False":
                failure = f"{condition['type']}: {condition.get('reason', '')} {condition.get('message', '')}".strip()
                break
    return BackendStatus(tuple(versions), canary_ready=ready and not failure, canary_failure=failure)
