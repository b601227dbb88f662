"""Silent results, tried as a user would (issue 39): held-out image noise fixed per row, a sampler that trains no
denoising step refused at start-up, and ``grpolab doctor`` on a run in which nothing was trained.

Each test failed on the code before its fix: rows without ``noise_seed`` drew their held-out noise from the
global RNG (two evaluations of one model differed, a learning-rate-0 run reported a held-out change), a
``--flow_steps 2`` DanceGRPO run trained 0 steps with exit code 0, and the doctor called such a run healthy."""
import json
import zlib

import numpy as np
import pytest
import torch

from grpolab.cli import main
from grpolab.components import Component
from grpolab.config import Config, ConfigError
from grpolab.policies import POLICIES
from grpolab.policies.base import held_out_seed
from grpolab.recipes import recipe_overrides
from grpolab.report import doctor

pytest.importorskip("diffusers")

QUIET = ["--eval_before", "false", "--eval_after", "false", "--tensorboard", "false", "--quiet", "--threads", "1"]


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("grpolab: error:")]
    assert lines and "Traceback" not in err, err
    return lines[-1]


# ------------------------------------------------------------------------- 1. held-out noise fixed per row
def test_held_out_seed_is_the_rows_noise_seed_else_crc32_of_uid_and_prompt():
    # the documented formula (docs/images.md), computed here by hand: crc32 of b"<uid>|<prompt>"
    assert held_out_seed({"prompt": "3"}, 5) == zlib.crc32(b"5|3") == 3787172229  # CRC-32 (also binascii)
    assert held_out_seed({"prompt": "3", "noise_seed": 11}, 5) == 11
    assert held_out_seed({"label": 7}, 0) == zlib.crc32(b"0|7")  # no prompt: the label
    assert held_out_seed({"prompt": "a red apple", "noise_seed": None}, 2) == zlib.crc32(b"2|a red apple")
    assert held_out_seed({"prompt": "utterance 4", "audio_seed": 9}, 1, "audio_seed") == 9
    # different rows differ: another index, another prompt
    seeds = {held_out_seed({"prompt": p}, i) for i in range(20) for p in ("3", "4")}
    assert len(seeds) == 40


def _load(policy: str, task: str):
    cfg = Config.build({"policy": policy, "task": task})
    pol = Component(POLICIES.get(policy), cfg, policy).fn
    from grpolab.tasks import get_task
    t = get_task(task, cfg=cfg)
    rows = [{k: v for k, v in r.items() if k != "noise_seed"} for r in t.eval_rows[:4]]  # user rows: no noise_seed
    return pol, pol.load(cfg, t.train_rows[:4], [], log=lambda *a: None), rows


def actions(batch) -> torch.Tensor:
    """The sampled images ([R, C, H, W]) or trajectories ([R, 8, 2]) of a batch."""
    if "images" in batch.row_data:
        return batch.row_data["images"]
    return torch.from_numpy(np.stack(batch.columns["completion"]))


# every policy that denoises held-out noise (ar_image / var_image drew from the row's uid already; they now use
# the same formula, checked above and by the image tests)
DENOISERS = [("flow_matching", "digits"), ("ddpm", "digits"), ("flow_dsm", "digits"),
             ("ddpm_planner", "toy_planner")]


@pytest.mark.parametrize("policy,task", DENOISERS)
def test_the_same_model_evaluated_twice_on_rows_without_noise_seed_is_identical(policy, task):
    pol, module, rows = _load(policy, task)
    sample = lambda r, u, **kw: pol.sample(module, r, u, evaluation=True, **kw)  # noqa: E731
    torch.manual_seed(1)  # the global RNG differs between the two evaluations (it did decide the noises)
    a = sample(rows, list(range(len(rows))), num_generations=1, temperature=0.0)
    torch.manual_seed(2)
    b = sample(rows, list(range(len(rows))), num_generations=1, temperature=0.0)
    got_a, got_b = actions(a), actions(b)
    assert torch.equal(got_a, got_b)
    # different rows still get different noises: a row's draw follows its index (the same row at another uid
    # is another sample), and two rows at one index differ
    c = sample(rows[:1], [1], num_generations=1, temperature=0.0)
    assert not torch.equal(got_a[0], actions(c)[0])
    assert not torch.equal(got_a[0], got_a[1])


