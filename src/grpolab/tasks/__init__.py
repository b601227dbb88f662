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

from ..registry import TASKS, UnknownComponentError
from .base import Task, get_task
from .gym import GYM_PREFIX

__all__ = ["TASKS", "Task", "get_task", "GYM_PREFIX", "UnknownComponentError"]
