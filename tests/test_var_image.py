"""var_image (next-scale image policy) and the VAR RL components of 000-27: hand-computed weights, masks and
advantages; vmr_scale = last scale is plain GRPO; recomputed log-probs equal the behaviour ones."""
from __future__ import annotations

import types

import pytest
import torch

from grpolab.algorithms.adv_var import var_middle_return_advantage
from grpolab.algorithms.advantages import group_zscore
from grpolab.algorithms.weightings import span_balance
from grpolab.policies.var_image.model import OFFSETS, TOKENS, VarCodebook, scale_ids
from grpolab.policies.var_image.masks import propagate, top_q_mask

from _helpers import LEARNING_SEEDS  # noqa: E402


def test_span_balance_by_hand():
    # row 0: spans 1,1,2,2,2,2 (6 tokens, 2 spans): w = 6/(2*2) = 1.5 on span 1, 6/(2*4) = 0.75 on span 2
    # row 1: last two tokens off the mask: spans 1,1,2,2 -> 4/(2*2) = 1 everywhere alive, 0 off
    ids = torch.tensor([[1, 1, 2, 2, 2, 2], [1, 1, 2, 2, 2, 2]])
    mask = torch.tensor([[1., 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    batch = types.SimpleNamespace(span_ids=ids)
    out = span_balance(torch.tensor([2.0, -1.0]), mask, batch)
    assert torch.allclose(out, torch.tensor([[3.0, 3.0, 1.5, 1.5, 1.5, 1.5], [-1.0, -1, -1, -1, 0, 0]]))
    # var_image's layout: 85/(4*1), 85/(4*4), 85/(4*16), 85/(4*64), summing to 85 per row
    w = span_balance(torch.ones(1), torch.ones(1, TOKENS), types.SimpleNamespace(span_ids=scale_ids()[None]))
    assert w[0, 0] == pytest.approx(85 / 4) and w[0, 1] == pytest.approx(85 / 16)
    assert w[0, 5] == pytest.approx(85 / 64) and w[0, 21] == pytest.approx(85 / 256)
    assert float(w.sum()) == pytest.approx(85.0)


def test_mask_propagation_by_hand():
    sal = torch.zeros(1, 8, 8)
    sal[0, 0, 0], sal[0, 7, 7], sal[0, 3, 4] = 3.0, 2.0, 1.0
    keep = top_q_mask(sal, 2 / 64)  # the two largest: (0,0) and (7,7)
    assert keep.sum() == 2 and keep[0, 0, 0] and keep[0, 7, 7]
    tok = propagate(keep)[0]
    assert tok.shape == (85,)
    assert tok[0]  # 1x1 covers everything
    assert tok[1:5].tolist() == [True, False, False, True]  # 2x2: top-left and bottom-right quadrants
    s3 = tok[5:21].reshape(4, 4)
    assert s3[0, 0] and s3[3, 3] and int(s3.sum()) == 2
    s4 = tok[21:].reshape(8, 8)
    assert s4[0, 0] and s4[7, 7] and int(s4.sum()) == 2
    # ties: lower raster index first
    assert top_q_mask(torch.ones(1, 8, 8), 1 / 64)[0, 0, 0] and top_q_mask(torch.ones(1, 8, 8), 1 / 64).sum() == 1


def test_codebook_round_trip_is_exact_for_representable_images():
    book = VarCodebook(torch.linspace(-1, 1, 32))
    codes = torch.randint(0, 32, (3, TOKENS))
    img = book.decode(codes)
    assert img.shape == (3, 1, 8, 8)
    assert OFFSETS == (0, 1, 5, 21, 85)


def _batch(rewards, groups, prefixes, last):
    return types.SimpleNamespace(columns={"vmr_prefix": prefixes, "vmr_scale": [last] * len(prefixes)},
                                 span_ids=scale_ids().expand(len(prefixes), -1).clone())


def test_vmr_advantages_by_hand():
    # one prompt, 2 prefixes x 2 continuations: r = [1, 0, 0.5, 0.5]; V = [0.5, 0.5] -> prefix z-score 0 (equal)
    # remainder d = [0.5, -0.5, 0, 0]: mean 0, std (Bessel) = sqrt(0.5/3); A = d / (std + 1e-4)
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    g = torch.zeros(4, dtype=torch.long)
    adv = var_middle_return_advantage(r, g, torch.ones(4, TOKENS), _batch(r, g, [0, 0, 1, 1], 2))
    std = (0.5 / 3) ** 0.5
    assert torch.allclose(adv[:, :5], torch.zeros(4, 5))
    assert torch.allclose(adv[:, 5], torch.tensor([0.5, -0.5, 0, 0]) / (std + 1e-4), atol=1e-5)
    # unequal prefixes: r = [1, 1, 0, 0] -> V = [1, 0], z = +-(0.5/(sqrt(0.5)+1e-4)); remainders 0
    r2 = torch.tensor([1.0, 1.0, 0.0, 0.0])
    adv2 = var_middle_return_advantage(r2, g, torch.ones(4, TOKENS), _batch(r2, g, [0, 0, 1, 1], 2))
    z = 0.5 / (0.5 ** 0.5 + 1e-4)
    assert torch.allclose(adv2[:, 0], torch.tensor([z, z, -z, -z]), atol=1e-5)
    assert torch.allclose(adv2[:, 5:], torch.zeros(4, 80))


def test_vmr_last_scale_is_plain_grpo():
    r = torch.tensor([0.2, 0.9, 0.4, 0.1, 0.7, 0.3])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = var_middle_return_advantage(r, g, torch.ones(6, TOKENS), _batch(r, g, list(range(6)), 4))
    assert torch.allclose(adv, group_zscore(r, g)[:, None].expand(6, TOKENS).float())


@pytest.fixture(scope="module")
def policy():
    from grpolab.policies.var_image.policy import VARImagePolicy
    p = VARImagePolicy(model="tiny", temperature=1.0)
    module = p.load(None, [{"label": 1}], [], log=lambda *a: None)
    return p, module


ROWS = [{"label": 3, "prompt": "3"}, {"label": 7, "prompt": "7"}]


def test_recomputed_logprobs_equal_behaviour(policy):
    p, module = policy
    b = p.sample(module, ROWS, [0, 1], num_generations=4, generator=torch.Generator().manual_seed(0))
    assert b.completion_ids.shape == (8, TOKENS) and torch.equal(b.span_ids[0], scale_ids())
    assert b.row_data["images"].shape == (8, 1, 8, 8) and b.columns["completion"][0].shape == (8, 8, 1)
    out = p.forward(module, b, want=frozenset({"entropy"}), grad=False)
    assert torch.allclose(out["logprobs"], b.behavior_logprobs, atol=1e-4)
    assert out["entropy"].shape == (8, TOKENS)


def test_vmr_rollout_last_scale_draws_as_generate(policy):
    from grpolab.policies.var_image.middle_return import var_middle_return
    p, module = policy
    cfg = types.SimpleNamespace(num_generations=4, temperature=1.0)
    ctx = types.SimpleNamespace(cfg=cfg, actions=p, policy=module, sampling_generator=torch.Generator().manual_seed(5),
                                score=lambda b: None)
    b = var_middle_return(ctx, ROWS, [0, 1], 0, vmr_scale=4, vmr_continuations=2)
    plain = p.sample(module, ROWS, [0, 1], num_generations=4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(b.completion_ids, plain.completion_ids)
    assert torch.equal(b.completion_mask, plain.completion_mask)
    # a middle scale: 2 prefixes x 2 continuations per prompt share their prefix tokens; duplicates off the mask
    ctx.sampling_generator = torch.Generator().manual_seed(5)
    b2 = var_middle_return(ctx, ROWS, [0, 1], 0, vmr_scale=2, vmr_continuations=2)
    assert torch.equal(b2.completion_ids[0, :5], b2.completion_ids[1, :5])
    assert b2.completion_mask[1, :5].sum() == 0 and b2.completion_mask[0, :5].sum() == 5
    out = p.forward(module, b2, grad=False)["logprobs"]
    assert torch.allclose(out, b2.behavior_logprobs, atol=1e-4)


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
def test_var_grpo_raises_the_held_out_confidence_on_every_seed(tmp_path, seed):
    """The var_grpo recipe (middle return, span balance, mask propagation) on the digits task, 30 steps: the
    held-out confidence of the asked class rises. Measured (50 held-out rows): AVX512-BF16 kernels 0.150 -> 0.261
    / 0.323 / 0.247 (seeds 0, 1, 2); AVX2 kernels with the models rebuilt on them (make test-avx2's variables)
    0.153 -> 0.279 / 0.324 / 0.265. At 20 steps the rise was 0.05-0.08 on AVX512 but 0.018 on AVX2 seed 0, too
    close to a margin. Asserted: a rise of 0.04."""
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    cfg = Config.build({**recipe_overrides("var_grpo"), "steps": 30, "seed": seed, "save_steps": 100,
                        "out": str(tmp_path / "run"), "stall_steps": 0, "threads": 1})
    summary = Trainer(cfg, log=lambda *a: None).train(progress=False)
    before, after = (summary[k]["rewards/digit_confidence/mean"] for k in ("before", "after"))
    assert after > before + 0.04, (before, after)
