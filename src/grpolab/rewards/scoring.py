"""Reward functions and their scoring: loading, validation and scoring into a ``[rows, K]`` matrix.

The contract is TRL's: a reward function is called as
``f(prompts=..., completions=..., completion_ids=..., **columns)`` and returns a
list with one float (or ``None`` = unscorable) per completion. Unscorable
entries become NaN and are left out of group statistics.

A reward function is the user's code and runs in the training process, but it
cannot corrupt the run (:meth:`RewardScorer.score`): each call gets its own deep
copies of the prompts, completions, ids and columns (editing them in place
changes nothing the trainer keeps); with ``reward_timeout`` > 0 a call runs in a
worker thread and one still running after that many seconds is abandoned (its
rows are NaN for that step, counted in ``reward_errors``, with a warning naming
the function; Python cannot stop a thread, so a reward that never returns keeps
its thread); and any exception it raises, ``SystemExit`` and other
``BaseException`` subclasses included (but not ``KeyboardInterrupt``), is reported as that
reward's error for the call instead of ending the run.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import math
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from ..algorithms.advantages import combine_rewards
from ..registry import REWARD_SPECS, declared_params

STANDARD_ARGS = {"prompts", "completions", "completion_ids"}


class RewardTimeout(Exception):
    """A reward call still running after ``reward_timeout`` seconds (abandoned)."""


@dataclass
class RewardFn:
    name: str
    fn: Callable
    weight: float = 1.0


def parse_reward_spec(spec: str, cfg=None) -> RewardFn:
    """``module:function[=weight]``, ``rm:PATH[=weight]``, ``judge:PATH[=weight]`` or
    ``pm4grpo[=weight]`` -> :class:`RewardFn`.

    The module is imported with the current directory on ``sys.path`` (and
    ``PYTHONPATH`` as usual). ``rm:PATH`` loads a local Hugging Face
    sequence-classification model as a reward model (``rewards/models.py``).
    ``judge:PATH`` / ``judge:self`` / ``judge:tiny`` asks a causal LM a yes/no
    question about each completion (``rewards/judge.py``); ``pm4grpo`` is the
    PM4GRPO process-conformance reward (``rewards/process.py``). ``cfg`` (the
    run's Config) supplies the ``judge_*`` / ``pm4grpo_*`` options and the
    policy that ``judge:self`` copies; without it the defaults apply.
    """
    name = spec.partition("=")[0]
    if name in REWARD_SPECS:  # rm:PATH, judge:PATH, pm4grpo, ...: built by the registered spec parser
        parse = REWARD_SPECS.get(name)
        opts = {k: getattr(cfg, k) for k in declared_params(parse) if cfg is not None and hasattr(cfg, k)}
        return parse(spec, cfg=cfg, **opts)
    target, _, weight = spec.partition("=")
    module_name, _, func_name = target.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"--reward '{spec}': expected module:function or module:function=weight "
                         f"(or rm:PATH, judge:PATH, pm4grpo)")
    try:
        w = float(weight) if weight else 1.0
    except ValueError:
        raise ValueError(f"--reward '{spec}': weight '{weight}' is not a number") from None
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--reward '{spec}': cannot import module '{module_name}' ({e}); "
                         f"it must be importable from the current directory or PYTHONPATH") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ValueError(f"--reward '{spec}': module '{module_name}' has no function '{func_name}'")
    return RewardFn(func_name, fn, w)


def check_signature(reward: RewardFn, columns: set[str], source: str = "the data") -> None:
    """Reject a reward function that asks for a parameter no data column provides."""
    sig = inspect.signature(reward.fn)
    for p in sig.parameters.values():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if p.name in STANDARD_ARGS or p.name in columns or p.default is not inspect.Parameter.empty:
            continue
        raise ValueError(
            f"reward function '{reward.name}' takes parameter '{p.name}', but {source} has no column "
            f"'{p.name}' (columns: {', '.join(sorted(columns)) or 'none'}; always passed: "
            f"{', '.join(sorted(STANDARD_ARGS))}). Add the column or give the parameter a default.")


class RewardScorer:
    """Runs every reward function over a batch of completions."""

    def __init__(self, rewards: list[RewardFn], log=print, timeout: float = 0.0):
        names = [r.name for r in rewards]
        self.names = [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]
        self.rewards = rewards
        self.weights = torch.tensor([r.weight for r in rewards], dtype=torch.float32)
        self.log = log
        if not (timeout >= 0 and math.isfinite(timeout)):
            raise ValueError(f"reward_timeout: must be a number of seconds >= 0 (0 = no limit), got {timeout}")
        self.timeout = float(timeout)

    def _call(self, name: str, fn: Callable, kwargs: dict):
        """``fn(**kwargs)`` on deep copies of the inputs, within ``timeout`` seconds when one is set."""
        kwargs = copy.deepcopy(kwargs)
        if self.timeout <= 0:
            return fn(**kwargs)
        box: dict = {}

        def target():
            try:
                box["value"] = fn(**kwargs)
            except BaseException as e:  # noqa: BLE001 - reported in the calling thread
                box["error"] = e

        worker = threading.Thread(target=target, name=f"reward:{name}", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            raise RewardTimeout(f"still running after reward_timeout={self.timeout:g} s; the call was abandoned "
                               f"(raise reward_timeout if it is just slow)")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def score_batch(self, batch) -> tuple[torch.Tensor, int]:
        """Score a RolloutBatch: its prompts, completions, completion token ids and data columns."""
        cols = {k: v for k, v in batch.columns.items() if k not in ("prompt", "completion")}
        ids = [row[:int(n)].tolist() for row, n in zip(batch.completion_ids, batch.completion_attention_mask.sum(-1))]
        return self.score(batch.columns["prompt"], batch.columns["completion"], ids, cols)

    def score(self, prompts: list, completions: list, completion_ids: list[list[int]],
              columns: dict[str, list]) -> tuple[torch.Tensor, int]:
        """Return ``(matrix [R, K] with NaN for unscorable, number of calls that raised)``."""
        R, errors = len(completions), 0
        matrix = torch.full((R, len(self.rewards)), float("nan"))
        for k, (name, r) in enumerate(zip(self.names, self.rewards)):
            try:
                values = self._call(name, r.fn, dict(prompts=prompts, completions=completions,
                                                     completion_ids=completion_ids, **columns))
                values = list(values)
                if len(values) != R:
                    raise ValueError(f"returned {len(values)} values for {R} completions")
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # a failing reward must not kill the run: SystemExit included
                errors += 1
                timed_out = isinstance(e, RewardTimeout)
                what = "timed out" if timed_out else f"raised {type(e).__name__}"
                self.log(f"[grpolab] reward function '{name}' {what}: {e}; its {R} rows are unscorable this step"
                         + ("" if timed_out else f"\n{traceback.format_exc(limit=2)}"))
                continue
            for i, v in enumerate(values):
                if v is None:
                    continue
                try:
                    f = float(v)
                except (TypeError, ValueError):
                    continue
                if math.isfinite(f):
                    matrix[i, k] = f
        return matrix, errors


class BatchScorer:
    """Scores a ``RolloutBatch`` and turns its reward matrix into one scalar reward per row.

    The single place of the scalar-reward formula: the weighted sum of the reward
    functions (NaN entries left out, :func:`~grpolab.algorithms.advantages.combine_rewards`),
    then each reward transform in order. Both the trainer and the rollout context
    (strategies, stages) score through one of these.
    """

    def __init__(self, rewards: RewardScorer, transforms=()):
        self.rewards = rewards
        self.transforms = list(transforms)  # called with the standard transform inputs (rewards, lengths, ...)

    @property
    def names(self) -> list[str]:
        return self.rewards.names

    @property
    def weights(self) -> torch.Tensor:
        return self.rewards.weights

    def score(self, batch) -> int:
        """Set ``batch.rewards`` ``[R, K]`` (NaN = unscorable) and ``batch.reward_names``; return the number
        of reward calls that raised."""
        batch.rewards, errors = self.rewards.score_batch(batch)
        batch.reward_names = list(self.names)
        return errors

    def scalar(self, batch, step: int = 0) -> torch.Tensor:
        """Scalar reward ``[R]`` of a scored batch: weighted sum of the reward functions, then the transforms."""
        scalar = combine_rewards(batch.rewards, self.weights)
        for tr in self.transforms:
            scalar = tr(rewards=scalar, lengths=batch.completion_attention_mask.sum(-1), truncated=batch.truncated,
                        group_ids=batch.group_ids, prompt_uids=batch.prompt_uids, reward_matrix=batch.rewards,
                        reward_names=batch.reward_names, batch=batch, step=step)
        return scalar
