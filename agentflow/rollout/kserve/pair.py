"""Mode pair of the KServe backend: a stable and a canary InferenceService, in Knative (Serverless) or Standard
(RawDeployment) mode. Callers split the traffic between them by the routing table (``planner.routing``), so no
``canaryTrafficPercent`` is involved: the InferenceServices only load versions.

* the **stable** InferenceService ``N`` is the chart's (``AGENTFLOW_ROLLOUT_INFERENCE_SERVICE``);
* the **canary** ``N-canary`` (one at a time) is created by ``load_canary``: a copy of the stable's spec with the
  canary's ``storageUri`` and ``--served-model-name <version> <alias>``, the stable's labels and annotations
  (``serving.kserve.io/deploymentMode`` included, Helm's left out) plus ``app.kubernetes.io/managed-by:
  agentflow-rollout`` and ``agentflow.dev/version: <version>``, and an owner reference to the stable.

A withdrawn version stays servable until the controller retires it (``drain_s`` later), so that the trajectories on
it finish on it. What each operation changes:

| operation | the cluster |
|---|---|
| load_canary | create ``N-canary`` (nothing when it holds the canary already; patched in place when it holds a version nothing routes to any more) |
| set_percent | nothing: checks that ``N-canary`` holds the canary (the weights live in the routing table) |
| promote | ``N-canary`` annotated ``agentflow.dev/promoted-at``: it serves the new stable; ``N`` keeps the old one for its trajectories |
| retire(old stable) | "stable ← canary": ``N``'s ``storageUri`` and served names = the promoted version's (one merge patch) |
| tidy | once ``N`` is ready on the promoted version (``endpoint`` names ``N`` from then on) and ``drain_s`` has passed, delete ``N-canary``; when no retire came ``drain_s`` after the promote or rollback (a restarted controller), do retire's work itself |
| rollback | ``N-canary`` annotated ``agentflow.dev/rolled-back-at`` (its trajectories finish on it) |
| retire(rolled-back canary) | delete ``N-canary`` |

The state lives in the objects (the spec, those annotations), so a restarted controller carries on; ``status()``
reports a promoted canary's version as the stable (weight 100). ``endpoint(version)`` is the URL of the
InferenceService that holds ``version`` (``status.address.url``, the cluster-internal address KServe fills in both
modes, else ``status.url``) plus the OpenAI path; when both hold it, the stable one once it is ready on it.

Readiness of an InferenceService: status reconciled (``observedGeneration`` caught up with ``generation`` and, after
one of our patches, moved past its value before it: KServe copies it from the Knative Service / Deployment, whose
generations are not the InferenceService's), condition ``Ready`` True, no failure (model status, deployment
conditions); in Knative mode the latest created revision is the latest ready one, in Standard mode the Deployment
has finished rolling out (``PredictorReady`` reason ``NewReplicaSetAvailable``: during a rolling update KServe keeps
``Ready`` True while the old pods are available).
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Callable

from agentflow.errors import Reason
from agentflow.rollout.backends import (BackendError, BackendStatus, Endpoint, ServedVersion, UnknownVersion, Version,
                                        check_percent, check_version)
from agentflow.rollout.kserve.base import (API_VERSION, DEPLOYMENT_MODE_ANNOTATION, GROUP, RAW_MODES, KServeBase,
                                           address_url, isvc_failure, openai_url, predictor_of, reconciled,
                                           served_names, with_served_name)

log = logging.getLogger(__name__)

CANARY_SUFFIX = "-canary"
MANAGED_BY_LABEL, MANAGED_BY = "app.kubernetes.io/managed-by", "agentflow-rollout"
VERSION_LABEL = "agentflow.dev/version"
#: On the canary InferenceService: the stable it belongs to, the checkpoint it holds (label values are too short).
CANARY_OF_ANNOTATION = "agentflow.dev/canary-of"
CHECKPOINT_ANNOTATION = "agentflow.dev/checkpoint-uri"
#: On the canary InferenceService: when its version was promoted / rolled back (unix seconds).
PROMOTED_AT_ANNOTATION = "agentflow.dev/promoted-at"
ROLLED_BACK_AT_ANNOTATION = "agentflow.dev/rolled-back-at"
#: On a patched InferenceService: status.observedGeneration before the patch (readiness must move past it).
OBSERVED_BEFORE_ANNOTATION = "agentflow.dev/observed-generation-before"
#: Annotations of the stable that are not copied: its Helm ownership and kubectl's record of it.
_NOT_COPIED = ("kubectl.kubernetes.io/last-applied-configuration", "meta.helm.sh/", "helm.sh/")


class KServePairBackend(KServeBase):
    _verbs = "get, patch, create and delete on inferenceservices in this namespace (docs/deploy.md)"

    def __init__(self, api, namespace: str, name: str, *, drain_s: float = 150.0,
                 clock: Callable[[], float] = time.time, **kwargs):
        """As ``KServeBackend``; ``drain_s`` (the controller's ``drain_s``): how long a withdrawn version stays
        servable when no retire comes, and how long ``endpoint`` names the stable InferenceService for a promoted
        version before the canary one that served it is deleted (calls in flight finish, callers follow the
        re-published routing table)."""
        super().__init__(api, namespace, name, **kwargs)
        self.canary_name = name + CANARY_SUFFIX
        self.drain_s, self._clock = drain_s, clock
        #: ((canary uid, uri), since): the stable serves the promoted version; the canary drains
        self._draining: tuple[tuple, float] | None = None

    @classmethod
    def from_settings(cls, settings, *, api=None, **kwargs):
        return super().from_settings(settings, api=api, **{"drain_s": getattr(settings, "drain_s", 150.0), **kwargs})

    # --- the protocol -------------------------------------------------------------------------------------------------

    def status(self) -> BackendStatus:
        """The stable version (weight 100: the stable InferenceService's, or a promoted canary's) and, when the
        other InferenceService holds another version, that one (weight 0: the split is the routing table's); with
        the readiness and failure of a canary in progress."""
        stable = self._get()
        canary = self._canary()
        s_version = _version_of(stable, self.alias)
        if canary is None or _uri(canary) == s_version[1]:
            return BackendStatus((ServedVersion(*s_version, 100),))
        c_version = _version_of(canary, self.alias)
        if _marked(canary, PROMOTED_AT_ANNOTATION):
            return BackendStatus((ServedVersion(*c_version, 100), ServedVersion(*s_version, 0)))
        versions = (ServedVersion(*s_version, 100), ServedVersion(*c_version, 0))
        if _marked(canary, ROLLED_BACK_AT_ANNOTATION):
            return BackendStatus(versions)
        failure = isvc_failure(canary)
        return BackendStatus(versions, canary_ready=not failure and self._ready(canary, c_version[1]),
                             canary_failure=failure)

    def endpoint(self, version: Version) -> Endpoint:
        check_version(version, "requested")
        stable = self._get()
        canary = self._canary()
        on_stable = _uri(stable) == version.uri
        on_canary = canary is not None and _uri(canary) == version.uri
        if on_stable and on_canary:  # promoted and moved onto the stable: the canary serves it until that is ready
            obj = stable if self._ready(stable, version.uri) else canary
        elif on_stable or on_canary:
            obj = stable if on_stable else canary
        else:
            raise UnknownVersion(f"{self.target}: neither {self.name} nor {self.canary_name} serves {version.name} "
                                 f"({version.uri})")
        status = obj.get("status") or {}
        url = address_url(status.get("address")) or status.get("url")
        if not url:
            raise BackendError(f"{self.target}: {obj['metadata']['name']} reports no URL yet (status.address.url, "
                               f"status.url): KServe has not reconciled it")
        return Endpoint(openai_url(url, self.openai_path), self._model_name(version))

    def load_canary(self, canary: Version, stable: Version, percent: int) -> None:
        check_version(canary, "canary"), check_version(stable, "stable"), check_percent(percent)
        if canary.uri == stable.uri:
            raise BackendError(f"{self.target}: the canary {canary.name} and the stable {stable.name} have the same "
                               f"checkpoint {canary.uri}", retryable=False, reason=Reason.INVALID_INPUT)
        stable_obj = self._get()
        existing = self._get(self.canary_name, missing_ok=True)
        if existing is not None:
            self._check_ours(existing)
            if (existing.get("metadata") or {}).get("deletionTimestamp"):
                raise BackendError(f"{self.target}: {self.canary_name} is still being deleted; the canary "
                                   f"{canary.name} is created once it is gone")
        promoted = existing is not None and _uri(existing) == stable.uri
        if _uri(stable_obj) != stable.uri and not promoted:
            raise BackendError(f"{self.target} serves {_uri(stable_obj)!r}, not the stable {stable.name} "
                               f"({stable.uri}); refusing to start a canary over a version this controller does not "
                               f"know", retryable=False, reason=Reason.FAILED_PRECONDITION)
        if existing is None:
            self._create_canary(stable_obj, canary)
            return
        if _uri(existing) == canary.uri and served_names(_args(existing))[:1] == [canary.name] \
                and not _marked(existing, ROLLED_BACK_AT_ANNOTATION):
            log.info("%s: %s already serves %s", self.target, self.canary_name, canary.name)
            return
        if promoted:  # it serves the stable: first the stable InferenceService takes that version over
            if not self._settle(existing, stable):
                raise BackendError(f"{self.target}: {self.canary_name} serves the stable {stable.name} until "
                                   f"{self.name} is ready on it and has drained it; {canary.name} waits")
            stable_obj = self._get()
        elif not self._drained(existing, ROLLED_BACK_AT_ANNOTATION):
            raise BackendError(f"{self.target}: the rolled-back {_version_of(existing, self.alias)[0]} drains on "
                               f"{self.canary_name} for its trajectories; {canary.name} waits")
        self._replace(existing, stable_obj, canary)  # nothing routes to the version it holds any more

    def set_percent(self, canary: Version, stable: Version, percent: int) -> None:
        check_percent(percent)
        self._expect_canary(canary)

    def promote(self, canary: Version, stable: Version) -> None:
        check_version(canary, "canary")
        if _uri(self._get()) == canary.uri:
            return  # the stable InferenceService serves it already (a retried promote after retire)
        self._expect_canary(canary)

        def patch(obj):
            if _uri(obj) != canary.uri:
                raise UnknownVersion(f"{self.target}: {self.canary_name} no longer serves {canary.name}")
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            if annotations.get(PROMOTED_AT_ANNOTATION) and not annotations.get(ROLLED_BACK_AT_ANNOTATION):
                return None
            return {"metadata": {"annotations": {PROMOTED_AT_ANNOTATION: _stamp(self._clock()),
                                                 ROLLED_BACK_AT_ANNOTATION: None}}}

        self._patch(f"promote {canary.name} (served by {self.canary_name}; {self.name} keeps {stable.name} until "
                    f"it is retired)", patch, name=self.canary_name)

    def rollback(self, canary: Version, stable: Version) -> None:
        check_version(stable, "stable")
        if _uri(self._get()) != stable.uri:
            raise UnknownVersion(f"{self.target}: cannot roll back to {stable.name}: {self.name} does not serve it")
        existing = self._canary()
        if existing is None or _uri(existing) == stable.uri or _marked(existing, ROLLED_BACK_AT_ANNOTATION):
            return

        def patch(obj):
            if _uri(obj) == stable.uri or _marked(obj, ROLLED_BACK_AT_ANNOTATION):
                return None
            return {"metadata": {"annotations": {ROLLED_BACK_AT_ANNOTATION: _stamp(self._clock()),
                                                 PROMOTED_AT_ANNOTATION: None}}}

        self._patch(f"roll back {canary.name} ({self.canary_name} serves its trajectories until it is retired)",
                    patch, name=self.canary_name)

    def retire(self, version: Version) -> None:
        """Unload a withdrawn ``version``: a rolled-back canary's InferenceService is deleted; the old stable is
        replaced on the stable InferenceService by the promoted version ("stable ← canary"). Never the stable or a
        canary in progress (a warning, nothing changed)."""
        check_version(version, "retired")
        stable = self._get()
        canary = self._canary()
        if canary is not None and _uri(canary) == version.uri:
            if not _marked(canary, ROLLED_BACK_AT_ANNOTATION):
                log.warning("%s: not retiring %s: %s serves it as the %s", self.target, version.name,
                            self.canary_name, "promoted stable" if _marked(canary, PROMOTED_AT_ANNOTATION) else
                            "canary")
                return
            self._delete(f"retire {version.name}: delete {self.canary_name}", canary)
            self._draining = None
        elif _uri(stable) == version.uri:
            if canary is None or not _marked(canary, PROMOTED_AT_ANNOTATION):
                log.warning("%s: not retiring %s: %s serves it as the stable", self.target, version.name, self.name)
                return
            self._take_over(canary)

    def tidy(self, stable: Version) -> bool:
        """After a promote: once the stable InferenceService holds the promoted version (retire's patch; done here
        when no retire came ``drain_s`` after the promote) and is ready on it, and ``drain_s`` has passed since, the
        canary one is deleted. After a rollback: the rolled-back canary is deleted ``drain_s`` after it (when retire
        has not done it). A canary in progress is left alone. True when nothing is left to settle."""
        existing = self._canary()
        if existing is not None and _marked(existing, ROLLED_BACK_AT_ANNOTATION):
            if not self._drained(existing, ROLLED_BACK_AT_ANNOTATION):
                return False
            self._delete(f"delete the rolled-back {_version_of(existing, self.alias)[0]} ({self.canary_name})",
                         existing)
            return True
        if existing is None or _uri(existing) != stable.uri:
            self._draining = None
            return True
        if not self._settle(existing, stable):
            return False
        self._delete(f"delete {self.canary_name}: {self.name} serves {stable.name} now", existing)
        self._draining = None
        return True

    # --- helpers -----------------------------------------------------------------------------------------------------

    def _settle(self, existing: dict, stable: Version) -> bool:
        """``existing`` (the canary InferenceService) holds the promoted ``stable``: move that version onto the stable
        InferenceService when retire has not (``drain_s`` after the promote), then True once that is ready on it and
        ``drain_s`` has passed since it was first seen ready (from then on ``endpoint`` names it, so the routing
        table moves callers off the canary)."""
        stable_obj = self._get()
        if _uri(stable_obj) != stable.uri:
            self._draining = None
            if self._drained(existing, PROMOTED_AT_ANNOTATION):
                self._take_over(existing)
            return False
        if not self._ready(stable_obj, stable.uri):
            self._draining = None
            return False
        if self.drain_s <= 0:
            return True
        key, now = ((existing.get("metadata") or {}).get("uid"), stable.uri), self._clock()
        if self._draining is None or self._draining[0] != key:
            self._draining = (key, now)
            log.info("%s: %s is ready on %s; %s drains for %g s", self.target, self.name, stable.name,
                     self.canary_name, self.drain_s)
            return False
        return now - self._draining[1] >= self.drain_s

    def _take_over(self, canary: dict) -> None:
        """"stable ← canary": the stable InferenceService loads the promoted version the canary one holds."""
        version, uri = _version_of(canary, self.alias)

        def patch(obj):
            predictor = predictor_of(obj)
            model = predictor.get("model") or {}
            if model.get("storageUri") == uri and served_names(model.get("args"))[:1] == [version] \
                    and predictor.get("canaryTrafficPercent") is None:
                return None
            body = {"metadata": {"annotations": {OBSERVED_BEFORE_ANNOTATION: _observed(obj)}},
                    "spec": {"predictor": {"model": {
                        "storageUri": uri, "args": with_served_name(model.get("args"), version, self.alias)}}}}
            if "canaryTrafficPercent" in predictor:  # left from mode canary: the new model must take the traffic
                body["spec"]["predictor"]["canaryTrafficPercent"] = None
            return body

        self._patch(f"{self.name} takes over {version} from {self.canary_name}", patch)

    def _create_canary(self, stable: dict, canary: Version) -> None:
        if self._create(f"create {self.canary_name} serving {canary.name}", self._canary_object(stable, canary)):
            return
        again = self._get(self.canary_name, missing_ok=True)  # created meanwhile (our earlier attempt, answer lost?)
        if again is None or _uri(again) != canary.uri or (again.get("metadata") or {}).get("deletionTimestamp"):
            raise BackendError(f"{self.target}: {self.canary_name} was created or deleted meanwhile; retrying")

    def _canary(self) -> dict | None:
        """The canary InferenceService when it exists, is ours and is not being deleted."""
        obj = self._get(self.canary_name, missing_ok=True)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return None
        if not _ours(obj):
            log.warning("%s: %s is not managed by the rollout controller (label %s); ignoring it", self.target,
                        self.canary_name, MANAGED_BY_LABEL)
            return None
        return obj

    def _check_ours(self, obj: dict) -> None:
        if not _ours(obj):
            raise BackendError(f"{self.target}: an InferenceService named {self.canary_name} exists and is not "
                               f"managed by the rollout controller (label {MANAGED_BY_LABEL}: {MANAGED_BY}); remove "
                               f"or rename it", retryable=False, reason=Reason.FAILED_PRECONDITION)

    def _expect_canary(self, canary: Version) -> None:
        existing = self._canary()
        if existing is None or _uri(existing) != canary.uri or _marked(existing, ROLLED_BACK_AT_ANNOTATION):
            held = "does not exist" if existing is None else f"serves {_uri(existing)!r}"
            raise UnknownVersion(f"{self.target}: {self.canary_name} {held}, not the canary {canary.name} "
                                 f"({canary.uri})")

    def _drained(self, obj: dict, annotation: str) -> bool:
        """``drain_s`` has passed since ``obj`` was marked with ``annotation`` (unmarked: nothing drains)."""
        stamp = ((obj.get("metadata") or {}).get("annotations") or {}).get(annotation)
        try:
            return stamp is None or self._clock() - float(stamp) >= self.drain_s
        except ValueError:
            return True

    def _ready(self, obj: dict, uri: str) -> bool:
        """Whether ``obj`` is ready and serves ``uri`` (see the module's docstring)."""
        if _uri(obj) != uri or not reconciled(obj) or isvc_failure(obj):
            return False
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        before = (meta.get("annotations") or {}).get(OBSERVED_BEFORE_ANNOTATION)
        if before is not None and before.isdigit() and int(status.get("observedGeneration") or 0) <= int(before):
            return False  # the status still describes the object before our patch
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        if (conditions.get("Ready") or {}).get("status") != "True":
            return False
        component = (status.get("components") or {}).get("predictor") or {}
        if component.get("latestCreatedRevision") \
                and component.get("latestReadyRevision") != component.get("latestCreatedRevision"):
            return False  # Knative: the newest revision is still starting
        mode = (meta.get("annotations") or {}).get(DEPLOYMENT_MODE_ANNOTATION) or status.get("deploymentMode")
        predictor = conditions.get("PredictorReady") or {}
        if mode in RAW_MODES and predictor.get("reason") and predictor["reason"] != "NewReplicaSetAvailable":
            return False  # Standard: the Deployment is still rolling out
        return True

    def _canary_object(self, stable: dict, canary: Version) -> dict:
        meta = stable.get("metadata") or {}
        labels = {**(meta.get("labels") or {}), MANAGED_BY_LABEL: MANAGED_BY, VERSION_LABEL: _label(canary.name)}
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                       if not k.startswith(_NOT_COPIED) and k != OBSERVED_BEFORE_ANNOTATION}
        annotations.update({CANARY_OF_ANNOTATION: self.name, CHECKPOINT_ANNOTATION: canary.uri})
        spec = copy.deepcopy(stable.get("spec") or {})
        predictor = spec.setdefault("predictor", {})
        predictor.pop("canaryTrafficPercent", None)
        model = predictor.setdefault("model", {})
        model["storageUri"] = canary.uri
        model["args"] = with_served_name(model.get("args"), canary.name, self.alias)
        metadata = {"name": self.canary_name, "namespace": self.namespace, "labels": labels,
                    "annotations": annotations}
        if meta.get("uid"):  # deleting the stable (helm uninstall) deletes the canary
            metadata["ownerReferences"] = [{"apiVersion": f"{GROUP}/{API_VERSION}", "kind": "InferenceService",
                                            "name": self.name, "uid": meta["uid"]}]
        return {"apiVersion": f"{GROUP}/{API_VERSION}", "kind": "InferenceService", "metadata": metadata,
                "spec": spec}

    def _replace(self, existing: dict, stable: dict, canary: Version) -> None:
        """Turn the canary InferenceService (holding a version nothing routes to any more) into ``canary``'s: one
        merge patch to the spec, labels and annotations a fresh one would have."""
        desired = self._canary_object(stable, canary)
        uid = (existing.get("metadata") or {}).get("uid")
        self._draining = None

        def patch(obj):
            meta = obj.get("metadata") or {}
            if meta.get("uid") != uid:
                raise BackendError(f"{self.target}: {self.canary_name} was replaced meanwhile; retrying")
            annotations = {**desired["metadata"]["annotations"], OBSERVED_BEFORE_ANNOTATION: _observed(obj)}
            body = {}
            metadata = {key: diff for key, want in (("labels", desired["metadata"]["labels"]),
                                                    ("annotations", annotations))
                        if (diff := merge_patch(meta.get(key) or {}, want))}
            if metadata:
                body["metadata"] = metadata
            if spec := merge_patch(obj.get("spec") or {}, desired["spec"]):
                body["spec"] = spec
            return body or None

        self._patch(f"replace {_version_of(existing, self.alias)[0]} on {self.canary_name} by {canary.name}", patch,
                    name=self.canary_name)


def merge_patch(current: dict, desired: dict) -> dict:
    """The JSON merge patch (RFC 7386) that turns ``current`` into ``desired``: maps recursively, keys only in
    ``current`` set to null, anything else (lists too) replaced when it differs."""
    patch: dict = {key: None for key in current if key not in desired}
    for key, value in desired.items():
        old = current.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            if sub := merge_patch(old, value):
                patch[key] = sub
        elif key not in current or old != value:
            patch[key] = value
    return patch


def _uri(obj: dict) -> str:
    return str((((obj.get("spec") or {}).get("predictor") or {}).get("model") or {}).get("storageUri") or "")


def _args(obj: dict) -> list:
    return (((obj.get("spec") or {}).get("predictor") or {}).get("model") or {}).get("args") or []


def _version_of(obj: dict, alias: str) -> tuple[str, str]:
    """(version name, checkpoint URI) an InferenceService serves: its first served name (else the alias)."""
    names = served_names(_args(obj))
    return (names[0] if names else alias), _uri(obj)


def _ours(obj: dict) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def _marked(obj: dict, annotation: str) -> bool:
    return bool(((obj.get("metadata") or {}).get("annotations") or {}).get(annotation))


def _observed(obj: dict) -> str:
    return str(int((obj.get("status") or {}).get("observedGeneration") or 0))


def _stamp(now: float) -> str:
    return f"{now:.3f}"


def _label(value: str) -> str:
    """``value`` as a valid label value (at most 63 of [A-Za-z0-9._-], alphanumeric at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)
