"""The catalogue: every built-in component, imported once so that its registry knows it.

Importing this module registers the algorithms, rewards, tasks, prompt samplers,
rollout strategies and stages (``grpolab/__init__.py`` does it, so any
``import grpolab...`` sees a full catalogue). Components registered from user
code join the same registries and are first-class: their declared parameters
are config keys of the runs that select them.
"""
from __future__ import annotations

import importlib
import pkgutil

from . import algorithms, prompts, rewards, rollouts, stages, tasks
from .registry import ALL_REGISTRIES

COMPONENT_PACKAGES = (algorithms, prompts, rewards, rollouts, stages, tasks)

# A new component is one new file: every module of the component packages is imported (and so registers
# what it defines) without an edit to the package's __init__.
for _pkg in COMPONENT_PACKAGES:
    for _mod in pkgutil.iter_modules(_pkg.__path__):
        importlib.import_module(f"{_pkg.__name__}.{_mod.name}")

__all__ = ["ALL_REGISTRIES", "COMPONENT_PACKAGES"]
