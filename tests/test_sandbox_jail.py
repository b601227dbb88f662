"""The sandbox's jail against hostile programs (issue 22, section 1).

Every program of the corpus runs twice: with the Python-level audit hook on, and with it off (what code that
escapes or disables the hook faces: the kernel layers alone). Each must be contained: nothing written or sent
outside the call, nothing read from the host, nothing left running, the worker and the trainer unharmed.
The escapes of the issue (a fresh interpreter through ``_posixsubprocess.fork_exec``, a pathname Unix socket
owned by the trainer's user, ``setsid`` and outliving the call, the trainer's API keys in the environment)
each succeeded on the sandbox before the jail.
"""
import os
import socket
import sys
import threading
import time

import pytest

from grpolab.sandbox import Limits, Sandbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the jail is Linux namespaces and seccomp")

SECRET = "sk-grpolab-test-4f2a9c"


# the hook on; the hook off (the kernel layers alone); the hook off on the path of a user without root (the
# namespaces made through a user namespace), forced here even as root
@pytest.fixture(scope="module", params=[(True, {}), (False, {}), (False, {"GRPOLAB_SANDBOX_USERNS": "1"})],
                ids=["hook-on", "hook-off", "userns-hook-off"])
def box(request):
    hook, env = request.param
    os.environ["GRPOLAB_TEST_API_KEY"] = SECRET  # a key set in the trainer: must never reach the child
    try:
        with Sandbox(limits=Limits(cpu_s=5, wall_s=8, memory_mb=1024), audit_hook=hook, env=env) as b:
            b.run_python("pass")
            iso = b.isolation
            if iso.get("view") == "host" or iso.get("seccomp") == "none":
                pytest.skip(f"no jail on this machine: {iso}")  # the docs say what holds then
            yield b
    finally:
        os.environ.pop("GRPOLAB_TEST_API_KEY", None)


class _Listener:
    """A TCP, UDP, pathname-Unix and abstract-Unix listener in the trainer: records anything that reaches it."""

    def __init__(self, tmp_path):
        self.got: list[bytes] = []
        self.unix_path = str(tmp_path / "agent.sock")  # like an ssh-agent, docker.sock or D-Bus socket
        self.abstract = f"\0grpolab-test-{os.getpid()}"
        self.socks = []
        for fam, kind, addr in [(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)),
                                (socket.AF_UNIX, socket.SOCK_STREAM, self.unix_path),
                                (socket.AF_UNIX, socket.SOCK_STREAM, self.abstract),
                                (socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0))]:
            s = socket.socket(fam, kind)
            s.bind(addr)
            if kind == socket.SOCK_STREAM:
                s.listen(4)
            s.settimeout(0.2)
            self.socks.append(s)
        self.tcp_port = self.socks[0].getsockname()[1]
        self.udp_port = self.socks[3].getsockname()[1]
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            for s in self.socks:
                try:
                    if s.type == socket.SOCK_DGRAM:
                        self.got.append(s.recv(4096))
                    else:
                        conn, _ = s.accept()
                        conn.settimeout(1)
                        self.got.append(b"connected:" + (conn.recv(4096) or b""))
                        conn.close()
                except (OSError, socket.timeout):
                    pass

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        for s in self.socks:
            s.close()


