"""Seed 000-115 (Group Invariant Learning, arXiv:2310.11971): the per-group adaptation of the exploration space —
a KL coefficient per automatic group of the auto_group sampler (regularizer auto_group_kl)."""
import io
import math

import pytest
import torch

from grpolab.algorithms.kl import kl_penalty
from grpolab.algorithms.regularizers import AutoGroupKL, group_adaptive_kl_coefficients
from grpolab.batch import RolloutBatch
from grpolab.config import Config, ConfigError
from grpolab.recipes import recipe_overrides
from grpolab.train.checkpoint import decode_state, encode_state
from grpolab.train.trainer import Trainer, build_sampler

T = torch.tensor


def fb(sampler, uids, rewards):
    sampler.feedback(prompt_uids=T(uids), rewards=T(rewards, dtype=torch.float32), group_ids=T(uids),
                     reward_matrix=T(rewards)[:, None], lengths=torch.ones(len(uids)), step=0)


def test_coefficients_by_hand():
    # s = (.2, .8), equal sizes: s_bar = .5; beta .04, kappa 2:
    # hard group: .04 * exp(2 * (.2 - .5)) = .04 * exp(-.6) = .04 * .548812 = .0219525
    # easy group: .04 * exp(2 * (.8 - .5)) = .04 * exp(.6) = .04 * 1.822119 = .0728848
    c = group_adaptive_kl_coefficients(T([.2, .8]), T([2.0, 2.0]), 0.04, 2.0)
    assert c.tolist() == pytest.approx([0.0219525, 0.0728848], rel=1e-5)
    # unequal sizes: s_bar = (3 * .2 + 1 * .8) / 4 = .35: exp(2 * -.15) = .740818, exp(2 * .45) = 2.459603
    c = group_adaptive_kl_coefficients(T([.2, .8]), T([3.0, 1.0]), 1.0, 2.0)
    assert c.tolist() == pytest.approx([0.740818, 2.459603], rel=1e-5)
    # relations: the hard group gets less than beta, the easy one more; kappa 0 gives beta everywhere;
    # equal success rates give beta everywhere
    assert c[0] < 1.0 < c[1]
    assert group_adaptive_kl_coefficients(T([.2, .8]), T([3.0, 1.0]), 0.5, 0.0).tolist() == [0.5, 0.5]
    assert group_adaptive_kl_coefficients(T([.4, .4, .4]), T([1.0, 2.0, 3.0]), 0.5, 3.0).tolist() == \
        pytest.approx([0.5, 0.5, 0.5])


