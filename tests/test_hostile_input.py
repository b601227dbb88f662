"""Hostile and careless input (issue 16, sections 3 and 4): untrusted code never runs in the training process,
and nothing a user already has is lost.

Each test reproduces a probe of the issue; each failed on the code before the fix.
"""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from grpolab.cli import main
from grpolab.config import Config, ConfigError
from grpolab.train import checkpoint as ckpt
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

TIMING = {"rollout_s", "train_s", "tokens_per_s", "peak_rss_mb", "train_seconds_total"}
quiet = {"log": lambda *a: None}

reasoning_gym = pytest.importorskip("reasoning_gym")


def _payload(target: Path) -> str:
    """One line of Python that writes ``target`` when a scorer evaluates it."""
    return f"__import__('pathlib').Path({str(target)!r}).write_text('pwned')"


# every one of these reasoning-gym scorers evaluates the answer as Python (read their score_answer):
# spiral_matrix / string_insertion / n_queens: eval(answer) after the exact-match check fails;
# polynomial_multiplication / simple_integration: sympy.parse_expr(answer), which evals the expression
EVAL_SCORERS = ["spiral_matrix", "string_insertion", "n_queens", "polynomial_multiplication", "simple_integration"]


def _rg_task(name, **opts):
    from grpolab.tasks import get_task

    cfg = Config.build({"task": f"rg:{name}", "rg_train_size": 6, "rg_eval_size": 3, **opts})
    task = get_task(cfg.task, cfg=cfg)
    return task, dict((n, f) for n, f, _ in task.rewards)["rg_score"]


def _score(fn, rows, answers):
    completions = [[{"role": "assistant", "content": f"Let me think.\nAnswer: {a}"}] for a in answers]
    return fn(prompts=[r["prompt"] for r in rows], completions=completions,
              rg_entry=[r["rg_entry"] for r in rows], rg_split=[r["rg_split"] for r in rows])


# ----------------------------------------------------------------------------------- 3. untrusted code: rg:
@pytest.mark.parametrize("name", EVAL_SCORERS)
def test_crafted_rg_answer_writes_nothing(name, tmp_path):
    task, rg_score = _rg_task(name)
    row = task.train_rows[0]
    # the exploit is real: reasoning-gym's own scorer, run unsandboxed (in a throw-away process), writes the file
    control = tmp_path / "control"
    script = (f"import reasoning_gym as rg, json; ds = rg.create_dataset({name!r}, size=6, seed=1234); "
              f"ds.score_answer({_payload(control)!r}, json.loads({json.dumps(row['rg_entry'], default=str)!r}))")
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=120)
    assert control.exists(), "the crafted answer should write when scored without the sandbox"
    # through grpolab: scored in the sandbox, nothing is written and the answer simply scores 0
    target = tmp_path / f"pwned_{name}"
    assert _score(rg_score, [row], [_payload(target)]) == [0.0]
    assert not target.exists()
    assert not (Path.cwd() / f"pwned_{name}").exists()


@pytest.mark.parametrize("name,mode", [(n, "call") for n in EVAL_SCORERS + ["chain_sum"]]
                         + [("string_insertion", "item"), ("polynomial_multiplication", "item")])
def test_rg_scores_of_normal_answers_are_unchanged(name, mode):
    task, rg_score = _rg_task(name, rg_sandbox=mode)
    rows = task.train_rows[:3] + task.eval_rows[:2]
    answers = [r["answer"] for r in rows] + ["7", "x**2", "[1, 2]"]
    rows = rows + rows[:3]
    from grpolab.tasks.gym import extract_answer
    ds = {s: reasoning_gym.create_dataset(name, size=n, seed=seed)
          for s, n, seed in [("train", 6, 1234), ("eval", 3, 1240)]}
    expected = [float(ds[r["rg_split"]].score_answer(extract_answer(f"Answer: {a}"), r["rg_entry"]))
                for r, a in zip(rows, answers)]  # benign answers: safe to score in-process here
    assert _score(rg_score, rows, answers) == expected
    assert expected[0] == 1.0 or name == "n_queens"  # an n_queens answer is a board of several lines


