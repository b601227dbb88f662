"""Built-in verifiable tasks.

A task supplies train and held-out rows (dicts with a ``prompt`` plus any
columns the reward functions read) and its reward functions. Splits are fixed
by seed and disjoint.

Names: the registered built-ins (``arithmetic``, ``arithmetic_multistep``,
``countdown``, ``repeat``) and ``rg:NAME`` for any dataset of the optional
`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ package
(``pip install 'grpolab[gym]'``; adapter in ``tasks/gym.py``). ``TASKS``
accepts the ``rg:`` prefix, so ``task: rg:chain_sum`` passes config validation.

Task options are config keys: a task function's *keyword-only* parameters
(e.g. ``arithmetic_levels``, ``rg_train_size``) are filled from the config
attribute of the same name when :func:`get_task` is given ``cfg`` (positional
parameters such as the built-ins' ``seed`` never read the training ``seed``).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from ..registry import Registry, UnknownComponentError

GYM_PREFIX = "rg:"


class TaskRegistry(Registry):
    """The task registry; also resolves ``rg:NAME`` (reasoning-gym datasets)."""

    def get(self, name: str):
        if isinstance(name, str) and name.startswith(GYM_PREFIX):
            from .gym import gym_task
            dataset = name[len(GYM_PREFIX):]

            def factory(**kwargs):
                return gym_task(dataset, **kwargs)
            factory.__signature__ = inspect.signature(gym_task).replace(
                parameters=[p for p in inspect.signature(gym_task).parameters.values() if p.name != "name"])
            return factory
        return super().get(name)

    def names(self) -> list[str]:
        return super().names() + [GYM_PREFIX + "NAME (reasoning-gym)"]

    def __contains__(self, name) -> bool:
        if isinstance(name, str) and name.startswith(GYM_PREFIX) and len(name) > len(GYM_PREFIX):
            return True  # the dataset name itself is checked (with close matches) when the task is built
        return super().__contains__(name)


TASKS: TaskRegistry = TaskRegistry("task")


@dataclass
class Task:
    name: str
    train_rows: list[dict]
    eval_rows: list[dict]
    rewards: list[tuple[str, Callable, float]]  # (name, function, weight)
    accuracy_reward: str | None = None  # reward whose value 1.0 means "correct"
    description: str = ""
    extra: dict = field(default_factory=dict)

    def texts(self) -> list[str]:
        """Every string the tiny model's tokenizer must cover."""
        out = []
        for row in self.train_rows + self.eval_rows:
            for v in row.values():
                if isinstance(v, str):
                    out.append(v)
                elif isinstance(v, list):
                    out.extend(m["content"] for m in v if isinstance(m, dict) and "content" in m)
        return out


def task_config_kwargs(factory: Callable, cfg) -> dict:
    """Keyword-only parameters of a task function that ``cfg`` has an attribute for."""
    out = {}
    if cfg is None:
        return out
    for p in inspect.signature(factory).parameters.values():
        if p.kind == p.KEYWORD_ONLY and hasattr(cfg, p.name):
            out[p.name] = getattr(cfg, p.name)
    return out


def get_task(name: str, cfg=None, **kwargs) -> Task:
    """Build task ``name``; ``cfg`` (a Config) fills the task's keyword-only options, ``kwargs`` win."""
    factory = TASKS.get(name)
    return factory(**{**task_config_kwargs(factory, cfg), **kwargs})


__all__ = ["TASKS", "Task", "get_task", "GYM_PREFIX", "UnknownComponentError"]

from . import arithmetic, repeat  # noqa: E402,F401  (register built-ins)
from . import countdown  # noqa: E402,F401
