"""Config fields for rollout budgets and budget-aware samplers (``sampling/budgets.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class BudgetParams:
    pass
