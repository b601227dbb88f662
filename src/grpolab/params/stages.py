"""Config fields for batch stages and update strategies (``stages/``): pruning, replay, SFPO."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class StageParams:
    pass
