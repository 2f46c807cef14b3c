"""Child bootstrap of the ``python`` tool: isolates itself, then runs the untrusted program.

Started by :mod:`agentflow.tools.python_tool` as ``python -I -B sandbox_boot.py SETTINGS_JSON``. It uses the
standard library only (it must not import agentflow) and applies these layers, kernel-enforced ones first:

1. rlimits: CPU seconds, address space, file size, open files, processes, no core dumps.
2. namespaces (``unshare``): user (drops host capabilities), network (no interfaces but a down loopback),
   IPC, mount and PID. In the mount namespace every mount is made read-only and a small tmpfs becomes the
   working directory; the mounts are then locked by a second user namespace. In the PID namespace the program
   runs as pid 1 under this process (the reaper), sees no host process, and dies with the reaper.
3. every capability dropped, then seccomp: no new processes (threads are fine), no exec, no sockets, no mounts,
   no ptrace, no keyrings.
4. an audit hook (Python level, friendly errors): refuses sockets, subprocesses, ctypes calls, signals to
   other processes, rlimit changes, and writes outside the working directory.

Each layer is applied when the kernel permits it; the list of applied layers is reported to the parent.
Stdout and stderr go to a file the parent opened; the bootstrap caps what reaches it. A JSON line per event
(``{"isolation": [...]}``, ``{"status": ...}``) goes to the report descriptor the parent passed.
"""

from __future__ import annotations

import ctypes
import io
import json
import linecache
import os
import resource
import signal
import sys
import traceback
import types

EXIT_FORBIDDEN, EXIT_MEMORY, EXIT_CPU = 201, 202, 203
PROGRAM_NAME = "<python>"
TRACEBACK_FRAMES = 30  # a deep recursion would otherwise take seconds to format
SANDBOX_ID = 1000  # uid/gid the program sees inside its user namespace

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_THREAD = 0x20000000, 0x40000000, 0x00010000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REC, MS_PRIVATE = 0x4000, 0x40000
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and aarch64
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2

_libc = ctypes.CDLL(None, use_errno=True)


class Forbidden(PermissionError):
    """Raised by the audit hook for an operation the sandbox refuses."""


# ---------------------------------------------------------------- limits


def set_limits(settings: dict) -> None:
    cpu = int(settings["cpu_s"])
    memory = int(settings["memory_bytes"])
    limits = {
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # soft -> SIGXCPU (handled), hard -> SIGKILL
        resource.RLIMIT_AS: memory,
        resource.RLIMIT_FSIZE: int(settings["output_bytes"]) + 65536,
        resource.RLIMIT_NOFILE: int(settings["max_open_files"]),
        resource.RLIMIT_NPROC: int(settings["max_processes"]),  # not enforced for uid 0; seccomp covers that
    }
    for which, value in limits.items():
        soft, hard = value if isinstance(value, tuple) else (value, value)
        resource.setrlimit(which, (soft, hard))


# ---------------------------------------------------------------- namespaces and mounts


def _ok(result: int) -> bool:
    return result == 0


def _unshare_first(candidates: list[int]) -> int:
    """Unshare the first namespace set the kernel allows; 0 when none."""
    for flags in candidates:
        if _ok(_libc.unshare(flags)):
            return flags
    return 0


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _mount_setattr(path: str, recursive: bool, set_: int = 0, clear: int = 0) -> bool:
    attr = _MountAttr(set_, clear, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    size = ctypes.sizeof(attr)
    return _ok(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), size))


def _readonly_root_with_tmpfs_work(work: str, work_bytes: int) -> bool:
    """Make every mount read-only, then mount a size-capped tmpfs on the working directory."""
    if not _ok(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)):
        return False
    if not _mount_setattr("/", recursive=True, set_=MOUNT_ATTR_RDONLY):
        return False
    options = f"size={work_bytes},mode=0700".encode()
    return _ok(_libc.mount(b"tmpfs", work.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options))


