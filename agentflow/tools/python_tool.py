"""The ``python`` tool: runs a short program in a sandboxed child process and returns what it printed.

The child is ``sys.executable -I -S -B sandbox_boot.py`` (isolated mode: no user site, no PYTHON* variables; no
``site`` module, whose ``.pth`` hooks, the editable install's finder among them, were two thirds of a 35 ms start, but
the bootstrap puts this interpreter's site-packages on its path, so they stay importable) in its own session, with a minimal environment and a fresh
temporary directory that is deleted afterwards. The bootstrap (see :mod:`agentflow.tools.sandbox_boot`) applies
rlimits, namespaces, a read-only file system, an unprivileged uid, seccomp and an audit hook, and reports which
layers it could apply; they are returned in ``ToolResult.meta["isolation"]``. On wall-time expiry the whole process
group is SIGKILLed.

Nothing of a run has a name another run could find: the program goes in and the output comes back through unnamed
files (``O_TMPFILE``), the report through a pipe that the child closes before the program starts, and the files the
program writes live in a tmpfs that exists only in the run's own mount namespace. The run directory on the host is
an empty mount point.

Typed errors: ``timeout``, ``cpu_limit``, ``memory_error``, ``forbidden``, ``runtime_error``, ``invalid_input``.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path

from agentflow.config import setting
from agentflow.errors import InvalidInput
from agentflow.tools.base import ToolResult, ToolSpec

BOOTSTRAP = Path(__file__).with_name("sandbox_boot.py")
# this interpreter's site-packages, which the child (started without ``site``) puts on its path; not the folders a
# ``.pth`` file adds
SITE_PACKAGES = [path for path in site.getsitepackages() if os.path.isdir(path)]
EXIT_FORBIDDEN, EXIT_MEMORY, EXIT_CPU = 201, 202, 203  # mirrored in sandbox_boot.py
OUTPUT_TAIL_BYTES = 65536  # room past output_bytes (RLIMIT_FSIZE) for an error's last line after a cut
REPORT_BYTES = 65536  # the report is one line of layer names
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class PythonToolConfig:
    """Limits of one sandboxed run."""

    timeout_s: float = setting(10.0, "wall-clock limit of one run in seconds (the call's own timeout may lower it)")
    cpu_s: int = setting(10, "CPU-time limit of one run in seconds (RLIMIT_CPU)")
    memory_mb: int = setting(1024, "address-space limit of the child in MiB (RLIMIT_AS)")
    max_output_chars: int = setting(8000, "characters of printed output returned; the rest is cut with a marker")
    output_bytes: int = setting(1_000_000, "bytes of output the child may write before the rest is dropped")
    workdir_mb: int = setting(64, "size of the child's working directory in MiB (a tmpfs where permitted)")
    max_open_files: int = setting(64, "open file descriptors of the child (RLIMIT_NOFILE)")
    max_processes: int = setting(256, "processes+threads of the child's uid, counted machine-wide (RLIMIT_NPROC; "
                                      "the kernel does not enforce it for root, seccomp refuses new processes anyway)")
    temp_root: str | None = setting(None, "where run directories are created (default: the system temp dir)")
    sandbox_uid: int = setting(65534, "host uid and gid of the program when the service runs as root (not 0; "
                                      "default nobody); a non-root service runs it as its own uid")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and value <= 0:
                raise InvalidInput(f"python tool setting {f.name} must be positive, got {value!r}")
        if self.temp_root is not None and not Path(self.temp_root).is_dir():
            raise InvalidInput(f"python tool setting temp_root is not a directory: {self.temp_root}")


def unwrap_code(command: str) -> str:
    """The code inside the first markdown fence, or the command itself."""
    match = _FENCE.search(command)
    return match.group(1) if match else command


def truncate_output(text: str, limit: int, dropped: bool = False) -> str:
    """At most ``limit`` characters, ending with a marker when something was cut (``dropped``: the child already
    dropped what the program printed past its byte cap, so the total is not known)."""
    total = len(text)
    if total <= limit and not dropped:
        return text
    counts = f"{max(0, total - limit)} of {'over ' if dropped else ''}{total}"
    marker = f"\n...[output truncated: {counts} characters omitted]"
    return text[: max(0, limit - len(marker))] + marker


class PythonTool:
    """Runs Python 3 code in a sandboxed child process."""

    def __init__(self, config: PythonToolConfig | None = None):
        self.config = config or PythonToolConfig()
        c = self.config
        self.spec = ToolSpec(
            name="python",
            description="Runs a short Python 3 program in an isolated sandbox and returns what it prints.",
            input_format="Python 3 source code that prints its result with print(), optionally in a ```python fence",
            # examples that answer no question anyone asks: a small model copies what its prompt shows
            # (tests/unit/test_prompt_examples.py keeps the docs' example queries out of every prompt)
            examples=("print(sorted(['pear', 'fig', 'apple']))", "import math; print(math.sqrt(2))"),
            limitations=(f"no network, no subprocesses, files only in its temporary working directory; "
                         f"{c.timeout_s:g} s wall time, {c.cpu_s} s CPU, {c.memory_mb} MiB memory; "
                         f"output cut at {c.max_output_chars} characters; only printed output is returned"),
        )

    def run(self, command: str, timeout: float) -> ToolResult:
        started = time.monotonic()
        code = unwrap_code(command)
        wall = min(self.config.timeout_s, timeout)
        if not code.strip():
            return ToolResult(error="invalid_input: empty program", duration_s=time.monotonic() - started)
        if wall <= 0:
            return ToolResult(error="timeout: no time left to run the program", duration_s=0.0)
        box = Path(tempfile.mkdtemp(prefix="agentflow-py-", dir=self.config.temp_root))
        try:
            result = self._run_in(box, code, wall)
        except OSError as exc:  # the machine, not the program: no process, no disk space
            result = ToolResult(error=f"unavailable: could not run the sandbox: {exc}")
        finally:
            shutil.rmtree(box, ignore_errors=True)
        result.duration_s = time.monotonic() - started
        return result

    # ------------------------------------------------------------ child process

    def _run_in(self, box: Path, code: str, wall: float) -> ToolResult:
        work = box / "work"  # the mount point of the run's private tmpfs; the box holds nothing else
        work.mkdir(mode=0o700)
        box.chmod(0o711)  # the unprivileged uid may walk through, not list
        if os.geteuid() == 0:  # without a mount namespace the program writes in this folder itself
            os.chown(work, self.config.sandbox_uid, self.config.sandbox_uid)
        report_r, report_w = os.pipe()
        try:
            with _unnamed_file(self.config.temp_root) as program, _unnamed_file(self.config.temp_root) as out:
                program.write(code.encode("utf-8", errors="backslashreplace"))
                program.seek(0)
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-B", str(BOOTSTRAP), json.dumps(self._settings(work, report_w))],
                    cwd=work, env=_child_env(work), stdin=program, stdout=out, stderr=subprocess.STDOUT,
                    pass_fds=(report_w,), start_new_session=True,
                )
                os.close(report_w)
                report_w = -1
                status, cpu_s, timed_out = _wait_or_kill(proc, wall)
                out.seek(0)
                raw = out.read(self.config.output_bytes + OUTPUT_TAIL_BYTES)
            isolation = read_isolation(_read_available(report_r))
        finally:
            os.close(report_r)
            if report_w >= 0:
                os.close(report_w)
        return self._to_result(status, cpu_s, timed_out, wall, raw, isolation)

    def _settings(self, work: Path, report_fd: int) -> dict:
        c = self.config
        return {
            "work": str(work), "report_fd": report_fd, "host_id": c.sandbox_uid,
            "cpu_s": c.cpu_s, "memory_bytes": c.memory_mb * 2**20, "output_bytes": c.output_bytes,
            "work_bytes": c.workdir_mb * 2**20, "max_open_files": c.max_open_files,
            "max_processes": c.max_processes, "site_packages": SITE_PACKAGES,
        }

    # ------------------------------------------------------------ outcome

    def _to_result(self, status: int, cpu_s: float, timed_out: bool, wall: float, raw: bytes,
                   isolation: list[str]) -> ToolResult:
        meta = {"isolation": isolation, "cpu_s": round(cpu_s, 3), "exit_status": status}
        output = raw.decode("utf-8", errors="replace")
        text = truncate_output(output, self.config.max_output_chars, dropped=len(raw) >= self.config.output_bytes)
        error = "" if status == 0 and not timed_out else self._error(status, cpu_s, timed_out, wall, output)
        return ToolResult(output=text, error=error, meta=meta)

    def _error(self, status: int, cpu_s: float, timed_out: bool, wall: float, output: str) -> str:
        """From what the kernel says (timeout, exit status, CPU time) and, for the message, the output's last line."""
        message = _last_line(output)
        if timed_out:
            return f"timeout: the program ran past the {wall:g} s wall-clock limit and was killed"
        hard_cpu_kill = status == -signal.SIGKILL and cpu_s >= self.config.cpu_s
        if status in (EXIT_CPU, -signal.SIGXCPU) or hard_cpu_kill:
            return f"cpu_limit: the program used more than {self.config.cpu_s} s of CPU time"
        if status == EXIT_MEMORY:
            return f"memory_error: the program ran past the {self.config.memory_mb} MiB memory limit"
        if status == EXIT_FORBIDDEN:
            return f"forbidden: {message.removeprefix('Forbidden: ') or 'an operation the sandbox does not allow'}"
        if status < 0:
            return f"runtime_error: killed by signal {_signal_name(-status)}"
        if status == 1 and message:  # an uncaught exception (its last line) or sys.exit("message")
            return f"runtime_error: {message}"
        return f"runtime_error: exited with status {status}"


