"""How far a rollout driver runs ahead of the trainer (docs/training.md, "How far the driver runs ahead").

The trainer publishes on ``trainer.progress`` how many training groups it is done with, trained on or dropped, over
its life. A driver counts the groups it sent since it started and, from the trainer's records produced after that,
the groups the trainer finished since; it starts a group only while sent - finished < ``limit``. With ``limit`` =
(max_staleness + 1) x groups per step, a group is trained on within about max_staleness versions of the one that
sampled it (AReaL's bound on head off-policyness), and a stopped trainer holds the driver at the limit instead of
letting it fill the topic with rollouts that would arrive stale.

Finished groups, not versions: a step without a reward spread publishes no version but does use its groups.
A trainer restarted from an older checkpoint counts from there again: a count that goes down is a new base (nothing
counted), and groups it consumes a second time count again, so the driver may run ahead by what the trainer redoes.
Every driver counts all of the trainer's progress: give several drivers each a share of the limit (the chart does).
"""

from __future__ import annotations

import threading

from agentflow.bus.codec import now_ms


class TrainerPace:
    """Groups sent against groups the trainer finished (see the module docstring). Thread-safe."""

    def __init__(self, limit: int, started_unix_ms: int | None = None):
        self.limit = limit
        self.started_ms = now_ms() if started_unix_ms is None else started_unix_ms
        self.sent = 0
        self.finished = 0  # groups the trainer finished since this driver started
        self._last: int | None = None  # the trainer's newest count
        self._changed = threading.Condition()

    def observe(self, groups_done: int, produced_at_ms: int) -> None:
        """A ``TrainerProgress`` record: what it adds since the previous one counts if it was produced after the
        start (older records only set the base)."""
        with self._changed:
            if self._last is not None and produced_at_ms >= self.started_ms:
                self.finished += max(0, groups_done - self._last)
            self._last = groups_done
            self._changed.notify_all()

    def started_group(self) -> None:
        with self._changed:
            self.sent += 1

    @property
    def ahead(self) -> int:
        with self._changed:
            return self.sent - self.finished

    def wait(self, timeout_s: float) -> bool:
        """True once a group may start (at once when it may), False after ``timeout_s`` without."""
        with self._changed:
            return self._changed.wait_for(lambda: self.sent - self.finished < self.limit, timeout_s)


def follow_progress(bus, pace: TrainerPace, stop: threading.Event):
    """A started ``Follower`` of ``trainer.progress``, from its beginning, that feeds ``pace``."""
    from agentflow.bus import topics
    from agentflow.bus.clients import Follower
    from agentflow.bus.codec import DecodeError, decode

    def handle(received) -> None:
        try:
            envelope = decode(received.value)
        except DecodeError:
            return
        if envelope.HasField("trainer_progress"):
            pace.observe(envelope.trainer_progress.groups_done, envelope.produced_at_unix_ms)

    return Follower(bus, [topics.TRAINER_PROGRESS], handle, stop=stop, name="drive-pace", poll_s=0.5,
                    on_connect=lambda: topics.ensure_topics(bus, [topics.TRAINER_PROGRESS])).start()
