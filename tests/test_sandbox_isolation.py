"""The sandbox against hostile programs, issue 39: calls that cannot see each other, results the caller cannot
be fooled by, memory that counts, a worker that never runs a call twice.

Every category of the issue is a program here, run on each path a machine can give (the audit hook on; off;
off through a user namespace; off on a kernel without mount namespaces and with Landlock older than ABI 6, i.e.
no signal scoping, as before Linux 6.12), so a regression fails CI. Each program succeeded against the sandbox
before this issue's changes: System V message queues and shared memory carried data from one call to the next,
``memfd_create`` grew past ``memory_mb``, and a forged result raised in the caller.
"""
import json
import os
import sys
import threading

import pytest

from grpolab.sandbox import Limits, Sandbox, SandboxResult, parse_result

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the jail is Linux namespaces and seccomp")

PATHS = {
    "hook-on": (True, {}),
    "hook-off": (False, {}),
    "userns-hook-off": (False, {"GRPOLAB_SANDBOX_USERNS": "1"}),
    # a kernel that refuses mount namespaces and has no Landlock signal scoping: PID namespaces alone
    "old-kernel-hook-off": (False, {"GRPOLAB_SANDBOX_NO_MOUNTNS": "1", "GRPOLAB_SANDBOX_LANDLOCK_ABI": "5"}),
}


@pytest.fixture(scope="module", params=list(PATHS), ids=list(PATHS))
def box(request):
    hook, env = PATHS[request.param]
    with Sandbox(limits=Limits(cpu_s=10, wall_s=15, memory_mb=1024, tmp_mb=64), audit_hook=hook, env=env) as b:
        b.run_python("pass")
        iso = b.isolation
        if iso.get("processes") != "pidns" or iso.get("seccomp") == "none":
            pytest.skip(f"no PID namespaces or seccomp on this machine: {iso}")  # docs/safety.md: what holds
        b.path = request.param
        yield b


def _run(box, source, **kw):
    r = box.run_python(source, **kw)
    assert box._proc.poll() is None, "the worker died"
    return r


# the result pipe is the child's highest file descriptor (0-2 are stdio; listdir opens one of its own)
RESULT_FD = "__import__('os').listdir('/proc/self/fd') and max(int(f) for f in __import__('os').listdir('/proc/self/fd'))"

LIBC = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
"""


# ------------------------------------------------------------------------- one call cannot see another's data
def test_files_of_an_earlier_call_are_gone(box):
    plant = _run(box, """
import os
open("planted", "w").write("secret-of-" + "call-1")
os.makedirs("deep/er", exist_ok=True)
open("deep/er/x", "w").write("secret-of-" + "call-1")
for p in ("/tmp/planted", os.path.expanduser("~/planted"), "/planted", "/dev/shm/planted"):
    try:
        open(p, "w").write("secret-of-" + "call-1")
    except OSError:
        pass
print(os.getcwd())
""")
    assert plant.ok, plant
    tops = ["/tmp", "/dev", "/"] if box.isolation.get("view") == "jail" else []  # (else /tmp is the host's)
    look = _run(box, f"""
import os
found = []
for p in ("/tmp/planted", os.path.expanduser("~/planted"), "/planted", "/dev/shm/planted", "planted"):
    if os.path.exists(p):
        found.append(p)
for top in {tops!r} + [os.getcwd(), os.path.expanduser("~")]:
    for root, dirs, files in os.walk(top):
        if root.startswith(("/proc", "/usr", "/lib", "/sys")):
            dirs[:] = []
            continue
        for f in files:
            try:
                if "secret-of-" + "call-1" in open(os.path.join(root, f), errors="ignore").read(1 << 16):
                    found.append(os.path.join(root, f))
            except OSError:
                pass
        if top == "/":
            break
print(found)
""")
    assert look.ok, look
    assert look.stdout.strip() == "[]", look.stdout


def test_a_system_v_message_queue_does_not_carry_data_to_the_next_call(box):
    send = _run(box, LIBC + """
