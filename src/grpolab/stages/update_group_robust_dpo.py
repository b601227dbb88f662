"""Group Robust Preference Optimization (GR-DPO): worst-group weighting of the DPO loss over labeller groups.

Ramesh et al., 2024, "Group Robust Preference Optimization in
Reward-free RLHF", arXiv:2405.20304 (seed 000-57; "GRPO" there is *Group Robust* PO, not Group Relative PO).
The objective over labeller groups g = 1..K with pairs (x, y_w, y_l) labelled by g:

    min_π max_{α ∈ Δ_K} Σ_g α_g · L_g(π),   L_g(π) = mean over g's pairs of ℓ(π; x, y_w, y_l),
    ℓ = −log σ(β · [(log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))]),

solved by alternating a mirror-ascent (exponentiated-gradient) step on α and a gradient step on π with the
α-weighted loss. Here: the ``preference_pairs`` rollout puts the step's pairs in the batch, the policy loss
``group_dpo`` gives each pair its DPO loss, and this update strategy does the α step and weights the pairs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import UPDATE_STRATEGIES, param
from ._checks import require_at_least


def pair_margins(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor,
                 chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(margins [P], chosen_rows [P])``: per pair (a group id of the batch: its chosen and its rejected row)
    ``m = h(y_w) − h(y_l)`` with ``h(y) = Σ_t (log π − log π_ref)`` over the row's loss tokens."""
    h = ((logprobs - ref_logprobs.to(logprobs.dtype)) * mask).sum(-1)
    margins, rows = [], []
    for g in torch.unique(group_ids).tolist():
        idx = (group_ids == g).nonzero().squeeze(-1)
        w = idx[chosen[idx] > 0.5]
        lose = idx[chosen[idx] <= 0.5]
        if len(w) != 1 or len(lose) != 1:
            raise ValueError(f"group_robust_dpo: batch group {g} is not one chosen and one rejected row "
                             f"(rollout_strategy preference_pairs makes such pairs)")
        margins.append(h[w[0]] - h[lose[0]])
        rows.append(w[0])
    return torch.stack(margins), torch.stack(rows)


def group_losses(pair_loss: torch.Tensor, labeller: torch.Tensor, num_groups: int) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    """``(L [K], counts [K])``: the mean pair loss of each labeller group in the batch (0 where a group has no
    pair, with count 0)."""
    labeller = labeller.long()
    if labeller.numel() and (int(labeller.min()) < 0 or int(labeller.max()) >= num_groups):
        raise ValueError(f"group_robust_dpo: labeller groups must be 0..{num_groups - 1} "
                         f"(group_robust_dpo_num_groups {num_groups}); got {sorted(set(labeller.tolist()))}")
    sums = torch.zeros(num_groups, dtype=pair_loss.dtype).index_add_(0, labeller, pair_loss)
    counts = torch.bincount(labeller, minlength=num_groups).to(pair_loss.dtype)
    return sums / counts.clamp(min=1), counts


def alpha_step(alpha: torch.Tensor, losses: torch.Tensor, eta: float) -> torch.Tensor:
    """One exponentiated-gradient (mirror ascent) step on the simplex: ``α_g ← α_g · exp(η · L_g) / Z``."""
    a = alpha * torch.exp(eta * losses)
    return a / a.sum()


NEEDS = {"rollout_strategy": "preference_pairs", "policy_loss": "group_dpo",
         "loss_aggregation": "seq_mean_token_mean"}


def _needs(cfg) -> None:
    """The run's other components that the weighting is built for (checked when the update first runs)."""
    wrong = [f"{k}: {v}" for k, v in NEEDS.items() if getattr(cfg, k, v) != v]
    if wrong:
        raise ValueError("update_strategy 'group_robust_dpo' weights the DPO losses of offline preference pairs "
                         "for the mean over rows of the rows' token means: set " + ", ".join(wrong))


def _check(cfg) -> None:
    require_at_least(cfg, 1, "group_robust_dpo_num_groups")
    require_at_least(cfg, 0, "group_robust_dpo_eta")


