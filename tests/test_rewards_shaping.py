"""Reward transforms from the seeds and the countdown task (hand-computed)."""
import math
import random
from types import SimpleNamespace

import pytest
import torch

from grpolab.components import Component
from grpolab.config import Config
from grpolab.recipes import recipe_overrides
from grpolab.rewards.transforms import REWARD_TRANSFORMS
from grpolab.tasks import get_task
from grpolab.tasks.countdown import accuracy as cd_accuracy, check, evaluate, format_reward as cd_format, make_problem

from _helpers import close, tr  # noqa: E402

NAN = float("nan")
NAMES = ["accuracy", "format"]


def matrix(acc, fmt=None):
    fmt = fmt if fmt is not None else [0.0] * len(acc)
    return torch.tensor([acc, fmt], dtype=torch.float32).T


def batch(completions, **columns):
    return SimpleNamespace(columns={"completion": completions, **columns})


# ---------------------------------------------------------------- ReDit (004-06)

def test_redit_is_deterministic_per_seed_and_step_and_zero_mean():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, NAN])
    uids = torch.tensor([7, 7, 7, 7, 8])
    a = tr("redit", rewards=r, prompt_uids=uids, step=3, seed=5, redit_scale=0.1)
    b = tr("redit", rewards=r, prompt_uids=uids, step=3, seed=5, redit_scale=0.1)
    assert close(a, b)  # same (seed, step): identical, no hidden RNG state
    assert math.isnan(a[4])  # unscorable stays unscorable
    assert not close(a, tr("redit", rewards=r, prompt_uids=uids, step=4, seed=5, redit_scale=0.1))
    assert not close(a, tr("redit", rewards=r, prompt_uids=uids, step=3, seed=6, redit_scale=0.1))
    # global RNG untouched
    torch.manual_seed(0)
    x = torch.rand(1)
    torch.manual_seed(0)
    tr("redit", rewards=r, prompt_uids=uids, step=3, seed=5)
    assert torch.equal(torch.rand(1), x)
    # a row's noise does not depend on its position in the batch (filter vs advantages)
    perm = torch.tensor([4, 0, 1, 2, 3])
    p = tr("redit", rewards=r[perm], prompt_uids=uids[perm], step=3, seed=5, redit_scale=0.1)
    assert close(p, a[perm])
    # zero mean, scale = std (gaussian) / half-width (uniform) over many rows
    big = torch.zeros(20000)
    ids = torch.arange(20000)
    g = tr("redit", rewards=big, prompt_uids=ids, step=0, seed=0, redit_scale=0.5)
    assert abs(float(g.mean())) < 0.02 and abs(float(g.std()) - 0.5) < 0.02
    u = tr("redit", rewards=big, prompt_uids=ids, step=0, seed=0, redit_distribution="uniform", redit_scale=0.5)
    assert abs(float(u.mean())) < 0.01 and float(u.abs().max()) <= 0.5 and float(u.abs().max()) > 0.49
    # breaks ties: an all-equal group now has non-zero variance
    tied = torch.ones(4)
    assert float(tr("redit", rewards=tied, prompt_uids=uids[:4], step=3).std()) > 0
    assert torch.equal(tr("redit", rewards=tied, prompt_uids=uids[:4], step=3, redit_scale=0.0), tied)


def test_redit_resumed_trainer_component_matches():
    cfg = Config.build({"seed": 11, "reward_transforms": ["redit"], "redit_scale": 0.2})
    c1, c2 = Component(REWARD_TRANSFORMS.get("redit"), cfg), Component(REWARD_TRANSFORMS.get("redit"), cfg)
    r, uids = torch.ones(4), torch.tensor([0, 0, 1, 1])
    for step in range(3):  # a "resumed" component (fresh object) gives the same noise at every step
        assert close(c1(rewards=r, prompt_uids=uids, step=step), c2(rewards=r, prompt_uids=uids, step=step))


# ---------------------------------------------------------------- GRPO-LEAD (000-03)

