"""``tsp`` and ``cvrp``: random routing instances with an expert solution each, for policy ``bq_nco`` (seed 000-97).

An instance is ``tsp_nodes`` points uniform in the unit square, drawn from ``tsp_seed`` (train) and
``tsp_seed + 10000`` (held-out), rounded to 6 decimals. Each row stores the expert tour, computed once when the
task is built (OR-Tools, policies/bq_nco/model.py ``ortools_tsp``: cheapest-arc first solution then greedy-descent
local search, deterministic), and its length::

    {"prompt": "tsp10 #3", "coords": [[x, y], ...], "expert_tour": [0, 7, ...], "expert_length": 2.83}

A completion (policy ``bq_nco``) is a tour: the list of node ids from node 0. Rewards:

* ``neg_tour_length`` (weight 1): ``-L(tour)``, the closed tour's Euclidean length, negated;
* ``tour_gap_pct`` (logged): ``100 (L - L_expert) / L_expert``, the optimality gap against the expert (the
  authors' ``get_opt_gap``; negative when the policy beats the expert);
* ``tour_matches_expert`` (the accuracy): 1.0 when ``L <= L_expert (1 + 1e-6)``.

An invalid tour (not a permutation of the nodes) is unscorable (None). Task ``cvrp`` (function :func:`cvrp`)
has the same rewards on route sequences ``[0, c.., 0, c.., 0]`` (invalid: a customer missed or repeated, or a
route over the capacity).
"""
from __future__ import annotations

from functools import lru_cache

from .model import (check_tsp_nodes, cvrp_feasible, cvrp_length, ortools_cvrp, ortools_tsp,
                              random_cvrp_instances, random_instances, tour_length)
from ...errors import ConfigError
from ...registry import TASKS, param
from ...tasks.base import Task

EVAL_SEED_OFFSET = 10_000
MATCH_TOLERANCE = 1e-6


def _lengths(reward: str, completions, coords, demands=None, capacity=None) -> list:
    """The length of each completion, None for one that is no solution: a TSP tour (a permutation of the
    nodes), or with ``demands`` a CVRP route sequence ``[0, c.., 0, c.., 0]`` serving every customer once within
    the capacity."""
    if completions is None:
        raise ValueError(f"reward '{reward}': no completions given (expected tours, lists of node ids)")
    if coords is None or len(coords) != len(completions):
        raise ValueError(f"reward '{reward}' needs the data column 'coords' (task tsp / cvrp), one per completion")
    cvrp = demands is not None
    if cvrp and (len(demands) != len(completions) or capacity is None or len(capacity) != len(completions)):
        raise ValueError(f"reward '{reward}': CVRP rows need the columns 'demands' and 'capacity', one per completion")
    out = []
    for i, (t, c) in enumerate(zip(completions, coords)):
        try:
            t = [int(v) for v in t]
        except (TypeError, ValueError):
            out.append(None)
            continue
        if cvrp:
            routes, cur = [], []
            for v in t[1:]:
                if v == 0:
                    routes, cur = routes + [cur] if cur else routes, []
                else:
                    cur.append(v)
            ok = len(t) >= 2 and t[0] == 0 and t[-1] == 0 and cvrp_feasible(demands[i], int(capacity[i]), routes)
            out.append(cvrp_length(c, routes) if ok else None)
        else:
            out.append(tour_length(c, t) if sorted(t) == list(range(len(c))) else None)
    return out


def _expert(reward: str, expert_length, n: int) -> list[float]:
    if expert_length is None or len(expert_length) != n:
        raise ValueError(f"reward '{reward}' needs the data column 'expert_length' (task tsp / cvrp), one per "
                         f"completion")
    return [float(v) for v in expert_length]


def neg_tour_length(prompts=None, completions=None, *, coords=None, demands=None, capacity=None, **kwargs) -> list:
    """``-L``: minus the closed tour's (CVRP: the routes') Euclidean length; None for a completion that is not a
    solution.

    Source: [paper] — BQ-NCO (arXiv:2301.03313, seed 000-97): the TSP / CVRP objective, as a reward to maximise.
    """
    return [None if L is None else -L for L in _lengths("neg_tour_length", completions, coords, demands, capacity)]


def tour_gap_pct(prompts=None, completions=None, *, coords=None, expert_length=None, demands=None, capacity=None,
                 **kwargs) -> list:
    """``100 (L - L_expert) / L_expert`` (percent). Source: [authors' code] — naver/bq-nco utils/misc.py
    get_opt_gap."""
    lengths = _lengths("tour_gap_pct", completions, coords, demands, capacity)
    best = _expert("tour_gap_pct", expert_length, len(lengths))
    return [None if L is None else 100.0 * (L - b) / b for L, b in zip(lengths, best)]