def _child_env(work: Path) -> dict:
    one = "1"
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": one, "OPENBLAS_NUM_THREADS": one, "MKL_NUM_THREADS": one, "NUMEXPR_NUM_THREADS": one,
    }


def _wait_or_kill(proc: subprocess.Popen, wall: float) -> tuple[int, float, bool]:
    """Wait up to ``wall`` seconds; kill the process group after. Returns (exit status, CPU seconds, timed out)."""
    timed_out = not _exits_within(proc, wall)
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, raw_status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(raw_status)
    return proc.returncode, usage.ru_utime + usage.ru_stime, timed_out


def _exits_within(proc: subprocess.Popen, wall: float) -> bool:
    """Whether the child exits within ``wall`` seconds (it stays unreaped, for wait4)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel, strict seccomp profile): poll instead
        return _polls_exit_within(proc.pid, wall)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(wall * 1000))
    finally:
        os.close(pidfd)


def _polls_exit_within(pid: int, wall: float) -> bool:
    deadline = time.monotonic() + wall
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.01)
    return False


def _unnamed_file(folder: str | None):
    """A read-write file with no name (O_TMPFILE where the file system has it): no other run can open it."""
    return tempfile.TemporaryFile(dir=folder)


def _read_available(fd: int) -> bytes:
    """What the pipe holds now, without waiting for writers that may linger a moment after a kill."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, REPORT_BYTES)
    except BlockingIOError:
        return b""


def read_isolation(report: bytes) -> list[str]:
    """The layers named on the report's first line, ``{"isolation": [...]}``; [] for anything else."""
    try:
        item = json.loads(report.partition(b"\n")[0])
    except ValueError:  # also bad UTF-8
        return []
    layers = item.get("isolation") if isinstance(item, dict) else None
    if isinstance(layers, list) and all(isinstance(layer, str) for layer in layers):
        return layers
    return []


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][-2000:] if lines else ""
