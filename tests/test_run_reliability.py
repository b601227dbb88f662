"""Run reliability (issue 39, "Reliability III"): one process per run folder, a trainer killed by SIGKILL, a full
disk during a checkpoint, resuming a Python-API run, a first step that keeps no group.

Each test failed on the code before its fix: two `grpolab train --resume RUN` at once both trained (metrics.jsonl
held steps 1, 2, 3, 3, 4, 4, ...); a SIGKILLed trainer made the supervisor print a traceback and exit 1; PyTorch's
``enforce fail at inline_container.cc`` ended the run with a raw traceback; the resume command docs/python_api.md
gave for a GRPOTrainer run failed ("--data needs at least one --reward"); a step with no group kept showed
``reward=nan`` and made PyTorch warn that the scheduler stepped before the optimiser.
"""
import errno
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch

from grpolab.cli import main
from grpolab.config import Config
from grpolab.errors import RunFolderBusy
from grpolab.train import checkpoint as ckpt
from grpolab.train import rundir, runlock
from grpolab.train.metrics import progress_fields, read_metrics
from grpolab.train.runlock import LOCK, RunLock, holder_of
from grpolab.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
quiet = {"log": lambda *a: None}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
TINY_CLI = ["--model", "tiny", "--task", "repeat", "--num_generations", "2", "--prompts_per_step", "2",
            "--max_completion_length", "3", "--eval_before", "false", "--eval_after", "false",
            "--tensorboard", "false", "--quiet", "--threads", "1"]
