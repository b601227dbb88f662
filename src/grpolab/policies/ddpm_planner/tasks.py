"""``toy_planner``: 2-D start/goal scenes with one disc obstacle, for the multi-head diffusion planner (seed 000-55).

A scene: start s = (−1, U(−½, ½)), goal g = (1, U(−½, ½)), one disc obstacle with centre o ∈ U(−0.4, 0.4)² and
radius ρ ∈ U(0.1, 0.3) (drawn with the task's ``seed``). The task makes **one row per (scene, head)**, so a group
(the G samples of one row) holds one strategy head's trajectories of one scene:
``{"prompt": "scene 3 head 1", "start": [x, y], "goal": [x, y], "obstacle": [cx, cy, r], "head": 1}``; held-out
rows add ``noise_seed`` (the evaluation sampler's fixed initial noise). A completion (policy ``ddpm_planner``) is
the absolute waypoints p_1..p_8 as a float32 NumPy array ``[8, 2]``; p_0 = s.

Rewards (û = (g − s)/|g − s|; Δ_k = p_k − p_{k−1}):

* ``planner_strategy`` (weight 1): the row's head picks its reward, head 0 ``planner_fast``, head 1
  ``planner_safe`` (a head beyond 1 is unscorable: None);
* ``planner_fast`` (aggressive): progress per step along the start→goal direction, (1/8)·Σ_k Δ_k·û
  = ((p_8 − s)·û)/8 (the demonstrations make |g − s|/8);
* ``planner_safe`` (conservative): clearance + smoothness, min(min_k |p_k − o| − ρ, 0.25)
  − 10·mean_{k=1..7} |Δ_{k+1} − Δ_k|²;
* ``planner_speed`` (logged): the mean step length (1/8)·Σ_k |Δ_k|;
* ``planner_reached`` (the accuracy, logged): 1 when |p_8 − g| < 0.2 and no waypoint is inside the obstacle.
"""
from __future__ import annotations

import random

import numpy as np

from ...registry import TASKS

from ...tasks.base import Task

WAYPOINTS = 8
HEADS = ("fast", "safe")
CLEARANCE_CAP = 0.25
SMOOTHNESS_WEIGHT = 10.0
REACH_RADIUS = 0.2
_TRAJ = "a float32 NumPy array [8, 2] (the absolute waypoints p_1..p_8)"


def _points(reward: str, completions) -> list[np.ndarray]:
    if completions is None:
        raise ValueError(f"reward '{reward}': no completions given (expected a list of {_TRAJ})")
    out = []
    for c in completions:
        if hasattr(c, "detach"):
            c = c.detach().cpu().numpy()
        if not (isinstance(c, np.ndarray) and c.shape == (WAYPOINTS, 2) and np.issubdtype(c.dtype, np.floating)):
            raise ValueError(f"reward '{reward}' scores trajectories: each completion must be {_TRAJ}, as policy "
                             f"ddpm_planner passes them; got {type(c).__name__} {getattr(c, 'shape', '')}")
        out.append(c.astype(np.float64))
    return out


def _column(reward: str, name: str, value, n: int, size: int) -> list[np.ndarray]:
    if value is None or len(value) != n:
        raise ValueError(f"reward '{reward}' needs the data column '{name}' (task toy_planner), one per completion")
    out = [np.asarray(v, dtype=np.float64) for v in value]
    if any(v.shape != (size,) for v in out):
        raise ValueError(f"reward '{reward}': column '{name}' holds {size} numbers per row")
    return out


def progress_per_step(p: np.ndarray, s: np.ndarray, g: np.ndarray) -> float:
    u = (g - s) / max(float(np.linalg.norm(g - s)), 1e-9)
    return float((p[-1] - s) @ u) / WAYPOINTS


def clearance(p: np.ndarray, obstacle: np.ndarray) -> float:
    """min_k |p_k − o| − ρ (negative inside the disc)."""
    return float(np.min(np.linalg.norm(p - obstacle[:2], axis=-1)) - obstacle[2])


def smoothness(p: np.ndarray, s: np.ndarray) -> float:
    """−mean_{k=1..7} |Δ_{k+1} − Δ_k|² with Δ_k = p_k − p_{k−1}, p_0 = s."""
    d = np.diff(np.vstack([s, p]), axis=0)  # Δ_1..Δ_8
    return -float(np.mean(np.sum(np.diff(d, axis=0) ** 2, -1)))


def planner_fast(prompts=None, completions=None, *, start, goal, **kwargs) -> list[float]:
    """Progress per step: r = ((p_8 − s)·û)/8, û = (g − s)/|g − s| (module docstring).

    Source: [ours] — the "aggressive" strategy of seed 000-55 (arXiv:2508.16947) as a speed reward.
    """
    P = _points("planner_fast", completions)
    S, G = _column("planner_fast", "start", start, len(P), 2), _column("planner_fast", "goal", goal, len(P), 2)
    return [progress_per_step(p, s, g) for p, s, g in zip(P, S, G)]