def test_rg_answer_that_hangs_scores_zero_within_the_timeout():
    task, rg_score = _rg_task("string_insertion", rg_score_timeout=2.0)
    rows = task.train_rows[:3]
    t0 = time.perf_counter()
    # eval of 9**9**9**9 never finishes: the call times out, then each answer is retried in its own child
    assert _score(rg_score, rows, [rows[0]["answer"], "9**9**9**9", rows[2]["answer"]]) == [1.0, 0.0, 1.0]
    assert time.perf_counter() - t0 < 20


# ------------------------------------------------------------------------------- 3. the sandbox itself
def test_sandbox_runs_code_with_limits_and_captures_output(tmp_path):
    from grpolab.sandbox import Limits, Sandbox

    outside = tmp_path / "outside.txt"
    with Sandbox(limits=Limits(cpu_s=2, wall_s=3, memory_mb=1024)) as box:
        r = box.run_python("import os\nprint(6 * 7)\nopen('scratch.txt', 'w').write('ok')\n"
                           "print(open('scratch.txt').read(), os.getcwd() != %r)" % os.getcwd())
        assert r.ok and r.stdout == "42\nok True\n"
        for source in [f"open({str(outside)!r}, 'w').write('x')",
                       f"import os; os.system('touch {outside}')",
                       f"import subprocess; subprocess.run(['touch', {str(outside)!r}])",
                       "import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)",
                       "import os; os.kill(os.getppid(), 9)"]:
            r = box.run_python(source)
            assert not r.ok and "not allowed" in r.error, (source, r)
        assert not outside.exists()
        r = box.run_python("while True: pass", limits=Limits(cpu_s=1, wall_s=60))
        assert not r.ok and not r.timed_out and "CPU limit" in r.error
        r = box.run_python("import time; time.sleep(60)", limits=Limits(cpu_s=60, wall_s=1))
        assert not r.ok and r.timed_out and r.error.startswith("timeout") and r.seconds < 30
        r = box.run_python("x = bytearray(4 * 1024 ** 3)")
        assert not r.ok and "MemoryError" in r.error
        r = box.run_python("import sys; print('bye'); sys.exit(3)")
        assert not r.ok and "SystemExit" in r.error and r.stdout == "bye\n"
        r = box.run_python("import os; os._exit(5)")
        assert not r.ok and "exit status 5" in r.error
        assert box.run_python("print('still alive')").stdout == "still alive\n"  # the worker survived all that


def test_sandbox_kernel_layers_hold_without_the_audit_hook(tmp_path):
    """Landlock and the network namespace alone (where the kernel has them) stop writes and connections."""
    from grpolab.sandbox import Limits, Sandbox

    outside = tmp_path / "outside.txt"
    with Sandbox(limits=Limits(wall_s=5), audit_hook=False) as box:
        r = box.run_python(f"import os; os.system('touch {outside}'); open({str(outside)!r}, 'w')")
        iso = box.isolation
        if iso["filesystem"] == "landlock":  # refused (Landlock), or not even there (the jail's own view)
            assert not r.ok and ("PermissionError" in r.error or "FileNotFoundError" in r.error), r
            assert not outside.exists()
        if iso["network"] == "netns":
            r = box.run_python("import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)")
            assert not r.ok and any(w in r.error for w in ("unreachable", "OSError", "PermissionError")), r
    if iso["filesystem"] != "landlock" or iso["network"] != "netns":
        pytest.skip(f"kernel isolation on this machine: {iso}")


def test_sandbox_result_is_json_never_unpickled():
    from grpolab.sandbox import Sandbox

    with Sandbox() as box:
        r = box.call(eval, "object()")  # a value that is not JSON
        assert not r.ok and "JSON" in r.error


