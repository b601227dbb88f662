"""Config fields for prompt samplers."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class SamplerParams:
    pass
