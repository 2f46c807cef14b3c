"""Child bootstrap of the ``python`` tool: isolates itself, then runs the untrusted program.

Started by :mod:`agentflow.tools.python_tool` as ``python -I -S -B sandbox_boot.py SETTINGS_JSON`` with the program
on stdin. It uses the standard library only (it must not import agentflow) and applies these layers, kernel-enforced
ones first:

1. rlimits: CPU seconds, address space, file size, open files, processes, no core dumps.
2. namespaces (``unshare``): network (no interfaces but a down loopback), IPC, mount and PID, and an unprivileged
   uid. Run as root, the namespaces are made first, then uid and gid become ``host_id`` (never 0: root-only files
   stay unreadable, no capability is left); otherwise the process drops to ``host_id`` where it can and a user
   namespace maps SANDBOX_ID to its own ids. In the mount namespace every mount is made read-only and a small
   tmpfs, private to this run, becomes the working directory; the mounts are then locked by a user namespace of
   the unprivileged uid. In the PID namespace the program runs as pid 1 under this process (the reaper), sees no
   host process, and dies with the reaper.
3. every capability dropped, then seccomp: no new processes (threads are fine), no exec, no sockets, no mounts,
   no ptrace, no keyrings.
4. an audit hook (Python level, friendly errors): refuses sockets, subprocesses, ctypes calls, signals to
   other processes, rlimit changes, and writes outside the working directory.

Each layer is applied when the kernel permits it. The list of applied layers, ``{"isolation": [...]}``, is the one
line written to the report descriptor the parent passed, and that descriptor is closed before the program runs: the
program cannot forge it. Stdout and stderr go to an unnamed file the parent opened; the bootstrap caps what reaches
it. The outcome is the exit status (EXIT_* below, 1 for an uncaught exception, whose last line ends the output).
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
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
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


def _readonly_root_with_tmpfs_work(work: str, work_bytes: int, owner: int) -> bool:
    """Make every mount read-only, then mount a size-capped tmpfs owned by ``owner`` on the working directory and
    enter it (the cwd stays valid once the uid can no longer walk the path to it)."""
    if not _ok(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)):
        return False
    if not _mount_setattr("/", recursive=True, set_=MOUNT_ATTR_RDONLY):
        return False
    options = f"size={work_bytes},mode=0700,uid={owner},gid={owner}".encode()
    if not _ok(_libc.mount(b"tmpfs", work.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options)):
        return False
    os.chdir(work)
    return True


def _closed_ancestor(path: str) -> str | None:
    """The highest folder above ``path`` that only its owner (root) may enter, if any."""
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        ancestor = os.sep.join(parts[:i]) or os.sep
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def reveal_interpreter(paths: list[str]) -> bool:
    """For the interpreter's folders (``sys.path``) below a folder only root may enter (e.g. /root/.pyenv), cover
    that folder with a read-only tmpfs holding read-only binds of just those folders, so that the unprivileged uid
    can import and sees nothing else there. Run as root in the private mount namespace; whether all went well."""
    by_ancestor: dict[str, list[str]] = {}
    for path in sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)}):
        ancestor = _closed_ancestor(path)
        if ancestor is not None:
            by_ancestor.setdefault(ancestor, []).append(path)
    ok = True
    for ancestor, folders in by_ancestor.items():
        fd = os.open(ancestor, os.O_PATH | os.O_DIRECTORY)
        ok &= _ok(_libc.mount(b"tmpfs", ancestor.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755"))
        bound: list[str] = []
        for folder in folders:
            if any(folder.startswith(b + os.sep) for b in bound):
                continue
            os.makedirs(folder, exist_ok=True)
            source = f"/proc/self/fd/{fd}/{os.path.relpath(folder, ancestor)}".encode()
            ok &= _ok(_libc.mount(source, folder.encode(), None, MS_BIND | MS_REC, None))
            bound.append(folder)
        ok &= _mount_setattr(ancestor, recursive=True, set_=MOUNT_ATTR_RDONLY)
        os.close(fd)
    return bool(ok)


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


def _fork_into_pid_namespace(report_fd: int) -> int | None:
    """Fork; the parent closes ``report_fd`` and becomes the reaper, the child (pid 1 in the namespace) returns the
    read end of a pipe that tells whether the reaper lives (for :func:`_die_with_reaper`).

    Returns None, without forking, when the fork is refused (e.g. RLIMIT_NPROC of a busy non-root user).
    """
    alive_r, alive_w = os.pipe()
    try:
        child = os.fork()
    except OSError:
        os.close(alive_r)
        os.close(alive_w)
        return None
    if child:
        os.close(alive_r)
        os.close(report_fd)
        _become_reaper_of(child, alive_w)
    os.close(alive_w)
    return alive_r


def _die_with_reaper(alive_r: int) -> None:
    """Arm the death signal (a change of ids clears it, so this comes after the last one), then make sure the
    reaper did not die before."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.set_blocking(alive_r, False)
    try:
        if os.read(alive_r, 1) == b"":
            os._exit(137)
    except BlockingIOError:
        pass
    os.close(alive_r)


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


def drop_ids(host_id: int) -> bool:
    """As root, become ``host_id`` (uid and gid, no supplementary groups; capabilities go with uid 0). Whether the
    process now runs as a uid other than root."""
    if os.geteuid() != 0:
        return True
    try:
        os.setgroups([])
        os.setresgid(host_id, host_id, host_id)
        os.setresuid(host_id, host_id, host_id)
    except OSError:
        return False
    return os.geteuid() != 0


