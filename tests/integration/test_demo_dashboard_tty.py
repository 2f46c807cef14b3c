"""The demo dashboard through a real terminal: a child draws it with rich.live in a pty 100x30 and updates it."""

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COLUMNS, LINES = 100, 30

CHILD = """
import time
from rich.console import Console
from rich.live import Live
from agentflow.demo.view import new_state, render_dashboard

console = Console()
assert console.is_terminal and console.size == (100, 30), console.size
state = new_state(duration_s=60.0, phase="training")
with Live(render_dashboard(state), console=console, auto_refresh=False) as live:
    for i, success in enumerate((0.2, 0.5, 0.9)):
        time.sleep(0.2)
        state["elapsed_s"] = 10.0 * (i + 1)
        state["heldout"].append({"t_s": 10.0 * i, "success": success, "version": f"v{i}"})
        if i == 1:
            state["decisions"].append({"t_s": 15.0, "version": "v1", "action": "promote", "percent": 100,
                                       "reason": "canary wins by 0.3", "evidence": {}})
        live.update(render_dashboard(state), refresh=True)
"""

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def run_in_pty(code: str, timeout_s: float = 20.0) -> str:
    """Run `python -c code` with a pty of COLUMNS x LINES as its terminal; everything it wrote there."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLORTERM", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(LINES), PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, env=env,
                             cwd=REPO, start_new_session=True)
    os.close(slave)
    output, deadline = b"", time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every holder of the terminal's other side has closed it
                    break
                if not chunk:
                    break
                output += chunk
        else:
            raise AssertionError(f"the child did not finish in {timeout_s} s: {output[-2000:]!r}")
        assert child.wait(timeout=5) == 0, output.decode(errors="replace")[-3000:]
    finally:
        child.kill()
        os.close(master)
    return output.decode("utf-8", errors="replace")


def test_dashboard_draws_and_updates_in_a_terminal():
    raw = run_in_pty(CHILD)
    assert "\x1b[" in raw and "\x1b[2K" in raw  # styled, and lines erased to redraw in place
    assert re.search(r"\x1b\[(?:\d+;)*3[1-7]m", raw)  # coloured
    text = ANSI.sub("", raw)
    for title in ("production traffic", "planner versions", "held-out success", "training reward",
                  "rollout decisions"):
        assert title in text
    frames = [text.index(marker) for marker in ("no held-out evaluation yet", "latest 0.20", "latest 0.50",
                                                "latest 0.90")]
    assert frames == sorted(frames), frames
    assert frames[1] < text.index("canary wins by 0.3") < frames[3]  # the decision arrives with the 0.50 frame
    assert "00:30 / 01:00" in text
