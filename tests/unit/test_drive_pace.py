"""The driver's bound on how far it runs ahead of the trainer (trainer/pace.py): groups sent against the groups the
trainer's ``trainer.progress`` records say it finished since the driver started."""

from __future__ import annotations

import threading

import pytest

from agentflow.errors import InvalidInput
from agentflow.trainer.drive import DriveSettings
from agentflow.trainer.pace import TrainerPace

START = 1_000_000


def sent(pace: TrainerPace, groups: int) -> TrainerPace:
    for _ in range(groups):
        pace.started_group()
    return pace


def test_the_driver_waits_at_the_limit_until_the_trainer_finishes_groups():
    pace = sent(TrainerPace(3, started_unix_ms=START), 3)
    assert pace.ahead == 3 and not pace.wait(0.05)
    pace.observe(40, START + 1)  # the first record is the base: nothing finished yet
    assert not pace.wait(0.05)
    pace.observe(41, START + 2)
    assert pace.ahead == 2 and pace.wait(0.05)


def test_records_from_before_the_start_only_set_the_base():
    pace = sent(TrainerPace(2, started_unix_ms=START), 2)
    for done in (10, 20, 30):
        pace.observe(done, START - 5)  # the trainer's history, read from the topic's beginning
    assert pace.ahead == 2
    pace.observe(32, START + 1)
    assert pace.ahead == 0


def test_a_restarted_trainer_counting_from_an_older_checkpoint_is_a_new_base():
    pace = sent(TrainerPace(4, started_unix_ms=START), 4)
    pace.observe(10, START + 1)
    pace.observe(12, START + 2)
    pace.observe(8, START + 3)  # restarted from a checkpoint at 8: nothing finished, nothing taken back
    assert pace.ahead == 2
    pace.observe(11, START + 4)
    assert pace.ahead == -1  # groups it redid count again: the driver may run ahead by as many


def test_a_waiting_driver_wakes_when_the_trainer_reports():
    pace = sent(TrainerPace(1, started_unix_ms=START), 1)
    pace.observe(0, START)
    timer = threading.Timer(0.2, pace.observe, (1, START + 1))
    timer.start()
    try:
        assert pace.wait(10)
    finally:
        timer.cancel()


def test_the_limit_is_a_whole_number_of_groups_and_zero_means_none():
    assert DriveSettings().max_ahead_groups == 0
    with pytest.raises(InvalidInput, match="max_ahead_groups"):
        DriveSettings(max_ahead_groups=-1)
