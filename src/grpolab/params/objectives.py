"""Config fields for policy objectives and regularisers."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class ObjectiveParams:
    pass
