"""Budget-aware samplers: completions per prompt, per-prompt temperature, model-derived orderings.

Besides ``next`` / ``feedback`` / ``state_dict`` / ``load_state_dict`` (see
``grpolab.prompts``), a sampler here may define

* ``budgets(idx) -> list[int]``: completions for each chosen prompt (ragged
  groups; the trainer hands them to the rollout strategy as ``budgets``);
* ``temperatures(idx) -> list[float]``: one sampling temperature per prompt;
* ``attach(ctx)``: called once after the model is loaded (reads the model).

``budgets`` and ``temperatures`` are deterministic functions of the sampler's
state (no random draws), so the trainer may call them in any order. All
randomness comes from the sampler's own ``torch.Generator``, whose state is part
of ``state_dict``: a resumed sampler makes exactly the choices of an
uninterrupted one.

Success rule (all samplers here, as in ``prompts/adaptive.py``): a completion
succeeds when its combined scalar reward is ``>= success_threshold`` (the one
core key of every component that counts successes; no paper here sets its own);
NaN rewards are ignored (:func:`~grpolab.prompts.adaptive.prompt_outcomes`).

AR3PO's staged generation and response reuse (the ``ar3po`` rollout strategy)
is in ``rollouts/ar3po.py``; it takes its parameters from here.
"""
from __future__ import annotations

import heapq
import math

import torch

from ..data import tokenize_prompts
from ..errors import ConfigError, warn_fallback
from ..model.hf import model_device
from ..registry import SAMPLERS
from .uniform import UniformSampler, require_rows
from .adaptive import PromptGDROSampler, _check_rows, _take_without_replacement, prompt_outcomes
from ..registry import param

AR3PO_STAGE_SIZE = param(4, 'AR3PO: completions per prompt per generation stage')
AR3PO_MAX_STAGES = param(2, 'AR3PO: generation stages (a prompt stops once it has a correct response)')


# ----------------------------------------------------------------------------- shared helpers

