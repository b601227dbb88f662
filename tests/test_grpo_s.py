"""DR-IRL / GRPO-S (000-43): category reward models learnt by maximum-entropy IRL (task drirl_safety) and the
reward scaled by data hardness and model responsiveness (transform grpo_s_scaling, recipe grpo_s)."""
import json
import math
import zlib
from types import SimpleNamespace

import pytest
import torch

from grpolab.algorithms.advantages import group_mean, group_zscore
from grpolab.config import Config
from grpolab.recipes import recipe_overrides
from grpolab.tasks import get_task
from grpolab.tasks.drirl_safety import (CATEGORIES, NON_EXPERT, category_refusal, category_reward_models,
                                        data_hardness, demonstration_sets, drirl, fit_irl_reward, text_features)
from grpolab.train.trainer import Trainer

from _helpers import close, tr  # noqa: E402

NAN = float("nan")
T2 = 0.9640275800758169  # tanh(2)


# ---------------------------------------------------------------- the GRPO-S scale

def _scale(rewards, drirl_col, groups, hardness, demo, **kw):
    r = torch.tensor(rewards, dtype=torch.float64)
    batch = SimpleNamespace(columns={"completion": [""] * len(rewards), "hardness": hardness, "demo_reward": demo})
    return tr("grpo_s_scaling", rewards=r, group_ids=torch.tensor(groups),
              reward_matrix=torch.tensor(drirl_col, dtype=torch.float64)[:, None], reward_names=["drirl"],
              batch=batch, **kw)


def test_grpo_s_scaling_hand_computed():
    # group 0: r = [1, 3], h = 0.5, r(x, y*) = 4: gap = 4 - 2 = 2, s = 1 + 0.5 + tanh(2) = 2.46402758
    # group 1: r = [2, NaN], h = 0.2, r(x, y*) = 1: gap = 1 - 2 = -1 -> 0, s = 1 + 0.2 + 0 = 1.2
    out = _scale([1.0, 3.0, 2.0, NAN], [1.0, 3.0, 2.0, NAN], [0, 0, 1, 1], [0.5, 0.5, 0.2, 0.2], [4.0, 4.0, 1.0, 1.0],
                 grpo_s_alpha=1.0, grpo_s_beta=1.0)
    s0 = 1 + 0.5 + T2
    assert close(out, [s0 * 1.0, s0 * 3.0, 1.2 * 2.0, NAN])
    # alpha = 0.5, beta = 2: s0 = 1 + 0.25 + 2 tanh(2) = 3.17805516; s1 = 1 + 0.1 = 1.1
    out = _scale([1.0, 3.0, 2.0, NAN], [1.0, 3.0, 2.0, NAN], [0, 0, 1, 1], [0.5, 0.5, 0.2, 0.2], [4.0, 4.0, 1.0, 1.0],
                 grpo_s_alpha=0.5, grpo_s_beta=2.0)
    assert close(out, [3.17805516015 * 1.0, 3.17805516015 * 3.0, 2.2, NAN], tol=1e-9)
    # the scale multiplies the combined reward, not the column it reads the gap from; an all-NaN group: gap 0
    out = _scale([10.0, 0.0], [NAN, NAN], [0, 0], [0.0, 0.0], [5.0, 5.0])
    assert close(out, [10.0, 0.0])


def test_grpo_s_scaling_bounds_and_advantage_relations():
    """1 <= s <= 1 + alpha + beta; the scale cancels in group_zscore and multiplies group_mean's advantages."""
    torch.manual_seed(0)
    r = torch.randn(12, dtype=torch.float64)
    g = torch.arange(12) // 4
    h = [0.9] * 4 + [0.0] * 4 + [0.4] * 4
    demo = [50.0] * 4 + [-50.0] * 4 + [0.3] * 4
    out = _scale(r.tolist(), r.tolist(), g.tolist(), h, demo)
    s = out / r
    for k in range(3):
        assert torch.allclose(s[g == k], s[g == k][0].expand(4))
    assert 1.0 <= float(s.min()) and float(s.max()) <= 3.0
    assert float(s[0]) == pytest.approx(1 + 0.9 + math.tanh(50 - float(r[:4].mean())))
    assert float(s[4]) == pytest.approx(1.0)  # h = 0 and the policy is above the demonstration
    assert torch.allclose(group_zscore(out, g, advantage_epsilon=0.0), group_zscore(r, g, advantage_epsilon=0.0))
    assert torch.allclose(group_mean(out, g), s * group_mean(r, g))


def test_grpo_s_scaling_names_missing_inputs():
    with pytest.raises(ValueError, match="grpo_s_reward_column"):
        tr("grpo_s_scaling", rewards=torch.zeros(2), group_ids=torch.zeros(2, dtype=torch.long),
           reward_matrix=torch.zeros(2, 1), reward_names=["accuracy"],
           batch=SimpleNamespace(columns={"hardness": [0, 0], "demo_reward": [0, 0]}))
    with pytest.raises(ValueError, match="grpo_s_hardness_column"):
        tr("grpo_s_scaling", rewards=torch.zeros(2), group_ids=torch.zeros(2, dtype=torch.long),
           reward_matrix=torch.zeros(2, 1), reward_names=["drirl"], batch=SimpleNamespace(columns={}))


# ---------------------------------------------------------------- features, hardness, IRL

