"""Config fields for rollout strategies (``rollout/strategies.py``): hints, injected references."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class RolloutParams:
    pass
