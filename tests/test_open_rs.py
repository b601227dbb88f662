"""Open-RS (seed 000-60): the cosine length-scaled reward (hand-computed) and the open_rs recipe."""
import math
from types import SimpleNamespace

import pytest
import torch

from _helpers import close, tr  # noqa: E402

NAMES = ["accuracy", "format"]


def _batch(texts):
    return SimpleNamespace(columns={"completion": texts})


def test_cosine_length_reward_hand_computed():
    # cosine_max_len 100 characters; R = lo + (hi - lo)/2 * (1 + cos(pi L / 100))
    #   correct: lo 0.5, hi 1.0 -> L 0: 1.0, L 50: 0.75, L 100: 0.5, L 200: cos(2 pi) = 1 -> 1.0 (no clamp)
    #   wrong (script defaults, swapped): lo -0.5, hi 0.0 -> L 0: 0.0, L 50: -0.25, L 100: -0.5
    #   L 25 correct: cos(pi/4) = 0.70711 -> 0.5 + 0.25 * 1.70711 = 0.92678
    lengths = [0, 50, 100, 200, 0, 50, 100, 25]
    acc = [1, 1, 1, 1, 0, 0, 0, 1]
    texts = ["x" * n for n in lengths]
    r = torch.tensor([0.5, 0.0, 0.5, 0.5, 0.0, 0.5, 0.0, 0.5], dtype=torch.float64)  # e.g. the format term
    m = torch.tensor([acc, [0.0] * 8], dtype=torch.float64).T
    out = tr("cosine_length_reward", rewards=r, reward_matrix=m, reward_names=NAMES, batch=_batch(texts),
             cosine_max_len=100, cosine_reward_weight=2.0)
    cos_term = [1.0, 0.75, 0.5, 1.0, 0.0, -0.25, -0.5, 0.5 + 0.25 * (1 + math.sqrt(0.5))]
    assert close(out, [ri + 2.0 * c for ri, c in zip(r.tolist(), cos_term)])
    assert out[7] - r[7] == pytest.approx(2 * 0.926777, abs=1e-5)
    # shorter is better among correct rows and among wrong rows (up to cosine_max_len)
    assert out[0] - r[0] > out[1] - r[1] > out[2] - r[2] and out[4] - r[4] > out[5] - r[5] > out[6] - r[6]


def test_cosine_length_reward_function_defaults_and_unscorable_rows():
    # the authors' function defaults (min_wrong -1.0, max_wrong -0.5): wrong L 0 -> -1.0, L max -> -0.5
    nan = float("nan")
    m = torch.tensor([[0.0, 0.0, nan, 1.0], [0.0] * 4], dtype=torch.float64).T
    r = torch.tensor([0.0, 0.0, 0.3, nan], dtype=torch.float64)
    out = tr("cosine_length_reward", rewards=r, reward_matrix=m, reward_names=NAMES,
             batch=_batch(["", "y" * 10, "z", "w"]), cosine_max_len=10, cosine_min_value_wrong=-1.0,
             cosine_max_value_wrong=-0.5, cosine_reward_weight=1.0)
    assert out[0].item() == pytest.approx(-1.0) and out[1].item() == pytest.approx(-0.5)
    assert out[2].item() == pytest.approx(0.3)  # unscorable accuracy: unchanged
    assert math.isnan(out[3].item())  # unscorable row stays NaN
    with pytest.raises(ValueError, match="cosine_max_len"):
        tr("cosine_length_reward", rewards=r, reward_matrix=m, reward_names=NAMES, batch=_batch(["a"] * 4),
           cosine_max_len=0)


def test_open_rs_recipe_settings():
    from grpolab.recipes import recipe_overrides
    flat = recipe_overrides("open_rs")
    assert flat["reward_transforms"] == ["cosine_length_reward"]
    assert flat["reward_weights"] == [0.0, 1.0] and flat["cosine_reward_weight"] == 2.0
    assert flat["num_generations"] == 6 and flat["temperature"] == 0.7 and flat["beta"] == 0.04
    # the pinned TRL commit (69ad852) divides the summed token losses by the token count: token_mean
    assert flat["loss_aggregation"] == "token_mean" and flat["kl_estimator"] == "k3"