def tour_matches_expert(prompts=None, completions=None, *, coords=None, expert_length=None, demands=None,
                        capacity=None, **kwargs) -> list:
    """1.0 when ``L <= L_expert (1 + 1e-6)``, else 0.0. Source: [ours]."""
    lengths = _lengths("tour_matches_expert", completions, coords, demands, capacity)
    best = _expert("tour_matches_expert", expert_length, len(lengths))
    return [None if L is None else float(L <= b * (1 + MATCH_TOLERANCE)) for L, b in zip(lengths, best)]


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





@lru_cache(maxsize=16)
def _solved_cvrp(n: int, customers: int, capacity: int, seed: int) -> tuple:
    out = []
    coords, demands = random_cvrp_instances(n, customers, seed)
    for c, d in zip(coords, demands):
        routes = ortools_cvrp(c, d, capacity)
        out.append((c.tolist(), tuple(int(v) for v in d), tuple(tuple(r) for r in routes), cvrp_length(c, routes)))
    return tuple(out)


def cvrp_rows(n: int, customers: int, capacity: int, seed: int, first: int = 0) -> list[dict]:
    return [{"prompt": f"cvrp{customers} #{first + i}", "coords": [list(p) for p in c], "demands": list(d),
             "capacity": int(capacity), "expert_routes": [list(r) for r in routes], "expert_length": round(L, 9)}
            for i, (c, d, routes, L) in enumerate(_solved_cvrp(n, customers, capacity, seed))]


@TASKS.register("cvrp")
def cvrp(*, cvrp_customers: int = param(10, "cvrp: customers per instance (plus the depot, node 0)"),
         cvrp_capacity: int = param(20, "cvrp: vehicle capacity (demands are 1..9; 20 for 10 customers as in "
                                    "the usual CVRP-10 benchmarks)"),
         cvrp_instances: int = param(128, "cvrp: train instances (the expert of each is computed once, OR-Tools, "
                                     "about 25 ms each at 10 customers)"),
         cvrp_eval_instances: int = param(32, "cvrp: held-out instances"),
         cvrp_seed: int = param(0, "cvrp: seed of the instances (held-out: cvrp_seed + 10000)")) -> Task:
    """Random CVRP instances (depot and customers uniform in the unit square, demands 1..9) with OR-Tools
    expert routes; the rewards of task ``tsp`` on route sequences ``[0, c.., 0, c.., 0]`` (module docstring).
    Rows: ``coords`` (depot first), ``demands`` (the depot's 0 first), ``capacity``, ``expert_routes``,
    ``expert_length``. For policy ``bq_nco``.

    Provenance: authors' code — https://github.com/naver/bq-nco data/prepare_cvrp_dataset.py (N + 1 uniform points,
    node 0 the depot, demands ``randint(1, 10)``, an expert solution per instance); read, not copied. Our
    choices: OR-Tools' routing solver (N vehicles, a capacity dimension, cheapest arc + greedy descent) instead
    of LKH-3, so the expert is a local optimum (the exact optimum on 11 of 12 random 6-customer instances with
    capacity 10); capacity 20 for 10 customers (the authors' data script defaults to 50 for 100).
    Test: tests/test_bq_nco.py::test_cvrp_expert_and_exact_optimum.
    """
    if cvrp_customers < 3 or cvrp_customers > 100 or cvrp_capacity < 9:
        raise ConfigError(f"cvrp_customers in 3..100 and cvrp_capacity >= 9 (the largest demand), got "
                          f"{cvrp_customers}, {cvrp_capacity}")
    if cvrp_instances < 1 or cvrp_eval_instances < 0:
        raise ConfigError(f"cvrp_instances >= 1 and cvrp_eval_instances >= 0, got {cvrp_instances}, "
                          f"{cvrp_eval_instances}")
    n, cap = int(cvrp_customers), int(cvrp_capacity)
    train = cvrp_rows(int(cvrp_instances), n, cap, int(cvrp_seed))
    held = cvrp_rows(int(cvrp_eval_instances), n, cap, int(cvrp_seed) + EVAL_SEED_OFFSET,
                     first=int(cvrp_instances)) if cvrp_eval_instances else []
    return Task("cvrp", train, held,
                rewards=[("neg_tour_length", neg_tour_length, 1.0), ("tour_gap_pct", tour_gap_pct, 0.0),
                         ("tour_matches_expert", tour_matches_expert, 0.0)],
                accuracy_reward="tour_matches_expert",
                description=f"random CVRP-{n} instances (capacity {cap}) with OR-Tools expert routes", extra={})


__all__ = ["tsp", "cvrp", "neg_tour_length", "tour_gap_pct", "tour_matches_expert", "tsp_rows", "cvrp_rows"]
