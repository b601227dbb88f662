"""Advantage baselines, normalisations and multi-reward estimators, and the difficulty weightings (hand-computed)."""
import math
from types import SimpleNamespace

import pytest
import torch

from grpolab.algorithms import ADVANTAGES, WEIGHTINGS, combine_rewards, group_mean, group_zscore
from grpolab.components import Component
from grpolab.config import Config
from grpolab.recipes import load_recipe, recipe_overrides

G2 = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
R2 = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])  # group accuracies 0.25 and 0.5


def adv(name, *args, **kw):
    return ADVANTAGES.get(name)(*args, **kw)


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                          atol=tol, rtol=0)


# ---------------------------------------------------------------- leave_one_out (RLOO)

def test_leave_one_out_hand_computed():
    # group 0: 1 - (0+0+0)/3 = 1;  0 - (1+0+0)/3 = -1/3
    # group 1: 1 - (1+0+0)/3 = 2/3; 0 - (1+1+0)/3 = -2/3
    assert close(adv("leave_one_out", R2, G2), [1, -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3])
    # NaN row left out (n = 2: 1 - 0 = 1, 0 - 1 = -1); a singleton group gets 0
    r = torch.tensor([1.0, float("nan"), 0.0, 5.0])
    assert close(adv("leave_one_out", r, torch.tensor([0, 0, 0, 1])), [1, 0, -1, 0])


def test_rloo_is_g_over_g_minus_one_times_group_mean():
    r = torch.rand(15, generator=torch.Generator().manual_seed(0))
    g = torch.arange(3).repeat_interleave(5)
    assert close(adv("leave_one_out", r, g), 5 / 4 * group_mean(r, g))


# ---------------------------------------------------------------- batch-level normalisation

def test_batch_zscore_reinforce_pp_baseline_hand_computed():
    # r - mean_g = [.75,-.25,-.25,-.25, .5,.5,-.5,-.5]; batch mean 0;
    # Bessel var = (.5625 + 3*.0625 + 4*.25) / 7 = 1.75/7 = .25 -> std .5 -> A = 2 (r - mean_g)
    # (the per-completion variant, batch_zscore_over="completions")
    assert close(adv("batch_zscore", R2, G2, advantage_epsilon=0.0, batch_zscore_over="completions"),
                 [1.5, -.5, -.5, -.5, 1, 1, -1, -1])
    # the whitening also removes a non-zero batch mean: one group [1, 0] and one [1, 0, NaN]
    for over in ("tokens", "completions"):
        out = adv("batch_zscore", torch.tensor([1.0, 0, 1, 0, float("nan")]), torch.tensor([0, 0, 1, 1, 1]),
                  batch_zscore_over=over)
        assert out[4] == 0 and abs(float(out[:4].mean())) < 1e-6


def _openrlhf_reinforce_baseline(rewards, n, lengths, T):
    """OpenRLHF experience_maker.py, estimator reinforce_baseline, written out independently in float64:
    per-group mean baseline, gamma = 1 returns (every valid token carries the sequence value), then the
    token-level whitening over the batch: masked mean, biased masked variance, var.clamp(min=1e-8).rsqrt()."""
    r = torch.tensor(rewards, dtype=torch.float64).reshape(-1, n)
    r = (r - r.mean(-1, keepdim=True)).reshape(-1)
    mask = torch.tensor([[1.0] * L + [0.0] * (T - L) for L in lengths], dtype=torch.float64)
    returns = r[:, None] * mask
    num = mask.sum()
    mean = (returns * mask).sum() / num
    var = ((returns - mean).pow(2) * mask).sum() / num
    adv = (returns - mean) * var.clamp(min=1e-8).rsqrt()
    return adv, mask


