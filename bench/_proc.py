"""Process helpers the bench scripts share: CPU seconds from Linux /proc, and stopping a process group."""

from __future__ import annotations

import os
import signal
import subprocess


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of ``pid``, None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # state, ppid, ..., utime (12th), stime (13th)
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cpu_seconds(pid: int, *, descendants: bool = False) -> float | None:
    """User + system CPU seconds of ``pid`` so far, with its live descendants' if asked; None if unreadable."""
    if not descendants:
        stat = _stat(pid)
        return None if stat is None else stat[1]
    try:
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return None
    stats = {p: s for p in pids if (s := _stat(p)) is not None}
    if pid not in stats:
        return None
    tree, frontier = {pid}, {pid}
    while frontier:
        frontier = {p for p, (parent, _) in stats.items() if parent in frontier and p not in tree}
        tree |= frontier
    return sum(stats[p][1] for p in tree)


def stop_process(process: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process's group (started with ``start_new_session``), SIGKILL it after ``grace_s``."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
