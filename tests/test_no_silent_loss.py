"""No user file lost, no silent success (issue 22, section 2).

Each test reproduces a probe of the issue and failed on the code before the fix: ``--overwrite`` replacing and
deleting a user's files, a reward calling ``os._exit(0)`` ending the run with exit code 0, a hanging reward with
nothing on screen, a reward's dict / NaN / string / huge-int values scored or not counted as its errors, a full
disk ending the run with a raw traceback and leaving ``step_*.tmp``.
"""
import errno
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from grpolab.cli import main
from grpolab.config import Config, ConfigError
from grpolab.rewards import scoring
from grpolab.rewards.scoring import RewardFn, RewardScorer
from grpolab.train import checkpoint as ckpt
from grpolab.train import metrics as metrics_mod
from grpolab.train.metrics import read_metrics
from grpolab.train.rundir import MARKER
from grpolab.train.trainer import Trainer

quiet = {"log": lambda *a: None}
TINY_CLI = ["--model", "tiny", "--task", "repeat", "--num_generations", "2", "--prompts_per_step", "2",
            "--max_completion_length", "3", "--eval_before", "false", "--eval_after", "false",
            "--tensorboard", "false", "--quiet"]


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder``: relative path -> text."""
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------- 1. --overwrite and a user's files
def _users_folder(tmp_path: Path) -> Path:
    out = tmp_path / "my_project"
    for name in ("checkpoints", "final", "tensorboard"):
        (out / name).mkdir(parents=True)
        (out / name / "mine.txt").write_text(f"my {name} notes\n")
    (out / "metrics.jsonl").write_text('{"step": 1, "my_metric": 0.5}\n')
    (out / "notes.txt").write_text("keep me\n")
    return out


def test_overwrite_refuses_a_folder_whose_files_a_run_would_replace(tmp_path, capsys):
    out = _users_folder(tmp_path)
    before = _tree(out)
    argv = ["train", *TINY_CLI, "--steps", "1", "--out", str(out), "--overwrite", "--tensorboard", "true"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    for name in ("metrics.jsonl", "checkpoints/", "final/", "tensorboard/"):
        assert name in err
    assert "notes.txt" not in err and "another --out" in err
    assert _tree(out) == before  # nothing replaced, merged or deleted
    with pytest.raises(ConfigError, match="did not write"):  # the Python path: the same rule
        Trainer(Config.build({"model": "tiny", "task": "repeat", "out": str(out)}), overwrite=True, **quiet)
    assert _tree(out) == before


def test_overwrite_deletes_only_what_grpolab_wrote(tiny_args, tmp_path):
    out = tmp_path / "shared_folder"
    (out / "data").mkdir(parents=True)
    (out / "data" / "rows.jsonl").write_text("{}\n")
    (out / "notes.txt").write_text("keep me\n")
    args = {**tiny_args, "steps": 2, "out": str(out)}
    Trainer(Config.build(args), overwrite=True, **quiet).train(progress=False)  # a run next to the user's files
    manifest = json.loads((out / MARKER).read_text())
    assert {"metrics.jsonl", "checkpoints", "final", "config.yaml"} <= set(manifest["owned"])
    assert "tensorboard" not in manifest["owned"] and "notes.txt" not in manifest["owned"]
    (out / "tensorboard").mkdir()  # the user's own folder, made after the run (which had no tensorboard)
    (out / "tensorboard" / "mine.txt").write_text("mine\n")
    with pytest.raises(ConfigError, match="holds tensorboard/, which grpolab did not write"):
        Trainer(Config.build({**args, "tensorboard": True}), overwrite=True, **quiet)  # would write into it
    assert read_metrics(out)
    (out / "final" / "extra.bin").write_text("x")  # inside a folder the run created: the run's
    t = Trainer(Config.build(args), overwrite=True, **quiet)
    assert not (out / "metrics.jsonl").exists() and not (out / "final").exists()
    t.train(progress=False)
    assert (out / "notes.txt").read_text() == "keep me\n" and (out / "data" / "rows.jsonl").exists()
    assert (out / "tensorboard" / "mine.txt").read_text() == "mine\n"
    assert [m["step"] for m in read_metrics(out)] == [1, 2]


# ------------------------------------------------------------------------------- 2. no silent success
EXIT_REWARD = """
    import os
    calls = []
    def exits(prompts, completions, **kw):
        calls.append(1)
        if len(calls) == 3:
            os._exit(0)
        return [1.0] * len(prompts)
    """


def _cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grpolab", "train", *TINY_CLI, "--save_steps", "1", "--threads", "1",
            "--out", str(out), *extra]


def test_os_exit_in_a_reward_never_exits_0(tmp_path):
    (tmp_path / "exiting_rewards.py").write_text(textwrap.dedent(EXIT_REWARD))
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(_cli(out, "--steps", "5", "--reward", "exiting_rewards:exits"), env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert "os._exit" in proc.stderr and f"grpolab train --resume {out}" in proc.stderr
    assert not (out / "summary.json").exists() and [m["step"] for m in read_metrics(out)] == [1, 2]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc to find the training process")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_reach_the_training_process(tmp_path, sig):
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # no terminal: signals are sent by pid. SIGINT as a terminal's foreground job has it: a suite started in the
    # background of a non-interactive shell (`make test &`) ignores SIGINT, and children inherit that, so the
    # trainer would never see its KeyboardInterrupt (seen: the test failed only when the suite ran as such a job)
    proc = subprocess.Popen(_cli(out, "--steps", "100000"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while time.time() < deadline and not read_metrics(out):
        time.sleep(0.05)
    children = _children(proc.pid)
    assert len(children) == 1  # the training process
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert not Path(f"/proc/{children[0]}").exists()
    if sig == signal.SIGTERM:
        assert proc.returncode == -sig  # ended by that signal, as a single process is
    else:  # the trainer's KeyboardInterrupt, as in a single process (its exit code: 1)
        assert "KeyboardInterrupt" in err and proc.returncode == 1
    assert len(read_metrics(out)) < 100000


LOST_INTERRUPT_REWARD = """
    import os, signal, time
    calls = []
    class Collected:
        def __del__(self):  # the SIGINT's KeyboardInterrupt is raised here, where Python ignores it
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    def ctrl_c_in_a_del(prompts, completions, **kw):
        calls.append(1)
        if len(calls) == 2:
            Collected()
        return [1.0] * len(prompts)
    """


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="sends itself SIGINT")
def test_a_ctrl_c_python_loses_in_a_del_still_stops_the_run(tiny_args, tmp_path, monkeypatch):
    # seen in CI: a SIGINT that landed in regex's Group.__del__ during a reward printed "Exception ignored" and
    # the run trained on; now the loop raises KeyboardInterrupt at the end of that step
    (tmp_path / "lost_interrupt.py").write_text(textwrap.dedent(LOST_INTERRUPT_REWARD))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("lost_interrupt", None)
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: ignored.append(u.exc_type))  # "Exception ignored in"
    # the protection applies where Python's own SIGINT handler is in place (a user's handler is left alone). Seen
    # once in a full suite run (2026-12-03): the run trained on ("DID NOT RAISE"), not reproduced in 12 runs
    # alone or 2 more suites, where a probe found no test leaving another handler; another handler in place is
    # the one explanation found, so the test starts from Python's own and puts back what was there
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        t = Trainer(Config.build({**tiny_args, "steps": 6, "save_steps": 1, "reward_timeout": 0,
                                     "reward": ["lost_interrupt:ctrl_c_in_a_del"]}),  # a reward in the main thread
                    **quiet)
        with pytest.raises(KeyboardInterrupt, match="lost"):
            t.train(progress=False)
        assert ignored == [KeyboardInterrupt]  # Python did swallow the first one
        assert t.step == 2 and [m["step"] for m in read_metrics(tmp_path / "run")] == [1]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, previous)


# ------------------------------------------------------------------------------- 3. a slow or hanging reward
def test_reward_timeout_has_a_finite_default():
    assert 0 < Config().reward_timeout < math.inf
    assert Config().reward_timeout == 300


@pytest.mark.parametrize("timeout", [0.0, 5.0])
def test_a_slow_reward_is_named_on_screen_before_the_timeout(monkeypatch, timeout):
    monkeypatch.setattr(scoring, "SLOW_REWARD_S", 0.3)

    def slow(prompts, completions, **kw):
        time.sleep(1.0)
        return [1.0] * len(prompts)
    logs = []
    scorer = RewardScorer([RewardFn("slow", slow)], log=logs.append, timeout=timeout)
    m, errors = scorer.score(["p"] * 2, ["c"] * 2, [[1], [2]], {})
    assert errors == 0 and m[:, 0].tolist() == [1.0, 1.0]
    slow_lines = [line for line in logs if "'slow'" in line and "still running" in line]
    assert len(slow_lines) == 1
    assert ("reward_timeout=5" in slow_lines[0]) == (timeout > 0)


# ------------------------------------------------------------------------------- 4. what a reward returns
@pytest.mark.parametrize("value,why", [({0: 1.0, 1: 1.0}, "a dict"), ({1.0, 2.0}, "a set"), ("11", "a str"),
                                       (3.0, "a float"), ((x for x in [1.0, 1.0]), "a generator")])
def test_a_reward_that_returns_no_list_is_that_rewards_error(value, why):
    logs = []
    scorer = RewardScorer([RewardFn("odd", lambda **kw: value)], log=logs.append)
    m, errors = scorer.score(["p"] * 2, ["c"] * 2, [[1], [2]], {})
    assert errors == 1 and m.isnan().all()
    assert any("'odd'" in line and why in line for line in logs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 10 ** 400, "1.0", b"1", [1.0],
                                 {"a": 1}, object(), torch.tensor([1.0, 2.0])])
def test_values_that_are_not_numbers_are_that_rewards_errors(bad):
    logs = []
    scorer = RewardScorer([RewardFn("bad_values", lambda **kw: [0.5, bad, 1.0])], log=logs.append)
    m, errors = scorer.score(["p"] * 3, ["c"] * 3, [[1], [2], [3]], {})
    assert errors == 1
    assert m[0, 0] == 0.5 and math.isnan(m[1, 0]) and m[2, 0] == 1.0
    assert any("'bad_values'" in line and "completion 2" in line for line in logs)


def test_numbers_of_every_kind_and_none_are_accepted():
    values = [1, 0.25, True, None, np.float32(0.5), np.int64(2), np.bool_(False), torch.tensor(0.75),
              torch.tensor([1.5])]
    logs = []
    scorer = RewardScorer([RewardFn("fine", lambda **kw: values)], log=logs.append)
    m, errors = scorer.score(["p"] * 9, ["c"] * 9, [[1]] * 9, {})
    assert errors == 0 and not logs
    got = m[:, 0].tolist()
    assert got[:3] + got[4:] == [1.0, 0.25, 1.0, 0.5, 2.0, 0.0, 0.75, 1.5] and math.isnan(got[3])
    scorer = RewardScorer([RewardFn("as_array", lambda **kw: np.array([1.0, 0.0]))], log=logs.append)
    assert scorer.score(["p"] * 2, ["c"] * 2, [[1]] * 2, {})[0][:, 0].tolist() == [1.0, 0.0]


def test_nan_from_a_reward_counts_in_reward_errors_of_the_run(tiny_args, tmp_path, monkeypatch):
    (tmp_path / "nan_rewards.py").write_text("def half_nan(prompts, completions, **kw):\n"
                                             "    return [float('nan') if i % 2 else 1.0 for i in range(len(prompts))]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("nan_rewards", None)
    logs = []
    t = Trainer(Config.build({**tiny_args, "steps": 1, "reward": ["nan_rewards:half_nan"]}), log=logs.append)
    m = t.train_step()
    assert m["reward_errors"] == 1 and m["rewards/half_nan/unscorable"] == 8
    assert any("'half_nan'" in line and "NaN" in line for line in logs)


# ------------------------------------------------------------------------------- 5. a full disk
def _disk_full(path):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_checkpoint_that_does_not_fit_is_skipped_and_the_run_goes_on(tiny_args, monkeypatch):
    out = Path(tiny_args["out"])
    real_save = ckpt.torch.save

    def save(obj, f, *a, **k):
        if "step_000002" in str(f):
            raise _disk_full(f)
        return real_save(obj, f, *a, **k)
    monkeypatch.setattr(ckpt.torch, "save", save)
    real_append = metrics_mod.append_line

    def append(path, record):
        if record.get("step") == 3 and Path(path).name == "metrics.jsonl":
            with open(path, "a") as fh:
                fh.write('{"step": 3, "cut')  # the part that fitted
            raise _disk_full(path)
        return real_append(path, record)
    monkeypatch.setattr(metrics_mod, "append_line", append)
    logs = []
    Trainer(Config.build(tiny_args), log=logs.append).train(progress=False)  # 4 steps, checkpoints at 2 and 4
    assert (out / "summary.json").exists() and (out / "final").is_dir()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000004"]  # no step_000002.tmp left
    assert any("step_000002" in line and str(out / "checkpoints") in line and "No space left" in line
               for line in logs)
    assert any("metrics.jsonl" in line and "No space left" in line for line in logs)
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 4]  # the cut line was taken back
    monkeypatch.undo()
    t = Trainer(Config.build({**tiny_args, "steps": 6}), resume=True, **quiet)
    assert t.step == 4
    t.train(progress=False)
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 4, 5, 6]


def test_a_weights_file_that_does_not_fit_leaves_the_previous_checkpoint(tiny_args, monkeypatch):
    out = Path(tiny_args["out"])
    real = ckpt.save_file

    def save_file(tensors, filename, *a, **k):
        if "step_000004" in str(filename):
            raise _disk_full(filename)
        return real(tensors, filename, *a, **k)
    monkeypatch.setattr(ckpt, "save_file", save_file)
    logs = []
    Trainer(Config.build(tiny_args), log=logs.append).train(progress=False)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000002"]
    assert any("step_000004" in line and "skipped" in line for line in logs)
    monkeypatch.undo()
    t = Trainer(Config.build(tiny_args), resume=True, **quiet)
    assert t.step == 2
    t.train(progress=False)
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3, 4]


def test_a_final_model_that_does_not_fit_is_a_clear_error(tiny_args, monkeypatch, capsys):
    import grpolab.model.loading as trainer_mod  # the causal LM policy's save (policies/causal_lm/policy.py) calls it

    def save_policy(model, tok, folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_text("cut")
        raise _disk_full(Path(folder) / "model.safetensors")
    monkeypatch.setattr(trainer_mod, "save_policy", save_policy)
    out = tiny_args["out"]
    rc = main(["train", *TINY_CLI, "--steps", "2", "--save_steps", "2", "--out", out])
    err = capsys.readouterr().err
    assert rc == 1 and "No space left" in err and str(Path(out) / "final") in err
    assert f"grpolab train --resume {out}" in err and "Traceback" not in err
    assert not (Path(out) / "final").exists() and not (Path(out) / "summary.json").exists()
