"""Advantage shaping estimators: noise-aware, stateful, soft, gated, pairwise and span-decoupled advantages.

Advantage estimators (``advantage: name``) of the GRPO variants that correct
for reward noise, keep state across steps, reshape rewards before the group
baseline, or give each token span its own advantage (``[R, T]``); the
weightings that rescale an estimator's advantages (uncertainty, entropy,
token weights, span scales) are in ``weightings.py``. Every function states
its formula, its seed id, and the choices made where the paper or abstract
leaves one open. Token spans: :mod:`grpolab.algorithms.spans`.
"""
from __future__ import annotations

import math

import torch

from ..errors import ConfigError
from ..registry import param
from .advantages import ADVANTAGES, group_stats, group_zscore
from .groups import group_index, masked_row_mean
from .spans import SPAN_MARK, span_ids_of


# ----------------------------------------------------------------- helpers


def reward_column(reward_matrix: torch.Tensor, names: list[str], spec: str) -> torch.Tensor:
    """Column ``spec`` of the reward matrix: a reward name or an integer index (``-1`` = last)."""
    spec = str(spec).strip()
    if spec in names:
        return reward_matrix[:, names.index(spec)]
    try:
        idx = int(spec)
    except ValueError:
        raise ConfigError(f"reward column '{spec}' is neither a reward name ({', '.join(names) or 'none'}) "
                          f"nor an integer index") from None
    K = reward_matrix.shape[1]
    if not -K <= idx < K:
        raise ValueError(f"reward column index {idx} is out of range for {K} reward function(s) "
                         f"({', '.join(names) or 'unnamed'})")
    return reward_matrix[:, idx]


def _reward_names(batch, reward_matrix: torch.Tensor) -> list[str]:
    names = list(getattr(batch, "reward_names", []) or []) if batch is not None else []
    return names if len(names) == reward_matrix.shape[1] else []


# ------------------------------------------------------------------ S-GRPO


def sgrpo_weight(n: torch.Tensor, k: torch.Tensor, p: float, eps: float = 1e-8) -> torch.Tensor:
    """S-GRPO optimal group weight ``w*(n, k, p)`` (authors' ``group_weight``).

    ``q = k / n`` (observed success rate), ``t = clip((q - p) / (1 - 2p), 0, 1)``
    (noise-corrected true rate), ``w* = (1 - 2p) t (1 - t) /
    (sqrt(q (1 - q) + eps) * sqrt(t (1 - t) + eps))``; ``w* = 0`` for ``n = 0``.
    """
    if not 0.0 <= p < 0.5:
        raise ValueError(f"sgrpo_noise_p: must be in [0, 0.5), got {p}")
    n = n.double()
    q = k.double() / n.clamp(min=1)
    t = ((q - p) / (1.0 - 2.0 * p)).clamp(0.0, 1.0)
    w = (1.0 - 2.0 * p) * t * (1.0 - t) / (torch.sqrt(q * (1 - q) + eps) * torch.sqrt(t * (1 - t) + eps))
    return torch.where(n > 0, w, torch.zeros_like(w))


@ADVANTAGES.register("sgrpo_noise_aware", min_group_size=2)
def sgrpo_noise_aware(rewards: torch.Tensor, group_ids: torch.Tensor, *, advantage_epsilon: float = 1e-4,
                      sgrpo_noise_p: float = param(0.1, 'S-GRPO: symmetric reward-flip probability p in [0, 0.5)'),
                      sgrpo_success_threshold: float = param(0.0, 'S-GRPO: a reward above this (strict >) counts as '
                                                             "a success (k); the authors' reward > 0, so it "
                                                             'overrides the shared success_threshold for S-GRPO')
                      ) -> torch.Tensor:
    """S-GRPO noise-aware advantage (Shen et al., 2025, seed 000-32; github.com/shenpeijun0212/S-GRPO).

    ``A_i = w*(n, k, p) * (r_i - mean_g r) / (std_g r + epsilon)`` where ``n`` is
    the group's scored rows, ``k`` the rows with ``r > sgrpo_success_threshold``
    and ``w*`` :func:`sgrpo_weight` under a symmetric reward-flip probability
    ``p``. Unbalanced groups (k near 0 or n), whose few successes are most
    likely flipped labels, are down-weighted; at ``p = 0`` ``w* ~= 1`` (GRPO).

    As in the authors' code (``compute_monte_carlo_advantages``) the weight
    multiplies the GRPO z-score (it recovers GRPO's std); binary rewards are
    assumed, counting ``reward > 0`` as a success as they do (hence S-GRPO's own
    ``sgrpo_success_threshold`` = 0 with a strict ``>``, not the shared
    ``success_threshold``, ``>= 1.0``). ``p = 0.1`` is our
    default (the authors' flag defaults to 0 = off).

    Provenance: authors' code — https://github.com/shenpeijun0212/S-GRPO, train/train_S-GRPO.py (group_weight,
    compute_monte_carlo_advantages); p = 0.1 is grpolab's default (the authors' flag defaults to 0).
    Test: tests/test_advantage_shaping.py::test_sgrpo_matches_the_authors_drgrpo_branch.
    """
    adv = group_zscore(rewards, group_ids, advantage_epsilon=advantage_epsilon)
    scored = ~torch.isnan(rewards)
    inv, n_groups = group_index(group_ids)
    n = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, scored.double())
    succ = (scored & (torch.nan_to_num(rewards, nan=0.0) > sgrpo_success_threshold)).double()
    k = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, succ)
    return adv * sgrpo_weight(n, k, sgrpo_noise_p)[inv].to(adv.dtype)


