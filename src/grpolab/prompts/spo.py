"""SPO's prioritised prompt sampler: prompts drawn in proportion to the uncertainty of their tracked success rate."""
from __future__ import annotations

import torch

from ..algorithms.adv_shaping import SPOValueTracker
from ..registry import SAMPLERS, param
from .uniform import require_rows


@SAMPLERS.register("spo_prioritized")
class SPOPrioritizedSampler:
    """SPO prioritised prompt sampling (Single-stream Policy Optimization, Xu & Ding, 2025, arXiv:2509.13232,
    seed 000-113).

    Each step draws the batch's ``k`` prompts from a candidate pool with
    probability proportional to::

        w(x) = sqrt(v(x) (1 - v(x))) + epsilon,      v(x) = a / (a + b)

    where ``v(x)`` is the success rate of prompt ``x`` estimated by the
    advantage's persistent Beta value tracker (``spo_single_stream``, read
    live, never copied) and ``epsilon = spo_sample_epsilon`` (0.05) keeps
    every prompt reachable. ``sqrt(v (1 - v))`` is the standard deviation of
    a Bernoulli reward: prompts the policy solves about half the time, whose
    single completion is most informative, come first; solved (v = 1) and
    hopeless (v = 0) prompts keep weight ``epsilon``. A prompt the tracker
    has not seen has ``v = spo_prior_value`` (0.5: the largest weight, so new
    prompts are visited early).

    The pool is every prompt (``spo_candidate_pool: 0``), or the next ``M``
    prompts of an epoch-wise shuffled pass (as the authors' dataloader's
    ``gen_batch_size`` rows). ``k <= M``: ``k`` distinct prompts by
    successive weighted draws without replacement (``torch.multinomial``, as
    ``numpy.random.choice(replace=False, p=...)``; with ``epsilon = 0`` and
    fewer than ``k`` prompts of non-zero weight, those come first and the
    rest uniformly from the others); ``k > M``: with replacement. Randomness
    comes from the sampler's own generator, part of
    ``state_dict``; the tracker's table is checkpointed by the advantage
    component, so a resumed run draws exactly what an uninterrupted one
    draws. ``feedback`` is unused: the advantage updates the tracker.

    How it reads the tracker: the trainer puts its components on the rollout
    context (``ctx.components``), and ``attach(ctx)`` keeps a reference to
    the ``SPOValueTracker`` among them; a run whose advantage is not
    ``spo_single_stream`` stops there, when the trainer is built, naming it.

    Provenance: authors' code — https://github.com/volcengine/verl, recipe/spo/spo_ray_trainer.py (commit
    4b2b364, ``RayPPOTrainer.fit``); weight ``sqrt(p (1 - p)) + 0.05`` from the tracker's ``alpha / (alpha + beta)``,
    probabilities normalised over the dataloader's batch of ``gen_batch_size`` candidates, ``train_batch_size``
    drawn with ``np.random.choice(..., replace=target_bs > M, p=probs)``. Differences: the authors initialise
    every prompt from offline rollouts and give a prompt with no estimate weight 0 (uniform if all are 0);
    here an unseen prompt has the tracker's prior value; the candidate pool defaults to every prompt (their
    train.sh: ``gen_batch_size`` 14000 "for DAPO en subsets" against ``train_batch_size`` 1024, a pool of
    most of the training data).
    Test: tests/test_spo_sampler.py::test_weights_and_probabilities_by_hand.
    """

    def __init__(self, num_rows: int, seed: int = 0, *,
                 spo_sample_epsilon: float = param(0.05, 'SPO sampler: exploration floor epsilon of the weight '
                                                   'sqrt(v (1 - v)) + epsilon'),
                 spo_candidate_pool: int = param(0, 'SPO sampler: candidates per step, taken in shuffled epoch '
                                                 'order before the weighted draw (0 = every prompt)')):
        require_rows(num_rows)
        if spo_sample_epsilon < 0:
            raise ValueError(f"spo_sample_epsilon: must be >= 0, got {spo_sample_epsilon}")
        if spo_candidate_pool < 0:
            raise ValueError(f"spo_candidate_pool: must be >= 0, got {spo_candidate_pool}")
        self.num_rows = num_rows
        self.epsilon = float(spo_sample_epsilon)
        self.pool = int(spo_candidate_pool)
        self.generator = torch.Generator().manual_seed(seed)
        self.order: list[int] = []
        self.position = 0
        self.tracker: SPOValueTracker | None = None

    def attach(self, ctx) -> None:
        found = [c.fn for c in getattr(ctx, "components", {}).values() if isinstance(c.fn, SPOValueTracker)]
        if not found:
            raise ValueError("prompt_sampler spo_prioritized samples from the per-prompt value tracker of "
                             "advantage spo_single_stream, which this run does not use (set advantage: "
                             "spo_single_stream)")
        self.tracker = found[0]

    def weights(self, idx: list[int]) -> torch.Tensor:
        """``sqrt(v (1 - v)) + epsilon`` of the prompts ``idx``."""
        if self.tracker is None:
            raise ValueError("spo_prioritized: attach(ctx) was not called (no value tracker)")
        v = torch.tensor([self.tracker.value(int(i)) for i in idx], dtype=torch.float64)
        return (v * (1.0 - v)).clamp(min=0.0).sqrt() + self.epsilon

    def _candidates(self) -> list[int]:
        if self.pool == 0:
            return list(range(self.num_rows))
        out: list[int] = []
        while len(out) < self.pool:
            if self.position >= len(self.order):
                self.order = torch.randperm(self.num_rows, generator=self.generator).tolist()
                self.position = 0
            take = min(self.pool - len(out), len(self.order) - self.position)
            out.extend(self.order[self.position:self.position + take])
            self.position += take
        return out

    def next(self, k: int) -> list[int]:
        cand = self._candidates()
        w = self.weights(cand)
        probs = w / w.sum() if float(w.sum()) > 0 else torch.full_like(w, 1.0 / len(cand))
        replace = k > len(cand)
        positive = int((probs > 0).sum())
        if replace or positive >= k:
            picks = torch.multinomial(probs, k, replacement=replace, generator=self.generator).tolist()
        else:  # epsilon 0 and fewer prompts with weight than k: those first, the rest uniformly from the others
            picks = torch.multinomial(probs, positive, generator=self.generator).tolist()
            zero = (probs == 0).nonzero().flatten()
            picks += zero[torch.randperm(len(zero), generator=self.generator)[:k - positive]].tolist()
        return [cand[i] for i in picks]

    def feedback(self, **outcomes) -> None:
        pass

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "order": list(self.order), "position": self.position,
                "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        if state["num_rows"] != self.num_rows:
            raise ValueError(f"sampler state is for {state['num_rows']} rows, the data has {self.num_rows}")
        self.generator.set_state(state["generator"])
        self.order, self.position = list(state["order"]), int(state["position"])