def _lead_authors(rewards, lengths, index, alpha=0.05, epsilon=1e-6, threshold=4000):
    """RewardManager.get_reweight_rewards of github.com/aeroplanepaper/GRPO-LEAD (verl/verl/trainer/main_ppo.py),
    re-written from the authors' code: rewards 1 (correct) / -1 (wrong); three shortest over all rows of the
    group gate the term (skip when their mean <= 4000); Bessel std, std = 1 with one correct row."""
    rewards = list(rewards)
    for q in set(index):
        rows = [i for i, qi in enumerate(index) if qi == q]
        mins = sorted(lengths[i] for i in rows)[:3] + [math.inf] * 3
        if sum(mins[:3]) / 3 <= threshold:
            continue
        good = [i for i in rows if rewards[i] > 0]
        if not good:
            continue
        avg = sum(lengths[i] for i in good) / len(good)
        std = 1.0
        if len(good) > 1:
            std = math.sqrt(sum((lengths[i] - avg) ** 2 for i in good) / (len(good) - 1))
        for i in good:
            rewards[i] = rewards[i] * math.exp(-alpha * (lengths[i] - avg) / (std + epsilon))
    return rewards


def test_lead_length_reward_hand_computed():
    # the issue's example: correct lengths [4100, 4200, 6000] -> authors' [1.032, 1.027, 0.944]
    lengths = [4100, 4200, 6000,            # group 0: long, all correct -> shaped
               4100, 4200, 6000, 100,       # group 1: same correct rows + a short wrong one -> gate closed
               300, 400, 500,               # group 2: short group -> unchanged
               5000, 4500, 4800,            # group 3: one correct row -> z = 0 (std 1) -> unchanged; wrong -> -1
               4500, 4600]                  # group 4: two rows -> min3 = inf in the code -> gate open
    acc = [1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 1]
    index = [0] * 3 + [1] * 4 + [2] * 3 + [3] * 3 + [4] * 2
    authors = _lead_authors([1.0 if a else -1.0 for a in acc], lengths, index)
    assert [round(v, 3) for v in authors[:3]] == [1.032, 1.027, 0.944]
    assert authors[3:10] == [1.0, 1.0, 1.0, -1.0, 1.0, 1.0, 1.0] and authors[10:13] == [1.0, -1.0, -1.0]
    assert authors[13] > 1.0 > authors[14]
    m = matrix(acc, [0.0] * len(acc))
    out = tr("lead_length_reward", rewards=torch.tensor(acc, dtype=torch.float32),
             lengths=torch.tensor(lengths), group_ids=torch.tensor(index), reward_matrix=m, reward_names=NAMES)
    assert close(out, authors)
    # other terms (format) are kept additively; NaN accuracy rows are left unchanged; a lower threshold opens the gate
    m = matrix([1, 1, 0, NAN], [0.5, 0.0, 0.5, 0.0])
    out = tr("lead_length_reward", rewards=torch.tensor([1.5, 1.0, 0.5, NAN]), lengths=torch.tensor([10, 20, 30, 5]),
             group_ids=torch.tensor([0, 0, 0, 0]), reward_matrix=m, reward_names=NAMES,
             lead_len_alpha=0.5, lead_len_threshold=0.0)
    ref = _lead_authors([1.0, 1.0], [10, 20], [0, 0], alpha=0.5, threshold=0.0)
    assert close(out, [0.5 + ref[0], ref[1], 0.5 - 1.0, NAN])
    assert out[0] - 0.5 > out[1]
    gated = tr("lead_length_reward", rewards=torch.tensor([1.5, 1.0, 0.5, NAN]), lengths=torch.tensor([10, 20, 30, 5]),
               group_ids=torch.tensor([0, 0, 0, 0]), reward_matrix=m, reward_names=NAMES, lead_len_alpha=0.5)
    assert close(gated, [1.5, 1.0, -0.5, NAN])


def test_correct_column_must_exist():
    with pytest.raises(ValueError, match="no reward column 'accuracy'"):
        tr("lead_length_reward", rewards=torch.zeros(2), lengths=torch.ones(2), group_ids=torch.zeros(2),
           reward_matrix=torch.zeros(2, 1), reward_names=["match"])


# ---------------------------------------------------------------- FGRPR (000-66)

