"""Advantage weightings: ``advantages -> advantages``, applied after the estimator.

Signature: ``fn(advantages, **inputs, *, params) -> Tensor`` with ``[R]`` or
``[R, T]`` advantages; inputs are resolved by name (see ``components.py``).
Listed in the config as ``advantage_weightings: [name, ...]``, applied in order.
"""
from __future__ import annotations

from ..registry import WEIGHTINGS