def test_batch_zscore_whitens_over_tokens_like_openrlhf():
    rewards, lengths, T = [1.0, 0, 0, 0, 1, 1, 0, 0], [2, 10, 10, 10, 3, 7, 1, 9], 10
    expect, mask = _openrlhf_reinforce_baseline(rewards, 4, lengths, T)
    got = adv("batch_zscore", torch.tensor(rewards), G2, mask.float())
    assert got.shape == (8,)
    assert close(got[:, None] * mask, expect * mask)  # OpenRLHF also shifts padding; the trainer zeroes it
    # hand check of row 0: a = [.75,-.25,-.25,-.25,.5,.5,-.5,-.5], 52 tokens, mu = (1.5-7.5+5-5)/52 = -6/52
    a = torch.tensor([.75, -.25, -.25, -.25, .5, .5, -.5, -.5], dtype=torch.float64)
    L = torch.tensor(lengths, dtype=torch.float64)
    mu = -6 / 52
    var = float((L * (a - mu) ** 2).sum() / 52)
    assert close(got[0], (.75 - mu) / math.sqrt(var))
    # per-completion whitening differs a lot on unequal lengths
    per_completion = adv("batch_zscore", torch.tensor(rewards), G2, mask.float(), batch_zscore_over="completions")
    assert abs(float(per_completion[0]) - float(got[0])) > 0.3
    # equal lengths: the token statistics are the per-completion ones with the biased variance
    eq = adv("batch_zscore", R2, G2, torch.ones(8, 5))
    centred = torch.tensor([.75, -.25, -.25, -.25, .5, .5, -.5, -.5])
    assert close(eq, centred / centred.pow(2).mean().sqrt())
    # an unscorable row is left out of the statistics and gets 0
    r = torch.tensor(rewards + [float("nan")])
    g = torch.cat([G2, torch.tensor([1])])
    m = torch.cat([mask.float(), torch.ones(1, T)])
    out = adv("batch_zscore", r, g, m)
    assert out[8] == 0 and close(out[:8], got)


def test_group_mean_batch_std_lite_ppo_hand_computed():
    # batch mean .375; Bessel var = (3*.625^2 + 5*.375^2)/7 = 1.875/7; std = .5175492
    std = math.sqrt(1.875 / 7)
    expect = torch.tensor([.75, -.25, -.25, -.25, .5, .5, -.5, -.5]) / std
    assert close(adv("group_mean_batch_std", R2, G2, advantage_epsilon=0.0), expect)
    assert close(expect[0], 1.449138, 1e-5)


def test_two_grpo_mixed_pair_opposite_sign_equal_size():
    # G = 2: std of [1, 0] is |1-0|/sqrt(2) = .7071068, so A = +-.5/(.7071068 + 1e-4) = +-.7070068
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    a = group_zscore(r, g)
    assert close(a, [.7070068, -.7070068, 0, 0, -.7070068, .7070068], 1e-6)
    assert a[0] == -a[1] and a[0] > 0 and a[2] == 0 and a[3] == 0


# ---------------------------------------------------------------- GPG

def test_gpg_alpha_variants_hand_computed():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])  # group 1 has zero variance: M = 4 of B = 8
    centred = torch.tensor([.75, -.25, -.25, -.25, 0, 0, 0, 0])
    assert close(adv("gpg", r, G2), 2.0 * centred)  # alpha = 8 / (8 - 4)
    assert close(adv("gpg", r, G2, gpg_alpha="nonzero"), 8 / 5 * centred)  # 5 non-zero rewards
    assert close(adv("gpg", r, G2, gpg_alpha="none"), centred)
    # F_norm = std: group 0 std = sqrt(.75/3) = .5 -> 2 * [.75, -.25] / .5 = [3, -1]
    assert close(adv("gpg", r, G2, gpg_std_normalize=True, advantage_epsilon=0.0), [3, -1, -1, -1, 0, 0, 0, 0])
    # no valid row: alpha falls back to 1 and everything is 0
    assert close(adv("gpg", torch.ones(4), torch.tensor([0, 0, 1, 1])), torch.zeros(4))
    with pytest.raises(ValueError, match="gpg_alpha"):
        adv("gpg", r, G2, gpg_alpha="bogus")


# ---------------------------------------------------------------- MathForge DGPO

def test_group_mad_hand_computed_and_constant_update_size():
    # group 0: |dev| sum = .75 + 3*.25 = 1.5 -> A = 4 dev / 1.5 = [2, -2/3, -2/3, -2/3]
    # group 1: |dev| sum = 4*.5 = 2 -> A = 4 dev / 2 = [1, 1, -1, -1]
    a = adv("group_mad", R2, G2, advantage_epsilon=0.0)
    assert close(a, [2, -2 / 3, -2 / 3, -2 / 3, 1, 1, -1, -1])
    # Theorem: sum_i |A_i| = n for every non-degenerate group, whatever its accuracy (GRPO's is not constant)
    r = torch.rand(24, generator=torch.Generator().manual_seed(1)).round()
    r[:8] = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0])
    g = torch.arange(3).repeat_interleave(8)
    a = adv("group_mad", r, g, advantage_epsilon=0.0)
    for k in range(3):
        sel = g == k
        if r[sel].std() > 0:
            assert close(a[sel].abs().sum(), 8.0)