needs_proc = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc to find the trainer")
posix_only = pytest.mark.skipif(runlock.fcntl is None or not hasattr(os, "fork"), reason="fcntl.flock, os.fork")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "grpolab", "train", *TINY_CLI, *args]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _wait_for(cond, seconds: float = 240, what: str = "") -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _start_training(out: Path) -> tuple[subprocess.Popen, int]:
    """A `grpolab train` that runs until stopped, once it has logged a step: (the process, its trainer's pid)."""
    proc = subprocess.Popen(_cli("--steps", "100000", "--save_steps", "1", "--out", str(out)), env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for(lambda: read_metrics(out) or proc.poll() is not None, what="the first step")
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    children = _children(proc.pid)
    assert len(children) == 1  # the supervisor's child: the training process
    return proc, children[0]


# --------------------------------------------------------------------------------------- 1. one process per folder
@needs_proc
@posix_only
def test_a_second_grpolab_train_on_a_run_folder_is_refused_and_a_killed_ones_lock_recovered(tmp_path, capsys):
    out = tmp_path / "run"
    proc, trainer_pid = _start_training(out)
    try:
        fixed = {n: (out / n).read_bytes() for n in ("config.yaml", rundir.MARKER)}
        # the second `grpolab train` runs in this process (the refusal happens before any trainer starts; the
        # first run is a real `grpolab train` process with its supervisor)
        for second in (["--resume", str(out)], ["--out", str(out)], ["--out", str(out), "--overwrite"]):
            capsys.readouterr()
            rc = main(["train", *second, "--quiet"])
            err = capsys.readouterr().err
            assert rc == 2, err[-2000:]
            assert f"run folder {out} is in use" in err and f"pid {trainer_pid}" in err
            assert f"started by pid {proc.pid}" in err  # the supervisor the user started
            assert f"kill {trainer_pid}" in err and f"grpolab train --resume {out}" in err
            assert "Nothing in" in err and "Traceback" not in err
            assert {n: (out / n).read_bytes() for n in fixed} == fixed  # refused before it wrote anything
        os.kill(trainer_pid, signal.SIGKILL)  # the out-of-memory killer: its lock file stays behind
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert json.loads((out / LOCK).read_text())["pid"] == trainer_pid  # left behind, but no longer held
    assert holder_of(out) is None
    done = max(r["step"] for r in read_metrics(out))
    got = subprocess.run(_cli("--resume", str(out), "--steps", str(done + 2)), env=ENV, capture_output=True,
                         text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    assert f"its last holder (pid {trainer_pid} on {socket.gethostname()}" in got.stderr
    assert "ended without releasing it" in got.stderr
    steps = [r["step"] for r in read_metrics(out)]
    assert steps == list(range(1, done + 3))  # one run's steps, each once
    assert not (out / LOCK).exists()  # released with the run


HOLDER = textwrap.dedent("""
    import sys, time
    from grpolab.train.runlock import RunLock
    lock = RunLock(sys.argv[1], resume="`grpolab train --resume " + sys.argv[1] + "`")
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def held_by_another_process(tiny_args):
    """The run folder of ``tiny_args`` with its lock held by another process (the holder's pid)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, tiny_args["out"]], env=ENV, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    yield holder.pid
    holder.kill()
    holder.wait()


@posix_only
def test_a_trainer_is_refused_while_another_process_holds_the_folder(tiny_args, held_by_another_process):
    out = Path(tiny_args["out"])
    before = _tree(out)
    with pytest.raises(RunFolderBusy, match=rf"is in use: the grpolab process pid {held_by_another_process}"):
        Trainer(Config.build(tiny_args), **quiet)
    with pytest.raises(RunFolderBusy, match="is in use"):
        Trainer(Config.build(tiny_args), resume=True, **quiet)
    assert _tree(out) == before  # nothing written: the holder's lock file alone
    # the launcher of several ranks checks before it starts any
    assert main(["train", *TINY_CLI, "--nproc_per_node", "2", "--out", str(out)]) == 2
    assert _tree(out) == before


@posix_only
def test_ranks_other_than_0_take_no_lock(tiny_args, held_by_another_process):
    class OtherRank(Trainer):  # a rank of a multi-rank run (DistributedTrainer sets these): rank 0 holds the lock
        rank, world_size = 1, 2

    t = OtherRank(Config.build(tiny_args), **quiet)  # not refused, though another process holds the folder
    assert not t.run_lock.held and not t.run_lock.active
    assert holder_of(Path(tiny_args["out"]))["pid"] == held_by_another_process


@posix_only
def test_a_killed_holders_lock_is_taken_over(tiny_args, held_by_another_process):
    os.kill(held_by_another_process, signal.SIGKILL)
    _wait_for(lambda: holder_of(Path(tiny_args["out"])) is None, 30, "the kernel to drop the lock")
    logs = []
    t = Trainer(Config.build(tiny_args), log=logs.append)
    assert any(f"its last holder (pid {held_by_another_process}" in line and "ended without releasing" in line
               for line in logs)
    assert holder_of(Path(tiny_args["out"]))["pid"] == os.getpid()
    t.train(progress=False)
    assert [m["step"] for m in read_metrics(tiny_args["out"])] == [1, 2, 3, 4]


@posix_only
def test_in_one_process_a_new_trainer_takes_over_unless_the_old_one_trains(tiny_args):
    cfg = {**tiny_args, "steps": 2}
    first = Trainer(Config.build(cfg), **quiet)
    second = Trainer(Config.build(cfg), **quiet)  # a notebook cell run again: the idle first one gives it up
    assert second.run_lock.held and not first.run_lock.held
    with second.run_lock.training():
        with pytest.raises(RunFolderBusy, match="another trainer of this process, inside its train"):
            Trainer(Config.build(cfg), resume=True, **quiet)
    second.train(progress=False)
    assert not (Path(cfg["out"]) / LOCK).exists()


@posix_only
def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    lock = RunLock(tmp_path / "run")
    lock.acquire()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # a reward worker, a sandbox: forked while the lock is held
        os.write(write_end, b"x")  # (after the fork handlers ran)
        time.sleep(5)
        os._exit(0)
    try:
        assert os.read(read_end, 1) == b"x"
        assert holder_of(tmp_path / "run")["pid"] == os.getpid()
        os.close(lock.fd)  # the holder dies (its descriptor closes) while the child lives on
        lock.fd = None
        runlock._HELD.clear()
        assert holder_of(tmp_path / "run") is None  # the child's copy was closed at the fork
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_run_that_fails_before_writing_leaves_no_folder(tiny_args, monkeypatch):
    out = Path(tiny_args["out"]) / "deeper"
    cfg = Config.build({**tiny_args, "out": str(out)})

    def fails(self, cfg):
        assert (out / LOCK).exists()  # held while the model loads
        raise RuntimeError("the model cannot be loaded")
    monkeypatch.setattr(Trainer, "load_policy", fails)
    with pytest.raises(RuntimeError, match="cannot be loaded"):
        Trainer(cfg, **quiet)
    assert not out.parent.exists()  # the folders made to hold the lock are gone with it
    assert not runlock._HELD


# --------------------------------------------------------------------------------------- 2. a SIGKILLed trainer
@needs_proc
@pytest.mark.parametrize("through_a_shell", [False, True])
def test_a_trainer_killed_by_sigkill_ends_the_command_by_sigkill_with_one_message(tmp_path, through_a_shell):
    out = tmp_path / "run"
    shell = ["sh", "-c", '"$0" "$@"; echo "exit status $?"'] if through_a_shell else []
    proc = subprocess.Popen(shell + _cli("--steps", "100000", "--save_steps", "1", "--out", str(out)), env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for(lambda: read_metrics(out) or proc.poll() is not None, what="the first step")
        supervisor = _children(proc.pid)[0] if through_a_shell else proc.pid
        [trainer] = _children(supervisor)
        os.kill(trainer, signal.SIGKILL)  # what the kernel's out-of-memory killer sends
        stdout, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if through_a_shell:
        assert "exit status 137" in stdout  # 128 + 9
    else:
        assert proc.returncode == -signal.SIGKILL  # ended by SIGKILL, as a single process killed so
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("grpolab: error:")]
    assert len(lines) == 1 and len(err.strip().splitlines()) <= 12, err[-3000:]
    assert "killed by SIGKILL" in lines[0] and "out-of-memory killer" in lines[0]
    assert f"grpolab train --resume {out}" in lines[0]


# --------------------------------------------------------------------------------------- 3. a full disk
def _checksums(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _size_text(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _torch_full_disk() -> RuntimeError:
    """What torch 2.x's torch.save raises on a full disk (seen on a full tmpfs): the writer's enforce failure,
    raised while handling the stream error, neither naming the disk nor an errno."""
    try:
        raise RuntimeError("basic_ios::clear: iostream error")
    except RuntimeError:
        try:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        except RuntimeError as e:
            return e


def _save_fails_at(monkeypatch, module, step_dir: str, failure, before=None) -> None:
    """``module.torch.save`` raises ``failure(f)`` for a file of ``step_dir`` (after ``before()``, if given)."""
    real_save = module.torch.save

    def save(obj, f, *a, **k):
        if step_dir in str(f):
            if before is not None:
                before()
            raise failure(f)
        return real_save(obj, f, *a, **k)
    monkeypatch.setattr(module.torch, "save", save)


@pytest.mark.parametrize("failure", [
    lambda f: RuntimeError("[enforce fail at inline_container.cc:858] . PytorchStreamWriter failed writing file "
                           "data/3: file write failed: No space left on device"),
    lambda f: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f)),
    lambda f: _torch_full_disk(),
], ids=["enforce_fail_no_space", "errno_28", "torch_unexpected_pos"])
def test_a_full_disk_during_a_checkpoint_is_one_sentence_and_keeps_the_previous_one(tiny_args, monkeypatch,
                                                                                     failure):
    out = Path(tiny_args["out"])
    kept: dict = {}
    _save_fails_at(monkeypatch, ckpt, "step_000004", failure,
                   before=lambda: kept.update(_checksums(out / "checkpoints" / "step_000002")))
    usage = rundir.shutil.disk_usage
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: usage(p)._replace(free=200_000))  # 200 kB left
    logs = []
    Trainer(Config.build(tiny_args), log=logs.append).train(progress=False)  # checkpoints at 2 and 4
    previous = out / "checkpoints" / "step_000002"
    need = sum(p.stat().st_size for p in previous.rglob("*") if p.is_file())
    lines = [line for line in logs if "step_000004" in line]
    assert len(lines) == 1, logs
    line = lines[0]
    assert f"checkpoint step_000004 could not be written to {out / 'checkpoints'}" in line
    assert "No space left on device" in line and "200 kB free on the file system of" in line
    assert f"about {_size_text(need)} needed" in line
    assert f"`grpolab train --resume {out}`" in line and "step_000002, intact" in line
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000002"]  # no step_000004.tmp
    assert _checksums(previous) == kept  # the previous checkpoint, byte for byte
    monkeypatch.undo()
    t = Trainer(Config.build({**tiny_args, "steps": 5}), resume=True, **quiet)
    assert t.step == 2


def test_a_full_disk_at_a_checkpoint_is_no_traceback_on_the_command_line(tiny_args, monkeypatch, capsys):
    out = tiny_args["out"]
    _save_fails_at(monkeypatch, ckpt, "step_000001", lambda f: _torch_full_disk())
    usage = rundir.shutil.disk_usage
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: usage(p)._replace(free=0))
    assert main(["train", *TINY_CLI, "--steps", "2", "--save_steps", "1", "--out", out]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "enforce fail at inline_container.cc" in err  # quoted in the sentence
    assert "checkpoint step_000001 could not be written" in err and "No space left on device" in err
    assert f"`grpolab train --resume {out}` from step 0: it has no checkpoint yet" in err


# --------------------------------------------------------------------------------------- 4. resuming an API run
API_SCRIPT = textwrap.dedent('''
    import sys
    from grpolab import GRPOConfig, GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(6 - len(c)) for c in completions]

    dataset = [{"prompt": f"What is {a} + {b}?"} for a in range(6) for b in range(4)]
    args = GRPOConfig(output_dir=sys.argv[1], per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, max_steps=int(sys.argv[2]), save_steps=2, logging_steps=1,
                      report_to="none", disable_tqdm=True)
    trainer = GRPOTrainer(model="tiny", reward_funcs=[reward_len], args=args, train_dataset=dataset)
    if sys.argv[3] == "resume":
        result = RESUME_CALL
    else:
        result = trainer.train()
    print("global_step", result.global_step)
''')


def _resume_call() -> str:
    """The resume call docs/python_api.md gives, from its 'Resuming a run' section."""
    text = (ROOT / "docs" / "python_api.md").read_text()
    section = text.split("## Resuming a run", 1)[1].split("\n## ", 1)[0]
    calls = {line.split("#")[0].strip() for block in section.split("```python")[1:]
             for line in block.split("```")[0].splitlines() if "resume_from_checkpoint" in line}
    assert calls == {"trainer.train(resume_from_checkpoint=True)"}, calls
    return calls.pop()


def test_the_documented_resume_of_a_python_api_run_works(tmp_path, capsys):
    call = _resume_call()
    script = tmp_path / "train.py"
    script.write_text(API_SCRIPT.replace("RESUME_CALL", call))
    out = tmp_path / "api_run"

    def run(*args):
        return subprocess.run([sys.executable, str(script), str(out), *args], env=ENV, capture_output=True,
                              text=True, timeout=300, cwd=tmp_path)
    first = run("2", "train")
    assert first.returncode == 0 and "global_step 2" in first.stdout, first.stderr[-3000:]
    again = run("4", "train")  # the script run again as it was: refused, naming the call that continues it
    assert again.returncode != 0 and call in again.stderr and "already holds a run" in again.stderr
    capsys.readouterr()
    rc = main(["train", "--resume", str(out)])  # refused before any trainer starts: in this process
    err = capsys.readouterr().err
    assert rc == 2 and "started from the Python API" in err and call in err
    assert "--data needs at least one --reward" not in err
    resumed = run("4", "resume")
    assert resumed.returncode == 0 and "global_step 4" in resumed.stdout, resumed.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'step_000002'} at step 2" in resumed.stderr
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3, 4]


def _api_run(out: Path, steps: int, resume=None, **fields):
    from grpolab import GRPOConfig, GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(6 - len(c)) for c in completions]
    dataset = [{"prompt": f"What is {a} + {b}?"} for a in range(6) for b in range(4)]
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, max_steps=steps, save_steps=2, report_to="none", disable_tqdm=True,
                      learning_rate=3e-3, **fields)
    trainer = GRPOTrainer(model="tiny", reward_funcs=[reward_len], args=args, train_dataset=dataset)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_a_resumed_python_api_run_is_the_uninterrupted_run(tmp_path):
    straight = _api_run(tmp_path / "a", 4, lr_scheduler_type="constant")
    _api_run(tmp_path / "b", 2, lr_scheduler_type="constant")
    resumed = _api_run(tmp_path / "b", 4, resume=True, lr_scheduler_type="constant")
    assert resumed.trainer.step == 4
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [m["loss"] for m in a] == [m["loss"] for m in b]
    with pytest.raises(Exception, match="would change what the run"):  # another setting: refused, as the CLI
        _api_run(tmp_path / "b", 6, resume=True, lr_scheduler_type="constant", beta=0.1)
    assert [m["step"] for m in read_metrics(tmp_path / "b")] == [1, 2, 3, 4]