class _EpochOrderSampler:
    """Prompts in an epoch-wise shuffled pass (as ``uniform``); subclasses add budgets or temperatures."""

    def __init__(self, num_rows: int, seed: int):
        self.order = UniformSampler(num_rows, seed)
        self.num_rows = num_rows

    def next(self, k: int) -> list[int]:
        return self.order.next(k)

    def state_dict(self) -> dict:
        return {"order": self.order.state_dict(), "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        _check_rows(state, self.num_rows)
        self.order.load_state_dict(state["order"])


def _check_range(cfg, lo_key: str, hi_key: str) -> None:
    lo, hi = getattr(cfg, lo_key), getattr(cfg, hi_key)
    if not 1 <= lo <= cfg.num_generations <= hi:
        raise ConfigError(f"{lo_key} <= num_generations <= {hi_key} is needed (the mean budget is "
                          f"num_generations), got {lo} <= {cfg.num_generations} <= {hi}")


def round_allocation(x: list[float], total: int, lo: int, hi: int) -> list[int]:
    """Integers ``n_i`` in ``[lo, hi]`` with ``sum n_i = total`` closest to the reals ``x`` (already in range).

    Floors first, then one more to the largest fractional parts (ties: the
    earlier prompt), as in largest-remainder apportionment.
    """
    n = [min(hi, max(lo, math.floor(v + 1e-9))) for v in x]
    order = sorted(range(len(x)), key=lambda i: (-(x[i] - n[i]), i))
    left = total - sum(n)
    for i in order * max(1, hi - lo):
        if left <= 0:
            break
        if n[i] < hi:
            n[i] += 1
            left -= 1
    return n


# ----------------------------------------------------------------------------- Knapsack RL (000-67)

def knapsack_value(n: int, p: float) -> float:
    """Knapsack RL's value of giving a prompt with success rate ``p`` ``n`` rollouts.

    ``Value(n, p) = ProbNonZeroGradient(n, p) * InfoGain(p)`` with
    ``ProbNonZeroGradient = 1 - p^n - (1-p)^n`` (the group has both outcomes)
    and ``InfoGain(p) = p (1-p)^2`` (the paper's approximation of the increase
    in success probability one gradient step brings).
    """
    return (1.0 - p ** n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def knapsack_allocate(success: list[float], total: int, lo: int, hi: int) -> list[int]:
    """Budgets maximising ``sum_i Value(n_i, p_i)`` s.t. ``sum n_i = total``, ``lo <= n_i <= hi``.

    Every prompt starts at ``lo``; each further rollout goes to the prompt with
    the largest marginal value ``Value(n+1, p) - Value(n, p) = InfoGain(p) *
    (p^n (1-p) + (1-p)^n p)`` (ties: the earlier prompt). The marginal value
    falls with ``n``, so this greedy is the exact optimum of the knapsack (a
    separable concave allocation; the paper solves the same problem by dynamic
    programming). If ``total < len * lo`` every prompt gets ``lo``.
    """
    n = [lo] * len(success)
    heap = [(-(knapsack_value(lo + 1, p) - knapsack_value(lo, p)), i) for i, p in enumerate(success) if lo < hi]
    heapq.heapify(heap)
    left = total - lo * len(success)
    while left > 0 and heap:
        _, i = heapq.heappop(heap)
        n[i] += 1
        left -= 1
        if n[i] < hi:
            p = success[i]
            heapq.heappush(heap, (-(knapsack_value(n[i] + 1, p) - knapsack_value(n[i], p)), i))
    return n


def _check_knapsack(cfg) -> None:
    _check_range(cfg, "knapsack_min_generations", "knapsack_max_generations")


@SAMPLERS.register("knapsack", check=_check_knapsack)
class KnapsackSampler(_EpochOrderSampler):
    """Knapsack RL: per-prompt exploration budgets from a knapsack over the batch.

    Li et al. 2025, *Knapsack RL: Unlocking Exploration of LLMs via Optimizing
    Budget Allocation*, arXiv:2509.25849, seed 000-67.

    Prompts come in an epoch-wise shuffled pass (as ``uniform``). Each chosen
    prompt is an item whose exploration with ``n`` rollouts costs ``n`` and is
    worth ``Value(n, p) = (1 - p^n - (1-p)^n) * p (1-p)^2`` (the paper's value:
    probability of a non-zero GRPO gradient times its InfoGain approximation,
    see :func:`knapsack_value`). ``budgets(idx)`` solves the knapsack with the
    total budget ``len(idx) * num_generations`` (compute-neutral against
    uniform G) and per-prompt caps ``[knapsack_min_generations,
    knapsack_max_generations]`` (:func:`knapsack_allocate`).

    Success-rate estimate ``p``: from the prompt's last visit (the paper uses
    the rollouts of the previous epoch), smoothed ``p = (s + a p0) / (n + a)``
    with ``a = knapsack_smoothing`` pseudo-counts at ``p0 =
    knapsack_prior_success``; a prompt never rolled out has ``p = p0``.
    Choice: the smoothing is ours; without it an all-correct or all-wrong
    prompt has value 0 and always gets the minimum (the paper handles these
    with separate fallback rules).

    Provenance: paper equations — Knapsack RL (Li et al., 2025, arXiv:2509.25849), the task value (1 - p^N -
    (1-p)^N) p (1-p)^2 and the knapsack allocation under the total budget (equation numbers not recorded); the
    smoothing of p is grpolab's.
    """

    def __init__(self, num_rows: int, seed: int = 0, *, num_generations: int = 8,
                 knapsack_min_generations: int = param(2, 'Knapsack RL: fewest completions a prompt gets'),
                 knapsack_max_generations: int = param(16, 'Knapsack RL: most completions a prompt gets'),
                 knapsack_prior_success: float = param(0.5, 'Knapsack RL: success-rate estimate of a prompt never '
                                                       'rolled out'),
                 knapsack_smoothing: float = param(1.0, "Knapsack RL: pseudo-count pulling the last visit's success "
                                                   'rate towards knapsack_prior_success (0 = raw rate)'),
                 success_threshold: float = 1.0):
        super().__init__(num_rows, seed)
        if not 1 <= knapsack_min_generations <= knapsack_max_generations:
            raise ValueError("need 1 <= knapsack_min_generations <= knapsack_max_generations")
        if not 0.0 <= knapsack_prior_success <= 1.0 or knapsack_smoothing < 0:
            raise ValueError("need 0 <= knapsack_prior_success <= 1 and knapsack_smoothing >= 0")
        self.G = int(num_generations)
        self.lo, self.hi = int(knapsack_min_generations), int(knapsack_max_generations)
        self.p0, self.a = float(knapsack_prior_success), float(knapsack_smoothing)
        self.threshold = float(success_threshold)
        self.successes = torch.zeros(num_rows, dtype=torch.float64)
        self.trials = torch.zeros(num_rows, dtype=torch.float64)


    def success_rate(self) -> torch.Tensor:
        den = self.trials + self.a
        est = (self.successes + self.a * self.p0) / den.clamp_min(1e-12)
        return torch.where(den > 0, est, torch.full_like(est, self.p0))

    def budgets(self, idx: list[int]) -> list[int]:
        p = self.success_rate()
        return knapsack_allocate([float(p[i]) for i in idx], len(idx) * self.G, self.lo, self.hi)

    def feedback(self, prompt_uids, rewards, **outcomes) -> None:
        for uid, (s, n) in prompt_outcomes(prompt_uids, rewards, self.threshold).items():
            if n:
                self.successes[uid], self.trials[uid] = float(s), float(n)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "successes": self.successes.clone(), "trials": self.trials.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.successes, self.trials = state["successes"].clone(), state["trials"].clone()


# ----------------------------------------------------------------------------- AR3PO (000-70)

@SAMPLERS.register("ar3po")
class AR3POSampler(_EpochOrderSampler):
    """AR3PO's adaptive rollout budget: fewer responses for prompts solved last time.

    Zhang et al. 2025, *Improving Sampling Efficiency in RLVR through Adaptive
    Rollout and Response Reuse* (AR3PO), arXiv:2509.25808, seed 000-70.

    Prompts come in an epoch-wise shuffled pass. ``budgets(idx)`` caps each
    prompt's responses: a prompt whose last visit was all correct gets one
    stage (``ar3po_stage_size``); every other prompt (unseen, mixed, all wrong)
    gets ``ar3po_stage_size * ar3po_max_stages``. With the ``ar3po`` rollout
    strategy the cap bounds its staged generation (which stops a prompt as
    soon as it has a correct response, the paper's adaptive rollout); with the
    ``plain`` strategy the caps are the group sizes. Choice: the paper adapts
    within a step only (staged generation); carrying "solved last time" across
    steps as a cap is ours (it saves the second stage on easy prompts).

    Provenance: reconstructed from the abstract — carrying "solved last time" across steps as a cap on a
    prompt's responses is grpolab's; the paper adapts within a step (the ar3po rollout).
    """

    def __init__(self, num_rows: int, seed: int = 0, *,
                 ar3po_stage_size: int = AR3PO_STAGE_SIZE,
                 ar3po_max_stages: int = AR3PO_MAX_STAGES,
                 success_threshold: float = 1.0):
        super().__init__(num_rows, seed)
        if ar3po_stage_size < 1 or ar3po_max_stages < 1:
            raise ValueError("need ar3po_stage_size >= 1 and ar3po_max_stages >= 1")
        self.stage, self.stages = int(ar3po_stage_size), int(ar3po_max_stages)
        self.threshold = float(success_threshold)
        self.solved = torch.zeros(num_rows, dtype=torch.bool)  # last visit all correct

    def budgets(self, idx: list[int]) -> list[int]:
        return [self.stage if bool(self.solved[i]) else self.stage * self.stages for i in idx]

    def feedback(self, prompt_uids, rewards, **outcomes) -> None:
        for uid, (s, n) in prompt_outcomes(prompt_uids, rewards, self.threshold).items():
            if n:
                self.solved[uid] = s == n

    def state_dict(self) -> dict:
        return {**super().state_dict(), "solved": self.solved.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.solved = state["solved"].clone()


def angle_concentration(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean pairwise cosine similarity of each sequence's token hidden states.

    ``hidden [B, P, H]``, ``mask [B, P]`` (1 = real token). For sequence ``b``
    with real tokens ``1..L``: ``AC_b = (sum_{i != j} cos(h_i, h_j)) / (L (L-1))``
    (1 when ``L = 1``). The higher, the more the token vectors point the same
    way.
    """
    h = torch.nn.functional.normalize(hidden.float(), dim=-1) * mask[..., None].float()
    cos = h @ h.transpose(1, 2)
    L = mask.sum(-1).float()
    off = cos.sum((1, 2)) - torch.diagonal(cos, dim1=1, dim2=2).sum(-1)
    return torch.where(L > 1, off / (L * (L - 1)).clamp_min(1), torch.ones_like(L))


@torch.no_grad()
def prompt_angle_concentration(model, tokenizer, rows: list[dict], max_prompt_length: int,
                               batch_size: int = 32) -> torch.Tensor:
    """:func:`angle_concentration` of every row's prompt under ``model``'s last-layer hidden states."""
    was_training = model.training
    model.eval()
    dev = model_device(model)
    out = []
    for i in range(0, len(rows), batch_size):
        ids, mask = tokenize_prompts(tokenizer, [r["prompt"] for r in rows[i:i + batch_size]], max_prompt_length)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        res = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                    output_hidden_states=True, use_cache=False)
        out.append(angle_concentration(res.hidden_states[-1].float().cpu(), mask))
    model.train(was_training)
    return torch.cat(out).to(torch.float64)


@SAMPLERS.register("gain_rl", needs=("text",))
class GainRLSampler:
    """GAIN-RL: order data by angle concentration; sample a Gaussian window that advances with accuracy.

    Wang et al. 2025, *Angles Don't Lie: Unlocking Training-Efficient RL Through
    the Model's Own Signals* (GAIN-RL), arXiv:2506.02281, seed 004-08.

    * **Angle concentration.** ``attach(ctx)`` runs the policy once over every
      prompt and scores it with the mean pairwise cosine similarity of its
      last-layer token hidden states (:func:`angle_concentration`); with
      ``gain_rl_refresh_steps = N > 0`` the scores are recomputed with the
      current policy every N steps. Prompts are sorted by score, highest first
      (the model learns high-concentration data first).
    * **Gaussian window.** ``next(k)`` draws ``k`` distinct positions of the
      sorted list with probability ``∝ exp(-(r - mu)^2 / (2 sigma^2))``,
      ``sigma = gain_rl_sigma * N`` (N = data size), from the sampler's own
      generator (cycling when ``k > N``).
    * **Schedule.** Every ``gain_rl_update_steps`` steps the centre advances::

          mu <- min(N - 1, mu + gain_rl_max_shift * N *
                    clamp(0.5 tanh(2 (acc - 0.5)) + 0.5 tanh(2 ang), 0, 1))

      with ``acc`` the share of correct completions and ``ang`` the mean angle
      concentration of the prompts trained on since the last advance; ``mu``
      starts at 0. This is the authors' released schedule (``500 tanh(2(acc -
      0.5)) + 500 tanh(2 ang)`` clamped to ``[0, 1000]``, std 1000, on data
      sets of a few thousand prompts) with the constants as fractions of N.

    Choices: the authors' code reads the input of the last layer's MLP and adds
    8x the similarity between the question and a fixed 110-token system prompt;
    our prompts have no fixed template, so we use the plain mean pairwise
    cosine over all prompt tokens of the last hidden layer. Before ``attach``
    (no model) every score is 0 and the order is the data order.

    Provenance: reconstructed from the abstract — angle concentration as the mean pairwise cosine of last-layer
    token states and the Gaussian window with the tanh schedule of the authors' release (constants as fractions
    of N); the authors' code was not located in this pass, so this is not a checked port.
    """

    def __init__(self, num_rows: int, seed: int = 0, *, max_prompt_length: int = 512,
                 gain_rl_sigma: float = param(0.1, 'GAIN-RL: std of the Gaussian over sorted positions, as a '
                                              'fraction of the data set'),
                 gain_rl_max_shift: float = param(0.1, 'GAIN-RL: largest advance of the Gaussian centre per update, '
                                                  'as a fraction of the data set'),
                 gain_rl_update_steps: int = param(1, 'GAIN-RL: steps between advances of the Gaussian centre'),
                 gain_rl_refresh_steps: int = param(0, 'GAIN-RL: recompute angle concentration with the current '
                                                    'policy every N steps (0 = once, at the start)'),
                 gain_rl_batch_size: int = param(32, 'GAIN-RL: prompts per forward when computing angle concentration'),
                 success_threshold: float = 1.0):
        require_rows(num_rows)
        if gain_rl_sigma <= 0 or gain_rl_max_shift < 0 or gain_rl_update_steps < 1 or gain_rl_refresh_steps < 0:
            raise ValueError("need gain_rl_sigma > 0, gain_rl_max_shift >= 0, gain_rl_update_steps >= 1, "
                             "gain_rl_refresh_steps >= 0")
        self.num_rows = num_rows
        self.max_prompt_length = int(max_prompt_length)
        self.sigma, self.max_shift = float(gain_rl_sigma) * num_rows, float(gain_rl_max_shift) * num_rows
        self.update_steps, self.refresh_steps = int(gain_rl_update_steps), int(gain_rl_refresh_steps)
        self.batch_size, self.threshold = int(gain_rl_batch_size), float(success_threshold)
        self.generator = torch.Generator().manual_seed(seed)
        self.ctx = None
        self.set_scores(torch.zeros(num_rows, dtype=torch.float64))
        self.mu = 0.0
        self.steps = 0
        self.scored_at = 0
        self.acc_sum = self.acc_n = self.ang_sum = self.ang_n = 0.0

    def set_scores(self, scores: torch.Tensor) -> None:
        self.scores = scores.to(torch.float64).clone()
        self.order = torch.sort(-self.scores, stable=True).indices  # position r -> prompt uid

    def attach(self, ctx) -> None:
        self.ctx = ctx
        self.refresh()

    def refresh(self) -> None:
        self.set_scores(prompt_angle_concentration(self.ctx.policy, self.ctx.tokenizer, self.ctx.rows,
                                                   self.max_prompt_length, self.batch_size))
        self.scored_at = self.steps

    def probabilities(self) -> torch.Tensor:
        r = torch.arange(self.num_rows, dtype=torch.float64)
        w = torch.exp(-0.5 * ((r - self.mu) / self.sigma) ** 2)
        return w / w.sum()

    def next(self, k: int) -> list[int]:
        if self.refresh_steps and self.ctx is not None and self.steps - self.scored_at >= self.refresh_steps:
            self.refresh()
        if self.ctx is None:
            warn_fallback("gain_rl", "the model's angle-concentration scores (attach(ctx) was not called)",
                          "score 0 for every prompt (the data order)")
        p = self.probabilities()
        out: list[int] = []
        while len(out) < k:
            take = min(k - len(out), self.num_rows)
            pos = torch.multinomial(p, take, replacement=False, generator=self.generator)
            out.extend(self.order[pos].tolist())
        return out

    def shift(self, acc: float, ang: float) -> float:
        s = 0.5 * math.tanh(2.0 * (acc - 0.5)) + 0.5 * math.tanh(2.0 * ang)
        return self.max_shift * min(1.0, max(0.0, s))

    def feedback(self, prompt_uids, rewards, **outcomes) -> None:
        for uid, (s, n) in prompt_outcomes(prompt_uids, rewards, self.threshold).items():
            if n:
                self.acc_sum += s
                self.acc_n += n
                self.ang_sum += float(self.scores[uid])
                self.ang_n += 1
        self.steps += 1
        if self.steps % self.update_steps == 0 and self.acc_n > 0:
            self.mu = min(self.num_rows - 1.0, self.mu + self.shift(self.acc_sum / self.acc_n,
                                                                    self.ang_sum / self.ang_n))
            self.acc_sum = self.acc_n = self.ang_sum = self.ang_n = 0.0

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "scores": self.scores.clone(), "mu": self.mu,
                "steps": self.steps, "scored_at": self.scored_at, "num_rows": self.num_rows,
                "acc": [self.acc_sum, self.acc_n, self.ang_sum, self.ang_n]}

    def load_state_dict(self, state: dict) -> None:
        _check_rows(state, self.num_rows)
        self.generator.set_state(state["generator"])
        self.set_scores(state["scores"])
        self.mu, self.steps, self.scored_at = float(state["mu"]), int(state["steps"]), int(state["scored_at"])
        self.acc_sum, self.acc_n, self.ang_sum, self.ang_n = state["acc"]


# ----------------------------------------------------------------------------- automatic groups (000-115, 000-57)

@SAMPLERS.register("auto_group")
class AutoGroupSampler:
    """Automatic grouping that maximises performance variance, with worst-group emphasis.

    Zheng et al. 2024, *Improving Generalization of Alignment with Human
    Preferences through Group Invariant Learning*, arXiv:2310.11971 (seed
    000-115, *"learn a consistent policy via RL across various data groups"*)
    and Ramesh et al. 2024, *Group Robust Preference Optimization in
    Reward-free RLHF*, arXiv:2405.20304 (seed 000-57) for the weights.

    * **Performance.** Each prompt keeps an EMA of its success rate,
      ``p <- ema p + (1 - ema) s/n`` per visit (``auto_group_prior_success``
      before any visit).
    * **Automatic groups.** Every ``auto_group_regroup_steps`` steps the
      prompts are sorted by ``p`` (ties: index) and cut into
      ``K = auto_group_num_groups`` contiguous groups of (nearly) equal size:
      group 0 holds the weakest prompts. For fixed group sizes the contiguous
      split of the sorted values is the partition with the largest variance of
      the group means (a swap argument), which is the paper's objective.
    * **Worst-group weights (exponentiated gradient, as GRPO-robust).** After
      every step, each group ``g`` that got rows has loss ``l_g`` = its error
      rate (share of failed completions) and ``w_g <- w_g exp(eta l_g)``,
      renormalised (``eta = auto_group_eta``): the worst-performing group
      gains weight. Groups are ranks (0 = weakest), so the weights keep their
      meaning across re-partitions.
    * **Sampling.** ``next(k)`` draws each slot's group from ``q = (1 - gamma)
      w + gamma / K`` and a prompt of that group uniformly (without
      replacement while the group lasts).

    * **Exploration space per group.** The regulariser ``auto_group_kl``
      (``algorithms/regularizers.py``) gives each group its own KL
      coefficient from this sampler's groups and success rates (hard groups
      a looser KL, easy ones a tighter one); :meth:`attach` binds it when
      both are selected.

    Choices: the partition rule (sorted equal-size split), the error-rate loss,
    the exploration mix and the constants are ours.

    Provenance: reconstructed from the abstract — sorted equal-size partition by EMA success rate, error-rate
    group loss, exponentiated-gradient worst-group weights with a uniform mix, and their constants are grpolab's
    choices.
    """

    def __init__(self, num_rows: int, seed: int = 0, *,
                 auto_group_num_groups: int = param(2, 'auto_group: number of automatic prompt groups'),
                 auto_group_eta: float = param(1.0, 'auto_group: exponentiated-gradient step size of the group '
                                               'weights'),
                 auto_group_gamma: float = param(0.1, 'auto_group: share of uniform exploration over groups'),
                 auto_group_ema: float = param(0.5, "auto_group: EMA factor of each prompt's success-rate estimate"),
                 auto_group_prior_success: float = param(0.5, 'auto_group: success-rate estimate of a prompt never '
                                                         'rolled out'),
                 auto_group_regroup_steps: int = param(1, 'auto_group: steps between re-partitions of the prompts'),
                 success_threshold: float = 1.0):
        require_rows(num_rows)
        if not 1 <= auto_group_num_groups <= num_rows:
            raise ValueError(f"auto_group_num_groups must be in [1, {num_rows}] (number of prompts)")
        if not 0 <= auto_group_gamma <= 1 or not 0 <= auto_group_ema < 1 or auto_group_regroup_steps < 1:
            raise ValueError("need 0 <= auto_group_gamma <= 1, 0 <= auto_group_ema < 1, "
                             "auto_group_regroup_steps >= 1")
        self.num_rows, self.K = num_rows, int(auto_group_num_groups)
        self.eta, self.gamma, self.ema = float(auto_group_eta), float(auto_group_gamma), float(auto_group_ema)
        self.regroup_steps, self.threshold = int(auto_group_regroup_steps), float(success_threshold)
        self.generator = torch.Generator().manual_seed(seed)
        self.success = torch.full((num_rows,), float(auto_group_prior_success), dtype=torch.float64)
        self.log_w = torch.zeros(self.K, dtype=torch.float64)
        self.steps = 0
        self.regroup()

    def regroup(self) -> None:
        order = torch.sort(self.success, stable=True).indices
        self.group = torch.empty(self.num_rows, dtype=torch.long)
        for g, chunk in enumerate(torch.tensor_split(order, self.K)):
            self.group[chunk] = g

    def weights(self) -> torch.Tensor:
        return torch.softmax(self.log_w, 0)

    def probabilities(self) -> torch.Tensor:
        return (1.0 - self.gamma) * self.weights() + self.gamma / self.K

    def attach(self, ctx) -> None:
        """Bind the ``auto_group_kl`` regulariser, when the run selects it, to these groups."""
        reg = getattr(ctx, "components", {}).get("loss/auto_group_kl")
        if reg is not None:
            reg.fn.bind(self)

    def row_groups(self, prompt_uids) -> torch.Tensor:
        """The current group (0 = weakest) of each prompt uid."""
        return self.group[torch.as_tensor(prompt_uids, dtype=torch.long)]

    def group_success(self) -> torch.Tensor:
        """Mean EMA success rate of each group's prompts, ``[K]`` (0 for an empty group)."""
        sums = torch.zeros(self.K, dtype=torch.float64).index_add_(0, self.group, self.success)
        return sums / self.group_sizes().clamp_min(1)

    def group_sizes(self) -> torch.Tensor:
        return torch.bincount(self.group, minlength=self.K).to(torch.float64)

    def next(self, k: int) -> list[int]:
        members = [(self.group == g).nonzero().flatten().tolist() for g in range(self.K)]
        slots = torch.multinomial(self.probabilities(), k, replacement=True, generator=self.generator)
        out: list[int] = []
        for g, c in enumerate(torch.bincount(slots, minlength=self.K).tolist()):
            if c:
                out.extend(_take_without_replacement(members[g], c, self.generator))
        return out

    def feedback(self, prompt_uids, rewards, **outcomes) -> None:
        err = torch.zeros(self.K, dtype=torch.float64)
        rows = torch.zeros(self.K, dtype=torch.float64)
        for uid, (s, n) in prompt_outcomes(prompt_uids, rewards, self.threshold).items():
            if n:
                g = int(self.group[uid])
                err[g] += n - s
                rows[g] += n
                self.success[uid] = self.ema * self.success[uid] + (1.0 - self.ema) * s / n
        self.log_w = self.log_w + self.eta * torch.where(rows > 0, err / rows.clamp_min(1), torch.zeros_like(err))
        self.log_w = self.log_w - self.log_w.max()
        self.steps += 1
        if self.steps % self.regroup_steps == 0:
            self.regroup()

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "success": self.success.clone(),
                "log_w": self.log_w.clone(), "group": self.group.clone(), "steps": self.steps,
                "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        _check_rows(state, self.num_rows)
        self.generator.set_state(state["generator"])
        self.success, self.log_w, self.group = state["success"].clone(), state["log_w"].clone(), state["group"].clone()
        self.steps = int(state["steps"])


