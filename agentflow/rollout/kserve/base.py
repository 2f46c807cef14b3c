"""What both KServe backends share (``agentflow.rollout.kserve``): the ``serving.kserve.io/v1beta1``
InferenceService API through the official ``kubernetes`` client's ``CustomObjectsApi`` (bounded retries,
resourceVersion-guarded JSON merge patches, create and delete), the served-name arguments vLLM reads, and readers of
InferenceService objects."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable

from agentflow.errors import InvalidInput, Reason
from agentflow.rollout.backends import BackendError, UnknownVersion, Version

log = logging.getLogger(__name__)

GROUP, API_VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
SERVED_NAME_FLAG = "--served-model-name"
DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
#: Conditions whose status "False" means the latest revision cannot serve.
_FAILURE_CONDITIONS = ("LatestDeploymentReady", "PredictorConfigurationReady")
_FAILED_TRANSITIONS = ("BlockedByFailedLoad", "InvalidSpec")
RAW_MODES = ("Standard", "RawDeployment")


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


def openai_url(base: str, path: str) -> str:
    """``base`` (an InferenceService URL) with the OpenAI routes' path appended: the routing table's base URL."""
    path = (path or "").strip("/")
    return base.rstrip("/") + (f"/{path}" if path else "")


def custom_objects_api():
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
    return client.CustomObjectsApi()



class KServeBase:
    """What both KServe backends share: the InferenceService ``name`` in ``namespace`` they drive, the served
    alias, and the API plumbing (get, guarded merge patch, create, delete, bounded retries)."""

    kind = "kserve"
    #: What the controller's Role must allow, for the 403 message.
    _verbs = "get and patch on this InferenceService"

    def __init__(self, api, namespace: str, name: str, *, served_model_name: str = "planner",
                 openai_path: str = "/openai/v1", retries: int = 4, backoff_s: float = 0.2, timeout_s: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep):
        """``api``: a ``kubernetes.client.CustomObjectsApi``; ``name``: the InferenceService in ``namespace``;
        ``openai_path``: where the OpenAI routes sit under an InferenceService URL (``kserve_openai_path``)."""
        if not name:
            raise InvalidInput("the kserve backend needs the InferenceService name (--isvc or "
                               "AGENTFLOW_ROLLOUT_INFERENCE_SERVICE)")
        if not namespace:
            raise InvalidInput("the kserve backend needs a namespace (--namespace or AGENTFLOW_ROLLOUT_NAMESPACE)")
        self.api, self.namespace, self.name = api, namespace, name
        self.alias = served_model_name
        self.openai_path = openai_path
        self.retries, self.backoff_s, self.timeout_s, self._sleep = retries, backoff_s, timeout_s, sleep
        self.target = f"{namespace}/{name}"

    @classmethod
    def from_cluster(cls, namespace: str, name: str, **kwargs):
        """In a pod: the service account's credentials; elsewhere: the current kubeconfig context."""
        return cls(custom_objects_api(), namespace, name, **kwargs)

    @classmethod
    def from_settings(cls, settings, *, api=None, **kwargs):
        """From ``RolloutSettings``: namespace, inference_service, served_model_name, retries, request_timeout_s,
        kserve_openai_path. ``api``: a ``CustomObjectsApi`` (default: the cluster's, as ``from_cluster``)."""
        options = dict(served_model_name=settings.served_model_name, openai_path=settings.kserve_openai_path,
                       retries=settings.retries, timeout_s=settings.request_timeout_s)
        return cls(api if api is not None else custom_objects_api(), settings.namespace,
                   settings.inference_service, **{**options, **kwargs})

    def _model_name(self, version: Version) -> str:
        return self.alias or version.name

    # --- plumbing ----------------------------------------------------------------------------------------------------

    def _get(self, name: str | None = None, *, missing_ok: bool = False) -> dict | None:
        """The object ``name`` (default: the InferenceService); None when ``missing_ok`` and it does not exist."""
        from kubernetes.client.exceptions import ApiException

        name = name or self.name
        try:
            return self._call(f"get {name}", lambda: self.api.get_namespaced_custom_object(
                GROUP, API_VERSION, self.namespace, PLURAL, name, _request_timeout=self.timeout_s),
                passthrough=(404,) if missing_ok else ())
        except ApiException:  # only a 404 comes through, with missing_ok
            return None

    def _patch(self, what: str, make_patch: Callable[[dict], dict | None], name: str | None = None) -> None:
        """Read, compute the patch, send it guarded by the resourceVersion read; re-read and retry on 409."""
        from kubernetes.client.exceptions import ApiException

        name = name or self.name
        for attempt in range(self.retries + 1):
            obj = self._get(name)
            body = make_patch(copy.deepcopy(obj))
            if body is None:
                log.info("%s: %s: nothing to change", self.target, what)
                return
            body.setdefault("metadata", {})["resourceVersion"] = (obj.get("metadata") or {}).get("resourceVersion")
            try:
                self._call(what, lambda: self.api.patch_namespaced_custom_object(
                    GROUP, API_VERSION, self.namespace, PLURAL, name, body, _request_timeout=self.timeout_s),
                    passthrough=(409,))
                log.info("%s: %s", self.target, what)
                return
            except ApiException as e:  # only a 409 comes through _call
                log.info("%s: %s: conflict (%s); re-reading (attempt %d)", self.target, what, e.reason, attempt + 1)
        raise BackendError(f"{self.target}: {what}: the object kept changing under us "
                           f"({self.retries + 1} conflicts); nothing was changed")

    def _create(self, what: str, body: dict) -> bool:
        """Create ``body``; False when an object of that name exists already (409: maybe our own earlier attempt,
        whose answer was lost)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._call(what, lambda: self.api.create_namespaced_custom_object(
                GROUP, API_VERSION, self.namespace, PLURAL, body, _request_timeout=self.timeout_s),
                passthrough=(409,))
        except ApiException:
            return False
        log.info("%s: %s", self.target, what)
        return True

    def _delete(self, what: str, obj: dict) -> None:
        """Delete the object ``obj`` was read as, guarded by its uid and resourceVersion (a 409 re-reads it and tries
        again); a missing object is fine."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        name = obj["metadata"]["name"]
        for attempt in range(self.retries + 1):
            meta = obj.get("metadata") or {}
            options = client.V1DeleteOptions(preconditions=client.V1Preconditions(
                uid=meta.get("uid"), resource_version=meta.get("resourceVersion")))
            try:
                self._call(what, lambda: self.api.delete_namespaced_custom_object(
                    GROUP, API_VERSION, self.namespace, PLURAL, name, body=options, _request_timeout=self.timeout_s),
                    passthrough=(404, 409))
                log.info("%s: %s", self.target, what)
                return
            except ApiException as e:
                if e.status == 404:
                    return
                log.info("%s: %s: conflict (%s); re-reading (attempt %d)", self.target, what, e.reason, attempt + 1)
            again = self._get(name, missing_ok=True)
            if again is None:
                return
            if (again.get("metadata") or {}).get("uid") != meta.get("uid"):
                raise BackendError(f"{self.target}: {what}: {name} was replaced meanwhile; not deleting the new one",
                                   retryable=True)
            obj = again
        raise BackendError(f"{self.target}: {what}: the object kept changing under us "
                           f"({self.retries + 1} conflicts); nothing was changed")

    def _call(self, what: str, call, *, passthrough: tuple[int, ...] = ()):
        """``call()`` with bounded retries on 5xx, 429 and connection errors; answers in ``passthrough`` re-raised
        as ``ApiException``."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as Urllib3Error

        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return call()
            except ApiException as e:
                if e.status in passthrough:
                    raise
                if e.status == 404:
                    raise UnknownVersion(f"{self.target}: {what}: InferenceService not found in namespace "
                                         f"{self.namespace}") from None
                if e.status in (401, 403):
                    raise BackendError(f"{self.target}: {what}: forbidden (HTTP {e.status}); the controller's "
                                       f"Role must allow {self._verbs}", retryable=False,
                                       reason=Reason.PERMISSION_DENIED) from None
                if e.status is None or e.status >= 500 or e.status == 429:
                    last = f"HTTP {e.status} {e.reason}"
                    continue
                raise BackendError(f"{self.target}: {what}: HTTP {e.status} {e.reason}: {error_message(e)}",
                                   retryable=False) from None
            except (Urllib3Error, OSError) as e:
                last = f"{type(e).__name__}: {e}"
                continue
        raise BackendError(f"{self.target}: {what} failed {self.retries + 1} times (last: {last}); nothing was "
                           f"changed")



# --- reading InferenceService objects -----------------------------------------------------------------------------


def predictor_of(obj: dict) -> dict:
    predictor = (obj.get("spec") or {}).get("predictor")
    if not isinstance(predictor, dict):
        raise BackendError("the InferenceService has no spec.predictor", retryable=False)
    return predictor


def error_message(error) -> str:
    import json

    try:
        return json.loads(error.body).get("message", "")[:300]
    except (TypeError, ValueError, AttributeError):
        return str(error.body or "")[:300]


def address_url(addressable) -> str:
    """``address.url`` of a Knative Addressable (a string in the API's JSON), or ""."""
    return str((addressable or {}).get("url") or "") if isinstance(addressable, dict) else ""


def reconciled(obj: dict) -> bool:
    """Whether the status describes the current spec (``observedGeneration`` caught up with ``generation``; KServe
    copies the observed generation of the Knative Service / Deployment it drives)."""
    generation = (obj.get("metadata") or {}).get("generation")
    observed = (obj.get("status") or {}).get("observedGeneration")
    return generation is None or observed is None or observed >= generation


def isvc_failure(obj: dict) -> str:
    """Why the InferenceService's latest model cannot serve (model status, deployment conditions), or ""."""
    if not reconciled(obj):
        return ""  # old conditions say nothing about the current spec
    status = obj.get("status") or {}
    model_status = status.get("modelStatus") or {}
    if model_status.get("transitionStatus") in _FAILED_TRANSITIONS:
        info = model_status.get("lastFailureInfo") or {}
        return f"{model_status['transitionStatus']}: {info.get('reason', '')} {info.get('message', '')}".strip()
    for condition in status.get("conditions") or []:
        if condition.get("type") in _FAILURE_CONDITIONS and condition.get("status") == "False":
            return f"{condition['type']}: {condition.get('reason', '')} {condition.get('message', '')}".strip()
    return ""