# ------------------------------------------------------------------------------- 3. untrusted checkpoints
def _two_step_run(tiny_args, **kw):
    args = {**tiny_args, "steps": 2, "save_steps": 2, **kw}
    Trainer(Config.build(args), **quiet).train(progress=False)
    return Path(args["out"])


class _Evil:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (exec, (f"open({self.target!r}, 'w').write('pwned')",))


def test_crafted_checkpoint_pickle_is_refused(tiny_args, tmp_path, capsys):
    out = _two_step_run(tiny_args)
    target = tmp_path / "pwned_by_checkpoint"
    state = ckpt.latest_checkpoint(out) / "state.pt"
    torch.save({"optimizer": _Evil(target), "step": 2}, state)
    rc = main(["train", "--resume", str(out), "--steps", "3", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "refused to load" in err and "state.pt" in err
    _assert_security_refusal(err, "exec")
    assert not target.exists()
    from grpolab.errors import CheckpointError
    with pytest.raises(CheckpointError, match="refused"):
        ckpt.read_state(state.parent)
    assert not target.exists()


def _assert_security_refusal(err: str, refused: str) -> None:
    """Issue 23: a security refusal is one clean line that says what was refused and never the unsafe way round."""
    lines = [ln for ln in err.splitlines() if ln.startswith("grpolab: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert f"refused {refused}" in line or f"'{refused}'" in line or f" {refused} " in line, line
    for unsafe in ("weights_only=False", "weights_only` set to `False", "add_safe_globals", "safe_globals(",
                   "can still be loaded", "\x1b["):
        assert unsafe not in err, (unsafe, err)


def test_crafted_model_pickle_is_refused_in_one_line(tiny_args, tmp_path, capsys):
    """``grpolab eval --model`` on a folder whose weights are a crafted pickle: exit 2, one line naming the file
    and what the unpickler refused (it was a 30-line traceback ending in PyTorch's weights_only=False advice)."""
    out = _two_step_run(tiny_args)
    target = tmp_path / "pwned_by_model"
    final = out / "final"
    for f in final.glob("*.safetensors"):
        f.unlink()
    torch.save({"model.embed_tokens.weight": _Evil(target)}, final / "pytorch_model.bin")
    capsys.readouterr()
    rc = main(["eval", "--model", str(final)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "pytorch_model.bin" in err and "refused" in err
    _assert_security_refusal(err, "exec")
    assert not target.exists()


def test_checkpoint_state_round_trips_without_pickled_objects(tmp_path):
    import numpy as np
    from grpolab.batch import RolloutBatch

    z = torch.zeros(2, 4)
    batch = RolloutBatch(prompt_ids=torch.ones(2, 3, dtype=torch.long), prompt_mask=torch.ones(2, 3),
                         completion_ids=torch.zeros(2, 4, dtype=torch.long), completion_mask=torch.ones(2, 4),
                         behavior_logprobs=z, group_ids=torch.tensor([0, 0]), prompt_uids=torch.tensor([5, 5]),
                         truncated=torch.tensor([False, True]), columns={"answer": ["1", "2"]})
    state = {"numpy": np.random.get_state(), "python": __import__("random").getstate(), "seen": {3, 1},
             "arr": np.arange(5, dtype=np.float32), "by_id": {4: (1, 2.5)}, "t": torch.arange(3),
             "np_int": np.int64(7), "buffer": [batch]}
    torch.save({"format": ckpt.FORMAT, "state": ckpt.encode_state(state)}, tmp_path / "state.pt")
    back = ckpt.read_state(tmp_path)  # torch.load(weights_only=True) with no extra globals allowed
    assert back["numpy"][0] == "MT19937" and np.array_equal(back["numpy"][1], state["numpy"][1])
    assert back["numpy"][1].dtype == state["numpy"][1].dtype
    np.random.set_state(back["numpy"])
    assert back["python"] == state["python"] and back["seen"] == {1, 3} and back["by_id"] == {4: (1, 2.5)}
    assert back["arr"].dtype == np.float32 and np.array_equal(back["arr"], state["arr"]) and back["np_int"] == 7
    b = back["buffer"][0]
    assert isinstance(b, RolloutBatch) and b.columns == {"answer": ["1", "2"]} and b.truncated.tolist() == [0, 1]
    assert torch.equal(b.token_origin, batch.token_origin) and b.reward_names == []
    with pytest.raises(TypeError, match="cannot be checkpointed"):
        ckpt.encode_state({"x": object()})


def test_a_checkpoint_naming_a_dataclass_in_its_old_module_still_decodes(tmp_path):
    """Issue 40 moved modules (e.g. grpolab.vision.scenes -> grpolab.policies.vision_language.scenes); a checkpoint
    written before names the old module, and decoding it rebuilds the class from its new home."""
    import numpy as np

    from grpolab.policies.vision_language.scenes import shapes_scene

    scene = shapes_scene(3)
    enc = ckpt.encode_state({"scene": scene})
    assert enc["scene"]["class"] == "grpolab.policies.vision_language.scenes:Scene"
    enc["scene"]["class"] = "grpolab.vision.scenes:Scene"  # as the checkpoint of 2026-12-06 wrote it
    torch.save({"format": ckpt.FORMAT, "state": enc}, tmp_path / "state.pt")
    back = ckpt.read_state(tmp_path)["scene"]
    assert type(back) is type(scene) and back.target == scene.target and np.array_equal(back.image, scene.image)
    assert [(o.name, o.box) for o in back.objects] == [(o.name, o.box) for o in scene.objects]
    for old, new in ckpt.MOVED_MODULES.items():  # every alias names a module that exists
        __import__(new)


def test_checkpoint_of_the_previous_format_still_resumes(tiny_args):
    out = _two_step_run(tiny_args)
    last = ckpt.latest_checkpoint(out)
    state = ckpt.read_state(last)
    torch.save(state, last / "state.pt")  # format 1: the raw state dict, NumPy RNG state pickled as arrays
    t = Trainer(Config.build({**tiny_args, "steps": 3}), resume=True, **quiet)
    assert t.step == 2
    t.train(progress=False)
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3]


# ------------------------------------------------------------------------------- 3. reward functions
def _reward_module(tmp_path, monkeypatch, source, name="hostile_rewards"):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return name


def _chat_data(tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"say {w}"}], "answer": w}) + "\n"
                            for w in ["one", "two"]))
    return data