# ------------------------------------------------------ SPO single stream


@ADVANTAGES.register("spo_single_stream")
class SPOValueTracker:
    """SPO single-stream advantage with a persistent per-prompt value tracker
    (Single-stream Policy Optimization, Xu & Ding, 2025, arXiv:2509.13232, seed 000-113).

    Per prompt ``x`` (keyed by ``prompt_uids``) a Beta posterior ``(a, b)`` of the
    success rate; ``v(x) = a / (a + b)``. Each row's advantage uses the value the
    tracker had before this step::

        A_i = r_i - v(x_i)                            (no group baseline)
        A~  = (A - mean_B A) / (std_B A + epsilon)     (batch-global z-score)

    After the step's optimiser update (:meth:`after_optimizer_step`, which the
    trainer calls with the updated policy's log-probs), per prompt of the batch::

        D   = mean over the tokens of y_last of |log pi_last(y_last) - log pi_now(y_last)|
        rho = clip(2^(-D / D_half), rho_min, rho_max)
        a  <- rho a + sum r,     b <- rho b + sum (1 - r)

    where ``y_last`` is the completion of the prompt's previous visit and
    ``log pi_last`` its log-probs under the policy as it was right after that
    visit's update (stored then), ``pi_now`` the policy right after this step's
    update. A prompt's first visit has ``D = 0`` (``rho = rho_max``). The new
    completion and its log-probs under the updated policy are stored for the
    next visit. A new prompt starts from ``a = v0 N0``, ``b = (1 - v0) N0`` with
    ``v0 = spo_prior_value`` and ``N0 = 1 / (1 - rho_min)``. Works with any
    number of completions per prompt (``num_generations: 1`` is the paper's
    setting; with G > 1 the rows of a prompt share the baseline, ``D`` is the
    mean of their per-row drifts). Rewards must lie in [0, 1]; unscorable (NaN)
    rows get A = 0 and do not update the tracker. The prioritised prompt
    sampling is the sampler ``spo_prioritized`` (prompts/spo.py), which reads
    this tracker.

    Provenance: authors' code — https://github.com/volcengine/verl, recipe/spo/spo_ray_trainer.py (commit
    4b2b364: ``RayPPOTrainer.fit`` for the advantage ``r - alpha / (alpha + beta)`` z-scored over the batch, then
    ``alpha = rho * alpha + r``, ``beta = rho * beta + (1 - r)`` after ``update_actor``; ``_get_spo_rho`` type
    ``kl`` for ``D = masked_mean(|old_log_probs - cur_log_probs|)`` on the prompt's last stored response, the
    first visit using the current log-probs as old (D = 0), ``D_half = 0.06``, ``clamp(rho, clip_lower, 0.96)``);
    differences: the authors initialise ``alpha, beta = N_init (s + 0.5) / (N + 1), N_init (N - s + 0.5) /
    (N + 1)`` from N offline rollouts of the initial policy per prompt (N_init = 1 / (1 - clip_lower)), or 0.5
    and 0.5 without them; here a prior value ``v0`` with the same count N_init stands in for the offline
    success rate ``(s + 0.5) / (N + 1)``; the batch std is Bessel-corrected as theirs, with grpolab's
    ``advantage_epsilon`` (1e-4) for their 1e-8. Test: tests/test_advantage_shaping.py::test_spo_tracker_hand_computed.
    """

    def __init__(self, *,
                 spo_rho_min: float = param(0.875, 'SPO: lower clip of the forgetting factor rho'),
                 spo_rho_max: float = param(0.96, 'SPO: upper clip of the forgetting factor rho'),
                 spo_kl_half: float = param(0.06, 'SPO: policy drift D_half at which rho = 1/2 before clipping'),
                 spo_prior_value: float = param(0.5, 'SPO: value estimate of a prompt never seen before'),
                 spo_normalize: str = param('batch', 'SPO: z-score advantages over the whole batch, or not',
                                            ['batch', 'none'])):
        if not 0.0 < spo_rho_min <= spo_rho_max < 1.0:
            raise ConfigError(f"spo_rho_min/spo_rho_max: need 0 < rho_min <= rho_max < 1, "
                              f"got {spo_rho_min}, {spo_rho_max}")
        if spo_kl_half <= 0:
            raise ConfigError(f"spo_kl_half: must be > 0, got {spo_kl_half}")
        if not 0.0 <= spo_prior_value <= 1.0:
            raise ConfigError(f"spo_prior_value: must be in [0, 1], got {spo_prior_value}")
        if spo_normalize not in ("batch", "none"):
            raise ConfigError(f"spo_normalize: '{spo_normalize}' is not valid; valid values: batch, none")
        self.rho_min, self.rho_max, self.kl_half = spo_rho_min, spo_rho_max, spo_kl_half
        self.prior, self.normalize = spo_prior_value, spo_normalize
        self.table: dict[int, tuple[float, float]] = {}  # uid -> (a, b)
        self.last: dict[int, tuple] = {}  # uid -> (its last completions as a RolloutBatch, their log-probs then)
        self.pending: dict | None = None  # this step's scored rows, until after_optimizer_step

    def value(self, uid: int) -> float:
        if uid in self.table:
            a, b = self.table[uid]
            return a / (a + b)
        return self.prior

    def rho(self, drift: float) -> float:
        return min(max(2.0 ** (-drift / self.kl_half), self.rho_min), self.rho_max)

    def __call__(self, rewards: torch.Tensor, prompt_uids: torch.Tensor, batch, *,
                 advantage_epsilon: float = 1e-4) -> torch.Tensor:
        if self.pending is not None:
            raise RuntimeError("spo_single_stream: the last batch's tracker update is still pending; "
                               "after_optimizer_step(logprobs) must follow every advantage call (the trainer "
                               "calls it after the optimiser step)")
        scored = ~torch.isnan(rewards)
        r = rewards.double()
        if bool(((r[scored] < 0) | (r[scored] > 1)).any()):
            raise ValueError("spo_single_stream: rewards must lie in [0, 1] (the tracker estimates success rates)")
        uids = prompt_uids.tolist()
        baseline = torch.tensor([self.value(u) for u in uids], dtype=torch.float64)
        adv = torch.where(scored, r - baseline, torch.zeros_like(r))
        rows = [i for i in range(len(uids)) if bool(scored[i])]
        if rows:
            self.pending = {"batch": batch.select(rows), "uids": [uids[i] for i in rows],
                            "rewards": [float(r[i]) for i in rows]}
        if self.normalize == "batch":
            mean, std, count = group_stats(torch.where(scored, adv, torch.full_like(adv, float("nan"))),
                                           torch.zeros_like(prompt_uids))
            adv = torch.nan_to_num((adv - mean) / (std + advantage_epsilon), nan=0.0) * scored
        return adv.to(rewards.dtype)

    def drift(self, old: torch.Tensor, now: torch.Tensor, mask: torch.Tensor) -> float:
        """``D``: the mean over rows of each row's mean ``|old - now|`` over its completion tokens."""
        return float(masked_row_mean((old.double() - now.double()).abs(), mask).mean())

    def after_optimizer_step(self, logprobs, pad_id: int = 0) -> None:
        """The tracker update of the step's batch, after the optimiser step. ``logprobs(batch)``: the updated
        policy's per-token log-probs ``[R, T]`` of a batch's completions."""
        from ..batch import RolloutBatch  # the batch type, for concatenating stored completions

        p, self.pending = self.pending, None
        if p is None:
            return
        order = list(dict.fromkeys(p["uids"]))
        seen = [u for u in order if u in self.last]
        drift = dict.fromkeys(order, 0.0)  # a first visit: old = now, D = 0
        if seen:
            now = logprobs(RolloutBatch.concat([self.last[u][0] for u in seen], pad_id=pad_id))
            start = 0
            for u in seen:
                past, old = self.last[u]
                n, T = old.shape
                drift[u] = self.drift(old, now[start:start + n, :T], past.completion_attention_mask[:, :T])
                start += n
        current = logprobs(p["batch"])
        for u in order:
            rows = [i for i, v in enumerate(p["uids"]) if v == u]
            succ = sum(p["rewards"][i] for i in rows)
            if u in self.table:
                a, b = self.table[u]
            else:
                n0 = 1.0 / (1.0 - self.rho_min)
                a, b = self.prior * n0, (1.0 - self.prior) * n0
            rho = self.rho(drift[u])
            self.table[u] = (rho * a + succ, rho * b + len(rows) - succ)
            mine = p["batch"].select(rows).trim()
            self.last[u] = (mine, current[rows, :mine.completion_ids.shape[1]].detach().cpu())

    def state_dict(self) -> dict:
        return {"table": {int(k): list(v) for k, v in self.table.items()},
                "last": {int(k): [b, lp] for k, (b, lp) in self.last.items()}, "pending": self.pending}

    def load_state_dict(self, state: dict) -> None:
        # a checkpoint before the authors' drift stored (a, b, nll): the completions it lacks start over
        self.table = {int(k): (float(v[0]), float(v[1])) for k, v in state["table"].items()}
        self.last = {int(k): (v[0], v[1]) for k, v in state.get("last", {}).items()}
        self.pending = state.get("pending")


