"""Config fields for baselines, normalisations, difficulty and multi-reward weightings."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class AdvantageParamsA:
    pass
