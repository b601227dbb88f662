"""Reward functions and transforms from the seeds (variant catalogue II)."""
from __future__ import annotations
