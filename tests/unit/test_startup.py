"""The first-connection rule of agentflow.startup, on a fake clock: retry with a doubling pause and one log line per
failed try, then one error naming the address and the flag that sets it."""

import logging

import pytest

from agentflow import startup
from agentflow.errors import InvalidInput


class Clock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(startup, "time", fake)
    return fake


def test_it_returns_once_the_other_side_answers(clock, caplog):
    answers = iter([False, False, False, True])
    with caplog.at_level(logging.WARNING, logger="agentflow.startup"):
        startup.first_contact("Kafka", "k:9092", lambda: next(answers), set_by="--bootstrap", wait_s=60)
    assert clock.sleeps == [0.5, 1.0, 2.0]  # doubling from 0.5 s
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("Kafka at k:9092 does not answer" in line for line in lines)


def test_it_gives_up_after_the_wait_naming_the_address_and_the_flag(clock, caplog):
    with caplog.at_level(logging.WARNING, logger="agentflow.startup"):
        with pytest.raises(startup.Unreachable) as info:
            startup.first_contact("the gateway", "gw:50051", lambda: False, set_by="--gateway", wait_s=20)
    message = str(info.value)
    assert "the gateway at gw:50051 did not answer in 20 s" in message and "--gateway" in message
    assert startup.WAIT_ENV in message and info.value.reason == "unavailable"
    assert max(clock.sleeps) == startup.LONGEST_PAUSE_S and sum(clock.sleeps) == pytest.approx(20)
    assert len(caplog.records) == len(clock.sleeps)  # one line per failed try, none for the last


def test_a_wait_of_zero_is_one_try(clock):
    with pytest.raises(startup.Unreachable, match=r"\(1 try\)"):
        startup.first_contact("Kafka", "k:9092", lambda: False, set_by="--bootstrap", wait_s=0)
    assert clock.sleeps == []


@pytest.mark.parametrize("text, wait", [("", 60.0), ("0", 0.0), ("2.5", 2.5)])
def test_the_wait_comes_from_the_environment(text, wait):
    assert startup.connect_wait_s({startup.WAIT_ENV: text}) == wait


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_bad_wait_names_the_variable(text):
    with pytest.raises(InvalidInput, match=startup.WAIT_ENV):
        startup.connect_wait_s({startup.WAIT_ENV: text})