def test_reward_editing_its_inputs_in_place_changes_nothing(tiny_args, tmp_path, monkeypatch):
    mod = _reward_module(tmp_path, monkeypatch, """
        def grow(prompts, completions, answer, **kw):
            for p in prompts:
                p[-1]["content"] += " and more"   # edits the chat message in place
                p.append({"role": "user", "content": "extra"})
            for c in completions:
                c.clear() if isinstance(c, list) else None
            answer[:] = ["x"] * len(answer)
            return [1.0] * len(prompts)
        def length(prompts, completions, answer, **kw):
            return [float(len(p)) for p in prompts]
        """)
    args = {**tiny_args, "data": str(_chat_data(tmp_path)), "steps": 3, "prompts_per_step": 2,
            "num_generations": 2, "reward": [f"{mod}:grow", f"{mod}:length"]}
    t = Trainer(Config.build(args), **quiet)
    t.train(progress=False)
    assert [r["prompt"] for r in t.rows] == [[{"role": "user", "content": "say one"}],
                                             [{"role": "user", "content": "say two"}]]
    assert [r["answer"] for r in t.rows] == ["one", "two"]
    assert [m["rewards/length/mean"] for m in read_metrics(args["out"])] == [1.0, 1.0, 1.0]


def _sleepy_reward_trainer(tiny_args, tmp_path, monkeypatch, fn, module, **extra):
    """A 1-step trainer whose one reward ``fn`` (in the module ``module``) sleeps 30 s, with reward_timeout 0.5:
    ``(trainer, its log lines)``."""
    mod = _reward_module(tmp_path, monkeypatch, f"""
        import time
        def {fn}(prompts, completions, **kw):
            time.sleep(30)
            return [1.0] * len(prompts)
        """, name=module)
    logs = []
    args = {**tiny_args, "steps": 1, "reward": [f"{mod}:{fn}"], "reward_timeout": 0.5, **extra}
    return Trainer(Config.build(args), log=logs.append), logs


