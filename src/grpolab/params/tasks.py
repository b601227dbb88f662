"""Config fields for tasks, thinking-mode control, SFT and judge rewards."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class TaskParams:
    pass
