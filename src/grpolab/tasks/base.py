"""A task: train and held-out rows plus reward functions; ``get_task`` builds a registered one."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..components import config_kwargs
from ..data import load_data
from ..errors import ConfigError
from ..registry import TASKS


@dataclass
class Task:
    name: str
    train_rows: list[dict]
    eval_rows: list[dict]
    rewards: list[tuple[str, Callable, float]]  # (name, function, weight)
    accuracy_reward: str | None = None  # reward whose value 1.0 means "correct"
    description: str = ""
    extra: dict = field(default_factory=dict)


def check_range(name: str, value, lo, hi) -> None:
    """``lo <= value <= hi``, else a ConfigError naming the task option ``name``, the range and the value."""
    if not lo <= value <= hi:
        raise ConfigError(f"{name}: expected {lo}..{hi}, got {value}")


def check_held_out(name: str, n_eval, n_rows: int) -> None:
    """``0 <= n_eval < n_rows`` (the held-out rows leave at least one training row), else a ConfigError naming
    the task option ``name``."""
    if not 0 <= n_eval < n_rows:
        raise ConfigError(f"{name}: expected 0..{n_rows - 1}, got {n_eval}")


def provides_environment(factory: Callable) -> Callable:
    """Mark a task function whose tasks carry ``extra["environment"]`` (agent tasks): naming the task selects
    the ``agent`` rollout strategy when no strategy is named (:func:`task_provides_environment`)."""
    factory.provides_environment = True
    return factory


def task_provides_environment(name) -> bool:
    """Whether the registered task ``name`` is marked with :func:`provides_environment` (False if unknown)."""
    if not isinstance(name, str) or name not in TASKS:
        return False
    return bool(getattr(TASKS.get(name), "provides_environment", False))


def task_config_kwargs(factory: Callable, cfg) -> dict:
    """Keyword-only parameters of a task function that ``cfg`` has a value for (none without a config)."""
    return {} if cfg is None else config_kwargs(factory, cfg, keyword_only=True)


def get_task(name: str, cfg=None, **kwargs) -> Task:
    """Build task ``name``; ``cfg`` (a Config) fills the task's keyword-only options, ``kwargs`` win."""
    factory = TASKS.get(name)
    _, rest = TASKS.split(name)
    args = (rest,) if rest is not None else ()
    return factory(*args, **{**task_config_kwargs(factory, cfg), **kwargs})


def add_rows_source(parser, data_help: str, task_help: str) -> None:
    """The required choice of a data-preparation command's input: ``--data FILE`` or ``--task NAME``
    (read by :func:`source_rows`)."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help=data_help)
    src.add_argument("--task", help=task_help)


def source_rows(args) -> list[dict]:
    """The rows :func:`add_rows_source`'s options name: a built-in task's training rows or a data file's."""
    if args.task:
        return list(get_task(args.task).train_rows)
    return list(load_data(args.data))
