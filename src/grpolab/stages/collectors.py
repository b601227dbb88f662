"""Collectors: how a step's scored batch is gathered when one rollout round is not enough.

Without a collector the trainer runs one round: ``prompts_per_step`` prompts,
their completions, their rewards. A collector (``COLLECTORS``) replaces that
round by a loop of its own; the built-in one, DAPO's dynamic sampling, is
switched on by ``dynamic_sampling: true`` (the switch is named like the
component, registry.py's ``switch`` registries); ``steps_per_generation: K``
(K > 1) switches on the one that decodes K steps' prompts in one call. It is
called with

* ``generate(n) -> (batch, reward-call errors)``: ``n`` prompts drawn from the
  sampler, their completions scored (``batch.rewards`` [R, K] set);
* ``scalar(batch) -> [R]``: the combined reward (weights, then reward transforms);
* ``prompts_per_step``, ``step``, ``log``, ``pad_id`` and ``ctx`` (the rollout context);

and returns ``(batch or None, errors, stats)``: ``None`` when no group is
kept (the trainer skips the step), ``stats`` are logged with the step.
"""
from __future__ import annotations

import math

import torch

from ..algorithms import zero_variance_groups, zero_variance_groups_count
from ..batch import RolloutBatch
from ..errors import ConfigError
from ..registry import COLLECTORS, param
from ._checks import require_at_least


def _check_dynamic_sampling(cfg) -> None:
    """Settings dynamic sampling cannot work with, refused before the run starts."""
    require_at_least(cfg, 1, "dynamic_sampling_oversample", "dynamic_sampling_max_rounds")