def test_fuzzy_numeric_hand_computed():
    # authors' count_reward (yeyimilk/CrowdVLM-R1 grpo_rec.py): gap = |sol - y| / sol; 1.5 - gap if gap < .5 else 0
    def authors(y, sol):
        gap = abs(sol - y) / sol
        return 1.5 - gap if gap < 0.5 else 0.0
    b = batch(["Answer: 10", "so Answer: 8", "Answer: 15", "Answer: 14", "Answer: 40", "no number", "Answer: 1",
               "Answer: 2.5"],
              answer=["10", "10", "10", "10", "10", "10", "0", "2"])
    expect = [authors(10, 10), authors(8, 10), authors(15, 10), authors(14, 10), authors(40, 10), 0.0,
              0.0, authors(2.5, 2)]
    # 1.5 ; 1.3 ; gap .5 is not < .5 -> 0 ; 1.1 ; 0 ; unparsed 0 ; target 0: |1|/max(0, floor 1) = 1 -> 0 ; 1.25
    assert expect == pytest.approx([1.5, 1.3, 0.0, 1.1, 0.0, 0.0, 0.0, 1.25])
    out = tr("fuzzy_numeric", rewards=torch.full((8,), 0.5), batch=b, fuzzy_weight=2.0)
    assert close(out, 0.5 + 2 * torch.tensor(expect))
    # grpolab's former ramp max(0, 1 - gap) gave .8 and .5 for the 2nd and 3rd rows: the authors' rule differs
    assert expect[1] != 0.8 and expect[2] != 0.5
    # last 'Answer:' counts
    assert close(tr("fuzzy_numeric", rewards=torch.zeros(1), batch=batch(["Answer: 3 Answer: 9"], answer=["9"])), [1.5])


def test_fgrpr_recipe_reproduces_the_authors_advantages(tmp_path):
    """One group of four through the fgrpr recipe's trainer (rewards, weights, fuzzy transform, advantages). The
    authors' code sums the fuzzy count reward and the format reward with weight 1 each (accuracy replaced), then
    GRPO's (r - mean) / (std + 1e-4) with the sample std: [1.098, -0.416, 0.492, -1.174]. The recipe weighted the
    format reward 0.5 and gave [0.941, 0.157, 0.314, -1.411]. Target 10; fuzzy 1.5 - |y - 10| / 10 below 50 %:
      "Answer: 10"           fuzzy 1.5, format 1 (ends with the answer) -> 2.5
      "Answer: 10 because.." fuzzy 1.5, format 0                        -> 1.5
      "Answer: 14"           fuzzy 1.1, format 1                        -> 2.1
      "Answer: 40"           fuzzy 0,   format 1                        -> 1.0"""
    from grpolab.batch import RolloutBatch
    from grpolab.train.trainer import Trainer
    totals = [1.5 + 1, 1.5 + 0, 1.1 + 1, 0.0 + 1]
    mean = sum(totals) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in totals) / 3)
    authors = [(r - mean) / (std + 1e-4) for r in totals]
    assert authors == pytest.approx([1.098, -0.416, 0.492, -1.174], abs=1e-3)  # the figures the issue cites
    cfg = Config.build({**recipe_overrides("fgrpr"), "model": "tiny", "num_generations": 4, "prompts_per_step": 1,
                        "eval_before": False, "eval_after": False, "tensorboard": False, "out": str(tmp_path / "r")})
    t = Trainer(cfg, log=lambda *a: None)
    comps = ["Answer: 10", "Answer: 10 because 7 + 3 = 10 and", "Answer: 14", "Answer: 40"]
    b = RolloutBatch(prompt_ids=torch.zeros(4, 2, dtype=torch.long), prompt_mask=torch.ones(4, 2, dtype=torch.long),
                     completion_ids=torch.ones(4, 3, dtype=torch.long), completion_mask=torch.ones(4, 3),
                     behavior_logprobs=torch.zeros(4, 3), group_ids=torch.zeros(4, dtype=torch.long),
                     prompt_uids=torch.zeros(4, dtype=torch.long), truncated=torch.zeros(4, dtype=torch.bool),
                     columns={"prompt": ["p"] * 4, "completion": comps, "answer": ["10"] * 4})
    t.scorer.score(b)
    assert b.reward_names == NAMES and b.rewards[:, 1].tolist() == [1.0, 0.0, 1.0, 1.0]
    b.scalar_rewards = t.scorer.scalar(b)
    assert close(b.scalar_rewards, totals)
    assert t.compute_advantages(b)[:, 0].tolist() == pytest.approx(authors, abs=1e-5)


