"""``tsp``: random Euclidean TSP instances with an expert tour each, for policy ``bq_nco`` (seed 000-97).

An instance is ``tsp_nodes`` points uniform in the unit square, drawn from ``tsp_seed`` (train) and
``tsp_seed + 10000`` (held-out), rounded to 6 decimals. Each row stores the expert tour, computed once when the
task is built (OR-Tools, control/bq_nco.py ``ortools_tsp``: cheapest-arc first solution then greedy-descent
local search, deterministic), and its length::

    {"prompt": "tsp10 #3", "coords": [[x, y], ...], "expert_tour": [0, 7, ...], "expert_length": 2.83}

A completion (policy ``bq_nco``) is a tour: the list of node ids from node 0. Rewards:

* ``neg_tour_length`` (weight 1): ``-L(tour)``, the closed tour's Euclidean length, negated;
* ``tour_gap_pct`` (logged): ``100 (L - L_expert) / L_expert``, the optimality gap against the expert (the
  authors' ``get_opt_gap``; negative when the policy beats the expert);
* ``tour_matches_expert`` (the accuracy): 1.0 when ``L <= L_expert (1 + 1e-6)``.

An invalid tour (not a permutation of the nodes) is unscorable (None).
"""
from __future__ import annotations

from functools import lru_cache

from ..control.bq_nco import check_tsp_nodes, ortools_tsp, random_instances, tour_length
from ..errors import ConfigError
from ..registry import TASKS, param
from .base import Task

EVAL_SEED_OFFSET = 10_000
MATCH_TOLERANCE = 1e-6


def _tours(reward: str, completions, coords) -> list:
    if completions is None:
        raise ValueError(f"reward '{reward}': no completions given (expected tours, lists of node ids)")
    if coords is None or len(coords) != len(completions):
        raise ValueError(f"reward '{reward}' needs the data column 'coords' (task tsp), one per completion")
    out = []
    for t, c in zip(completions, coords):
        n = len(c)
        try:
            ok = sorted(int(v) for v in t) == list(range(n))
        except (TypeError, ValueError):
            ok = False
        out.append([int(v) for v in t] if ok else None)
    return out


def _expert(reward: str, expert_length, n: int) -> list[float]:
    if expert_length is None or len(expert_length) != n:
        raise ValueError(f"reward '{reward}' needs the data column 'expert_length' (task tsp), one per completion")
    return [float(v) for v in expert_length]


def neg_tour_length(prompts=None, completions=None, *, coords=None, **kwargs) -> list:
    """``-L(tour)``: minus the closed tour's Euclidean length (None for a tour that is not a permutation).

    Source: [paper] — BQ-NCO (arXiv:2301.03313, seed 000-97): the TSP objective, as a reward to maximise.
    """
    tours = _tours("neg_tour_length", completions, coords)
    return [None if t is None else -tour_length(c, t) for t, c in zip(tours, coords)]


def tour_gap_pct(prompts=None, completions=None, *, coords=None, expert_length=None, **kwargs) -> list:
    """``100 (L - L_expert) / L_expert`` (percent). Source: [authors' code] — naver/bq-nco utils/misc.py
    get_opt_gap."""
    tours = _tours("tour_gap_pct", completions, coords)
    best = _expert("tour_gap_pct", expert_length, len(tours))
    return [None if t is None else 100.0 * (tour_length(c, t) - b) / b for t, c, b in zip(tours, coords, best)]


def tour_matches_expert(prompts=None, completions=None, *, coords=None, expert_length=None, **kwargs) -> list:
    """1.0 when ``L <= L_expert (1 + 1e-6)``, else 0.0. Source: [ours]."""
    tours = _tours("tour_matches_expert", completions, coords)
    best = _expert("tour_matches_expert", expert_length, len(tours))
    return [None if t is None else float(tour_length(c, t) <= b * (1 + MATCH_TOLERANCE))
            for t, c, b in zip(tours, coords, best)]


@lru_cache(maxsize=16)
def _solved(n: int, nodes: int, seed: int) -> tuple:
    """``n`` instances of ``seed`` with their expert tours (computed once per process)."""
    out = []
    for c in random_instances(n, nodes, seed):
        tour = ortools_tsp(c)
        out.append((c.tolist(), tuple(tour), tour_length(c, tour)))
    return tuple(out)


def tsp_rows(n: int, nodes: int, seed: int, first: int = 0) -> list[dict]:
    return [{"prompt": f"tsp{nodes} #{first + i}", "coords": [list(p) for p in c], "expert_tour": list(t),
             "expert_length": round(L, 9)} for i, (c, t, L) in enumerate(_solved(n, nodes, seed))]


@TASKS.register("tsp")
def tsp(*, tsp_nodes: int = param(10, "tsp: nodes per instance (points in the unit square)"),
        tsp_instances: int = param(128, "tsp: train instances (the expert tour of each is computed once, "
                                   "OR-Tools, about 10 ms each at 10 nodes)"),
        tsp_eval_instances: int = param(32, "tsp: held-out instances"),
        tsp_seed: int = param(0, "tsp: seed of the instances (held-out: tsp_seed + 10000)")) -> Task:
    """Random Euclidean TSP instances with OR-Tools expert tours; reward ``neg_tour_length``, logged
    ``tour_gap_pct``, accuracy ``tour_matches_expert`` (module docstring). For policy ``bq_nco``.

    Provenance: authors' code — https://github.com/naver/bq-nco data/prepare_tsp_dataset.py (instances uniform
    in the unit square, an expert solution per instance, the optimality gap of learning/tsp/traj_learner.py);
    read, not copied. Our choices: OR-Tools' routing solver (cheapest arc + greedy descent) instead of
    Concorde, so the expert is a local optimum (equal to the exact optimum on 20 of 20 random 8-node
    instances and 46 of 50 10-node ones, worst gap 7.4%, measured against Held-Karp); small instances
    (10 nodes by default; the paper trains on 100). Test: tests/test_bq_nco.py::test_rewards_hand_computed,
    tests/test_bq_nco.py::test_expert_tour_is_the_dp_optimum_on_small_instances.
    """
    nodes = check_tsp_nodes(tsp_nodes, "tsp_nodes")
    if tsp_instances < 1 or tsp_eval_instances < 0:
        raise ConfigError(f"tsp_instances >= 1 and tsp_eval_instances >= 0, got {tsp_instances}, "
                          f"{tsp_eval_instances}")
    train = tsp_rows(int(tsp_instances), nodes, int(tsp_seed))
    held = tsp_rows(int(tsp_eval_instances), nodes, int(tsp_seed) + EVAL_SEED_OFFSET, first=int(tsp_instances)) \
        if tsp_eval_instances else []
    return Task("tsp", train, held,
                rewards=[("neg_tour_length", neg_tour_length, 1.0), ("tour_gap_pct", tour_gap_pct, 0.0),
                         ("tour_matches_expert", tour_matches_expert, 0.0)],
                accuracy_reward="tour_matches_expert",
                description=f"random Euclidean TSP-{nodes} instances with OR-Tools expert tours", extra={})


__all__ = ["tsp", "neg_tour_length", "tour_gap_pct", "tour_matches_expert", "tsp_rows"]
