"""Where planner versions are served, behind one small protocol, and the local backend (``agentflow serve-llm``'s
admin API). The KServe backend is in ``agentflow.rollout.kserve``.

Every backend is stateless: each call names the canary and the stable version (name and checkpoint URI), so a
restarted controller can carry on from its last decision. Each operation either completes or leaves the traffic
as it was (the stable version keeps serving): no half-states.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agentflow.errors import AgentFlowError, InvalidInput, Reason
from agentflow.versions import check_version_name, parse_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Version:
    """A planner version as the serving side knows it: the name responses report, and its checkpoint."""

    name: str
    uri: str


@dataclass(frozen=True)
class Endpoint:
    """Where one version is served: an OpenAI-compatible base URL (including ``/v1``) and the model name to send.
    The routing table (``planner.routing``) lists one per live version; callers follow it (docs/rollout.md)."""

    url: str
    model: str


@dataclass(frozen=True)
class ServedVersion:
    name: str
    uri: str
    weight: int  # percent of the traffic


@dataclass(frozen=True)
class BackendStatus:
    versions: tuple[ServedVersion, ...]
    #: False while a freshly loaded canary is not ready to take traffic yet (KServe: its revision is starting).
    canary_ready: bool = True
    #: Why the latest version cannot serve (KServe: the checkpoint failed to load); "" when nothing failed.
    canary_failure: str = ""

    def weight(self, name: str) -> int | None:
        return next((v.weight for v in self.versions if v.name == name), None)


class BackendError(AgentFlowError):
    """A backend operation failed; nothing was changed. ``retryable``: worth trying again later."""

    reason = Reason.UNAVAILABLE

    def __init__(self, message: str, *, retryable: bool = True, reason: str | None = None):
        super().__init__(message, reason=reason)
        self.retryable = retryable


class VersionRejected(BackendError):
    """The backend refused the version itself (its checkpoint failed to load, its name is taken by another URI)."""

    reason = Reason.INVALID_INPUT

    def __init__(self, message: str):
        super().__init__(message, retryable=False)


def strip_file(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def local_path(version: "Version", backend: str) -> str:
    """The absolute local path a server loads ``version`` from (its URI without ``file://``): the model store mounted
    at the same path in the server's pod. Anything else is refused."""
    path = strip_file(version.uri)
    if "://" in path or not os.path.isabs(path):
        raise VersionRejected(f"the {backend} loads versions from absolute local paths (the model store mounted at "
                              f"the same path in the server's pod); {version.name!r} has {version.uri!r}")
    return path


class UnknownVersion(BackendError):
    """The backend does not know a version the operation names."""

    reason = Reason.NOT_FOUND

    def __init__(self, message: str):
        super().__init__(message, retryable=False)


class Backend(Protocol):
    kind: str  # "local" | "lora" | "kserve"
    target: str  # what it drives, for logs and decision events

    def status(self) -> BackendStatus: ...

    def endpoint(self, version: Version) -> Endpoint:
        """Where a loaded ``version`` is served now: its entry in the routing table. Raises ``BackendError``."""

    def load_canary(self, canary: Version, stable: Version, percent: int) -> None:
        """Make ``canary`` servable and give it ``percent`` of the traffic (the rest stays on ``stable``)."""

    def set_percent(self, canary: Version, stable: Version, percent: int) -> None:
        """Move the canary's share to ``percent`` (0 < percent < 100)."""

    def promote(self, canary: Version, stable: Version) -> None:
        """All traffic to ``canary``; it becomes the stable version. The old stable stays servable (``retire``)."""

    def rollback(self, canary: Version, stable: Version) -> None:
        """All traffic back to ``stable``. The canary stays servable for the trajectories on it (``retire``)."""

    def retire(self, version: Version) -> None:
        """Unload a withdrawn version that no route names any more (idempotent; never the stable or the canary)."""

    # Optional: ``tidy(stable) -> bool``, called on ticks after a rollback until it returns True (KServe: drop
    # ``canaryTrafficPercent: 0`` once the revision with the restored model is ready).


def check_percent(percent: int, *, low: int = 1, high: int = 99) -> int:
    if isinstance(percent, bool) or not isinstance(percent, int) or not low <= percent <= high:
        raise InvalidInput(f"canary percent must be an integer in [{low}, {high}], got {percent!r}")
    return percent


def check_weights(weights: dict[str, int]) -> dict[str, int]:
    """Integer percents, none negative, summing to 100 (what the admin API accepts)."""
    if not weights:
        raise InvalidInput("weights are empty")
    for name, weight in weights.items():
        if not name:
            raise InvalidInput("a weight has an empty version name")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            raise InvalidInput(f"weight of {name!r} must be a non-negative integer percent, got {weight!r}")
    if sum(weights.values()) != 100:
        raise InvalidInput(f"weights must sum to 100, got {sum(weights.values())}: {weights}")
    return weights


def check_version(version: Version, what: str) -> Version:
    if not version.name or not version.uri:
        raise InvalidInput(f"the {what} version needs a name and a checkpoint URI, got {version}")
    check_version_name(version.name)  # it goes into the server's URL paths and headers
    return version


class AdminClient:
    """An LLM server's HTTP API as the local and LoRA backends drive it: the base URL (an OpenAI base URL ending in
    ``/v1`` is taken for the server's), an optional bearer token, and requests whose connection errors, timeouts,
    429 and 5xx answers are retried ``retries`` times with doubling backoff before a retryable ``BackendError``;
    401/403 and 404 raise at once (``UnknownVersion`` for 404), other unexpected statuses too, not retryable."""

    def __init__(self, url: str, *, token: str = "", timeout_s: float = 10.0, retries: int = 3,
                 backoff_s: float = 0.2, sleep: Callable[[float], None] = time.sleep, transport=None):
        import httpx

        self.target = url.rstrip("/").removesuffix("/v1")
        self.retries, self.backoff_s, self._sleep = retries, backoff_s, sleep
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.target, headers=headers, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, json=None, accept=(200,), timeout_s: float | None = None):
        """The response of ``method path`` when its status is in ``accept`` (``timeout_s``: this request's, in place
        of the client's)."""
        import httpx

        last = ""
        options = {} if timeout_s is None else {"timeout": timeout_s}
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self.http.request(method, path, json=json, **options)
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if response.status_code in accept:
                return response
            if response.status_code >= 500 or response.status_code == 429:
                last = f"HTTP {response.status_code}: {error_message(response)}"
                continue
            where = f"{method} {self.target}{path}"
            if response.status_code in (401, 403):
                raise BackendError(f"{where}: HTTP {response.status_code} (check the admin token, "
                                   f"AGENTFLOW_ROLLOUT_ADMIN_TOKEN)", retryable=False, reason=Reason.UNAUTHENTICATED)
            if response.status_code == 404:
                raise UnknownVersion(f"{where}: not found ({error_message(response)})")
            raise BackendError(f"{where}: HTTP {response.status_code}: {error_message(response)}", retryable=False)
        raise BackendError(f"{method} {self.target}{path} failed {self.retries + 1} times; last: {last}")


