"""The python tool's sandbox against hostile programs: a real child process, nothing mocked."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from agentflow.tools.python_tool import PythonTool, PythonToolConfig


def _sandbox_processes(root: Path, settle_s: float = 5.0) -> int:
    """Sandbox processes of this test (their settings name its ``root``) still alive after up to ``settle_s``:
    a killed process may take a moment to be reaped on a loaded machine, and other tests' sandboxes don't count."""
    deadline = time.monotonic() + settle_s
    while True:
        count = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            count += b"sandbox_boot.py" in cmdline and str(root).encode() in cmdline
        if count == 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.1)


def _all_processes() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


@pytest.fixture
def run_root(tmp_path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root


@pytest.fixture
def tool(run_root) -> PythonTool:
    return PythonTool(PythonToolConfig(timeout_s=10, cpu_s=10, temp_root=str(run_root)))


@pytest.fixture
def kernel_only_tool(run_root, monkeypatch) -> PythonTool:
    """A tool whose child skips the audit hook, to check that the kernel layers hold on their own."""
    tool = PythonTool(PythonToolConfig(timeout_s=10, temp_root=str(run_root)))
    settings = tool._settings
    monkeypatch.setattr(tool, "_settings", lambda *a: {**settings(*a), "audit_hook": False})
    return tool


def _needs(result, *layers: str) -> None:
    missing = [layer for layer in layers if layer not in result.meta["isolation"]]
    if missing:
        pytest.skip(f"the kernel here does not permit {missing}")


# ---------------------------------------------------------------- ordinary programs


def test_prints_the_result(tool):
    result = tool.run("print(1234*5678)", timeout=10)
    assert result.ok, result.error
    assert result.output.strip() == "7006652"
    assert "audit_hook" in result.meta["isolation"]


def test_code_in_a_markdown_fence_is_unwrapped(tool):
    result = tool.run("Here you go:\n```python\nx = 6 * 7\nprint(x)\n```\n", timeout=10)
    assert result.ok and result.output.strip() == "42"


def test_numpy_can_be_imported(tool):
    result = tool.run("import numpy as np\nprint(int(np.arange(10).sum()))", timeout=10)
    assert result.ok, result.error + result.output
    assert result.output.strip() == "45"


def test_what_site_gave_a_program_is_kept_without_it(tool):
    """The child starts without ``site`` (-S, a faster start): site-packages stay importable, ``exit`` and ``quit``
    work, and the package's own editable finder is not there (the program cannot import agentflow)."""
    result = tool.run("import sys\nprint(sys.flags.no_site)\nexit('done')", timeout=10)
    assert result.output.splitlines()[0] == "1" and result.error == "runtime_error: done", result
    assert tool.run("quit()", timeout=10).ok
    assert "No module named 'agentflow'" in tool.run("import agentflow", timeout=10).error


def test_runtime_error_names_the_exception(tool):
    result = tool.run("x = 1\nprint(x / 0)", timeout=10)
    assert result.error.startswith("runtime_error: ZeroDivisionError")
    assert 'line 2' in result.output


def test_working_directory_is_private_and_removed(tool, run_root):
    code = "import os\nopen('notes.txt', 'w').write('hi')\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))"
    result = tool.run(code, timeout=10)
    assert result.ok, result.error + result.output
    workdir, listing = result.output.strip().splitlines()
    assert listing == "['notes.txt']"
    assert Path(workdir).is_relative_to(run_root)
    assert not Path(workdir).exists()
    assert list(run_root.iterdir()) == []


def test_concurrent_runs_do_not_interfere(tool):
    results = [None] * 4

    def work(i):
        results[i] = tool.run(f"print({i} * 1000)", timeout=10)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.output.strip() for r in results] == ["0", "1000", "2000", "3000"]


# ---------------------------------------------------------------- limits


def test_infinite_loop_is_stopped_by_the_wall_clock(run_root):
    tool = PythonTool(PythonToolConfig(timeout_s=2, cpu_s=30, temp_root=str(run_root)))
    started = time.monotonic()
    result = tool.run("while True: pass", timeout=10)
    assert time.monotonic() - started < 2 + 2
    assert result.error.startswith("timeout:")
    assert _sandbox_processes(run_root) == 0


def test_infinite_loop_is_stopped_by_the_cpu_limit(run_root):
    tool = PythonTool(PythonToolConfig(timeout_s=10, cpu_s=1, temp_root=str(run_root)))
    started = time.monotonic()
    result = tool.run("while True: pass", timeout=10)
    assert result.error.startswith("cpu_limit:")
    assert time.monotonic() - started < 8  # 1 s of CPU; generous for a busy machine


def test_the_call_timeout_lowers_the_configured_one(tool):
    started = time.monotonic()
    result = tool.run("import time\ntime.sleep(60)", timeout=1)
    assert result.error.startswith("timeout:")
    assert time.monotonic() - started < 1 + 2


