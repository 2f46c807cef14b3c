"""The judge's calls, limited and remembered: a token bucket over the whole process (``TokenBucket``) and an LRU of
verdicts (``VerdictCache``) keyed by the prompt's inputs (``verdict_key``). Used by the judge service
(services/judge)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class TokenBucket:
    """At most ``rate`` acquisitions a second on average, bursts of up to ``burst`` (default: one second's worth,
    at least 1). Callers over the rate reserve a token and wait their turn, so they are served in order."""

    def __init__(self, rate: float, burst: float | None = None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate = rate
        self.capacity = burst if burst is not None else max(1.0, rate)
        self.clock, self.sleep = clock, sleep
        self.tokens = self.capacity
        self.updated = clock()
        self.lock = threading.Lock()

    def acquire(self) -> float:
        """Take one token, waiting until it is there; returns the seconds waited (0.0 without a limit)."""
        if self.rate <= 0:
            return 0.0
        with self.lock:
            now = self.clock()
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
            self.tokens -= 1
            wait = max(0.0, -self.tokens / self.rate)
        if wait:
            self.sleep(wait)
        return wait


class VerdictCache:
    """An LRU of rewards by key, safe across the worker's threads; size 0 keeps nothing."""

    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict[str, dict] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: str) -> dict | None:
        with self.lock:
            if key not in self.items:
                return None
            self.items.move_to_end(key)
            return dict(self.items[key])

    def put(self, key: str, reward: dict) -> None:
        if self.size <= 0:
            return
        with self.lock:
            self.items[key] = dict(reward)
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)


def verdict_key(mode: str, question: str, answer: str, context: str) -> str:
    """The cache key: SHA-256 of the prompt's inputs (``context``: the reference, or the evidence)."""
    return hashlib.sha256(json.dumps([mode, question, answer, context], ensure_ascii=False).encode()).hexdigest()