def test_reward_timeout_abandons_a_sleeping_reward_in_training_and_evaluation(tiny_args, tmp_path, monkeypatch):
    """A training step abandons the sleeping reward (an error, the rows unscorable, the log names the timeout),
    and so do the before/after evaluations (and grpolab eval, same function)."""
    t, logs = _sleepy_reward_trainer(tiny_args, tmp_path, monkeypatch, "slow", "sleepy_rewards", eval_problems=4)
    t0 = time.perf_counter()
    m = t.train_step()
    assert time.perf_counter() - t0 < 20
    assert m["reward_errors"] == 1 and m["rewards/slow/unscorable"] == 16 and m["rewards/slow/mean"] is None
    assert any("'slow' timed out" in line and "reward_timeout=0.5" in line for line in logs)
    t0 = time.perf_counter()
    res = t.evaluate()
    assert time.perf_counter() - t0 < 20
    assert res["rewards/slow/mean"] is None or res["rewards/slow/mean"] != res["rewards/slow/mean"]


@pytest.mark.parametrize("body", ["sys.exit(3)", "raise SystemExit('bye')", "raise GeneratorExit()"])
def test_sys_exit_in_a_reward_is_that_rewards_error(tiny_args, tmp_path, monkeypatch, body):
    mod = _reward_module(tmp_path, monkeypatch, f"""
        import sys
        def quitter(prompts, completions, **kw):
            {body}
        """, name="quitting_rewards")
    logs = []
    args = {**tiny_args, "steps": 2, "reward": [f"{mod}:quitter"]}
    t = Trainer(Config.build(args), log=logs.append)
    t.train(progress=False)
    ms = read_metrics(args["out"])
    assert [m["step"] for m in ms] == [1, 2] and all(m["reward_errors"] == 1 for m in ms)
    assert any("reward function 'quitter' raised" in line for line in logs)


# ------------------------------------------------------------------------------------------ 4. files lost
def test_out_folder_that_is_not_a_run_is_refused(tiny_args, tmp_path, capsys):
    out = tmp_path / "my_project"
    out.mkdir()
    (out / "config.yaml").write_text("my: own config\n")
    (out / "summary.json").write_text('{"mine": true}\n')
    argv = ["train", "--model", "tiny", "--task", "repeat", "--steps", "1", "--num_generations", "2",
            "--prompts_per_step", "2", "--max_completion_length", "3", "--eval_before", "false",
            "--eval_after", "false", "--tensorboard", "false", "--quiet", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "not a grpolab run folder" in err and "--overwrite" in err
    assert (out / "config.yaml").read_text() == "my: own config\n"
    assert (out / "summary.json").read_text() == '{"mine": true}\n'
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "summary.json"]
    with pytest.raises(ConfigError, match="not a grpolab run folder"):  # the Python path: the same rule
        Trainer(Config.build({**tiny_args, "out": str(out)}), **quiet)
    assert main(argv + ["--overwrite"]) == 2  # a run would replace them: refused with the flag too (issue 22)
    assert "which grpolab did not write" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "summary.json"]
    for name in ("config.yaml", "summary.json"):
        (out / name).rename(out / f"my_{name}")
    assert main(argv + ["--overwrite"]) == 0  # the explicit flag: the run is written next to the user's files
    assert (out / "grpolab_run.json").exists() and read_metrics(out)
    assert (out / "my_config.yaml").read_text() == "my: own config\n"