@COLLECTORS.register("dynamic_sampling", check=_check_dynamic_sampling)
class DynamicSampling:
    """DAPO dynamic sampling: drop groups whose accuracy does not vary, generate more prompts until the batch is full.

    A group whose filter quantity ``v`` (``dynamic_sampling_metric``) is
    constant, ``std_i(v_i) = 0``, has advantage 0 for every completion and
    no gradient; it is dropped. Each round generates a whole generation batch
    of ``ceil(dynamic_sampling_oversample x prompts_per_step)`` prompts and
    keeps its groups with signal, until ``prompts_per_step`` groups are kept;
    kept groups beyond that are discarded. The filter quantity is by default
    the task's accuracy reward (not the shaped reward: an overlong penalty must
    not make a group of equally correct answers look informative).

    From DAPO: An Open-Source LLM Reinforcement Learning System at Scale
    (Yu et al. 2025, arXiv:2503.14476; not among the seed papers), its
    "dynamic sampling".

    Provenance: authors' code — https://github.com/volcengine/verl, recipe/dapo/dapo_ray_trainer.py
    (RayDAPOTrainer.fit, the ``algorithm.filter_groups`` branch; the DAPO authors' scripts are
    recipe/dapo/run_dapo_qwen2.5_32b.sh): ``filter_groups.metric=acc`` (``dynamic_sampling_metric:
    accuracy``), ``data.gen_batch_size`` prompts per round (``dynamic_sampling_oversample``; the script sets
    ``gen_prompt_bsz = 3 x train_prompt_bsz``), the accumulated batch truncated to ``train_batch_size``
    groups, ``max_num_gen_batches`` rounds (``dynamic_sampling_max_rounds``). ``dynamic_sampling_adaptive``
    (grpolab's, off by default) sizes each round by the groups still needed over the keep rate seen so far,
    so the rounds verl would run one after another are decoded as one batch. Known differences: after the
    last round verl raises an error, grpolab warns and trains on the groups it kept (the step is skipped if
    none); verl keeps a group when its metric has ``np.std > 0`` or it has one completion, grpolab when its
    Bessel std exceeds 1e-6 (algorithms/filters.py: float noise never passes a constant group, a group of one
    is dropped). Test: tests/test_trainer_schedules.py::test_dynamic_sampling_keeps_only_groups_with_signal.
    """

    def __init__(self, *, reward_names: list[str], accuracy_reward: str | None,
                 dynamic_sampling_metric: str = param(
                     "accuracy", "quantity whose constant groups dynamic sampling drops: 'accuracy' (the task's "
                                 "accuracy reward column, as DAPO / verl filter_groups.metric=acc), 'reward' (the "
                                 "combined reward after transforms such as overlong_penalty) or a reward function "
                                 "name"),
                 dynamic_sampling_oversample: float = param(
                     1.0, "dynamic sampling generates ceil(factor x prompts_per_step) prompts per round and keeps "
                          "the first groups with signal (verl gen_batch_size / train_batch_size; 1 = no "
                          "over-sampling)"),
                 dynamic_sampling_max_rounds: int = param(
                     4, "generation rounds per step before dynamic sampling gives up and trains on the groups it "
                        "has (with a warning; verl max_num_gen_batches, where it is an error)"),
                 dynamic_sampling_adaptive: bool = param(
                     False, "size each round by the groups still needed over the fraction of groups kept so far "
                            "(decayed 0.8 per step), so a step's expected rounds are decoded as one batch (more "
                            "rows per decode step, fewer rounds); capped at max_rounds x oversample x "
                            "prompts_per_step prompts; off = verl's fixed gen_batch_size rounds")):
        self.oversample = float(dynamic_sampling_oversample)
        self.max_rounds = int(dynamic_sampling_max_rounds)
        self.column = self._column(dynamic_sampling_metric, list(reward_names), accuracy_reward)
        self.metric = "reward" if self.column is None else list(reward_names)[self.column]  # (named in messages)
        self.adaptive = bool(dynamic_sampling_adaptive)
        self.seen = [0.0, 0.0]  # adaptive: decayed counts of (groups with signal, groups generated)

    DECAY = 0.8  # adaptive: weight of the previous steps' counts at each new step

    def keep_rate(self) -> float:
        """Estimated fraction of generated groups with signal: (kept + 1) / (generated + 1) over the decayed
        counts (1 before any round: the first round is the fixed one)."""
        kept, generated = self.seen
        return (kept + 1.0) / (generated + 1.0)

    def round_size(self, need: int, prompts_per_step: int) -> int:
        """Prompts the next round generates: ``ceil(oversample x prompts_per_step)`` (verl's gen_batch_size), or
        with ``dynamic_sampling_adaptive`` ``ceil(oversample x need / keep_rate)`` capped at
        ``ceil(max_rounds x oversample x prompts_per_step)`` (the most the fixed rounds generate in a step)."""
        fixed = math.ceil(self.oversample * prompts_per_step - 1e-9)
        if not self.adaptive:
            return fixed
        cap = math.ceil(self.max_rounds * self.oversample * prompts_per_step - 1e-9)
        return max(1, min(cap, math.ceil(self.oversample * need / self.keep_rate() - 1e-9)))

    def state_dict(self) -> dict:
        return {"seen": list(self.seen)}

    def load_state_dict(self, state: dict) -> None:
        self.seen = [float(v) for v in state["seen"]]

    @staticmethod
    def _column(metric: str, names: list[str], accuracy_reward: str | None) -> int | None:
        """Reward-matrix column the filter reads; None = the combined scalar reward. Raises ``ConfigError``
        naming the fix when the metric cannot be resolved."""
        if metric == "reward":
            return None
        if metric == "accuracy":
            if accuracy_reward is None:
                raise ConfigError("dynamic_sampling_metric: 'accuracy' needs an accuracy reward, and this run has "
                                  "none designated (e.g. --data with --reward functions); set "
                                  "dynamic_sampling_metric to one of the reward functions "
                                  f"({', '.join(names)}) or to 'reward' (the combined shaped reward)")
            metric = accuracy_reward
        if metric not in names:
            raise ConfigError(f"dynamic_sampling_metric: '{metric}' is not a reward function of this run; valid "
                              f"values: accuracy, reward, {', '.join(names)}")
        return names.index(metric)

    def values(self, batch: RolloutBatch, scalar) -> torch.Tensor:
        """``[R]`` per-row quantity whose constant groups are dropped (``scalar``: batch -> combined reward)."""
        return scalar(batch) if self.column is None else batch.rewards[:, self.column]

    def __call__(self, generate, scalar, prompts_per_step: int, step: int, log, pad_id: int):
        kept, errors, generated, dropped, n_kept, sampled = [], 0, 0, 0, 0, []
        self.seen = [self.DECAY * v for v in self.seen]
        for round_ in range(self.max_rounds):
            need = prompts_per_step - n_kept
            n_prompts = self.round_size(need, prompts_per_step)
            batch, round_errors = generate(n_prompts)
            errors += round_errors
            generated += n_prompts
            values = self.values(batch, scalar)
            sampled.append(values)
            keep = zero_variance_groups(values, batch.group_ids)
            n_dropped = zero_variance_groups_count(values, batch.group_ids)
            dropped += n_dropped
            n_groups = len(torch.unique(batch.group_ids))
            self.seen = [self.seen[0] + n_groups - n_dropped, self.seen[1] + n_groups]
            if keep.any():
                groups = torch.unique(batch.group_ids[keep])[:need]  # over-sampled surplus is discarded
                rows = (keep & torch.isin(batch.group_ids, groups)).nonzero().squeeze(-1)
                kept.append(batch.select(rows))
                n_kept += len(groups)
            if n_kept >= prompts_per_step:
                break
        else:
            if n_kept:
                log(f"[grpolab] step {step + 1}: dynamic sampling kept {n_kept} of {prompts_per_step} groups after "
                    f"{self.max_rounds} rounds (dynamic_sampling_max_rounds); training on what it has")
            else:
                values = torch.cat(sampled)
                mean = float(torch.nanmean(values)) if (~values.isnan()).any() else float("nan")
                log(f"[grpolab] step {step + 1}: dynamic sampling kept 0 of {prompts_per_step} groups after "
                    f"{self.max_rounds} rounds (dynamic_sampling_max_rounds): in each of the {dropped} groups it "
                    f"sampled, {self.metric} was the same for every completion (mean {self.metric} "
                    f"{mean:.3f}); the step is skipped: no optimiser step, the learning-rate schedule does not "
                    f"advance")
        stats = {"dynamic_sampling/rounds": round_ + 1, "dynamic_sampling/generated_groups": generated,
                 "dynamic_sampling/dropped_groups": dropped, "dynamic_sampling/kept_groups": n_kept,
                 "frac_zero_std_groups": dropped / max(generated, 1)}
        if self.adaptive:
            stats["dynamic_sampling/keep_rate"] = self.keep_rate()
        if not kept:
            return None, errors, stats
        return RolloutBatch.concat(kept, pad_id=pad_id), errors, stats