q = libc.msgget(0x6770, 0o1666)
buf = ctypes.create_string_buffer(b"\\x01" + b"\\x00" * 7 + b"secret", 14)
print(q, libc.msgsnd(q, buf, 6, 0) if q >= 0 else -1)
""")
    recv = _run(box, LIBC + """
q = libc.msgget(0x6770, 0o666)
buf = ctypes.create_string_buffer(64)
n = libc.msgrcv(q, buf, 56, 0, 0o4000) if q >= 0 else -1
print(n, buf.raw[8:8 + max(n, 0)])
""")
    assert "secret" not in recv.stdout and "secret" not in recv.stderr, recv
    if send.ok:  # (the audit hook refuses ctypes itself)
        assert send.stdout.split()[0] == "-1", send.stdout  # msgget refused
        assert recv.stdout.split()[0] == "-1", recv.stdout


def test_system_v_shared_memory_and_posix_queues_are_refused(box):
    r = _run(box, LIBC + """
out = {"shmget": libc.shmget(0x6771, 768 << 20, 0o1666), "semget": libc.semget(0x6772, 1, 0o1666),
       "mq_open": libc.syscall(240, b"grpolab", 0o100 | 2, 0o666, None)}
print(out)
""")
    if r.ok:  # (the audit hook refuses ctypes itself)
        assert all(v == -1 for v in eval(r.stdout).values()), r.stdout
        after = _run(box, LIBC + "print(libc.shmget(0x6771, 0, 0o666))")
        assert after.stdout.strip() == "-1"
    else:
        assert "ctypes" in r.error, r.error


def test_no_file_descriptor_of_the_worker_or_an_earlier_call_is_open(box):
    r = _run(box, "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))")
    assert r.ok, r
    fds = eval(r.stdout)
    assert len(fds) <= 5 and set(fds) >= {0, 1, 2}, fds  # stdio, the result pipe, listdir's own


# ------------------------------------------------------------------------------------- memory beyond the limit
def test_memfd_cannot_grow_past_the_memory_limit(box):
    r = _run(box, """
import os
held = 0
try:
    for i in range(48):  # 3 GiB in 64 MiB memory files, past memory_mb=1024
        fd = os.memfd_create(f"m{i}")
        os.write(fd, b"x" * (63 << 20))
        held += 63
except OSError as e:
    print("refused", held, e.errno)
print("held", held)
""", limits=Limits(cpu_s=30, wall_s=40, memory_mb=1024, tmp_mb=64))
    assert "held 3024" not in r.stdout, r
    assert r.stdout.startswith("refused 0"), r.stdout


def test_the_scratch_folder_holds_at_most_tmp_mb(box):
    r = _run(box, """
import os
written = 0
try:
    for i in range(10):
        with open(f"f{i}", "wb") as fh:
            fh.write(b"x" * (16 << 20))
        written += 16
except OSError as e:
    print("stopped", written, e.errno)
""")
    if box.isolation.get("view") == "jail":  # a tmpfs of tmp_mb=64 per call
        assert r.stdout.startswith("stopped") and int(r.stdout.split()[1]) <= 64, r.stdout


def test_workers_side_by_side_have_cgroups_of_their_own():
    """Two workers at once (xdist, a trainer with several sandboxes): each worker is PID 1 of its namespace, so
    the cgroup's name must not come from its pid; closing one must not remove the other's."""
    with Sandbox(limits=Limits(cpu_s=5, wall_s=10)) as a, Sandbox(limits=Limits(cpu_s=5, wall_s=10)) as b:
        assert a.run_python("print(1)").ok and b.run_python("print(2)").ok
        a.close()
        for _ in range(3):
            r = b.run_python("print(3)")
            assert r.ok and r.stdout == "3\n", r


def test_a_memory_cgroup_counts_what_the_address_space_limit_does_not():
    """Files in the call's tmpfs are memory no RLIMIT_AS counts: under a memory cgroup they count."""
    with Sandbox(limits=Limits(cpu_s=20, wall_s=30, memory_mb=256, tmp_mb=1024, file_mb=1024)) as b:
        b.run_python("pass")
        if not b.isolation.get("memory", "").startswith("cgroup") or b.isolation.get("view") != "jail":
            pytest.skip(f"no memory cgroup or jail here: {b.isolation}")
        r = b.run_python("""
for i in range(8):
    open(f"f{i}", "wb").write(b"x" * (64 << 20))
    print(i, flush=True)
""")
        assert not r.ok and r.error == "crashed: memory limit of 256 MiB (memory_mb)", r
        assert b.run_python("print('next')").stdout == "next\n"