def isolate(work: str, work_bytes: int, host_id: int, report_fd: int) -> list[str]:
    """Apply the namespace layers the kernel allows and end as an unprivileged uid; return the layers' names."""
    os.chdir(work)  # while the path can still be walked; the tmpfs, where there is one, is entered below
    base = CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS | CLONE_NEWPID
    as_root = os.geteuid() == 0 and _ok(_libc.unshare(base))  # needs CAP_SYS_ADMIN; ids dropped after the mounts
    flags, owner, unprivileged = base, host_id, False
    if not as_root:  # a user namespace of the unprivileged ids, where the kernel allows one
        unprivileged, uid, gid = drop_ids(host_id), os.geteuid(), os.getegid()
        flags = _unshare_first([CLONE_NEWUSER | base, base, CLONE_NEWUSER | CLONE_NEWNET, CLONE_NEWNET])
        owner = SANDBOX_ID if flags & CLONE_NEWUSER else uid
        if flags & CLONE_NEWUSER and not _map_own_ids(SANDBOX_ID, uid, gid):
            flags &= ~CLONE_NEWNS  # without a mapping the tmpfs working directory would be unusable
    names = {CLONE_NEWUSER: "user_ns", CLONE_NEWNET: "net_ns", CLONE_NEWIPC: "ipc_ns"}
    applied = [name for bit, name in names.items() if flags & bit]
    if flags & CLONE_NEWNS and _readonly_root_with_tmpfs_work(work, work_bytes, owner):
        applied += ["readonly_fs", "tmpfs_workdir"]
        if as_root and not reveal_interpreter(sys.path):
            as_root = False  # keep root rather than break imports (reported: no "unprivileged_uid")
    alive = _fork_into_pid_namespace(report_fd) if flags & CLONE_NEWPID else None
    if alive is not None:
        applied.append("pid_ns")
        if flags & CLONE_NEWNS and _ok(_libc.mount(b"proc", b"/proc", b"proc",
                                                   MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)):
            applied.append("private_proc")
    if as_root:
        unprivileged = drop_ids(host_id)
    if unprivileged:
        applied.append("unprivileged_uid")
    if flags & CLONE_NEWNS and _ok(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)):
        applied += ["locked_mounts"] if flags & CLONE_NEWUSER else ["user_ns", "locked_mounts"]
    if alive is not None:
        _die_with_reaper(alive)
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


def report_and_close(fd: int, applied: list[str]) -> None:
    """The one line of the report, then the descriptor is closed: nothing the program does can reach it."""
    try:
        os.write(fd, (json.dumps({"isolation": applied}) + "\n").encode())
    except OSError:
        pass
    os.close(fd)


def take_program() -> str:
    """The program, read from stdin (an unnamed file of the parent's); stdin then becomes /dev/null."""
    source = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return source


def _finish(code: int, message: str, sink: CappedSink) -> None:
    """Exit with ``code``; when the output was cut, an error's ``message`` still ends it (RLIMIT_FSIZE leaves room)."""
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - the program may have broken its own streams
        pass
    if code and sink.left <= 0:
        try:
            os.write(1, f"\n{message[-2000:]}\n".encode(errors="backslashreplace"))
        except OSError:
            pass
    os._exit(code)


def _print_user_traceback(exc: BaseException) -> None:
    """The innermost frames of the traceback, without the bootstrap's (its runner and its audit hook)."""
    innermost = traceback.extract_tb(exc.__traceback__, limit=-TRACEBACK_FRAMES)
    frames = [f for f in innermost if f.filename != __file__]
    if frames:
        print("Traceback (most recent call last):", file=sys.stderr)
        print("".join(traceback.format_list(frames)), end="", file=sys.stderr)
    print("".join(traceback.format_exception_only(type(exc), exc)), end="", file=sys.stderr)


def run_program(source: str, sink: CappedSink) -> None:
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
        _finish(code, message, sink)
    except MemoryError:
        _finish(EXIT_MEMORY, "the program ran out of memory", sink)
    except Forbidden as exc:
        _print_user_traceback(exc)
        _finish(EXIT_FORBIDDEN, str(exc), sink)
    except BaseException as exc:  # noqa: BLE001 - any error of the program is its result
        _print_user_traceback(exc)
        _finish(1, "".join(traceback.format_exception_only(type(exc), exc)).strip(), sink)
    _finish(0, "", sink)


def _on_cpu_limit(sink: CappedSink):
    def handler(signum, frame):  # pid 1 of a namespace ignores SIGXCPU unless it has a handler
        _finish(EXIT_CPU, "CPU time limit reached", sink)

    return handler


def without_site(site_packages: list[str]) -> None:
    """What the ``site`` module gives a program that we keep, the child being started without it (-S): the
    interpreter's site-packages on the path, and ``exit``, ``quit`` and ``help``."""
    import builtins

    import _sitebuiltins

    sys.path.extend(path for path in site_packages if path not in sys.path)
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    builtins.help = _sitebuiltins._Helper()


def main() -> None:
    settings = json.loads(sys.argv[1])
    without_site(settings.get("site_packages", []))
    report_fd = int(settings["report_fd"])
    source = take_program()
    work = os.path.realpath(settings["work"])
    set_limits(settings)
    applied = isolate(work, int(settings["work_bytes"]), int(settings["host_id"]), report_fd)
    if drop_capabilities():
        applied.append("no_capabilities")
    if install_seccomp():
        applied.append("seccomp")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full output file drops output, it does not kill
    sink = capture_output(int(settings["output_bytes"]))
    signal.signal(signal.SIGXCPU, _on_cpu_limit(sink))
    if settings.get("audit_hook", True):  # tests turn it off to check the kernel layers on their own
        sys.addaudithook(make_audit_hook(work))
        applied.append("audit_hook")
    report_and_close(report_fd, applied)
    run_program(source, sink)


if __name__ == "__main__":
    main()