def test_a_program_that_leaves_its_process_group_is_still_killed(run_root):
    tool = PythonTool(PythonToolConfig(timeout_s=1, temp_root=str(run_root)))
    result = tool.run("import os, time\nos.setsid()\ntime.sleep(60)", timeout=10)
    assert result.error.startswith("timeout:")
    time.sleep(0.2)
    assert _sandbox_processes(run_root) == 0


def test_fork_bomb_is_stopped(tool):
    before = _all_processes()
    started = time.monotonic()
    result = tool.run("import os\nwhile True: os.fork()", timeout=10)
    assert time.monotonic() - started < 5
    assert result.error.startswith("forbidden:")
    time.sleep(0.2)
    assert _sandbox_processes(Path(tool.config.temp_root)) == 0
    assert _all_processes() < before + 10  # other work on the machine may start a few


def test_huge_allocation_is_a_memory_error(tool):
    result = tool.run("b = bytearray(10*1024**3)", timeout=10)
    assert result.error.startswith("memory_error:")


def test_huge_output_is_capped(tool):
    result = tool.run("for i in range(200_000):\n    print('line', i)", timeout=10)
    assert result.ok, result.error
    assert len(result.output) <= tool.config.max_output_chars
    assert result.output.startswith("line 0\n")
    assert "[output truncated:" in result.output


def test_working_directory_size_is_capped(tool):
    code = "data = b'x' * 2**20\nfor i in range(200):\n    open(f'f{i}', 'wb').write(data)"
    result = tool.run(code, timeout=10)
    if "tmpfs_workdir" not in result.meta["isolation"]:
        pytest.skip("no tmpfs working directory here")
    assert result.error.startswith("runtime_error:") and "No space left" in result.error


# ---------------------------------------------------------------- refused operations


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    yield server
    server.close()


def _assert_nobody_connected(server: socket.socket) -> None:
    with pytest.raises(socket.timeout):
        server.accept()


def test_network_is_refused(tool, listener):
    port = listener.getsockname()[1]
    result = tool.run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)", timeout=10)
    assert result.error.startswith("forbidden:")
    _assert_nobody_connected(listener)


def test_writing_outside_the_working_directory_is_refused(tool, tmp_path):
    target = tmp_path / "escaped.txt"
    result = tool.run(f"open({str(target)!r}, 'w').write('x')", timeout=10)
    assert result.error.startswith("forbidden:")
    assert not target.exists()


def test_deleting_outside_the_working_directory_is_refused(tool, tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    result = tool.run(f"import os\nos.remove({str(victim)!r})", timeout=10)
    assert result.error.startswith("forbidden:")
    assert victim.read_text() == "precious"


def test_subprocess_is_refused(tool):
    target = Path(f"/tmp/agentflow-sandbox-{uuid.uuid4().hex}")
    result = tool.run(f"import subprocess\nsubprocess.run(['sh', '-c', 'touch {target}'])", timeout=10)
    assert result.error.startswith("forbidden:")
    assert not target.exists()


def test_ctypes_is_refused(tool):
    result = tool.run("import ctypes\nprint(ctypes.CDLL(None).getpid())", timeout=10)
    assert result.error.startswith("forbidden:")


def test_signalling_the_caller_is_refused(tool):
    result = tool.run(f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)", timeout=10)
    assert not result.ok  # we are still alive to see it


# ---------------------------------------------------------------- kernel layers without the audit hook


def test_kernel_keeps_the_file_system_read_only(kernel_only_tool, tmp_path):
    open_to_all = tmp_path / "open"  # in a folder anyone may enter and write, only the read-only mount stops it
    open_to_all.mkdir()
    folder = tmp_path  # every folder of pytest's on the way (one more under xdist: popen-gwN) may be entered
    while folder != Path(tempfile.gettempdir()) and folder.stat().st_uid == os.getuid() and folder != folder.parent:
        folder.chmod(folder.stat().st_mode | 0o711)
        folder = folder.parent
    open_to_all.chmod(0o777)
    target = open_to_all / "escaped.txt"
    result = kernel_only_tool.run(f"open({str(target)!r}, 'w').write('x')", timeout=10)
    _needs(result, "readonly_fs")
    assert "Read-only file system" in result.error
    assert not target.exists()


def test_kernel_keeps_the_network_away(kernel_only_tool, listener):
    port = listener.getsockname()[1]
    result = kernel_only_tool.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
                                  timeout=10)
    _needs(result, "net_ns")
    assert result.error.startswith("runtime_error:")
    _assert_nobody_connected(listener)


def test_kernel_refuses_new_processes(kernel_only_tool):
    target = Path(f"/tmp/agentflow-sandbox-{uuid.uuid4().hex}")
    code = f"import os, subprocess\ntry:\n    os.fork()\nexcept OSError as e:\n    print('fork:', e)\n" \
           f"subprocess.run(['sh', '-c', 'touch {target}'])"
    result = kernel_only_tool.run(code, timeout=10)
    _needs(result, "seccomp")
    assert "fork: [Errno 1] Operation not permitted" in result.output
    assert result.error.startswith("runtime_error: PermissionError")
    assert not target.exists()