def test_fuzzy_needs_answer_column():
    with pytest.raises(ValueError, match="data column 'answer'"):
        tr("fuzzy_numeric", rewards=torch.zeros(1), batch=batch(["Answer: 1"]))


# ---------------------------------------------------------------- LC-R1 (000-100)

def _authors_lc_length(L, right, groups):
    """The authors' len_penalty_coef block (zxiangx/LC-R1, grpo_trainer.py), per group in plain Python:
    no right row -> 0 for the whole group; else 1 - L / (max L of right rows + 1e-4) for every row."""
    out = [0.0] * len(L)
    for g in set(groups):
        idx = [i for i in range(len(L)) if groups[i] == g]
        right_L = [L[i] for i in idx if right[i]]
        for i in idx:
            out[i] = 1 - L[i] / (max(right_L) + 1e-4) if right_L else 0.0
    return out


def test_lc_length_hand_computed():
    # L = tokens before EOS: finished rows count their EOS in `lengths`, truncated rows do not have one
    L = [200, 100, 50, 400,   30, 60,   10, 30,   20, 20, 10, 40,   5, 50]
    trunc = [0, 0, 0, 0,      0, 0,     0, 0,     0, 0, 0, 1,       0, 0]
    groups = [0, 0, 0, 0,     1, 1,     2, 2,     3, 3, 3, 3,       4, 4]
    acc = [1, 1, 0, 0,        0, 0,     1, 0,     1, 1, 1, 0,       1, 1]
    texts = ["x Answer: 1"] * 12 + ["x Answer 1", "x Answer: 1"]  # row 12 lacks the marker: not correct
    right = [a == 1 and t.count("Answer:") == 1 for a, t in zip(acc, texts)]
    lengths = torch.tensor([n + (0 if t else 1) for n, t in zip(L, trunc)])
    r = torch.tensor([1.5 if a else 0.5 for a in acc], dtype=torch.float64)
    out = tr("lc_length", rewards=r, lengths=lengths, truncated=torch.tensor(trunc, dtype=torch.bool),
             group_ids=torch.tensor(groups), reward_matrix=matrix(acc), reward_names=NAMES, batch=batch(texts),
             lc_length_weight=1.0, lc_think_end="Answer:")
    expected = [ri + t for ri, t in zip(r.tolist(), _authors_lc_length(L, right, groups))]
    assert close(out, expected)
    # the numbers: max correct 200 -> wrong rows of 50 and 400 get +.75 and -1.0 (grpolab used to give 0)
    assert out[2] - r[2] == pytest.approx(0.75, abs=1e-6) and out[3] - r[3] == pytest.approx(-1.0, abs=1e-6)
    assert out[0] - r[0] == pytest.approx(0.0, abs=1e-5)  # the longest correct row
    assert close(out[4:6], r[4:6])  # no correct row: unchanged
    assert out[6] - r[6] == pytest.approx(1e-5, abs=1e-7)  # single correct row: 1 - 10/10.0001
    assert out[7] - r[7] == pytest.approx(1 - 30 / 10.0001, abs=1e-9)
    assert out[8] == out[9] and out[10] - r[10] == pytest.approx(0.5, abs=1e-5)  # ties share the max
    assert out[11] - r[11] == pytest.approx(1 - 40 / 20.0001, abs=1e-9)  # truncated: all its 40 tokens
    assert out[12] - r[12] == pytest.approx(0.9, abs=1e-5)  # correct answer without the marker: measured, not max
    # weight 2 doubles the term; the group mean is then subtracted by group_mean (no std), as the authors
    out2 = tr("lc_length", rewards=r, lengths=lengths, truncated=torch.tensor(trunc, dtype=torch.bool),
              group_ids=torch.tensor(groups), reward_matrix=matrix(acc), reward_names=NAMES, batch=batch(texts),
              lc_length_weight=2.0, lc_think_end="Answer:")
    assert close(out2 - r, 2 * (out - r))
    # NaN rows stay NaN, and an empty marker is refused
    rn = r.clone()
    rn[1] = NAN
    out3 = tr("lc_length", rewards=rn, lengths=lengths, truncated=torch.tensor(trunc, dtype=torch.bool),
              group_ids=torch.tensor(groups), reward_matrix=matrix(acc), reward_names=NAMES, batch=batch(texts),
              lc_think_end="Answer:")
    assert math.isnan(out3[1]) and close(out3[2:], out[2:])
    with pytest.raises(ValueError, match="lc_think_end"):
        tr("lc_length", rewards=r, lengths=lengths, truncated=torch.tensor(trunc, dtype=torch.bool),
           group_ids=torch.tensor(groups), reward_matrix=matrix(acc), reward_names=NAMES, batch=batch(texts),
           lc_think_end="")


