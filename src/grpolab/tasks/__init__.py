"""Built-in verifiable tasks.

A task supplies train and held-out rows (dicts with a ``prompt`` plus any
columns the reward functions read) and its reward functions. Splits are fixed
by seed and disjoint.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..registry import Registry

TASKS: Registry = Registry("task")


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


def get_task(name: str, **kwargs) -> Task:
    return TASKS.get(name)(**kwargs)


from . import arithmetic, repeat  # noqa: E402,F401  (register built-ins)
from . import countdown  # noqa: E402,F401