def test_group_mad_valid_token_rescale():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1])  # third group constant
    g = torch.arange(3).repeat_interleave(4)
    lengths = torch.tensor([2.0] * 4 + [3.0] * 4 + [5.0] * 4)  # 40 tokens, 20 in valid groups -> x2
    plain = adv("group_mad", r, g, advantage_epsilon=0.0)
    scaled = adv("group_mad", r, g, lengths=lengths, dgpo_valid_token_rescale=True, advantage_epsilon=0.0)
    assert close(scaled, 2.0 * plain)


def test_dgpo_question_weight_hand_computed():
    # valid groups: accuracies .25 and .5; constant third group keeps weight 1
    # softmax(-[.25, .5] / 2) = [e^-.125, e^-.25] / (e^-.125 + e^-.25) = [.5312094, .4687906]; x M = 2
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1])
    g = torch.arange(3).repeat_interleave(4)
    w = WEIGHTINGS.get("dgpo_question_weight")(torch.ones(12), r, g, r[:, None], dgpo_temperature=2.0)
    assert close(w, [1.0624188] * 4 + [0.9375812] * 4 + [1.0] * 4)
    # [R, T] advantages are scaled per row
    w2 = WEIGHTINGS.get("dgpo_question_weight")(torch.ones(12, 3), r, g, r[:, None])
    assert close(w2[:, 2], w)


def test_dgpo_question_weight_all_wrong_group_gets_lowest_weight():
    # accuracy column 0, format column 1: group 0 is all wrong but varies through format -> acc set to 1
    rm = torch.tensor([[0.0, 1], [0, 0], [1, 1], [0, 1]])
    g = torch.tensor([0, 0, 1, 1])
    total = combine_rewards(rm, torch.tensor([1.0, 0.5]))
    w = WEIGHTINGS.get("dgpo_question_weight")(torch.ones(4), total, g, rm, dgpo_temperature=1.0)
    # accuracies used: [1, .5] -> 2 * softmax([-1, -.5]) = 2 * [.3775407, .6224593]
    assert close(w, [0.7550813, 0.7550813, 1.2449187, 1.2449187])


# ---------------------------------------------------------------- GRPO-LEAD

def test_lead_difficulty_weight_hand_computed():
    # group 0: rho = .25 -> w(.25) = .4 + 1.1 / (1 + e^-5) = 1.4926377 for A > 0,
    #                        w(.75) = .4 + 1.1 / 2 = .95 for A <= 0
    # group 1: rho = .75 -> .95 for A > 0 and 1.4926377 for A <= 0
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    a = torch.tensor([1.0, -1, -1, -1, 1, 1, 1, -1])
    out = WEIGHTINGS.get("lead_difficulty_weight")(a, r, G2)
    assert close(out, [1.4926377, -.95, -.95, -.95, .95, .95, .95, -1.4926377])
    # an explicit wrong-answer penalty (-1) still counts as incorrect: same rho
    r_pen = torch.where(r > 0, r, -torch.ones_like(r))
    assert close(WEIGHTINGS.get("lead_difficulty_weight")(a, r_pen, G2), out)


# ---------------------------------------------------------------- HA-DW (stateful)

def _hadw(**kw):
    return WEIGHTINGS.get("hadw")(**{"hadw_eta": 1.0, "hadw_lambda_scale": 1.0, "hadw_window": 8,
                                     "hadw_init_anchor": 0.5, **kw})


