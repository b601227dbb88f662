"""Adaptive prompt samplers: difficulty- and variance-aware prompt selection.

Every sampler here follows the interface of ``grpolab.prompts`` (``next``,
``feedback``, ``state_dict`` / ``load_state_dict``) and draws all randomness
from its own ``torch.Generator``, whose state is part of ``state_dict``, so a
resumed sampler makes exactly the choices an uninterrupted one makes.

Shared choice (all four samplers): a completion is a *success* when its
combined scalar reward is ``>= success_threshold`` (the core key shared by every
component that counts successes; no paper here sets its own; default 1.0, i.e.
"fully correct" for 0/1 accuracy rewards and for fractional rewards in
[0, 1]; a format bonus alone does not count). NaN rewards (unscorable) are
neither successes nor failures: they are ignored. The per-prompt counts come
from :func:`prompt_outcomes`, the one place this rule lives.
"""
from __future__ import annotations

import warnings

import torch

from ..errors import ConfigError, warn_fallback
from ..registry import SAMPLERS
from .uniform import require_rows
from ..registry import param


# ----------------------------------------------------------------------------- shared helpers

def prompt_outcomes(prompt_uids, rewards, threshold: float) -> dict[int, tuple[int, int]]:
    """Per prompt: ``(successes, valid completions)`` from one step's rows.

    ``success = reward >= threshold``; rows with a NaN reward are not counted.
    """
    uids = torch.as_tensor(prompt_uids).reshape(-1).tolist()
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    valid = ~torch.isnan(r)
    succ = (r >= threshold) & valid
    out: dict[int, list[int]] = {}
    for u, s, v in zip(uids, succ.tolist(), valid.tolist()):
        acc = out.setdefault(int(u), [0, 0])
        acc[0] += int(s)
        acc[1] += int(v)
    return {u: (s, n) for u, (s, n) in out.items()}


def _fork_seed(generator: torch.Generator) -> int:
    """A seed drawn from ``generator`` (for samplers torch offers only on the global RNG)."""
    return int(torch.randint(0, 2 ** 62, (1,), generator=generator).item())


def _take_without_replacement(pool: list[int], k: int, generator: torch.Generator) -> list[int]:
    """``k`` items of ``pool`` in random order; cycles through fresh permutations when ``k > len(pool)``."""
    out: list[int] = []
    while len(out) < k:
        perm = torch.randperm(len(pool), generator=generator).tolist()
        out.extend(pool[i] for i in perm[:k - len(out)])
    return out


def _check_rows(state: dict, num_rows: int) -> None:
    if state["num_rows"] != num_rows:
        raise ValueError(f"sampler state is for {state['num_rows']} rows, the data has {num_rows}")


# ----------------------------------------------------------------------------- VADE (000-06)

