"""Run untrusted code (model output) in a separate, locked-down process.

Used to score ``rg:`` tasks, whose reasoning-gym scorers ``eval`` the model's
answer (:mod:`grpolab.sandbox.gym`), and meant for any tool that runs
model-written code. A leaf package: it imports nothing else from grpolab, and
its worker process imports only this package (not ``grpolab/__init__``, which
loads torch), so it starts in well under a second and stays small. A function
sent to a child must be importable by name; one in grpolab belongs in this
package (its modules import no other part of grpolab).

    box = Sandbox(limits=Limits(cpu_s=5, memory_mb=1024, wall_s=10))
    r = box.run_python("print(6 * 7)")            # SandboxResult(ok=True, stdout='42\\n', ...)
    r = box.call(some_module.score, "answer", {...})  # value: the JSON-able return value
    rs = box.map(some_module.score, [(a, e) for ...])  # one child per item, one round trip
    box.close()

How it works. ``Sandbox`` starts one worker process (a fork server running
only grpolab's own, trusted code, with a minimal environment; it never runs a
request itself). Before it reads any request it enters new network, mount and
PID namespaces (:mod:`grpolab.sandbox.jail`), builds the jail's read-only view
and runs the ``preload`` calls (e.g. building the datasets a scorer needs, so
children start warm). For each call it forks a fresh child, which

* is process 1 of a PID namespace of its own (killed with everything it started
  when the call ends or times out), gets mount and IPC namespaces of its own and
  pivots into the view: a minimal read-only root with a scratch directory (its
  working directory: a fresh tmpfs of ``tmp_mb``, gone with the call), no host
  path it does not need, no network;
* joins a memory cgroup of its own limited to ``memory_mb`` where the worker can
  make one (:class:`jail.MemoryCgroup`), so shared memory and files count too;
* drops every capability and loads a seccomp filter that refuses new
  processes, exec, sockets, ptrace, mounts, namespaces, keyrings, bpf, ...;
* has a minimal environment and no file descriptor but its stdout, stderr and
  result pipe;
* is limited by ``RLIMIT_CPU`` (``cpu_s``), ``RLIMIT_AS`` (``memory_mb`` of
  address space) and ``RLIMIT_FSIZE``, and killed after ``wall_s`` seconds;
* may write files only inside its scratch directory (Linux Landlock, where the
  kernel has it);
* runs the function; its stdout/stderr are captured (``max_output`` bytes each).

Every call runs in a fresh child, so nothing one call does to its process
(monkey-patching the scorer, say) reaches the next call. Results come back as
JSON only: nothing a child sends is ever unpickled, so a child that is taken
over cannot run code in the worker or in the training process, and what it
sends is checked strictly (:func:`parse_result`: size, depth, keys, types). A
timeout, a crash, a limit hit or a malformed result is a ``SandboxResult`` with
``ok=False`` and ``error`` saying which, never an exception in the caller; a
request the worker received is never run twice.

What the kernel allowed is in ``Sandbox.isolation`` (:func:`capabilities`):
``view`` (``"jail"`` or ``"host"``), ``processes`` (``"pidns"`` or
``"session"``), ``network`` (``"netns"``, ``"landlock-tcp"`` or
``"audit-hook"``), ``seccomp`` (``"filter"`` or ``"none"``), ``filesystem``
(``"landlock"`` or ``"audit-hook"``), ``environment`` (``"minimal"``) and a
``note`` where a layer is missing. The namespaces need root or unprivileged
user namespaces; docs/safety.md says what holds without them.

An audit hook (``sys.addaudithook``, installed in every child as a last layer)
refuses ``socket.*``, ``open`` for writing outside the scratch directory,
``os.remove``/``rename``/``mkdir``/..., ``os.system``, ``subprocess.Popen``,
``os.exec*``/``posix_spawn``/``fork`` and ``ctypes`` with a readable message.
It is not what contains hostile code: tests/test_sandbox_jail.py runs a corpus
of hostile programs with it on and off.
"""
from __future__ import annotations

import ctypes
import json
import os
import pickle
import platform
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from . import jail

# ----------------------------------------------------------------- results