# -------------------------------------------------------------- TempSamp-R1


def asymmetric_soft_reward(rewards: torch.Tensor, tau: float, log_scale: float, alpha: float) -> torch.Tensor:
    """TempSamp-R1 reward shaping, as ``transform_rewards`` in the public TempSamp-R1 code:

    ``r >= tau: tau + log_scale * log(1 + (r - tau))``            (compress to a near-flat plateau)
    ``r <  tau: tau - (exp(alpha (tau - r)) - 1) / (exp(alpha) - 1)``  (exponential penalty ramp)
    """
    if alpha <= 0:
        raise ValueError(f"tempsamp_alpha: must be > 0 (the ramp divides by exp(alpha) - 1), got {alpha}")
    if log_scale < 0:
        raise ValueError(f"tempsamp_log_scale: must be >= 0, got {log_scale}")
    d = rewards - tau
    up = tau + log_scale * torch.log1p(d.clamp(min=0))
    down = tau - torch.expm1(alpha * (-d).clamp(min=0)) / math.expm1(alpha)
    return torch.where(d >= 0, up, down)


@ADVANTAGES.register("tempsamp_soft_advantage", min_group_size=2)
def tempsamp_soft_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, *, advantage_epsilon: float = 1e-4,
                            tempsamp_tau: float = param(0.8, 'TempSamp-R1: success threshold (pivot) of the reward '
                                                        'shaping (authors\' code: 0.8 on IoU)'),
                            tempsamp_log_scale: float = param(0.01, 'TempSamp-R1: coefficient of log(1 + r - tau) '
                                                              'above the pivot (authors\' code: 0.01)'),
                            tempsamp_alpha: float = param(1.0, 'TempSamp-R1: steepness of the exponential ramp below '
                                                          'the pivot (authors\' code: 1.0)')) -> torch.Tensor:
    """TempSamp-R1 non-linear soft advantage (Li et al., 2025, arXiv:2509.18056, seed 000-112).

    ``A_i = zscore_g(phi(r)_i)`` with the reward shaping ``phi``
    (:func:`asymmetric_soft_reward`)::

        phi(r) = tau + 0.01 * log(1 + (r - tau))                     r >= tau
        phi(r) = tau - (exp(alpha (tau - r)) - 1) / (exp(alpha) - 1)  r <  tau

    with ``tau = 0.8`` and ``alpha = 1``: rewards at or above the success
    threshold are squashed onto a near-flat plateau (r = 1 -> 0.8018), so a
    near-perfect (e.g. injected ground-truth) completion does not dominate the
    group; below it the penalty ramps exponentially (r = 0 -> 0.0867), so the
    group advantage sharpens around the threshold. ``phi`` is monotone and
    continuous at ``tau``.

    Provenance: authors' code — https://github.com/ZhangZikun6666/TempSamp-R1,
    scripts/timelens/timelens_reward.py (transform_rewards; defaults
    GTPO_REWARD_SHAPING_THRESHOLD 0.8, GTPO_REWARD_SHAPING_ALPHA 1.0, the 0.01
    plateau factor hard-coded) and verl/trainer/core_algos.py
    (compute_grpo_outcome_advantage: sample std, eps 1e-6 where grpolab uses
    ``advantage_epsilon``). This repository's README credits the paper's
    authors (Li, Cheng, Jia, Kuang, Jiao, Hou, Cheng) and calls itself "an
    open-source implementation of TempSamp-R1"; it is not the HVision-NKU
    repository named in the paper, which is not in the searched store, so it
    is the closest public code, not certainly the paper's own. Known
    differences: the code shapes only the IoU term and adds a 0.1-weighted
    format reward afterwards; here ``phi`` is applied to the task's scalar
    reward. The code's ground-truth injection (one rollout per group replaced
    by the ground-truth answer, ``_inject_gt_rollout_in_gen_output``) is the
    rollout strategy ``tempsamp_r1`` (grpolab.rollouts.tempsamp), not part of
    this advantage component.
    Test: tests/test_advantage_shaping.py::test_tempsamp_soft_advantage.
    """
    shaped = asymmetric_soft_reward(rewards, tempsamp_tau, tempsamp_log_scale, tempsamp_alpha)
    return group_zscore(shaped, group_ids, advantage_epsilon=advantage_epsilon)


