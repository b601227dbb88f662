"""The jail around every sandbox child: Linux namespaces, a minimal read-only view, seccomp, no capabilities.

Kernel mechanisms only: nothing here depends on catching Python-level events,
so code that escapes or disables the audit hook (a fresh interpreter started
through ``_posixsubprocess``, ``ctypes`` into libc, native extensions) is held
by the same walls. Used by :mod:`grpolab.sandbox`; a leaf module (standard
library and ``ctypes`` only).

The layers, each reported by :class:`grpolab.sandbox.Sandbox` ``.isolation``:

* **view** (``"jail"``): the fork-server worker builds, once, a root of its own
  in a private mount namespace — a tmpfs holding read-only bind mounts of only
  what Python needs (``/usr``, ``/lib*``, the interpreter's prefixes, the
  ``sys.path`` entries other than the current directory and the home folder,
  grpolab's own package, the modules of the functions sent), ``/dev/{null,zero,
  full,random,urandom}``, a private ``/proc`` and a size-limited ``/tmp`` that
  holds the per-call scratch folders. Each call's child pivots into it, so the
  user's home, ``/run`` (docker.sock, D-Bus, ssh-agent sockets), ``/etc`` and
  every other host path do not exist for it.
* **processes** (``"pidns"``): each call gets its own PID namespace whose init is
  grpolab code; when the call ends or times out the init is killed and the
  kernel kills everything in the namespace, whatever ``setsid``/double-forking
  the code did. Host processes (the trainer, the worker) are invisible to it.
* **network** (``"netns"``): a new network namespace with only a downed
  loopback, created by the worker: no TCP/UDP, and no abstract Unix sockets of
  the host (they are per network namespace); pathname Unix sockets of the host
  are not in the view.
* **seccomp** (``"filter"``, x86-64): a BPF filter refuses new processes
  (``fork``/``vfork``/``clone`` other than threads; ``clone3`` answers ENOSYS so
  threads fall back to ``clone``), ``execve``/``execveat``, ``socket``, ``ptrace``
  and ``process_vm_*``, ``mount`` and the new mount API, ``pivot_root``/``chroot``,
  ``unshare``/``setns``, ``keyctl``/``add_key``/``request_key``, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, module and kexec loading,
  and the other administrative calls in :data:`DENIED`.
* **capabilities**: all dropped (effective, permitted, inheritable, bounding),
  and ``no_new_privs`` set.

Where the kernel refuses namespaces (no root and no unprivileged user
namespaces, e.g. some containers, macOS), the view and the PID namespace are
missing and ``isolation`` says so; seccomp, Landlock, limits and the audit hook
still apply where the kernel has them.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import struct
import sys
import time

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_THREAD = 0x10000000, 0x20000000, 0x40000000, 0x00010000
_NS_FLAGS = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 24, 38, 22
SECCOMP_MODE_FILTER = 2

DEV_NODES = ("null", "zero", "full", "random", "urandom")
SCRATCH = "/tmp/scratch"  # a call's scratch folder (its working directory, HOME and TMPDIR) inside the view
SCRATCH_INODES = 16384    # files and folders a call's scratch tmpfs may hold


def libc():
    try:
        lib = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    lib.syscall.restype = ctypes.c_long
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


# --------------------------------------------------------------------- namespaces of the worker
def enter_worker_namespaces(lib) -> dict:
    """Move the worker into new network, mount, PID, IPC and UTS namespaces (through a user namespace when not
    root; the PID namespace applies to the worker's children: see ``_become_init``).

    Returns ``{"network": bool, "mount": bool, "pid": bool}``: what the kernel allowed.
    """
    none = {"network": False, "mount": False, "pid": False}
    if lib is None or sys.platform != "linux":
        return none
    full = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    # where a mount namespace is refused, a PID namespace alone still keeps every call from signalling the
    # worker, the trainer or anything else outside it (the layer that holds where Landlock cannot scope signals)
    tries = (full, full & ~CLONE_NEWNS, CLONE_NEWNET)
    if os.environ.get("GRPOLAB_SANDBOX_NO_MOUNTNS") == "1":  # tests: a kernel that refuses mount namespaces
        tries = tries[1:]
    # GRPOLAB_SANDBOX_USERNS=1: take the path of a user without root (a user namespace) even as root (tests)
    for flags in (() if os.environ.get("GRPOLAB_SANDBOX_USERNS") == "1" else tries):
        if lib.unshare(flags) == 0:
            return {"network": True, "mount": bool(flags & CLONE_NEWNS), "pid": bool(flags & CLONE_NEWPID)}
    uid, gid = os.getuid(), os.getgid()
    for flags in tries:
        if lib.unshare(CLONE_NEWUSER | flags) == 0:
            try:  # keep our uid/gid inside the user namespace
                for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                                   ("gid_map", f"{gid} {gid} 1")):
                    with open(f"/proc/self/{name}", "w") as fh:
                        fh.write(text)
            except OSError:
                pass
            return {"network": True, "mount": bool(flags & CLONE_NEWNS), "pid": bool(flags & CLONE_NEWPID)}
    return none


# --------------------------------------------------------------------- the view
def _mount_flags(path: str) -> int:
    """The flags a read-only remount of a bind of ``path`` must keep (the kernel refuses to clear locked ones)."""
    f = os.statvfs(path).f_flag
    out = MS_NOSUID | MS_NODEV
    for st, ms in ((os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                   (getattr(os, "ST_RELATIME", 4096), MS_RELATIME)):
        if f & st:
            out |= ms
    return out


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class View:
    """A root folder (tmpfs, read-only) of read-only binds that each call's child pivots into.

    Nothing in it is writable by a call but the call's own scratch folder, ``/tmp/scratch`` (:data:`SCRATCH`):
    a fresh tmpfs of ``Limits.tmp_mb`` that each child mounts in its own mount namespace (:meth:`enter`), so
    no file of an earlier call is ever in view and the folder's memory is gone with the call.
    """

    def __init__(self, lib, base: str):
        self.lib = lib
        self.root = os.path.join(base, "root")
        self.bound: list[str] = []
        os.makedirs(self.root)
        _check(lib.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
        _check(lib.mount(b"tmpfs", self.root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=16m"),
               "mounting the jail's root")
        for d in ("proc", "tmp", "dev", "etc", SCRATCH.lstrip("/")):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        os.chmod(os.path.join(self.root, "tmp"), 0o755)
        for name in DEV_NODES:
            src = f"/dev/{name}"
            if os.path.exists(src):
                dst = os.path.join(self.root, "dev", name)
                open(dst, "w").close()
                _check(lib.mount(src.encode(), dst.encode(), None, MS_BIND, None), f"binding {src}")
        self._remount_root(writable=False)
        for src in ("/etc/ld.so.cache", "/etc/localtime"):
            if os.path.isfile(src):
                self.add(src)

    def add(self, path: str) -> None:
        """Make ``path`` (a file or folder of the host) visible, read-only, at the same place in the view."""
        path = os.path.abspath(path)
        real = os.path.realpath(path)
        if not os.path.exists(real) or _under(real, self.bound) or _under(real, ("/proc", "/sys", "/dev")):
            self._link(path, real)
            return
        dst = self.root + real
        self._remount_root(writable=True)
        try:
            if os.path.isdir(real):
                os.makedirs(dst, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if not os.path.exists(dst):
                    open(dst, "w").close()
        finally:
            self._remount_root(writable=False)
        _check(self.lib.mount(real.encode(), dst.encode(), None, MS_BIND | MS_REC, None), f"binding {real}")
        _check(self.lib.mount(None, dst.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY | _mount_flags(real),
                              None), f"making {real} read-only")
        self.bound.append(real)
        self._link(path, real)

    def _link(self, path: str, real: str) -> None:
        """Where ``path`` is reached through a symlink (``/lib`` -> ``usr/lib``), the same symlink in the view."""
        if path == real or _under(path, self.bound) or os.path.lexists(self.root + path):
            return
        parent = os.path.dirname(path)
        if not os.path.islink(path):  # a symlink higher up: mirror that one instead
            if parent != path:
                self._link(parent, os.path.realpath(parent))
            return
        self._remount_root(writable=True)
        try:
            os.makedirs(self.root + parent, exist_ok=True)
            os.symlink(os.readlink(path), self.root + path)
        except FileExistsError:
            pass
        finally:
            self._remount_root(writable=False)

    def _remount_root(self, writable: bool) -> None:
        flags = MS_REMOUNT | MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY)
        _check(self.lib.mount(None, self.root.encode(), None, flags, None), "remounting the jail's root")

    def enter(self, tmp_mb: int) -> bool:
        """In a call's child (PID 1 of its own PID namespace, in mount and IPC namespaces of its own): a fresh
        tmpfs of ``tmp_mb`` MiB on the scratch folder, a fresh read-only ``/proc``, pivot into the view,
        ``chdir`` to :data:`SCRATCH`. Returns whether ``/proc`` could be mounted (a user namespace in a
        container whose ``/proc`` is partly masked cannot)."""
        lib = self.lib
        scratch = (self.root + SCRATCH).encode()
        opts = f"mode=0700,size={max(1, int(tmp_mb))}m,nr_inodes={SCRATCH_INODES}".encode()
        _check(lib.mount(b"tmpfs", scratch, b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mounting the call's scratch")
        proc = os.path.join(self.root, "proc")
        has_proc = lib.mount(b"proc", proc.encode(), b"proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                             None) == 0
        os.chdir(self.root)
        _check(lib.syscall(_NR["pivot_root"], b".", b"."), "pivot_root")
        _check(lib.umount2(b".", MNT_DETACH), "detaching the host's root")
        os.chdir("/")
        os.chdir(SCRATCH)
        return has_proc


def default_paths(extra=(), home: str | None = None, cwd: str | None = None) -> list[str]:
    """What the view shows read-only: system libraries, the interpreter's prefixes, ``sys.path`` entries other
    than the current folder ``cwd`` and the home folder ``home`` (or one above them; the trainer's, by default
    this process's), grpolab's package, and ``extra``."""
    home = os.path.realpath(home or os.path.expanduser("~"))
    cwd = os.path.realpath(cwd or os.getcwd())
    keep = []
    for p in ["/usr", "/lib", "/lib64", "/lib32", "/bin", sys.prefix, sys.base_prefix, sys.exec_prefix,
              sys.base_exec_prefix, *sys.path, *extra]:
        if not p or not os.path.isabs(p) or not os.path.exists(p):
            continue
        real = os.path.realpath(p)
        if real == "/" or real == cwd or (home != "/" and (real == home or home.startswith(real + "/"))):
            continue
        if cwd.startswith(real + "/"):
            continue  # a folder above the current one would show the user's project and data
        keep.append(p)
    return keep


def module_paths(fn) -> list[str]:
    """The file or package folder a worker needs to import ``fn`` by name (its top-level module)."""
    mod = sys.modules.get(getattr(fn, "__module__", None) or "")
    if mod is None:
        return []
    top = sys.modules.get(mod.__name__.split(".")[0], mod)
    if getattr(top, "__path__", None):
        return [p for p in top.__path__ if os.path.isdir(p)]
    f = getattr(top, "__file__", None)
    return [f] if f and os.path.exists(f) else []


# --------------------------------------------------------------------- memory of a call
class MemoryCgroup:
    """A memory cgroup for each call, so ``Limits.memory_mb`` counts everything a call holds.

    ``RLIMIT_AS`` counts address space only: memory that is not mapped (files in a tmpfs, a memory file
    written with ``write``, System V segments detached after use) escapes it. A cgroup counts every page
    charged to the call (anonymous, shared, tmpfs, kernel buffers). The worker makes one folder of its own
    below its cgroup (``grpolab-sandbox-RANDOM``) and, per call, a child folder with ``memory_mb`` as its limit
    and no swap; the call's child moves itself in before it runs anything (:meth:`join`); when the call has
    ended the folder is read (was the call killed for memory?) and removed. cgroup v2 where the memory
    controller is delegated to this process's cgroup, else cgroup v1's memory hierarchy where writable
    (root); :meth:`create` raises ``OSError`` saying why where neither is.
    """

    def __init__(self, parent: str, version: int):
        self.parent, self.version, self._n = parent, version, 0

    @classmethod
    def create(cls) -> "MemoryCgroup":
        mounts, mine = _cgroup_mounts(), _own_cgroups()
        errors = []
        for version, key in ((2, ""), (1, "memory")):
            if key not in mine or version not in mounts or (version == 1 and "memory" not in mounts[1]):
                errors.append(f"no cgroup v{version} memory hierarchy")
                continue
            mount, root = mounts[version] if version == 2 else mounts[1]["memory"]
            rel = mine[key]
            here = os.path.join(mount, os.path.relpath(rel, root) if rel.startswith(root) else rel.lstrip("/"))
            try:
                if version == 2:
                    with open(os.path.join(here, "cgroup.controllers")) as fh:
                        if "memory" not in fh.read().split():
                            raise OSError(errno.ENOTSUP, "the memory controller is not delegated here")
                # a name of its own: the worker is PID 1 of its namespace, so its pid names nothing
                parent = os.path.join(here, f"grpolab-sandbox-{os.urandom(6).hex()}")
                os.mkdir(parent)
                if version == 2:
                    _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
                return cls(parent, version)
            except OSError as e:
                errors.append(f"cgroup v{version} at {here}: {e.strerror or e}")
        raise OSError(errno.ENOTSUP, "; ".join(errors))

    def prepare(self, memory_mb: int) -> str:
        """A fresh folder for one call, limited to ``memory_mb`` MiB (no swap); returns its path."""
        self._n += 1
        path = os.path.join(self.parent, f"call-{self._n}")
        os.mkdir(path)
        limit = str(int(memory_mb) << 20)
        if self.version == 2:
            _write(os.path.join(path, "memory.max"), limit)
            _write(os.path.join(path, "memory.swap.max"), "0", missing_ok=True)
        else:
            _write(os.path.join(path, "memory.limit_in_bytes"), limit)
            _write(os.path.join(path, "memory.memsw.limit_in_bytes"), limit, missing_ok=True)
        return path

    @staticmethod
    def join_fd(path: str) -> int:
        """An fd the call's child writes ``0`` to (:meth:`join`) to move itself into ``path``."""
        return os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    @staticmethod
    def join(fd: int) -> None:
        os.write(fd, b"0")
        os.close(fd)

    def finish(self, path: str) -> bool:
        """After the call: remove its folder; True when the kernel killed a process of it for memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        killed = False
        try:
            with open(os.path.join(path, name)) as fh:
                killed = any(line.split()[:1] == ["oom_kill"] and int(line.split()[1]) > 0 for line in fh)
        except (OSError, ValueError, IndexError):
            pass
        for _ in range(200):  # the PID namespace's last processes may still be exiting
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.005)
        return killed

    def close(self) -> None:
        for name in sorted(os.listdir(self.parent)) if os.path.isdir(self.parent) else []:
            if name.startswith("call-"):
                self.finish(os.path.join(self.parent, name))
        try:
            os.rmdir(self.parent)
        except OSError:
            pass


def _write(path: str, text: str, missing_ok: bool = False) -> None:
    try:
        with open(path, "w") as fh:
            fh.write(text)
    except FileNotFoundError:
        if not missing_ok:
            raise


def _cgroup_mounts() -> dict:
    """``{2: (mountpoint, root), 1: {controller: (mountpoint, root)}}`` from ``/proc/self/mountinfo``."""
    out: dict = {1: {}}
    try:
        with open("/proc/self/mountinfo") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) < 5 or len(r) < 3:
            continue
        if r[0] == "cgroup2":
            out.setdefault(2, (f[4], f[3]))
        elif r[0] == "cgroup":
            for opt in r[2].split(","):
                out[1].setdefault(opt, (f[4], f[3]))
    return out


def _own_cgroups() -> dict:
    """This process's cgroup per v1 controller, and ``""`` for v2 (``/proc/self/cgroup``)."""
    out = {}
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                _, ctrl, path = line.rstrip("\n").split(":", 2)
                for c in (ctrl.split(",") if ctrl else [""]):
                    out[c] = path
    except (OSError, ValueError):
        pass
    return out


# --------------------------------------------------------------------- the child's own locks
def drop_capabilities(lib) -> bool:
    """Empty the bounding, effective, permitted and inheritable capability sets."""
    if lib is None or sys.platform != "linux":
        return False
    for cap in range(64):
        if lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    header = struct.pack("<Ii", 0x20080522, 0)        # _LINUX_CAPABILITY_VERSION_3, this process
    data = ctypes.create_string_buffer(24)             # two {effective, permitted, inheritable}, all zero
    return lib.syscall(_NR["capset"], ctypes.c_char_p(header), data) == 0


def no_new_privs(lib) -> bool:
    return lib is not None and lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0


# --------------------------------------------------------------------- seccomp
# the two calls the jail itself makes, per architecture (asm/unistd_64.h, asm-generic/unistd.h)
_NR = {"x86_64": {"pivot_root": 155, "capset": 126},
       "aarch64": {"pivot_root": 41, "capset": 91}}.get(platform.machine(), {"pivot_root": -1, "capset": -1})
# x86-64 system call numbers (asm/unistd_64.h) for the filter
_X86_64 = {
    "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone": 56, "clone3": 435,
    "socket": 41, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168, "syslog": 103,
    "acct": 163, "quotactl": 179, "iopl": 172, "ioperm": 173, "sethostname": 170, "setdomainname": 171,
    "settimeofday": 164, "clock_settime": 227, "adjtimex": 159, "personality": 135, "uselib": 134,
    "modify_ldt": 154, "vhangup": 153, "lookup_dcookie": 212, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "fanotify_init": 300, "pidfd_getfd": 438,
    # memory that RLIMIT_AS does not count and that could carry data from one call to the next: anonymous
    # memory files, System V shared memory / semaphores / message queues, POSIX message queues
    "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67,
    "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70,
    "msgctl": 71, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
    "mq_notify": 244, "mq_getsetattr": 245,
}
DENIED = tuple(n for n in _X86_64 if n not in ("clone", "clone3"))
_AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def seccomp_supported() -> bool:
    return sys.platform == "linux" and platform.machine() == "x86_64"


def seccomp_program() -> list[tuple[int, int, int, int]]:
    """The filter as ``(code, jt, jf, k)`` BPF instructions (see the module docstring for what it refuses)."""
    prog: list = []   # (code, jt_label_or_0, jf_label_or_0, k); labels resolved below

    def op(code, k=0, jt=0, jf=0):
        prog.append([code, jt, jf, k])

    op(_LD_W_ABS, 4)                                     # seccomp_data.arch
    op(_JEQ, _AUDIT_ARCH_X86_64, jt=1)                   # foreign ABI (i386 through int 0x80): kill
    op(_RET, _RET_KILL_PROCESS)
    op(_LD_W_ABS, 0)                                     # seccomp_data.nr
    op(_JGE, 0x40000000, jt="kill")                      # the x32 ABI
    op(_JEQ, _X86_64["clone"], jt="clone")
    op(_JEQ, _X86_64["clone3"], jt="enosys")
    for name in DENIED:
        op(_JEQ, _X86_64[name], jt="deny")
    labels = {}
    labels["allow"] = len(prog)
    op(_RET, _RET_ALLOW)
    labels["deny"] = len(prog)
    op(_RET, _RET_ERRNO | errno.EPERM)
    labels["enosys"] = len(prog)
    op(_RET, _RET_ERRNO | errno.ENOSYS)
    labels["kill"] = len(prog)
    op(_RET, _RET_KILL_PROCESS)
    labels["clone"] = len(prog)
    op(_LD_W_ABS, 16)                                    # low 32 bits of args[0] (clone flags)
    op(_JSET, _NS_FLAGS, jt=2)                           # no new namespaces
    op(_JSET, CLONE_THREAD, jt=0, jf=1)                  # a thread, never a process (BPF jumps forward only)
    op(_RET, _RET_ALLOW)
    op(_RET, _RET_ERRNO | errno.EPERM)
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        assert 0 <= jt < 256 and 0 <= jf < 256
        out.append((code, jt, jf, k))
    return out


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


@functools.lru_cache(maxsize=1)
def _compiled_filter():
    """:func:`seccomp_program` as the kernel's ``sock_fprog``: built once in the worker, inherited by every child."""
    prog = seccomp_program()
    arr = (_SockFilter * len(prog))(*[_SockFilter(*p) for p in prog])
    return arr, _SockFprog(len(prog), ctypes.cast(arr, ctypes.POINTER(_SockFilter)))


def install_seccomp(lib) -> bool:
    """Load :func:`seccomp_program` into this process (needs ``no_new_privs`` or CAP_SYS_ADMIN); True if loaded."""
    if lib is None or not seccomp_supported():
        return False
    _, fprog = _compiled_filter()
    return lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0