@dataclass
class Limits:
    """Per-call limits of a sandboxed child."""
    cpu_s: float = 10.0          # CPU seconds (RLIMIT_CPU)
    memory_mb: int = 2048        # MiB: address space (RLIMIT_AS) and, with a memory cgroup, all the call holds
    wall_s: float = 20.0         # wall-clock seconds before the child is killed
    file_mb: int = 64            # largest file the child may write (RLIMIT_FSIZE)
    tmp_mb: int = 256            # size of the call's own scratch folder (a fresh tmpfs per call, in the jail)
    max_output: int = 65536      # bytes of stdout / stderr kept


@dataclass
class SandboxResult:
    ok: bool
    value: Any = None             # the function's return value (JSON round-trip)
    error: str | None = None      # why it failed: "timeout: ...", "crashed: ...", "raised ValueError: ..."
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    seconds: float = 0.0


@dataclass
class _Isolation:
    network: str = "audit-hook"
    filesystem: str = "audit-hook"
    signals: str = "unrestricted"
    view: str = "host"              # "jail": the child sees only a minimal read-only view (jail.View)
    processes: str = "session"      # "pidns": a PID namespace per call; nothing outlives the call
    seccomp: str = "none"           # "filter": jail.seccomp_program is loaded in every child
    environment: str = "minimal"    # the worker starts with a minimal environment (no variables of the trainer)
    memory: str = "address-space"   # "cgroup-v1" / "cgroup-v2": a memory cgroup per call counts all it holds
    ipc: str = "seccomp"            # "ipcns": System V / POSIX IPC namespace per call (besides the filter)
    note: str = ""                  # why a layer is missing, where the kernel said so

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "note" or v}


# ------------------------------------------------------- kernel mechanisms
_PR_SET_NO_NEW_PRIVS = 38
_SYS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # landlock_create_ruleset / add_rule / restrict_self
# Landlock filesystem rights (ABI 1..): execute 1, write_file 2, read_file 4, read_dir 8, remove_dir 16,
# remove_file 32, make_char 64, make_dir 128, make_reg 256, make_sock 512, make_fifo 1024, make_block 2048,
# make_sym 4096, refer 8192 (ABI 2), truncate 16384 (ABI 3), ioctl_dev 32768 (ABI 5)
_LL_WRITE = {1: 2 | 16 | 32 | 64 | 128 | 256 | 512 | 1024 | 2048 | 4096}
_LL_WRITE[2] = _LL_WRITE[1] | 8192
_LL_WRITE[3] = _LL_WRITE[2] | 16384
_LL_WRITE[5] = _LL_WRITE[3] | 32768
_LL_NET_TCP = 1 | 2              # bind_tcp, connect_tcp (ABI 4)
_LL_SCOPE = 1 | 2                # abstract unix socket, signal (ABI 6)


