"""Child processes that never outlive their parent (docs/architecture.md, "Child processes").

``spawn_tied`` starts a command in a session of its own, so that ``stop_group`` reaches everything in its process
group, and asks the kernel to SIGTERM it when its parent dies, even by SIGKILL or a timeout. Every level ties its own
children: a killed bench takes its ``serve-llm`` with it, and ``serve-llm``'s SIGTERM handler stops what it started.

The tie is util-linux ``setpriv --pdeathsig``, not a ``preexec_fn``: a Python pre-exec hook forces a plain fork, and
in a process that already runs gRPC threads gRPC's fork handlers can abort the child. The kernel sends the signal
when the *thread* that forked the child ends, so a child started off the main thread is left untied (a warning
says so) rather than killed when that thread returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

log = logging.getLogger(__name__)


def tied(command: list[str]) -> list[str]:
    """``command`` wrapped so that the kernel SIGTERMs it when the thread that starts it ends (Linux with setpriv;
    elsewhere ``command`` unchanged). For ``subprocess.run`` and other callers that cannot use ``spawn_tied``."""
    setpriv = _setpriv()
    return [setpriv, "--pdeathsig", "TERM", "--", *command] if setpriv else list(command)


def spawn_tied(command: list[str], **popen) -> subprocess.Popen:
    """``subprocess.Popen(command, **popen)`` in a new session, tied to this process (see the module docstring),
    returned once the tie is in place. Start long-lived children from the main thread: off it the child is started
    untied."""
    setpriv = None
    if threading.current_thread() is threading.main_thread():
        setpriv = _setpriv()
    else:
        log.warning("%s started from thread %s is not tied to this process: it would be killed when that thread "
                    "ends", os.path.basename(str(command[0])), threading.current_thread().name)
    wrapped = [setpriv, "--pdeathsig", "TERM", "--", *command] if setpriv else list(command)
    process = subprocess.Popen(wrapped, start_new_session=True, **popen)
    if setpriv:
        _wait_past(process, setpriv)
    return process


def _setpriv() -> str | None:
    return shutil.which("setpriv") if sys.platform.startswith("linux") else None


def _wait_past(process: subprocess.Popen, setpriv: str, timeout_s: float = 5.0) -> None:
    """Return once ``process`` runs its command: setpriv sets the tie just before it execs it, so a parent that
    died earlier (killed right after the start) would leave the child untied for good."""
    setpriv = os.path.realpath(setpriv)
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{process.pid}/exe") != setpriv:
                return
        except OSError:
            return
        time.sleep(0.001)


def group_alive(process: subprocess.Popen) -> bool:
    """Whether any process is left in the group ``spawn_tied`` made for ``process``."""
    try:
        os.killpg(process.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_group(process: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to ``process``'s whole group; nothing if the group is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def stop_group(process: subprocess.Popen, grace_s: float = 15.0, *, settle_s: float = 5.0) -> int | None:
    """SIGTERM ``process``'s group, SIGKILL what is left after ``grace_s`` (also children the leader left behind),
    then wait up to ``settle_s`` for the group to vanish, so that its ports and memory are free. Returns the exit
    code; safe to call twice."""
    if process.poll() is None:
        signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace_s)
    if process.poll() is None:
        log.warning("pid %d ignored SIGTERM for %.0f s; killing its group", process.pid, grace_s)
    signal_group(process, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(settle_s)
    deadline = time.monotonic() + settle_s
    while group_alive(process) and time.monotonic() < deadline:
        time.sleep(0.05)
    return process.returncode
