"""Policy objectives, regularisers (hand-computed values and relations)."""
import math
from types import SimpleNamespace

import pytest
import torch

from grpolab.algorithms import AGGREGATIONS, POLICY_LOSSES, REGULARIZERS, StepTotals
from grpolab.algorithms.regularizers import RatioVariance
from grpolab.components import Component
from grpolab.config import Config, ConfigError
from grpolab.recipes import recipe_overrides

from _helpers import micro_batched_loss

T = torch.tensor
L = POLICY_LOSSES.get
RG = REGULARIZERS.get


def seq_mean(loss, mask):
    return AGGREGATIONS.get("seq_mean_token_mean")(loss, mask, StepTotals.from_masks([mask], constant=1))


# ------------------------------------------------------------------ policy gradient (GPG)

def test_policy_gradient_value_and_grad():
    logp = T([[-1.0, -2.0]], requires_grad=True)
    loss, _ = L("policy_gradient")(logp, logp.detach() - 5.0, T([0.5]), torch.ones(1, 2))
    # -A * logp = -0.5 * [-1, -2] = [0.5, 1.0]; old log-probs play no role
    assert torch.allclose(loss, T([[0.5, 1.0]]))
    loss.sum().backward()
    assert torch.allclose(logp.grad, T([[-0.5, -0.5]]))


# ----------------------------------------------------------------------------- GSPO