def test_sampler_groups_drive_the_row_coefficients():
    cfg = Config.build({"prompt_sampler": "auto_group", "regularizers": ["auto_group_kl"], "beta": 0.04,
                        "auto_group_num_groups": 2, "auto_group_ema": 0.0, "auto_group_kl_scale": 2.0})
    s = build_sampler(cfg, [{}] * 4)
    # success rates after one visit each (ema 0): prompt 0: 0/4, 1: 4/4, 2: 2/4, 3: 1/4
    fb(s, [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4, [0] * 4 + [1] * 4 + [1, 1, 0, 0] + [1, 0, 0, 0])
    # regrouped: sorted 0 (0), 3 (.25) | 2 (.5), 1 (1): group 0 = {0, 3}, mean .125; group 1 = {1, 2}, mean .75
    assert s.row_groups([0, 1, 2, 3]).tolist() == [0, 1, 1, 0]
    assert s.group_success().tolist() == pytest.approx([0.125, 0.75])
    reg = AutoGroupKL(beta=0.04, auto_group_kl_scale=2.0)
    reg.bind(s)
    # s_bar = (.125 + .75) / 2 = .4375; hard: .04 exp(2 (.125 - .4375)) = .04 exp(-.625) = .04 * .535261 = .0214105
    # easy: .04 exp(2 (.75 - .4375)) = .04 exp(.625) = .04 * 1.868246 = .0747298
    assert reg.coefficients(T([0, 1, 2, 3])).tolist() == pytest.approx([0.0214105, 0.0747298, 0.0747298,
                                                                       0.0214105], rel=1e-5)
    # the term adds (beta_g - beta) KL to the trainer's beta KL: the total is beta_g KL, per row
    logp = T([[-1.0, -2.0], [-0.5, -0.3], [-1.2, -0.1], [-0.7, -0.9]])
    ref = T([[-1.1, -1.5], [-0.4, -0.6], [-1.0, -0.2], [-0.9, -0.8]])
    batch = RolloutBatch(prompt_ids=torch.zeros(4, 1, dtype=torch.long), prompt_mask=torch.ones(4, 1),
                         completion_ids=torch.zeros(4, 2, dtype=torch.long), completion_mask=torch.ones(4, 2),
                         behavior_logprobs=logp, group_ids=T([0, 1, 2, 3]), prompt_uids=T([0, 1, 2, 3]),
                         truncated=torch.zeros(4, dtype=torch.bool))
    term, metrics = reg(logprobs=logp, ref_logprobs=ref, batch=batch)
    kl = kl_penalty(logp, ref, "k3")
    coef = T([0.0214105, 0.0747298, 0.0747298, 0.0214105])[:, None]
    assert torch.allclose(0.04 * kl + term, coef * kl, rtol=1e-4)
    assert torch.allclose(metrics["kl_coef"], coef.expand(4, 2), rtol=1e-4)
    # k3 of row 0 token 0 by hand: x = ref - logp = -.1: exp(-.1) - (-.1) - 1 = .904837 + .1 - 1 = .0048374
    assert float(kl[0, 0]) == pytest.approx(0.0048374, rel=1e-4)


def test_config_checks_name_the_fields():
    with pytest.raises(ConfigError, match="beta"):
        Config.build({"prompt_sampler": "auto_group", "regularizers": ["auto_group_kl"], "beta": 0.0})
    with pytest.raises(ConfigError, match="prompt_sampler.*auto_group"):
        Config.build({"regularizers": ["auto_group_kl"], "beta": 0.04})


def test_resumed_sampler_gives_the_same_coefficients():
    cfg = Config.build({"prompt_sampler": "auto_group", "regularizers": ["auto_group_kl"], "beta": 0.04,
                        "auto_group_num_groups": 3})
    a = build_sampler(cfg, [{}] * 7)
    for k in range(3):
        idx = a.next(3)
        fb(a, idx, [float((u + k) % 2) for u in idx])
    buf = io.BytesIO()
    torch.save(encode_state(a.state_dict()), buf)
    buf.seek(0)
    b = build_sampler(cfg, [{}] * 7)
    b.load_state_dict(decode_state(torch.load(buf, weights_only=True)))
    ra, rb = AutoGroupKL(beta=0.04), AutoGroupKL(beta=0.04)
    ra.bind(a)
    rb.bind(b)
    uids = T(list(range(7)))
    assert torch.equal(ra.coefficients(uids), rb.coefficients(uids))


def test_recipe_trains_with_per_group_kl(tiny_args):
    """Smoke: the recipe's sampler binds the regulariser, two steps train, and the logged KL coefficient is
    a mean of the per-group values (not beta itself once the groups' success rates differ)."""
    cfg = Config.build({**recipe_overrides("auto_group_dro"), **tiny_args, "steps": 2, "save_steps": 2})
    assert cfg.regularizers == ["auto_group_kl"] and cfg.prompt_sampler == "auto_group"
    t = Trainer(cfg, log=lambda *a: None)
    reg = t.components["loss/auto_group_kl"].fn
    assert reg.sampler is t.sampler
    t.sampler.success[:] = torch.linspace(0.0, 1.0, t.sampler.num_rows, dtype=torch.float64)
    t.sampler.regroup()
    c = reg.coefficients(torch.arange(t.sampler.num_rows))
    assert c.min() < 0.04 < c.max()
    m = t.train_step()
    assert math.isfinite(m["loss"])
    m = t.train_step()
    assert math.isfinite(m["loss"])