def _secret_home(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_rsa"
    key.write_text("PRIVATE KEY " + SECRET)
    return key


def _run(box, source, **kw):
    r = box.run_python(source, **kw)
    assert box._proc.poll() is None, "the worker died"
    return r


# How code gets around the audit hook without native code: subprocess raises its audit event from Python
# through its module-level ``sys``; with that replaced, Popen reaches _posixsubprocess.fork_exec, which raises
# none, and the new interpreter has no hook at all.
SPAWN = """
import subprocess, sys, types
_fake = types.ModuleType("sys")
_fake.__dict__.update(sys.__dict__)
_fake.audit = lambda *a, **k: None
subprocess.sys = _fake
def spawn(code, **kw):
    return subprocess.Popen([sys.executable, "-c", code], **kw)
"""


def test_fresh_interpreter_via_fork_exec_cannot_start(box, tmp_path):
    """The escape of the issue: a fresh interpreter, without the hook, started through fork_exec."""
    marker = tmp_path / "escaped"
    r = _run(box, SPAWN + f"""
p = spawn("open({str(marker)!r}, 'w').write('out')")
p.wait()
print("started", p.pid)
""")
    time.sleep(0.5)
    assert not marker.exists()
    assert "started" not in r.stdout
    assert not r.ok


def test_no_socket_of_any_family_reaches_the_trainer(box, tmp_path):
    key = _secret_home(tmp_path)
    lis = _Listener(tmp_path)
    try:
        r = _run(box, f"""
import socket
tries = [("tcp", socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", {lis.tcp_port})),
         ("tcp6", socket.AF_INET6, socket.SOCK_STREAM, ("::1", {lis.tcp_port})),
         ("unix-path", socket.AF_UNIX, socket.SOCK_STREAM, {lis.unix_path!r}),
         ("unix-abstract", socket.AF_UNIX, socket.SOCK_STREAM, {lis.abstract!r}),
         ("udp", socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", {lis.udp_port})),
         ("netlink", socket.AF_NETLINK, socket.SOCK_RAW, None),
         ("packet", getattr(socket, "AF_PACKET", 17), socket.SOCK_RAW, None),
         ("vsock", getattr(socket, "AF_VSOCK", 40), socket.SOCK_STREAM, None)]
for name, fam, kind, addr in tries:
    try:
        data = b"leak"
        try:
            data = open({str(key)!r}, "rb").read()
        except OSError:
            pass
        s = socket.socket(fam, kind)
        if addr is not None:
            s.settimeout(1)
            s.connect(addr)
            s.sendall(data)
        print(name, "OPEN")
    except Exception as e:
        print(name, "refused", type(e).__name__)
""")
        time.sleep(0.5)
    finally:
        lis.close()
    assert lis.got == []
    assert "OPEN" not in r.stdout, r.stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_nothing_outlives_the_call(box, tmp_path):
    """A process in a session of its own that keeps running after the call ended (the issue's setsid escape),
    started both through fork_exec and through os.fork: the call's PID namespace ends with the call."""
    marker = tmp_path / "late"
    late = f"import time; time.sleep(4); open({str(marker)!r}, 'w').write('still running')"
    r = _run(box, SPAWN + f"""
import os
try:
    print("pid", spawn({late!r}, start_new_session=True).pid)
except OSError as e:
    print("spawn refused", e)
try:
    pid = os.fork()
    if pid == 0:
        os.setsid()
        exec({late!r})
        os._exit(0)
    print("pid", pid)
except OSError as e:
    print("fork refused", e)
""")
    time.sleep(1)
    pids = [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("pid ")]
    survivors = [p for p in pids if _alive(p)]
    for p in survivors:  # leave nothing behind on a machine where this fails
        os.kill(p, 9)
    assert survivors == [], r
    assert not marker.exists(), r


def test_environment_holds_no_trainer_variables(box):
    r = _run(box, """
import os
print(sorted(os.environ))
for p in ("/proc/self/environ", "/proc/1/environ"):
    try:
        print(open(p, "rb").read())
    except OSError as e:
        print(p, e)
""")
    assert SECRET not in r.stdout and "GRPOLAB_TEST_API_KEY" not in r.stdout
    assert set(eval(r.stdout.splitlines()[0])) <= {"PATH", "LANG", "HOME", "TMPDIR"}


def test_fork_bomb_is_contained(box):
    r = _run(box, "import os\nwhile True:\n    os.fork()", limits=Limits(cpu_s=3, wall_s=5))
    assert not r.ok
    r = _run(box, "import ctypes\nlibc = ctypes.CDLL(None)\nn = 0\nwhile n < 10000:\n    n += libc.fork() >= 0\n"
                  "print(n)", limits=Limits(cpu_s=3, wall_s=5))
    assert box.run_python("print('ok')").stdout == "ok\n"


def test_memory_bomb_is_contained(box):
    r = _run(box, "x = bytearray(8 * 1024 ** 3)")
    assert not r.ok
    r = _run(box, "xs = []\nwhile True:\n    xs.append(bytearray(64 * 1024 ** 2))")
    assert not r.ok and ("MemoryError" in r.error or "crashed" in r.error)


def test_no_writes_outside_scratch(box, tmp_path):
    target = tmp_path / "outside.txt"
    r = _run(box, f"""
import os
done = []
for p in [{str(target)!r}, "/tmp/other-call", "/usr/evil", "/etc/evil", "/evil", "/proc/sys/kernel/evil"]:
    try:
        open(p, "w").write("x")
        done.append(p)
    except OSError:
        pass
open("scratch.txt", "w").write("fine")
print(done, open("scratch.txt").read())
""")
    assert not target.exists()
    if r.ok:
        assert r.stdout.strip() == "[] fine"


def test_user_home_and_host_paths_are_not_visible(box, tmp_path):
    key = _secret_home(tmp_path)
    r = _run(box, f"""
import os
seen = []
for p in [{str(key)!r}, {os.path.expanduser('~/.bash_history')!r}, "/etc/passwd", "/etc/shadow",
          "/run/docker.sock", "/var/run", {os.getcwd()!r} + "/pyproject.toml"]:
    if os.path.exists(p):
        seen.append(p)
print(seen)
""")
    if r.ok:
        assert r.stdout.strip() == "[]", r.stdout
    assert SECRET not in r.stdout


def test_cannot_kill_or_see_the_worker_or_the_trainer(box):
    worker = box._proc.pid
    r = _run(box, f"""
import os, signal
for pid in [os.getppid(), {worker}, {os.getpid()}, -1]:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as e:
        pass
try:
    os.killpg(0, signal.SIGKILL)
except OSError:
    pass
print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) if os.path.isdir("/proc") else [])
""")
    assert box._proc.poll() is None
    assert box.run_python("print('alive')").stdout == "alive\n"
    if r.ok and r.stdout.strip():
        assert all(p < 10 for p in eval(r.stdout)), r.stdout  # only the call's own processes


def test_ctypes_system_calls_are_refused(box, tmp_path):
    marker = tmp_path / "ctypes"
    r = _run(box, f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}
for name, nr, args in [("socket", 41, (2, 1, 0)), ("ptrace", 101, (16, 1, 0, 0)), ("mount", 165, (0, 0, 0, 0, 0)),
                       ("unshare", 272, (0x10000000,)), ("keyctl", 250, (0, 0)), ("bpf", 321, (0, 0, 0)),
                       ("execve", 59, (b"/bin/sh", 0, 0)), ("fork", 57, ()), ("setns", 308, (0, 0)),
                       ("chroot", 161, (b"/",)), ("userfaultfd", 323, (0,)), ("io_uring_setup", 425, (1, 0))]:
    out[name] = libc.syscall(nr, *args)
libc.system(b"touch {marker}")
print(out)
""")
    assert not marker.exists()
    if r.ok:
        assert all(v == -1 for v in eval(r.stdout).values()), r.stdout


def test_protocol_pipes_are_out_of_reach(box):
    """A call cannot write fake answers to the worker's protocol or read the next request."""
    r = _run(box, """
import os
hits = []
for fd in range(0, 256):
    if fd in (1, 2):
        continue
    try:
        os.write(fd, b"\\x10\\x00\\x00\\x00\\x00\\x00\\x00\\x00" + b'{"ok": true}    ')
        hits.append(fd)
    except OSError:
        pass
print(hits)
""")
    assert r.stdout.startswith("[") and r.stdout.endswith("]\n"), r  # the call ran to its end
    assert box.run_python("print(6 * 7)").stdout == "42\n"
    assert box.call(pow, 2, 10).value == 1024


def test_a_scorer_patched_by_one_answer_does_not_score_the_next():
    """rg_sandbox's default scores each answer in its own child: a crafted answer that patches the scorer
    cannot make two wrong answers of the same call score 1.0 (the issue's attack on 'call')."""
    pytest.importorskip("reasoning_gym")
    from grpolab.config import Config
    from grpolab.tasks import get_task

    cfg = Config.build({"task": "rg:string_insertion", "rg_train_size": 6, "rg_eval_size": 3})
    task = get_task(cfg.task, cfg=cfg)
    rg_score = dict((n, f) for n, f, _ in task.rewards)["rg_score"]
    rows = task.train_rows[:3]
    patch = ("[setattr(v, 'score_answer', lambda *a, **k: 1.0) for v in "
             "__import__('sys').modules['grpolab.sandbox.gym']._DATASETS.values()]")
    completions = [[{"role": "assistant", "content": f"Answer: {a}"}] for a in (patch, "wrong", "wrong too")]
    scores = rg_score(prompts=[r["prompt"] for r in rows], completions=completions,
                      rg_entry=[r["rg_entry"] for r in rows], rg_split=[r["rg_split"] for r in rows])
    assert scores == [0.0, 0.0, 0.0]


def test_python_tool_warns_once_without_a_jail():
    from grpolab.agents import tools

    class NoJail:
        isolation = {"view": "host", "note": "no jail: the kernel refused new mount and PID namespaces"}

    box = NoJail()
    with pytest.warns(RuntimeWarning, match="without the sandbox's jail"):
        tools._warn_without_jail(box)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tools._warn_without_jail(box)  # once per sandbox
        box.isolation = {"view": "jail"}
        tools._warn_without_jail(NoJail.__new__(type("Jailed", (), {"isolation": {"view": "jail"}})))


def test_seccomp_program_is_well_formed():
    """Every jump lands inside the program and forward (the kernel refuses the filter otherwise), the
    architecture is checked first and the program ends in a return."""
    from grpolab.sandbox import jail

    prog = jail.seccomp_program()
    assert prog[0] == (0x20, 0, 0, 4) and prog[1][3] == 0xC000003E
    for i, (code, jt, jf, k) in enumerate(prog):
        if code & 0x07 == 0x05:  # BPF_JMP
            assert i + 1 + max(jt, jf) < len(prog)
    assert prog[-1][0] == 0x06 and len(prog) < 4096
    denied = {k for code, jt, jf, k in prog if code == 0x15}
    for name in ("execve", "socket", "ptrace", "mount", "unshare", "keyctl", "bpf", "fork", "vfork"):
        assert jail._X86_64[name] in denied, name
