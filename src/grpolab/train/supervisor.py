"""`grpolab train` as two processes: the one the user started watches the one that trains.

``os._exit()`` (called by a reward function, a component, a library) ends a process at once: no exception,
no ``finally``, no ``atexit``, and the exit code it chose; ``os._exit(0)`` would tell a sweep the run
succeeded. No code in the process can see it happen, so the CLI forks before it trains (:func:`fork`): the
child trains and tells the parent over a pipe how the command ended (``end RC`` when it returned,
``raised NAME`` when an exception left it); the parent waits for the child and ends as it did. A child
that exits without having said so did not reach the end of the command: the parent says so, names the
likely cause and the command that resumes the run, and exits 1 where the child exited 0.

Nothing else changes for the user:

* a fork costs a few tens of milliseconds and no second start of Python (the modules, about 2 s of
  imports, are loaded once, before it);
* signals reach the training process as before: Ctrl-C reaches both processes from the terminal (the
  parent ignores it and the trainer gets its ``KeyboardInterrupt``); SIGINT, SIGTERM, SIGHUP, SIGUSR1 and
  SIGUSR2 sent to the parent's pid (``kill``, ``timeout``, a scheduler) are passed on to the child; the
  parent then ends by the same signal, so the exit status is the one a single process would have had;
* a training process killed by a signal nobody sent through the parent (SIGKILL from the kernel's
  out-of-memory killer, ``kill -9`` of the child's pid) gets one message from the parent, naming the signal,
  the likely cause and the command that resumes the run, and the parent ends by the same signal (a shell
  shows 128 + 9 = 137 for SIGKILL), as a single process killed so would have;
* ``kill -9`` of the parent kills the child at once (Linux: ``PR_SET_PDEATHSIG``; elsewhere a thread of
  the child polls its parent every 0.2 s), so a killed run stops where it was killed and ``--resume``
  continues it exactly.

Used only where the process is the CLI (``grpolab.cli.main`` with the command line of the process) on a
system with ``os.fork``, and not for ``--nproc_per_node`` or a torchrun rank (the launcher watches those).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

FORWARDED = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2") if hasattr(signal, n))
_report_fd: int | None = None  # the child's end of the pipe (None: not a supervised training process)


def wanted(argv: list[str]) -> bool:
    """True when the command line ``argv`` (without the program) is a single-process `grpolab train` and
    this system can fork."""
    if not hasattr(os, "fork") or any(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK")):
        return False
    i = 0
    while i < len(argv) and argv[i].startswith("--import"):  # the global option: --import M / --import=M
        i += 1 if "=" in argv[i] else 2
    rest = argv[i + 1:]
    return argv[i:i + 1] == ["train"] and not any(a.split("=")[0] == "--nproc_per_node" for a in rest) \
        and not any(a in ("-h", "--help") for a in rest)


def fork() -> int | None:
    """Fork. In the parent: wait for the child, and return the exit code to end with (or end by the signal
    that ended the child). In the child: return None, and train."""
    global _report_fd
    read_end, write_end = os.pipe()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _report_fd = write_end
        _die_with(parent)
        return None
    os.close(write_end)
    return _wait(pid, read_end)


def watched() -> bool:
    """True in the training process of a supervised `grpolab train` (its parent, the process the user started,
    watches it)."""
    return _report_fd is not None


def report(key: str, value) -> None:
    """Tell the watching parent ``key value`` (a no-op in a process nobody watches)."""
    if _report_fd is not None:
        os.write(_report_fd, f"{key} {value}\n".encode())


def _die_with(parent: int) -> None:
    """Make the child end when the parent does (``kill -9`` of the process the user started)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
                if os.getppid() != parent:  # the parent died before prctl took effect
                    os.kill(os.getpid(), signal.SIGKILL)
                return
        except (OSError, AttributeError):
            pass

    def watch():
        while os.getppid() == parent:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, name="grpolab-parent-watch", daemon=True).start()


def _in_terminal_foreground() -> bool:
    """This process group is its terminal's foreground group: a SIGINT is the terminal's Ctrl-C, which the
    kernel sent to the child too."""
    for fd in (0, 1, 2):
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def _wait(pid: int, read_end: int) -> int:
    forwarded: list[int] = []

    def forward(sig, frame):
        if sig == signal.SIGINT and _in_terminal_foreground():
            return  # Ctrl-C: the training process has it already
        forwarded.append(sig)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, forward)
    _, status = os.waitpid(pid, 0)  # retried after each handler (PEP 475)
    said = _messages(read_end)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in forwarded and sig != signal.SIGINT and "raised" not in said:
            cause = " (the kernel's out-of-memory killer sends it)" if sig == signal.SIGKILL else ""
            _error(f"the training process was killed by {signal.Signals(sig).name}{cause} before the run reached "
                   f"its end", said)
        sys.stdout.flush()
        sys.stderr.flush()
        if sig not in (signal.SIGKILL, getattr(signal, "SIGSTOP", None)):  # (those two have no handler to reset)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # end as a single process would have (a shell shows 128 + sig: 137 for SIGKILL)
        return 128 + sig
    rc = os.WEXITSTATUS(status)
    if "end" in said:
        return rc
    if "raised" in said:  # an exception left the command: Python printed it (SystemExit(0): nothing)
        if rc == 0:
            _error(f"the training process raised {said['raised']} with exit code 0 before the run reached its end",
                   said)
            return 1
        return rc
    _error(f"the training process exited with code {rc} before the run reached its end, without an error: "
           f"something in it called os._exit({rc}), most likely a reward function or other user code "
           f"(sys.exit() in a reward function is caught as that reward's error; os._exit() ends the process at "
           f"once)", said)
    return rc or 1


def _messages(read_end: int) -> dict[str, str]:
    """What the child said (the last value of each key); read without waiting for processes it started."""
    os.set_blocking(read_end, False)
    data = b""
    try:
        while chunk := os.read(read_end, 65536):
            data += chunk
    except BlockingIOError:
        pass
    os.close(read_end)
    said = {}
    for line in data.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        said[key] = value
    return said


def _error(what: str, said: dict[str, str]) -> None:
    out = said.get("out")
    if out is None:
        print(f"grpolab: error: {what}", file=sys.stderr, flush=True)
        return
    steps = sorted(p.name for p in (Path(out) / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
    kept = f"its checkpoints (newest: {steps[-1]})" if steps else "no checkpoint yet (a resume starts from step 0)"
    print(f"grpolab: error: {what}. The run in {out} has {kept}; after fixing the cause, continue it with "
          f"`grpolab train --resume {out}`", file=sys.stderr, flush=True)
