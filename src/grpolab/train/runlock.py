"""One training process per run folder: the lock ``OUT/grpolab_run.lock``.

Two processes that train in one folder (two ``grpolab train --resume OUT`` at once) interleave their steps
(``metrics.jsonl`` then holds steps 1, 2, 3, 3, 4, 4, 5, 5) and overwrite each other's checkpoints. So the
process that trains in a run folder holds an exclusive ``fcntl.flock`` on ``OUT/grpolab_run.lock`` from before
it writes anything there until its run ends, and writes into that file who it is (pid, host, start time,
command line, the command that resumes the run) for the message another process gets:

* another process that would train in the folder (``--out`` or ``--resume``, a Python ``Trainer`` or
  ``GRPOTrainer``) is refused with :class:`~grpolab.errors.RunFolderBusy`, naming the holder and what to do,
  before it writes anything there (:meth:`RunLock.check` reads only; :func:`holder_of` is the same probe);
* the kernel drops a flock when the process that holds it ends, however it ends (``kill -9``, the
  out-of-memory killer), so a lock left behind is no obstacle: the next run takes it, and says that its last
  holder ended without releasing it; a holder on its way out (dead, or its supervisor dead: ``kill -9`` of the
  `grpolab train` the user started, whose training process follows it at once) is waited for up to
  :data:`GRACE_S`;
* a process forked by the holder (a reward worker, a sandbox) does not keep the lock: its copy of the
  descriptor is closed in the child (``os.register_at_fork``);
* in one process, a newer trainer on the folder takes the lock over from an older one that is not inside
  ``train()`` (a notebook cell run again, a test that builds a second trainer); one inside ``train()`` keeps it;
* the lock file is removed when the run ends (while it is still held; a process that opened it just before
  sees another file at the path after its ``flock`` and tries again on that one), and a folder created only to
  hold it is removed too, so a run that fails before it writes anything leaves nothing.

Who locks: the process that trains (under `grpolab train` the supervisor's child, train/supervisor.py; the
supervisor takes no lock), and of a multi-rank run rank 0 only, so ranks never refuse each other; the launcher
of ``--nproc_per_node`` checks the folder before it starts any rank. Without ``fcntl`` (Windows) no lock is
taken, and a file system without locks (``ENOLCK``) gets a warning.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from ..errors import RunFolderBusy

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

LOCK = "grpolab_run.lock"
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
_HELD: dict[str, "RunLock"] = {}  # real path of the folder -> the lock this process holds on it


def _key(out: Path) -> str:
    return os.path.realpath(out)


def _forget_in_child() -> None:
    """In a forked child: close the inherited lock descriptors, so the lock ends with the process that took it."""
    for lock in list(_HELD.values()):
        with contextlib.suppress(OSError):
            os.close(lock.fd)
        lock.fd = None
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _read(fd: int) -> dict:
    """The holder's record in an open lock file ({} when it has none yet)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 65536).decode(errors="replace")
        info = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def holder_of(out: Path) -> dict | None:
    """The record of the process that holds the lock of ``out`` (``{}`` when it has written none yet), or None
    when no process holds it. Reads only: creates and changes nothing."""
    if fcntl is None:
        return None
    try:
        fd = os.open(Path(out) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            return _read(fd) if e.errno in _BUSY else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _alive(pid) -> bool:
    """A process ``pid`` of this machine exists and is not a zombie."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _ending(info: dict) -> bool:
    """The holder described by ``info`` (on this machine) is on its way out: it has died and the kernel is
    closing its files, or the supervisor that started it has died (the child follows at once: train/supervisor.py,
    PR_SET_PDEATHSIG, or its watch thread within 0.2 s)."""
    if not info or info.get("host") != socket.gethostname():
        return False
    return not _alive(info.get("pid")) or (bool(info.get("supervisor")) and not _alive(info["supervisor"]))


GRACE_S = 3.0  # how long a refused process waits for a holder that is ending (kill -9 of `grpolab train`)


def holder(out: Path) -> dict | None:
    """:func:`holder_of`, waiting up to :data:`GRACE_S` for a holder that is ending (:func:`_ending`) or has not
    written its record yet."""
    deadline = time.monotonic() + GRACE_S
    info = holder_of(out)
    while info is not None and (not info or _ending(info)) and time.monotonic() < deadline:
        time.sleep(0.05)
        info = holder_of(out)
    return info


def busy_message(out: Path, info: dict | None, this_process: bool = False) -> str:
    """What a process refused by the lock of ``out`` is told: who holds it, and what to do."""
    out = Path(out)
    info = info or {}
    pid, host = info.get("pid"), info.get("host")
    if this_process:
        who = "another trainer of this process, inside its train()"
        todo = "Wait until that train() returns, or choose another --out (Python: output_dir, Config.out)"
    else:
        elsewhere = host and host != socket.gethostname()
        who = (f"a grpolab process on host {host} (pid {pid}; the folder is shared)" if elsewhere
               else f"the grpolab process pid {pid}" if pid else
               f"another process (it has not written its pid into {out / LOCK} yet)")
        if info.get("supervisor"):
            who += f", started by pid {info['supervisor']}"
        if info.get("started") or info.get("command"):
            who += f", since {info.get('started', '?')}: {info.get('command', '?')}"
        stop = f"`kill {pid}`" + (f" on {host}" if elsewhere else "") if pid else "stop it"
        resume = info.get("resume") or f"`grpolab train --resume {out}`"
        todo = (f"Wait for it to end, or stop it ({stop}; then {resume} continues the run from its newest "
                f"checkpoint), then run this again; or choose another --out (Python: output_dir, Config.out)")
    return (f"run folder {out} is in use: {who}, is training in it; two runs in one folder would interleave their "
            f"steps and overwrite each other's checkpoints. {todo}. Nothing in {out} was changed")


class RunLock:
    """The lock of the run folder ``out`` for this process (module docstring); ``active=False`` (another rank,
    no ``fcntl``): every method does nothing. ``resume``: the command that continues the run, recorded for the
    message a refused process gets."""

    def __init__(self, out: Path, active: bool = True, resume: str | None = None):
        self.out = Path(out)
        self.path = self.out / LOCK
        self.active = active and fcntl is not None
        self.resume = resume
        self.fd: int | None = None
        self.busy = False  # inside train(): a newer trainer of this process may not take the lock over
        self._made: list[Path] = []  # folders created to hold the lock (removed on release if still empty)

    @property
    def held(self) -> bool:
        return self.fd is not None

    def check(self) -> None:
        """Raise :class:`RunFolderBusy` if another process (or a trainer of this one inside ``train()``) trains
        in the folder; reads only."""
        if not self.active or self.held:
            return
        other = _HELD.get(_key(self.out))
        if other is not None and other is not self:
            if other.busy:
                raise RunFolderBusy(busy_message(self.out, None, this_process=True))
            return
        info = holder(self.out)
        if info is not None:
            raise RunFolderBusy(busy_message(self.out, info))

    def acquire(self, log=print) -> None:
        """Take the lock (creating the folder if needed), or raise :class:`RunFolderBusy`."""
        if not self.active or self.held:
            return
        key = _key(self.out)
        other = _HELD.get(key)
        if other is not None and other is not self:  # a trainer of this process: take over unless it trains
            if other.busy:
                raise RunFolderBusy(busy_message(self.out, None, this_process=True))
            self.fd, other.fd, self._made, other._made = other.fd, None, other._made, []
            _HELD[key] = self
            self._record()
            return
        made, folder = [], self.out
        while not folder.exists() and folder.parent != folder:  # the folders this creates, deepest first
            made.append(folder)
            folder = folder.parent
        self.out.mkdir(parents=True, exist_ok=True)
        self._made = made
        fd = self._lock(log)
        if fd is None:
            return
        previous = _read(fd)
        self.fd = fd
        _HELD[key] = self
        self._record()
        if previous.get("pid"):
            log(f"[grpolab] {self.path}: its last holder (pid {previous['pid']} on {previous.get('host', '?')}, "
                f"since {previous.get('started', '?')}) ended without releasing it (killed?); the kernel had "
                f"dropped its lock, and this process holds it now")

    def _lock(self, log) -> int | None:
        """An open descriptor of the lock file, locked; None where the file system has no locks."""
        deadline = time.monotonic() + GRACE_S
        for attempt in range(400):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                self._undo_folders()
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                info = _read(fd)
                os.close(fd)
                if e.errno not in _BUSY:
                    log(f"[grpolab] warning: {self.path} cannot be locked ({os.strerror(e.errno or 0)}): nothing "
                        f"stops a second process from training in {self.out} at the same time")
                    self._undo_folders()
                    return None
                if (not info and attempt < 40) or (_ending(info) and time.monotonic() < deadline):
                    time.sleep(0.025)  # a holder writing its record (or a probe), or one that is ending: again
                    continue
                self._undo_folders()
                raise RunFolderBusy(busy_message(self.out, info)) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except OSError:
                same = False
            if same:
                return fd
            os.close(fd)  # its holder removed that file as it released it: lock the one at the path now
        raise RunFolderBusy(busy_message(self.out, {}))  # pragma: no cover - 400 files replaced in a row

    def _record(self) -> None:
        """Write who holds the lock into it (a full disk leaves it empty: the lock still holds)."""
        from . import supervisor

        program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
        program = program.parent.name if program.name == "__main__.py" else program.name  # python -m NAME: NAME
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": " ".join([program, *sys.argv[1:]])[:500], "resume": self.resume}
        if supervisor.watched():
            info["supervisor"] = os.getppid()
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
            os.lseek(self.fd, 0, os.SEEK_SET)
            os.write(self.fd, (json.dumps(info) + "\n").encode())

    def release(self) -> None:
        """Remove the lock file and drop the lock (and the folders made only to hold it, if still empty)."""
        if self.fd is None:
            return
        if _HELD.get(_key(self.out)) is self:
            del _HELD[_key(self.out)]
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = None
        self._undo_folders()

    def _undo_folders(self) -> None:
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:
                break
        self._made = []

    @contextlib.contextmanager
    def training(self, log=print):
        """Held (taken again if released) and marked busy for the block; released after it."""
        if not self.held:
            self.check()
            self.acquire(log)
        self.busy = True
        try:
            yield
        finally:
            self.busy = False
            self.release()