# ----------------------------------------------------------------------------- ERPO (000-85)

def _check_erpo(cfg) -> None:
    if cfg.erpo_max_temperature < cfg.temperature:
        raise ConfigError(f"erpo_max_temperature ({cfg.erpo_max_temperature}) must be >= temperature "
                          f"({cfg.temperature})")


@SAMPLERS.register("erpo", check=_check_erpo)
class ERPOSampler(_EpochOrderSampler):
    """ERPO: raise the sampling temperature of residual (all-correct) prompts.

    Liu et al. 2025, *Explore Data Left Behind in Reinforcement Learning for
    Reasoning Language Models* (ERPO), arXiv:2511.04800, seed 000-85.

    Prompts come in an epoch-wise shuffled pass. A per-prompt history tracker
    counts residual visits: a visit whose scorable completions were all
    correct raises the prompt's level by one; a visit with mixed outcomes
    (variance returned) resets it to 0; an all-wrong visit leaves it as it is.
    ``temperatures(idx)`` gives each prompt
    ``T = min(erpo_max_temperature, temperature + erpo_temperature_step * level)``.

    The behaviour log-probs of a row are recorded at its own sampling
    temperature (``generation/sampling.py``), while the training forward uses
    ``cfg.temperature``. The importance ratio ``pi_theta(y; T_train) /
    pi_old(y; T_row)`` then corrects for sampling from the hotter policy (it
    is not 1 at the first pass; the clip bounds it, like any off-policy
    ratio), so the update still estimates the gradient of the policy at the
    training temperature.

    Provenance: reconstructed from the abstract — "maintains a history
    tracker for each prompt and adaptively increases the sampling temperature
    for residual prompts that previously produced all correct responses"; the
    linear step, the cap and the all-wrong rule are grpolab's choices, and
    whether the authors recompute old log-probs at the training temperature is
    not known. The authors' code (github.com/DawnLIU35/ERPO, named in the
    arXiv html v1) is not in the searched store (index, snapshot fetch).
    """

    def __init__(self, num_rows: int, seed: int = 0, *, temperature: float = 0.7,
                 erpo_temperature_step: float = param(0.1, 'ERPO: temperature added per residual (all-correct) visit'),
                 erpo_max_temperature: float = param(1.2, 'ERPO: highest per-prompt sampling temperature'),
                 success_threshold: float = 1.0):
        super().__init__(num_rows, seed)
        if erpo_temperature_step < 0 or erpo_max_temperature < temperature:
            raise ValueError("need erpo_temperature_step >= 0 and erpo_max_temperature >= temperature")
        self.base, self.step_size = float(temperature), float(erpo_temperature_step)
        self.max_t, self.threshold = float(erpo_max_temperature), float(success_threshold)
        self.level = torch.zeros(num_rows, dtype=torch.long)


    def temperatures(self, idx: list[int]) -> list[float]:
        return [min(self.max_t, self.base + self.step_size * int(self.level[i])) for i in idx]

    def feedback(self, prompt_uids, rewards, **outcomes) -> None:
        for uid, (s, n) in prompt_outcomes(prompt_uids, rewards, self.threshold).items():
            if n and s == n:
                self.level[uid] += 1
            elif 0 < s < n:
                self.level[uid] = 0

    def state_dict(self) -> dict:
        return {**super().state_dict(), "level": self.level.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.level = state["level"].clone()


# ----------------------------------------------------------------------------- Rollout-GDRO (000-28)

def sqrt_allocation(price: list[float], total: int, lo: int, hi: int) -> tuple[list[int], float]:
    """Square-root allocation ``n_i ∝ sqrt(q_i)`` with ``sum n_i = total`` and ``lo <= n_i <= hi``.

    Minimising the variance proxy ``sum_i q_i / n_i`` subject to ``sum_i n_i =
    total`` gives ``q_i / n_i^2 = mu`` (the shadow price of the budget), i.e.
    ``n_i = sqrt(q_i / mu)``. Prompts that hit a cap are fixed there and ``mu``
    is re-solved for the rest (water-filling); the reals are then rounded
    with :func:`round_allocation`. Returns ``(budgets, mu)``.
    """
    m = len(price)
    root = [math.sqrt(max(q, 0.0)) for q in price]
    fixed: dict[int, float] = {}
    scale = 0.0
    for _ in range(m + 1):
        free = [i for i in range(m) if i not in fixed]
        room = total - sum(fixed.values())
        mass = sum(root[i] for i in free)
        scale = room / mass if mass > 0 else 0.0
        over = [i for i in free if root[i] * scale > hi]
        under = [i for i in free if root[i] * scale < lo]
        if not over and not under:
            break
        for i in over:
            fixed[i] = hi
        if not over:
            for i in under:
                fixed[i] = lo
    x = [fixed.get(i, root[i] * scale) for i in range(m)]
    mu = 1.0 / scale ** 2 if scale > 0 else float("inf")
    return round_allocation(x, total, lo, hi), mu


def _check_rollout_gdro(cfg) -> None:
    _check_range(cfg, "rgdro_min_generations", "rgdro_max_generations")


@SAMPLERS.register("rollout_gdro", check=_check_rollout_gdro)
class RolloutGDROSampler(_EpochOrderSampler):
    """Rollout-GDRO: shadow-price allocation of rollouts across pass@k difficulty bins.

    Panaganti et al. 2026, *Group Distributionally Robust Optimization-Driven
    Reinforcement Learning for LLM Reasoning*, arXiv:2601.19280, seed 000-28.

    * **Bins.** Prompt-GDRO's online difficulty classifier, reused as is
      (:class:`~grpolab.prompts.adaptive.PromptGDROSampler`: moving pass@k of
      each prompt over ``rgdro_window`` visits, binned by ``rgdro_bin_edges``;
      its bias-corrected EMA of each bin's error rate ``e_b``, factor
      ``rgdro_ema``).
    * **Price.** Bin ``b``'s variance proxy is the Bernoulli variance of its
      rows, ``q_b = max(e_b (1 - e_b), rgdro_min_variance)`` (0.25 before the
      bin has data).
    * **Allocation.** Prompts come in an epoch-wise shuffled pass (Rollout-GDRO
      is the compute adversary only; the two games are independent).
      ``budgets(idx)`` minimises ``sum_i q_{b(i)} / n_i`` under the fixed total
      ``len(idx) * num_generations`` and caps ``[rgdro_min_generations,
      rgdro_max_generations]``: the square-root rule ``n_i = sqrt(q_i / mu)``
      with shadow price ``mu`` (:func:`sqrt_allocation`).

    Choice: the paper's controller moves ``mu`` by online dual steps, which
    meets the mean budget on average; since the batch's bins are known before
    generation we solve for ``mu`` each step (the controller's fixed point),
    so every step uses exactly the uniform-G compute. ``mu`` is kept as
    ``self.shadow_price``.

    Provenance: reconstructed from the abstract — Bernoulli-variance prices per bin and the square-root
    allocation solved for the shadow price each step (the fixed point of the paper's dual controller); constants
    are grpolab's.
    """

    def __init__(self, num_rows: int, seed: int = 0, *, num_generations: int = 8,
                 rgdro_bin_edges: list | None = param([0.25, 0.5, 0.75], 'Rollout-GDRO: ascending pass@k bin edges '
                                                      'in (0, 1)'),
                 rgdro_window: int = param(4, "Rollout-GDRO: pass@k is the mean of a prompt's last N any-success "
                                           'flags'),
                 rgdro_ema: float = param(0.9, "Rollout-GDRO: EMA factor of each bin's error rate (bias-corrected)"),
                 rgdro_min_generations: int = param(2, 'Rollout-GDRO: fewest completions a prompt gets'),
                 rgdro_max_generations: int = param(16, 'Rollout-GDRO: most completions a prompt gets'),
                 rgdro_min_variance: float = param(0.01, "Rollout-GDRO: floor of a bin's variance proxy e(1-e)"),
                 success_threshold: float = 1.0):
        super().__init__(num_rows, seed)
        if not 1 <= rgdro_min_generations <= rgdro_max_generations:
            raise ValueError("need 1 <= rgdro_min_generations <= rgdro_max_generations")
        self.classifier = PromptGDROSampler(num_rows, seed, gdro_bin_edges=rgdro_bin_edges, gdro_window=rgdro_window,
                                            gdro_ema=rgdro_ema, success_threshold=success_threshold)
        self.G, self.lo, self.hi = int(num_generations), int(rgdro_min_generations), int(rgdro_max_generations)
        self.min_var = float(rgdro_min_variance)
        self.shadow_price = float("nan")


    def prices(self) -> torch.Tensor:
        e = self.classifier.debiased_loss()
        q = (e * (1.0 - e)).clamp_min(self.min_var)
        return torch.where(self.classifier.n > 0, q, torch.full_like(q, 0.25))

    def budgets(self, idx: list[int]) -> list[int]:
        bins, q = self.classifier.bins(), self.prices()
        out, self.shadow_price = sqrt_allocation([float(q[bins[i]]) for i in idx], len(idx) * self.G,
                                                 self.lo, self.hi)
        return out

    def feedback(self, **outcomes) -> None:
        self.classifier.feedback(**outcomes)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "classifier": self.classifier.state_dict(),
                "shadow_price": self.shadow_price}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.classifier.load_state_dict(state["classifier"])
        self.shadow_price = float(state["shadow_price"])


__all__ = ["knapsack_value", "knapsack_allocate", "round_allocation", "sqrt_allocation", "angle_concentration",
           "prompt_angle_concentration", "KnapsackSampler", "AR3POSampler", "GainRLSampler",
           "AutoGroupSampler", "ERPOSampler", "RolloutGDROSampler"]
