"""SEED-GRPO's focal scaling f(x) = (1 - x)^gamma (seed 000-86), hand-computed."""
import math

import pytest
import torch

from grpolab.algorithms import WEIGHTINGS
from grpolab.batch import RolloutBatch


def text_batch(texts):
    R = len(texts)
    return RolloutBatch(prompt_ids=torch.zeros(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1, dtype=torch.long),
                        completion_ids=torch.zeros(R, 1, dtype=torch.long), completion_mask=torch.ones(R, 1),
                        behavior_logprobs=torch.zeros(R, 1), group_ids=torch.zeros(R, dtype=torch.long),
                        prompt_uids=torch.zeros(R, dtype=torch.long), truncated=torch.zeros(R, dtype=torch.bool),
                        columns={"completion": list(texts)})


TEXTS = ["3", "3", "3", "5",     # p = 3/4, 1/4: SE = (0.287682 + 1.386294)/2 = 0.836988; / ln 4 = 0.603759
         "1", "2", "3", "4",     # all differ: SE / SE_max = 1
         "7", "7", "7", "7"]     # one answer: SE = 0
GIDS = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)


def test_focal_factor_by_hand():
    fn = WEIGHTINGS.get("seed_semantic_entropy")
    batch = text_batch(TEXTS)
    adv = torch.tensor([1.5, -0.5, -0.5, -0.5, 2.0, -1.0, 0.0, 1.0, 0.3, -0.3, 0.0, 0.0])
    out = fn(adv, GIDS, batch, seed_alpha=0.5, seed_scaling="focal", seed_focal_gamma=2.0,
             seed_cluster_probability="frequency")
    # group 0: x = 0.5 * 0.603759 = 0.301880; f = (1 - 0.301880)^2 = 0.698120^2 = 0.487372
    # group 1: x = 0.5; f = 0.25.  group 2: x = 0; f = 1 (confident prompt keeps its advantages exactly)
    f0 = 0.487372
    assert out[:4].tolist() == pytest.approx([1.5 * f0, -0.5 * f0, -0.5 * f0, -0.5 * f0], abs=1e-6)
    assert out[4:8].tolist() == pytest.approx([0.5, -0.25, 0.0, 0.25])
    assert torch.equal(out[8:], adv[8:])
    # a second computation of f0 from the cluster counts
    se = -(math.log(3 / 4) + math.log(1 / 4)) / 2
    assert f0 == pytest.approx((1 - 0.5 * se / math.log(4)) ** 2, abs=1e-6)


def test_focal_relations():
    fn = WEIGHTINGS.get("seed_semantic_entropy")
    batch = text_batch(TEXTS)
    ones = torch.ones(12)
    kw = dict(seed_alpha=0.5, seed_cluster_probability="frequency")
    lin = fn(ones, GIDS, batch, seed_scaling="linear", **kw)
    # gamma = 1 is the linear f; gamma = 0 switches the scaling off
    assert fn(ones, GIDS, batch, seed_scaling="focal", seed_focal_gamma=1.0, **kw).tolist() == pytest.approx(lin.tolist())
    assert fn(ones, GIDS, batch, seed_scaling="focal", seed_focal_gamma=0.0, **kw).tolist() == pytest.approx([1.0] * 12)
    # gamma > 1 damps uncertain groups more than the linear f, the more uncertain the more
    foc = fn(ones, GIDS, batch, seed_scaling="focal", seed_focal_gamma=3.0, **kw)
    assert foc[4] < foc[0] < 1.0 and foc[0] < lin[0] and foc[4] < lin[4]
    assert foc[4].item() == pytest.approx(0.125)  # (1 - 0.5)^3
    # alpha = 1, every answer different: f = 0 (never negative)
    assert fn(ones, GIDS, batch, seed_alpha=1.0, seed_scaling="focal",
              seed_cluster_probability="frequency")[4:8].tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="seed_focal_gamma"):
        fn(ones, GIDS, batch, seed_scaling="focal", seed_focal_gamma=-1.0, **kw)
    with pytest.raises(ValueError, match="focal"):
        fn(ones, GIDS, batch, seed_scaling="cubic", **kw)
