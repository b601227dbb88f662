"""ConvRec-R1 Stage 1 (seed 000-91): Remap-Reflect-Adjust demonstrations, the SFT warm start, then Rank-GRPO."""
import json
import math

import numpy as np
import pytest
import torch

from grpolab.config import Config
from grpolab.tasks import get_task
from grpolab.tasks.ranked_list_bc import (fit_adjust, judge, reflect_scores, remap_reflect_adjust, remap_scores,
                                          teacher_list)

CAT = (1, 2, 3, 4, 5, 6)


def test_remap_by_hand():
    # teacher [5, 9] (9 is off this catalogue), prompt numbers {2, 5}, tau 1, lambda 1:
    # s[v] = (e^-|5-v| + [v = 5]) / sqrt(1) + (e^-|9-v| + [v = 9]) / sqrt(2) + [v in {2, 5}]
    s = remap_scores([5, 9], [2, 5], sim_scale=1.0, lam=1.0, catalogue=CAT)
    want = [math.exp(-abs(5 - v)) + (v == 5) + math.exp(-abs(9 - v)) / math.sqrt(2) + (v in (2, 5)) for v in CAT]
    assert s.tolist() == pytest.approx(want)
    assert s[4] == pytest.approx(3 + math.exp(-4) / math.sqrt(2))  # v = 5: exact match + similarity 1 + mentioned


def test_reflect_by_hand():
    s = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.3, 0.2], dtype=torch.float64)
    # top 3: v = 2 (0.9, in the prompt, not the answer: 0), v = 4 (0.7, the answer: +2), v = 3 (0.5, absent: -2)
    out = reflect_scores(s, [2, 4, 5], [4], candidates=3, gamma=0.5, catalogue=CAT)
    assert out.tolist() == pytest.approx([0.1, 0.9, 0.5 - 1.0, 0.7 + 1.0, 0.3, 0.2])
    assert [judge(v, [2, 4, 5], [4]) for v in (4, 5, 6)] == [2, 0, -2]


def _objective_gradient(scores, positives, w, b, reg):
    """The gradient of mean_i -sum_{v in pos_i} log softmax(w s_i + b)[v] + reg (|w - 1|^2 + |b|^2), by hand:
    per row, d/dz = n_i softmax(z) - counts_i; dz/db = 1, dz/dw = s_i."""
    s = scores.numpy()
    n, C = s.shape
    z = w * s + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    counts = np.zeros((n, C))
    for i, pos in enumerate(positives):
        for v in pos:
            counts[i, v] += 1
    dz = counts.sum(1, keepdims=True) * p - counts
    return (dz * s).mean(0) + 2 * reg * (w - 1), dz.mean(0) + 2 * reg * b


def test_adjust_is_the_regularised_likelihood_optimum():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(20, 6, generator=g, dtype=torch.float64)
    positives = [[5, 4] if i % 2 else [5, 1] for i in range(20)]  # item 6 is always a positive
    w, b = fit_adjust(scores, positives, reg=0.01)
    gw, gb = _objective_gradient(scores, positives, w.numpy(), b.numpy(), 0.01)
    assert np.abs(gw).max() < 1e-6 and np.abs(gb).max() < 1e-6
    assert int(torch.argmax(b)) == 5  # the always-positive item gets the largest additive bias
    w, b = fit_adjust(scores, positives, reg=1e6)  # a huge penalty: the identity adjustment
    assert torch.allclose(w, torch.ones(6, dtype=torch.float64), atol=1e-5) and b.abs().max() < 1e-5


def test_pipeline_grounds_and_corrects_a_noisy_teacher():
    rows = get_task("ranked_list").train_rows[:200]
    demos, s = remap_reflect_adjust(rows, convrec_teacher_noise=0.6)
    assert s["teacher_off_catalogue"] > 0 or s["teacher_hit_rate"] < 0.6
    assert s["demo_hit_rate"] > s["teacher_hit_rate"] + 0.3, s  # measured (seed 0): 0.43 -> 0.91
    mentioned = 0
    for d, r in zip(demos, rows):  # catalogue-grounded: three distinct catalogue items, nearly all from the prompt
        items = [int(x) for x in d.split("\n")]
        assert len(items) == 3 and len(set(items)) == 3 and all(1 <= v <= 99 for v in items)
        mentioned += len(set(items) & set(r["numbers"]))
    assert mentioned / (3 * len(rows)) > 0.95
    clean, s0 = remap_reflect_adjust(rows[:50], convrec_teacher_noise=0.0)
    assert s0["teacher_hit_rate"] == 1.0 and all(set(map(int, d.split("\n"))) == set(r["top"])
                                                 for d, r in zip(clean, rows))
    assert remap_reflect_adjust(rows[:50], convrec_teacher_noise=0.6) == remap_reflect_adjust(
        rows[:50], convrec_teacher_noise=0.6)  # seeded


def test_teacher_hallucinates_neighbours():
    import random
    rng = random.Random(0)
    lists = [teacher_list([10, 50, 99, 3, 7, 60], rng, noise=1.0, length=5) for _ in range(20)]
    assert all(0 < abs(u - v) <= 3 for lst in lists for u, v in zip(lst, [99, 60, 50, 10, 7]))
    assert teacher_list([10, 50, 99], random.Random(0), noise=0.0, length=5) == [99, 50, 10]


def test_stage1_sft_then_stage2_rank_grpo(tmp_path):
    from grpolab.cli import main
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer
    out = tmp_path / "sft"
    assert main(["sft", "--model", "tiny", "--task", "ranked_list", "--out", str(out), "--sft_mode", "convrec",
                 "--sft_steps", "2", "--sft_batch_size", "4", "--threads", "1"]) == 0
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["mode"] == "convrec" and summary["examples"] == 1000 and summary["demo_hit_rate"] > 0.9
    args = {**recipe_overrides("rank_grpo"), "model": str(out), "steps": 1, "prompts_per_step": 2,
            "num_generations": 2, "max_completion_length": 8, "eval_before": False, "eval_after": False,
            "tensorboard": False, "threads": 1, "out": str(tmp_path / "rl")}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    assert t.step == 1
