"""AWPO's tailored clipping (seed 000-118): the clipped-ratio surrogate on a clipped mixed advantage, by hand."""
import math

import pytest
import torch

from grpolab.algorithms import POLICY_LOSSES
from grpolab.config import Config
from grpolab.errors import ConfigError


def run(ratios, advs, **kw):
    lp = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros_like(lp)
    adv = torch.tensor([advs], dtype=torch.float64)
    loss, metrics = POLICY_LOSSES.get("awpo_clipped")(lp, old, adv, torch.ones_like(old), **kw)
    loss.sum().backward()
    return loss.detach()[0].tolist(), lp.grad[0].tolist(), {k: v[0].tolist() for k, v in metrics.items()}


def test_awpo_clipped_by_hand():
    # eps = 0.2 (ratio in [0.8, 1.2]), c = 3
    #  token  ratio  A     A^    loss                                  d loss / d log pi
    #  0      1.1    1     1     -1.1 (inside both clips)                -1.1   (= -rho A)
    #  1      1.1    5     3     -3.3 (advantage clipped)                -3.3   (= -rho c: smaller, same sign)
    #  2      1.5    5     3     -min(4.5, 3.6) = -3.6 (ratio clipped)    0
    #  3      0.5   -5    -3     -min(-1.5, -2.4) = 2.4 (ratio clipped)   0
    #  4      1.5   -5    -3     -min(-4.5, -3.6) = 4.5 (pessimistic)     4.5   (= -rho A^)
    #  5      1.0    3     3     -3.0 (at the bound: not clipped)        -3.0
    #  6      1.0   -3.5  -3      3.0                                     3.0
    loss, grad, m = run([1.1, 1.1, 1.5, 0.5, 1.5, 1.0, 1.0], [1, 5, 5, -5, -5, 3, -3.5],
                        epsilon=0.2, awpo_adv_clip=3.0)
    assert loss == pytest.approx([-1.1, -3.3, -3.6, 2.4, 4.5, -3.0, 3.0])
    assert grad == pytest.approx([-1.1, -3.3, 0.0, 0.0, 4.5, -3.0, 3.0])
    assert m["awpo_adv_clip_frac"] == [0, 1, 1, 1, 1, 0, 1]
    assert m["clip_frac_high"] == [0, 0, 1, 0, 0, 0, 0]
    assert m["clip_frac_low"] == [0, 0, 0, 1, 0, 0, 0]


def test_awpo_clipped_relations():
    torch.manual_seed(0)
    lp = torch.randn(3, 5, dtype=torch.float64) * 0.3
    old = torch.randn(3, 5, dtype=torch.float64) * 0.3
    mask = torch.ones(3, 5)
    adv = torch.tensor([2.5, -1.0, 0.3], dtype=torch.float64)  # all inside c = 3
    ref, _ = POLICY_LOSSES.get("clipped_ratio")(lp, old, adv, mask, epsilon=0.2, epsilon_high=0.28)
    got, _ = POLICY_LOSSES.get("awpo_clipped")(lp, old, adv, mask, epsilon=0.2, epsilon_high=0.28)
    assert torch.equal(got, ref)  # |A| <= c: clipped_ratio exactly
    big = torch.tensor([30.0, -30.0, 3.0], dtype=torch.float64)
    capped, _ = POLICY_LOSSES.get("clipped_ratio")(lp, old, big.clamp(-3, 3), mask, epsilon=0.2)
    got, _ = POLICY_LOSSES.get("awpo_clipped")(lp, old, big, mask, epsilon=0.2, awpo_adv_clip=3.0)
    assert torch.allclose(got, capped)  # beyond c: the surrogate of the clipped advantage
    with pytest.raises(ConfigError, match="awpo_adv_clip"):
        Config.build({"policy_loss": "awpo_clipped", "awpo_adv_clip": 0.0})