def test_hadw_weights_and_anchor_hand_computed():
    h = _hadw()
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])  # p = .25 (harder than anchor .5) and .75 (easier)
    a = torch.tensor([1.0, -1, -1, -1, 1, 1, 1, -1])
    out = h(a, r, G2)
    e, ie = math.exp(0.25), math.exp(-0.25)
    # hard prompt: positive x e^.25, negative x e^-.25; easy prompt: the reverse
    assert close(out, [e, -ie, -ie, -ie, ie, ie, ie, -e])
    # first batch: eta_t = 1 -> anchor = batch accuracy 4/8 = .5
    assert h.anchor == pytest.approx(0.5)
    # second batch accuracy 6/8 = .75: sigma = pop std of [.5, .75] = .125 -> C = .875*.5 + .125*.75
    h(torch.ones(8), torch.tensor([1.0, 1, 1, 1, 1, 1, 0, 0]), G2)
    assert h.anchor == pytest.approx(0.53125)
    assert h.state_dict() == {"anchor": pytest.approx(0.53125), "history": [0.5, 0.75], "updates": 2}


def test_hadw_restore_is_exact():
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, generator=gen), torch.rand(8, generator=gen).round()) for _ in range(5)]
    a = _hadw(hadw_window=3, hadw_eta=2.0)
    for adv_, r in batches[:3]:
        a(adv_, r, G2)
    b = _hadw(hadw_window=3, hadw_eta=2.0)
    b.load_state_dict(a.state_dict())
    for adv_, r in batches[3:]:
        assert torch.equal(a(adv_, r, G2), b(adv_, r, G2))
        assert a.state_dict() == b.state_dict()
    # a fresh instance (no history) behaves differently: the restore carried real state
    fresh = _hadw(hadw_window=3, hadw_eta=2.0)
    assert not torch.equal(fresh(*batches[3], G2), _restored_call(a, batches[3]))


def _restored_call(h, batch):
    c = _hadw(hadw_window=3, hadw_eta=2.0)
    c.load_state_dict(h.state_dict())
    return c(batch[0], batch[1], G2)


def test_hadw_built_from_config_by_name(tmp_path):
    cfg = Config.build({"model": "tiny", "task": "repeat", "advantage_weightings": ["hadw"], "hadw_eta": 0.3,
                        "hadw_window": 4, "out": str(tmp_path)})
    comp = Component(WEIGHTINGS.get("hadw"), cfg, "hadw")
    assert comp.stateful and comp.fn.eta == 0.3 and comp.fn.window == 4
    out = comp(advantages=torch.ones(8), rewards=R2, group_ids=G2, reward_matrix=R2[:, None], step=0)
    assert out.shape == (8,)


# ---------------------------------------------------------------- VITAL / DGRPO

def test_dgrpo_difficulty_weight_hand_computed():
    r = torch.tensor([1.0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, .5, .5])
    g = torch.arange(4).repeat_interleave(4)
    batch = SimpleNamespace(columns={"task": ["qa"] * 8 + ["tg"] * 8})
    # task difficulty: qa 1 - 5/8 = .375, tg 1 - 2/8 = .75; mean .5625 -> w_task = [2/3, 4/3]
    # prompt difficulty: qa groups .25, .5 (mean .375) -> [2/3, 4/3]; tg groups .75, .75 -> [1, 1]
    w = WEIGHTINGS.get("dgrpo_difficulty_weight")(torch.ones(16), r, g, batch)
    assert close(w, [4 / 9] * 4 + [8 / 9] * 4 + [4 / 3] * 8)
    # without the task column: one task, only the prompt factor (mean d_q = (.25+.5+.75+.75)/4 = .5625), and the
    # stand-in is reported
    from grpolab.errors import FallbackWarning
    with pytest.warns(FallbackWarning, match="task column 'task'"):
        w1 = WEIGHTINGS.get("dgrpo_difficulty_weight")(torch.ones(16), r, g, SimpleNamespace(columns={}))
    assert close(w1, [.25 / .5625] * 4 + [.5 / .5625] * 4 + [.75 / .5625] * 8)
    # a = b = 0 is GRPO
    w0 = WEIGHTINGS.get("dgrpo_difficulty_weight")(torch.ones(16), r, g, batch, dgrpo_task_power=0.0,
                                                  dgrpo_sample_power=0.0)
    assert close(w0, torch.ones(16))


# ---------------------------------------------------------------- multi-reward: GDPO, MO-GRPO, multi-label