@UPDATE_STRATEGIES.register("group_robust_dpo", check=_check, needs=("tokens",))
class GroupRobustDPO:
    """Group Robust DPO (Ramesh et al., 2024, arXiv:2405.20304; seed 000-57): the worst-group
    weighting of the DPO loss over labeller groups.

    Each step, on the batch's pairs (``preference_pairs``: group id = pair, ``row_data['pref_chosen']``,
    ``row_data['labeller_group']``) and with β = ``dpo_beta`` (``group_dpo``'s):

    1. ``m_p = h(y_w) − h(y_l)``, ``h(y) = Σ_t log π_θ(y_t) − log π_ref(y_t)`` under the current weights
       (the batch's behaviour log-probs, teacher-forced before the update) and the frozen initial policy;
       ``ℓ_p = −log σ(β m_p)``;
    2. ``L_g = (1/N_g) Σ_{p ∈ g} ℓ_p`` over the N_g pairs of group g in the batch;
    3. ``α_g ← α_g · exp(η_α · L_g)``, then ``α ← α / Σ_g α_g`` (η_α = ``group_robust_dpo_eta``; α starts
       uniform, 1/K, and is carried across steps and saved in checkpoints);
    4. the policy step on ``Σ_g α_g · L_g(θ)`` with the new α: every token of pair p's two rows gets the weight
       ``P · α_g / N_g`` (P = pairs in the batch) in ``batch.token_weights``, so that ``group_dpo`` (ℓ_p on
       each token of the pair) with ``seq_mean_token_mean`` (mean over the 2P rows of their token means) gives
       ``(1/P) Σ_p P α_{g(p)}/N_{g(p)} ℓ_p = Σ_g α_g L_g``; then the ordinary update (``num_iterations``
       passes; the weights stay fixed over the passes).

    ``group_robust_dpo_weighting: pairs`` gives every pair weight 1 instead (plain DPO, the mean over all
    pairs, so each group counts by its share of the pairs: the paper's baseline); ``group_robust_dpo_eta: 0``
    keeps α uniform (each group's mean loss counts equally, whatever its share).
    A labeller group with no pair in the batch uses its L_g of the last batch that had one (0 before any), so
    a small group's weight does not fall because a step happened to draw none of its pairs.
    Metrics: ``rollout/grdpo_alpha_<g>`` and ``rollout/grdpo_loss_<g>`` (the L_g of step 2).

    Matched to the authors' code (https://github.com/rsshyam/Group-robust-preference-optimization-bandits,
    algos/linear_bandit/group_robust_dpo_vectorised_gradfix.py, ``batch_update_once``): the group loss is the
    batch mean of −log σ(β·margin) over the group's pairs (``group_loss /= cur_group_counts``), the weights are
    multiplied by ``exp(exp_step_size * group_loss)`` and renormalised *before* the parameter step, and the step
    uses ``Σ_g α_g · (Σ_{p∈g} ∇ℓ_p)/N_g`` (their "gradfix"). Differences: the policy is a language model
    trained with AdamW (theirs: a log-linear bandit policy, plain gradient descent); their optional
    generalisation adjustment ``adj/√N_g`` (default off) and L2 terms are not included; their code divides by
    a count of 0 for a group absent from the batch (their default sampler draws groups uniformly), here such a
    group keeps its last loss; their default η_α is 0.01 (``--rdpo_exp_step_size``), the recipe's is larger
    for its short runs.

    Provenance: authors' code — https://github.com/rsshyam/Group-robust-preference-optimization-bandits,
    algos/linear_bandit/group_robust_dpo_vectorised_gradfix.py (batch_update_once); a language-model policy with
    AdamW and the last loss for a group absent from the batch are grpolab's.
    Test: tests/test_group_robust_pref.py::test_alpha_step_by_hand,
    tests/test_group_robust_pref.py::test_weighted_loss_gradient_is_alpha_weighted_group_gradients.
    """

    needs_reference_model = True
    fills_ref_logprobs = True  # group_dpo's config check: the reference log-probs come from here with beta 0

    def __init__(self, *, group_robust_dpo_num_groups: int = param(2, "group_robust_dpo: number of labeller "
                                                                     "groups K (labeller_group 0..K-1)"),
                 group_robust_dpo_eta: float = param(1.0, "group_robust_dpo: exponentiated-gradient step size "
                                                          "η_α of the group weights (the authors' bandit "
                                                          "default is 0.01)"),
                 group_robust_dpo_weighting: str = param(
                     "robust", "group_robust_dpo: 'robust' = the alpha-weighted group losses (GR-DPO); 'pairs' = "
                               "every pair weight 1, plain DPO's mean over pairs (the paper's baseline; alpha is "
                               "still stepped and logged)", ["robust", "pairs"])):
        if group_robust_dpo_weighting not in ("robust", "pairs"):
            raise ValueError(f"group_robust_dpo_weighting: expected robust or pairs, got "
                             f"'{group_robust_dpo_weighting}'")
        self.num_groups = int(group_robust_dpo_num_groups)
        self.eta = float(group_robust_dpo_eta)
        self.weighting = group_robust_dpo_weighting
        self.alpha = torch.full((self.num_groups,), 1.0 / self.num_groups, dtype=torch.float64)
        self.last_loss = torch.zeros(self.num_groups, dtype=torch.float64)  # L_g of the last batch with g

    def state_dict(self) -> dict:
        return {"alpha": self.alpha.clone(), "last_loss": self.last_loss.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.alpha = state["alpha"].clone().to(torch.float64)
        self.last_loss = state["last_loss"].clone().to(torch.float64)

    def weights(self, batch, beta: float) -> dict:
        """Steps 1-3 of the docstring on ``batch`` (with its ``ref_logprobs``; ``beta`` = ``dpo_beta``); sets
        ``batch.token_weights`` (step 4's weights) and returns the step's group losses."""
        if "pref_chosen" not in batch.row_data or "labeller_group" not in batch.row_data:
            raise ValueError("update_strategy 'group_robust_dpo' needs the batch's pair labels (row_data "
                             "pref_chosen, labeller_group): set rollout_strategy: preference_pairs")
        chosen = batch.row_data["pref_chosen"]
        labeller = batch.row_data["labeller_group"].long()
        with torch.no_grad():
            m, rows = pair_margins(batch.behavior_logprobs.double(), batch.ref_logprobs.double(),
                                   batch.completion_mask.double(), batch.group_ids, chosen)
            scalar = getattr(batch, "scalar_rewards", None)
            if scalar is not None and scalar.shape[0] == chosen.shape[0]:  # group_dpo picks y_w by the reward
                win = scalar[rows].double()
                lose = torch.stack([scalar[(batch.group_ids == batch.group_ids[r]) & (chosen <= 0.5)][0]
                                    for r in rows.tolist()]).double()
                if not bool((win > lose).all()):
                    raise ValueError("group_robust_dpo: a pair's chosen row does not have the higher reward, so "
                                     "group_dpo would not train it as y_w: use a reward that scores the label "
                                     "(task arithmetic_prefs' 'preferred')")
            pair_loss = -F.logsigmoid(beta * m)
            L, counts = group_losses(pair_loss, labeller[rows], self.num_groups)
            L = torch.where(counts > 0, L, self.last_loss)  # a group absent from the batch: its last loss
            self.last_loss = L.clone()
            self.alpha = alpha_step(self.alpha, L, self.eta)
            row_w = len(rows) * self.alpha[labeller] / counts[labeller].clamp(min=1)
            if self.weighting == "pairs":  # plain DPO: the mean over pairs
                row_w = torch.ones_like(row_w)
        w = row_w.to(batch.behavior_logprobs.dtype)[:, None].expand_as(batch.behavior_logprobs)
        batch.token_weights = w if batch.token_weights is None else batch.token_weights * w
        return {"loss": L, "counts": counts}

    def __call__(self, update, batch, ctx):
        _needs(ctx.cfg)
        if batch.ref_logprobs is None:  # beta 0: the trainer's KL pass did not fill them
            with ctx.reference_policy() as ref:
                batch.ref_logprobs = ctx.logprobs(batch, model=ref)
        out = self.weights(batch, ctx.cfg.dpo_beta)
        for g in range(self.num_groups):
            ctx.metric(f"grdpo_alpha_{g}", float(self.alpha[g]))
            if out["counts"][g] > 0:
                ctx.metric(f"grdpo_loss_{g}", float(out["loss"][g]))
        return update(batch)