def test_text_features_and_hardness_hand_computed():
    grams = ["alpha", "beta", "alpha beta", "gamma", "alpha gamma"]
    assert len({zlib.crc32(x.encode()) % 256 for x in grams}) == 5  # no hash collision among these grams
    f = text_features("Alpha beta!")
    assert float(f.sum()) == pytest.approx(3 / math.sqrt(3)) and int((f > 0).sum()) == 3
    # "alpha beta" and "alpha gamma": 3 grams each, one shared ('alpha'): cos = (1/3) / 1 -> h = 2/3
    assert data_hardness("alpha beta", "alpha gamma") == pytest.approx(2 / 3)
    assert data_hardness("alpha beta", "Alpha beta.") == pytest.approx(0.0, abs=1e-12)
    assert data_hardness("", "alpha") == 0.0


def test_maxent_irl_reaches_the_hand_solved_optimum():
    # demos {e1}, samples {e1, e2}, l2 = 1. Stationarity: 1 - p1 - theta1 = 0, -p2 - theta2 = 0 with
    # p = softmax(theta) -> theta2 = -theta1 and theta1 = sigmoid(-2 theta1): theta1 = 0.33742 (bisection)
    theta = fit_irl_reward(torch.tensor([[1.0, 0.0]], dtype=torch.float64),
                           torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64), l2=1.0, iters=600, lr=0.05)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid < 1 / (1 + math.exp(2 * mid)) else (lo, mid)
    assert lo == pytest.approx(0.33742, abs=1e-4)
    assert theta.tolist() == pytest.approx([lo, -lo], abs=1e-3)


def test_each_category_model_prefers_its_own_demonstration():
    rms = category_reward_models()
    demos, samples = demonstration_sets()
    for c in CATEGORIES:
        own = min(rms.score(c, d) for d in demos[c])
        assert own > max(rms.score(c, s) for s in samples[c])  # beats compliance and the other categories' refusals
    # category-specific: the privacy refusal is rewarded by the privacy model, not by the malware one
    d = demos["privacy"][0]
    assert rms.score("privacy", d) > 1.0 > rms.score("malware", d)
    with pytest.raises(ValueError, match="categories"):
        rms.score("weather", d)


def test_task_rows_and_rewards():
    t = get_task("drirl_safety")
    rows = t.train_rows + t.eval_rows
    assert len(rows) == 72 and len(t.eval_rows) == 12
    assert {r["category"] for r in rows} == set(CATEGORIES)
    rms = category_reward_models()
    for r in rows[:10]:
        assert 0.0 <= r["hardness"] <= 1.0 and r["hardness"] == data_hardness(r["question"], r["demonstration"])
        assert r["demo_reward"] == pytest.approx(rms.score(r["category"], r["demonstration"]))
    cats = ["privacy", "malware", "fraud", "fraud"]
    comps = ["I can't share that; privacy matters.", "Sure, here is how.", "I cannot help: that is fraud.", "No."]
    assert category_refusal(completions=comps, category=cats) == [1.0, 0.0, 1.0, 0.0]
    assert drirl(completions=comps, category=cats) == [rms.score(c, y) for c, y in zip(cats, comps)]
    assert NON_EXPERT[0] not in [r["demonstration"] for r in rows]


# ---------------------------------------------------------------- recipe and smoke run

def test_recipe_and_smoke_step(tiny_args):
    over = recipe_overrides("grpo_s")
    assert over["advantage"] == "group_mean" and over["reward_transforms"] == ["grpo_s_scaling"]
    assert over["task"] == "drirl_safety"
    args = {**over, "model": "tiny", "steps": 2, "prompts_per_step": 2, "num_generations": 4,
            "max_completion_length": 8, "micro_batch_size": 32, "threads": 1, "eval_before": False,
            "eval_after": False, "tensorboard": False, "save_steps": 1000, "out": tiny_args["out"]}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    rows = [json.loads(x) for x in open(f"{tiny_args['out']}/metrics.jsonl")]
    assert len(rows) == 2 and all(r["reward_errors"] == 0 for r in rows)
    assert all(math.isfinite(r["reward_mean"]) for r in rows) and "rewards/drirl/mean" in rows[0]


# ---------------------------------------------------------------- your own demonstrations: fit, save, drirl:PATH

def test_fit_rows_save_load_and_the_drirl_reward_spec(tmp_path):
    from grpolab.rewards import parse_reward_spec
    from grpolab.tasks.drirl_safety import CategoryRewardModels
    rows = [{"category": "tone", "demonstration": "thank you kindly friend", "response": "go away"},
            {"category": "tone", "demonstration": "thank you so much", "response": "whatever"},
            {"category": "brevity", "demonstration": "ok", "response": "well it is a long story really"}]
    rms = CategoryRewardModels.fit_rows(rows)
    assert set(rms.thetas) == {"tone", "brevity"}
    assert rms.score("tone", "thank you") > rms.score("tone", "go away")
    assert rms.score("tone", "thank you") > rms.score("brevity", "thank you")  # the other category's expert text
    path = tmp_path / "rms.json"
    rms.save(path)
    back = CategoryRewardModels.load(path)
    assert back.score("tone", "thank you kindly") == rms.score("tone", "thank you kindly")
    r = parse_reward_spec(f"drirl:{path}=2")
    assert r.name == "drirl" and r.weight == 2.0
    comps = ["thank you", "whatever"]
    assert r.fn(completions=comps, category=["tone", "tone"]) == [rms.score("tone", y) for y in comps]
    with pytest.raises(ValueError, match="drirl_category_column"):
        r.fn(completions=comps)
    (tmp_path / "bad.json").write_text('{"format": 9}')
    with pytest.raises(ValueError, match="format 1"):
        parse_reward_spec(f"drirl:{tmp_path / 'bad.json'}")
