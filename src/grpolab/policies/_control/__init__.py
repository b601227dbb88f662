"""Shared code of the control policies (not a kind): ``envs.py`` builds and steps Gymnasium / PettingZoo
environments (seeded start states per row) and holds the one start-up check of the policies that act in
environments; ``maddpg.py`` MADDPG's formulas (TD targets, Polyak updates), shared by ``control``'s MADDPG update
and ``mardpg``."""
from __future__ import annotations

from ...registry import declare_capability

declare_capability("control", "actions are environment steps of Gymnasium / PettingZoo environments: "
                   "per-step observations, actions and rewards (step_data / row_data), episode "
                   "returns, learned critics over observations")
