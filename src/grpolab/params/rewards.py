"""Config fields for reward functions and reward transforms."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class RewardParams:
    pass
