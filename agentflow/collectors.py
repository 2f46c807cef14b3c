"""Prometheus collectors, one way: a class builds its collectors in ``default_registry(registry)`` (a test passes
its own registry), and ``process_collectors(cls)`` is the one instance of that class in this process, made on first
use (under a lock: two instances would register the same names twice)."""

from __future__ import annotations

import threading
from typing import TypeVar

T = TypeVar("T")
_made: dict[type, object] = {}
_lock = threading.Lock()


def default_registry(registry=None):
    """``registry``, or prometheus_client's default one (what ``telemetry.serve_metrics`` serves)."""
    from prometheus_client import REGISTRY

    return REGISTRY if registry is None else registry


def process_collectors(cls: type[T]) -> T:
    """The process-wide ``cls()``."""
    with _lock:
        if cls not in _made:
            _made[cls] = cls()
        return _made[cls]  # type: ignore[return-value]