class LocalBackend:
    """Drives ``agentflow serve-llm`` over its admin HTTP API:

    ``GET /admin/versions`` -> ``{"versions": [{"name", "uri", "weight"}]}``; ``POST /admin/versions``
    ``{"name", "uri"}`` -> 201 (409 name taken, 400 checkpoint failed to load); ``PUT /admin/weights``
    ``{"weights": {name: percent}}`` -> 200 (400 unknown name or not summing to 100); ``DELETE
    /admin/versions/{name}`` -> 200 (404 unknown, 409 still weighted). Optional bearer token.

    Connection errors, timeouts and 5xx answers are retried ``retries`` times with doubling backoff, then raise a
    retryable ``BackendError``.
    """

    kind = "local"

    def __init__(self, url: str, *, serving_url: str = "", **client):
        """``client``: ``AdminClient``'s options (token, timeout_s, retries, backoff_s, sleep, transport)."""
        if not url:
            raise InvalidInput("the local backend needs the LLM server's URL (--llm-admin-url or "
                               "AGENTFLOW_ROLLOUT_LLM_URL)")
        self.admin = AdminClient(url, **client)
        self.target = self.admin.target
        self.serving_url = serving_url or self.target + "/v1"  # what callers send chat requests to

    def close(self) -> None:
        self.admin.close()

    # --- the protocol -------------------------------------------------------------------------------------------------

    def status(self) -> BackendStatus:
        data = self.admin.request("GET", "/admin/versions").json()
        try:
            versions = tuple(ServedVersion(str(v["name"]), str(v.get("uri", "")), int(v.get("weight", 0)))
                             for v in data["versions"])
        except (KeyError, TypeError, ValueError) as e:
            raise BackendError(f"{self.target}/admin/versions answered an unexpected body: {str(data)[:200]}",
                               retryable=False) from e
        return BackendStatus(versions)

    def endpoint(self, version: Version) -> Endpoint:
        """One server holds every version: callers name it as the model (serve-llm routes by it)."""
        return Endpoint(self.serving_url, version.name)

    def load_canary(self, canary: Version, stable: Version, percent: int) -> None:
        check_version(canary, "canary"), check_version(stable, "stable"), check_percent(percent)
        if canary.name == stable.name:
            raise InvalidInput(f"canary and stable are the same version {canary.name!r}")
        status = self.status()
        if status.weight(stable.name) is None:
            raise UnknownVersion(f"the stable version {stable.name!r} is not loaded on {self.target}")
        existing = next((v for v in status.versions if v.name == canary.name), None)
        if existing is not None and existing.uri != canary.uri:
            raise VersionRejected(f"{self.target} already serves a version named {canary.name!r} from "
                                  f"{existing.uri}, not {canary.uri}")
        if existing is None:
            self._load(canary)
        try:
            self._set_weights({stable.name: 100 - percent, canary.name: percent})
        except BackendError:
            self._unload(canary.name)  # nothing routed to it: take it away again
            raise

    def set_percent(self, canary: Version, stable: Version, percent: int) -> None:
        check_percent(percent)
        self._set_weights({stable.name: 100 - percent, canary.name: percent})

    def promote(self, canary: Version, stable: Version) -> None:
        self._set_weights({canary.name: 100, stable.name: 0})

    def rollback(self, canary: Version, stable: Version) -> None:
        status = self.status()
        if status.weight(stable.name) is None:
            raise UnknownVersion(f"cannot roll back to {stable.name!r}: {self.target} does not serve it")
        if status.weight(canary.name) is not None:
            self._set_weights({stable.name: 100, canary.name: 0}, status)
        elif status.weight(stable.name) != 100:
            self._set_weights({stable.name: 100}, status)

    def retire(self, version: Version) -> None:
        self._unload(version.name)

    # --- plumbing ----------------------------------------------------------------------------------------------------

    def _load(self, version: Version) -> None:
        """Load ``version`` with weight 0; ``VersionRejected`` when the server cannot load it."""
        response = self.admin.request("POST", "/admin/versions", json={"name": version.name, "uri": version.uri},
                                 accept=(201, 400, 409))
        if response.status_code == 400:
            raise VersionRejected(f"{self.target} could not load {version.name!r} from {version.uri}: "
                                  f"{error_message(response)}")
        if response.status_code == 409:  # created concurrently (e.g. by our own earlier attempt)
            again = self.status()
            if not any(v.name == version.name and v.uri == version.uri for v in again.versions):
                raise VersionRejected(f"{self.target} refused {version.name!r}: {error_message(response)}")

    def _set_weights(self, wanted: dict[str, int], status: BackendStatus | None = None) -> None:
        """Send ``wanted``; the server gives every version it does not name 0. Naming them all with 0, as it once
        did, raced the server's own unloading: a version unloaded between the status read and the PUT made the
        server refuse the whole map, and the canary was rejected as unloadable (seen in a demo run)."""
        status = status or self.status()
        known = {v.name for v in status.versions}
        missing = sorted(set(wanted) - known)
        if missing:
            raise UnknownVersion(f"{self.target} does not serve {', '.join(map(repr, missing))} "
                                 f"(it serves {', '.join(sorted(known)) or 'nothing'})")
        weights = check_weights(wanted)
        response = self.admin.request("PUT", "/admin/weights", json={"weights": weights}, accept=(200, 400))
        if response.status_code == 400:
            raise BackendError(f"{self.target} refused weights {weights}: {error_message(response)}", retryable=False,
                               reason=Reason.INVALID_INPUT)

    def _unload(self, name: str) -> None:
        """Best effort: a version left loaded with weight 0 costs memory, not correctness."""
        try:
            response = self.admin.request("DELETE", f"/admin/versions/{name}", accept=(200, 404, 409))
            if response.status_code == 409:
                log.warning("%s kept %s loaded: %s", self.target, name, error_message(response))
        except BackendError as e:
            log.warning("could not unload %s from %s: %s", name, self.target, e)


