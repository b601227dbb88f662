"""Preference objectives over a group's rows: DGPO's group-preference loss for diffusion / flow models and DPO
on the best and worst completion of each group (GRPO vs DPO). Both need the reference model's values
(``needs_reference_model``)."""
from __future__ import annotations

import torch

from ...errors import ConfigError
from ...registry import POLICY_LOSSES, param
from .common import _pair_matrix, _row_mean, _row_sum, _whole_groups, per_token


def _check_dgpo(cfg) -> None:
    """DGPO's group weight sums over a whole group: groups of >= 2 that micro-batches never split."""
    _whole_groups(cfg)
    if cfg.micro_batch_tokens <= 0 and cfg.micro_batch_size % cfg.num_generations:
        raise ConfigError(f"policy_loss 'dgpo' sums each group's terms inside a micro-batch: micro_batch_size "
                          f"({cfg.micro_batch_size}) must be a multiple of num_generations ({cfg.num_generations})")
    if cfg.dgpo_beta <= 0 or cfg.dgpo_clip < 0:
        raise ConfigError(f"dgpo_beta must be > 0 and dgpo_clip >= 0, got {cfg.dgpo_beta} / {cfg.dgpo_clip}")


@POLICY_LOSSES.register("dgpo", check=_check_dgpo, needs=("denoising_loss",))
def dgpo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         group_ids: torch.Tensor, ref_dsm_loss: torch.Tensor | None = None, *,
         dgpo_beta: float = param(100.0, "DGPO (diffusion): beta_dpo in the group weight "
                                         "sigmoid(beta/G * sum_g A_i (l_theta - l_ref)) (the authors' 100)"),
         dgpo_clip: float = param(0.0, "DGPO (diffusion): clip range c; a step whose ratio exp(l_old - l_theta) "
                                       "leaves [1 - c, 1 + c] on its advantage's side has its loss detached "
                                       "(the authors' clip_dsm, 1e-2 / 5e-2; 0 = off)")):
    """DGPO group-preference loss for diffusion / flow models (Luo et al., "Reinforcing Diffusion Models by
    Direct Group Preference Optimization", arXiv:2510.08425; seed 000-42).

    With ``logprobs = −ℓ_θ`` (the policy ``flow_dsm``: ℓ = mean_u (v_θ(x_t) − v*)² of a re-noised final sample,
    one step per re-noising) and ℓ_ref the frozen reference's (``ref_dsm_loss``), per step j and group g of the
    micro-batch (G_g its rows):

        w_g,j = σ( (β/G_g) · Σ_{i∈g} A_i · (ℓ_θ,ij − ℓ_ref,ij) )   (detached)
        loss_ij = w_g,j · A_i · ℓ_θ,ij

    averaged over rows and steps by the aggregation (``token_mean``: the code's mean over the batch and over
    the M accumulated timesteps). It is the gradient of the DPO-style −log σ between the group's
    positive- and negative-advantage subsets. ``dgpo_clip`` c > 0: with ratio = exp(ℓ_old − ℓ_θ) (``old`` =
    the behaviour values), a step with A > 0 and ratio > 1 + c, or A < 0 and ratio < 1 − c, uses ℓ_θ detached
    (metric ``clip_frac``). Metric ``dgpo_weight``: w.

    Provenance: authors' code — https://github.com/Luo-Yihong/DGPO, scripts/train_sd3_dgpo.py
    (compute_group_dgpo_loss_allreduce; the clip_dsm branch of the training loop); differences: G is the
    group's row count in the micro-batch (the code divides by the configured group size; equal when groups
    are whole, which the config check enforces), the clip's ℓ_old is the behaviour (sampling) model's, the
    code's is an EMA of the policy; the code's optional KL β·mean‖v_θ − v_ref‖² is not included.
    Test: tests/test_image_dgpo_vipo.py::test_dgpo_weights_by_hand_on_two_groups,
    tests/test_image_dgpo_vipo.py::test_dgpo_clip_detaches.
    """
    if ref_dsm_loss is None:
        raise ValueError("dgpo needs the frozen reference's denoising losses (ref_dsm_loss): use policy flow_dsm, "
                         "whose forward offers dsm_loss")
    ell = -logprobs
    adv = per_token(advantages, logprobs).to(ell.dtype) * mask
    _, inv = torch.unique(group_ids, return_inverse=True)
    inv = inv.to(ell.device)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    with torch.no_grad():
        term = adv * (ell.detach() - ref_dsm_loss.to(ell))                       # [R, T]
        sums = torch.zeros(n_groups, ell.shape[1], dtype=ell.dtype, device=ell.device).index_add_(0, inv, term)
        size = torch.bincount(inv, minlength=n_groups).to(ell.dtype)[:, None]
        weight = torch.sigmoid(dgpo_beta * sums / size)[inv]                     # [R, T]
        clip = torch.zeros_like(mask, dtype=torch.bool)
        if dgpo_clip > 0:
            ratio = torch.exp((logprobs.detach() - old_logprobs).clamp(-20.0, 20.0))
            clip = torch.where(adv > 0, ratio > 1 + dgpo_clip, ratio < 1 - dgpo_clip) & (mask > 0)
    ell_used = torch.where(clip, ell.detach(), ell)
    return weight * adv * ell_used, {"dgpo_weight": weight, "clip_frac": clip.float()}


