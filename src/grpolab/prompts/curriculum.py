"""A difficulty curriculum: easy rows first, harder ones unlocked as training proceeds (CRAFT-GUI, seed 000-19)."""
from __future__ import annotations

import math

import torch

from ..registry import SAMPLERS, param
from .uniform import require_rows


def _check_curriculum(cfg) -> None:
    from ..config import ConfigError
    if not 0 < float(cfg.curriculum_start) <= 1:
        raise ConfigError(f"curriculum_start: the share of the data unlocked at step 0, in (0, 1]; got "
                          f"{cfg.curriculum_start}")
    if int(cfg.curriculum_steps) < 0:
        raise ConfigError(f"curriculum_steps: steps until every row is unlocked, >= 0; got {cfg.curriculum_steps}")


def curriculum_order(difficulties: list, seed: int = 0) -> list[int]:
    """Row indices sorted by difficulty, easiest first; rows of equal difficulty in a random order drawn from
    ``seed`` (so a cut through one level takes a random part of it, not the data's first rows)."""
    g = torch.Generator().manual_seed(int(seed))
    tiebreak = torch.randperm(len(difficulties), generator=g).tolist()
    return sorted(range(len(difficulties)), key=lambda i: (float(difficulties[i]), tiebreak[i]))


def unlocked_count(num_rows: int, step: int, start: float, steps: int) -> int:
    """``m(t) = ceil(N · min(1, s₀ + (1 − s₀) · t / T))`` rows unlocked at step t (at least 1; all when T = 0)."""
    frac = 1.0 if steps <= 0 else min(1.0, start + (1.0 - start) * step / steps)
    return max(1, min(num_rows, math.ceil(num_rows * frac - 1e-9)))


@SAMPLERS.register("difficulty_curriculum", check=_check_curriculum,
                   columns=lambda cfg: (cfg.curriculum_column,))
class DifficultyCurriculumSampler:
    """CRAFT-GUI's difficulty curriculum for GRPO (Nong et al., 2025, *CRAFT-GUI: Curriculum-Reinforced Agent For
    GUI Tasks*, arXiv:2508.11360; seed 000-19), as a prompt sampler.

    The rows are sorted by their ``curriculum_column`` (a number per row, higher = harder; ties in a seeded random
    order: :func:`curriculum_order`). At training step t (the number of ``feedback`` calls so far) the easiest

        m(t) = ceil(N · min(1, s₀ + (1 − s₀) · t / T))          s₀ = curriculum_start, T = curriculum_steps

    rows are unlocked (a linear pacing function: a share s₀ at the start, everything after T steps), and
    ``next(k)`` returns k distinct unlocked rows drawn uniformly from the sampler's own generator (cycling through
    fresh permutations when k exceeds the pool). The order is the curriculum's "ordering by difficulty"; the
    weighting is implicit: a row of difficulty level d is drawn with probability 0 until its level is reached and
    then 1/m(t), so the easy rows are drawn most over the run. The generator and the step count are checkpointed.

    Provenance: reconstructed from the abstract — CRAFT-GUI (arXiv:2508.11360) "a curriculum learning framework based
    on GRPO that explicitly accounts for the varying difficulty across trajectories"; no authors' code found
    (searched the code and pages indexes by name and arXiv id: only paper pages). Our choices: difficulty is a
    data column (for the toy GUI task, the number of elements on the screen); a linear baby-steps pacing over
    the sorted data (share s₀ = 0.25 at step 0, all rows after T = 40 steps by default) with uniform draws
    from the unlocked pool; no accuracy gate. The paper's actual staging and weights are not in the abstract.
    Test: tests/test_vision_gui.py::test_curriculum_order_and_pool, tests/test_vision_gui.py::test_curriculum_state.
    """

    def __init__(self, num_rows: int, seed: int = 0, rows: list | None = None, *,
                 curriculum_column: str = param("difficulty", "difficulty_curriculum: the data column with each "
                                                "row's difficulty (a number, higher = harder)"),
                 curriculum_start: float = param(0.25, "difficulty_curriculum: share of the rows (the easiest) "
                                                 "unlocked at step 0"),
                 curriculum_steps: int = param(40, "difficulty_curriculum: steps after which every row is "
                                               "unlocked (linear pacing; 0 = all from the start)")):
        require_rows(num_rows)
        if rows is None or len(rows) != num_rows:
            raise ValueError("difficulty_curriculum: needs the data rows (their difficulty column)")
        missing = next((i for i, r in enumerate(rows) if r.get(curriculum_column) is None), None)
        if missing is not None:
            raise ValueError(f"difficulty_curriculum: row {missing} has no '{curriculum_column}' column (each row's "
                             f"difficulty; set curriculum_column)")
        if not 0 < float(curriculum_start) <= 1 or int(curriculum_steps) < 0:
            raise ValueError("difficulty_curriculum: need 0 < curriculum_start <= 1 and curriculum_steps >= 0")
        self.num_rows = num_rows
        self.difficulties = [float(r[curriculum_column]) for r in rows]
        self.order = curriculum_order(self.difficulties, seed)
        self.start, self.steps_total = float(curriculum_start), int(curriculum_steps)
        self.generator = torch.Generator().manual_seed(int(seed) + 1)
        self.steps = 0

    def pool(self, step: int | None = None) -> list[int]:
        """The unlocked rows at ``step`` (default: now), easiest first."""
        step = self.steps if step is None else int(step)
        return self.order[:unlocked_count(self.num_rows, step, self.start, self.steps_total)]

    def next(self, k: int) -> list[int]:
        pool = self.pool()
        out: list[int] = []
        while len(out) < k:
            perm = torch.randperm(len(pool), generator=self.generator).tolist()
            out.extend(pool[i] for i in perm[:k - len(out)])
        return out

    def feedback(self, **outcomes) -> None:
        self.steps += 1

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "steps": self.steps, "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        if state["num_rows"] != self.num_rows:
            raise ValueError(f"sampler state is for {state['num_rows']} rows, the data has {self.num_rows}")
        self.generator.set_state(state["generator"])
        self.steps = int(state["steps"])