def test_kernel_hides_the_callers_processes(kernel_only_tool):
    result = kernel_only_tool.run(f"import os\nos.kill({os.getpid()}, 0)", timeout=10)
    _needs(result, "pid_ns")
    assert "ProcessLookupError" in result.error


def test_kernel_refuses_to_make_mounts_writable_again(kernel_only_tool):
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.mount(None, b'/', None, 32 | 4096, None), ctypes.get_errno())")  # MS_REMOUNT | MS_BIND
    result = kernel_only_tool.run(code, timeout=10)
    _needs(result, "readonly_fs", "seccomp")
    assert result.ok, result.error
    assert result.output.split() == ["-1", "1"]  # EPERM



# ---------------------------------------------------------------- isolation between runs and from the host

_HUNT = """
import os, stat, time


def read(path):  # regular files only: a pipe or FIFO would block
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b''
    try:
        return os.pread(fd, 1 << 20, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b''
    except OSError:
        return b''
    finally:
        os.close(fd)


time.sleep(1.0)  # the other run has started, written its file and printed by now
secret, hits, scanned, deadline = {secret!r}.encode(), [], 0, time.monotonic() + 5
roots, path = [], os.getcwd()
while path != '/':  # its own run folder, the folder of all runs, and up; then all of /tmp
    path = os.path.dirname(path)
    roots.append(path)
for root in roots[:-1] + ['/tmp']:
    base = root.count(os.sep)
    for folder, dirs, files in os.walk(root):
        if folder.count(os.sep) - base >= 3 or time.monotonic() > deadline:
            dirs[:] = []
        for name in files:
            scanned += 1
            if secret in read(os.path.join(folder, name)):
                hits.append(os.path.join(folder, name))
for pid in filter(str.isdigit, os.listdir('/proc')):
    for link in ['cwd/notes.txt'] + ['fd/' + fd for fd in '0123456789']:
        if secret in read(f'/proc/{{pid}}/{{link}}'):
            hits.append(f'/proc/{{pid}}/{{link}}')
print('scanned', scanned, 'found', sorted(set(hits)))
"""


@pytest.mark.faults
def test_a_run_cannot_read_another_concurrent_runs_files(tool, run_root):
    secret = uuid.uuid4().hex
    victim_code = f"import time\nopen('notes.txt', 'w').write({secret!r})\nprint({secret!r})\ntime.sleep(4)"
    results = {}
    victim = threading.Thread(target=lambda: results.setdefault("victim", tool.run(victim_code, timeout=10)))
    victim.start()
    deadline = time.monotonic() + 5
    while not list(run_root.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.01)
    hunter = tool.run(_HUNT.format(secret=secret), timeout=10)
    victim.join()
    assert results["victim"].ok and results["victim"].output.strip() == secret
    assert hunter.ok, hunter.error + hunter.output
    assert "scanned" in hunter.output and "found []" in hunter.output, hunter.output
    assert secret not in hunter.output


@pytest.fixture
def root_only_file():
    """A root-owned 0600 file in a folder anyone may enter, so that only the file's mode protects it."""
    if os.geteuid() != 0:
        pytest.skip("only a service running as root can make a file its sandbox must not read")
    folder = Path(tempfile.mkdtemp(prefix="agentflow-secret-"))
    folder.chmod(0o755)
    target = folder / "secret.txt"
    target.write_text("root-only " + uuid.uuid4().hex)
    target.chmod(0o600)
    yield target
    shutil.rmtree(folder)


@pytest.mark.faults
def test_a_run_cannot_read_a_root_only_host_file(tool, root_only_file):
    result = tool.run(f"print(open({str(root_only_file)!r}).read())", timeout=10)
    assert "root-only" not in result.output, result.output
    assert "unprivileged_uid" in result.meta["isolation"], result.meta
    assert result.error.startswith("runtime_error: PermissionError"), result.error


_FORGE = """
import os
for name in os.listdir('/proc/self/fd'):
    try:
        os.write(int(name), {payload!r})
        print('forged into', name)
    except OSError:
        pass
{ending}
"""


@pytest.mark.faults
@pytest.mark.parametrize("payload, ending, error", [
    (b'garbage\xff\xfe\n{"isolation": 7, "output_bytes": "many", "message": [1]}\n[1, 2]\n',
     "os._exit(1)", "runtime_error:"),
    (b'{"isolation": ["forged_layer"], "status": "ok", "message": "forged", "output_bytes": 123456789}\n',
     "print(1 / 0)", "runtime_error: ZeroDivisionError"),
])
def test_a_forged_report_cannot_change_the_result(tool, payload, ending, error):
    result = tool.run(_FORGE.format(payload=payload, ending=ending), timeout=10)
    assert result.error.startswith(error), result.error
    assert isinstance(result.meta["isolation"], list) and "forged_layer" not in result.meta["isolation"]
    assert "audit_hook" in result.meta["isolation"]
    assert "forged into 3" not in result.output and "omitted" not in result.output
