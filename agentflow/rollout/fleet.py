"""The rollout fleet: a server that holds the newest published planner versions for training rollouts alone.

Production routing (the stable version and the canary) moves a new version in only once the canary ladder reaches
it, so rollouts pinned to ``latest`` would otherwise wait, or run on the production versions and be dropped as
stale. The fleet is a separate server that users' traffic never reaches (``agentflow.llm.routing``: only pinned
calls go there). The rollout controller loads each version into it as it is published and names what it holds in
the routing table (``fleet_versions``, newest first), so ``latest`` resolves to the newest loaded version:

* ``lora`` — LoRA adapter versions on a vLLM server with runtime LoRA updating (or ``agentflow serve-llm``, which
  speaks the same routes): ``POST /v1/load_lora_adapter`` at publication, ``/v1/unload_lora_adapter`` once a version
  falls out of the newest ``slots``. Start vLLM with ``--max-loras`` of at least ``slots`` (TRL's rule: at least
  ``max_staleness + 1``), so that a rollout finishes on the adapter it began with.
* ``local`` — full-weight versions on ``agentflow serve-llm`` through its admin API (``POST /admin/versions``, the
  newest one given the server's weight, ``DELETE`` for the old ones).
* ``vllm`` — full-weight versions on a vLLM that replaces its weights in place from the version's folder, one
  version at a time (``agentflow.rollout.vllm_fleet``).

The fleet's state is the server's: after a restart the controller reads what is loaded and carries on. A version
the server refuses is skipped (logged, counted); a server that cannot be reached is tried again on the next tick.
The load lag (publication to loaded) is a metric; the trainer measures publication to first rollout.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from agentflow.errors import InvalidInput
from agentflow.rollout.backends import BackendError, LocalBackend, Version, VersionRejected, check_version
from agentflow.rollout.lora import LoraBackend
from agentflow.rollout.settings import FLEET_KINDS
from agentflow.rollout.vllm_fleet import WeightsFleetServer
from agentflow.versions import parse_version

log = logging.getLogger(__name__)


class FleetServer(Protocol):
    """What the fleet needs of a server: which versions it holds, and loading and unloading one."""

    target: str
    serving_url: str  # the OpenAI base URL pinned calls are sent to
    model: str  # the one model name every version is served under ("": each its own name)
    capacity: int | None  # versions it can hold at once (None: as many as the slots)

    def loaded(self) -> set[str]: ...

    def load(self, version: Version) -> None: ...

    def unload(self, name: str) -> None: ...


class LoraFleetServer:
    """Adapters on vLLM's runtime LoRA API (``LoraBackend``'s calls). The base model counts as loaded (the store's
    first version is served under its name) and is never unloaded."""

    model, capacity = "", None

    def __init__(self, backend: LoraBackend):
        self.backend, self.target, self.serving_url = backend, backend.target, backend.serving_url
        self.bases: set[str] = set()

    def loaded(self) -> set[str]:
        models = self.backend._models()
        self.bases = {m.name for m in models if m.base}
        return {m.name for m in models}

    def load(self, version: Version) -> None:
        self.backend.load(version)

    def unload(self, name: str) -> None:
        if name not in self.bases:
            self.backend.retire(Version(name, ""))


class AdminFleetServer:
    """Full-weight versions on ``agentflow serve-llm``'s admin API. Its weights do not matter here (pinned calls name
    their version), but a weighted version cannot be unloaded: the newest one loaded takes the weight."""

    model, capacity = "", None

    def __init__(self, backend: LocalBackend):
        self.backend, self.target, self.serving_url = backend, backend.target, backend.serving_url

    def loaded(self) -> set[str]:
        return {v.name for v in self.backend.status().versions}

    def load(self, version: Version) -> None:
        status = self.backend.status()
        if status.weight(version.name) is None:
            self.backend._load(version)
            status = None
        self.backend._set_weights({version.name: 100}, status)

    def unload(self, name: str) -> None:
        status = self.backend.status()
        others = [v.name for v in status.versions if v.name != name]
        if status.weight(name) and others:  # the weight moves to the newest of the others first
            self.backend._set_weights({max(others, key=lambda v: parse_version(v) or -1): 100}, status)
        self.backend.retire(Version(name, ""))


def fleet_server(kind: str, url: str, *, token: str = "", serving_url: str = "", mirror: str = "",
                 **options) -> FleetServer:
    if kind not in FLEET_KINDS:
        raise InvalidInput(f"the rollout fleet is one of {', '.join(FLEET_KINDS)}, got {kind!r}")
    if mirror and kind != "vllm":
        raise InvalidInput(f"a mirror folder is for the vllm fleet, not {kind}")
    if kind == "lora":
        return LoraFleetServer(LoraBackend(url, token=token, serving_url=serving_url, **options))
    if kind == "vllm":
        return WeightsFleetServer(url, token=token, serving_url=serving_url, mirror=mirror, **options)
    return AdminFleetServer(LocalBackend(url, token=token, serving_url=serving_url, **options))


class RolloutFleet:
    """Keeps the newest ``slots`` published versions loaded on ``server``. ``publish`` notes a version; ``sync``
    (on each publication and controller tick) loads what is missing, newest first, then unloads what fell out;
    ``versions`` is what the routing table names, newest first (while a version fails to load: what the server
    holds meanwhile). A version the server refuses is skipped, so it
    never takes the slot of an older one that loads."""

    def __init__(self, server: FleetServer, slots: int, *, clock: Callable[[], float] = time.time,
                 on_loaded: Callable[[str, float], None] | None = None, recheck_s: float = 30.0):
        if slots < 1:
            raise InvalidInput(f"the rollout fleet needs at least one slot, got {slots}")
        self.server, self.slots, self.clock = server, min(slots, server.capacity or slots), clock
        self.on_loaded = on_loaded  # (version, seconds from publication to loaded)
        self.recheck_s = recheck_s
        #: the newest published versions that the server did not refuse, oldest first: name -> (version, published)
        self.published: OrderedDict[str, tuple[Version, float]] = OrderedDict()
        self.held: list[str] | None = None  # loaded and wanted, newest first (None: not read from the server yet)
        self._checked_at = 0.0

    @property
    def endpoint(self) -> str:
        return self.server.serving_url

    @property
    def model(self) -> str:
        return self.server.model

    @property
    def versions(self) -> tuple[str, ...]:
        return tuple(self.held or ())

    @property
    def wanted(self) -> list[str]:
        """The newest ``slots`` versions, newest first."""
        return list(reversed(self.published))[:self.slots]

    def publish(self, version: Version, published_at_s: float) -> None:
        check_version(version, "published")
        if version.name in self.published:
            return
        self.published[version.name] = (version, published_at_s)
        ordered = sorted(self.published.items(), key=lambda kv: parse_version(kv[0]) or -1)
        self.published = OrderedDict(ordered[-4 * self.slots:])  # room for refusals; older ones are never wanted

    def sync(self, *, force: bool = False) -> bool:
        """Load the wanted versions that are missing (newest first), unload the others; True when ``versions``
        changed. Between publications the server is read every ``recheck_s`` (a restarted server is loaded again),
        or now with ``force``. A server that cannot be reached changes nothing (the next tick tries again)."""
        settled = self.held is not None and self.versions == tuple(self.wanted)
        if not self.published or (settled and not force and self.clock() - self._checked_at < self.recheck_s):
            return False
        before, loaded = self.versions, None
        try:
            loaded = self.server.loaded()
            while missing := [name for name in self.wanted if name not in loaded]:
                if self._load(*self.published[missing[0]]):  # a refused one leaves; the next older is wanted
                    loaded.add(missing[0])
            wanted = self.wanted
            for name in sorted(loaded - set(wanted)):
                self.server.unload(name)
            self.held = [name for name in wanted if name in loaded]
            self._checked_at = self.clock()
        except BackendError as e:
            log.warning("rollout fleet %s: %s (trying again on the next tick)", self.server.target, e)
            if loaded is not None:  # a version did not load (not mirrored yet): what the server holds serves meanwhile
                held = [name for name in loaded if parse_version(name) is not None]
                self.held = sorted(held, key=parse_version, reverse=True)[:self.slots]
        return self.versions != before

    def _load(self, version: Version, published_at_s: float) -> bool:
        try:
            self.server.load(version)
        except VersionRejected as e:
            log.error("rollout fleet %s refused %s, skipping it: %s", self.server.target, version.name, e)
            del self.published[version.name]
            return False
        lag = max(0.0, self.clock() - published_at_s)
        log.info("rollout fleet %s loaded %s, %.1f s after its publication", self.server.target, version.name, lag)
        if self.on_loaded is not None:
            self.on_loaded(version.name, lag)
        return True
