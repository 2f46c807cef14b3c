"""A wall-clock budget shared by every call made while solving one query."""

from __future__ import annotations

import math
import time


class Deadline:
    """An absolute point in monotonic time; ``remaining()`` never goes below zero."""

    def __init__(self, seconds: float | None):
        self._at = math.inf if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self._at - time.monotonic())

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def cap(self, seconds: float | None) -> float:
        """The smaller of ``seconds`` and the time left: the timeout to give one outbound call."""
        left = self.remaining()
        return left if seconds is None else min(seconds, left)


NEVER = Deadline(None)