def _landlock_abi(libc) -> int:
    nums = _SYS.get(platform.machine())
    if libc is None or nums is None or sys.platform != "linux":
        return 0
    abi = libc.syscall(nums[0], None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    return max(int(abi), 0)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _landlock_restrict(libc, abi: int, writable: list[str], block_tcp: bool) -> bool:
    """Allow writes only beneath ``writable``; refuse TCP when ``block_tcp`` (ABI >= 4); scope signals (>= 6)."""
    if abi < 1:
        return False
    create, add_rule, restrict = _SYS[platform.machine()]
    write = _LL_WRITE[max(k for k in _LL_WRITE if k <= abi)]
    attr = _RulesetAttr(write, _LL_NET_TCP if (block_tcp and abi >= 4) else 0, _LL_SCOPE if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    fd = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return False
    try:
        for path in writable:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(write, pfd)
                if libc.syscall(add_rule, ctypes.c_int(fd), ctypes.c_int(1), ctypes.byref(rule),
                                ctypes.c_uint32(0)) != 0:
                    return False
            finally:
                os.close(pfd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return libc.syscall(restrict, ctypes.c_int(fd), ctypes.c_uint32(0)) == 0
    finally:
        os.close(fd)


# -------------------------------------------------------------- audit hook
_BLOCKED_EVENTS = ("socket.", "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "ctypes.", "os.remove", "os.unlink", "os.rmdir", "os.rename", "os.replace",
                   "os.mkdir", "os.symlink", "os.link", "os.truncate", "os.chmod", "os.chown", "os.utime",
                   "shutil.", "os.kill", "os.killpg", "signal.pthread_kill", "sys.addaudithook",
                   "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod", "pty.")


def _install_audit_hook(scratch: str) -> None:
    scratch = os.path.realpath(scratch) + os.sep

    def inside(path) -> bool:
        try:
            p = os.fsdecode(path) if not isinstance(path, int) else None
        except TypeError:
            return False
        return p is not None and os.path.realpath(p).startswith(scratch)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                      (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
            if writing and not isinstance(path, int) and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed (only the scratch directory)")
            return
        if event.startswith(_BLOCKED_EVENTS):
            if event in ("os.remove", "os.unlink", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod",
                         "os.utime") and args and inside(args[0]):
                return
            if event in ("os.rename", "os.replace") and len(args) > 1 and inside(args[0]) and inside(args[1]):
                return
            raise PermissionError(f"sandbox: '{event}' is not allowed")

    sys.addaudithook(hook)


# ------------------------------------------------------------------ child
def _exec_source(source: str) -> None:
    """Run Python source as ``__main__`` (what :meth:`Sandbox.run_python` sends)."""
    exec(compile(source, "<sandbox>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})


def _keep_only(keep: set[int]) -> None:
    """Close every file descriptor above 2 except ``keep`` (the worker's protocol pipes above all)."""
    lo = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, 1 << 20)


_MIN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# variables the worker keeps from the trainer: OpenBLAS's core type (older builds compute wrong results on
# some CPUs without it) and the time zone; nothing that could hold a secret
_PASS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TZ")


def _child(req: dict, scratch: str, out_fd: int, err_fd: int, res_fd: int, view, lib, cgroup_fd: int = -1):
    """In the forked child (PID 1 of the call's own PID namespace when jailed): join the call's memory cgroup,
    enter the view, lock down, run, write the JSON result to ``res_fd``; never returns."""
    code = 0
    try:
        if cgroup_fd >= 0:
            jail.MemoryCgroup.join(cgroup_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        _keep_only({res_fd})
        sys.stdin = open(0, closefd=False)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        iso: _Isolation = req["isolation"]
        lim: Limits = req["limits"]
        if view is not None:  # mounts and System V / POSIX IPC of its own: nothing of an earlier call is there
            if lib.unshare(jail.CLONE_NEWNS | jail.CLONE_NEWIPC) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS | CLONE_NEWIPC)")
            view.enter(lim.tmp_mb)
            scratch = jail.SCRATCH
        else:
            os.setsid()  # without a mount namespace: the call's processes are (also) killed as its session
            if req["pidns"]:
                lib.unshare(jail.CLONE_NEWIPC)  # best effort: the seccomp filter refuses IPC calls anyway
            os.chdir(scratch)
        os.environ.clear()
        os.environ.update({**_MIN_ENV, "HOME": scratch, "TMPDIR": scratch})
        tempfile.tempdir = scratch
        import resource
        if lim.cpu_s > 0:
            cpu = max(1, int(lim.cpu_s + 0.999))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        if lim.memory_mb > 0:
            resource.setrlimit(resource.RLIMIT_AS, (lim.memory_mb << 20, lim.memory_mb << 20))
        if lim.file_mb > 0:
            resource.setrlimit(resource.RLIMIT_FSIZE, (lim.file_mb << 20, lim.file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        if iso.filesystem == "landlock" and not _landlock_restrict(lib, req["landlock_abi"], [scratch],
                                                                   block_tcp=iso.network != "netns"):
            raise RuntimeError("sandbox: Landlock restriction failed in the child")
        jail.drop_capabilities(lib)
        if iso.seccomp == "filter" and not (jail.no_new_privs(lib) and jail.install_seccomp(lib)):
            raise RuntimeError("sandbox: the seccomp filter failed to load in the child")
        if req.get("audit_hook", True):
            _install_audit_hook(scratch)
        fn, args, kwargs = req["fn"], req.get("args", ()), req.get("kwargs", {})
        try:
            value = fn(*args, **kwargs)
            payload = {"ok": True, "value": value}
        except BaseException as e:  # noqa: BLE001 - the child reports everything
            payload = {"ok": False, "error": f"raised {type(e).__name__}: {e}"[:2000]}
        try:
            data = json.dumps(payload, allow_nan=True).encode()
        except (TypeError, ValueError) as e:
            data = json.dumps({"ok": False, "error": f"result is not JSON-serialisable ({e})"}).encode()
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(res_fd, data)
    except BaseException as e:  # noqa: BLE001
        code = 3
        try:
            os.write(2, f"sandbox child setup failed: {type(e).__name__}: {e}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(code)


# ----------------------------------------------------------------- worker
def _read_msg(fh) -> bytes | None:
    head = fh.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return fh.read(n)


def _write_msg(fh, data: bytes) -> None:
    fh.write(struct.pack("<Q", len(data)) + data)
    fh.flush()


def _tail(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return ""
    text = data[:limit].decode("utf-8", "replace")
    return text + ("\n[output truncated]" if len(data) > limit else "")


def _fork_call(pidns: bool, lib, pidns_fd: int) -> int:
    """``os.fork()``; with ``pidns``, the child is PID 1 of a new PID namespace (unshare, fork, then back)."""
    if not pidns:
        return os.fork()
    if lib.unshare(jail.CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: unshare(CLONE_NEWPID) for a call")
    pid = os.fork()
    if pid != 0 and lib.setns(pidns_fd, jail.CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: setns back to the worker's PID namespace")
    return pid


#: what a child may send back: at most this many bytes of JSON, nested at most this deep
MAX_RESULT_BYTES = 32 << 20
MAX_RESULT_DEPTH = 64
_RESULT_KEYS = frozenset(("ok", "value", "error"))


def _too_deep(value, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            if d > limit:
                return True
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def parse_result(data: bytes) -> dict:
    """What a child wrote to its result pipe, checked strictly: ``{"ok": bool, "value": ..., "error": str|None}``
    or, for anything else (not JSON, too large, too deep, another shape), an error result saying what was wrong.
    The child is hostile: nothing it sends may raise here or reach the caller unchecked."""
    def bad(why):
        return {"ok": False, "value": None, "error": f"child sent a malformed result: {why}"}
    if len(data) > MAX_RESULT_BYTES:
        return bad(f"more than {MAX_RESULT_BYTES >> 20} MiB")
    try:
        obj = json.loads(data)
    except RecursionError:
        return bad(f"nested deeper than {MAX_RESULT_DEPTH} levels")
    except ValueError as e:  # UnicodeDecodeError and json.JSONDecodeError included
        return bad(f"not JSON ({str(e)[:100]})")
    if not isinstance(obj, dict):
        return bad(f"a JSON {type(obj).__name__}, not an object")
    if set(obj) - _RESULT_KEYS or "ok" not in obj:
        return bad(f"keys {sorted(obj)[:8]}, expected 'ok' with 'value' or 'error'")
    ok, value, error = obj["ok"], obj.get("value"), obj.get("error")
    if not isinstance(ok, bool):
        return bad(f"'ok' is {type(ok).__name__}, not a boolean")
    if ok and error is not None or not ok and (not isinstance(error, str) or value is not None):
        return bad("'ok' does not agree with 'value' / 'error'")
    if _too_deep(value, MAX_RESULT_DEPTH):
        return bad(f"nested deeper than {MAX_RESULT_DEPTH} levels")
    return {"ok": ok, "value": value, "error": error[:2000] if isinstance(error, str) else None}


def _run_one(req: dict, base: str, view, lib, pidns_fd: int, cgroup) -> dict:
    lim: Limits = req["limits"]
    # jailed, the scratch folder is a fresh tmpfs the child mounts in its own mount namespace (View.enter)
    scratch = jail.SCRATCH if view is not None else tempfile.mkdtemp(prefix="call-", dir=base)
    io_dir = tempfile.mkdtemp(prefix="io-", dir=base)
    out_path, err_path = os.path.join(io_dir, "stdout"), os.path.join(io_dir, "stderr")
    out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT, 0o600)
    err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT, 0o600)
    group = cgroup.prepare(lim.memory_mb) if cgroup is not None and lim.memory_mb > 0 else None
    group_fd = jail.MemoryCgroup.join_fd(group) if group is not None else -1
    r_fd, w_fd = os.pipe()
    t0 = time.monotonic()
    pid = _fork_call(pidns_fd >= 0, lib, pidns_fd)
    if pid == 0:
        os.close(r_fd)
        _child(req, scratch, out_fd, err_fd, w_fd, view, lib, group_fd)
    for fd in (w_fd, out_fd, err_fd) + ((group_fd,) if group_fd >= 0 else ()):
        os.close(fd)
    chunks, status, usage, timed_out = _collect(pid, r_fd, t0 + (lim.wall_s if lim.wall_s > 0 else 1e9), pidns_fd)
    _reap()
    out_of_memory = cgroup.finish(group) if group is not None else False
    seconds = time.monotonic() - t0
    res = {"stdout": _tail(out_path, lim.max_output), "stderr": _tail(err_path, lim.max_output),
           "timed_out": timed_out, "seconds": seconds}
    if view is None:
        shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(io_dir, ignore_errors=True)
    return _outcome(res, lim, timed_out, out_of_memory, chunks, status, usage)


def _collect(pid: int, r_fd: int, deadline: float, pidns_fd: int) -> tuple[list[bytes], int, object, bool]:
    """Read the call's result pipe ``r_fd`` until the call ``pid`` exits or ``deadline`` (monotonic) passes, then
    kill what is left of it and close the pipe: ``(result chunks, wait status, rusage, timed out)``. The chunks
    stop at the first byte past ``MAX_RESULT_BYTES`` (:func:`parse_result` refuses the oversized result)."""
    chunks, size, status, usage, timed_out = [], 0, None, None, False
    open_pipe = True
    while True:
        if open_pipe:
            ready, _, _ = select.select([r_fd], [], [], max(0.0, min(0.05, deadline - time.monotonic())))
            if ready:
                chunk = os.read(r_fd, 1 << 16)
                if chunk:
                    if size <= MAX_RESULT_BYTES:  # keep up to the first byte past the limit
                        chunks.append(chunk)
                    size += len(chunk)
                else:
                    open_pipe = False
        else:
            time.sleep(0.001)
        done, st, ru = os.wait4(pid, os.WNOHANG)
        if done:
            status, usage = st, ru
            break
        if time.monotonic() > deadline:
            timed_out = True
            break
    try:  # in a PID namespace: killing the call's init ends its whole namespace; else the call's session
        (os.kill if pidns_fd >= 0 else os.killpg)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if status is None:
        _, status, usage = os.wait4(pid, 0)
    os.set_blocking(r_fd, False)  # what is left; a process that escaped the kill cannot make us wait
    while open_pipe and not timed_out and size <= MAX_RESULT_BYTES:
        try:
            chunk = os.read(r_fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        size += len(chunk)
        chunks.append(chunk)
    os.close(r_fd)
    return chunks, status, usage, timed_out


def _outcome(res: dict, lim: Limits, timed_out: bool, out_of_memory: bool, chunks: list[bytes], status: int,
             usage) -> dict:
    """The call's answer: ``res`` (its output tails, ``timed_out``, ``seconds``) with ``ok`` and the result, or
    the error that names the limit it hit (wall time, memory, CPU time, file size, a forbidden system call) or
    how it ended without a result."""
    if timed_out:
        return {**res, "ok": False, "error": f"timeout: still running after {lim.wall_s:g} s (wall_s)"}
    if out_of_memory:
        return {**res, "ok": False, "error": f"crashed: memory limit of {lim.memory_mb} MiB (memory_mb)"}
    if chunks:
        return {**res, **parse_result(b"".join(chunks))}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        cpu = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
        if sig in (signal.SIGXCPU, signal.SIGKILL) and lim.cpu_s > 0 and cpu >= 0.9 * max(1, int(lim.cpu_s + 0.999)):
            why = f"CPU limit of {lim.cpu_s:g} s (cpu_s)"  # the init of a PID namespace gets the hard limit's kill
        else:
            why = {signal.SIGKILL: "killed", signal.SIGXFSZ: f"file size limit of {lim.file_mb} MiB (file_mb)",
                   signal.SIGSYS: "a system call the sandbox forbids"}.get(sig, signal.Signals(sig).name)
        return {**res, "ok": False, "error": f"crashed: {why}"}
    code = os.WEXITSTATUS(status)
    hint = " (memory limit?)" if "MemoryError" in res["stderr"] else ""
    return {**res, "ok": False, "error": f"crashed: exit status {code} without a result{hint}"}


def _reap() -> None:
    """Wait for any orphan handed to the worker (it is the init of its PID namespace)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _become_init() -> None:
    """After ``unshare(CLONE_NEWPID)``: fork the worker proper as PID 1 of the new namespace; this process
    only waits for it and exits with its status (the trainer's handle and process group stay the same)."""
    pid = os.fork()
    if pid == 0:
        return
    _keep_only(set())
    for fd in (0, 1):
        os.close(fd)
    while True:
        try:
            _, st = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(st) & 0xFF if os.WIFEXITED(st) else 1)


def _worker_main() -> None:
    """The fork server: reads pickled requests from the trusted parent, answers JSON."""
    lib = jail.libc()
    iso = _Isolation()
    ns = jail.enter_worker_namespaces(lib)
    if ns["pid"]:
        _become_init()
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # a call's processes must never reach the protocol pipes
    os.close(null)
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    sys.stdout = sys.stderr
    if ns["network"]:
        iso.network = "netns"
    abi = _landlock_abi(lib)
    if os.environ.get("GRPOLAB_SANDBOX_LANDLOCK_ABI", "").isdigit():  # tests: a kernel with an older Landlock
        abi = min(abi, int(os.environ["GRPOLAB_SANDBOX_LANDLOCK_ABI"]))
    if abi >= 1:
        iso.filesystem = "landlock"
        if iso.network != "netns" and abi >= 4:
            iso.network = "landlock-tcp"
        if abi >= 6:
            iso.signals = "landlock-scoped"
    if jail.seccomp_supported() and lib is not None:
        iso.seccomp = "filter"
        jail._compiled_filter()  # once here, not in every child
    notes = []
    cgroup = None
    if os.environ.get("GRPOLAB_SANDBOX_NO_CGROUP") != "1":  # tests: a machine without a writable memory cgroup
        try:
            cgroup = jail.MemoryCgroup.create()
            iso.memory = f"cgroup-v{cgroup.version}"
        except OSError as e:
            notes.append(f"memory: address space only, no memory cgroup ({e.strerror or e})")
    base = tempfile.mkdtemp(prefix="grpolab-sandbox-")
    view, pidns_fd = None, -1
    try:
        init = pickle.loads(_read_msg(proto_in) or b"")
        sys.path[:0] = [p for p in init.get("path", []) if p not in sys.path]
        if ns["pid"]:  # every call is PID 1 of a PID namespace of its own: it cannot signal anything outside
            pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            iso.processes = iso.signals = "pidns"
        if ns["mount"] and ns["pid"]:
            try:
                view = jail.View(lib, base)
                for p in jail.default_paths(init.get("binds", []), init.get("home"), init.get("cwd")):
                    view.add(p)
                iso.view, iso.ipc = "jail", "ipcns"
            except OSError as e:
                view = None
                notes.append(f"no jail: {e}")
        else:
            notes.append("no jail: the kernel refused new mount and PID namespaces (they need root or "
                         "unprivileged user namespaces)" if not ns["pid"] else
                         "no jail: the kernel refused a new mount namespace (calls get PID namespaces only)")
        iso.note = "; ".join(notes)
        errors = []
        for fn, args in init.get("preload", []):
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - reported to the parent
                errors.append(f"{getattr(fn, '__name__', fn)}: {type(e).__name__}: {e}")
        import gc
        gc.collect()
        gc.freeze()  # fewer copy-on-write pages in every child
        _write_msg(proto_out, json.dumps({"isolation": iso.as_dict(), "preload_errors": errors,
                                          "pid": os.getpid()}).encode())
        while (raw := _read_msg(proto_in)) is not None:
            _write_msg(proto_out, _answer(pickle.loads(raw), base, view, lib, pidns_fd, cgroup, iso, abi))
    finally:
        if view is not None and lib is not None:
            lib.umount2(view.root.encode(), jail.MNT_DETACH)  # never recurse into the read-only binds
        if cgroup is not None:
            cgroup.close()
        shutil.rmtree(base, ignore_errors=True)


def _answer(req: dict, base: str, view, lib, pidns_fd: int, cgroup, iso, abi: int) -> bytes:
    """The JSON answer to one request (from the trusted parent): one result, or one per item. Never raises:
    whatever a call did, the worker answers and serves the next request (it never runs a call twice)."""
    n = len(req["items"]) if "items" in req else None
    try:
        if view is not None:
            for p in req.pop("binds", []):
                try:
                    view.add(p)
                except OSError as e:
                    print(f"sandbox: could not show {p} in the jail: {e}", file=sys.stderr)
        req = {**req, "isolation": iso, "landlock_abi": abi, "pidns": pidns_fd >= 0}
        if n is not None:
            answers = [_run_one({**req, "args": a, "kwargs": {}}, base, view, lib, pidns_fd, cgroup)
                       for a in req["items"]]
        else:
            answers = _run_one(req, base, view, lib, pidns_fd, cgroup)
        return json.dumps(answers).encode()
    except Exception as e:  # noqa: BLE001 - the worker's own failure, reported as the calls' error
        err = {"ok": False, "value": None, "error": f"sandbox worker error: {type(e).__name__}: {e}"[:2000],
               "stdout": "", "stderr": "", "timed_out": False, "seconds": 0.0}
        return json.dumps(err if n is None else [err] * n).encode()


# ------------------------------------------------------------------ parent
class SandboxError(RuntimeError):
    """The sandbox worker itself could not start."""


class Sandbox:
    """A fork-server worker process that runs calls in fresh, limited children (see the module docstring).

    ``preload``: ``[(fn, args), ...]`` run once in the worker before any request
    (trusted set-up, e.g. building datasets into a module-level cache, so the
    children need not). ``fn`` and every callable sent must be importable by
    name (module-level functions). Thread-safe; the worker starts on first use
    and is restarted if it dies.
    """

    def __init__(self, limits: Limits | None = None, preload: list[tuple[Callable, tuple]] | None = None,
                 audit_hook: bool = True, env: dict[str, str] | None = None):
        self.limits = limits or Limits()
        self.preload = list(preload or [])
        self.audit_hook = audit_hook  # False only to test the kernel layers alone
        self.env = dict(env or {})    # variables the worker and its children get besides the minimal set
        self.isolation: dict | None = None
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    # -- worker lifecycle
    def _start(self) -> None:
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = [os.path.abspath(p) for p in sys.path]  # "" = the trainer's folder, not the worker's
        # a minimal environment: none of the trainer's variables (API keys, tokens) reach model-written code
        env = {**_MIN_ENV, "HOME": tempfile.gettempdir(), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": os.pathsep.join(path),
               **{k: os.environ[k] for k in _PASS_ENV if k in os.environ}, **self.env}
        # a bare namespace for grpolab: the worker imports grpolab.sandbox without grpolab/__init__ (torch)
        boot = (f"import sys, types; p = types.ModuleType('grpolab'); p.__path__ = [{pkg!r}]; "
                f"sys.modules['grpolab'] = p; import grpolab.sandbox as s; s._worker_main()")
        self._proc = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env=env, cwd=tempfile.gettempdir(), start_new_session=True)
        binds = [pkg] + [b for fn, _ in self.preload for b in jail.module_paths(fn)]
        _write_msg(self._proc.stdin, pickle.dumps({"path": path, "preload": self.preload, "binds": binds,
                                                    "home": os.path.expanduser("~"), "cwd": os.getcwd()}))
        hello = _read_msg(self._proc.stdout)
        if hello is None:
            self._kill()
            raise SandboxError("the sandbox worker exited at start (see the messages above)")
        info = json.loads(hello)
        self.isolation = info["isolation"]
        if info["preload_errors"]:
            self._kill()
            raise SandboxError(f"sandbox preload failed: {'; '.join(info['preload_errors'])}")

    def start(self, background: bool = False) -> None:
        """Start the worker now (``background``: in a thread, e.g. while a model loads) instead of on first use."""
        def ensure():
            with self._lock:
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = None
                    try:
                        self._start()
                    except SandboxError:
                        pass  # reported again by the first call
        if background:
            threading.Thread(target=ensure, name="sandbox-start", daemon=True).start()
        else:
            ensure()

    def _kill(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                try:
                    self._proc.stdin.close()
                    self._proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
                self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self._kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _request(self, req: dict, budget: float, n: int | None = None) -> list[SandboxResult]:
        """Send ``req`` and return its results (``n`` items, or one). A request the worker received is never
        sent again: if the worker dies or hangs while running it (a call that found a way to kill it, say),
        the calls get an error result and the next request starts a fresh worker. Only a request that could
        not be delivered (the worker had died in between) is delivered once more, to a fresh worker."""
        with self._lock:
            raw, delivered, ready = None, False, []
            for _ in (0, 1):
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = None
                    self._start()
                try:
                    _write_msg(self._proc.stdin, pickle.dumps(req))
                    delivered = True
                    ready, _, _ = select.select([self._proc.stdout], [], [], budget)
                    raw = _read_msg(self._proc.stdout) if ready else None
                except (BrokenPipeError, OSError):
                    raw = None
                if raw is not None or delivered:
                    break
                self._kill()
            results = _results(raw, n)
            if results is None:
                alive = not ready and self._proc is not None and self._proc.poll() is None  # ready + no answer: EOF
                self._kill()  # replaced on the next request
                why = (f"the sandbox worker did not answer within {budget:g} s" if alive else
                       "the sandbox worker died while running this call")
                results = [SandboxResult(ok=False, error=f"crashed: {why} (a fresh worker serves the next call)")
                           for _ in range(1 if n is None else n)]
            return results

    # -- the API
    def call(self, fn: Callable, *args, limits: Limits | None = None, **kwargs) -> SandboxResult:
        """``fn(*args, **kwargs)`` in a fresh limited child; the value comes back through JSON."""
        lim = limits or self.limits
        req = {"fn": fn, "args": args, "kwargs": kwargs, "limits": lim, "audit_hook": self.audit_hook,
               "binds": jail.module_paths(fn)}
        return self._request(req, budget=lim.wall_s + 30)[0]

    def map(self, fn: Callable, items: list[tuple], limits: Limits | None = None) -> list[SandboxResult]:
        """``[fn(*item) for item in items]``, each in its own fresh child (limits per item), in one round trip."""
        if not items:
            return []
        lim = limits or self.limits
        return self._request({"fn": fn, "items": [tuple(a) for a in items], "limits": lim,
                              "audit_hook": self.audit_hook, "binds": jail.module_paths(fn)},
                             budget=len(items) * (lim.wall_s + 1) + 30, n=len(items))

    def run_python(self, source: str, limits: Limits | None = None) -> SandboxResult:
        """Run Python source as a script in a fresh child; read its ``stdout`` / ``stderr``."""
        return self.call(_exec_source, source, limits=limits)


def _result(d) -> SandboxResult | None:
    """One result of the worker's answer as a ``SandboxResult`` (None if it is not one)."""
    if not isinstance(d, dict) or not isinstance(d.get("ok"), bool):
        return None
    text = {k: d.get(k) if isinstance(d.get(k), str) else "" for k in ("stdout", "stderr")}
    err = d.get("error")
    secs = d.get("seconds")
    return SandboxResult(ok=d["ok"], value=d.get("value"), error=err if isinstance(err, str) else None,
                         timed_out=d.get("timed_out") is True, seconds=float(secs) if isinstance(secs, (int, float))
                         else 0.0, **text)


def _results(raw: bytes | None, n: int | None) -> list[SandboxResult] | None:
    """The worker's answer: one result (``n`` None) or ``n``; None when it is missing or not that shape."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    items = [data] if n is None else data
    if not isinstance(items, list) or len(items) != (1 if n is None else n):
        return None
    out = [_result(d) for d in items]
    return None if any(r is None for r in out) else out


def capabilities() -> dict:
    """What isolation a sandbox gets on this machine (runs a throw-away worker)."""
    with Sandbox() as box:
        box.call(_noop)
        return dict(box.isolation or {})


def _noop() -> None:
    return None