# ------------------------------------------------------------------------------------- forged results
FORGERIES = {
    "extra key": b'{"ok": true, "value": 1, "extra": 2}',
    "missing ok": b'{"value": 1}',
    "forged fields": b'{"ok": true, "value": 1, "timed_out": "yes", "stdout": 5}',
    "not an object": b"[1, 2, 3]",
    "a number": b"1e300",
    "deep array": b'{"ok": true, "value": ' + b"[" * 200000 + b"]" * 200000 + b"}",
    "deep object": b'{"ok": true, "value": ' + b'{"a":' * 100 + b"1" + b"}" * 100 + b"}",
    "ok not a bool": b'{"ok": "yes", "value": 1}',
    "error not text": b'{"ok": false, "error": [1]}',
    "ok with error": b'{"ok": true, "value": 1, "error": "x"}',
    "not JSON": b"\xff\xfe{not json",
    "truncated": b'{"ok": true, "value": [1, 2',
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forged_result_is_an_error_result_of_that_call(box, name):
    payload = FORGERIES[name]
    r = _run(box, f"import os\nos.write({RESULT_FD}, {payload!r})\nos._exit(0)")
    assert isinstance(r, SandboxResult) and r.ok is False and r.value is None
    assert r.error.startswith("child sent a malformed result"), r.error
    assert r.timed_out is False and isinstance(r.stdout, str)
    assert box.call(pow, 2, 10).value == 1024


def test_a_huge_result_is_an_error_not_memory_of_the_caller(box):
    r = _run(box, f"import os\nfd = {RESULT_FD}\nfor _ in range(40):\n    os.write(fd, b' ' * (1 << 20))\n"
                  "os.write(fd, b'1')\nos._exit(0)")
    assert not r.ok and "more than 32 MiB" in r.error, r.error


def test_map_gives_every_other_item_its_own_result(box):
    forged = f"import os\nos.write({RESULT_FD}, b'[' * 100000)\nos._exit(0)"
    from grpolab.sandbox import _exec_source

    rs = box.map(_exec_source, [("print(1)",), (forged,), ("print(3)",)])
    assert [r.ok for r in rs] == [True, False, True]
    assert rs[0].stdout == "1\n" and rs[2].stdout == "3\n"


def test_parse_result_accepts_exactly_the_protocol():
    """The schema, derived from the protocol's definition rather than from the parser."""
    assert parse_result(b'{"ok": true, "value": [1, {"a": null}]}') == \
        {"ok": True, "value": [1, {"a": None}], "error": None}
    assert parse_result(b'{"ok": true}') == {"ok": True, "value": None, "error": None}
    assert parse_result(b'{"ok": false, "error": "raised ValueError: x"}') == \
        {"ok": False, "value": None, "error": "raised ValueError: x"}
    nested = json.dumps({"ok": True, "value": [[[[1]]]]}).encode()
    assert parse_result(nested)["value"] == [[[[1]]]]
    at_limit = b'{"ok": true, "value": ' + b"[" * 64 + b"]" * 64 + b"}"
    assert parse_result(at_limit)["ok"] is True
    over = b'{"ok": true, "value": ' + b"[" * 65 + b"]" * 65 + b"}"
    assert parse_result(over)["ok"] is False
    for payload in FORGERIES.values():
        assert parse_result(payload)["ok"] is False, payload[:40]


# ------------------------------------------------------------------------------- the worker and its callers
def test_a_call_cannot_signal_the_worker_or_the_trainer(box):
    worker = box._proc.pid
    r = _run(box, f"""
import os, signal
for pid in [os.getppid(), {worker}, {os.getpid()}, -1, 1]:
    for sig in (signal.SIGKILL, signal.SIGINT, signal.SIGTERM):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
print("ppid", os.getppid())
""")
    assert box._proc.poll() is None
    assert box.run_python("print('alive')").stdout == "alive\n"
    if r.ok:
        assert r.stdout.strip() == "ppid 0", r.stdout  # the worker is outside the call's PID namespace


def test_a_worker_that_dies_during_a_call_does_not_run_it_again():
    """A call whose worker dies mid-call gets an error result; the request is never sent a second time."""
    with Sandbox(limits=Limits(cpu_s=5, wall_s=5)) as b:
        b.run_python("pass")
        starts = []
        start = b._start

        def counting_start():
            starts.append(1)
            start()
        b._start = counting_start
        victim = b._proc.pid
        threading.Timer(0.5, lambda: os.killpg(victim, 9)).start()
        r = b.run_python("import time; time.sleep(3); print('ran')")
        assert not r.ok and "died while running this call" in r.error, r
        assert starts == []  # not retried
        assert b.run_python("print('fresh')").stdout == "fresh\n"
        assert starts == [1]


def test_the_worker_never_prints_a_traceback_for_a_call(box, capfd):
    _run(box, f"import os\nos.write({RESULT_FD}, b'[' * 300000)\nos._exit(0)")
    _run(box, "import os\nos._exit(7)")
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


# ------------------------------------------------------------------------------------------- rg: forged scores
@pytest.fixture(scope="module")
def rg_task():
    pytest.importorskip("reasoning_gym")
    from grpolab.config import Config
    from grpolab.tasks import get_task

    cfg = Config.build({"task": "rg:string_insertion", "rg_train_size": 6, "rg_eval_size": 3})
    return get_task(cfg.task, cfg=cfg)


FORGED_SCORES = [b'{"ok": true, "value": 1e300}', b'{"ok": true, "value": NaN}', b'{"ok": true, "value": "1.0"}',
                 b'{"ok": true, "value": [1.0]}', b'{"ok": true, "value": -5}', b'{"ok": true, "value": true}',
                 b'{"ok": true, "value": 1, "x": 0}', b"[" * 100000]


@pytest.mark.parametrize("mode", ["item", "call"])
def test_a_forged_rg_score_costs_only_that_answer(rg_task, mode):
    from grpolab.tasks.gym import score_in_sandbox

    box = rg_task.rewards[0][1].__closure__  # the task's own sandbox (through its reward's closure)
    box = next(c.cell_contents for c in box if isinstance(c.cell_contents, Sandbox))
    rows = rg_task.train_rows[:3]
    right = str(rows[0]["rg_entry"]["answer"])
    forged = [f"__import__('os').write({RESULT_FD}, {p!r}) and __import__('os')._exit(0)" for p in FORGED_SCORES]
    answers = [right] + forged + [right]
    entries = [rows[0]["rg_entry"]] * len(answers)
    scores = score_in_sandbox(box, answers, entries, [rows[0]["rg_split"]] * len(answers), per_item=mode == "item")
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores), scores
    if mode == "item":  # each answer in its own child: the right ones keep their score
        assert scores == [1.0] + [0.0] * len(forged) + [1.0], scores


def test_checked_score_is_a_finite_number_in_0_1():
    from grpolab.tasks.gym import checked_score

    assert [checked_score(v) for v in (0, 1, 0.25, 1.0, 0.0)] == [0.0, 1.0, 0.25, 1.0, 0.0]
    for v in (1e300, float("inf"), float("nan"), -0.1, 1.5, "1", [1], {"a": 1}, None, True):
        assert checked_score(v) == 0.0, v


def test_the_python_tool_turns_a_forged_result_into_text():
    """The agent's python tool (model-written code) gets an error text, never an exception in the rollout."""
    from grpolab.agents.tools import make_python_tool

    python = make_python_tool(Limits(cpu_s=5, wall_s=10, memory_mb=1024))
    for payload in (FORGERIES["deep array"], FORGERIES["extra key"], b"[1]"):
        out = python(f"import os\nos.write({RESULT_FD}, {payload!r})\nos._exit(0)")
        assert isinstance(out, str) and "malformed result" in out, out
    assert python("print(6 * 7)").strip().endswith("42")
