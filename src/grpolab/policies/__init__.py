"""Policies: the model being trained and how it acts (``POLICIES``, config key ``policy``).

``base.py`` names what the pipeline needs from a policy and the capabilities a component may require;
``causal_lm.py`` is the causal language model every text recipe trains (the default).
"""
from __future__ import annotations

from ..registry import POLICIES
from .base import CAPABILITIES, PolicyBase

__all__ = ["CAPABILITIES", "POLICIES", "PolicyBase"]
