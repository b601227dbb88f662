"""The catalogue: every built-in component, imported once so that its registry knows it.

Importing this module registers the algorithms, rewards, tasks, prompt samplers,
rollout strategies and stages (``grpolab/__init__.py`` does it, so any
``import grpolab...`` sees a full catalogue). Components registered from user
code join the same registries and are first-class: their declared parameters
are config keys of the runs that select them.
"""
from __future__ import annotations

from . import algorithms, prompts, rewards, rollouts, stages, tasks  # noqa: F401  (register the built-ins)
from .registry import ALL_REGISTRIES

__all__ = ["ALL_REGISTRIES"]
