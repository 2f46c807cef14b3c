"""A process that waits for SIGTERM/SIGINT stops once, promptly, whatever thread gets the signal and however many
arrive at once (a handler that took a lock used to deadlock the main thread: a service that never stopped)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

SERVICE = """
import sys, threading, time
from agentflow.services.serving import announce_and_wait
for _ in range(4):  # other threads, as in a service: the kernel may hand the signal to any of them
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
announce_and_wait(lambda: print("drained", flush=True), service="probe")
"""


@pytest.mark.parametrize("burst", [1, 50])
def test_a_burst_of_stop_signals_stops_the_process_once(burst):
    for _ in range(5):
        process = subprocess.Popen([sys.executable, "-c", SERVICE], stdout=subprocess.PIPE, text=True)
        try:
            assert json.loads(process.stdout.readline()) == {"service": "probe"}
            started = time.monotonic()
            for n in range(burst):
                process.send_signal(signal.SIGTERM if n % 2 == 0 else signal.SIGINT)
            out, _ = process.communicate(timeout=10)
            assert process.returncode == 0
            assert out.split() == ["drained"]
            assert time.monotonic() - started < 5
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