RM = torch.tensor([[1.0, 0], [1, 0], [0, 1], [0, 0]])  # one group of 4, two rewards
G1 = torch.zeros(4, dtype=torch.long)
W = torch.tensor([1.0, 1.0])
# col 0 [1,1,0,0]: std .5773503 -> z = +-.8660254;  col 1 [0,0,1,0]: mean .25, std .5 -> z = [-.5,-.5,1.5,-.5]
# sum: [.3660254, .3660254, .6339746, -1.3660254] (mean 0); Bessel std = sqrt(2.5358984 / 3) = .9194017
# -> [.398112, .398112, .689552, -1.485776]
DECOUPLED = torch.tensor([.3660254, .3660254, .6339746, -1.3660254]) / .9194017


def test_gdpo_hand_computed_differs_from_grpo():
    out = adv("gdpo", combine_rewards(RM, W), G1, RM, W, advantage_epsilon=0.0)
    assert close(out, DECOUPLED, 1e-5)
    # GRPO on the summed reward [1,1,1,0] gives [.5,.5,.5,-1.5]: (0,1) and (1,0) become indistinguishable
    assert close(group_zscore(combine_rewards(RM, W), G1, advantage_epsilon=0.0), [.5, .5, .5, -1.5])


def test_gdpo_equals_grpo_single_reward_up_to_batch_renorm():
    """With K = 1 and w = 1, GDPO = group_zscore(r) / (std_batch(group_zscore(r)) + eps).

    The per-reward step is exactly GRPO's group z-score; its batch mean is 0 when
    every group is complete, so the batch re-normalisation only divides by the
    batch std of the GRPO advantages.
    """
    gen = torch.Generator().manual_seed(5)
    r = torch.rand(20, generator=gen)
    g = torch.arange(5).repeat_interleave(4)
    grpo = group_zscore(r, g)
    expect = grpo / (grpo.std() + 1e-4)
    assert close(adv("gdpo", r, g, r[:, None], torch.ones(1)), expect, 1e-6)


def test_gdpo_unscorable_rows():
    rm = torch.tensor([[1.0, float("nan")], [0, 1], [float("nan"), float("nan")], [1, 0]])
    out = adv("gdpo", combine_rewards(rm, W), torch.tensor([0, 0, 0, 0]), rm, W)
    assert out[2] == 0 and torch.isfinite(out).all()


