"""Progress of an eval run on stderr: a rich bar on a terminal, plain lines elsewhere (CI, ``kubectl logs``), where
a bar would print nothing until the end.

A plain line comes every ``every`` items or every ``interval_s`` seconds, whichever first, and once at the end::

    eval search: 20/125 done (16%) · 8 running · accuracy 0.350 · 1 error · elapsed 2m10s · ETA 11m22s

Both show the items in flight and an ETA from :func:`eta_seconds`, which needs one finished item to know how long an
item takes ("ETA after the first item" until then).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable, Sequence, TextIO

DEFAULT_EVERY = 10
DEFAULT_INTERVAL_S = 30.0


def make_progress(total: int, label: str, *, enabled: bool = True, stream: TextIO | None = None,
                  every: int = DEFAULT_EVERY, interval_s: float = DEFAULT_INTERVAL_S, workers: int = 1):
    """The progress display for a run of ``total`` items on ``workers`` threads: none, a bar (``stream`` is a
    terminal) or plain lines."""
    if not enabled:
        return Progress(total, workers=workers)
    stream = stream or sys.stderr
    if _is_terminal(stream):
        return BarProgress(total, label, stream, workers=workers)
    return LineProgress(total, label, stream, every=every, interval_s=interval_s, workers=workers)


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


def item_seconds(finished_total_s: float, finished: int, running_ages: Sequence[float]) -> float | None:
    """How long an item takes: the mean wall time of the ``finished`` items, raised by the running items already
    older than that mean, each counted as if it finished now (a lower bound on its time), so that the quick items,
    which finish first, do not set the pace alone. None while nothing has finished."""
    if not finished:
        return None
    late = [age for age in running_ages if age > finished_total_s / finished]
    return (finished_total_s + sum(late)) / (finished + len(late))


def eta_seconds(queued: int, running_ages: Sequence[float], mean_item_s: float | None, workers: int) -> float | None:
    """Seconds until the last item finishes; None while no item has finished (``mean_item_s`` unknown).

    Each of ``workers`` threads solves one item at a time, and an item takes ``mean_item_s``: a running item of age
    ``a`` has ``max(mean - a, 0)`` left, a queued one ``mean``. The work left shared by the workers is the estimate,
    but never less than the longest remainder of one item (a queued one's is ``mean``). Between finishes it falls by
    up to a second per second, and an item that finishes when expected leaves it unchanged (its remainder was 0 and
    the next queued item starts): it neither grows while the workers are busy nor drops in waves as a throughput
    count would.
    """
    if mean_item_s is None:
        return None
    left = [max(mean_item_s - age, 0.0) for age in running_ages]
    work = queued * mean_item_s + sum(left)
    longest = max(left + [mean_item_s] * (queued > 0), default=0.0)
    return max(work / max(workers, 1), longest)


def smooth_eta(shown: float | None, seconds_since: float, estimate: float | None, time_constant: float) -> float | None:
    """The ETA to show: the one shown ``seconds_since`` ago, counted down by that time, then moved toward the new
    ``estimate`` by ``1 - exp(-seconds_since / time_constant)``; the first estimate is shown as it is. So an estimate
    that changes at a finish (the mean item time moved) is taken in over about ``time_constant`` seconds, the same
    however often the display asks."""
    if estimate is None or shown is None:
        return estimate
    counted = max(shown - seconds_since, 0.0)
    weight = 1.0 - math.exp(-seconds_since / time_constant) if time_constant > 0 else 1.0
    return counted + (estimate - counted) * weight


class Progress:
    """Counts started and finished items and estimates the time left; shows nothing. Used as a context manager:
    ``start`` when a worker takes an item, ``advance`` when it finishes, ``tick`` while waiting; ``carry`` counts an
    item finished before (a resumed run)."""

    def __init__(self, total: int, *, workers: int = 1, clock: Callable[[], float] = time.monotonic):
        self.total, self.clock = total, clock
        self.workers = max(1, workers)
        self.finished = self.correct = self.errors = 0
        self.started = clock()
        self._running: dict[object, float] = {}  # item index -> when it started
        self._timed = 0  # items finished in this session, and their summed wall time
        self._time_sum = 0.0
        self._shown_eta, self._shown_at = None, self.started

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self, index) -> None:
        self._running[index] = self.clock()

    def carry(self, row: dict) -> None:
        self.finished += 1
        self.correct += bool(row["correct"])
        self.errors += row["status"] in ("error", "invalid")

    def advance(self, row: dict) -> None:
        self.carry(row)
        began = self._running.pop(row.get("index"), self.started)  # never started: timed from the beginning
        self._timed += 1
        self._time_sum += self.clock() - began

    def tick(self) -> None:
        pass

    @property
    def running(self) -> int:
        return len(self._running)

    def accuracy(self) -> float:
        return self.correct / self.finished if self.finished else 0.0

    def eta(self) -> float | None:
        """Seconds left: :func:`eta_seconds`, smoothed over half an item's time (:func:`smooth_eta`; measured on
        simulated runs, that halves the error of a longer time constant and still keeps the steps small)."""
        now = self.clock()
        if self.finished >= self.total:
            return 0.0
        ages = [now - t for t in self._running.values()]
        mean = item_seconds(self._time_sum, self._timed, ages)
        estimate = eta_seconds(max(self.total - self.finished - self.running, 0), ages, mean, self.workers)
        self._shown_eta = smooth_eta(self._shown_eta, now - self._shown_at, estimate, (mean or 0.0) / 2)
        self._shown_at = now
        return self._shown_eta

    def status(self) -> list[str]:
        """``2/20 done (10%)``, ``4 running``, the accuracy, the errors (if any), the time elapsed and the ETA."""
        share = f" ({self.finished / self.total:.0%})" if self.total else ""
        parts = [f"{self.finished}/{self.total} done{share}", f"{self.running} running",
                 f"accuracy {self.accuracy():.3f}" if self.finished else "accuracy —"]
        if self.errors:
            parts.append(f"{self.errors} error{'s' if self.errors != 1 else ''}")
        parts.append(f"elapsed {duration(self.clock() - self.started)}")
        eta = self.eta()
        parts.append("ETA after the first item" if eta is None else f"ETA {duration(eta)}")
        return parts


class BarProgress(Progress):
    """A rich progress bar of the finished items, followed by :meth:`Progress.status` (our ETA, not rich's, which
    counts finished items only)."""

    def __init__(self, total: int, label: str, stream: TextIO, *, workers: int = 1,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(total, workers=workers, clock=clock)
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=20),
                                 TextColumn("{task.fields[stats]}"), console=Console(file=stream), transient=False)
        self._task = self._bar.add_task(f"eval {label}", total=total, stats="")

    def __enter__(self):
        self._bar.__enter__()
        self.tick()
        return self

    def __exit__(self, *exc):
        self.tick()
        self._bar.__exit__(*exc)
        return False

    def start(self, index) -> None:
        super().start(index)
        self.tick()

    def advance(self, row: dict) -> None:
        super().advance(row)
        self.tick()

    def tick(self) -> None:
        self._bar.update(self._task, completed=self.finished, stats=" · ".join(self.status()))


class LineProgress(Progress):
    """A plain line every ``every`` items or ``interval_s`` seconds (whichever first), and one at the end."""

    def __init__(self, total: int, label: str, stream: TextIO, *, every: int = DEFAULT_EVERY,
                 interval_s: float = DEFAULT_INTERVAL_S, workers: int = 1, clock: Callable[[], float] = time.monotonic):
        super().__init__(total, workers=workers, clock=clock)
        self.label, self.stream, self.every, self.interval_s = label, stream, every, interval_s
        self._last_line = self.started
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
        return f"eval {self.label}: " + " · ".join(self.status())

    def _print(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self._last_line, self._last_count = self.clock(), self.finished