dgpo.needs_reference_model = True


# ------------------------------------------------------------------ GRPO vs DPO (000-82)
def _check_group_dpo(cfg) -> None:
    """Whole groups per micro-batch, dpo_beta > 0, and reference log-probs: the trainer's (beta > 0), the
    policy's reference forward (a policy that offers ``token_logprobs``, e.g. ``ar_image``) or the update
    strategy's (one with ``fills_ref_logprobs``, e.g. ``group_robust_dpo``)."""
    from ...registry import POLICIES
    _whole_groups(cfg)
    if cfg.dpo_beta <= 0:
        raise ConfigError(f"dpo_beta: must be > 0, got {cfg.dpo_beta}")
    if cfg.beta <= 0:
        from ...registry import UPDATE_STRATEGIES
        if getattr(UPDATE_STRATEGIES.get(cfg.update_strategy), "fills_ref_logprobs", False):
            return  # e.g. group_robust_dpo computes them before the update
        try:
            offers = POLICIES.get(cfg.policy).offers(None)
        except Exception:  # an offers() that reads its instance: decided at run time
            return
        if "token_logprobs" not in offers:
            raise ConfigError(f"policy_loss 'group_dpo' needs the reference's log-probs: policy {cfg.policy} gives "
                              f"them through the trainer's KL pass only, so set beta > 0 (or use a policy that "
                              f"offers token_logprobs, e.g. ar_image)")