@SAMPLERS.register("vade")
class VADESampler:
    """VADE: Beta posteriors, information-gain Thompson sampling, two-scale prior decay.

    *VADE: Variance-Aware Dynamic Sampling via Online Sample-Level Difficulty
    Estimation for Multimodal RL* (2025), arXiv:2511.18902, seed 000-06.

    * **Posterior.** Prompt ``i`` has ``p_i ~ Beta(a_i, b_i)``, starting at the
      prior ``(a0, b0)``. After a step in which it got ``s_i`` successes out of
      ``n_i`` scorable completions: ``a_i += s_i``, ``b_i += n_i - s_i``
      (success rule: module docstring).
    * **Thompson selection.** ``next(k)`` draws ``p~_i ~ Beta(a_i, b_i)`` for every
      prompt and returns the ``k`` prompts with the largest information gain
      ``IG_i = p~_i (1 - p~_i)`` (the Bernoulli reward variance, largest at
      1/2: the prompts most likely to give a group with non-zero variance).
    * **Two-scale prior decay.** The evidence above the prior is discounted
      so the estimate tracks the moving policy::

          slow (every step, all prompts):   a <- a0 + rho_step  * (a - a0)
          fast (a prompt that gets new
                evidence, before adding it): a <- a0 + rho_visit * (a - a0)

      (the same for ``b``). With ``rho_step = vade_step_decay`` close to 1 an
      unvisited prompt's posterior drifts slowly back to the prior (its
      uncertainty grows again, so it gets re-explored); with ``rho_visit =
      vade_visit_decay`` the fresh rollouts of a revisited prompt outweigh its
      stale history. The abstract names the two-scale decay but not its form;
      this exponential-forgetting form (discounted Thompson sampling on the
      pseudo-counts, preserving the posterior mean) is our choice.

    The Beta draw uses torch's Beta sampler under a forked global RNG seeded
    from the sampler's own generator, so it is exact under checkpoint/restore
    and leaves the global RNG untouched.

    Provenance: reconstructed from the abstract — the abstract names Beta
    posteriors, a Thompson sampler maximising information gain and a
    two-scale prior decay; ``IG = p(1 - p)``, the exponential-forgetting form
    of the decay, its two rates and the hard top-k selection are grpolab's
    choices. Searched: the code index and snapshots (the paper points to the
    project page VADE-RL.github.io; no repository found), the stored paper
    pages (arXiv html v1, sciencestack: abstract and introduction only).
    """

    def __init__(self, num_rows: int, seed: int = 0, *,
                 vade_prior_alpha: float = param(1.0, "VADE: Beta prior alpha0 of every prompt's success probability"),
                 vade_prior_beta: float = param(1.0, "VADE: Beta prior beta0 of every prompt's success probability"),
                 vade_step_decay: float = param(0.99, 'VADE: slow decay, every step a <- a0 + rho (a - a0) for all '
                                                'prompts'),
                 vade_visit_decay: float = param(0.5, "VADE: fast decay of a revisited prompt's old evidence before "
                                                 'the new'),
                 success_threshold: float = 1.0):
        require_rows(num_rows)
        if vade_prior_alpha <= 0 or vade_prior_beta <= 0:
            raise ValueError("vade_prior_alpha and vade_prior_beta must be > 0")
        for name, v in (("vade_step_decay", vade_step_decay), ("vade_visit_decay", vade_visit_decay)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        self.num_rows = num_rows
        self.a0, self.b0 = float(vade_prior_alpha), float(vade_prior_beta)
        self.step_decay, self.visit_decay = float(vade_step_decay), float(vade_visit_decay)
        self.threshold = float(success_threshold)
        self.generator = torch.Generator().manual_seed(seed)
        self.alpha = torch.full((num_rows,), self.a0, dtype=torch.float64)
        self.beta = torch.full((num_rows,), self.b0, dtype=torch.float64)

    def information_gain(self, p: torch.Tensor) -> torch.Tensor:
        return p * (1.0 - p)

    def draw(self) -> torch.Tensor:
        """One Thompson draw ``p~ ~ Beta(alpha, beta)`` for every prompt."""
        seed = _fork_seed(self.generator)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return torch.distributions.Beta(self.alpha, self.beta).sample()

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            ig = self.information_gain(self.draw())
            take = min(k - len(out), self.num_rows)
            out.extend(torch.topk(ig, take).indices.tolist())
        return out

    def _decay(self, idx=None, rho: float = 1.0) -> None:
        sl = slice(None) if idx is None else idx
        self.alpha[sl] = self.a0 + rho * (self.alpha[sl] - self.a0)
        self.beta[sl] = self.b0 + rho * (self.beta[sl] - self.b0)

    def feedback(self, prompt_uids, rewards, **outcomes) -> None:
        self._decay(None, self.step_decay)
        for uid, (s, n) in prompt_outcomes(prompt_uids, rewards, self.threshold).items():
            if n == 0:
                continue
            self._decay([uid], self.visit_decay)
            self.alpha[uid] += s
            self.beta[uid] += n - s

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "alpha": self.alpha.clone(),
                "beta": self.beta.clone(), "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        _check_rows(state, self.num_rows)
        self.generator.set_state(state["generator"])
        self.alpha = state["alpha"].clone().to(torch.float64)
        self.beta = state["beta"].clone().to(torch.float64)


# ----------------------------------------------------------------------------- VAS (000-26)

def trajectory_diversity(ids: torch.Tensor, lengths) -> float:
    """Self-BLEU-style diversity of one group's completions (bigram version).

    ``TDS = 1 - mean_i |bigrams(y_i) ∩ ∪_{j≠i} bigrams(y_j)| / |bigrams(y_i)|``:
    the mean fraction of a completion's distinct token bigrams found in no
    other completion of the group (completions shorter than 2 tokens count as
    their single token). 0 when all completions are identical.
    """
    seqs = [tuple(ids[i, :int(lengths[i])].tolist()) for i in range(ids.shape[0])]
    grams = [set(zip(s, s[1:])) if len(s) >= 2 else {s} for s in seqs]
    if len(grams) < 2:
        return 0.0
    overlaps = []
    for i, g in enumerate(grams):
        if not g:
            continue
        others = set().union(*(grams[j] for j in range(len(grams)) if j != i))
        overlaps.append(len(g & others) / len(g))
    return 1.0 - sum(overlaps) / len(overlaps) if overlaps else 0.0


@SAMPLERS.register("vas", needs=("tokens",))
class VASSampler:
    """VAS (Variance-Aware Sampling) with the Variance Promotion Score, MMR1.

    Leng et al. 2025, *MMR1: Enhancing Multimodal Reasoning with Variance-Aware
    Sampling and Open Resources*, arXiv:2509.21268, seed 000-26.

    Per prompt, from its latest group of rollouts::

        OVS = p (1 - p)                       p = pass rate (success rule: module docstring)
        TDS = trajectory_diversity(group)     self-BLEU-style bigram diversity in [0, 1]
        VPS = vas_ovs_weight * OVS + vas_tds_weight * TDS

    ``next(k)`` draws ``round(vas_mix * k)`` prompts without replacement with
    probability proportional to ``VPS`` (plus a floor ``vas_min_score`` so no
    prompt is starved) and the rest uniformly from the remaining prompts. The
    sampling weights are a snapshot of the VPS table refreshed every
    ``vas_update_interval`` steps (the paper's T_update); prompts never rolled
    out score ``vas_init_score`` (default 0.25, the largest OVS: unseen prompts
    are explored first; the paper instead scores the whole set with an initial
    rollout pass).

    Choices: the paper's TDS is an inverse self-BLEU over the reasoning texts;
    here it is computed from completion token ids (bigram overlap), when the
    trainer passes ``completion_ids`` to ``feedback``. Without them TDS is 0
    and VPS reduces to the outcome variance. Default weights 1 / 1 on OVS /
    TDS and mix 0.5 are our choices.

    Provenance: paper equations — MMR1 (Leng et al., 2025, arXiv:2509.21268), the Variance Promotion Score VPS =
    w1 OVS + w2 TDS with OVS = p (1 - p) and the VPS-proportional / uniform mix refreshed every T_update steps
    (equation numbers not recorded); TDS from token bigrams and the weights are grpolab's.
    """

    def __init__(self, num_rows: int, seed: int = 0, *,
                 vas_ovs_weight: float = param(1.0, 'VAS: weight of the outcome variance p(1-p) in the VPS'),
                 vas_tds_weight: float = param(1.0, 'VAS: weight of the trajectory diversity score in the VPS'),
                 vas_mix: float = param(0.5, 'VAS: fraction of each batch drawn by VPS (the rest uniformly)'),
                 vas_update_interval: int = param(1, 'VAS: steps between refreshes of the VPS sampling weights'),
                 vas_init_score: float = param(0.25, 'VAS: VPS of prompts never rolled out'),
                 vas_min_score: float = param(0.001, 'VAS: floor added to every VPS weight'),
                 success_threshold: float = 1.0):
        require_rows(num_rows)
        if not 0.0 <= vas_mix <= 1.0:
            raise ValueError(f"vas_mix must be in [0, 1], got {vas_mix}")
        if vas_update_interval < 1:
            raise ValueError("vas_update_interval must be >= 1")
        if vas_min_score <= 0:
            raise ValueError("vas_min_score must be > 0")
        self.num_rows = num_rows
        self.w_ovs, self.w_tds = float(vas_ovs_weight), float(vas_tds_weight)
        self.mix, self.interval = float(vas_mix), int(vas_update_interval)
        self.min_score, self.threshold = float(vas_min_score), float(success_threshold)
        self.generator = torch.Generator().manual_seed(seed)
        self.vps = torch.full((num_rows,), float(vas_init_score), dtype=torch.float64)
        self.weights = self.vps.clone()
        self.updates = 0

    def score(self, successes: int, valid: int, tds: float = 0.0) -> float:
        p = successes / valid
        return self.w_ovs * p * (1.0 - p) + self.w_tds * tds

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            take = min(k - len(out), self.num_rows)
            n_w = int(round(self.mix * take))
            w = self.weights.clamp_min(0.0) + self.min_score
            chosen = torch.multinomial(w, n_w, replacement=False, generator=self.generator).tolist() if n_w else []
            picked = set(chosen)
            rest = [i for i in range(self.num_rows) if i not in picked]
            chosen += _take_without_replacement(rest, take - n_w, self.generator) if take > n_w else []
            out.extend(chosen)
        return out

    def feedback(self, prompt_uids, rewards, completion_ids=None, lengths=None, **outcomes) -> None:
        uids = torch.as_tensor(prompt_uids).reshape(-1)
        if self.w_tds != 0 and (completion_ids is None or lengths is None):
            warn_fallback("vas", "completion_ids / lengths in feedback (the trajectory diversity score's input)",
                          "TDS = 0 (the VPS reduces to the outcome variance)")
        for uid, (s, n) in prompt_outcomes(uids, rewards, self.threshold).items():
            if n == 0:
                continue
            tds = 0.0
            if completion_ids is not None and lengths is not None:
                rows = (uids == uid).nonzero().flatten()
                tds = trajectory_diversity(completion_ids[rows], torch.as_tensor(lengths)[rows])
            self.vps[uid] = self.score(s, n, tds)
        self.updates += 1
        if self.updates % self.interval == 0:
            self.weights = self.vps.clone()

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "vps": self.vps.clone(),
                "weights": self.weights.clone(), "updates": self.updates, "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        _check_rows(state, self.num_rows)
        self.generator.set_state(state["generator"])
        self.vps, self.weights = state["vps"].clone(), state["weights"].clone()
        self.updates = int(state["updates"])


# ----------------------------------------------------------------------------- SRPO (000-50)

SRPO_DROP_PERMANENTLY = param(False, 'SRPO: never resample a prompt once all its rollouts were correct')


@SAMPLERS.register("srpo_history")
class SRPOHistorySampler:
    """SRPO History Resampling: skip prompts whose rollouts were all correct last epoch.

    Kwaipilot team (Zhang et al.) 2025, *SRPO: A Cross-Domain Implementation
    of Large-Scale Reasoning Model Reinforcement Learning*, arXiv:2504.14286,
    seed 000-50. (The recipe ``srpo_history`` also drops the KL term and uses
    the token-level loss, as the paper's training setup.)

    An epoch-wise shuffled pass like ``uniform``, with a per-prompt history:
    a prompt whose scorable completions in epoch ``e`` were *all* successes
    (success rule: module docstring) is skipped in epoch ``e + 1``; prompts with
    mixed outcomes and all-wrong prompts (hard, possibly informative later) are
    kept, as in the paper. The skipped prompt comes back in epoch ``e + 2`` (it
    was not observed as solved in ``e + 1``) unless ``srpo_drop_permanently``,
    in which case it stays out until the end of training. The history is
    checked when a prompt's turn comes in the pass (so the feedback of the
    previous epoch's last batch is already there). A prompt whose completions
    are all unscorable (NaN) is not "all correct". If at the start of a pass
    every prompt would be skipped, the history is cleared with a warning
    (resample all).

    The paper's two-stage cross-domain schedule (math first, then code) is
    the subclass ``srpo_two_stage`` below.

    Provenance: reconstructed from the abstract — history resampling as
    described in the paper's text: all-correct prompts of an epoch are skipped
    in the next; the return after one skipped epoch, the all-unscorable rule
    and the reset when every prompt would be skipped are grpolab's choices.
    Searched: the code index and GitHub issues (SRPO / history resampling /
    Kwaipilot: no authors' code found).
    """

    def __init__(self, num_rows: int, seed: int = 0, *,
                 srpo_drop_permanently: bool = SRPO_DROP_PERMANENTLY,
                 success_threshold: float = 1.0):
        require_rows(num_rows)
        self.num_rows = num_rows
        self.threshold, self.permanent = float(success_threshold), bool(srpo_drop_permanently)
        self.generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.position = 0
        self.epoch = 0
        self.sampled_epoch = [-1] * num_rows   # epoch in which the prompt was last drawn
        self.solved_epoch = [-1] * num_rows    # epoch in which its rollouts were all correct (-1: not)
        self.skipped = 0                       # prompts skipped so far (a metric)

    def pool(self) -> list[int]:
        """The rows a pass draws from (all of them here; ``srpo_two_stage`` narrows it in stage 1)."""
        return list(range(self.num_rows))

    def is_skipped(self, uid: int) -> bool:
        e = self.solved_epoch[uid]
        return e >= 0 and (self.permanent or e == self.epoch - 1)

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.position >= len(self.order):
                pool = self.pool()
                self.order = [pool[i] for i in torch.randperm(len(pool), generator=self.generator).tolist()]
                self.position = 0
                self.epoch += 1
                if all(self.is_skipped(u) for u in pool):
                    warnings.warn("srpo_history: every prompt was solved in its last epoch; "
                                  "clearing the history and resampling all prompts")
                    self.solved_epoch = [-1] * self.num_rows
            uid = self.order[self.position]
            self.position += 1
            if self.is_skipped(uid):
                self.skipped += 1
                continue
            self.sampled_epoch[uid] = self.epoch
            out.append(uid)
        return out

    def feedback(self, prompt_uids, rewards, **outcomes) -> None:
        for uid, (s, n) in prompt_outcomes(prompt_uids, rewards, self.threshold).items():
            self.solved_epoch[uid] = self.sampled_epoch[uid] if (n > 0 and s == n) else -1

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "order": list(self.order),
                "position": self.position, "epoch": self.epoch, "num_rows": self.num_rows,
                "sampled_epoch": list(self.sampled_epoch), "solved_epoch": list(self.solved_epoch),
                "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        _check_rows(state, self.num_rows)
        self.generator.set_state(state["generator"])
        self.order, self.position, self.epoch = list(state["order"]), state["position"], state["epoch"]
        self.sampled_epoch, self.solved_epoch = list(state["sampled_epoch"]), list(state["solved_epoch"])
        self.skipped = state["skipped"]


@SAMPLERS.register("srpo_two_stage")
class SRPOTwoStageSampler(SRPOHistorySampler):
    """SRPO two-stage cross-domain schedule, with History Resampling (``srpo_history``) in both stages.

    Kwaipilot team (Zhang et al.) 2025, *SRPO: A Cross-Domain Implementation
    of Large-Scale Reasoning Model Reinforcement Learning*, arXiv:2504.14286,
    seed 000-50: stage 1 trains on math only, stage 2 adds the code data.

    Each data row names its domain in the column ``srpo_task_column``
    (default ``task``). With ``S = srpo_stage2_step``:

    * **stage 1** (training steps ``0 .. S-1``): the epoch-wise passes of
      ``srpo_history`` draw only the rows whose domain is in
      ``srpo_stage1_tasks``;
    * **stage 2** (steps ``>= S``): every row is drawable. At the first
      ``next`` call of stage 2 the current stage-1 pass is abandoned and a new
      pass (a new epoch) over all rows starts, so the second domain's rows
      join at once.

    The step is the one the trainer reports to ``feedback`` (0-based): after
    the feedback of step ``s`` the sampler is at step ``s + 1``; before any
    feedback at step 0 (a step that ends without feedback is not counted).
    History Resampling runs unchanged over the current pool: a prompt all of
    whose rollouts were correct in epoch ``e`` is skipped in ``e + 1``, also
    across the stage boundary. ``S = 0`` is single-stage ``srpo_history``
    over all rows. The stage, the step and the pass are in ``state_dict``.

    Provenance: reconstructed from the abstract — the abstract names the
    two stages (math, then math + code); the switch at a fixed training
    step, the abandoned pass at the switch and the domain column are
    grpolab's choices (the paper's stage lengths are not in the abstract).
    Searched: the code index and GitHub issues (SRPO / Kwaipilot / two-stage:
    no authors' code found).
    Test: tests/test_srpo_two_stage.py::test_stage1_draws_only_stage1_rows_then_all.
    """

    def __init__(self, num_rows: int, seed: int = 0, rows: list[dict] | None = None, *,
                 srpo_stage2_step: int = param(10, 'SRPO two-stage: first training step (0-based) of stage 2, '
                                               'when every domain becomes drawable'),
                 srpo_stage1_tasks: list = param(['multistep'], 'SRPO two-stage: the domains (values of the '
                                                 'task column) drawable in stage 1'),
                 srpo_task_column: str = param('task', 'SRPO two-stage: data column naming each row\'s domain'),
                 srpo_drop_permanently: bool = SRPO_DROP_PERMANENTLY,
                 success_threshold: float = 1.0):
        super().__init__(num_rows, seed, srpo_drop_permanently=srpo_drop_permanently,
                         success_threshold=success_threshold)
        if srpo_stage2_step < 0:
            raise ConfigError(f"srpo_stage2_step: must be >= 0, got {srpo_stage2_step}")
        if rows is None or len(rows) != num_rows:
            raise ConfigError("srpo_two_stage needs the data rows (one per prompt)")
        stage1 = {str(t) for t in ([srpo_stage1_tasks] if isinstance(srpo_stage1_tasks, str)
                                   else srpo_stage1_tasks)}
        missing = [i for i, r in enumerate(rows) if srpo_task_column not in r]
        if missing:
            raise ConfigError(f"srpo_two_stage: row {missing[0]} has no '{srpo_task_column}' column "
                             f"(srpo_task_column)")
        self.stage1_rows = [i for i, r in enumerate(rows) if str(r[srpo_task_column]) in stage1]
        if not self.stage1_rows:
            found = sorted({str(r[srpo_task_column]) for r in rows})
            raise ConfigError(f"srpo_stage1_tasks {sorted(stage1)}: no row has one of these domains "
                             f"(the data has {found})")
        self.stage2_step = int(srpo_stage2_step)
        self.step = 0
        self.stage = 2 if self.stage2_step == 0 else 1

    def pool(self) -> list[int]:
        return list(self.stage1_rows) if self.stage == 1 else list(range(self.num_rows))

    def next(self, k: int) -> list[int]:
        if self.stage == 1 and self.step >= self.stage2_step:
            self.stage = 2
            self.position = len(self.order)  # abandon the stage-1 pass: a new pass over all rows starts
        return super().next(k)

    def feedback(self, prompt_uids, rewards, step: int | None = None, **outcomes) -> None:
        super().feedback(prompt_uids, rewards, **outcomes)
        self.step = self.step + 1 if step is None else int(step) + 1

    def state_dict(self) -> dict:
        return {**super().state_dict(), "step": self.step, "stage": self.stage,
                "stage1_rows": list(self.stage1_rows)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if list(state["stage1_rows"]) != self.stage1_rows:
            raise ValueError("srpo_two_stage: the checkpoint's stage-1 rows differ from this data's")
        self.step, self.stage = int(state["step"]), int(state["stage"])


# ----------------------------------------------------------------------------- Prompt-GDRO (000-28)

@SAMPLERS.register("prompt_gdro")
class PromptGDROSampler:
    """Prompt-GDRO: multiplicative-weights bandit over online pass@k difficulty bins.

    Panaganti et al. 2026, *Group Distributionally Robust Optimization-Driven
    Reinforcement Learning for LLM Reasoning*, arXiv:2601.19280, seed 000-28.

    * **Online difficulty classifier.** For prompt ``x`` rolled out at a step
      with ``k`` completions, ``c(x) = 1[any completion succeeds]`` (pass@k,
      success rule: module docstring). ``pass@k^(x)`` is the mean of its last
      ``gdro_window`` values ``c`` (``gdro_init_pass`` before any). Bin
      ``b(x)`` is the interval of ``gdro_bin_edges`` (ascending, in (0, 1))
      that holds ``pass@k^(x)``: ``B = len(edges) + 1`` bins, bin 0 hardest.
    * **EMA-debiased bin loss.** At every step each bin ``b`` that got rows
      gets ``l_b = mean over its rows of 1[not success]`` (the per-row error
      rate); ``m_b <- beta m_b + (1 - beta) l_b`` with bias correction
      ``m^_b = m_b / (1 - beta^{n_b})`` (``n_b`` = number of updates of bin
      ``b``, ``beta = gdro_ema``), as in Adam's debiasing.
    * **Multiplicative weights.** Once per step, every bin with ``n_b > 0``:
      ``log w_b <- log w_b + eta * m^_b`` (``eta = gdro_eta``). Each bin gets one
      update per step whatever its sample count, so a frequently drawn bin
      gains no weight from frequency alone ("without frequency bias").
    * **Sampling.** ``q_b = (1 - gamma) w_b / sum w + gamma / B`` (EXP3-style
      uniform exploration, ``gamma = gdro_gamma``), renormalised over non-empty
      bins; ``next(k)`` draws each slot's bin from ``q`` and then a prompt of
      that bin uniformly (without replacement while the bin lasts).

    Choices (the abstract gives the structure, not the constants): the loss is
    the error rate ``1 - success`` (so persistently hard bins are up-weighted),
    the window/EMA/eta/gamma defaults, and no hysteresis on bin changes.

    Provenance: reconstructed from the abstract — the online pass@k bins, EMA-debiased bin error rate,
    multiplicative weights and EXP3-style mixing follow the abstract's structure; window, EMA, eta, gamma and
    the loss are grpolab's choices.
    """

    def __init__(self, num_rows: int, seed: int = 0, *,
                 gdro_bin_edges: list | None = param([0.25, 0.5, 0.75], 'Prompt-GDRO: ascending pass@k bin edges in '
                                                     '(0, 1)'),
                 gdro_window: int = param(4, "Prompt-GDRO: pass@k is the mean of a prompt's last N any-success flags"),
                 gdro_init_pass: float = param(0.5, 'Prompt-GDRO: pass@k estimate of prompts never rolled out'),
                 gdro_ema: float = param(0.9, 'Prompt-GDRO: EMA factor of the per-bin error rate (bias-corrected)'),
                 gdro_eta: float = param(1.0, 'Prompt-GDRO: multiplicative-weights step size'),
                 gdro_gamma: float = param(0.1, 'Prompt-GDRO: uniform exploration mixed into the bin distribution'),
                 success_threshold: float = 1.0):
        require_rows(num_rows)
        edges = [0.25, 0.5, 0.75] if gdro_bin_edges is None else [float(e) for e in gdro_bin_edges]
        if any(b <= a for a, b in zip(edges, edges[1:])) or any(not 0 < e < 1 for e in edges):
            raise ValueError(f"gdro_bin_edges must be ascending values in (0, 1), got {edges}")
        if gdro_window < 1 or not 0 <= gdro_ema < 1 or not 0 <= gdro_gamma <= 1:
            raise ValueError("need gdro_window >= 1, 0 <= gdro_ema < 1, 0 <= gdro_gamma <= 1")
        self.num_rows = num_rows
        self.edges = torch.tensor(edges, dtype=torch.float64)
        self.num_bins = len(edges) + 1
        self.window, self.init_pass = int(gdro_window), float(gdro_init_pass)
        self.ema, self.eta, self.gamma = float(gdro_ema), float(gdro_eta), float(gdro_gamma)
        self.threshold = float(success_threshold)
        self.generator = torch.Generator().manual_seed(seed)
        self.history = torch.zeros(num_rows, self.window, dtype=torch.float64)  # ring buffer of c(x)
        self.seen = torch.zeros(num_rows, dtype=torch.long)                       # observations per prompt
        self.m = torch.zeros(self.num_bins, dtype=torch.float64)
        self.n = torch.zeros(self.num_bins, dtype=torch.long)
        self.log_w = torch.zeros(self.num_bins, dtype=torch.float64)

    def pass_at_k(self) -> torch.Tensor:
        count = self.seen.clamp(max=self.window)
        est = self.history.sum(-1) / count.clamp_min(1)
        return torch.where(count > 0, est, torch.full_like(est, self.init_pass))

    def bins(self) -> torch.Tensor:
        return torch.bucketize(self.pass_at_k(), self.edges, right=True)

    def probabilities(self, present: torch.Tensor | None = None) -> torch.Tensor:
        w = torch.softmax(self.log_w, 0)
        q = (1.0 - self.gamma) * w + self.gamma / self.num_bins
        if present is not None:
            q = q * present
        return q / q.sum()

    def next(self, k: int) -> list[int]:
        bins = self.bins()
        members = [(bins == b).nonzero().flatten().tolist() for b in range(self.num_bins)]
        present = torch.tensor([float(len(m) > 0) for m in members], dtype=torch.float64)
        q = self.probabilities(present)
        slots = torch.multinomial(q, k, replacement=True, generator=self.generator)
        counts = torch.bincount(slots, minlength=self.num_bins).tolist()
        out: list[int] = []
        for b, c in enumerate(counts):
            if c:
                out.extend(_take_without_replacement(members[b], c, self.generator))
        return out

    def debiased_loss(self) -> torch.Tensor:
        corr = 1.0 - self.ema ** self.n.to(torch.float64)
        return torch.where(self.n > 0, self.m / corr.clamp_min(1e-12), torch.zeros_like(self.m))

    def feedback(self, prompt_uids, rewards, **outcomes) -> None:
        bins = self.bins()            # bins the prompts were drawn from (before this step's update)
        err = torch.zeros(self.num_bins, dtype=torch.float64)
        rows = torch.zeros(self.num_bins, dtype=torch.float64)
        for uid, (s, n) in prompt_outcomes(prompt_uids, rewards, self.threshold).items():
            if n == 0:
                continue
            b = int(bins[uid])
            err[b] += n - s
            rows[b] += n
            self.history[uid, int(self.seen[uid]) % self.window] = float(s > 0)
            self.seen[uid] += 1
        hit = rows > 0
        loss = err / rows.clamp_min(1)
        self.m = torch.where(hit, self.ema * self.m + (1.0 - self.ema) * loss, self.m)
        self.n = self.n + hit.long()
        self.log_w = self.log_w + self.eta * self.debiased_loss()
        self.log_w = self.log_w - self.log_w.max()

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "history": self.history.clone(),
                "seen": self.seen.clone(), "m": self.m.clone(), "n": self.n.clone(),
                "log_w": self.log_w.clone(), "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        _check_rows(state, self.num_rows)
        self.generator.set_state(state["generator"])
        for key in ("history", "seen", "m", "n", "log_w"):
            setattr(self, key, state[key].clone())


__all__ = ["prompt_outcomes", "trajectory_diversity", "VADESampler", "VASSampler",
           "SRPOHistorySampler", "PromptGDROSampler"]