def planner_safe(prompts=None, completions=None, *, start, obstacle, **kwargs) -> list[float]:
    """Clearance + smoothness: r = min(min_k |p_k − o| − ρ, 0.25) − 10·mean_k |Δ_{k+1} − Δ_k|².

    Source: [ours] — the "conservative" strategy of seed 000-55 (arXiv:2508.16947).
    """
    P = _points("planner_safe", completions)
    S = _column("planner_safe", "start", start, len(P), 2)
    O = _column("planner_safe", "obstacle", obstacle, len(P), 3)
    return [min(clearance(p, o), CLEARANCE_CAP) + SMOOTHNESS_WEIGHT * smoothness(p, s) for p, s, o in zip(P, S, O)]


def planner_strategy(prompts=None, completions=None, *, head, start, goal, obstacle, **kwargs) -> list:
    """The row's head's reward: head 0 → :func:`planner_fast`, head 1 → :func:`planner_safe` (other heads: None).

    Source: [ours] — seed 000-55's head-specific rewards.
    """
    fast = planner_fast(prompts, completions, start=start, goal=goal)
    safe = planner_safe(prompts, completions, start=start, obstacle=obstacle)
    if head is None or len(head) != len(fast):
        raise ValueError("reward 'planner_strategy' needs the data column 'head' (0 fast, 1 safe), one per row")
    return [f if int(h) == 0 else s if int(h) == 1 else None for h, f, s in zip(head, fast, safe)]


def planner_speed(prompts=None, completions=None, *, start, **kwargs) -> list[float]:
    """Mean step length (1/8)·Σ_k |p_k − p_{k−1}|, p_0 = s. Source: [ours]."""
    P = _points("planner_speed", completions)
    S = _column("planner_speed", "start", start, len(P), 2)
    return [float(np.mean(np.linalg.norm(np.diff(np.vstack([s, p]), axis=0), axis=-1))) for p, s in zip(P, S)]


def planner_reached(prompts=None, completions=None, *, goal, obstacle, **kwargs) -> list[float]:
    """1.0 when |p_8 − g| < 0.2 and every waypoint is outside the obstacle. Source: [ours]."""
    P = _points("planner_reached", completions)
    G = _column("planner_reached", "goal", goal, len(P), 2)
    O = _column("planner_reached", "obstacle", obstacle, len(P), 3)
    return [float(np.linalg.norm(p[-1] - g) < REACH_RADIUS and clearance(p, o) > 0) for p, g, o in zip(P, G, O)]


def scenes(n: int, seed: int) -> list[dict]:
    """``n`` scenes (start, goal, obstacle) drawn with ``seed`` (module docstring's distribution), rounded to 4
    decimals."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        out.append({"start": [-1.0, round(rng.uniform(-0.5, 0.5), 4)], "goal": [1.0, round(rng.uniform(-0.5, 0.5), 4)],
                    "obstacle": [round(rng.uniform(-0.4, 0.4), 4), round(rng.uniform(-0.4, 0.4), 4),
                                 round(rng.uniform(0.1, 0.3), 4)]})
    return out


def planner_rows(n_scenes: int, seed: int, heads: int = len(HEADS), noise: bool = False, first: int = 0) -> list[dict]:
    rows = []
    for i, sc in enumerate(scenes(n_scenes, seed)):
        for h in range(heads):
            row = {"prompt": f"scene {first + i} head {h}", **sc, "head": h}
            if noise:
                row["noise_seed"] = first + i
            rows.append(row)
    return rows


@TASKS.register("toy_planner")
def toy_planner(n_scenes: int = 32, seed: int = 0, n_eval_scenes: int = 8) -> Task:
    """2-D planning scenes with one disc obstacle, one row per (scene, head): reward ``planner_strategy`` (head 0
    ``planner_fast``, head 1 ``planner_safe``), logged ``planner_fast``, ``planner_safe``, ``planner_speed``,
    accuracy ``planner_reached`` (module docstring). For policy ``ddpm_planner``.

    Provenance: grpolab's own — a toy stand-in for the nuPlan scenes of the multi-head diffusion planner (Ding et
    al., arXiv:2508.16947, seed 000-55): start, goal, one obstacle, strategy-specific rewards per head.
    """
    if n_scenes < 1 or n_eval_scenes < 0:
        raise ValueError(f"toy_planner: n_scenes >= 1 and n_eval_scenes >= 0, got {n_scenes}, {n_eval_scenes}")
    train = planner_rows(n_scenes, seed)
    random.Random(seed).shuffle(train)
    held = planner_rows(n_eval_scenes, seed + 10_000, noise=True, first=n_scenes)
    return Task("toy_planner", train, held,
                rewards=[("planner_strategy", planner_strategy, 1.0), ("planner_fast", planner_fast, 0.0),
                         ("planner_safe", planner_safe, 0.0), ("planner_speed", planner_speed, 0.0),
                         ("planner_reached", planner_reached, 0.0)],
                accuracy_reward="planner_reached",
                description="2-D start/goal scenes with a disc obstacle; head 0 fast, head 1 safe", extra={})