class SeparateBackend:
    """Full-weight versions each on its own ``agentflow serve-llm`` process (the shape of KServe's pair mode without
    Kubernetes): a canary is loaded, with all of that server's traffic, on a server that does not serve the stable
    version (or, when every server serves it, the last one); the routing table names the server each version is on.
    ``promote`` and ``rollback`` change nothing on the servers (the weights live in the routing table); ``retire``
    unloads a withdrawn version wherever it is idle. Each server keeps at least one version (its last one cannot be
    unloaded): a server whose version is withdrawn is where the next canary goes."""

    kind = "local"

    def __init__(self, urls: list[str], **options):
        if len(urls) < 2:
            raise InvalidInput("the separate backend needs two LLM server URLs or more (comma-separated "
                               "--llm-admin-url)")
        self.servers = [LocalBackend(url, **options) for url in urls]
        self.target = ",".join(s.target for s in self.servers)

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def status(self) -> BackendStatus:
        """Each version once, with 100 where a server gives it all its traffic."""
        weights: dict[str, ServedVersion] = {}
        for server in self.servers:
            for v in server.status().versions:
                if v.name not in weights or v.weight > weights[v.name].weight:
                    weights[v.name] = v
        return BackendStatus(tuple(weights.values()))

    def endpoint(self, version: Version) -> Endpoint:
        server = self._serving(version, idle_too=True)  # a draining version is idle
        if server is None:
            raise UnknownVersion(f"no server of {self.target} serves {version.name}")
        return server.endpoint(version)

    def load_canary(self, canary: Version, stable: Version, percent: int) -> None:
        check_version(canary, "canary"), check_version(stable, "stable"), check_percent(percent)
        statuses = [(server, server.status()) for server in self.servers]
        if not any(status.weight(stable.name) for _, status in statuses):
            raise UnknownVersion(f"no server of {self.target} serves the stable version {stable.name!r}")
        holding = next((server for server, status in statuses if status.weight(canary.name) is not None), None)
        free = [server for server, status in statuses if not status.weight(stable.name)]
        server = holding or (free or [s for s, _ in statuses])[-1]
        if holding is None:
            server._load(canary)
        server._set_weights({canary.name: 100})

    def set_percent(self, canary: Version, stable: Version, percent: int) -> None:
        check_percent(percent)
        self._expect(canary, "the canary")

    def promote(self, canary: Version, stable: Version) -> None:
        self._expect(canary, "the canary")

    def rollback(self, canary: Version, stable: Version) -> None:
        self._expect(stable, "the stable version to roll back to")

    def retire(self, version: Version) -> None:
        """Unload ``version`` from every server that holds another version too (its traffic moves to the newest
        of those first); a server's only version stays, and the next canary goes there."""
        for server in self.servers:
            status = server.status()
            others = [v for v in status.versions if v.name != version.name]
            if status.weight(version.name) is None or not others:
                continue
            if status.weight(version.name):
                newest = max(others, key=lambda v: (parse_version(v.name) or -1, v.weight))
                server._set_weights({newest.name: 100}, status)
            server.retire(version)

    def _serving(self, version: Version, *, idle_too: bool = False) -> LocalBackend | None:
        """The server giving ``version`` traffic; with ``idle_too``, else one that only holds it (one status read
        per server)."""
        weights = [(server, server.status().weight(version.name)) for server in self.servers]
        return (next((server for server, weight in weights if weight), None)
                or next((server for server, weight in weights if idle_too and weight is not None), None))

    def _expect(self, version: Version, what: str) -> None:
        if self._serving(version) is None:
            raise UnknownVersion(f"no server of {self.target} serves {what} {version.name!r}")


def error_message(response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300] or f"HTTP {response.status_code}"
    if isinstance(data, dict):
        for key in ("error", "message", "detail"):
            value = data.get(key)
            if isinstance(value, dict):
                value = value.get("message") or value
            if value:
                return str(value)[:300]
    return str(data)[:300]
