"""Collectors: how a step's scored batch is gathered when one rollout round is not enough.

Without a collector the trainer runs one round: ``prompts_per_step`` prompts,
their completions, their rewards. A collector (``COLLECTORS``) replaces that
round by a loop of its own; the built-in one, DAPO's dynamic sampling, is
switched on by ``dynamic_sampling: true`` (the switch is named like the
component, registry.py's ``switch`` registries). It is called with

* ``generate(n) -> (batch, reward-call errors)``: ``n`` prompts drawn from the
  sampler, their completions scored (``batch.rewards`` [R, K] set);
* ``scalar(batch) -> [R]``: the combined reward (weights, then reward transforms);
* ``prompts_per_step``, ``step``, ``log`` and ``pad_id``;

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


def _check_dynamic_sampling(cfg) -> None:
    """Settings dynamic sampling cannot work with, refused before the run starts."""
    if cfg.dynamic_sampling_oversample < 1:
        raise ConfigError(f"dynamic_sampling_oversample: must be >= 1, got {cfg.dynamic_sampling_oversample}")
    if cfg.dynamic_sampling_max_rounds < 1:
        raise ConfigError(f"dynamic_sampling_max_rounds: must be >= 1, got {cfg.dynamic_sampling_max_rounds}")


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
    groups, ``max_num_gen_batches`` rounds (``dynamic_sampling_max_rounds``). Known differences: after the
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
                        "has (with a warning; verl max_num_gen_batches, where it is an error)")):
        self.oversample = float(dynamic_sampling_oversample)
        self.max_rounds = int(dynamic_sampling_max_rounds)
        self.column = self._column(dynamic_sampling_metric, list(reward_names), accuracy_reward)

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
        kept, errors, generated, dropped, n_kept = [], 0, 0, 0, 0
        n_prompts = math.ceil(self.oversample * prompts_per_step - 1e-9)
        for round_ in range(self.max_rounds):
            need = prompts_per_step - n_kept
            batch, round_errors = generate(n_prompts)
            errors += round_errors
            generated += n_prompts
            values = self.values(batch, scalar)
            keep = zero_variance_groups(values, batch.group_ids)
            dropped += zero_variance_groups_count(values, batch.group_ids)
            if keep.any():
                groups = torch.unique(batch.group_ids[keep])[:need]  # over-sampled surplus is discarded
                rows = (keep & torch.isin(batch.group_ids, groups)).nonzero().squeeze(-1)
                kept.append(batch.select(rows))
                n_kept += len(groups)
            if n_kept >= prompts_per_step:
                break
        else:
            log(f"[grpolab] step {step + 1}: dynamic sampling kept {n_kept} of {prompts_per_step} groups after "
                f"{self.max_rounds} rounds (dynamic_sampling_max_rounds); training on what it has")
        stats = {"dynamic_sampling/rounds": round_ + 1, "dynamic_sampling/generated_groups": generated,
                 "dynamic_sampling/dropped_groups": dropped, "frac_zero_std_groups": dropped / max(generated, 1)}
        if not kept:
            return None, errors, stats
        return RolloutBatch.concat(kept, pad_id=pad_id), errors, stats
