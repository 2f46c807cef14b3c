"""The ``python`` tool: runs a short program in a sandboxed child process and returns what it printed.

The child is ``sys.executable -I -B sandbox_boot.py`` (isolated mode: no user site, no PYTHON* variables, but the
interpreter's site-packages stay importable) in its own session, with a minimal environment and a fresh
temporary directory that is deleted afterwards. The bootstrap (see :mod:`agentflow.tools.sandbox_boot`) applies
rlimits, namespaces, a read-only file system, seccomp and an audit hook, and reports which layers it could apply;
they are returned in ``ToolResult.meta["isolation"]``. On wall-time expiry the whole process group is SIGKILLed.

Typed errors: ``timeout``, ``cpu_limit``, ``memory_error``, ``forbidden``, ``runtime_error``, ``invalid_input``.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
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
EXIT_FORBIDDEN, EXIT_MEMORY, EXIT_CPU = 201, 202, 203  # mirrored in sandbox_boot.py
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


def truncate_output(text: str, limit: int, total_chars: int | None = None) -> str:
    """At most ``limit`` characters, ending with a marker when something was cut."""
    total = max(total_chars or 0, len(text))
    if total <= limit:
        return text
    marker = f"\n...[output truncated: {total - limit} of {total} characters omitted]"
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
            examples=("print(1234 * 5678)", "import math; print(math.comb(10, 3))"),
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
        work = box / "work"
        work.mkdir()
        (box / "program.py").write_text(code, encoding="utf-8")
        with open(box / "output.txt", "wb+") as out, open(box / "report.jsonl", "wb+") as report:
            settings = self._settings(box, work, report.fileno())
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", str(BOOTSTRAP), json.dumps(settings)],
                cwd=work, env=_child_env(work), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                pass_fds=(report.fileno(),), start_new_session=True,
            )
            status, cpu_s, timed_out = _wait_or_kill(proc, wall)
            out.seek(0)
            output = out.read(self.config.output_bytes).decode("utf-8", errors="replace")
            report.seek(0)
            events = _read_report(report.read())
        return self._to_result(status, cpu_s, timed_out, wall, output, events)

    def _settings(self, box: Path, work: Path, report_fd: int) -> dict:
        c = self.config
        return {
            "program": str(box / "program.py"), "work": str(work), "report_fd": report_fd,
            "cpu_s": c.cpu_s, "memory_bytes": c.memory_mb * 2**20, "output_bytes": c.output_bytes,
            "work_bytes": c.workdir_mb * 2**20, "max_open_files": c.max_open_files,
            "max_processes": c.max_processes,
        }

    # ------------------------------------------------------------ outcome

    def _to_result(self, status: int, cpu_s: float, timed_out: bool, wall: float, output: str,
                   events: dict) -> ToolResult:
        meta = {"isolation": events.get("isolation", []), "cpu_s": round(cpu_s, 3), "exit_status": status}
        text = truncate_output(output, self.config.max_output_chars, events.get("output_bytes"))
        error = "" if status == 0 and not timed_out else self._error(status, cpu_s, timed_out, wall, output, events)
        return ToolResult(output=text, error=error, meta=meta)

    def _error(self, status: int, cpu_s: float, timed_out: bool, wall: float, output: str, events: dict) -> str:
        message = events.get("message", "")
        if timed_out:
            return f"timeout: the program ran past the {wall:g} s wall-clock limit and was killed"
        hard_cpu_kill = status == -signal.SIGKILL and cpu_s >= self.config.cpu_s
        if status in (EXIT_CPU, -signal.SIGXCPU) or hard_cpu_kill:
            return f"cpu_limit: the program used more than {self.config.cpu_s} s of CPU time"
        if status == EXIT_MEMORY:
            return f"memory_error: the program ran past the {self.config.memory_mb} MiB memory limit"
        if status == EXIT_FORBIDDEN:
            return f"forbidden: {message or 'an operation the sandbox does not allow'}"
        if status < 0:
            return f"runtime_error: killed by signal {_signal_name(-status)}"
        return f"runtime_error: {message or _last_lines(output) or f'exited with status {status}'}"


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


def _read_report(data: bytes) -> dict:
    """Merge the bootstrap's JSON lines; lines that do not parse are ignored."""
    events: dict = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict):
            events.update(item)
    return events


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _last_lines(output: str, count: int = 2) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:])
