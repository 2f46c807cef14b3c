"""The model versions one LLM server holds, and how traffic is split between them (a KServe-style canary).

``Versions`` maps a version name to a loaded engine and an integer traffic weight (percent; the weights of the
loaded versions sum to 100). A request is routed by its trajectory id: the first call of a trajectory picks a
version by hashing the id into one of 100 buckets laid over the versions newest first (so a canary's share grows
by taking buckets from the stable version, and a trajectory id keeps its bucket), and every later call of the same
trajectory goes to the version its first call used, while that version is loaded — all turns of a trajectory see
one policy, even when the weights change mid-trajectory. Requests without an id are spread by a counter.

Changes are atomic: a version that fails to load, a name ``agentflow.versions.check_version_name`` refuses, an
unknown name or weights that do not sum to 100 raise ``VersionError`` and leave the serving set as it was.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import threading
import time
from collections import OrderedDict
from typing import Callable

from agentflow.errors import AgentFlowError, InvalidInput, Reason
from agentflow.llm.base import Engine
from agentflow.versions import check_version_name, parse_version

log = logging.getLogger(__name__)
AFFINITY_SIZE = 100_000  # trajectory ids remembered for sticky routing (least recently used dropped first)


class VersionError(AgentFlowError):
    """An admin request that cannot be applied; ``status`` is the HTTP status the server answers with."""

    reason = Reason.INVALID_INPUT

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Versions:
    """Loaded versions, their weights and the sticky router. Thread-safe."""

    def __init__(self, load: Callable[[str, str], Engine], *, close_grace_s: float = 30.0):
        self.close_grace_s = close_grace_s
        self._load = load  # (name, uri) -> engine; raises on a checkpoint that cannot be served
        self._engines: dict[str, Engine] = {}
        self._uris: dict[str, str] = {}
        self._weights: dict[str, int] = {}
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._loaded = itertools.count()  # load order: the tie-break of ``newest_first``
        self._order: dict[str, int] = {}
        self._used: dict[str, float] = {}  # version -> when a call last went to it (time.monotonic)

    # --- admin ---------------------------------------------------------------------------------------------------
    def add(self, name: str, uri: str, engine: Engine | None = None) -> None:
        """Load a version with weight 0 (the first one loaded gets 100)."""
        _check_name(name)
        with self._lock:
            if name in self._engines:
                raise VersionError(f"version {name!r} is already loaded", 409)
        if engine is None:
            try:
                engine = self._load(name, uri)
            except Exception as e:  # noqa: BLE001 - any load failure is the caller's bad checkpoint
                raise VersionError(f"version {name!r} could not be loaded from {uri!r}: {e}") from e
        with self._lock:
            if name in self._engines:
                _close(engine)
                raise VersionError(f"version {name!r} is already loaded", 409)
            self._engines[name], self._uris[name] = engine, uri
            self._weights[name] = 0 if self._weights else 100
            self._order[name] = next(self._loaded)
        log.info("loaded version %s from %s", name, uri)

    def set_weights(self, weights: dict[str, int]) -> None:
        """Set every loaded version's weight at once (versions not named get 0)."""
        if not isinstance(weights, dict) or not weights:
            raise VersionError("weights must be a non-empty object {version: percent}")
        with self._lock:
            unknown = sorted(set(weights) - set(self._engines))
            if unknown:
                raise VersionError(f"unknown version(s) {', '.join(map(repr, unknown))}; loaded: "
                                   f"{', '.join(sorted(self._engines)) or 'none'}")
            if not all(isinstance(w, int) and not isinstance(w, bool) and 0 <= w <= 100 for w in weights.values()):
                raise VersionError(f"weights must be integers from 0 to 100, got {weights}")
            if sum(weights.values()) != 100:
                raise VersionError(f"weights must sum to 100, got {sum(weights.values())} ({weights})")
            self._weights = {name: int(weights.get(name, 0)) for name in self._engines}
        log.info("weights now %s", weights)

    def remove(self, name: str) -> None:
        """Unload a version that takes no traffic."""
        _check_name(name)
        with self._lock:
            if name not in self._engines:
                raise VersionError(f"unknown version {name!r}", 404)
            if self._weights.get(name, 0) > 0:
                raise VersionError(f"version {name!r} still has weight {self._weights[name]}; move its traffic "
                                   "first", 409)
            engine = self._engines.pop(name)
            self._uris.pop(name)
            self._weights.pop(name)
            self._order.pop(name)
            self._used.pop(name, None)
        # calls routed to it just before may still be running: close it once they have had time to finish
        timer = threading.Timer(self.close_grace_s, _close, (engine,))
        timer.daemon = True
        timer.start()
        log.info("unloaded version %s", name)

    def prune(self, keep: int = 1, *, unused_s: float = 0.0) -> list[str]:
        """Unload the idle versions but the ``keep`` newest; returns their names. Idle: weight 0, and no call in the
        last ``unused_s`` seconds (a version a router still sends trajectories to, draining after a rollback, stays
        loaded)."""
        now = time.monotonic()
        with self._lock:
            idle = [v for v in reversed(self._newest_first())
                    if self._weights[v] == 0 and now - self._used.get(v, -math.inf) >= unused_s]
        dropped = idle[: max(len(idle) - keep, 0)]
        for old in dropped:
            try:
                self.remove(old)
            except VersionError:  # it got traffic (or was removed) meanwhile
                pass
        return dropped

    def describe(self) -> list[dict]:
        with self._lock:
            return [{"name": n, "uri": self._uris[n], "weight": self._weights[n]} for n in self.names()]

    def names(self) -> list[str]:
        return sorted(self._engines)

    def engines(self) -> dict[str, Engine]:
        with self._lock:
            return dict(self._engines)

    def latest(self) -> str:
        """The newest loaded version (what a ``latest`` pin routes to); "" when none is."""
        with self._lock:
            return next(iter(self._newest_first()), "")

    def health(self) -> dict[str, bool]:
        """Whether each loaded version's engine can still serve (an engine without ``healthy`` is assumed to)."""
        with self._lock:
            engines = dict(self._engines)
        return {name: bool(getattr(engine, "healthy", True)) for name, engine in sorted(engines.items())}

    def _newest_first(self) -> list[str]:
        """Loaded versions, newest first: by version number (``agentflow.versions.parse_version``, so v10 comes
        after v9, unlike a name sort), then by load order; a name without a number ranks below numbered ones, and
        among such names the last loaded is the newest. Call with the lock held."""
        def key(name: str) -> tuple[bool, int, int]:
            number = parse_version(name)
            return number is not None, number or 0, self._order[name]

        return sorted(self._engines, key=key, reverse=True)

    # --- routing -------------------------------------------------------------------------------------------------
    def route(self, key: str = "", pin: str = "") -> tuple[str, Engine]:
        """The version (and its engine) for a call of trajectory ``key``; ``pin`` names a version, or ``latest``
        for the newest loaded (``_newest_first``; training rollouts use it: on-policy, whatever the canary weights)."""
        with self._lock:
            if not self._engines:
                raise VersionError("no version is loaded", 503)
            if pin:
                name = self._newest_first()[0] if pin == "latest" else pin
                if name not in self._engines:
                    raise VersionError(f"version {pin!r} is not loaded; loaded: {', '.join(sorted(self._engines))}",
                                       404)
                self._used[name] = time.monotonic()
                return name, self._engines[name]
            chosen = self._affinity.get(key) if key else None
            if chosen in self._engines:
                self._affinity.move_to_end(key)
            else:
                bucket = _bucket(key) if key else next(self._counter) % 100
                chosen = self._by_bucket(bucket)
                if key:
                    self._affinity[key] = chosen
                    if len(self._affinity) > AFFINITY_SIZE:
                        self._affinity.popitem(last=False)
            self._used[chosen] = time.monotonic()
            return chosen, self._engines[chosen]

    def _by_bucket(self, bucket: int) -> str:
        edge = 0
        for name in self._newest_first():  # a canary takes the low buckets
            edge += self._weights[name]
            if bucket < edge:
                return name
        return max(self._engines, key=lambda n: self._weights[n])

    def close(self) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            _close(engine)


def _check_name(name) -> None:
    try:
        check_version_name(name)
    except InvalidInput as e:
        raise VersionError(str(e)) from None


def _bucket(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % 100


def _close(engine) -> None:
    close = getattr(engine, "close", None)
    if close:
        close()
