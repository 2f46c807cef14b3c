"""One rule for a command's first connection to what it needs (the Kafka brokers, the gateway).

At start-up ``first_contact`` tries for ``AGENTFLOW_CONNECT_WAIT_S`` seconds (default 60), with a pause that doubles
from 0.5 s to 5 s and one log line per failed try naming the address; then it gives up with one error that names the
address and the flag that sets it (the command exits with status 2). Only the first connection: once connected, the
services ride out a restart of what they talk to as before (docs/event-bus.md, "Broker restarts").
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

from agentflow.errors import AgentFlowError, InvalidInput, Reason

WAIT_ENV = "AGENTFLOW_CONNECT_WAIT_S"
DEFAULT_WAIT_S = 60.0
FIRST_PAUSE_S, LONGEST_PAUSE_S = 0.5, 5.0

log = logging.getLogger(__name__)


class Unreachable(AgentFlowError):
    """What a command needs did not answer at start-up within the wait."""

    reason = Reason.UNAVAILABLE


def connect_wait_s(environ=None) -> float:
    """``AGENTFLOW_CONNECT_WAIT_S``: how long a command tries its first connection (0: one try)."""
    text = (os.environ if environ is None else environ).get(WAIT_ENV, "")
    try:
        wait = float(text) if text.strip() else DEFAULT_WAIT_S
    except ValueError:
        wait = -1.0
    if not (math.isfinite(wait) and wait >= 0):
        raise InvalidInput(f"{WAIT_ENV} must be a number of seconds >= 0, got {text!r}")
    return wait


def first_contact(what: str, address: str, answers: Callable[[], bool], *, set_by: str,
                  wait_s: float | None = None) -> None:
    """Return once ``answers()`` is true; until then try again (see the module), and raise ``Unreachable`` after
    ``wait_s`` (default: ``connect_wait_s()``). ``set_by`` names the flag (and variable) that gives ``address``."""
    wait_s = connect_wait_s() if wait_s is None else wait_s
    deadline, pause, tries = time.monotonic() + wait_s, FIRST_PAUSE_S, 0
    while True:
        tries += 1
        if answers():
            return
        left = deadline - time.monotonic()
        if left <= 0:
            counted = "1 try" if tries == 1 else f"{tries} tries"
            raise Unreachable(f"{what} at {address} did not answer in {wait_s:g} s ({counted}): is it running there? "
                              f"{set_by} gives the address, {WAIT_ENV} how long to try")
        pause = min(pause, left)
        log.warning("%s at %s does not answer (try %d); trying again in %.1f s, for %.0f s more", what, address,
                    tries, pause, left)
        time.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE_S)
