"""Config fields for uncertainty, entropy, token-level, stateful and span-decoupled advantages."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class AdvantageParamsB:
    pass