def test_lc_valid_thinking_end():
    from grpolab.rollouts.lc_r1 import lc_valid_thinking_end
    t = "30 + 12 = 42. so yes: 42.\n"
    assert t[:lc_valid_thinking_end(t, "42")] == "30 + 12 = 42."  # up to and including the first sentence
    assert lc_valid_thinking_end("so 142 or 42.5 or 4.42\n", "42") is None  # not a stand-alone answer
    t = "it is 7\nyes 7"
    assert t[:lc_valid_thinking_end(t, "7")] == "it is 7"  # a newline ends the sentence (not included)
    assert lc_valid_thinking_end("so 7", "7") == 4
    assert lc_valid_thinking_end("no answer here", "7") is None and lc_valid_thinking_end("7", "") is None


# ---------------------------------------------------------------- Unlikeliness (000-62)

def test_unlikeliness_hand_computed():
    # mean token log-probs per row (mask drops the padded token of rows 1 and 3):
    # row0 (-1-1)/2 = -1, row1 -3, row2 (-.5-.5)/2 = -.5, row3 -2   (one group of 4)
    lp = torch.tensor([[-1.0, -1.0], [-3.0, 9.0], [-0.5, -0.5], [-2.0, 9.0]])
    mask = torch.tensor([[1.0, 1], [1, 0], [1, 1], [1, 0]])
    b = SimpleNamespace(behavior_logprobs=lp, completion_mask=mask)
    # ranks ascending in likelihood: row1 0, row3 1, row0 2, row2 3 ; factor 1 - .5 rank / 4
    out = tr("unlikeliness", rewards=torch.tensor([1.0, 1.0, 1.0, 0.0]), group_ids=torch.zeros(4, dtype=torch.long),
             batch=b, unlikely_beta=0.5)
    assert close(out, [1 - 0.5 * 2 / 4, 1.0, 1 - 0.5 * 3 / 4, 0.0])
    # the rare correct sample now beats the likely one; wrong rows unchanged; beta 0 is the identity
    assert out[1] > out[0]
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert close(tr("unlikeliness", rewards=r, group_ids=torch.zeros(4, dtype=torch.long), batch=b,
                    unlikely_beta=0.0), r)


# ---------------------------------------------------------------- GCPO-geometry (000-56)

def test_gcpo_length_sign_and_hand_computed():
    lengths = torch.tensor([10, 40, 80, 80])
    m = matrix([1, 1, 1, 0])
    kw = dict(rewards=torch.zeros(4), lengths=lengths, reward_matrix=m, reward_names=NAMES,
              gcpo_len_weight=0.5, gcpo_len_target=40)
    # min(L/40, 1) = .25, 1, 1, 1 ; wrong row gets nothing (correct_only)
    assert close(tr("gcpo_length", **kw), [0.125, 0.5, 0.5, 0.0])
    assert close(tr("gcpo_length", gcpo_len_sign=-1.0, **kw), [-0.125, -0.5, -0.5, 0.0])
    assert close(tr("gcpo_length", gcpo_len_correct_only=False, **kw), [0.125, 0.5, 0.5, 0.5])


# ---------------------------------------------------------------- BAPO (000-109)

