"""Mode canary of the KServe backend (``KServeBackend``): one InferenceService, Knative (Serverless) mode only,
traffic split by ``spec.predictor.canaryTrafficPercent``; callers reach each revision by its tag URL (tag routing).

KServe splits a predictor's traffic between the latest ready revision and the last revision that
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

from agentflow.errors import Reason
from agentflow.rollout.backends import (BackendError, BackendStatus, Endpoint, ServedVersion, UnknownVersion, Version,
                                        check_percent, check_version)
from agentflow.rollout.kserve.base import (KServeBase, address_url, isvc_failure, openai_url, predictor_of,
                                           reconciled, served_names, with_served_name)

#: Makes KServe tag the latest revision's traffic target ``latest`` (it always tags the previous one ``prev``).
TAG_ROUTING_ANNOTATION = "serving.kserve.io/enable-tag-routing"
#: Mode canary: the stable version's checkpoint while a canary runs (the spec holds only the canary's).
STABLE_URI_ANNOTATION = "agentflow.dev/stable-uri"


class KServeBackend(KServeBase):
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
        predictor = predictor_of(obj)
        model = predictor.get("model") or {}
        in_spec = model.get("storageUri") == version.uri
        percent = predictor.get("canaryTrafficPercent")
        status = obj.get("status") or {}
        component = (status.get("components") or {}).get("predictor") or {}
        if not reconciled(obj):
            raise BackendError(f"{self.target}: KServe has not reconciled generation "
                               f"{obj['metadata'].get('generation')} yet; its URLs are not known")
        if percent is None or int(percent) >= 100:  # no canary: the predictor sends all to the latest revision
            if not in_spec:
                raise UnknownVersion(f"{self.target} serves {model.get('storageUri')!r}, not {version.name} "
                                     f"({version.uri})")
            url = (address_url(component.get("address")) or component.get("url") or address_url(status.get("address"))
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
            predictor = predictor_of(obj)
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
                                   retryable=False, reason=Reason.FAILED_PRECONDITION)
            return {**annotate, "spec": {"predictor": {
                "canaryTrafficPercent": percent,
                "model": {"storageUri": canary.uri, "args": with_served_name(model.get("args"), canary.name,
                                                                              self.alias)}}}}

        self._patch(f"load {canary.name} at {percent}%", patch)

    def set_percent(self, canary: Version, stable: Version, percent: int) -> None:
        check_percent(percent)

        def patch(obj):
            predictor = predictor_of(obj)
            self._expect_canary(predictor, canary)
            if predictor.get("canaryTrafficPercent") == percent:
                return None
            return {"spec": {"predictor": {"canaryTrafficPercent": percent}}}

        self._patch(f"set {canary.name} to {percent}%", patch)

    def promote(self, canary: Version, stable: Version) -> None:
        def patch(obj):
            predictor = predictor_of(obj)
            self._expect_canary(predictor, canary)
            if predictor.get("canaryTrafficPercent") is None:
                return None
            return {"spec": {"predictor": {"canaryTrafficPercent": None}}}

        self._patch(f"promote {canary.name}", patch)

    def rollback(self, canary: Version, stable: Version) -> None:
        check_version(stable, "stable")

        def patch(obj):
            predictor = predictor_of(obj)
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
            predictor = predictor_of(obj)
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



def _tagged(component: dict, tag: str) -> dict | None:
    """The traffic target tagged ``tag`` that has a URL (``status.components.predictor.traffic[]``)."""
    return next((t for t in component.get("traffic") or [] if t.get("tag") == tag and t.get("url")), None)


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
    ready = bool(reconciled(obj) and component.get("latestReadyRevision")
                 and component.get("latestReadyRevision") == component.get("latestCreatedRevision"))
    failure = isvc_failure(obj)
    return BackendStatus(tuple(versions), canary_ready=ready and not failure, canary_failure=failure)