def test_sequence_ratio_hand_values():
    old = torch.zeros(3, 2)
    logp = T([[math.log(2.0), 0.0], [math.log(2.0), 0.0], [math.log(2.0), 5.0]])
    mask = T([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    adv = T([1.0, -1.0, 1.0])
    loss, _ = L("sequence_ratio")(logp, old, adv, mask, epsilon=0.2, epsilon_high=0.2)
    # rows 0,1: s = exp((ln2 + 0)/2) = sqrt(2) = 1.41421
    # A = +1: -min(1.414, 1.2) = -1.2 ; A = -1: -min(-1.414, -1.2) = 1.41421
    # row 2: the masked token (5.0) is ignored: s = 2 -> -min(2, 1.2) = -1.2
    assert torch.allclose(loss[0], T([-1.2, -1.2]))
    assert torch.allclose(loss[1], T([math.sqrt(2.0)] * 2))
    assert torch.allclose(loss[2, 0], T(-1.2))
    loss2, _ = L("sequence_ratio")(logp, old, adv, mask, epsilon=0.2, epsilon_high=2.0)
    assert torch.allclose(loss2[2, 0], T(-2.0))  # 2 < 1 + 2: unclipped


def test_gspo_equals_grpo_when_token_ratios_equal():
    """All token ratios of a sequence equal => s_i = r_it: same per-token loss as clipped_ratio,
    hence the same objective under any aggregation (GSPO's own is seq_mean_token_mean)."""
    torch.manual_seed(0)
    old = torch.randn(4, 5)
    row_log_ratio = T([0.3, -0.1, 0.05, -0.4])
    logp = (old + row_log_ratio[:, None]).requires_grad_()
    mask = T([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]]).float()
    adv = T([1.0, -0.5, 2.0, -1.0])
    gspo, _ = L("sequence_ratio")(logp, old, adv, mask, epsilon=0.2)
    grpo, _ = L("clipped_ratio")(logp, old, adv, mask, epsilon=0.2)
    assert torch.allclose(gspo * mask, grpo * mask, atol=1e-6)
    # the GSPO objective (1/G) sum_i -min(s_i A_i, clip(s_i) A_i) under seq_mean_token_mean
    s = torch.exp(row_log_ratio)
    expected = -torch.minimum(s * adv, s.clamp(0.8, 1.2) * adv).mean()
    assert torch.allclose(seq_mean(gspo, mask), expected, atol=1e-6)


def test_gspo_token_gradient_equals_gspo_gradient():
    torch.manual_seed(1)
    old = torch.randn(3, 4)
    base = (old + 0.05 * torch.randn(3, 4))
    mask = T([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]).float()
    adv = T([1.0, -2.0, 0.5])
    grads, values = [], []
    for name in ("sequence_ratio", "sequence_ratio_token"):
        logp = base.clone().requires_grad_()
        loss, _ = L(name)(logp, old, adv, mask, epsilon=0.2)
        agg = seq_mean(loss, mask)
        agg.backward()
        grads.append(logp.grad.clone())
        values.append(agg.detach())
    assert torch.allclose(values[0], values[1], atol=1e-6)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert grads[0].abs().sum() > 0


# ------------------------------------------------------------------------- Rank-GRPO

def test_rank_ratio_hand_values_and_reductions():
    old = torch.zeros(1, 4)
    logp = T([[0.1, 0.3, 0.0, 0.2]])
    mask = torch.ones(1, 4)
    adv = T([1.0])
    big = dict(epsilon=10.0)
    spans = SimpleNamespace(span_ids=T([[1, 1, 1, 2]]))
    loss, _ = L("rank_ratio")(logp, old, adv, mask, spans, **big)
    w1, w2 = math.exp(0.4 / 3), math.exp(0.2)
    # unit 1 has 3 tokens, weight |o|/(K |k|) = 4/(2*3); unit 2 has 1 token, weight 4/(2*1)
    assert torch.allclose(loss, T([[-w1 * 2 / 3] * 3 + [-w2 * 2]]), atol=1e-6)
    # seq_mean_token_mean averages the two items equally: (1/2)(-w1 - w2)
    assert torch.allclose(seq_mean(loss, mask), T(-(w1 + w2) / 2), atol=1e-6)
    # no spans -> GSPO; one token per span -> token-level clipped ratio
    none = SimpleNamespace(span_ids=torch.zeros(1, 4, dtype=torch.long))
    each = SimpleNamespace(span_ids=T([[1, 2, 3, 4]]))
    from grpolab.errors import FallbackWarning
    with pytest.warns(FallbackWarning, match="rank-item spans"):  # no item marked: a reported stand-in
        no_items = L("rank_ratio")(logp, old, adv, mask, none)[0]
    assert torch.allclose(no_items, L("sequence_ratio")(logp, old, adv, mask)[0])
    assert torch.allclose(L("rank_ratio")(logp, old, adv, mask, each)[0], L("clipped_ratio")(logp, old, adv, mask)[0])


# ------------------------------------------------------------------------------ SAPO

def test_soft_gate_values():
    old = torch.zeros(1, 3)
    logp = T([[0.0, 0.0, math.log(2.0)]])
    adv = T([[1.0, -1.0, 1.0]])
    loss, _ = L("soft_gate")(logp, old, adv, torch.ones(1, 3), sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    # r=1: -(4/tau) sigmoid(0) A = -(2/tau) A -> -2 (tau 1), +2/1.05 (tau 1.05, A=-1)
    # r=2, tau=1: -4 sigmoid(1) = -4 * 0.7310586 = -2.9242344
    assert torch.allclose(loss, T([[-2.0, 2.0 / 1.05, -2.9242344]]), atol=1e-6)


def test_soft_gate_gradient_at_ratio_one_is_policy_gradient():
    logp = T([[-0.7, -1.3, -2.0]], requires_grad=True)
    adv = T([[1.5, -0.5, 2.0]])
    loss, _ = L("soft_gate")(logp, logp.detach(), adv, torch.ones(1, 3), sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    loss.sum().backward()
    # d/dlogp of -f(r) A at r = 1 is -A f'(1) r = -A (f'(1) = 1 for every tau)
    assert torch.allclose(logp.grad, -adv, atol=1e-6)


# ----------------------------------------------------------------------------- CISPO

def test_cispo_values_and_detached_weight():
    logp = T([[-1.0, -1.0, -1.0]], requires_grad=True)
    old = logp.detach() - T([[math.log(2.0), math.log(0.5), math.log(0.5)]])  # r = 2, 0.5, 0.5
    adv = T([[1.0, 1.0, -1.0]])
    loss, m = L("cispo")(logp, old, adv, torch.ones(1, 3), cispo_epsilon_low=None, cispo_epsilon_high=0.5)
    # w = sg(clip(r, -, 1.5)) = [1.5, 0.5, 0.5]; loss = -w A logp = [1.5, 0.5, -0.5]
    assert torch.allclose(loss, T([[1.5, 0.5, -0.5]]))
    assert torch.allclose(m["cispo_clip_frac"], T([[1.0, 0.0, 0.0]]))
    loss.sum().backward()
    assert torch.allclose(logp.grad, T([[-1.5, -0.5, 0.5]]))  # gradient -w A: the weight is detached
    loss2, _ = L("cispo")(logp, old, adv, torch.ones(1, 3), cispo_epsilon_low=0.2, cispo_epsilon_high=0.5)
    assert torch.allclose(loss2, T([[1.5, 0.8, -0.8]]))  # lower clip at 0.8


# ---------------------------------------------------------------- Simple Policy Optimization

def test_simple_po_values_and_grad_at_one():
    old = torch.zeros(1, 2)
    logp = torch.full((1, 2), math.log(1.5))
    loss, _ = L("simple_po")(logp, old, T([[2.0, -2.0]]), torch.ones(1, 2), simple_po_epsilon=0.2)
    # -(r A - |A|/(2 eps)(r-1)^2), r = 1.5: A=2: -(3 - 5*0.25) = -1.75 ; A=-2: -(-3 - 1.25) = 4.25
    assert torch.allclose(loss, T([[-1.75, 4.25]]))
    lp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = L("simple_po")(lp, lp.detach(), T([[2.0, -2.0]]), torch.ones(1, 2), simple_po_epsilon=0.2)
    loss.sum().backward()
    assert torch.allclose(lp.grad, T([[-2.0, 2.0]]))  # policy gradient at r = 1


# ------------------------------------------------------------------------- Guide (004-16)

def test_guide_off_policy_shaped_ratio_on_hinted_rows():
    # authors' compute_policy_loss (guide_rl core_algos.py, gamma_strategy "percentile", gamma_value 0.9):
    # off-policy rows: gamma = quantile_.9(ratio) (linear interpolation), loss = -A r / (r + gamma), no clip;
    # on-policy rows: -min(r A, clip(r, .8, 1.2) A)
    r_on, r_off = [1.5, 0.5, 1.0], [2.0, 1.0, 0.5]
    logp = torch.log(T([r_on, r_off]))
    old = torch.zeros(2, 3)
    adv = T([1.0, -1.0])
    mask = torch.ones(2, 3)
    batch = SimpleNamespace(columns={"hint_level": [0, 3]})
    loss, m = L("guide_off_policy")(logp, old, adv, mask, batch, epsilon=0.2, guide_gamma_quantile=0.9)
    # row 0 (A=1): -min(r, clip(r)) = [-1.2, -0.5, -1.0]
    # row 1 (A=-1): sorted ratios .5, 1, 2; quantile .9 at position .9 * 2 = 1.8 -> 1 + .8 * (2 - 1) = 1.8
    g = 1.8
    expect_off = [r / (r + g) for r in r_off]
    assert loss[0].tolist() == pytest.approx([-1.2, -0.5, -1.0], abs=1e-6)
    assert loss[1].tolist() == pytest.approx(expect_off, abs=1e-6)  # -A * r/(r+g) with A = -1
    # the clipped ratio would have given row 1: -min(-r, -clip(r)) = max(r, clip(r)) = [2.0, 1.0, 0.8]
    assert loss[1].tolist() != pytest.approx([2.0, 1.0, 0.8], abs=1e-3)
    assert m["guide_off_policy_frac"][:, 0].tolist() == [0.0, 1.0]
    # gradient of the shaped term: d/dlogp [-A r/(r+g)] = -A g r / (r+g)^2 (gamma detached)
    lp = logp.clone().requires_grad_()
    L("guide_off_policy")(lp, old, adv, mask, batch, epsilon=0.2, guide_gamma_quantile=0.9)[0].sum().backward()
    assert lp.grad[1].tolist() == pytest.approx([g * r / (r + g) ** 2 for r in r_off], abs=1e-5)
    # no hint column: exactly the clipped ratio
    plain, _ = L("guide_off_policy")(logp, old, adv, mask, None, epsilon=0.2)
    ref, _ = L("clipped_ratio")(logp, old, adv, mask, epsilon=0.2)
    assert torch.allclose(plain, ref)


def test_simple_po_matches_the_authors_loss_beyond_the_clip():
    # authors' compute_policy_loss (MyRepositories-hub/Simple-Policy-Optimization, mujoco/trainer.py, algo 'spo'):
    # -(A r - |A| (r - 1)^2 / (2 eps)); d/dlogp = -(A r - |A| (r - 1) r / eps). At r = 1.5, A = 2, eps = .2:
    # -(3 - 2 * .5 * 1.5 / .2) = 4.5, where the clipped ratio has no gradient (r > 1 + eps, A > 0)
    lp = torch.full((1, 1), math.log(1.5), requires_grad=True)
    L("simple_po")(lp, torch.zeros(1, 1), T([[2.0]]), torch.ones(1, 1), simple_po_epsilon=0.2)[0].sum().backward()
    assert float(lp.grad) == pytest.approx(4.5, abs=1e-5)
    lp2 = torch.full((1, 1), math.log(1.5), requires_grad=True)
    L("clipped_ratio")(lp2, torch.zeros(1, 1), T([[2.0]]), torch.ones(1, 1), epsilon=0.2)[0].sum().backward()
    assert float(lp2.grad) == 0.0


# ---------------------------------------------------------------------------- Reg-GRPO

def test_reg_grpo_values():
    old = torch.zeros(2, 1)
    logp = T([[0.4], [0.0]])
    g = T([0, 0])
    adv = T([1.0, -1.0])
    loss, m = L("reg_grpo")(logp, old, adv, torch.ones(2, 1), g, advantage_epsilon=0.0)
    # rho = [0.4, 0]; centred [0.2, -0.2]; Bessel std = sqrt((0.04 + 0.04) / 1) = 0.282843
    # prediction = +-0.2 / 0.282843 = +-0.707107; loss = (1 - 0.707107)^2 = 0.085786 on both rows
    assert torch.allclose(m["reg_grpo_pred"][:, 0], T([0.707107, -0.707107]), atol=1e-5)
    assert torch.allclose(loss, T([[0.085786], [0.085786]]), atol=1e-5)
    # eps enters the denominator: 0.2 / (0.282843 + 0.1) = 0.522414 -> (1 - 0.522414)^2 = 0.228088
    loss, _ = L("reg_grpo")(logp, old, adv, torch.ones(2, 1), g, advantage_epsilon=0.1)
    assert torch.allclose(loss, T([[0.228088], [0.228088]]), atol=1e-5)


def test_reg_grpo_scale_invariance_and_on_policy_gradient():
    """The z-scored prediction does not depend on the log-ratio scale (lambda and Z cancel, paper §3.2);
    on-policy the gradient is finite: -2 A_i grad(rho_i - mean rho) / (1e-6 + eps)."""
    old = torch.zeros(3, 2)
    mask = torch.ones(3, 2)
    g = T([0, 0, 0])
    adv = T([1.0, 0.0, -1.0])
    base = T([[0.1, 0.2], [0.0, -0.1], [0.3, -0.4]])
    l1, _ = L("reg_grpo")(base, old, adv, mask, g, advantage_epsilon=0.0)
    l3, _ = L("reg_grpo")(3 * base, old, adv, mask, g, advantage_epsilon=0.0)
    assert torch.allclose(l1, l3, atol=1e-5)
    logp = torch.zeros(3, 2, requires_grad=True)
    loss, m = L("reg_grpo")(logp, logp.detach(), adv, mask, g, advantage_epsilon=1e-4)
    assert torch.all(m["reg_grpo_pred"] == 0)
    seq_mean(loss, mask).backward()
    # row loss (A_i - pred_i)^2, pred = (rho - mean rho) / 1e-4 at rho = 0; seq_mean averages rows (1/3):
    # the zero variance is floored at 1e-12 (std 1e-6, no gradient through it), so the denominator is 1.01e-4:
    # d/d rho_k = (1/3) sum_i -2 A_i (delta_ik - 1/3) / 1.01e-4 = -2 A_k / 3.03e-4 (sum A = 0); each token of row k
    expect = (-2.0 * adv / 3.03e-4)[:, None].expand(3, 2)
    assert torch.isfinite(logp.grad).all()
    assert torch.allclose(logp.grad, expect, rtol=1e-4)


# ------------------------------------------------------------------------------- REBEL

def test_rebel_values_and_on_policy_gradient():
    old = torch.zeros(2, 2)
    logp = T([[0.1, 0.2], [0.0, -0.1]])
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = L("rebel")(logp, old, T([1.0, 0.0]), mask, T([7, 7]), rebel_eta=0.5)
    # l = [0.3, 0.0]; ((0.3 - 0)/0.5 - (1 - 0))^2 = (-0.4)^2 = 0.16 (both rows hold the pair)
    assert torch.allclose(loss, torch.full((2, 2), 0.16))
    lp = torch.zeros(2, 1, requires_grad=True)
    loss, _ = L("rebel")(lp, lp.detach(), T([1.0, -1.0]), torch.ones(2, 1), T([0, 0]), rebel_eta=0.5)
    seq_mean(loss, torch.ones(2, 1)).backward()
    # on-policy: d/dl_0 (( (l0-l1)/eta - 2)^2) = 2 * (-2) / eta = -8 ; row 1: +8
    assert torch.allclose(lp.grad, T([[-8.0], [8.0]]))


# -------------------------------------------------------------------------------- GVPO

def test_gvpo_values():
    old = torch.zeros(2, 1)
    logp = T([[0.2], [0.0]])
    loss, _ = L("gvpo")(logp, old, T([1.0, -1.0]), torch.ones(2, 1), T([0, 0]), gvpo_beta=0.5,
                              gvpo_groups_per_micro_batch=1)
    # implicit = 0.5 * [0.2, 0] -> centred [0.05, -0.05]; c = [0.05 - 1, -0.05 + 1] = [-0.95, 0.95]
    # row loss n c^2 / (2 (n-1)) = 2 * 0.9025 / 2 = 0.9025
    assert torch.allclose(loss, T([[0.9025], [0.9025]]))


def test_gvpo_gradient_is_weighted_logprob_form():
    """grad = -(beta/(n-1)) sum_i w_i grad log pi(o_i), w_i = (r_i - mean r) - beta (l_i - mean l)."""
    torch.manual_seed(2)
    old = torch.randn(3, 4)
    logp = (old + 0.1 * torch.randn(3, 4)).requires_grad_()
    mask = T([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]).float()
    adv = T([1.0, -0.25, -0.75])  # zero-sum (group_mean)
    beta = 0.3
    loss, _ = L("gvpo")(logp, old, adv, mask, T([0, 0, 0]), gvpo_beta=beta, gvpo_groups_per_micro_batch=1)
    seq_mean(loss, mask).backward()
    ell = ((logp.detach() - old) * mask).sum(-1)
    w = (adv - adv.mean()) - beta * (ell - ell.mean())
    expected = -(beta / 2) * w[:, None] * mask
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def _gvpo_authors_step_loss(logp, old, adv, mask, uid, n, beta, micro_rows):
    """github.com/jszkc/GVPO: compute_policy_loss_gvpo (GVPO/gvpo_core_algos.py) per micro-batch of
    ``micro_rows`` rows, times 1 / gradient_accumulation (GVPO/gvpo_dp_actor.py), summed (one GPU)."""
    rows = logp.shape[0]
    accum = rows // micro_rows
    rtheta_all = (((logp * mask).sum(-1) - (old * mask).sum(-1)) * beta).detach()
    means = {int(u): rtheta_all[uid == u].mean() for u in torch.unique(uid)}
    total = 0
    for s in range(0, rows, micro_rows):
        sl = slice(s, s + micro_rows)
        lp, o, a, m, u = logp[sl], old[sl], adv[sl], mask[sl], uid[sl]
        rtheta = ((lp * m).sum(-1) - (o * m).sum(-1)) * beta
        r_minus_avg = (a * m).sum(-1) / m.sum(-1)
        pg_loss = 0
        for i in range(len(rtheta)):
            pg_loss = pg_loss + 0.5 * ((rtheta[i] - means[int(u[i])]) - r_minus_avg[i]) ** 2
        total = total + (pg_loss / (n - 1)) / accum
    return total


def test_gvpo_gradient_matches_authors_for_any_micro_batch_size():
    """4 groups of n = 2; the authors' run puts k = 2 groups in a micro-batch (4 rows). grpolab with
    gvpo_groups_per_micro_batch = 2 gives the same gradient with 1 group or all 4 groups per micro-batch."""
    torch.manual_seed(5)
    n, groups, beta = 2, 4, 0.3
    rows = n * groups
    old = torch.randn(rows, 3)
    base = old + 0.2 * torch.randn(rows, 3)
    mask = T([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]).float()
    uid = torch.arange(groups).repeat_interleave(n)
    r = torch.randn(rows)
    adv = (r - r.view(groups, n).mean(-1).repeat_interleave(n))[:, None] * mask  # group_mean advantage per token

    ref = base.clone().requires_grad_()
    _gvpo_authors_step_loss(ref, old, adv, mask, uid, n, beta, micro_rows=4).backward()

    grads = []
    for micro in (n, rows):
        logp = base.clone().requires_grad_()
        totals = StepTotals.from_masks([mask], constant=1)
        for s in range(0, rows, micro):
            sl = slice(s, s + micro)
            loss, _ = L("gvpo")(logp[sl], old[sl], adv[sl], mask[sl], uid[sl], gvpo_beta=beta,
                                gvpo_groups_per_micro_batch=2)
            AGGREGATIONS.get("seq_mean_token_mean")(loss, mask[sl], totals).backward()
        grads.append(logp.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert torch.allclose(grads[0], ref.grad, atol=1e-6)
    # the default (4 = the authors' 16 rows / n 4) is 2x this
    logp = base.clone().requires_grad_()
    loss, _ = L("gvpo")(logp, old, adv, mask, uid, gvpo_beta=beta)
    AGGREGATIONS.get("seq_mean_token_mean")(loss, mask, StepTotals.from_masks([mask], constant=1)).backward()
    assert torch.allclose(logp.grad, 2 * ref.grad, atol=1e-6)


def test_gvpo_reference_anchor_needs_ref():
    with pytest.raises(ValueError, match="beta > 0"):
        L("gvpo")(torch.zeros(2, 1), torch.zeros(2, 1), T([1.0, -1.0]), torch.ones(2, 1), T([0, 0]),
                  None, gvpo_anchor="reference")


# ------------------------------------------------------------------------------- DisCO

def test_disco_values_and_kl_constraint():
    logp = T([[-1.0], [-2.0], [-3.0]])
    mask = torch.ones(3, 1)
    g = T([0, 0, 0])
    adv = T([1.0, -1.0, -1.0])
    loss, _ = L("disco")(logp, logp, adv, mask, g, disco_tau=1.0, disco_delta=1e-4, disco_beta=1e3)
    # n_g=3, n+=1, n-=2; positive row: -(3/1)(-1) = 3
    # LME = log((e^-2 + e^-3)/2) = log(0.0925613) = -2.3798854 ; each negative: (3/2)(-2.3798854) = -3.5698281
    assert torch.allclose(loss[:, 0], T([3.0, -3.5698281, -3.5698281]), atol=1e-6)
    # seq mean = -J with J = mean s+ - LME = -1 + 2.3798854
    assert torch.allclose(seq_mean(loss, mask), T(-1.3798854), atol=1e-6)
    bal, _ = L("disco")(logp, logp, adv, mask, g, disco_balanced=True)
    assert torch.allclose(bal[:, 0], T([3.0, -3.75, -3.75]))  # (3/2) * mean(-2, -3)
    # KL(pi_old || pi) = mean(old - logp) = 0.01 > delta: + 1e3 (0.01 - 1e-4)^2 = 0.09801 on every token
    pen, m = L("disco")(logp, logp + 0.01, adv, mask, g, disco_tau=1.0)
    assert torch.allclose(pen - loss, torch.full((3, 1), 0.09801), atol=1e-6)
    assert torch.allclose(m["disco_kl"], torch.full((3, 1), 0.01))


# -------------------------------------------------------------------------------- CoPG

def test_copg_values_and_gradient():
    logp = T([[-1.0], [-2.0]], requires_grad=True)
    old = logp.detach() - T([[0.2], [0.0]])  # l = [0.2, 0]
    loss, _ = L("copg")(logp, old, T([1.0, -1.0]), torch.ones(2, 1), T([0, 0]), copg_beta=0.5)
    # -1/2 [ (r0-r1)(L0-L1) - (beta/2)(l0-l1)^2 ] = -1/2 [2 * 1 - 0.25 * 0.04] = -0.995
    assert torch.allclose(loss, T([[-0.995], [-0.995]]))
    seq_mean(loss, torch.ones(2, 1)).backward()
    # d/dlogp_0 = -1/2 [(r0 - r1) - beta (l0 - l1)] = -1/2 [2 - 0.1] = -0.95 ; row 1 opposite
    assert torch.allclose(logp.grad, T([[-0.95], [0.95]]))


# --------------------------------------------------------------------------------- P3O

def test_p3o_values():
    old = torch.zeros(2, 1)
    logp = T([[math.log(1.5)], [math.log(0.5)]])
    loss, _ = L("p3o")(logp, old, T([1.0, -1.0]), torch.ones(2, 1), T([0, 0]), p3o_epsilon=0.2)
    # D01 = 2: row 0 -min(1.5*2, 1.2*2) = -2.4 ; row 1 (D10 = -2): -min(0.5*-2, 0.8*-2) = 1.6
    # pair loss = mean of the two = -0.4
    assert torch.allclose(loss, T([[-2.4], [1.6]]))
    assert torch.allclose(seq_mean(loss, torch.ones(2, 1)), T(-0.4))


def test_p3o_is_shift_invariant_and_needs_partner():
    old = torch.zeros(3, 2)
    logp = 0.1 * torch.arange(6.0).reshape(3, 2)
    a = T([0.5, 1.0, -1.5])
    l1, _ = L("p3o")(logp, old, a, torch.ones(3, 2), T([0, 0, 0]))
    l2, _ = L("p3o")(logp, old, a + 3.0, torch.ones(3, 2), T([0, 0, 0]))
    assert torch.allclose(l1, l2)
    with pytest.raises(ValueError, match="single row"):
        L("p3o")(logp, old, a, torch.ones(3, 2), T([0, 0, 1]))


# ------------------------------------------------------------------------------- GTPO

def test_gtpo_conflict_tokens_and_entropy_filter():
    ids = T([[5, 6, 7, 8], [5, 6, 9, 8], [5, 2, 7, 3]])
    mask = T([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]).float()
    batch = SimpleNamespace(completion_ids=ids, completion_attention_mask=mask.long())
    adv = T([1.0, -1.0, -1.0])[:, None] * mask
    entropy = T([0.5, 0.2, 1.0])[:, None] * torch.ones(3, 4)
    logp = -torch.ones(3, 4)
    loss, m = L("gtpo_conflict")(logp, logp, adv, mask, T([0, 0, 0]), entropy, batch)
    # start-aligned conflicts (leading run): row0 t0..3, row1 t0..1, row2 t0
    # end-aligned: row0 last token 8 == row1 last token 8 -> row0 t3, row1 t3 ; row2 none
    # delta: row0 (positive) [2, 2, 2, 2*2] ; row1 (negative) [0, 0, 1, 0] ; row2 [0, 1, 1, -]
    # entropy: row2 H=1.0 > 0.7 -> A=0 ; A'0 = 1 - 0.1*0.5 = 0.95 ; A'1 = -1 - 0.1*0.2 = -1.02
    # on-policy loss = -A' delta
    expected = T([[-1.9, -1.9, -1.9, -3.8], [0.0, 0.0, 1.02, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(loss * mask, expected, atol=1e-6)
    assert torch.allclose(m["gtpo_filtered_frac"][:, 0], T([0.0, 0.0, 1.0]))


# ---------------------------------------------------------------------- regularisers

def test_entropy_bonus():
    h = T([[0.5, 1.0]], requires_grad=True)
    term, _ = RG("entropy_bonus")(h, entropy_bonus_coef=0.1)
    assert torch.allclose(term, T([[-0.05, -0.1]]))
    term.sum().backward()
    assert torch.allclose(h.grad, T([[-0.1, -0.1]]))


def test_llds_response_and_action_gates():
    old = torch.zeros(3, 2)
    logp = T([[-0.2, 0.1], [-0.5, -0.5], [0.3, -0.1]])
    adv = T([1.0, -1.0, 0.5])
    mask = torch.ones(3, 2)
    term, _ = RG("llds")(logp, old, adv, mask, None, llds_coef=0.5)
    # row0: A>=0, response log-ratio -0.1 < 0 -> 0.5 * relu(0.2) on t0, 0 on t1 (its log-prob rose)
    # row1: A<0 -> not in the preserving set ; row2: response log-ratio +0.2 -> inactive
    assert torch.allclose(term, T([[0.1, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    spans = SimpleNamespace(span_ids=T([[1, 1], [1, 2], [1, 2]]))
    term, _ = RG("llds")(logp, old, adv, mask, spans, llds_coef=0.5, llds_gate="action")
    # row2 action 2 (t1) fell by 0.1 -> 0.5 * 0.1 = 0.05
    assert torch.allclose(term, T([[0.1, 0.0], [0.0, 0.0], [0.0, 0.05]]))


def test_dynamic_kl_schedule_total_coefficient():
    logp, ref = T([[-1.0]]), T([[-1.5]])
    kw = dict(beta=0.02, steps=10, kl_estimator="k3", grpo_d_beta_min=0.0, grpo_d_beta_max=0.02,
              grpo_d_explore_frac=0.3)
    k3 = math.exp(-0.5) + 0.5 - 1.0  # x = ref - logp = -0.5 -> 0.1065307
    # OThink-MR1 Eq. 3 with t = 10, w = 3, beta_mid = 0.01:
    # s=0 -> 0.01; s=1.5 -> 0.005; s=3 -> 0.0; s=6.5 -> 0.0 + 0.02 * 3.5 / 7 = 0.01; s=10 -> 0.02; s=20 -> 0.02
    for step, coef in [(0, 0.01), (1.5, 0.005), (3, 0.0), (6.5, 0.01), (10, 0.02), (20, 0.02)]:
        term, m = RG("dynamic_kl")(logp, ref, step, **kw)
        assert float(m["kl_coef"][0, 0]) == pytest.approx(coef)
        # the trainer adds 0.02 KL, this adds (beta(s) - 0.02) KL: total beta(s) KL
        assert torch.allclose(0.02 * k3 + term, T([[coef * k3]]), atol=1e-7)
    with pytest.raises(ValueError, match="beta > 0"):
        RG("dynamic_kl")(logp, None, 0, **kw)


def _rv_inputs(i):
    g = torch.Generator().manual_seed(i)
    old = torch.randn(2, 3, generator=g)
    return old + 0.2 * torch.randn(2, 3, generator=g), old, torch.ones(2, 3)


def test_ratio_variance_dual_update_hand():
    rv = RatioVariance(r2vpo_delta=0.02, r2vpo_dual_lr=1.0, r2vpo_lambda_init=1.0)
    one = torch.ones(1, 1)
    t, _ = rv(T([[math.log(1.2)]]), torch.zeros(1, 1), one, 0)
    assert torch.allclose(t, T([[0.04]]))  # lambda 1 * (1.2 - 1)^2
    rv(T([[math.log(0.9)]]), torch.zeros(1, 1), one, 0)  # (0.9 - 1)^2 = 0.01
    t, m = rv(T([[math.log(1.2)]]), torch.zeros(1, 1), one, 1)
    # new step: v = (0.04 + 0.01)/2 = 0.025 -> lambda = 1 + (0.025 - 0.02) = 1.005
    assert rv.lam == pytest.approx(1.005)
    assert torch.allclose(t, T([[1.005 * 0.04]]))
    rv2 = RatioVariance(r2vpo_delta=1.0, r2vpo_dual_lr=10.0)
    rv2(torch.zeros(1, 1), torch.zeros(1, 1), one, 0)
    rv2(torch.zeros(1, 1), torch.zeros(1, 1), one, 1)
    assert rv2.lam == 0.0  # projected to lambda >= 0


def test_ratio_variance_restore_is_exact():
    a = RatioVariance(r2vpo_delta=0.01, r2vpo_dual_lr=2.0)
    for i, step in enumerate([0, 0, 1, 1, 2]):
        a(*_rv_inputs(i), step)
    state = a.state_dict()
    b = RatioVariance(r2vpo_delta=0.01, r2vpo_dual_lr=2.0)  # same config, as on resume
    fresh = RatioVariance(r2vpo_delta=0.01, r2vpo_dual_lr=2.0)
    b.load_state_dict(state)
    for i, step in enumerate([2, 3, 3, 4]):
        ta, _ = a(*_rv_inputs(10 + i), step)
        tb, _ = b(*_rv_inputs(10 + i), step)
        tf, _ = fresh(*_rv_inputs(10 + i), step)
        assert torch.equal(ta, tb)
    assert a.state_dict() == b.state_dict()
    assert not torch.equal(ta, tf)  # the state matters: a fresh multiplier gives another term


def test_ratio_variance_is_a_stateful_component():
    cfg = Config.build({"model": "tiny", "task": "repeat", "regularizers": ["ratio_variance"], "r2vpo_lambda_init": 3.0})
    comp = Component(REGULARIZERS.get("ratio_variance"), cfg, "ratio_variance")
    assert comp.stateful and comp.fn.lam == 3.0


# -------------------------------------------------------------------- config checks

BASE = {"model": "tiny", "task": "repeat"}


def test_validate_objective_config_errors():
    """Invalid combinations are rejected when the config loads (each component's registered check)."""
    with pytest.raises(ConfigError, match="multiple of num_generations"):
        Config.build({**BASE, "policy_loss": "rebel", "num_generations": 4, "micro_batch_size": 6})
    with pytest.raises(ConfigError, match="beta > 0"):
        Config.build({**BASE, "regularizers": ["dynamic_kl"], "beta": 0.0})
    with pytest.raises(ConfigError, match="gvpo_anchor"):
        Config.build({**BASE, "policy_loss": "gvpo", "gvpo_anchor": "reference", "beta": 0.0,
                      "micro_batch_size": 8, "num_generations": 4})
    with pytest.raises(ConfigError, match="rebel_eta: must be > 0"):
        Config.build({**BASE, "policy_loss": "rebel", "rebel_eta": 0.0, "num_generations": 4, "micro_batch_size": 8})
    Config.build({**BASE, "policy_loss": "rebel", "num_generations": 4, "micro_batch_size": 8})


@pytest.mark.parametrize("recipe", ["gspo", "sapo", "cispo", "reg_grpo", "rebel", "gvpo", "disco", "simple_po",
                                    "copg", "p3o", "rank_grpo", "gtpo_conflict", "llds", "r2vpo", "grpo_d",
                                    "guide_grpo"])
def test_objective_recipes_validate(recipe):
    cfg = Config.build({**BASE, **recipe_overrides(recipe), "num_generations": 4, "micro_batch_size": 16})
    assert cfg.policy_loss == recipe_overrides(recipe).get("policy_loss", "clipped_ratio")


# ----------------------------------------------------------------------------- LUSPO (arXiv:2602.05261)

def _luspo_expected(logp, old, adv, mask, eps_low, eps_high):
    """TRL's luspo, written out: sequence-level clipped loss l_i (B, 1), then (l * mask.sum(1)).mean()."""
    out = []
    for i in range(logp.shape[0]):
        n = float(mask[i].sum())
        s = math.exp(float(((logp[i] - old[i]) * mask[i]).sum()) / n)
        a = float(adv[i])
        l_i = -min(s * a, min(max(s, 1 - eps_low), 1 + eps_high) * a)
        out.append(n * l_i)
    return sum(out) / len(out), out


def test_luspo_values_unequal_lengths_and_clip():
    mask = T([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    old = torch.zeros(3, 4)
    # row 0: s = exp(0.4) = 1.49 > 1 + eps_high, A > 0 (clipped); row 1: s = exp(-0.5) < 1 - eps, A < 0 (clipped);
    # row 2: s = exp(0.05) inside the range, A < 0; padding carries a large log-ratio that must be ignored
    logp = T([[0.4, 0.4, 0.4, 0.4], [-0.5, -0.5, 9.0, 9.0], [0.05, 0.05, 0.05, 9.0]])
    adv = T([1.0, -0.5, -2.0])
    loss, _ = L("luspo")(logp, old, adv, mask, epsilon=0.2, epsilon_high=0.28)
    want_total, want_rows = _luspo_expected(logp, old, adv, mask, 0.2, 0.28)
    # hand check of the clipped rows: row 0 -> -4 * 1.28, row 1 -> -2 * min(0.6065*-0.5, 0.8*-0.5) = -2 * -0.4
    assert want_rows[0] == pytest.approx(-4 * 1.28) and want_rows[1] == pytest.approx(0.8)
    # every token of row i carries |o_i| * l_i, so GRPO's seq_mean_token_mean gives TRL's (l * |o|).mean()
    for i in range(3):
        assert torch.allclose(loss[i][mask[i] > 0], torch.full((int(mask[i].sum()),), want_rows[i]), atol=1e-5)
    assert float(seq_mean(loss, mask)) == pytest.approx(want_total, rel=1e-5)
    # it differs from GSPO (sequence_ratio) when lengths differ: GSPO is (1/N) sum_i l_i
    gspo = seq_mean(L("sequence_ratio")(logp, old, adv, mask, epsilon=0.2, epsilon_high=0.28)[0], mask)
    assert float(gspo) == pytest.approx(sum(w / float(mask[i].sum()) for i, w in enumerate(want_rows)) / 3, rel=1e-5)
    assert abs(float(gspo) - want_total) > 0.1


def test_luspo_gradient_at_ratio_one_is_token_sum_policy_gradient():
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    logp = T([[-0.3, -1.2, -0.8], [-2.0, -0.1, -0.1]], requires_grad=True)
    adv = T([0.7, -1.3])
    loss, _ = L("luspo")(logp, logp.detach(), adv, mask, epsilon=2e-3, epsilon_high=2.5e-3)
    seq_mean(loss, mask).backward()
    # d/dlogp_it of (1/N) |o_i| * -(s_i A_i), s_i = exp(mean_t log r_it), at s = 1: -(1/N) A_i on every real token;
    # GSPO would give -(1/N) A_i / |o_i| instead (the length bias LUSPO removes)
    want = -adv[:, None] / 2 * mask
    assert torch.allclose(logp.grad, want, atol=1e-6)


def test_luspo_is_length_times_gspo_when_lengths_are_equal():
    torch.manual_seed(0)
    mask = torch.ones(4, 5)
    logp = (torch.randn(4, 5) * 0.3).requires_grad_()
    old = torch.randn(4, 5) * 0.3
    adv = T([1.0, -1.0, 0.5, -0.2])
    lu = seq_mean(L("luspo")(logp, old, adv, mask, epsilon=0.2)[0], mask)
    g_lu, = torch.autograd.grad(lu, logp)
    gs = seq_mean(L("sequence_ratio")(logp, old, adv, mask, epsilon=0.2)[0], mask)
    g_gs, = torch.autograd.grad(gs, logp)
    assert torch.allclose(lu, 5 * gs) and torch.allclose(g_lu, 5 * g_gs, atol=1e-6)


@pytest.mark.parametrize("name,agg", [("luspo", "seq_mean_token_mean"), ("vespo", "token_mean")])
def test_luspo_vespo_micro_batch_invariance(name, agg):
    """The step loss and gradient do not depend on how the rows are split into micro-batches."""
    torch.manual_seed(1)
    R, Tn = 6, 5
    mask = (torch.rand(R, Tn) > 0.3).float()
    mask[:, 0] = 1
    logp = (torch.randn(R, Tn) * 0.2 - 1.0).requires_grad_()
    old = logp.detach() + torch.randn(R, Tn) * 0.2
    adv = torch.randn(R)
    A = AGGREGATIONS.get(agg)

    def part(rows):
        return L(name)(logp[rows], old[rows], adv[rows], mask[rows])[0]

    whole, g_whole = micro_batched_loss(A, part, mask, [slice(None)], Tn, logp)
    acc, g_acc = micro_batched_loss(A, part, mask, [slice(0, 2), slice(2, 5), slice(5, 6)], Tn, logp)
    assert torch.allclose(whole, acc, atol=1e-6) and torch.allclose(g_whole, g_acc, atol=1e-6)


# ----------------------------------------------------------------------------- VESPO (arXiv:2602.10693)

def _gamma_phi(log_w, k, lam):
    """phi(W) = W^k exp(lam (1 - W)), the paper's / authors' kernel with phi(1) = 1."""
    w = math.exp(log_w)
    return w ** k * math.exp(lam * (1.0 - w))


def test_vespo_values_and_detached_kernel():
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # row 0: W = 2 (A > 0: k 2, lambda 3); row 1: W = 0.5 * 0.5 = 0.25 (the product, not the geometric mean;
    # A < 0: k 3, lambda 2); the padding token's log-ratio is ignored
    logp = T([[-1.0, -0.5, -2.0], [-0.7, -0.9, -3.0]], requires_grad=True)
    old = logp.detach() - T([[math.log(2.0), 0.0, 0.0], [math.log(0.5), math.log(0.5), 5.0]])
    adv = T([1.5, -0.8])
    loss, metrics = L("vespo")(logp, old, adv, mask, vespo_k_pos=2.0, vespo_lambda_pos=3.0,
                                vespo_k_neg=3.0, vespo_lambda_neg=2.0)
    phi0 = 4.0 * math.exp(-3.0)               # 2^2 e^{3 (1 - 2)}
    phi1 = 0.25 ** 3 * math.exp(2.0 * 0.75)   # 0.25^3 e^{2 (1 - 0.25)}
    assert phi0 == pytest.approx(_gamma_phi(math.log(2.0), 2, 3)) and phi1 == pytest.approx(_gamma_phi(math.log(0.25), 3, 2))
    want = -T([[phi0 * 1.5], [phi1 * -0.8]]) * logp.detach()
    assert torch.allclose(loss, want, atol=1e-6)
    assert torch.allclose(metrics["vespo_phi"][:, 0], T([phi0, phi1]), atol=1e-6)
    # the kernel is detached: the gradient is phi * A * grad log pi (REINFORCE scaled), per token
    loss.sum().backward()
    assert torch.allclose(logp.grad, -T([[phi0 * 1.5] * 3, [phi1 * -0.8] * 3]), atol=1e-6)
    # aggregated as TRL / the authors: token sum over the step's token count
    total = AGGREGATIONS.get("token_mean")(want, mask, StepTotals.from_masks([mask], constant=3))
    assert float(total) == pytest.approx(float((want * mask).sum()) / 5.0)


def test_vespo_gradient_on_policy_equals_grpo():
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = T([0.9, -1.1])
    grads = {}
    for name in ("vespo", "clipped_ratio"):
        logp = T([[-0.3, -1.2, -0.8], [-2.0, -0.1, -0.4]], requires_grad=True)
        kw = {} if name == "vespo" else {"epsilon": 0.2}
        loss, _ = L(name)(logp, logp.detach(), adv, mask, **kw)
        AGGREGATIONS.get("token_mean")(loss, mask, StepTotals.from_masks([mask], constant=3)).backward()
        grads[name] = logp.grad
    # W = 1 -> phi = 1 -> -A grad log pi, the on-policy GRPO gradient under the same aggregation
    assert torch.allclose(grads["vespo"], grads["clipped_ratio"], atol=1e-6)
    assert torch.allclose(grads["vespo"], -adv[:, None] * mask / 5.0, atol=1e-6)


def test_vespo_extreme_ratios_are_suppressed_and_finite():
    mask = torch.ones(3, 2)
    logp = torch.full((3, 2), -1.0)
    # log W = 30 (clamped to 20), -60 (clamped to log 1e-8), and 0.1 for a zero advantage (uses the A >= 0 kernel)
    old = logp - T([[15.0, 15.0], [-30.0, -30.0], [0.05, 0.05]])
    adv = T([1.0, -1.0, 0.0])
    loss, metrics = L("vespo")(logp, old, adv, mask)
    phi = metrics["vespo_phi"][:, 0]
    assert torch.isfinite(loss).all() and torch.isfinite(phi).all()
    assert float(phi[0]) == 0.0  # exp(3 + 2*20 - 3 e^20) underflows to 0: a huge W gets no gradient
    assert float(phi[1]) == pytest.approx(_gamma_phi(math.log(1e-8), 3, 2), rel=1e-4) and float(phi[1]) < 1e-20
    assert float(phi[2]) == pytest.approx(_gamma_phi(0.1, 2, 3), rel=1e-5)


def test_vespo_and_luspo_config_and_recipes():
    with pytest.raises(ConfigError, match="vespo_lambda_neg"):
        Config.build({"policy_loss": "vespo", "vespo_lambda_neg": 0.0})
    with pytest.raises(ConfigError, match="vespo_k_pos"):
        Config.build({"policy_loss": "vespo", "vespo_k_pos": -1.0})
    v = recipe_overrides("vespo")
    assert v["policy_loss"] == "vespo" and v["loss_aggregation"] == "token_mean"
    assert (v["vespo_k_pos"], v["vespo_lambda_pos"], v["vespo_k_neg"], v["vespo_lambda_neg"]) == (2.0, 3.0, 3.0, 2.0)
    lu = recipe_overrides("luspo")
    assert lu["policy_loss"] == "luspo" and lu["loss_aggregation"] == "seq_mean_token_mean_all_rows"
    assert (lu["epsilon"], lu["epsilon_high"]) == (2e-3, 2.5e-3)


def test_luspo_recipe_counts_a_fully_masked_row_as_trl_does():
    """Recipe ``luspo`` normalises as its reference implementation, TRL's ``(l * mask.sum(1)).mean()`` (issue 43:
    TRL -3.3636, grpolab -3.8441 = 8/7 of it with one of 8 rows masked). Hand-computed, ratio 1 everywhere
    (s_i = 1, no clip), so row i gives |o_i| * -A_i; 4 rows, the last fully masked:
      |o| = [2, 3, 1, 0], A = [1, -0.5, 2, 5]:  2(-1) + 3(0.5) + 1(-2) + 0 = -2.5;  TRL: -2.5 / 4 = -0.625
      (the rows-with-tokens normaliser gives -2.5 / 3)."""
    from grpolab.algorithms.aggregation import StepTotals
    from grpolab.recipes import load_recipe
    agg = load_recipe("luspo")["components"]["loss_aggregation"]
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    logp = -torch.rand(4, 3, generator=torch.Generator().manual_seed(0))
    loss, _ = L("luspo")(logp, logp.clone(), T([1.0, -0.5, 2.0, 5.0]), mask, epsilon=2e-3, epsilon_high=2.5e-3)
    totals = StepTotals.from_masks([mask], constant=3)
    assert float(AGGREGATIONS.get(agg)(loss, mask, totals)) == pytest.approx(-2.5 / 4, abs=1e-6)
    assert float(AGGREGATIONS.get("seq_mean_token_mean")(loss, mask, totals)) == pytest.approx(-2.5 / 3, abs=1e-6)