@POLICY_LOSSES.register("group_dpo", check=_check_group_dpo, needs=("tokens",))
def group_dpo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              group_ids: torch.Tensor, ref_logprobs: torch.Tensor | None = None,
              ref_token_logprobs: torch.Tensor | None = None, batch=None, *,
              dpo_beta: float = param(0.1, "group_dpo: DPO's beta in -log sigmoid(beta * margin) (the authors' "
                                           "training.beta 0.1)")):
    """DPO on the best and worst completion of each group (online pairs; the DPO half of "Delving into RL for
    Image Generation with CoT: A Study on DPO vs. GRPO", Tong et al., arXiv:2505.17017; seed 000-82).

    Per group g (its rows in this micro-batch): y_w = the row with the highest scalar reward, y_l = the row with
    the lowest (the first such row on ties); a group whose rewards are all equal (or that has fewer than two
    scorable rows) forms no pair and contributes nothing. With S(y) = Σ_t log π(y_t) the summed token
    log-prob and h(y) = S_θ(y) − S_ref(y):

    ``L_g = −log σ(β · [h(y_w) − h(y_l)])``

    L_g·n_g/2 is put on every token of y_w and of y_l (n_g = the group's rows), every other row gets 0, so
    that with the per-row or per-token mean aggregations (16 tokens per image) the step loss is Σ_g L_g / (number
    of groups): the mean pair loss, a tie group counting 0. Rewards: ``batch.scalar_rewards`` (the weighted sum,
    after reward transforms); a batch without them falls back to the row advantages, which ``group_zscore`` keeps
    monotone in the reward within a group. Reference log-probs: ``ref_token_logprobs`` (the frozen reference's
    forward of this micro-batch, from a policy that offers ``token_logprobs``: ``ar_image``), else the trainer's
    ``ref_logprobs`` (filled when beta > 0, which also adds the KL term). ``old_logprobs`` is unused (DPO has no
    ratio). Metrics (averaged by the trainer over every loss token, 0 off the pair rows): ``dpo_pair_frac`` (1 on
    a pair row) and ``dpo_margin`` (h(y_w) − h(y_l), detached, on the pair's rows).

    Matched to the authors' code (https://github.com/ZiyuGuo99/Image-Generation-CoT, training/train_dpo.py):
    ``get_batch_logps`` sums the token log-probs (``average_log_prob=False``), ``logits = (π_w − π_l) −
    (ref_w − ref_l)``, ``loss = −F.logsigmoid(beta · logits)``, beta 0.1 (scripts/dpo.yaml; ``sft_coef`` 0), a
    frozen copy of the initial model as reference. Differences [ours]: their pairs are built off-line from a
    preference data set; here each step's groups give one online pair each (winner and loser by the scalar
    reward); tie groups are dropped (Flow-GRPO's tracker in ``type='dpo'`` mode takes rows 0 and 1 instead).

    Provenance: authors' code — https://github.com/ZiyuGuo99/Image-Generation-CoT, training/train_dpo.py (the DPO
    loss on summed log-probs, beta 0.1); online best/worst pairs per group and dropped ties are grpolab's.
    Test: tests/test_ar_image.py::test_group_dpo_hand_value_and_ties.
    """
    _pair_matrix(group_ids, "group_dpo")  # every group whole in this micro-batch
    ref = ref_token_logprobs if ref_token_logprobs is not None else ref_logprobs
    if ref is None:
        raise ValueError("group_dpo needs the reference model's log-probs: set beta > 0, or use a policy whose "
                         "forward offers token_logprobs (ar_image)")
    h = _row_sum(logprobs - ref.to(logprobs.dtype), mask)
    rewards = getattr(batch, "scalar_rewards", None)
    if rewards is None or rewards.shape[0] != logprobs.shape[0]:
        rewards = _row_mean(per_token(advantages, logprobs), mask)
    rewards = rewards.detach().to(h.device, torch.float64)
    row_loss = torch.zeros_like(h)
    on_pair = torch.zeros(h.shape[0], dtype=torch.bool, device=h.device)
    margin = torch.zeros_like(h)
    for g in torch.unique(group_ids).tolist():
        rows = (group_ids == g).nonzero().squeeze(-1).to(h.device)
        r = rewards[rows]
        ok = ~torch.isnan(r)
        if int(ok.sum()) < 2:
            continue
        rows, r = rows[ok], r[ok]
        if bool(r.max() == r.min()):
            continue
        w, l = rows[int(r.argmax())], rows[int(r.argmin())]
        d = h[w] - h[l]
        pair_loss = -torch.nn.functional.logsigmoid(dpo_beta * d) * (len(rows) / 2)
        row_loss = row_loss.index_put((torch.stack([w, l]),), pair_loss.expand(2))
        on_pair[w] = on_pair[l] = True
        margin[w] = margin[l] = d.detach()
    pair = per_token(on_pair.to(logprobs.dtype), logprobs)
    return per_token(row_loss, logprobs), {"dpo_pair_frac": pair, "dpo_margin": per_token(margin, logprobs)}


group_dpo.needs_reference_model = True