@pytest.mark.parametrize("policy,task", DENOISERS + [("ar_image", "digits"), ("var_image", "digits")])
def test_a_row_without_noise_seed_draws_as_with_its_derived_seed(policy, task):
    """One formula for every image-like policy: a held-out row without ``noise_seed`` gets exactly the draws of
    the same row with ``noise_seed`` = crc32(b"<uid>|<prompt>") (ar_image / var_image used the bare uid)."""
    pol, module, rows = _load(policy, task)
    uids = [0, 1, 2, 3]
    seeded = [{**r, "noise_seed": zlib.crc32(f"{u}|{r['prompt']}".encode())} for r, u in zip(rows, uids)]
    a = pol.sample(module, rows, uids, num_generations=1, temperature=0.0, evaluation=True)
    b = pol.sample(module, seeded, uids, num_generations=1, temperature=0.0, evaluation=True)
    assert torch.equal(actions(a), actions(b))


def test_the_initial_noise_is_drawn_from_the_rows_own_seed():
    """flow_matching's held-out x_0 for row ``{"prompt": "3"}`` at uid 4 is torch.randn from a generator seeded
    with crc32(b"4|3"), whatever the global RNG; with noise_seed 11 it is the draw of seed 11."""
    from grpolab.policies._image.flow import row_noise

    torch.manual_seed(123)
    x = row_noise([{"prompt": "3"}, {"prompt": "3", "noise_seed": 11}], [4, 0], [1, 1], (1, 8, 8), None,
                  evaluation=True, same_in_group=False)
    want0 = torch.randn((1, 1, 8, 8), generator=torch.Generator().manual_seed(zlib.crc32(b"4|3")))
    want1 = torch.randn((1, 1, 8, 8), generator=torch.Generator().manual_seed(11))
    assert torch.equal(x[0:1], want0) and torch.equal(x[1:2], want1)
    # different rows, different noises: the same prompt at two indices, two prompts at one index
    y = row_noise([{"prompt": "3"}, {"prompt": "3"}, {"prompt": "4"}], [0, 1, 0], [1, 1, 1], (1, 8, 8), None,
                  evaluation=True, same_in_group=False)
    assert not torch.equal(y[0], y[1]) and not torch.equal(y[0], y[2])


