"""Process helpers the bench scripts share: starting a server that announces itself with a JSON line, CPU seconds
from Linux /proc, and killing a process tree (``agentflow.children.stop_group`` stops a process group)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

from agentflow.children import spawn_tied, stop_group


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


def _start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot): with the pid, it names one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every live descendant of ``pid``, however far down and in whatever session."""
    stats = {p: s for p in (int(e) for e in os.listdir("/proc") if e.isdigit()) if (s := _stat(p)) is not None}
    tree, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, (parent, _) in stats.items() if parent in frontier and p not in tree}
        tree |= frontier
    return [(p, t) for p in sorted(tree) if (t := _start_time(p)) is not None]


def kill_tree(process: subprocess.Popen) -> None:
    """Kill a process started with ``start_new_session`` and everything under it, also what left its group (the
    python tool's sandboxes run in sessions of their own): the group is stopped first, so that nothing new starts
    while its descendants are listed, then all of it is killed. Waits for ``process``."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGSTOP)
        others = descendants(process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for pid, started in others:
            if _start_time(pid) == started:  # not a new process that got a freed pid
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        process.wait()


def start_announcing(command: list[str], log, *, timeout_s: float = 300.0, cwd=None) -> tuple[subprocess.Popen, dict]:
    """Start ``command`` tied to this process (``agentflow.children.spawn_tied``), stderr into the file ``log``, and
    return it with the first JSON object it prints (a ready line such as ``agentflow serve-llm``'s). The rest of its
    stdout is drained in the background so a full pipe never blocks it. If no such line comes within ``timeout_s`` the process is stopped and SystemExit
    carries the end of the log."""
    process = spawn_tied(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=cwd)
    found: dict = {}
    ready = threading.Event()

    def read() -> None:
        for line in process.stdout:
            if ready.is_set():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.update(value)
                ready.set()
        ready.set()  # exited

    threading.Thread(target=read, daemon=True).start()
    ready.wait(timeout_s)
    if not found:
        stop_group(process)
        tail = Path(log.name).read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(command[:4])} printed no ready line within {timeout_s:.0f} s (exit code "
                         f"{process.poll()}); log {log.name}:\n{tail}")
    return process, found