def test_python_path_never_wipes_metrics(tiny_args):
    Trainer(Config.build(tiny_args), **quiet).train(progress=False)
    before = Path(tiny_args["out"], "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):
        Trainer(Config.build(tiny_args), **quiet)
    assert Path(tiny_args["out"], "metrics.jsonl").read_text() == before
    t = Trainer(Config.build(tiny_args), overwrite=True, **quiet)  # the explicit flag starts again
    assert not Path(tiny_args["out"], "metrics.jsonl").exists()
    t.train(progress=False)
    assert [m["step"] for m in read_metrics(tiny_args["out"])] == [1, 2, 3, 4]


def test_resume_keeps_the_before_evaluation(tiny_args):
    args = {**tiny_args, "eval_before": True, "eval_problems": 3, "steps": 2, "save_steps": 2}
    first = Trainer(Config.build(args), **quiet).train(progress=False)
    assert "before" in first
    summary = Trainer(Config.build({**args, "steps": 3}), resume=True, **quiet).train(progress=False)
    assert summary["before"] == json.loads(json.dumps(first["before"]))
    saved = json.loads(Path(args["out"], "summary.json").read_text())
    assert saved["before"]["accuracy"] == first["before"]["accuracy"]


def test_truncated_last_metrics_line_is_ignored_on_resume(tiny_args):
    out = _two_step_run(tiny_args)
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "reward_mean": 0.')  # a run killed while writing step 3
    logs = []
    t = Trainer(Config.build({**tiny_args, "steps": 3}), resume=True, log=logs.append)
    t.train(progress=False)
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3]
    assert any("metrics.jsonl:3" in line and "incomplete" in line for line in logs)


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tiny_args, tmp_path):
    ref = {**tiny_args, "out": str(tmp_path / "ref")}
    Trainer(Config.build(ref), **quiet).train(progress=False)  # checkpoints at steps 2 and 4
    out = Path(tiny_args["out"])
    Trainer(Config.build(tiny_args), **quiet).train(progress=False)
    newest = ckpt.latest_checkpoint(out)
    assert newest.name == "step_000004"
    data = (newest / "state.pt").read_bytes()
    (newest / "state.pt").write_bytes(data[: len(data) // 3])  # cut short
    logs = []
    t = Trainer(Config.build(tiny_args), resume=True, log=logs.append)
    assert t.step == 2
    assert any("step_000004" in line and "corrupt" in line and "step_000002" in line for line in logs)
    t.train(progress=False)
    a, b = read_metrics(ref["out"]), read_metrics(out)
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if k not in TIMING} == {k: v for k, v in y.items() if k not in TIMING}


def test_only_checkpoint_corrupt_is_a_clear_error(tiny_args, capsys):
    out = _two_step_run(tiny_args)
    (ckpt.latest_checkpoint(out) / "weights.safetensors").write_bytes(b"\0" * 10)
    rc = main(["train", "--resume", str(out), "--steps", "3", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "weights.safetensors" in err and "no older checkpoint" in err


def test_checkpoint_write_is_atomic(tiny_args, monkeypatch):
    out = _two_step_run(tiny_args)
    good = ckpt.latest_checkpoint(out)
    t = Trainer(Config.build({**tiny_args, "steps": 3}), resume=True, **quiet)

    def dies(*a, **k):
        raise KeyboardInterrupt("killed mid-save")
    monkeypatch.setattr(ckpt.torch, "save", dies)
    t.step = 4
    with pytest.raises(KeyboardInterrupt):
        t.save()
    assert ckpt.latest_checkpoint(out) == good and ckpt.read_state(good)["step"] == 2