def test_a_learning_rate_0_ddpo_run_on_user_rows_reports_no_held_out_change(tmp_path, capsys):
    """The issue's probe: DDPO on a --data file of prompts without noise_seed, learning rate 0: the weights do
    not move, so the held-out figures before and after are equal (they were 0.534 -> 0.555)."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": str(i % 10), "label": i % 10}) + "\n" for i in range(24)))
    out = tmp_path / "run"
    rc = main(["train", "--recipe", "ddpo", "--data", str(data), "--reward",
               "grpolab.policies._image.rewards:digit_confidence", "--learning_rate", "0", "--steps", "1",
               "--prompts_per_step", "2", "--num_generations", "2", "--ddpm_steps", "2", "--ddpm_eval_steps", "2",
               "--eval_split", "6", "--tensorboard", "false", "--quiet", "--threads", "1", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    before, after = summary["before"], summary["after"]
    assert before["n"] == after["n"] == 6
    assert before["reward_mean"] == after["reward_mean"]  # exactly: the change is 0
    assert before["image_grid"] == after["image_grid"]  # the same images


# ------------------------------------------------------------------------- 2. a sampler that trains no step
# recipe, the options that leave no step, the pieces of the message, and the settings the message offers (each
# builds: k >= 1), all worked out by hand from k = int(n * steps_fraction), n = steps (- 1 with steps_drop_last)
NO_STEP = [
    ("dance_grpo", ["--flow_steps", "2"],  # n = 2 - 1, int(1 * 0.6) = 0
     ["flow_steps 2", "steps_fraction 0.6", "steps_drop_last true", "int(1 * 0.6) = 0",
      "flow_steps >= 3", "steps_fraction >= 1", "steps_drop_last: false"],
     [{"flow_steps": 3}, {"flow_steps": 2, "steps_fraction": 1.0},  # int(2 * 0.6) = 1; int(1 * 1.0) = 1
      {"flow_steps": 2, "steps_drop_last": False}]),  # int(2 * 0.6) = 1
    ("flow_grpo_images", ["--flow_steps", "1"],  # int(1 * 0.99) = 0; 2 steps keep int(1.98) = 1
     ["flow_steps 1", "steps_fraction 0.99", "int(1 * 0.99) = 0", "flow_steps >= 2", "steps_fraction >= 1"],
     [{"flow_steps": 2}, {"flow_steps": 1, "steps_fraction": 1.0}]),
    ("ddpo", ["--ddpm_steps", "3", "--steps_fraction", "0.3"],  # int(0.9) = 0; 4 * 0.3 = 1.2; 1/3 -> 0.334
     ["ddpm_steps 3", "steps_fraction 0.3", "int(3 * 0.3) = 0", "ddpm_steps >= 4", "steps_fraction >= 0.334"],
     [{"ddpm_steps": 4, "steps_fraction": 0.3}, {"ddpm_steps": 3, "steps_fraction": 0.334}]),  # int(1.002) = 1
    ("chunk_grpo_images", ["--flow_steps", "1"], ["flow_steps 1", "int(1 * 0.99) = 0", "flow_steps >= 2"],
     [{"flow_steps": 2}]),
    ("vipo_images", ["--flow_steps", "1"], ["flow_steps 1", "int(1 * 0.99) = 0", "flow_steps >= 2"],
     [{"flow_steps": 2}]),
    ("self_paced_grpo", ["--flow_steps", "1"], ["flow_steps 1", "int(1 * 0.99) = 0", "flow_steps >= 2"],
     [{"flow_steps": 2}]),
    (None, ["--policy", "ddpm_planner", "--batch_stages", "denoising_steps", "--planner_steps", "1",
            "--steps_fraction", "0.5"],
     ["planner_steps 1", "int(1 * 0.5) = 0", "planner_steps >= 2", "steps_fraction >= 1"],
     [{"policy": "ddpm_planner", "batch_stages": ["denoising_steps"], "planner_steps": 2, "steps_fraction": 0.5}]),
]


@pytest.mark.parametrize("recipe,opts,parts,valid", NO_STEP, ids=[r or "ddpm_planner" for r, *_ in NO_STEP])
def test_a_sampler_that_trains_no_step_is_refused_at_start(tmp_path, capsys, recipe, opts, parts, valid):
    out = tmp_path / "run"
    rc = main(["train", *(["--recipe", recipe] if recipe else []), *opts, "--steps", "1", "--out", str(out),
               *QUIET])
    assert rc == 2
    line = one_line_error(capsys.readouterr().err)
    for p in parts:
        assert p in line, (p, line)
    assert "no step would train" in line
    assert not (out / "metrics.jsonl").exists()  # refused before any step
    for over in valid:  # the values the error offers are valid
        Config.build({**(recipe_overrides(recipe) if recipe else {}), **over})


def test_a_batch_whose_rows_keep_no_step_is_refused_when_it_arrives():
    """The stage's own guard (rows whose step count the config cannot know, e.g. a rollout of one step per row):
    one loss step at steps_fraction 0.99 keeps int(0.99) = 0."""
    from types import SimpleNamespace

    from grpolab.batch import RolloutBatch
    from grpolab.policies._image.stages_denoising import denoising_steps
    R, T = 2, 1
    b = RolloutBatch(prompt_ids=torch.ones(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1, dtype=torch.long),
                     completion_ids=torch.zeros(R, T, dtype=torch.long), completion_mask=torch.ones(R, T),
                     behavior_logprobs=torch.zeros(R, T), group_ids=torch.zeros(R, dtype=torch.long),
                     prompt_uids=torch.zeros(R, dtype=torch.long), truncated=torch.zeros(R, dtype=torch.bool))
    ctx = SimpleNamespace(generator=torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match=r"at most 1 loss step and steps_fraction 0.99 keeps int\(1 \* 0.99\) = 0"):
        denoising_steps(b, ctx, steps_fraction=0.99)
    assert denoising_steps(b, ctx, steps_fraction=1.0).completion_mask.sum() == R  # 1 step each trains


# ------------------------------------------------------------------------- 3. doctor: nothing was trained
def _row(step: int, **over) -> dict:
    r = {"step": step, "reward_mean": 0.4, "reward_std": 0.3 + 0.01 * step, "loss": 0.0, "grad_norm": 0.0,
         "skipped": 0, "kl": None, "entropy": None, "clip_frac_low": 0.0, "clip_frac_high": 0.0,
         "completion_len_mean": 8.0, "completion_len_max": 8, "frac_truncated": 0.0, "advantage_abs_mean": 0.0}
    return {**r, **over}


def _run(tmp_path, rows, name="run"):
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"skipped_steps": 0}))
    return run


def test_doctor_reports_grad_norm_0_on_every_step_while_rewards_vary(tmp_path, capsys):
    rows = [_row(s) for s in range(1, 6)]
    run = _run(tmp_path, rows)
    found = doctor.diagnose(run)["findings"]
    assert [f["check"] for f in found] == ["nothing_trained"]
    f = found[0]
    # from the data: 5 steps, all grad_norm 0; reward_std 0.31 .. 0.35, all above 1e-6; advantages all 0
    assert "on all 5 logged steps" in f["evidence"] and "on 5 of them" in f["evidence"]
    assert "step 1: 0.31" in f["evidence"] and "step 5: 0.35" in f["evidence"]
    assert "advantage_abs_mean 0 on all 5 steps" in f["evidence"]
    assert f["steps"] == [1, 2, 3, 4, 5]
    assert f["fix"].startswith("nothing was trained")
    for cause in ("trains no step", "advantages zero", "frozen parameters"):
        assert cause in f["fix"]
    assert main(["doctor", str(run)]) == 1
    text = capsys.readouterr().out
    assert "[nothing_trained] nothing was trained" in text and "healthy" not in text


def test_doctor_nothing_trained_needs_every_step_at_0_and_varying_rewards(tmp_path):
    # one step with a gradient: something trained
    rows = [_row(s, grad_norm=0.0 if s != 3 else 0.2) for s in range(1, 6)]
    assert doctor.check_nothing_trained(rows, {}) is None
    # a constant reward explains a zero gradient: that is reward_constant's finding, not this one
    flat = [_row(s, reward_std=0.0) for s in range(1, 6)]
    assert doctor.check_nothing_trained(flat, {}) is None
    assert doctor.check_reward_constant(flat, {}) is not None
    # steps that log no grad_norm (null: not measured) are not evidence either way
    assert doctor.check_nothing_trained([_row(s, grad_norm=None) for s in range(1, 6)], {}) is None
    # without advantage_abs_mean the finding stands, without the advantage sentence
    f = doctor.check_nothing_trained([{k: v for k, v in _row(s).items() if k != "advantage_abs_mean"}
                                      for s in range(1, 4)], {})
    assert f is not None and "advantage_abs_mean" not in f.evidence
    # a normal run (a tiny image run that trains) does not trigger it
    from grpolab.train.metrics import read_metrics
    from grpolab.train.trainer import Trainer

    out = tmp_path / "run"
    cfg = Config.build({**recipe_overrides("flow_grpo_images"), "steps": 2, "prompts_per_step": 2,
                        "num_generations": 2, "flow_steps": 2, "eval_before": False, "eval_after": False,
                        "out": str(out), "threads": 1})
    Trainer(cfg, log=lambda *a: None).train(progress=False)
    assert all(r["grad_norm"] > 0 for r in read_metrics(out))
    assert doctor.check_nothing_trained(read_metrics(out), {}) is None
    assert "nothing_trained" not in {f["check"] for f in doctor.diagnose(out)["findings"]}