def test_bapo_idk_only_in_groups_without_a_correct_answer():
    texts = ["I don't know", "Answer: 3", "I DON'T KNOW.", "Answer: 5"]
    acc = [0, 1, 0, 0]  # group 0 (rows 0,1) has a correct answer, group 1 (rows 2,3) none
    kw = dict(rewards=torch.tensor(acc, dtype=torch.float32), group_ids=torch.tensor([0, 0, 1, 1]),
              reward_matrix=matrix(acc), reward_names=NAMES, batch=batch(texts), bapo_idk_reward=0.5)
    assert close(tr("bapo_idk", step=0, **kw), [0.0, 1.0, 0.5, 0.0])
    # modulator: in exploration with IDK ratio 2/4 = .5 > .3 the IDK reward is suspended ...
    assert close(tr("bapo_idk", step=0, bapo_exploration_steps=10, bapo_max_idk_ratio=0.3, **kw), acc)
    # ... not when the ratio is below the cap, and always on after exploration
    assert close(tr("bapo_idk", step=0, bapo_exploration_steps=10, bapo_max_idk_ratio=0.6, **kw), [0, 1, 0.5, 0])
    assert close(tr("bapo_idk", step=10, bapo_exploration_steps=10, bapo_max_idk_ratio=0.3, **kw), [0, 1, 0.5, 0])


# ---------------------------------------------------------------- countdown task

def test_countdown_checker():
    assert evaluate("(7 - 3) * 5") == (20, [7, 3, 5])
    assert check("(7 - 3) * 5", [3, 5, 7, 9], 20)
    assert check("9 / 3 + 7", [3, 7, 9], 10)
    assert not check("7 * 7 - 9", [3, 7, 9], 40)  # 7 used twice
    assert not check("3 + 4", [3, 7, 9], 7)  # 4 is not given
    assert not check("8 / 3 * 3", [8, 3, 3], 9)  # exact arithmetic: 8 != 9
    assert check("8 / 3 * 3", [8, 3, 3], 8)
    assert not check("2 ** 3", [2, 3], 8) and not check("-3 + 5", [3, 5], 2) and not check("7 / 0", [7, 0], 0)
    assert not check("__import__('os')", [1], 1)


def test_countdown_rewards_and_splits():
    comps = ["ok. Answer: (7 - 3) * 5", "Answer: 7 * 3", "Answer: (7 - 3) * 5 and more", "no answer"]
    nums, tgt = [[3, 5, 7]] * 4, ["20"] * 4
    assert cd_accuracy(completions=comps, numbers=nums, target=tgt) == [1.0, 0.0, 1.0, 0.0]
    assert cd_format(completions=comps) == [1.0, 1.0, 0.0, 0.0]
    t = get_task("countdown", n_train=300, n_eval=50, seed=3)
    assert len(t.train_rows) == 300 and len(t.eval_rows) == 50
    key = lambda r: (tuple(sorted(r["numbers"])), r["target"])  # noqa: E731
    assert not {key(r) for r in t.train_rows} & {key(r) for r in t.eval_rows}  # disjoint
    for r in t.train_rows + t.eval_rows:  # every reference solution is correct
        assert check(r["solution"], r["numbers"], int(r["target"])) and r["answer"] == r["target"]
        assert 2 <= r["level"] <= len(r["numbers"]) and len(r["hints"]) == 3
        assert [m["role"] for m in r["prompt"]] == ["system", "user"]
    again = get_task("countdown", n_train=300, n_eval=50, seed=3)
    assert again.train_rows == t.train_rows  # fixed by seed
    assert get_task("countdown", n_train=300, n_eval=50, seed=4).train_rows != t.train_rows
    # the reference solution scores 1 on accuracy and format
    r = t.train_rows[0]
    c = [f"Answer: {r['solution']}"]
    assert cd_accuracy(completions=c, numbers=[r["numbers"]], target=[r["target"]]) == [1.0]
    assert cd_format(completions=c) == [1.0]
    assert make_problem(random.Random(0))["prompt"][1]["content"].startswith("Using the numbers")


# ---------------------------------------------------------------- recipes

@pytest.mark.parametrize("name,transform", [
    ("redit", "redit"), ("grpo_lead_full", "lead_length_reward"), ("fgrpr", "fuzzy_numeric"),
    ("lc_r1", "lc_length"), ("rewarding_unlikely", "unlikeliness"),
    ("bapo_idk", "bapo_idk")])
def test_recipes_select_their_transform(name, transform):
    rec = recipe_overrides(name)
    assert rec["reward_transforms"] == [transform]
    cfg = Config.build(rec)
    Component(REWARD_TRANSFORMS.get(transform), cfg)  # every parameter resolves from the config
