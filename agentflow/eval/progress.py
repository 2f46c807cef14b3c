"""Progress of an eval run on stderr: a rich bar on a terminal, plain lines elsewhere (CI, ``kubectl logs``), where
a bar would print nothing until the end.

A plain line comes every ``every`` items or every ``interval_s`` seconds, whichever first, and once at the end::

    eval search: 20/125 items (16%) · accuracy 0.350 · 1 error · elapsed 2m10s · ETA 11m22s
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

DEFAULT_EVERY = 10
DEFAULT_INTERVAL_S = 30.0


def make_progress(total: int, label: str, *, enabled: bool = True, stream: TextIO | None = None,
                  every: int = DEFAULT_EVERY, interval_s: float = DEFAULT_INTERVAL_S):
    """The progress display for a run of ``total`` items: none, a bar (``stream`` is a terminal) or plain lines."""
    if not enabled:
        return Progress(total)
    stream = stream or sys.stderr
    if _is_terminal(stream):
        return BarProgress(total, label, stream)
    return LineProgress(total, label, stream, every=every, interval_s=interval_s)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def duration(seconds: float) -> str:
    """``seconds`` as ``45s``, ``2m10s`` or ``1h05m``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Counts finished items; shows nothing. Used as a context manager; ``advance`` per item, ``tick`` while
    waiting."""

    def __init__(self, total: int):
        self.total = total
        self.finished = self.correct = self.errors = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def advance(self, row: dict) -> None:
        self.finished += 1
        self.correct += bool(row["correct"])
        self.errors += row["status"] in ("error", "invalid")

    def tick(self) -> None:
        pass

    def accuracy(self) -> float:
        return self.correct / self.finished if self.finished else 0.0


class BarProgress(Progress):
    """A rich progress bar with the running accuracy."""

    def __init__(self, total: int, label: str, stream: TextIO):
        super().__init__(total)
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=Console(file=stream), transient=False)
        self._task = self._bar.add_task(f"eval {label}", total=total, stats="")

    def __enter__(self):
        self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        self._bar.__exit__(*exc)
        return False

    def advance(self, row: dict) -> None:
        super().advance(row)
        stats = f"acc {self.accuracy():.3f}" + (f" · {self.errors} errors" if self.errors else "")
        self._bar.update(self._task, advance=1, stats=stats)


class LineProgress(Progress):
    """A plain line every ``every`` items or ``interval_s`` seconds (whichever first), and one at the end."""

    def __init__(self, total: int, label: str, stream: TextIO, *, every: int = DEFAULT_EVERY,
                 interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        super().__init__(total)
        self.label, self.stream, self.every, self.interval_s, self.clock = label, stream, every, interval_s, clock
        self.started = self._last_line = clock()
        self._last_count = -1

    def advance(self, row: dict) -> None:
        super().advance(row)
        if self.every > 0 and self.finished % self.every == 0:
            self._print()
        else:
            self.tick()

    def tick(self) -> None:
        if self.interval_s > 0 and self.clock() - self._last_line >= self.interval_s:
            self._print()

    def __exit__(self, *exc):
        if self._last_count != self.finished:
            self._print()
        return False

    def line(self) -> str:
        elapsed = self.clock() - self.started
        share = f" ({self.finished / self.total:.0%})" if self.total else ""
        parts = [f"eval {self.label}: {self.finished}/{self.total} items{share}",
                 f"accuracy {self.accuracy():.3f}" if self.finished else "accuracy —"]
        if self.errors:
            parts.append(f"{self.errors} error{'s' if self.errors != 1 else ''}")
        parts.append(f"elapsed {duration(elapsed)}")
        left = self.total - self.finished
        parts.append(f"ETA {duration(elapsed / self.finished * left)}" if self.finished else "ETA —")
        return " · ".join(parts)

    def _print(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self._last_line, self._last_count = self.clock(), self.finished