# --------------------------------------------------------------------- AAPO


AAPO_REF_COLUMN = param('ref_reward', "AAPO: batch column with the reward of each row's reference-model "
                        "completion (written by rollout_strategy aapo_reference)")


@ADVANTAGES.register("aapo_momentum")
class AAPOMomentum:
    """AAPO advantage momentum / margin (Xiong et al., 2025, arXiv:2505.14264, seed 000-48).

    ``A_i = (r_i - mean_g r) / (std_g r + 1e-4) + eta * clip(r_i - r^ref_i, -clip_low, clip_high)``

    ``r^ref_i`` is the reward of a completion of the same prompt sampled from
    the frozen reference model (the initial policy), scored with the same
    reward functions; ``std_g`` is Bessel-corrected; ``eta = 1`` and the bounds
    ``0.2 / 0.28`` are the authors'. The policy is trained with the plain
    cross-entropy loss ``-A_i log pi(o_i)`` averaged over all tokens of the
    batch (no ratio, no clip: ``policy_loss: policy_gradient`` with
    ``loss_aggregation: token_mean``). The "momentum" (renamed "advantage
    margin" in the latest arXiv version) is the reward gap to the reference
    model: when the group advantage vanishes (all rewards equal) it still says
    whether the policy beats the reference.

    ``aapo_baseline`` chooses ``r^ref``:

    * ``reference`` (default, the authors'): the batch column
      ``aapo_ref_column`` (default ``ref_reward``), which the rollout strategy
      ``aapo_reference`` writes (``rollouts/reference.py``). A run without that
      column stops with an error naming the fix; a None/NaN entry (an
      unscorable reference completion) gives margin 0.
    * ``ema`` (grpolab's stand-in, not the paper's): ``r^ref_i = m(x_i)``, an
      exponential moving average of prompt x's group-mean reward over its
      previous visits (``m <- mu m + (1 - mu) mean_g r``, ``mu =
      aapo_momentum``; margin 0 on a first visit; checkpointed). Once it
      settles the margin of an all-correct or all-wrong group is 0, where
      AAPO's is not.

    Unscorable rows get A = 0.

    Provenance: authors' code — https://github.com/JianxXiong/AAPO,
    open-r1/trainer/AAPOTrainer.py (AAPOTrainer._generate_and_score_completions
    and compute_loss, the same formula in open-rs/trainer/AAPOTrainer.py);
    matches: the z-score with torch's Bessel std and 1e-4, ``advantage_constrain
    = rewards - ref_rewards`` paired by index (one reference completion per
    policy completion, ``ref_model.generate`` on the prompt repeated G times
    with the same generation config), clamp(-0.2, 0.28), the loss ``-logp * A``
    over ``completion_mask.sum()``. Known differences: the authors' rewards are
    a NaN-skipping weighted sum where an all-unscorable row scores 0 (here NaN,
    so A = 0 and margin 0); open-rs slices the reference *prompt* tokens
    (``prompt_ref_completion_ids[:, :prompt_length]``), a bug that open-r1
    fixes (``[:, prompt_length:]``) and grpolab follows open-r1; the open-rs
    vLLM branch (unused, their configs set ``use_vllm: false``) samples the
    "reference" completions from the current policy's vLLM server. The EMA
    baseline is grpolab's, not the authors'.
    Test: tests/test_advantage_shaping.py::test_aapo_momentum_hand_computed.
    """

    def __init__(self, *,
                 aapo_momentum: float = param(0.9, "AAPO: EMA momentum of each prompt's mean reward (only with "
                                              'aapo_baseline: ema; 1 = frozen at the first visit)')):
        if not 0.0 <= aapo_momentum <= 1.0:
            raise ValueError(f"aapo_momentum: must be in [0, 1], got {aapo_momentum}")
        self.mu = aapo_momentum
        self.ema: dict[int, float] = {}

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor, prompt_uids: torch.Tensor, batch=None, *,
                 advantage_epsilon: float = 1e-4,
                 aapo_baseline: str = param('reference', "AAPO: r_ref from the reference model's completions "
                                            "('reference', the authors'; needs rollout_strategy aapo_reference) or "
                                            "a per-prompt EMA of past group-mean rewards ('ema', grpolab's "
                                            'stand-in)', ['reference', 'ema']),
                 aapo_eta: float = param(1.0, 'AAPO: weight of the clipped margin term clip(r - r_ref)'),
                 aapo_clip_low: float = param(0.2, 'AAPO: margin r - r_ref is clipped below at -clip_low (authors: '
                                              '0.2)'),
                 aapo_clip_high: float = param(0.28, 'AAPO: margin r - r_ref is clipped above at clip_high (authors: '
                                               '0.28)'),
                 aapo_ref_column: str = AAPO_REF_COLUMN) -> torch.Tensor:
        if aapo_clip_low < 0 or aapo_clip_high < 0:
            raise ValueError(f"aapo_clip_low/high: must be >= 0, got {aapo_clip_low}, {aapo_clip_high}")
        adv = group_zscore(rewards, group_ids, advantage_epsilon=advantage_epsilon).double()
        if aapo_baseline == "reference":
            col = None if batch is None else getattr(batch, "columns", {}).get(aapo_ref_column)
            if col is None:
                raise ValueError(f"aapo_momentum: the batch has no column '{aapo_ref_column}' (the reward of each "
                                 "row's reference-model completion, AAPO's r_ref); select rollout_strategy: "
                                 "aapo_reference (the aapo recipe does), or set aapo_baseline: ema for grpolab's "
                                 "per-prompt EMA stand-in")
            base = torch.tensor([float("nan") if v is None else float(v) for v in col], dtype=torch.float64)
        elif aapo_baseline == "ema":
            base = torch.tensor([self.ema.get(u, float("nan")) for u in prompt_uids.tolist()], dtype=torch.float64)
            self._update_ema(rewards, group_ids, prompt_uids)
        else:
            raise ValueError(f"aapo_baseline: '{aapo_baseline}' is not valid; valid values: reference, ema")
        margin = torch.nan_to_num(rewards.double() - base, nan=0.0).clamp(-aapo_clip_low, aapo_clip_high)
        return (adv + aapo_eta * margin).to(rewards.dtype)

    def _update_ema(self, rewards: torch.Tensor, group_ids: torch.Tensor, prompt_uids: torch.Tensor) -> None:
        """One EMA update per prompt per step, with the mean of its groups' mean rewards (unscorable left out)."""
        mean, _, _ = group_stats(rewards.double(), group_ids)
        updates: dict[int, list[float]] = {}
        for i, u in enumerate(prompt_uids.tolist()):
            if not math.isnan(float(mean[i])):
                updates.setdefault(u, []).append(float(mean[i]))
        for u, means in updates.items():
            m_now = sum(means) / len(means)
            self.ema[u] = m_now if u not in self.ema else self.mu * self.ema[u] + (1 - self.mu) * m_now

    def state_dict(self) -> dict:
        return {"ema": {int(k): float(v) for k, v in self.ema.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.ema = {int(k): float(v) for k, v in state["ema"].items()}


# --------------------------------------------------------------------- AWPO


@ADVANTAGES.register("awpo_gated", min_group_size=2)
def awpo_gated(reward_matrix: torch.Tensor, group_ids: torch.Tensor, batch, *, advantage_epsilon: float = 1e-4,
               awpo_outcome_reward: str = param('0', 'AWPO: outcome reward column (name or index)'),
               awpo_reasoning_reward: str = param('-1', 'AWPO: reasoning reward column (name or index)'),
               awpo_lambda: float = param(0.5, 'AWPO: weight of the gated reasoning advantage'),
               awpo_var_cap: float = param(0.25, 'AWPO: outcome variance at which the gate closes (0.25 = Bernoulli '
                                           'max)')) -> torch.Tensor:
    """AWPO variance-gated, difficulty-weighted reasoning advantage (Lin et al., 2025, arXiv:2512.19126, seed 000-118).

    With outcome reward ``o`` and reasoning reward ``z`` (two columns of the
    reward matrix) and per-group statistics::

        A_i = zscore_g(o)_i + lambda * gate_g * diff_g * zscore_g(z)_i
        gate_g = clip(1 - var_g(o) / var_cap, 0, 1)     (variance-aware gating)
        diff_g = clip(1 - mean_g(o), 0, 1)               (difficulty weighting)

    The reasoning signal is let through where the outcome gives little signal
    (low outcome variance, e.g. all-fail groups) and weighted up on hard
    prompts; where outcomes already separate the completions it is gated off,
    so it cannot conflict with the primary objective.

    Provenance: reconstructed from the abstract — the abstract names
    "variance-aware gating and difficulty-aware weighting ... based on
    group-relative statistics"; the linear gate, the ``1 - mean`` difficulty
    and ``var_cap = 0.25`` (Bernoulli maximum) are grpolab's reading. Searched
    (no authors' code, no equations): the stored text of arXiv:2512.19126
    (html v2/v3: abstract and introduction only), the emergentmind.com AWPO
    page (a "hyper-advantage" without its formula), the code index (searches
    for AWPO / advantage-weighted policy optimization with gating) and the
    paper pages (no repository link). Columns are
    chosen by reward name
    or index (``awpo_outcome_reward``/``awpo_reasoning_reward``); naming the
    same column twice is allowed (the reasoning term then re-weights the
    outcome advantage). ``var`` is the Bessel-corrected group variance from
    :func:`group_stats`. The paper's tailored clipping is a loss feature, not
    part of this component: policy loss ``awpo_clipped`` (losses.py).
    """
    names = _reward_names(batch, reward_matrix)
    o = reward_column(reward_matrix, names, awpo_outcome_reward)
    z = reward_column(reward_matrix, names, awpo_reasoning_reward)
    a_o = group_zscore(o, group_ids, advantage_epsilon=advantage_epsilon)
    a_z = group_zscore(z, group_ids, advantage_epsilon=advantage_epsilon)
    mean_o, std_o, _ = group_stats(o, group_ids)
    gate = torch.nan_to_num(1.0 - std_o ** 2 / awpo_var_cap, nan=0.0).clamp(0.0, 1.0)
    diff = torch.nan_to_num(1.0 - mean_o, nan=0.0).clamp(0.0, 1.0)
    return a_o + awpo_lambda * gate * diff * a_z


# ------------------------------------------------------------------- DaGRPO


@ADVANTAGES.register("dagrpo_distinct_pairs", min_group_size=2)
def dagrpo_distinct_pairs(rewards: torch.Tensor, group_ids: torch.Tensor, *,
                          advantage_epsilon: float = 1e-4,
                          dagrpo_delta: float = param(0.1, 'DaGRPO: pairs with |r_i - r_j| < delta are masked')) -> torch.Tensor:
    """DaGRPO distinctiveness masking of low-contrast pairs (Xie et al., 2025, arXiv:2512.06337, seed 000-17).

    GRPO's centred reward is an average of pairwise differences,
    ``r_i - mean_g r = (1/n) sum_j (r_i - r_j)``. DaGRPO's sequence-level gradient
    rectification masks pairs whose scores are too close to be distinguished::

        A_i = (1/n) sum_{j in g} 1[|r_i - r_j| >= delta] (r_i - r_j) / (std_g r + epsilon)

    ``delta = 0`` gives GRPO's ``group_zscore`` exactly; a group whose rewards
    all lie within ``delta`` of each other gets A = 0 (no conflicting updates
    from homogeneous groups).

    Provenance: reconstructed from the abstract — the pairwise decomposition
    with a hard threshold ``delta`` on the fine-grained score is grpolab's
    reading of "mask sample pairs with low distinctiveness"; GRPO's ``1/n``
    and std normalisation are kept. Searched (no authors' code, no
    equations): the stored text of arXiv:2512.06337 (html v1: abstract and
    introduction only), sciencestack/arxivlens/newx summaries (no repository
    link) and the code index (DaGRPO, distinctiveness-aware GRPO: only
    unrelated "adagrpo" repositories).
    Off-policy anchor augmentation is a rollout feature, not part of this
    component. Unscorable rows get A = 0 and take part in no pair.
    """
    _, std, count = group_stats(rewards, group_ids)
    scored = ~torch.isnan(rewards)
    r = torch.nan_to_num(rewards.double(), nan=0.0)
    diff = r[:, None] - r[None, :]
    pair = (group_ids[:, None] == group_ids[None, :]) & scored[:, None] & scored[None, :]
    keep = pair & (diff.abs() >= dagrpo_delta)
    num = (diff * keep).sum(1) / count.double().clamp(min=1)
    adv = num / (std.double() + advantage_epsilon)
    return torch.nan_to_num(adv * scored, nan=0.0).to(rewards.dtype)


# ---------------------------------------------------------- span-decoupled


@ADVANTAGES.register("span_decoupled_advantage", min_group_size=2)
def span_decoupled_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                             completion_mask: torch.Tensor, batch, *, advantage_epsilon: float = 1e-4,
                             span_mark: str = SPAN_MARK,
                             span_reward_columns: list = param([''], 'DTPO: reward column (name or index) per span '
                                                               "id; '' = combined reward")) -> torch.Tensor:
    """Separate advantages per token span (DTPO in AdaptVision, 2025, seed 004-05).

    ``A_it = zscore_g(R_s)_i`` for token t in span ``s = span_id[i, t]``, where
    ``R_s`` is the reward column ``span_reward_columns[s]`` (name or index;
    ``''`` or ids past the list = the combined reward). DTPO decouples tool
    learning from answer accuracy: tool-call tokens learn from the tool reward,
    answer tokens from the accuracy reward, each with its own group
    normalisation. Output ``[R, T]``.

    Spans: with agent episodes (``rollout_strategy: agent``) ``span_mark:
    episode`` marks the model turns that made a tool call as span 1 and those
    that made none (the answer) as span 2, from the episode record
    (``batch.columns["episode"]``); the agent rollout numbers turns and
    observations 1, 2, 3, ... in ``batch.span_ids``, which ``span_mark: batch``
    uses as they are (span s = the s-th turn or observation). ``span_mark:
    first_token`` marks a control token. Unmarked tokens (id 0) use column 0 of
    the list. Choices: the generic text-LLM mechanism; the crop tool and visual
    tokens of the paper are domain-specific and not part of this component.

    The recipe ``rank_grpo`` uses it for Rank-GRPO's per-rank advantages (seed
    000-91): the ``rank_items`` rollout marks line k as span k and
    ``span_reward_columns: ["", rank_1, rank_2, rank_3]`` gives item k the group
    z-score of its causal reward ``rank_k`` (the authors' per-rank
    normalisation, Bessel std, epsilon 1e-4).

    Provenance: reconstructed from the abstract — per-span reward columns, each group-normalised, for the
    generic text-LLM case; the paper's crop tool and visual tokens are not included.
    """
    ids = span_ids_of(batch, completion_mask, span_mark)
    names = _reward_names(batch, reward_matrix)
    cols = list(span_reward_columns)
    out = torch.zeros(ids.shape, dtype=rewards.dtype)
    alive = completion_mask > 0
    for s in torch.unique(ids[alive]).tolist():
        spec = str(cols[s]).strip() if s < len(cols) else ""
        r = rewards if spec == "" else reward_column(reward_matrix, names, spec)
        adv = group_zscore(r, group_ids, advantage_epsilon=advantage_epsilon)
        in_s = alive & (ids == s)
        out = torch.where(in_s, adv[:, None].to(out.dtype).expand_as(out), out)
    return out
