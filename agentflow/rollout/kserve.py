"""The KServe backends, through the official ``kubernetes`` client's ``CustomObjectsApi``
(``serving.kserve.io/v1beta1`` InferenceServices). Two modes (``AGENTFLOW_ROLLOUT_KSERVE_MODE``):

* ``canary`` (``KServeBackend``, this module): one InferenceService, Knative (Serverless) mode only, traffic split
  by ``spec.predictor.canaryTrafficPercent``; callers reach each revision by its tag URL (tag routing).
* ``pair`` (``KServePairBackend``, ``agentflow.rollout.kserve_pair``): a stable and a canary InferenceService,
  Knative or Standard (RawDeployment) mode; the routing table holds the split.

Both share ``_KServeBase``: bounded retries, resourceVersion-guarded JSON merge patches, create and delete.

**Mode canary.** KServe splits a predictor's traffic between the latest ready revision and the last revision that
was rolled out with 100 %, by ``canaryTrafficPercent``; changing the model (``storageUri``) creates a new revision:

| operation | one JSON merge patch of ``spec.predictor`` (and ``metadata.annotations``) |
|---|---|
| load_canary | ``model.storageUri`` = canary URI, ``model.args`` served name = canary version, ``canaryTrafficPercent`` = p, annotations ``serving.kserve.io/enable-tag-routing: "true"`` and ``agentflow.dev/stable-uri`` = stable URI |
| set_percent | ``canaryTrafficPercent`` = p |
| promote | ``canaryTrafficPercent`` removed (100 % to the latest revision) |
| rollback | ``canaryTrafficPercent`` = 0 (100 % back on the previous revision at once), ``storageUri`` and served name back to the stable version, so the spec describes what serves |
| tidy (after a rollback) | ``canaryTrafficPercent`` removed, once the revision with the restored model is ready |
| retire | nothing (Knative routes nothing to a revision no traffic target names) |

``endpoint(version)`` reads the predictor's traffic in ``status.components.predictor.traffic`` (Knative's
``TrafficTarget``s: ``tag``, ``revisionName``, ``latestRevision``, ``percent``, ``url``). With tag routing KServe
tags the latest revision's target ``latest``; the previously rolled-out one is always tagged ``prev``
(KServe's knative ksvc_reconciler.go). So while a canary runs the canary is the ``latest`` tag URL and the stable the
``prev`` tag URL; after a rollback (percent 0) the stable is ``prev`` until tidy; with no canary the stable is the
predictor's own address (it sends 100 % to the latest revision). The URL gets ``openai_path`` appended.

Every patch carries the ``metadata.resourceVersion`` it was computed from: if anything changed the object in
between, the API server answers 409 Conflict and the operation re-reads the object and tries again. 5xx answers,
429 and connection errors are retried with doubling backoff, a bounded number of times, then a retryable
``BackendError`` says what failed. A patch is applied whole or not at all, so a failed operation leaves the
InferenceService exactly as it was (no half-state).

**Which version served a call.** vLLM reports the *first* ``--served-model-name`` as the response's ``model`` and
accepts every name in that list as the request's model, so each version runs with ``--served-model-name <version>
<served_model_name>``: the routing table's ``model`` is the alias (``planner``), which every revision and both
InferenceServices accept — also while Knative or a rolling update still has the previous version behind a URL —
and each response (and so each trajectory's planner turns) names the version that produced it.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable

from agentflow.errors import InvalidInput
from agentflow.rollout.backends import (BackendError, BackendStatus, Endpoint, ServedVersion, UnknownVersion, Version,
                                        check_percent, check_version)

log = logging.getLogger(__name__)

GROUP, API_VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
SERVED_NAME_FLAG = "--served-model-name"
#: Makes KServe tag the latest revision's traffic target ``latest`` (it always tags the previous one ``prev``).
TAG_ROUTING_ANNOTATION = "serving.kserve.io/enable-tag-routing"
DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
#: Mode canary: the stable version's checkpoint while a canary runs (the spec holds only the canary's).
STABLE_URI_ANNOTATION = "agentflow.dev/stable-uri"
#: Conditions whose status "False" means the latest revision cannot serve.
_FAILURE_CONDITIONS = ("LatestDeploymentReady", "PredictorConfigurationReady")
_FAILED_TRANSITIONS = ("BlockedByFailedLoad", "InvalidSpec")
_RAW_MODES = ("Standard", "RawDeployment")


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


def _custom_objects_api():
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


class _KServeBase:
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
        return cls(_custom_objects_api(), namespace, name, **kwargs)

    @classmethod
    def from_settings(cls, settings, *, api=None, **kwargs):
        """From ``RolloutSettings``: namespace, inference_service, served_model_name, retries, request_timeout_s,
        kserve_openai_path. ``api``: a ``CustomObjectsApi`` (default: the cluster's, as ``from_cluster``)."""
        options = dict(served_model_name=settings.served_model_name, openai_path=settings.kserve_openai_path,
                       retries=settings.retries, timeout_s=settings.request_timeout_s)
        return cls(api if api is not None else _custom_objects_api(), settings.namespace,
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


class KServeBackend(_KServeBase):
    """Mode canary: canaries on one InferenceService by ``canaryTrafficPercent`` (Knative mode), callers routed to
    each revision by its tag URL (see the module's docstring)."""

    # --- the protocol -------------------------------------------------------------------------------------------------

    def status(self) -> BackendStatus:
        return isvc_status(self._get(), self.alias)

    def endpoint(self, version: Version) -> Endpoint:
        """Where ``version`` is served now: the ``latest`` tag URL for the canary, the ``prev`` tag URL for the stable
        while a canary runs or a rollback settles, the predictor's address when no canary runs; each with the OpenAI
        path. Raises a retryable ``BackendError`` while KServe has not reported those URLs (tag routing off or not
        reconciled yet), ``UnknownVersion`` for a version this InferenceService does not serve."""
        check_version(version, "requested")
        obj = self._get()
        predictor = _predictor(obj)
        model = predictor.get("model") or {}
        in_spec = model.get("storageUri") == version.uri
        percent = predictor.get("canaryTrafficPercent")
        status = obj.get("status") or {}
        component = (status.get("components") or {}).get("predictor") or {}
        if not _reconciled(obj):
            raise BackendError(f"{self.target}: KServe has not reconciled generation "
                               f"{obj['metadata'].get('generation')} yet; its URLs are not known")
        if percent is None or int(percent) >= 100:  # no canary: the predictor sends all to the latest revision
            if not in_spec:
                raise UnknownVersion(f"{self.target} serves {model.get('storageUri')!r}, not {version.name} "
                                     f"({version.uri})")
            url = (_url(component.get("address")) or component.get("url") or _url(status.get("address"))
                   or status.get("url") or (_tagged(component, "latest") or {}).get("url"))
            if not url:
                raise BackendError(f"{self.target} reports no URL yet (status.components.predictor.address/url)")
            return Endpoint(openai_url(url, self.openai_path), self._model_name(version))
        if int(percent) == 0 and not in_spec:
            raise UnknownVersion(f"{self.target} rolled {version.name} back; it no longer serves it")
        stable_uri = ((obj.get("metadata") or {}).get("annotations") or {}).get(STABLE_URI_ANNOTATION)
        if not in_spec and stable_uri and stable_uri != version.uri:
            raise UnknownVersion(f"{self.target} serves the canary {model.get('storageUri')!r} and the stable "
                                 f"{stable_uri!r}, not {version.name} ({version.uri})")
        # a canary runs (the spec holds it), or a rollback settles (percent 0: "prev" keeps all the traffic)
        tag = "latest" if in_spec and int(percent) > 0 else "prev"
        target = _tagged(component, tag)
        if target is None:
            raise BackendError(f"{self.target}: status.components.predictor.traffic has no {tag!r} tag URL yet: "
                               f"is tag routing on (annotation {TAG_ROUTING_ANNOTATION}: \"true\"), and has KServe "
                               f"reconciled the canary?")
        latest_created = component.get("latestCreatedRevision")
        if tag == "latest" and latest_created and target.get("revisionName") not in (None, latest_created):
            raise BackendError(f"{self.target}: the canary revision {latest_created} is not ready yet (the latest "
                               f"tag still routes to {target.get('revisionName')})")
        return Endpoint(openai_url(target["url"], self.openai_path), self._model_name(version))

    def load_canary(self, canary: Version, stable: Version, percent: int) -> None:
        check_version(canary, "canary"), check_version(stable, "stable"), check_percent(percent)

        def patch(obj):
            predictor = _predictor(obj)
            model = predictor.get("model") or {}
            uri = model.get("storageUri")
            wanted = {TAG_ROUTING_ANNOTATION: "true", STABLE_URI_ANNOTATION: stable.uri}
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            missing = {k: v for k, v in wanted.items() if annotations.get(k) != v}
            annotate = {"metadata": {"annotations": missing}} if missing else {}
            if uri == canary.uri and predictor.get("canaryTrafficPercent") == percent \
                    and served_names(model.get("args"))[:1] == [canary.name]:
                return annotate or None  # already done (a retried call)
            if uri != stable.uri:
                raise BackendError(f"{self.target} serves {uri!r}, not the stable {stable.name} ({stable.uri}); "
                                   f"refusing to start a canary over a version this controller does not know",
                                   retryable=False, reason="failed_precondition")
            return {**annotate, "spec": {"predictor": {
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

    def retire(self, version: Version) -> None:
        """Nothing to unload: a revision no traffic target names gets no traffic (and no tag URL) once KServe has
        reconciled, and Knative garbage-collects old revisions itself. (So in this mode a withdrawn version is not
        servable while it drains: the old stable loses its ``prev`` URL at the promote, a rolled-back canary its
        revision at the rollback; mode pair keeps both.)"""
        check_version(version, "retired")

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

    def _expect_canary(self, predictor: dict, canary: Version) -> None:
        uri = (predictor.get("model") or {}).get("storageUri")
        if uri != canary.uri:
            raise UnknownVersion(f"{self.target} serves {uri!r}, not the canary {canary.name} ({canary.uri})")


def kserve_backend(settings, *, api=None):
    """The KServe backend ``settings.kserve_mode`` names (canary: ``KServeBackend``, pair: ``KServePairBackend``)."""
    if settings.kserve_mode == "pair":
        from agentflow.rollout.kserve_pair import KServePairBackend

        return KServePairBackend.from_settings(settings, api=api)
    return KServeBackend.from_settings(settings, api=api)


# --- reading InferenceService objects -----------------------------------------------------------------------------


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


def _url(addressable) -> str:
    """``address.url`` of a Knative Addressable (a string in the API's JSON), or ""."""
    return str((addressable or {}).get("url") or "") if isinstance(addressable, dict) else ""


def _tagged(component: dict, tag: str) -> dict | None:
    """The traffic target tagged ``tag`` that has a URL (``status.components.predictor.traffic[]``)."""
    return next((t for t in component.get("traffic") or [] if t.get("tag") == tag and t.get("url")), None)


def _reconciled(obj: dict) -> bool:
    """Whether the status describes the current spec (``observedGeneration`` caught up with ``generation``; KServe
    copies the observed generation of the Knative Service / Deployment it drives)."""
    generation = (obj.get("metadata") or {}).get("generation")
    observed = (obj.get("status") or {}).get("observedGeneration")
    return generation is None or observed is None or observed >= generation


def isvc_failure(obj: dict) -> str:
    """Why the InferenceService's latest model cannot serve (model status, deployment conditions), or ""."""
    if not _reconciled(obj):
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
    component = ((obj.get("status") or {}).get("components") or {}).get("predictor") or {}
    ready = bool(_reconciled(obj) and component.get("latestReadyRevision")
                 and component.get("latestReadyRevision") == component.get("latestCreatedRevision"))
    failure = isvc_failure(obj)
    return BackendStatus(tuple(versions), canary_ready=ready and not failure, canary_failure=failure)