def _become_reaper_of(child: int, alive_w: int) -> None:
    """Wait for the namespace's pid 1 and leave the way it left. Never returns."""
    _, status = os.waitpid(child, 0)
    os.close(alive_w)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _fork_into_pid_namespace() -> bool:
    """Fork; the parent becomes the reaper, the child (pid 1 in the namespace) returns True.

    Returns False, without forking, when the fork is refused (e.g. RLIMIT_NPROC of a busy non-root user).
    """
    alive_r, alive_w = os.pipe()
    try:
        child = os.fork()
    except OSError:
        os.close(alive_r)
        os.close(alive_w)
        return False
    if child:
        os.close(alive_r)
        _become_reaper_of(child, alive_w)
    os.close(alive_w)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.set_blocking(alive_r, False)
    try:
        if os.read(alive_r, 1) == b"":  # the reaper died before the death signal was armed
            os._exit(137)
    except BlockingIOError:
        pass
    os.close(alive_r)
    return True


def _map_own_ids(inside_id: int, uid: int, gid: int) -> bool:
    """Map our outside ``uid``/``gid`` to ``inside_id`` in the new user namespace (to create files and nest)."""
    try:
        for name, value in (("setgroups", "deny"), ("uid_map", f"{inside_id} {uid} 1"),
                            ("gid_map", f"{inside_id} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(value)
        return True
    except OSError:
        return False


def isolate(work: str, work_bytes: int) -> list[str]:
    """Apply the namespace layers the kernel allows; return their names."""
    applied, uid, gid = [], os.geteuid(), os.getegid()
    base = CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS | CLONE_NEWPID
    flags = _unshare_first([CLONE_NEWUSER | base, base, CLONE_NEWUSER | CLONE_NEWNET, CLONE_NEWNET])
    if flags & CLONE_NEWUSER and not _map_own_ids(SANDBOX_ID, uid, gid):
        flags &= ~CLONE_NEWNS  # without a mapping the tmpfs working directory would be unusable
    names = {CLONE_NEWUSER: "user_ns", CLONE_NEWNET: "net_ns", CLONE_NEWIPC: "ipc_ns"}
    applied += [name for bit, name in names.items() if flags & bit]
    if flags & CLONE_NEWNS and _readonly_root_with_tmpfs_work(work, work_bytes):
        applied += ["readonly_fs", "tmpfs_workdir"]
    if flags & CLONE_NEWPID and _fork_into_pid_namespace():
        applied.append("pid_ns")
        if flags & CLONE_NEWNS and _ok(_libc.mount(b"proc", b"/proc", b"proc",
                                                   MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)):
            applied.append("private_proc")
    if flags & CLONE_NEWUSER and flags & CLONE_NEWNS and _ok(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)):
        applied.append("locked_mounts")  # mounts copied into a less privileged namespace cannot be made rw
    return applied


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> bool:
    """Clear every capability (matters most when no user namespace was allowed and we are real root)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    return _ok(_libc.capset(ctypes.byref(header), data))


# ---------------------------------------------------------------- seccomp

_SECCOMP_TABLES = {
    # arch id; refused with EPERM: fork vfork (x86_64 only) execve execveat socket ptrace process_vm_readv/writev
    # mount umount2 pivot_root chroot unshare setns open_tree move_mount fsopen fsconfig fsmount fspick
    # mount_setattr add_key request_key keyctl perf_event_open bpf; then clone, clone3, whether x32 numbers exist
    "x86_64": (0xC000003E, (57, 58, 59, 322, 41, 101, 310, 311, 165, 166, 155, 161, 272, 308, 428, 429, 430,
                            431, 432, 433, 442, 248, 249, 250, 298, 321), 56, 435, True),
    "aarch64": (0xC00000B7, (221, 281, 198, 117, 270, 271, 40, 39, 41, 51, 97, 268, 428, 429, 430, 431, 432,
                             433, 442, 217, 218, 219, 241, 280), 220, 435, False),
}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp_program(arch: int, refused: tuple, clone: int, clone3: int, has_x32: bool) -> list[tuple]:
    """Classic BPF: refuse the listed syscalls, clone without CLONE_THREAD, and other ABIs."""
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    prog = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, eperm), (load, 0, 0, 0)]
    if has_x32:
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    for nr in refused:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, clone3), (ret, 0, 0, enosys)]  # glibc falls back to clone, checked below
    prog += [(jeq, 0, 4, clone), (load, 0, 0, 16), (jset, 0, 1, CLONE_THREAD), (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    prog += [(ret, 0, 0, allow)]
    return prog


def install_seccomp() -> bool:
    table = _SECCOMP_TABLES.get(os.uname().machine)
    if table is None or not _ok(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)):
        return False
    prog = _seccomp_program(*table)
    filters = (_SockFilter * len(prog))(*[_SockFilter(c, jt, jf, k) for c, jt, jf, k in prog])
    fprog = _SockFprog(len(prog), filters)
    return _ok(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0))


# ---------------------------------------------------------------- output


class CappedSink(io.RawIOBase):
    """Writes to ``fd`` until ``limit`` bytes, then counts and drops the rest."""

    def __init__(self, fd: int, limit: int):
        self.fd, self.left, self.total = fd, limit, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        size = len(data)
        self.total += size
        keep = memoryview(data)[: max(0, self.left)]
        try:
            while keep:
                written = os.write(self.fd, keep)
                keep, self.left = keep[written:], self.left - written
        except OSError:
            self.left = 0
        return size


def capture_output(limit: int) -> CappedSink:
    sink = CappedSink(1, limit)
    shared = io.BufferedWriter(sink)  # one buffer keeps stdout and stderr in order
    for name in ("stdout", "stderr"):
        stream = io.TextIOWrapper(shared, encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True, write_through=True)
        setattr(sys, name, stream)
    return sink


# ---------------------------------------------------------------- audit hook

_REFUSED_EVENTS = {
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
    "pty.spawn", "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "resource.setrlimit", "resource.prlimit", "os.setuid", "os.setgid",
}
# event -> positions of the path arguments that name something the call would modify
_PATH_EVENTS = {
    "os.remove": (0,), "os.rename": (0, 1), "os.mkdir": (0,), "os.rmdir": (0,), "os.chmod": (0,),
    "os.chown": (0,), "os.link": (1,), "os.symlink": (1,), "os.truncate": (0,), "os.utime": (0,),
    "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,), "os.chflags": (0,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


_WRITABLE_DEVICES = {os.devnull, "/dev/stdout", "/dev/stderr"}


def _inside(path, work: str, dir_fd=None) -> bool:
    """Whether ``path`` (relative to ``dir_fd`` or the cwd) resolves into ``work``."""
    if isinstance(path, int):  # an already open descriptor
        return True
    path = os.fsdecode(path)
    if path in _WRITABLE_DEVICES:
        return True
    base = os.getcwd()
    if isinstance(dir_fd, int) and dir_fd >= 0:
        base = os.readlink(f"/proc/self/fd/{dir_fd}")
    real = os.path.realpath(os.path.join(base, path))
    return real == work or real.startswith(work + os.sep) or real == os.devnull


def _dir_fd(event: str, args: tuple):
    """The dir_fd argument of a path event, when it has one (it comes right after the paths)."""
    return args[-1] if event in ("os.remove", "os.mkdir", "os.rmdir", "os.chmod", "os.utime") else None


def _opens_for_writing(args: tuple) -> bool:
    """``open`` events carry (path, mode, flags)."""
    return len(args) > 2 and isinstance(args[2], int) and bool(args[2] & _WRITE_FLAGS)


def make_audit_hook(work: str):
    own_pid = os.getpid()

    def hook(event: str, args: tuple) -> None:
        if event in _REFUSED_EVENTS or event.startswith("ctypes."):
            raise Forbidden(f"{event} is not allowed in the sandbox")
        if event in ("os.kill", "os.killpg") and args[0] != own_pid:
            raise Forbidden(f"{event} to another process")
        if event == "open" and _opens_for_writing(args) and not _inside(args[0], work):
            raise Forbidden(f"writing {args[0]!r} outside the working directory")
        for index in _PATH_EVENTS.get(event, ()):
            if not _inside(args[index], work, _dir_fd(event, args)):
                raise Forbidden(f"{event} on {args[index]!r} outside the working directory")

    return hook


# ---------------------------------------------------------------- running the program


class Reporter:
    """JSON lines to the parent's report descriptor."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, **fields) -> None:
        try:
            os.write(self.fd, (json.dumps(fields) + "\n").encode())
        except OSError:
            pass


def _finish(code: int, kind: str, message: str, sink: CappedSink, reporter: Reporter) -> None:
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - the program may have broken its own streams
        pass
    reporter.send(status=kind, message=message[-2000:], output_bytes=sink.total)
    os._exit(code)


def _print_user_traceback(exc: BaseException) -> None:
    """The innermost frames of the traceback, without the bootstrap's (its runner and its audit hook)."""
    innermost = traceback.extract_tb(exc.__traceback__, limit=-TRACEBACK_FRAMES)
    frames = [f for f in innermost if f.filename != __file__]
    if frames:
        print("Traceback (most recent call last):", file=sys.stderr)
        print("".join(traceback.format_list(frames)), end="", file=sys.stderr)
    print("".join(traceback.format_exception_only(type(exc), exc)), end="", file=sys.stderr)


def run_program(source: str, sink: CappedSink, reporter: Reporter) -> None:
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    linecache.cache[PROGRAM_NAME] = (len(source), None, source.splitlines(True), PROGRAM_NAME)
    try:
        exec(compile(source, PROGRAM_NAME, "exec"), main.__dict__)
    except SystemExit as exc:  # sys.exit(): an int status, or a message printed with status 1
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        message = f"exited with status {code}"
        if exc.code is not None and not isinstance(exc.code, int):
            message = str(exc.code)
            print(message, file=sys.stderr)
        _finish(code, "ok" if code == 0 else "runtime_error", message, sink, reporter)
    except MemoryError:
        _finish(EXIT_MEMORY, "memory_error", "the program ran out of memory", sink, reporter)
    except Forbidden as exc:
        _print_user_traceback(exc)
        _finish(EXIT_FORBIDDEN, "forbidden", str(exc), sink, reporter)
    except BaseException as exc:  # noqa: BLE001 - any error of the program is its result
        _print_user_traceback(exc)
        message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        _finish(1, "runtime_error", message, sink, reporter)
    _finish(0, "ok", "", sink, reporter)


def _on_cpu_limit(sink: CappedSink, reporter: Reporter):
    def handler(signum, frame):  # pid 1 of a namespace ignores SIGXCPU unless it has a handler
        _finish(EXIT_CPU, "cpu_limit", "CPU time limit reached", sink, reporter)

    return handler


def main() -> None:
    settings = json.loads(sys.argv[1])
    reporter = Reporter(int(settings["report_fd"]))
    with open(settings["program"], encoding="utf-8") as f:
        source = f.read()
    work = os.path.realpath(settings["work"])
    set_limits(settings)
    applied = isolate(work, int(settings["work_bytes"]))
    os.chdir(work)
    if drop_capabilities():
        applied.append("no_capabilities")
    if install_seccomp():
        applied.append("seccomp")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full output file drops output, it does not kill
    sink = capture_output(int(settings["output_bytes"]))
    signal.signal(signal.SIGXCPU, _on_cpu_limit(sink, reporter))
    if settings.get("audit_hook", True):  # tests turn it off to check the kernel layers on their own
        sys.addaudithook(make_audit_hook(work))
        applied.append("audit_hook")
    reporter.send(isolation=applied)
    run_program(source, sink, reporter)


if __name__ == "__main__":
    main()
