"""Child processes that never outlive their parent (agentflow/children.py): a parent killed with SIGKILL or SIGTERM
takes its tied children with it, and theirs; the same parent with untied children leaves them running."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from agentflow.children import group_alive, spawn_tied, stop_group

# A parent that starts a child, which starts a grandchild; each sleeps. ``tie`` says whether they use spawn_tied.
PARENT = textwrap.dedent("""
    import json, subprocess, sys
    from agentflow.children import spawn_tied

    tie = sys.argv[1] == "tie"
    start = spawn_tied if tie else (lambda cmd, **kw: subprocess.Popen(cmd, start_new_session=True, **kw))
    CHILD = ("import subprocess, sys, time; from agentflow.children import spawn_tied; "
             "start = spawn_tied if sys.argv[1] == 'tie' else "
             "(lambda cmd, **kw: subprocess.Popen(cmd, start_new_session=True, **kw)); "
             "g = start([sys.executable, '-c', 'import time; time.sleep(300)']); "
             "print(g.pid, flush=True); time.sleep(300)")
    child = start([sys.executable, "-c", CHILD, sys.argv[1]], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    print(json.dumps({"child": child.pid, "grandchild": grandchild}), flush=True)
    import time; time.sleep(300)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended; only its entry is left
    except OSError:
        return False


def wait_gone(pids: list[int], budget_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + budget_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def start_parent(tie: str) -> tuple[subprocess.Popen, list[int]]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, tie], stdout=subprocess.PIPE, text=True)
    pids = json.loads(parent.stdout.readline())
    return parent, [pids["child"], pids["grandchild"]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tie is Linux's parent-death signal")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "term"])
def test_a_killed_parent_takes_its_tied_children_and_theirs_with_it(signum):
    parent, pids = start_parent("tie")
    try:
        assert [p for p in pids if alive(p)] == pids
        parent.send_signal(signum)
        parent.wait(10)
        assert wait_gone(pids) == []
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_untied_children_outlive_a_killed_parent():
    """The control: without the tie the same children keep running (so the test above can fail)."""
    parent, pids = start_parent("untied")
    try:
        parent.kill()
        parent.wait(10)
        time.sleep(1.0)
        assert [p for p in pids if alive(p)] == pids
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_stop_group_kills_what_ignores_sigterm_and_its_group():
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)']); print(g.pid, flush=True); "
            "time.sleep(300)")
    process = spawn_tied([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = int(process.stdout.readline())
    started = time.monotonic()
    assert stop_group(process, grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 10
    assert not group_alive(process) and wait_gone([grandchild], 5) == []
    assert stop_group(process, grace_s=0.5) == -signal.SIGKILL  # twice is fine


def test_a_child_started_off_the_main_thread_is_left_untied_with_a_warning(caplog):
    """The kernel would SIGTERM it when the starting thread ends, long before the process does."""
    box = {}

    def start():
        box["process"] = spawn_tied([sys.executable, "-c", "import time; time.sleep(300)"])

    with caplog.at_level(logging.WARNING, logger="agentflow.children"):
        thread = threading.Thread(target=start, name="starter")
        thread.start()
        thread.join()
    process = box["process"]
    try:
        time.sleep(1.0)
        assert process.poll() is None, "the child died with its starting thread"
        assert "not tied" in caplog.text and "starter" in caplog.text
    finally:
        stop_group(process, grace_s=2)


def test_spawn_tied_returns_once_the_child_runs_its_command():
    """setpriv sets the tie just before it execs the command: a parent killed while its child is still in setpriv
    would leave that child untied (seen in CI under load: a grandchild outlived the test's 30 s)."""
    from agentflow.children import tied

    setpriv = os.path.realpath(tied(["true"])[0])
    if not setpriv.endswith("setpriv"):
        pytest.skip("no setpriv here: nothing is tied")
    for _ in range(10):
        child = spawn_tied([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert os.readlink(f"/proc/{child.pid}/exe") != setpriv
        finally:
            child.kill()
            child.wait()
