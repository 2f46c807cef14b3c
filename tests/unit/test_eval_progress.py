"""Eval progress: the ETA as a pure function, and the progress displays driven by a fake clock."""

import io

import pytest

from agentflow.eval.progress import BarProgress, Progress, eta_seconds, item_seconds, smooth_eta


class Clock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("queued,ages,mean,workers,expected", [
    (5, [1.0, 2.0], None, 2, None),  # nothing finished yet: no estimate
    (4, [3.0, 8.0], 10.0, 2, 24.5),  # (4 x 10 + 7 + 2) / 2
    (0, [1.0, 9.0], 10.0, 2, 9.0),  # last stretch: the longest running item, not (9 + 1) / 2
    (0, [12.0], 10.0, 4, 0.0),  # an overdue item has nothing left by the mean
    (6, [], 5.0, 1, 30.0),  # one worker: the items one after another
    (3, [], 5.0, 0, 15.0),  # workers is at least 1
])
def test_eta_seconds_by_hand(queued, ages, mean, workers, expected):
    assert eta_seconds(queued, ages, mean, workers) == expected


def test_item_seconds_counts_late_running_items_as_lower_bounds():
    assert item_seconds(0.0, 0, [5.0]) is None
    assert item_seconds(30.0, 3, [4.0, 9.0]) == 10.0  # none older than the mean 10 s
    assert item_seconds(30.0, 3, [4.0, 25.0]) == 13.75  # (30 + 25) / 4


def test_smooth_eta_counts_down_and_moves_toward_the_estimate():
    assert smooth_eta(None, 5.0, 100.0, 10.0) == 100.0  # the first estimate as it is
    assert smooth_eta(100.0, 5.0, None, 10.0) is None
    assert smooth_eta(100.0, 10.0, 90.0, 10.0) == 90.0  # counted down to what the estimate says: no change
    moved = smooth_eta(100.0, 10.0, 190.0, 10.0)  # 90 counted, then 1 - 1/e of the way to 190
    assert moved == pytest.approx(90 + 100 * (1 - 2.718281828 ** -1))
    twice = smooth_eta(smooth_eta(100.0, 5.0, 195.0, 10.0), 5.0, 190.0, 10.0)  # the estimate counts down too
    assert twice == pytest.approx(moved)  # the same however often it is asked
    assert smooth_eta(3.0, 10.0, 0.0, 0.0) == 0.0


def simulate(durations: list[float], workers: int) -> list[tuple[float, float | None, float]]:
    """Run items of the given durations on ``workers`` threads against a fake clock, a second per step:
    (time, the progress's ETA, the true time left) at every step."""
    clock = Clock()
    progress = Progress(len(durations), workers=workers, clock=clock)
    queued, ends = list(enumerate(durations)), {}

    def fill():
        while queued and len(ends) < workers:
            index, duration = queued.pop(0)
            ends[index] = clock.now + duration
            progress.start(index)

    fill()
    finish = _finish_time(durations, workers)
    samples = []
    while ends:
        clock.now += 1
        for index in sorted(i for i, end in ends.items() if end <= clock.now):
            del ends[index]
            progress.advance({"index": index, "correct": True, "status": "answered"})
            fill()
        samples.append((clock.now, progress.eta(), finish - clock.now))
    return samples


def _finish_time(durations, workers) -> float:
    free = [0.0] * workers
    for duration in durations:
        free[free.index(min(free))] += duration
    return max(free)


def test_with_items_of_equal_length_the_eta_is_exact_from_the_first_finish():
    samples = simulate([10.0] * 20, workers=4)
    assert [eta for t, eta, _ in samples if t < 10] == [None] * 9
    assert all(eta == pytest.approx(left) for t, eta, left in samples if t >= 10)


def test_the_eta_is_steady_when_items_vary():
    durations = [6.0, 14.0, 9.0, 11.0, 12.0, 8.0, 10.0, 7.0, 13.0, 10.0] * 3  # mean 10 s, 80 s on 4 workers
    samples = [(t, eta, left) for t, eta, left in simulate(durations, workers=4) if eta is not None]
    assert samples[0][0] == 6  # from the first finish on
    steps = [b - a for (_, a, _), (_, b, _) in zip(samples, samples[1:])]
    assert max(steps) <= 2.5  # it rises while the first (quick) items turn out not to be the norm, but gently
    assert sum(step > 0 for step in steps) < len(steps) / 4  # and mostly falls
    assert all(abs(eta - left) <= 0.3 * left + 6 for t, eta, left in samples if t >= 20)  # after two items' time


def test_the_eta_accounts_for_the_items_in_flight():
    """The first of four items in flight finishes at 10 s: 15 queued and 4 running (one just started) on 4 workers
    is (15 x 10 + 10) / 4 = 40 s (it takes 43); elapsed / finished x left, a count of finished items only, said 190."""
    samples = simulate([10.0, 11.0, 12.0, 13.0] + [10.0] * 16, workers=4)
    t, eta, left = samples[9]
    assert (t, eta, left) == (10, 40.0, 43)


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_bar_shows_items_in_flight_and_waits_for_the_first_item_for_its_eta():
    clock, stream = Clock(100.0), Terminal()
    with BarProgress(3, "search", stream, workers=2, clock=clock) as bar:
        bar.start(0)
        bar.start(1)
        clock.now += 30
        bar.tick()
        assert " · ".join(bar.status()) == (
            "0/3 done (0%) · 2 running · accuracy — · elapsed 30s · ETA after the first item")
        clock.now += 10
        bar.advance({"index": 0, "correct": True, "status": "answered"})
        bar.start(2)
        # 40 s an item: item 1 has run 40 s, item 2 nothing: 40 s left
        assert " · ".join(bar.status()) == "1/3 done (33%) · 2 running · accuracy 1.000 · elapsed 40s · ETA 40s"
    assert "2 running" in stream.getvalue()


def test_items_carried_over_count_as_done_but_not_for_the_eta():
    clock = Clock()
    progress = Progress(4, workers=2, clock=clock)
    for index in (0, 1):
        progress.carry({"index": index, "correct": index == 0, "status": "answered"})
    progress.start(2)
    clock.now += 5
    assert progress.status()[:3] == ["2/4 done (50%)", "1 running", "accuracy 0.500"]
    assert progress.eta() is None
