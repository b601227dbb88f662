"""What a rollout strategy, a batch stage or a budget-aware sampler may use.

The trainer builds one :class:`RolloutContext` from its parts (config, tokenizer,
data rows, policy, scorer, generators, engine) and hands it to every rollout
strategy (``rollouts/strategies.py``) and batch stage (``stages/``). Through it a
component can generate completions (optionally with other prompts, another
number of completions per prompt or another temperature), score a batch with
the configured reward functions, compute the scalar reward, and teacher-force
log-probs of tokens it injected — without knowing the trainer (tests build one
directly, see tests/test_rollout_context.py).
"""
from __future__ import annotations

import contextlib
import hashlib

import torch

from ..batch import RolloutBatch


def group_seed(seed: int, step: int, group_id: int) -> int:
    """The token-draw seed of group ``group_id`` of step ``step`` (``rollout_seeding: group``, and every Ray
    rollout worker): the first 8 bytes of ``sha256("grpolab-group:{seed}:{step}:{group_id}")`` (little-endian,
    63 bits), so neighbouring groups and steps get unrelated streams and a group's completions depend on
    (seed, step, group) only."""
    digest = hashlib.sha256(f"grpolab-group:{seed}:{step}:{group_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2 ** 63 - 1)


class RolloutContext:
    """Built from explicit parts, so a strategy or stage can run (and be tested) without a trainer.

    ``policy`` is the model rollouts are sampled from, or a zero-argument callable
    returning it (the trainer passes one: off-policy, the stale snapshot changes
    between steps). ``scorer`` has ``score(batch) -> errors`` (sets
    ``batch.rewards``) and ``scalar(batch, step) -> [R]``
    (:class:`~grpolab.rewards.scoring.BatchScorer`). ``generator`` is the run's
    seeded CPU generator, ``sampling_generator`` the one for token draws on the
    policy's device (defaults to ``generator``). ``engine`` is a generation
    engine (vLLM; or one with ``rollout(ctx, rows, uids, group_offset=,
    num_generations=, temperature=)`` that packs the batch itself, such as
    the Ray rollout workers of ``distributed/ray_workers.py``) or None. ``step`` is the current training step: the trainer
    sets it at the start of every step (:meth:`new_step`). ``reference`` is the
    frozen initial policy (a model), or a zero-argument callable returning a
    context manager that yields it (the trainer passes one: its frozen copy,
    or for LoRA the policy with its adapters off), or None
    (:meth:`reference_policy`).
    """

    def __init__(self, cfg, tokenizer, rows: list[dict], *, policy, scorer, generator: torch.Generator,
                 sampling_generator: torch.Generator | None = None, engine=None, log=print, step: int = 0,
                 reference=None, actions=None):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.rows = rows  # the training data rows (dataset index = prompt uid)
        self._policy = policy if callable(policy) and not isinstance(policy, torch.nn.Module) else (lambda: policy)
        self.scorer = scorer
        self.generator = generator  # seeded, checkpointed: for choices made on the CPU
        self.sampling_generator = sampling_generator if sampling_generator is not None else generator
        self.engine = engine
        self._reference = (reference if reference is None or not isinstance(reference, torch.nn.Module)
                           else (lambda: contextlib.nullcontext(reference)))
        self.log = log
        self.step = step
        self.reward_errors = 0  # reward-function errors seen through score()
        self._next_group = 0
        self.metrics: dict[str, float] = {}  # this step's rollout/<name> metrics (see metric())
        self.environment = None  # the agent rollout's environment (the API's or the task's; grpolab.agents)
        self._actions = actions  # the policy kind (grpolab/policies/); None: built from cfg.policy on first use
        # the run's components by key (advantage/<name>, loss/<name>, ...; the trainer sets it): a sampler may read
        # a component's state through it (spo_prioritized: the spo_single_stream value tracker)
        self.components: dict = {}

    def new_step(self, step: int | None = None) -> None:
        """Start a step (group ids restart at 0, metrics empty); the trainer passes its step number."""
        if step is not None:
            self.step = step
        self._next_group = 0
        self.metrics = {}

    def metric(self, name: str, value: float) -> None:
        """Log ``value`` for this step as ``rollout/<name>`` in metrics.jsonl (the last value of the step wins)."""
        self.metrics[name] = float(value)

    def allocate_groups(self, n: int) -> int:
        """Reserve ``n`` fresh group ids for this step; returns the first (ids are offset .. offset+n-1)."""
        first = self._next_group
        self._next_group += n
        return first

    @property
    def actions(self):
        """The kind of policy (grpolab/policies/, e.g. the causal LM): per-step log-probs of a batch's actions."""
        if self._actions is None:
            from ..components import Component
            from ..registry import POLICIES
            self._actions = Component(POLICIES.get(self.cfg.policy), self.cfg, self.cfg.policy).fn
        if self._actions.tokenizer is None:
            self._actions.tokenizer = self.tokenizer
        return self._actions

    @property
    def pad_id(self) -> int:
        """The ``completion_ids`` filler for :meth:`RolloutBatch.concat` (the tokenizer's pad id for a causal LM)."""
        return self.actions.pad_id

    @property
    def policy(self):
        """The model rollouts are sampled from (the stale snapshot when off-policy)."""
        return self._policy()

    @contextlib.contextmanager
    def reference_policy(self):
        """``with ctx.reference_policy() as ref:`` the frozen initial policy (the reference model).

        A component that samples from or scores with it sets the attribute
        ``needs_reference_model = True`` on itself: the trainer then keeps a
        frozen copy of the initial weights even when ``beta = 0`` (with LoRA the
        reference is the policy with its adapters off, valid inside the block).
        """
        if self._reference is None:
            raise RuntimeError("this RolloutContext has no reference model: build it with reference=MODEL (the "
                               "trainer passes one when beta > 0 or a selected component sets "
                               "needs_reference_model = True)")
        with self._reference() as model:
            yield model

    # ------------------------------------------------------------- generation
    def generate(self, rows: list[dict], uids: list[int], *, group_offset: int,
                 num_generations: int | list[int] | None = None,
                 temperature: float | list[float] | None = None, model=None) -> RolloutBatch:
        """Sample completions for ``rows`` (each needs a ``prompt``) and pack a batch.

        ``num_generations`` and ``temperature`` default to the config; either may
        be a list with one value per row (ragged groups, per-prompt temperature).
        Group ids are ``group_offset + i``; prompt uids are ``uids``.

        With ``rollout_seeding: group`` each prompt's group is drawn on its own, from the token-draw generator
        seeded by :func:`group_seed` (seed, step, group id): a group's completions are then the same whichever
        batch, process or rank draws them (distributed runs, docs/distributed.md).
        """
        if getattr(self.cfg, "rollout_seeding", "batch") == "group" and rows:
            return self._generate_per_group(rows, uids, group_offset, num_generations, temperature, model)
        return self._generate(rows, uids, group_offset, num_generations, temperature, model)

    def _generate(self, rows, uids, group_offset, num_generations, temperature, model) -> RolloutBatch:
        cfg = self.cfg
        engine = self.engine
        if engine is not None and model is None and hasattr(engine, "rollout"):  # packs its own batch (Ray workers)
            return engine.rollout(self, rows, uids, group_offset=group_offset, num_generations=num_generations,
                                  temperature=temperature)
        if engine is not None and model is None:  # vLLM: sampled by the engine, pi_old from the trainer
            from ..generation.vllm_engine import engine_rollout
            return engine_rollout(engine, self, rows, uids, group_offset=group_offset,
                                  num_generations=cfg.num_generations if num_generations is None else num_generations,
                                  temperature=cfg.temperature if temperature is None else temperature)
        return self.actions.sample(model if model is not None else self.policy, rows, uids, group_offset=group_offset,
                                   num_generations=cfg.num_generations if num_generations is None
                                   else num_generations,
                                   temperature=cfg.temperature if temperature is None else temperature,
                                   generator=self.sampling_generator)

    def _generate_per_group(self, rows, uids, group_offset, num_generations, temperature, model) -> RolloutBatch:
        """One group at a time, each from a generator reseeded by :func:`group_seed`; packed like one call."""
        def one(value, i):
            return value[i] if isinstance(value, (list, tuple)) else value

        parts = []
        for i, (row, uid) in enumerate(zip(rows, uids)):
            seed = group_seed(self.cfg.seed, self.step, group_offset + i)
            self.sampling_generator.manual_seed(seed)
            if self.generator is not self.sampling_generator:
                self.generator.manual_seed(seed)
            parts.append(self._generate([row], [uid], group_offset + i, one(num_generations, i),
                                        one(temperature, i), model))
        return RolloutBatch.concat(parts, pad_id=self.pad_id)

    def continue_(self, contexts: list[list[int]], *, max_new_tokens: int | list[int] | None = None,
                  temperature: float | list[float] | None = None, stop_token_ids=(), stop_strings=(),
                  model=None):
        """One continuation of each token-id context (:func:`grpolab.generation.turns.continue_sequences`).

        Sampled by the behaviour policy (or ``model``) with the run's top-k /
        top-p, sampler, static-cache setting and token-draw generator;
        ``max_new_tokens`` defaults to ``max_completion_length`` and
        ``temperature`` to the config's (either may be one value per context).
        With a vLLM engine configured (and no ``model``) the engine samples,
        seeded from the run's CPU generator like :meth:`generate`; the result
        then has ``from_engine=True`` and the engine's log-probs (pack it with
        :func:`~grpolab.generation.turns.pack_episodes` and
        ``logprobs_fn=ctx.logprobs`` to get the trainer's pi_old and the
        truncated importance weights). Returns a
        :class:`~grpolab.generation.turns.Continuation`.
        """
        from ..generation.turns import continue_sequences

        cfg = self.cfg
        engine = self.engine if model is None else None
        return continue_sequences(model if model is not None else self.policy, self.tokenizer, contexts,
                                  max_new_tokens=cfg.max_completion_length if max_new_tokens is None
                                  else max_new_tokens,
                                  temperature=cfg.temperature if temperature is None else temperature,
                                  top_k=cfg.top_k, top_p=cfg.top_p,
                                  generator=self.generator if engine is not None else self.sampling_generator,
                                  stop_token_ids=stop_token_ids, stop_strings=stop_strings,
                                  sampling_method=cfg.sampling_method, static_cache=cfg.static_kv_cache,
                                  engine=engine)

    # ---------------------------------------------------------------- rewards
    def score(self, batch: RolloutBatch) -> torch.Tensor:
        """Score ``batch`` with the reward functions (sets ``batch.rewards``); return scalar rewards [R]."""
        self.reward_errors += self.scorer.score(batch)
        return self.scorer.scalar(batch, step=self.step)

    def scalar(self, batch: RolloutBatch) -> torch.Tensor:
        """Combined scalar reward [R] of an already scored batch (weights, then reward transforms)."""
        return self.scorer.scalar(batch, step=self.step)

    # ---------------------------------------------------------- teacher force
    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, model=None) -> torch.Tensor:
        """Log-probs [R, T] of ``batch``'s completion tokens under the behaviour policy (or ``model``).

        Use it to give injected tokens the behaviour log-prob they really have.
        """
        return self.actions.logprobs(model if model is not None else self.policy, batch,
                                     micro_batch_size=self.cfg.micro_batch_size,
                                     max_tokens=self.cfg.micro_batch_tokens)