# --------------------------------------------------------------------------------------- 5. a step that keeps no group
def test_the_default_job_uses_dynamic_sampling():
    from grpolab.cli import task_run_defaults
    assert task_run_defaults({})["dynamic_sampling"] is True  # `grpolab train` with no options (the README)


def _no_group_on_step_1(t: Trainer) -> None:
    """Step 1's groups all constant (dynamic sampling keeps none, the step is skipped); later steps' rewards
    0, 1, 0, 1, ... within every group (all kept)."""
    real_score = t.scorer.score

    def score(batch):
        errors = real_score(batch)
        within = torch.zeros(batch.rewards.shape[0], dtype=batch.rewards.dtype)  # each row's place in its group
        for g in torch.unique(batch.group_ids):
            rows = (batch.group_ids == g).nonzero().squeeze(-1)
            within[rows] = torch.arange(len(rows), dtype=within.dtype)
        batch.rewards[:] = 1.0 if t.step == 0 else (within % 2)[:, None].expand_as(batch.rewards)
        return errors
    t.scorer.score = score


def _zero_keep_args(tiny_args, out: Path) -> dict:
    return {**tiny_args, "out": str(out), "steps": 3, "save_steps": 100, "dynamic_sampling": True,
            "dynamic_sampling_max_rounds": 2, "lr_scheduler_type": "linear", "learning_rate": 3e-3}