def _check_steps_per_generation(cfg) -> None:
    """Settings one generation call for several steps cannot work with, refused before the run starts."""
    k = cfg.steps_per_generation
    if cfg.dynamic_sampling:
        raise ConfigError(f"steps_per_generation: {k} with dynamic_sampling: true is not supported (both gather "
                          f"the step's batch: dynamic sampling refills one step's batch round by round, "
                          f"steps_per_generation serves K steps from one call); use one of them "
                          f"(steps_per_generation: 1, or dynamic_sampling: false)")
    if cfg.async_rollouts:
        raise ConfigError(f"steps_per_generation: {k} with async_rollouts: true is not supported (the workers "
                          f"sample one step's prompts ahead; a window of K steps is already generated ahead); set "
                          f"steps_per_generation: 1 or async_rollouts: false")
    if getattr(cfg, "rollout_seeding", "batch") == "group":
        raise ConfigError(f"steps_per_generation: {k} with rollout_seeding: group decodes one group at a time, so "
                          f"no decode step sees more rows than without it; use rollout_seeding: batch, or "
                          f"steps_per_generation: 1")


@COLLECTORS.register("steps_per_generation", check=_check_steps_per_generation)
class StepsPerGeneration:
    """One generation call for K optimiser steps: decode K x prompts_per_step prompts together, train K steps.

    At a step whose queue is empty the collector draws ``K x prompts_per_step``
    prompts (``K = steps_per_generation``) in one ``generate`` call, so every
    decode step runs over ``K x prompts_per_step x G`` rows and each weight
    streamed from memory serves K times the rows. The scored batch is split into
    K step batches of whole groups (``prompts_per_step`` each), in sampler order
    (groups renumbered 0..P-1, as a plain step's), queued, and served one per
    step. Each keeps the behaviour log-probs of generation time, so the batch
    trained at position ``j`` of the window (``j = 0..K-1``) was sampled ``j``
    updates ago and its first ratio is

        rho_t = pi_theta_{s+j}(o_t) / pi_theta_s(o_t)

    which the policy loss's clip corrects (the off-policy ratio of PPO's
    surrogate). The run's last window is cut to the steps left, so nothing
    generated goes untrained. K = 1 is the plain path (the collector is not built). The queue
    is component state: a checkpoint taken mid-window resumes it bit for bit.

    Differences from TRL: TRL computes advantages over the whole generation
    batch and shuffles its rows before splitting; grpolab splits whole groups in
    sampler order and computes advantages per step batch (equal for the group
    estimators; a batch-wide statistic such as ``group_mean_batch_std`` sees one
    step batch). TRL regenerates after a resume (its buffer is not saved);
    grpolab resumes the queue. A sampler that learns from ``feedback`` sees a
    window's outcomes one step at a time, after the window's prompts were drawn.

    Provenance: authors' code — https://github.com/huggingface/trl, trl/trainer/grpo_config.py
    (``steps_per_generation``, ``generation_batch_size``: ``__post_init__`` sets generation_batch_size =
    per_device_train_batch_size x num_processes x steps_per_generation, refuses both set together, and needs
    generation_batch_size divisible by num_generations) and trl/trainer/grpo_trainer.py (``_prepare_inputs``:
    generate every ``steps_per_generation x num_iterations`` micro-steps, shuffle, split into
    ``steps_per_generation`` buffered slices, old log-probs from generation time); TRL counts micro-batches, grpolab
    optimiser steps (api.py maps one onto the other). verl's equivalent is a PPO mini-batch smaller than the
    train batch (``actor.ppo_mini_batch_size`` < ``data.train_batch_size``: several optimiser steps per
    generated batch). Test:
    tests/test_steps_per_generation.py::test_k2_serves_the_plain_path_prompts_in_order_from_one_call_of_k_x_the_rows.
    """

    def __init__(self, *, steps_per_generation: int, steps: int):
        self.k = int(steps_per_generation)
        self.steps = int(steps)  # the run's last window is cut to the steps left (nothing generated is dropped)
        self.queue: list[RolloutBatch] = []  # the window's step batches not yet trained, in order
        self.served = 0  # step batches of the current window served so far (its staleness in updates)

    def split(self, batch: RolloutBatch, k: int) -> list[RolloutBatch]:
        """``batch``'s groups in order, cut into K step batches of whole groups (``prompts_per_step`` groups each
        for a rollout with one group per prompt; as even as the count allows otherwise), each renumbered from 0."""
        groups = torch.unique(batch.group_ids)  # sorted: the sampler's order (ids follow the drawn prompts)
        out = []
        for chunk in torch.tensor_split(groups, k):
            if not len(chunk):
                continue
            part = batch.select(torch.isin(batch.group_ids, chunk).nonzero().squeeze(-1))
            part.group_ids = torch.unique(part.group_ids, return_inverse=True)[1]
            out.append(part)
        return out

    def __call__(self, generate, prompts_per_step: int, step: int, ctx=None):
        generated, errors = 0, 0
        if not self.queue:
            k = max(1, min(self.k, self.steps - step))
            batch, errors = generate(k * prompts_per_step)  # one call: K x the rows per decode step
            if batch is None:  # the rollout strategy had nothing to train on: the step is skipped
                return None, errors, {"steps_per_generation/rows_generated": 0}
            generated, self.served = batch.num_rows, 0
            self.queue = self.split(batch, k)
        elif ctx is not None:  # this step's group ids, as a plain step's (a stage's own groups come after them)
            ctx.allocate_groups(len(torch.unique(self.queue[0].group_ids)))
        stats = {"steps_per_generation/rows_generated": generated,
                 "steps_per_generation/staleness": self.served}  # updates since the window was generated
        self.served += 1
        return self.queue.pop(0), errors, stats

    def state_dict(self) -> dict:
        return {"queue": list(self.queue), "served": self.served}

    def load_state_dict(self, state: dict) -> None:
        self.queue, self.served = list(state["queue"]), int(state["served"])
