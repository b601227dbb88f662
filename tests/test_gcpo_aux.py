"""GCPO (GeometryZero, 000-56): Group Contrastive Masking (gcpo_aux_mask), the arithmetic_aux task, the recipe."""
import re
from types import SimpleNamespace

import pytest
import torch

from grpolab.components import Component
from grpolab.config import Config
from grpolab.recipes import recipe_overrides
from grpolab.rewards.transforms import REWARD_TRANSFORMS
from grpolab.tasks import get_task
from grpolab.tasks.arithmetic import accuracy, format_reward
from grpolab.tasks.arithmetic_aux import AUX_PATTERN

from _helpers import close, tr  # noqa: E402

NAMES = ["accuracy", "format"]
AUX = "<aux>2 + 3 = 5; 5 * 2 = 10</aux>\nAnswer: 10"
AUX_WRONG = "<aux>2 + 3 = 6</aux>\nAnswer: 12"
PLAIN = "Answer: 10"
PLAIN_WRONG = "Answer: 11"


def _kw(texts, acc, groups, **extra):
    m = torch.tensor([acc, [0.0] * len(acc)], dtype=torch.float32).T
    return dict(rewards=torch.tensor(acc, dtype=torch.float32), group_ids=torch.tensor(groups), reward_matrix=m,
                reward_names=NAMES, batch=SimpleNamespace(columns={"completion": texts}), **extra)


def test_gcpo_aux_mask_hand_computed():
    # M per group from d = acc(with <aux>) - acc(without); rows with <aux> get + 0.5 * M, others unchanged.
    # group 0 (rows 0-3):  with 2/2, without 0/2 -> d = +1   -> M = +1: rows 0, 1: 1 + 0.5 = 1.5
    # group 1 (rows 4-7):  with 0/2, without 1/2 -> d = -0.5 -> M = -1: rows 4, 5: 0 - 0.5 = -0.5
    # group 2 (rows 8-10): with 1/2, without 1/1 -> d = -0.5 -> M = -1: row 8: 1 - 0.5 = 0.5, row 9: -0.5
    # group 3 (rows 11-12): every row uses <aux> -> no contrast, M = 0: rewards unchanged
    texts = [AUX, AUX, PLAIN_WRONG, PLAIN_WRONG,
             AUX_WRONG, AUX_WRONG, PLAIN, PLAIN_WRONG,
             AUX, AUX_WRONG, PLAIN,
             AUX, AUX_WRONG]
    acc = [1, 1, 0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 0]
    groups = [0] * 4 + [1] * 4 + [2] * 3 + [3] * 2
    out = tr("gcpo_aux_mask", **_kw(texts, acc, groups, gcpo_aux_weight=0.5))
    assert close(out, [1.5, 1.5, 0, 0, -0.5, -0.5, 1, 0, 0.5, -0.5, 1, 1, 0])


def test_gcpo_aux_mask_margin_weight_and_pattern():
    # one group: with <aux> 2/3 correct, without 1/2 -> d = 2/3 - 1/2 = 1/6 ~ 0.1667
    texts = [AUX, AUX, AUX_WRONG, PLAIN, PLAIN_WRONG]
    acc = [1, 1, 0, 1, 0]
    g = [7] * 5
    assert close(tr("gcpo_aux_mask", **_kw(texts, acc, g, gcpo_aux_weight=0.3)), [1.3, 1.3, 0.3, 1, 0])
    # a margin above 1/6 zeroes the mask; one below keeps it
    assert close(tr("gcpo_aux_mask", **_kw(texts, acc, g, gcpo_aux_margin=0.2)), acc)
    assert close(tr("gcpo_aux_mask", **_kw(texts, acc, g, gcpo_aux_margin=0.1)), [1.5, 1.5, 0.5, 1, 0])
    # another marker: a pattern that matches only the plain rows swaps the sides: "with" = rows 3, 4 (1/2),
    # "without" = rows 0-2 (2/3) -> d = -1/6 -> M = -1 on rows 3, 4: 1 - 0.5 = 0.5 and 0 - 0.5 = -0.5
    out = tr("gcpo_aux_mask", **_kw(texts, acc, g, gcpo_aux_pattern=r"^Answer"))
    assert close(out, [1, 1, 0, 0.5, -0.5])
    with pytest.raises(ValueError, match="gcpo_aux_pattern"):
        tr("gcpo_aux_mask", **_kw(texts, acc, g, gcpo_aux_pattern="("))


def test_gcpo_aux_mask_matches_a_second_computation():
    # independent re-computation with plain Python lists over random groups
    gen = torch.Generator().manual_seed(0)
    n, G = 24, 4
    use = (torch.rand(n, generator=gen) < 0.5).tolist()
    acc = (torch.rand(n, generator=gen) < 0.5).float().tolist()
    texts = [("<aux>x</aux> " if u else "") + "Answer: 1" for u in use]
    groups = [i // G for i in range(n)]
    out = tr("gcpo_aux_mask", **_kw(texts, acc, groups))
    expect = []
    for i in range(n):
        rows = [j for j in range(n) if groups[j] == groups[i]]
        w = [acc[j] for j in rows if use[j]]
        wo = [acc[j] for j in rows if not use[j]]
        m = 0.0
        if w and wo:
            d = sum(w) / len(w) - sum(wo) / len(wo)
            m = 1.0 if d > 0 else (-1.0 if d < 0 else 0.0)
        expect.append(acc[i] + (0.5 * m if use[i] else 0.0))
    assert close(out, expect)


def test_arithmetic_aux_task_rows_and_disjoint_splits():
    t = get_task("arithmetic_aux")
    assert len(t.train_rows) == 600 and len(t.eval_rows) == 100
    train_q = {r["question"] for r in t.train_rows}
    assert len(train_q) == 600 and not train_q & {r["question"] for r in t.eval_rows}
    assert {r["level"] for r in t.train_rows} == {1, 2, 3}
    assert get_task("arithmetic_aux").train_rows[:5] == t.train_rows[:5]  # same seed, same rows
    pat = re.compile(AUX_PATTERN, re.S)
    for r in t.train_rows[:50]:
        assert "<aux>" in r["prompt"][-1]["content"] and r["question"] in r["prompt"][-1]["content"]
        sol = [r["solution"]]
        # the worked solution is correct and well formatted; it uses <aux> exactly on multi-step questions
        assert accuracy(completions=sol, answer=[r["answer"]]) == [1.0] and format_reward(completions=sol) == [1.0]
        assert bool(pat.search(r["solution"])) == (r["level"] >= 2)
    # a 2-step row's <aux> span holds its two steps "x op n = y; y op m = z", z being the answer
    row = next(r for r in t.train_rows if r["level"] == 2)
    steps = re.search(r"<aux>(.*)</aux>", row["solution"]).group(1).split("; ")
    assert len(steps) == 2 and steps[-1].split(" = ")[1] == row["answer"]


def test_gcpo_geometry_recipe_selects_both_transforms():
    rec = recipe_overrides("gcpo_geometry")
    assert rec["reward_transforms"] == ["gcpo_aux_mask", "gcpo_length"] and rec["task"] == "arithmetic_aux"
    cfg = Config.build(rec)
    for name in rec["reward_transforms"]:
        Component(REWARD_TRANSFORMS.get(name), cfg)  # every parameter resolves from the config