def _lrs_of_updates(t: Trainer) -> list[float]:
    lrs: list[float] = []
    t.optimizer.register_step_pre_hook(lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"]))
    return lrs


def test_a_first_step_that_keeps_no_group(tiny_args, tmp_path, capsys):
    logs = []
    t = Trainer(Config.build(_zero_keep_args(tiny_args, tmp_path / "a")), log=logs.append)
    _no_group_on_step_1(t)
    lrs = _lrs_of_updates(t)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.train(progress=True)
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    rows = read_metrics(tmp_path / "a")
    assert [r["skipped"] for r in rows] == [1, 0, 0] and rows[0]["dynamic_sampling/kept_groups"] == 0
    # linear schedule over 3 steps, lambda(k) = 1 - k / 3 at the k-th update: the skipped step made none
    assert lrs == pytest.approx([3e-3, 3e-3 * (1 - 1 / 3)], rel=1e-12)
    assert t.scheduler.last_epoch == 2 and t.optimizer_updates == 2
    err = capsys.readouterr().err
    assert "reward=0 groups kept" in err and "nan" not in err
    assert any("kept 0 of 4 groups" in line and "the step is skipped" in line  # (repeat's accuracy: match)
               and f"{t.accuracy_reward} was the same for every completion (mean {t.accuracy_reward} 1.000)" in line
               for line in logs)
    assert progress_fields(rows[0])["reward"] == "0 groups kept"


def test_a_run_resumed_after_a_step_that_kept_no_group_is_the_uninterrupted_run(tiny_args, tmp_path):
    straight = Trainer(Config.build(_zero_keep_args(tiny_args, tmp_path / "a")), **quiet)
    _no_group_on_step_1(straight)
    lrs_a = _lrs_of_updates(straight)
    straight.train(progress=False)

    first = Trainer(Config.build(_zero_keep_args(tiny_args, tmp_path / "b")), **quiet)
    _no_group_on_step_1(first)
    lrs_b = _lrs_of_updates(first)
    assert first.train_step()["skipped"] == 1 and first.train_step()["skipped"] == 0
    first.save()  # the run stops after step 2
    resumed = Trainer(Config.build(_zero_keep_args(tiny_args, tmp_path / "b")), resume=True, **quiet)
    assert resumed.step == 2 and resumed.scheduler.last_epoch == 1  # one update before the checkpoint
    _no_group_on_step_1(resumed)
    lrs_resumed = _lrs_of_updates(resumed)
    resumed.train(progress=False)
    assert lrs_b + lrs_resumed == lrs_a == pytest.approx([3e-3, 2e-3], rel=1e-12)
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name


def test_a_full_disk_during_a_distributed_checkpoint_is_the_same_sentence(tiny_args, monkeypatch):
    """The DCP writer of a torch.distributed run (here its one-process form): every rank agrees the checkpoint
    failed, step_N.tmp is removed, the previous checkpoint stays, one warning line, the run goes on."""
    from grpolab.distributed import checkpoint as dckpt
    from grpolab.distributed.trainer import DistributedTrainer

    out = Path(tiny_args["out"])
    _save_fails_at(monkeypatch, dckpt, "step_000004", lambda f: _torch_full_disk())
    usage = rundir.shutil.disk_usage
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: usage(p)._replace(free=0))
    logs = []
    DistributedTrainer(Config.build(tiny_args), log=logs.append).train(progress=False)
    lines = [line for line in logs if "step_000004" in line]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "about" in lines[0], logs
    assert f"`grpolab train --resume {out}`" in lines[0] and "step_000002, intact" in lines[0]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000002"]
    assert dckpt.is_dcp(out / "checkpoints" / "step_000002")