def test_mo_grpo_hand_computed_and_scale_invariant():
    # one group: the per-group z-score of the decoupled sum equals DECOUPLED above
    out = adv("mo_grpo", combine_rewards(RM, W), G1, RM, W, advantage_epsilon=0.0)
    assert close(out, DECOUPLED, 1e-5)
    # each reward's scale no longer matters (GRPO on the raw sum is dominated by the large reward)
    r = torch.rand(8, 2, generator=torch.Generator().manual_seed(2))
    r2 = r * torch.tensor([1.0, 100.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert close(adv("mo_grpo", None, g, r, W, advantage_epsilon=0.0), adv("mo_grpo", None, g, r2, W, advantage_epsilon=0.0))
    assert not close(group_zscore(r.sum(1), g), group_zscore(r2.sum(1), g), 1e-2)
    # weights are ignored unless mo_grpo_use_weights
    w = torch.tensor([1.0, 3.0])
    assert close(adv("mo_grpo", None, g, r, w), adv("mo_grpo", None, g, r, W))
    assert not close(adv("mo_grpo", None, g, r, w, mo_grpo_use_weights=True), adv("mo_grpo", None, g, r, W), 1e-3)


def test_multi_label_zscore_hand_computed():
    # weights [1, 3]; row 1 misses label 1 -> its weighted mean uses label 0 only
    rm = torch.tensor([[1.0, 0], [0, float("nan")], [1, 1], [0, 0]])
    w = torch.tensor([1.0, 3.0])
    # combined = [(1+0)/4, 0/1, (1+3)/4, 0] = [.25, 0, 1, 0]
    expect = group_zscore(torch.tensor([.25, 0, 1, 0]), G1)
    assert close(adv("multi_label_zscore", combine_rewards(rm, w), G1, rm, w), expect)
    # with every label scored it is GRPO on the weighted sum (z-score removes the 1 / sum w factor)
    full = torch.rand(8, 3, generator=torch.Generator().manual_seed(4))
    w3 = torch.tensor([0.5, 1.0, 2.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert close(adv("multi_label_zscore", None, g, full, w3, advantage_epsilon=0.0),
                 group_zscore(combine_rewards(full, w3), g, advantage_epsilon=0.0))


# ---------------------------------------------------------------- off-policy group-relative REINFORCE (RED)

def test_red_weight_hand_computed():
    a = torch.tensor([1.0, -1.0, 0.0])
    f = WEIGHTINGS.get("advantage_exp_weight")
    assert close(f(a), [math.e, -1 / math.e, 0])
    assert close(f(a, red_temperature=2.0), [math.exp(.5), -math.exp(-.5), 0])
    with pytest.raises(ValueError):
        f(a, red_temperature=0.0)


def test_red_drop_balances_negatives():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0])
    g = torch.arange(3).repeat_interleave(4)
    out = adv("group_mean_balanced_drop", r, g, 7, red_seed=1)
    # group 0: 1 positive, 3 negatives -> 2 negatives dropped; kept {1, 0}: mean .5 -> +.5, -.5
    assert out[0] == 0.5 and sorted(out[1:4].tolist()) == [-0.5, 0.0, 0.0]
    # group 1 is balanced: plain mean baseline; group 2 has more positives: nothing dropped
    assert close(out[4:8], [.5, .5, -.5, -.5])
    assert close(out[8:], [.25, .25, .25, -.75])
    # reproducible for the same seed and step
    assert torch.equal(out, adv("group_mean_balanced_drop", r, g, 7, red_seed=1))
    # over steps every negative of group 0 is sometimes kept
    kept = set()
    for step in range(20):
        o = adv("group_mean_balanced_drop", r, g, step)
        kept.update(int(i) for i in torch.nonzero(o[1:4]).flatten() + 1)
    assert kept == {1, 2, 3}


# ---------------------------------------------------------------- recipes

RECIPES = {"rloo": "leave_one_out", "reinforce_pp_baseline": "batch_zscore", "lite_ppo": "group_mean_batch_std",
           "two_grpo": "group_zscore", "gpg": "gpg", "dgpo_mathforge": "group_mad", "grpo_lead": "group_zscore",
           "ha_dw": "group_zscore", "dgrpo_vital": "group_zscore", "gdpo_reward_decoupled": "gdpo",
           "mo_grpo": "mo_grpo", "multi_label_grpo": "multi_label_zscore", "red_weight": "group_mean",
           "red_drop": "group_mean_balanced_drop"}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_names_its_components(name):
    rec = load_recipe(name)
    assert rec["components"]["advantage"] == RECIPES[name]
    for key in ("title", "citation", "description"):
        assert rec[key]
    cfg = Config.build({**recipe_overrides(name), "model": "tiny", "task": "repeat"})
    assert set(recipe_overrides(name)) <= set(cfg.to_dict())  # core keys or parameters of its components


def test_two_grpo_recipe_sets_group_size_two():
    assert recipe_overrides("two_grpo")["num_generations"] == 2


def test_hadw_anchor_survives_trainer_checkpoint(tiny_args):
    from grpolab.train.trainer import Trainer

    args = {**recipe_overrides("ha_dw"), **tiny_args, "steps": 2, "save_steps": 2}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    state = t.components["advantage/hadw"].fn.state_dict()
    assert state["updates"] == 2
    resumed = Trainer(Config.build(args), resume=True, log=lambda *a: None)
    assert resumed.step == 2 and resumed.components["advantage/hadw"].fn.state_dict() == state


def test_hadw_accuracy_outside_unit_range_is_an_error():
    """The anchor is a solve rate: an accuracy above 1 (e.g. accuracy + 0.5 format as the combined reward) stops
    with an error naming hadw_accuracy_reward, instead of a quietly wrong anchor."""
    g = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="hadw_accuracy_reward"):
        _hadw()(torch.ones(4), torch.tensor([1.5, 0.0, 1.0, 0.5]), g)
    m = torch.tensor([[1.0, 0.5], [0.0, 0.0], [1.0, 0.5], [0.0, 0.5]])
    out = _hadw(hadw_accuracy_reward=0)(torch.ones(4), m.sum(-1), g, reward_matrix=m)  # the accuracy column
    assert torch.isfinite(out).all()
