"""Reward functions and their scoring: loading, validation and scoring into a ``[rows, K]`` matrix.

The contract is TRL's: a reward function is called as
``f(prompts=..., completions=..., completion_ids=..., **columns)`` and returns a
list with one number (or ``None`` = unscorable) per completion. Unscorable
entries become NaN and are left out of group statistics. Anything else is that
reward's error for the call (counted in ``reward_errors``, named in a warning):
a dict, set, string or single number instead of a list, a list of the wrong
length (no row scored), and NaN, infinities, ints too large for a float,
strings or other objects as values (those rows unscorable).

A reward function is the user's code and runs in the training process, but it
cannot corrupt the run (:meth:`RewardScorer.score`): each call gets its own deep
copies of the prompts, completions, ids and columns (editing them in place
changes nothing the trainer keeps); with ``reward_timeout`` > 0 (default 300 s)
a call runs in a worker thread and one still running after that many seconds is
abandoned (its rows are NaN for that step, counted in ``reward_errors``, with a
warning naming the function; Python cannot stop a thread, so a reward that never
returns keeps its thread); a call still running after ``SLOW_REWARD_S`` (60 s, or
half the timeout if sooner) is named on screen, with or without a timeout; and any exception it raises, ``SystemExit`` and other
``BaseException`` subclasses included (but not ``KeyboardInterrupt``), is reported as that
reward's error for the call instead of ending the run.
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import math
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..algorithms.advantages import combine_rewards
from ..config import Config
from ..errors import warn_line
from ..registry import REWARD_SPECS, declared_params

STANDARD_ARGS = {"prompts", "completions", "completion_ids"}


# a reward call still running after this many seconds (or half of reward_timeout, if sooner) is named on screen
SLOW_REWARD_S = 60.0


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
    w = spec_weight(spec, weight)
    module = import_reward_module(module_name, spec)
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ValueError(f"--reward '{spec}': module '{module_name}' has no function '{func_name}'")
    return RewardFn(func_name, fn, w)


def import_reward_module(module_name: str, spec: str):
    """The module of a ``--reward`` spec: a module name importable from the current directory or PYTHONPATH
    (``my_rewards``, ``pkg.rewards``), or a path to a Python file (``./my_rewards``, ``dir/my_rewards.py``).
    Any failure is one line naming the cause."""
    is_path = "/" in module_name or "\\" in module_name or module_name.endswith(".py") or module_name.startswith(".")
    try:
        if is_path:
            path = Path(module_name)
            if path.suffix != ".py":
                path = path.with_name(path.name + ".py")
            if not path.is_file():
                shown = module_name if module_name.endswith(".py") else module_name + ".py"
                raise ValueError(f"--reward '{spec}': no Python file {shown}; give module:function with a module "
                                 f"importable from the current directory (my_rewards:correct) or the path of a .py "
                                 f"file (./my_rewards.py:correct)")
            name = f"grpolab_user_reward_{path.stem}"
            loader_spec = importlib.util.spec_from_file_location(name, path.resolve())
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
            return module
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(module_name)
    except ValueError as e:
        if str(e).startswith("--reward"):
            raise
        raise ValueError(_import_failure(spec, module_name, e)) from None
    except ModuleNotFoundError as e:
        if e.name and module_name.split(".")[0] == e.name.split(".")[0]:
            raise ValueError(f"--reward '{spec}': cannot import module '{module_name}' ({e}); it must be importable "
                             f"from the current directory or PYTHONPATH, or give a file path "
                             f"(./{module_name.replace('.', '/')}.py:function)") from None
        raise ValueError(_import_failure(spec, module_name, e)) from None
    except Exception as e:  # the user's module raised while importing
        raise ValueError(_import_failure(spec, module_name, e)) from None


def _import_failure(spec: str, module_name: str, e: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
    at = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    if isinstance(e, SyntaxError) and e.filename:
        at = f" ({e.filename}, line {e.lineno})"
    return (f"--reward '{spec}': importing module '{module_name}' failed: {type(e).__name__}: "
            f"{getattr(e, 'msg', None) if isinstance(e, SyntaxError) else e}{at}; fix the module "
            f"(python -c 'import {Path(module_name).stem}' shows the full traceback)")


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

    def __init__(self, rewards: list[RewardFn], log=None, timeout: float | None = None):
        names = [r.name for r in rewards]
        self.names = [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]
        self.rewards = rewards
        self.weights = torch.tensor([r.weight for r in rewards], dtype=torch.float32)
        self.log = log or warn_line  # stderr, never stdout (eval prints JSON); on its own line under a bar
        if timeout is None:  # the core key's default (config.py), written once
            timeout = Config.__dataclass_fields__["reward_timeout"].default
        if not (timeout >= 0 and math.isfinite(timeout)):
            raise ValueError(f"reward_timeout: must be a number of seconds >= 0 (0 = no limit), got {timeout}")
        self.timeout = float(timeout)

    def _slow(self, name: str, after: float) -> None:
        """Name on screen a call that is still running after ``after`` seconds (once per call)."""
        end = (f"it is abandoned at reward_timeout={self.timeout:g} s" if self.timeout > 0 else
               "reward_timeout=0: no limit, the run waits for it")
        self.log(f"[grpolab] reward function '{name}' still running after {after:g} s ({end}); a reward that "
                 f"waits on a network service, a lock or a subprocess may never return")

    def _call(self, name: str, fn: Callable, kwargs: dict):
        """``fn(**kwargs)`` on deep copies of the inputs, within ``timeout`` seconds when one is set."""
        kwargs = copy.deepcopy(kwargs)
        slow_after = SLOW_REWARD_S if self.timeout <= 0 else min(SLOW_REWARD_S, self.timeout / 2)
        if self.timeout <= 0:  # in this thread; a timer names it on screen if it is slow
            timer = threading.Timer(slow_after, self._slow, args=(name, slow_after))
            timer.daemon = True
            timer.start()
            try:
                return fn(**kwargs)
            finally:
                timer.cancel()
        box: dict = {}

        def target():
            try:
                box["value"] = fn(**kwargs)
            except BaseException as e:  # noqa: BLE001 - reported in the calling thread
                box["error"] = e

        worker = threading.Thread(target=target, name=f"reward:{name}", daemon=True)
        worker.start()
        worker.join(slow_after)
        if worker.is_alive():
            self._slow(name, slow_after)
            worker.join(self.timeout - slow_after)
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
        """Return ``(matrix [R, K] with NaN for unscorable, number of calls that failed)``.

        A call fails when it raises or times out, when it returns anything but one value per completion
        (:func:`reward_values`), or when some of its values are not finite numbers (:func:`reward_number`:
        NaN, infinities, huge ints, strings, ...). The rows a call could not score are NaN, and the warning
        names the function."""
        R, errors = len(completions), 0
        matrix = torch.full((R, len(self.rewards)), float("nan"))
        for k, (name, r) in enumerate(zip(self.names, self.rewards)):
            try:
                values = self._call(name, r.fn, dict(prompts=prompts, completions=completions,
                                                     completion_ids=completion_ids, **columns))
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # a failing reward must not kill the run: SystemExit included
                errors += 1
                timed_out = isinstance(e, RewardTimeout)
                what = "timed out" if timed_out else f"raised {type(e).__name__}"
                self.log(f"[grpolab] reward function '{name}' {what}: {e}; its {R} rows are unscorable this step"
                         + ("" if timed_out else f"\n{traceback.format_exc(limit=2)}"))
                continue
            values, problem = reward_values(values, R)
            if problem is not None:  # not one number per completion: the whole call is the reward's error
                errors += 1
                self.log(f"[grpolab] reward function '{name}' {problem}; it must return a list with one number "
                         f"(or None = unscorable) per completion, in order; its {R} rows are unscorable this step")
                continue
            bad = []
            for i, v in enumerate(values):
                f, why = reward_number(v)
                if why is None:
                    matrix[i, k] = f
                elif why:  # None needs no word: it is the documented "unscorable"
                    bad.append((i, why))
            if bad:  # the rows it could not score are NaN; the call counts once in reward_errors
                errors += 1
                i, why = bad[0]
                more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                self.log(f"[grpolab] reward function '{name}' returned {why} for completion {i + 1}{more}; return "
                         f"a finite number, or None for a completion it cannot score; such rows are unscorable "
                         f"this step and the call counts in reward_errors")
        return matrix, errors


def reward_values(raw, rows: int) -> tuple[list, str | None]:
    """``(values, None)`` when a reward function returned one value per completion as TRL reads it (a list or
    tuple, a 1-D NumPy array or tensor), else ``([], why)``: a dict, a set, a string, a generator or a single
    number is not a list of scores, even where iterating it would give ``rows`` items (a dict's keys)."""
    if isinstance(raw, np.ndarray) or isinstance(raw, torch.Tensor):
        if raw.ndim != 1:
            return [], f"returned a {raw.ndim}-D {type(raw).__name__} of shape {tuple(raw.shape)}"
        raw = list(raw)
    if not isinstance(raw, (list, tuple)):
        return [], f"returned {_a(type(raw).__name__)}"
    if len(raw) != rows:
        return [], f"returned {len(raw)} values for {rows} completions"
    return list(raw), None


def reward_number(v) -> tuple[float, str | None]:
    """One value a reward function returned for one completion: ``(number, None)`` when it is a finite number
    (int, float, bool, a NumPy number, a one-element tensor); ``(nan, "")`` for None (unscorable, TRL's
    contract); ``(nan, why)`` for anything else: NaN and infinities, an int too large for a float, a string
    (never parsed: "1.0" is a bug in the reward, not a score), any other object."""
    if v is None:
        return math.nan, ""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or v.dtype.is_complex:
            return math.nan, f"a tensor of shape {tuple(v.shape)}"
        v = v.item()
    if isinstance(v, np.generic) and v.dtype.kind in "biuf":
        v = v.item()
    if not isinstance(v, (bool, int, float)):
        return math.nan, f"{str(v)[:30]!r} ({type(v).__name__})"
    try:
        f = float(v)
    except OverflowError:
        return math.nan, f"an int too large for a float ({len(str(v))} digits)"
    if not math.isfinite(f):
        return math.nan, f"{f} (NaN is not a score: return None for a completion it cannot score)" \
            if math.isnan(f) else f"{f}"
    return f, None


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


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


def spec_weight(spec: str, weight: str) -> float:
    """The weight of reward spec ``spec`` from its text ``weight`` after the ``=`` (1 when there is none); one that
    is not a finite number is an error."""
    try:
        w = float(weight) if weight else 1.0
    except ValueError:
        raise ValueError(f"--reward '{spec}': weight '{weight}' is not a number") from None
    if not math.isfinite(w):
        raise ValueError(f"--reward '{spec}': weight '{weight}' is not a finite number; give a real number")
    return w


def spec_target_and_weight(spec: str, prefix: str) -> tuple[str, float]:
    """``PREFIX:TARGET`` or ``PREFIX:TARGET=WEIGHT`` (a reward spec such as ``rm:PATH=0.5``) -> ``(TARGET, WEIGHT)``.

    The weight is the text after the last ``=`` when it reads as a number (so a path may itself contain ``=``);
    otherwise the whole rest is the target and the weight 1. A weight that is not finite is an error."""
    body = spec[len(prefix):]
    head, sep, tail = body.rpartition("=")
    if not sep:
        return body, 1.0
    try:
        weight = float(tail)
    except ValueError:
        return body, 1.0
    if not math.isfinite(weight):
        raise ValueError(f"--reward '{spec}': the weight '{tail}' is not a finite number")
    return head, weight


def scorer_spec(spec: str, name: str, scorer, expected: str, cfg, opts: dict) -> RewardFn:
    """The RewardFn ``name`` of the spec ``NAME:TARGET[=weight]`` (:func:`spec_target_and_weight`), scoring with
    ``scorer(TARGET, cfg=cfg, **opts)``; an empty TARGET is a ValueError ``--reward '<spec>': expected
    <expected>``."""
    target, weight = spec_target_and_weight(spec, f"{name}:")
    if not target:
        raise ValueError(f"--reward '{spec}': expected {expected}")
    return RewardFn(name, scorer(target, cfg=cfg, **opts), weight)
