"""BQ-NCO: constructive combinatorial optimisation as an MDP over *remaining sub-problems*, learnt by imitation.

Drakulic, Michel, Mai, Sors, Andreoli, "BQ-NCO: Bisimulation Quotienting for Efficient Neural Combinatorial
Optimization", NeurIPS 2023, arXiv:2301.03313 (seed 000-97).

The pieces (TSP; instances are ``N`` points in the unit square, tours start at node 0):

* :func:`bq_state` / :func:`subproblem_index` — the BQ state of a partial tour ``(t_0, ..., t_k)``: the path-TSP
  sub-problem ``[t_k (origin), remaining nodes in instance order, t_0 (destination)]``. Every partial tour with
  the same first node, last node and visited set maps to the same state (the bisimulation quotient);
* :class:`BQTransformer` — a Transformer encoder over the sub-problem's nodes (no positional encoding, no
  autoregressive decoder; learnt "origin" / "destination" embeddings added to the first and last node), one score
  per node, origin and destination masked: ``pi(. | state) = softmax(scores / tau)``;
* :func:`rollout` — greedy or sampled construction of whole tours, with the per-step log-probs of the choices;
* :func:`sample_suffix_size`, :func:`suffix_subproblem`, :func:`next_node_cross_entropy` — the imitation data
  and loss: the tail of an expert tour as the sub-problem, the expert's next node as the target;
* :func:`tour_length`, :func:`held_karp` (exact DP, N <= 12), :func:`ortools_tsp` (the expert).

CVRP (node 0 the depot, customers with demands, capacity C): :func:`cvrp_state` (the state adds the demand and
the remaining capacity as node features), :func:`cvrp_rollout` (an action is a customer reached directly or via
the depot), :func:`cvrp_expert_order` / :func:`cvrp_suffix` / :func:`sample_cvrp_begin` (the authors' training
sequences and sub-problems), :func:`exact_cvrp` (enumeration + Split, N <= 7), :func:`ortools_cvrp` (the expert).

Provenance of each piece: the authors' code, https://github.com/naver/bq-nco (files named in each docstring and
in the registered components: policies/bq_nco/policy.py, policies/bq_nco/tasks.py, policies/bq_nco/imitation.py), read, not copied.
Imports of OR-Tools happen inside :func:`ortools_tsp` / :func:`ortools_cvrp` (the ``control`` extra).
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ...errors import ConfigError

#: integer scale of the distances handed to OR-Tools (its arc costs are integers); the authors scale Concorde's
#: input by 1e6 too (data/prepare_tsp_dataset.py SCALE)
ORTOOLS_SCALE = 1_000_000
MAX_DP_NODES = 12
#: problem -> (node features, scores per node) of :class:`BQTransformer`
PROBLEMS = {"tsp": (2, 1), "cvrp": (4, 2)}


# ---------------------------------------------------------------------------------------------------- tours

def tour_length(coords, tour: Sequence[int], closed: bool = True) -> float:
    """``L(tour) = sum_k |x_{t_k} - x_{t_{k+1}}|`` (Euclidean), with the closing edge ``t_{N-1} -> t_0`` when
    ``closed``."""
    c = np.asarray(coords, dtype=np.float64)
    t = list(tour) + ([tour[0]] if closed and len(tour) else [])
    return float(sum(np.linalg.norm(c[a] - c[b]) for a, b in zip(t[:-1], t[1:])))


def tour_lengths(coords: torch.Tensor, tours: torch.Tensor) -> torch.Tensor:
    """Batched closed-tour lengths: ``coords`` [B, N, 2], ``tours`` [B, N] -> [B] (float64)."""
    x = coords.double().gather(1, tours[..., None].expand(-1, -1, coords.shape[-1]))
    return (x - x.roll(-1, dims=1)).norm(dim=-1).sum(-1)


def held_karp(coords) -> tuple[float, list[int]]:
    """The optimal closed tour by Held and Karp's dynamic programme (exact; ``N <= 12``)::

        C(S, j) = min_{i in S \\ {j}} C(S \\ {j}, i) + d(i, j),   C({j}, j) = d(0, j),   L* = min_j C(V\\{0}, j) + d(j, 0)

    Returns ``(L*, tour starting at 0)``; ties go to the smallest index (deterministic)."""
    c = np.asarray(coords, dtype=np.float64)
    n = len(c)
    if n > MAX_DP_NODES:
        raise ValueError(f"held_karp: at most {MAX_DP_NODES} nodes (2^N states), got {n}")
    if n <= 2:
        return tour_length(c, list(range(n))), list(range(n))
    d = np.linalg.norm(c[:, None] - c[None], axis=-1)
    m = n - 1  # nodes 1..n-1 are bits 0..m-1
    cost = np.full((1 << m, m), np.inf)
    parent = np.full((1 << m, m), -1, dtype=np.int64)
    for j in range(m):
        cost[1 << j, j] = d[0, j + 1]
    for S in range(1, 1 << m):
        for j in range(m):
            if not S >> j & 1 or cost[S, j] == np.inf:
                continue
            for k in range(m):
                if S >> k & 1:
                    continue
                T, v = S | (1 << k), cost[S, j] + d[j + 1, k + 1]
                if v < cost[T, k]:
                    cost[T, k], parent[T, k] = v, j
    full = (1 << m) - 1
    ends = cost[full] + d[1:, 0]
    j = int(np.argmin(ends))
    best, tour, S = float(ends[j]), [], full
    while j >= 0:
        tour.append(j + 1)
        S, j = S & ~(1 << j), int(parent[S, j])
    return best, [0, *reversed(tour)]


def brute_force_tsp(coords) -> float:
    """The optimal closed-tour length by enumerating the (N-1)! tours from node 0 (tests; N <= 9)."""
    c = np.asarray(coords, dtype=np.float64)
    return min(tour_length(c, [0, *p]) for p in itertools.permutations(range(1, len(c))))


def ortools_tsp(coords) -> list[int]:
    """The expert: OR-Tools' routing solver on the instance (one vehicle from node 0), distances rounded to
    integers after scaling by :data:`ORTOOLS_SCALE`; first solution ``PATH_CHEAPEST_ARC``, then
    ``GREEDY_DESCENT`` local search (2-opt, or-opt, relocate, exchange, ...) until no move improves: a local
    optimum, deterministic, with no time limit (a time limit would make the expert depend on the machine's
    speed). Returns the tour as node ids starting at 0 (without the return to 0)."""
    try:
        from ortools.constraint_solver import pywrapcp, routing_enums_pb2
    except ImportError as e:  # pragma: no cover - the control extra installs it
        raise ConfigError("ortools is not installed: the BQ-NCO expert (task tsp) needs it; "
                          "pip install 'grpolab[control]'") from e
    c = np.asarray(coords, dtype=np.float64)
    n = len(c)
    if n < 3:
        return list(range(n))
    dist = np.rint(np.linalg.norm(c[:, None] - c[None], axis=-1) * ORTOOLS_SCALE).astype(np.int64).tolist()
    manager = pywrapcp.RoutingIndexManager(n, 1, 0)
    routing = pywrapcp.RoutingModel(manager)
    routing.SetArcCostEvaluatorOfAllVehicles(routing.RegisterTransitMatrix(dist))
    params = pywrapcp.DefaultRoutingSearchParameters()
    params.first_solution_strategy = routing_enums_pb2.FirstSolutionStrategy.PATH_CHEAPEST_ARC
    params.local_search_metaheuristic = routing_enums_pb2.LocalSearchMetaheuristic.GREEDY_DESCENT
    solution = routing.SolveWithParameters(params)
    if solution is None:  # pragma: no cover - a TSP always has a solution
        raise RuntimeError("ortools_tsp: the routing solver found no tour")
    tour, i = [], routing.Start(0)
    while not routing.IsEnd(i):
        tour.append(manager.IndexToNode(i))
        i = solution.Value(routing.NextVar(i))
    return tour


# ---------------------------------------------------------------------------------------------------- BQ states

def bq_state(coords, partial: Sequence[int]) -> tuple[np.ndarray, list[int]]:
    """The BQ state of partial tour ``partial = (t_0, ..., t_k)`` (k >= 0) of an instance ``coords`` [N, 2]:
    ``(sub-problem coordinates [N - k + 1, 2], their node ids)``, the nodes being ``[t_k, remaining nodes in
    increasing id, t_0]`` (origin, the nodes still to visit, destination). With ``k = 0`` it is the whole
    instance as a path from ``t_0`` back to ``t_0``."""
    c = np.asarray(coords)
    seen = set(partial)
    if not partial or len(seen) != len(partial) or not all(0 <= int(t) < len(c) for t in partial):
        raise ValueError(f"bq_state: a partial tour is distinct node ids in 0..{len(c) - 1}, got {list(partial)}")
    ids = [int(partial[-1]), *[i for i in range(len(c)) if i not in seen], int(partial[0])]
    return c[ids], ids


def subproblem_index(prefix: torch.Tensor, n: int) -> torch.Tensor:
    """Batched :func:`bq_state` ids: ``prefix`` [B, k] (the visited nodes, ``prefix[:, 0]`` the start) ->
    [B, n - k + 2] = ``[last visited, unvisited nodes in increasing id, first]``."""
    B, k = prefix.shape
    visited = torch.zeros(B, n, dtype=torch.long, device=prefix.device).scatter_(1, prefix, 1)
    key = visited * n + torch.arange(n, device=prefix.device)  # unvisited first, each group in id order
    remaining = key.sort(dim=1).values[:, :n - k] % n
    return torch.cat([prefix[:, -1:], remaining, prefix[:, :1]], 1)


def gather_nodes(coords: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``coords`` [B, N, F] at ``idx`` [B, M] -> [B, M, F]."""
    return coords.gather(1, idx[..., None].expand(-1, -1, coords.shape[-1]))


# ---------------------------------------------------------------------------------------------------- imitation

def sample_suffix_size(n_nodes: int, rng: np.random.Generator) -> int:
    """One sub-problem size per mini-batch, ``s ~ U{4, ..., N + 1}`` for TSP-N, as the authors'
    ``collate_func_with_sample_suffix`` (``np.random.randint(4, nb_nodes + 1)`` with ``nb_nodes = N + 1``,
    the closed tour's node count)."""
    if n_nodes < 3:
        raise ValueError(f"sample_suffix_size: TSP with at least 3 nodes, got {n_nodes}")
    return int(rng.integers(4, n_nodes + 2))


def suffix_subproblem(closed: torch.Tensor, s: int) -> torch.Tensor:
    """The sub-problem of suffix size ``s`` of expert tours: ``closed`` [B, N + 1, F] holds each instance's nodes
    in the expert tour's order with node ``t_0`` repeated at the end (the authors' ``reorder``ed data); the slice
    ``[N + 2 - s, N + 2)`` as in the authors' ``collate_func_with_sample_suffix`` (``begin_idx = nb_nodes + 1 -
    subproblem_size``). The slice runs one past the end, so it holds ``s - 1`` nodes: origin ``t_{N+1-s}``, the
    expert's next node at position 1, ..., destination ``t_0`` last. Sizes 3..N are trained; the first decision
    (the N + 1-node whole instance) never is, as in the authors' code."""
    nb = closed.shape[1]
    begin = nb + 1 - s
    if not 4 <= s <= nb:
        raise ValueError(f"suffix_subproblem: suffix size in 4..{nb} for {nb - 1} nodes, got {s}")
    return closed[:, begin:begin + s]


def next_node_cross_entropy(scores: torch.Tensor, target: int | torch.Tensor = 1) -> torch.Tensor:
    """``CE = mean_b -log softmax(scores_b)[target_b]`` over the masked scores [B, M] (``-inf`` at origin and
    destination); the expert's next node is position 1 of a suffix sub-problem (the authors'
    ``nn.CrossEntropyLoss()(scores, ones)``)."""
    if isinstance(target, int):
        target = torch.full((scores.shape[0],), target, dtype=torch.long, device=scores.device)
    return -torch.log_softmax(scores.float(), -1).gather(1, target[:, None]).squeeze(1).mean()


# ---------------------------------------------------------------------------------------------------- the network

class BQEncoderLayer(nn.Module):
    """``h <- h + a_1 MHA(h, h, h)``, ``h <- h + a_2 W_2 relu(W_1 h)``: self-attention and a ReLU feed-forward
    with ReZero residuals (``a_i`` learnt scalars starting at 0, no normalisation; the authors' default,
    model/encoder.py ResidualNorm without batchnorm)."""

    def __init__(self, dim: int, heads: int, ff: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, ff), nn.ReLU(), nn.Linear(ff, dim))
        self.alpha = nn.Parameter(torch.zeros(2))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.alpha[0] * self.attn(h, h, h, need_weights=False)[0]
        return h + self.alpha[1] * self.ff(h)


class BQTransformer(nn.Module):
    """Scores of the next action of a BQ state: ``e_i = W x_i`` (+ ``o`` at the origin, + ``d`` at the
    destination), ``layers`` encoder layers, ``score_i = w . h_i``, origin and destination set to ``-inf``.
    Permutation-equivariant over the nodes between origin and destination (no positional encoding), so the
    remaining nodes' order (expert order in training, id order in decoding) does not matter.

    ``problem = "tsp"``: node features (x, y), one score per node, [B, M]. ``problem = "cvrp"``: node features
    (x, y, demand / C, remaining capacity / C), two scores per node (go directly, go via the depot), flattened
    to [B, 2M] (action ``2i``: node i directly, ``2i + 1``: via the depot); a direct move to a node whose demand
    exceeds the remaining capacity is masked too (the authors' model.py)."""

    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2, ff: int = 128, problem: str = "tsp"):
        super().__init__()
        if problem not in PROBLEMS:
            raise ConfigError(f"BQTransformer: problem is one of {', '.join(PROBLEMS)}, got {problem!r}")
        self.config = {"dim": int(dim), "heads": int(heads), "layers": int(layers), "ff": int(ff), "problem": problem}
        self.problem = problem
        self.input_emb = nn.Linear(PROBLEMS[problem][0], dim)
        self.begin_end = nn.Embedding(2, dim)
        self.layers = nn.ModuleList(BQEncoderLayer(dim, heads, ff) for _ in range(layers))
        self.score = nn.Linear(dim, PROBLEMS[problem][1])

    def forward(self, nodes: torch.Tensor) -> torch.Tensor:
        """``nodes`` [B, M, F] (origin first, destination last) -> masked scores [B, M] (TSP) or [B, 2M] (CVRP)."""
        h = self.input_emb(nodes.float())
        ends = torch.zeros(1, h.shape[1], h.shape[2], device=h.device, dtype=h.dtype)
        ends[0, 0], ends[0, -1] = self.begin_end.weight[0], self.begin_end.weight[1]
        h = h + ends
        for layer in self.layers:
            h = layer(h)
        scores = self.score(h)  # [B, M, outputs]
        mask = torch.zeros_like(scores, dtype=torch.bool)
        mask[:, 0] = mask[:, -1] = True
        if self.problem == "cvrp":  # direct moves need demand <= remaining capacity
            mask[..., 0] |= nodes[..., 2] > nodes[..., 3]
        return scores.masked_fill(mask, float("-inf")).reshape(len(scores), -1)


def step_logprobs(model: nn.Module, coords: torch.Tensor, prefix: torch.Tensor,
                  temperature: float | torch.Tensor = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log pi(. | state) [B, M], sub-problem ids [B, M])`` for the BQ states of ``prefix`` [B, k];
    ``log pi = log_softmax(scores / tau)`` (``temperature``: a number or one per row, [B])."""
    idx = subproblem_index(prefix, coords.shape[1])
    scores = model(gather_nodes(coords, idx)).float()
    tau = torch.as_tensor(temperature, dtype=torch.float32, device=scores.device).reshape(-1, 1).clamp(min=1e-8)
    return torch.log_softmax(scores / tau, -1), idx


def rollout(model: nn.Module, coords: torch.Tensor, *, greedy: bool, temperature: float | torch.Tensor = 1.0,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Construct tours of ``coords`` [B, N, 2] from node 0: at step j = 0..N-3 the BQ state of the prefix is
    scored and a node chosen (argmax when ``greedy``, else drawn from ``softmax(scores / tau)`` with
    ``generator``); the last node is forced. Returns ``(tours [B, N], choices [B, N-2] (positions in the
    sub-problem), logprobs [B, N-2] of the choices; 0 when greedy)``."""
    B, N = coords.shape[:2]
    tour = torch.zeros(B, 1, dtype=torch.long, device=coords.device)
    choices, lps = [], []
    for _ in range(max(N - 2, 0)):
        logp, idx = step_logprobs(model, coords, tour, temperature)
        if greedy:
            pos = logp.argmax(-1)
        else:
            pos = torch.multinomial(logp.exp().cpu(), 1, generator=generator).squeeze(1).to(coords.device)
        choices.append(pos)
        lps.append(logp.gather(1, pos[:, None]).squeeze(1))
        tour = torch.cat([tour, idx.gather(1, pos[:, None])], 1)
    if N >= 2:
        tour = torch.cat([tour, subproblem_index(tour, N)[:, 1:2]], 1)  # the one node left
    T = max(N - 2, 0)
    stack = (lambda xs, dt: torch.stack(xs, 1) if xs else torch.zeros(B, 0, dtype=dt, device=coords.device))
    logprobs = stack(lps, torch.float32) if not greedy else torch.zeros(B, T, device=coords.device)
    return tour, stack(choices, torch.long), logprobs


def choice_logprobs(model: nn.Module, coords: torch.Tensor, tours: torch.Tensor, choices: torch.Tensor,
                    temperature: float = 1.0, steps: torch.Tensor | None = None) -> torch.Tensor:
    """Per-step log-probs [B, N-2] of recorded ``choices`` along ``tours`` under ``model`` (the same BQ states
    :func:`rollout` scored: step j's state is that of ``tours[:, :j+1]``); ``steps`` [B, N-2] bool: the steps to
    compute (others 0)."""
    B, N = tours.shape
    out = torch.zeros(B, choices.shape[1], device=coords.device)
    cols = []
    for j in range(choices.shape[1]):
        if steps is not None and not bool(steps[:, j].any()):
            cols.append(out[:, j])
            continue
        logp, _ = step_logprobs(model, coords, tours[:, :j + 1], temperature)
        cols.append(logp.gather(1, choices[:, j:j + 1]).squeeze(1))
    return torch.stack(cols, 1) if cols else out


# ---------------------------------------------------------------------------------------------------- CVRP
# An instance: node 0 the depot, nodes 1..N customers with integer demands (the depot's demand 0), vehicle
# capacity C. A solution is a sequence of routes from the depot; the BQ construction visits the customers one by
# one, each step choosing (customer, directly or via the depot); the BQ state is (origin, the customers still to
# serve, the depot as destination) with the remaining capacity as a node feature.

def cvrp_length(coords, routes: Sequence[Sequence[int]]) -> float:
    """``sum_r L(0, r_1, ..., r_m, 0)``: the routes' closed lengths from the depot (node 0)."""
    return sum(tour_length(coords, [0, *r]) for r in routes if len(r))


def cvrp_feasible(demands, capacity: int, routes: Sequence[Sequence[int]]) -> bool:
    """Every customer 1..N served exactly once, and every route's load ``<= capacity``."""
    n = len(demands) - 1
    served = sorted(int(v) for r in routes for v in r)
    return served == list(range(1, n + 1)) and all(sum(demands[v] for v in r) <= capacity for r in routes)


def exact_cvrp(coords, demands, capacity: int) -> float:
    """The optimal CVRP length by enumeration (tests; N <= 7 customers): every order of the customers, split into
    routes optimally by Beasley's *Split* DP, ``V(j) = min_{i < j, load(p_{i+1..j}) <= C} V(i) + L(0, p_{i+1..j},
    0)``; the best order's ``V(N)``. Every solution is some order cut into routes, so this is exact."""
    c = np.asarray(coords, dtype=np.float64)
    d = np.linalg.norm(c[:, None] - c[None], axis=-1)
    n = len(c) - 1
    if n > 7:
        raise ValueError(f"exact_cvrp: at most 7 customers (N! orders), got {n}")
    best = math.inf
    for p in itertools.permutations(range(1, n + 1)):
        V = [0.0] + [math.inf] * n
        for i in range(n):
            load, inner = 0, 0.0
            for j in range(i, n):
                load += demands[p[j]]
                if load > capacity:
                    break
                inner += d[p[j - 1], p[j]] if j > i else 0.0
                V[j + 1] = min(V[j + 1], V[i] + d[0, p[i]] + inner + d[p[j], 0])
        best = min(best, V[n])
    return float(best)


def ortools_cvrp(coords, demands, capacity: int) -> list[list[int]]:
    """The CVRP expert: OR-Tools' routing solver with N vehicles of capacity C from depot 0 (a capacity
    dimension on the demands), distances scaled by :data:`ORTOOLS_SCALE` and rounded; ``PATH_CHEAPEST_ARC`` then
    ``GREEDY_DESCENT`` (deterministic, no time limit). Returns the non-empty routes (customer ids, no depot)."""
    try:
        from ortools.constraint_solver import pywrapcp, routing_enums_pb2
    except ImportError as e:  # pragma: no cover - the control extra installs it
        raise ConfigError("ortools is not installed: the BQ-NCO expert (task cvrp) needs it; "
                          "pip install 'grpolab[control]'") from e
    c = np.asarray(coords, dtype=np.float64)
    n = len(c) - 1
    dem = [int(v) for v in demands]
    if any(v > capacity for v in dem):
        raise ValueError(f"ortools_cvrp: a demand exceeds the capacity {capacity}: {dem}")
    dist = np.rint(np.linalg.norm(c[:, None] - c[None], axis=-1) * ORTOOLS_SCALE).astype(np.int64).tolist()
    manager = pywrapcp.RoutingIndexManager(n + 1, n, 0)
    routing = pywrapcp.RoutingModel(manager)
    routing.SetArcCostEvaluatorOfAllVehicles(routing.RegisterTransitMatrix(dist))
    demand = routing.RegisterUnaryTransitVector(dem)
    routing.AddDimensionWithVehicleCapacity(demand, 0, [int(capacity)] * n, True, "load")
    params = pywrapcp.DefaultRoutingSearchParameters()
    params.first_solution_strategy = routing_enums_pb2.FirstSolutionStrategy.PATH_CHEAPEST_ARC
    params.local_search_metaheuristic = routing_enums_pb2.LocalSearchMetaheuristic.GREEDY_DESCENT
    solution = routing.SolveWithParameters(params)
    if solution is None:  # pragma: no cover - one vehicle per customer is always feasible
        raise RuntimeError("ortools_cvrp: the routing solver found no solution")
    routes = []
    for v in range(n):
        i, r = solution.Value(routing.NextVar(routing.Start(v))), []
        while not routing.IsEnd(i):
            r.append(manager.IndexToNode(i))
            i = solution.Value(routing.NextVar(i))
        if r:
            routes.append(r)
    return routes


def cvrp_expert_order(demands, capacity: int, routes) -> tuple[list[int], list[int], list[int]]:
    """The expert solution as the authors' reordered training sequence (data/prepare_cvrp_dataset.py
    ``reorder``): routes sorted by their leftover capacity ``C - load`` (ascending, ties in route order), their
    customers concatenated between two depots: ``order = [0, customers..., 0]``; ``via[k] = 1`` where a new route
    starts (the first customer of every route after the first); ``remaining[k]`` = the capacity left after serving
    ``order[k]`` (C at the depots). The authors flag "via the depot" where the remaining capacity rises, which
    misses a new route whose first demand leaves less than the previous route's leftover; here the route
    structure sets the flag."""
    left = [capacity - sum(demands[v] for v in r) for r in routes]
    ordered = [routes[i] for i in sorted(range(len(routes)), key=lambda i: left[i])]
    order, via, remaining = [0], [0], [int(capacity)]
    for ri, r in enumerate(ordered):
        cap = int(capacity)
        for k, v in enumerate(r):
            cap -= int(demands[v])
            order.append(int(v))
            via.append(int(k == 0 and ri > 0))
            remaining.append(cap)
    return order + [0], via + [0], remaining + [int(capacity)]


def cvrp_nodes(coords: torch.Tensor, demands: torch.Tensor, capacity: torch.Tensor, idx: torch.Tensor,
               remaining: torch.Tensor) -> torch.Tensor:
    """The network's input for CVRP states: ``[x, y, demand / C, remaining / C]`` of the nodes ``idx`` [B, M]
    (``coords`` [B, N+1, 2], ``demands`` [B, N+1], ``capacity`` [B], ``remaining`` [B])."""
    C = capacity.float()[:, None]
    return torch.cat([gather_nodes(coords, idx).float(), (demands.float().gather(1, idx) / C)[..., None],
                      (remaining.float()[:, None] / C).expand_as(idx)[..., None]], -1)


def cvrp_state(coords, demands, capacity: int, partial: Sequence[int], remaining: int) -> tuple[np.ndarray, list]:
    """The BQ state of a CVRP partial solution (unbatched): ``partial = (0, c_1, ..., c_k)`` the depot then the
    customers served so far, ``remaining`` the capacity left; nodes ``[c_k (or the depot), customers still to
    serve in id order, depot]`` with features ``(x, y, demand / C, remaining / C)``."""
    _, ids = bq_state(coords, partial)
    d = np.asarray(demands, dtype=np.float64)
    c = np.asarray(coords, dtype=np.float64)
    return np.concatenate([c[ids], d[ids, None] / capacity, np.full((len(ids), 1), remaining / capacity)], 1), ids


def cvrp_suffix(order_nodes: torch.Tensor, order_demands: torch.Tensor, capacity: torch.Tensor,
                remaining: torch.Tensor, via: torch.Tensor, begin: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sub-problem from position ``begin`` of expert sequences (:func:`cvrp_expert_order`; ``order_nodes``
    [B, N+2, 2], ``order_demands``, ``remaining``, ``via`` [B, N+2], ``capacity`` [B]) as the authors'
    ``collate_func_with_sample`` (learning/cvrp/dataloading/dataset.py: every sequence from ``begin_idx`` to the
    end, the remaining capacity at ``begin_idx``), and the target action ``2 + via[begin + 1]`` (the authors'
    ground truth: node 1, directly or via the depot)."""
    C = capacity.float()[:, None]
    sub = order_nodes[:, begin:].float()
    feats = torch.cat([sub, (order_demands[:, begin:].float() / C)[..., None],
                       (remaining[:, begin].float()[:, None] / C).expand(-1, sub.shape[1])[..., None]], -1)
    return feats, 2 + via[:, begin + 1].long()


def sample_cvrp_begin(n_customers: int, rng: np.random.Generator) -> int:
    """``begin ~ U{0, ..., N - 2}``: the authors' ``np.random.randint(0, nb_nodes - 3)`` with ``nb_nodes = N + 2``
    (depot, N customers, depot), so sub-problems of 4..N+2 nodes."""
    if n_customers < 2:
        raise ValueError(f"sample_cvrp_begin: at least 2 customers, got {n_customers}")
    return int(rng.integers(0, n_customers - 1))


def cvrp_rollout(model: nn.Module, coords: torch.Tensor, demands: torch.Tensor, capacity: torch.Tensor, *,
                 greedy: bool, temperature: float | torch.Tensor = 1.0, generator: torch.Generator | None = None):
    """Construct CVRP solutions: at step j = 0..N-1 the state (the last customer or the depot, the customers left,
    the depot; the remaining capacity) is scored and an action ``2i + v`` chosen (node i of the sub-problem,
    ``v = 1``: via the depot, which refills the vehicle). Returns ``(customers [B, N] in service order, via
    [B, N], choices [B, N], logprobs [B, N] (0 when greedy), remaining [B, N] before each step)``."""
    B, N1 = coords.shape[:2]
    prefix = torch.zeros(B, 1, dtype=torch.long, device=coords.device)
    rem = capacity.float().clone()
    cap = capacity.float()
    vias, choices, lps, rems = [], [], [], []
    tau = torch.as_tensor(temperature, dtype=torch.float32, device=coords.device).reshape(-1, 1).clamp(min=1e-8)
    for _ in range(N1 - 1):
        idx = subproblem_index(prefix, N1)
        logp = torch.log_softmax(model(cvrp_nodes(coords, demands, capacity, idx, rem)).float() / tau, -1)
        if greedy:
            a = logp.argmax(-1)
        else:
            a = torch.multinomial(logp.exp().cpu(), 1, generator=generator).squeeze(1).to(coords.device)
        node, v = idx.gather(1, (a // 2)[:, None]).squeeze(1), a % 2
        rems.append(rem)
        rem = torch.where(v.bool(), cap, rem) - demands.float().gather(1, node[:, None]).squeeze(1)
        choices.append(a)
        vias.append(v)
        lps.append(logp.gather(1, a[:, None]).squeeze(1))
        prefix = torch.cat([prefix, node[:, None]], 1)
    logprobs = torch.zeros(B, N1 - 1, device=coords.device) if greedy else torch.stack(lps, 1)
    return prefix[:, 1:], torch.stack(vias, 1), torch.stack(choices, 1), logprobs, torch.stack(rems, 1)


def cvrp_choice_logprobs(model: nn.Module, coords, demands, capacity, customers: torch.Tensor,
                         remaining: torch.Tensor, choices: torch.Tensor, temperature: float = 1.0,
                         steps: torch.Tensor | None = None) -> torch.Tensor:
    """Per-step log-probs [B, N] of recorded CVRP ``choices`` (the states of :func:`cvrp_rollout`, rebuilt from
    the served ``customers`` and the ``remaining`` capacity before each step)."""
    B, N = customers.shape
    prefix = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=coords.device), customers], 1)
    cols = []
    for j in range(N):
        if steps is not None and not bool(steps[:, j].any()):
            cols.append(torch.zeros(B, device=coords.device))
            continue
        idx = subproblem_index(prefix[:, :j + 1], N + 1)
        logp = torch.log_softmax(model(cvrp_nodes(coords, demands, capacity, idx, remaining[:, j])).float()
                                 / max(float(temperature), 1e-8), -1)
        cols.append(logp.gather(1, choices[:, j:j + 1]).squeeze(1))
    return torch.stack(cols, 1)


def cvrp_lengths(coords: torch.Tensor, customers: torch.Tensor, via: torch.Tensor) -> torch.Tensor:
    """Batched CVRP lengths [B] (float64): a direct step adds ``|x_prev - x_i|``, a step via the depot
    ``|x_prev - x_0| + |x_0 - x_i|``, and the last customer returns to the depot."""
    c = coords.double()
    B, N = customers.shape
    depot = c[:, 0]
    prev = depot
    total = torch.zeros(B, dtype=torch.float64, device=coords.device)
    for j in range(N):
        x = c[torch.arange(B), customers[:, j]]
        direct = (x - prev).norm(dim=-1)
        total += torch.where(via[:, j].bool(), (prev - depot).norm(dim=-1) + (depot - x).norm(dim=-1), direct)
        prev = x
    return total + (prev - depot).norm(dim=-1)


def cvrp_routes(customers: Sequence[int], via: Sequence[int]) -> list[list[int]]:
    """Routes from a service order and its via-depot flags (a flag starts a new route)."""
    routes: list[list[int]] = []
    for v, f in zip(customers, via):
        if f or not routes:
            routes.append([])
        routes[-1].append(int(v))
    return routes


def random_cvrp_instances(n: int, customers: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` instances: depot and customers uniform in the unit square (rounded to 6 decimals), demands uniform in
    1..9 (the authors' ``np.random.randint(1, 10)``), the depot's 0: ``(coords [n, N+1, 2], demands [n, N+1])``."""
    rng = np.random.default_rng(seed)
    coords = np.round(rng.random((n, customers + 1, 2)), 6)
    demands = np.concatenate([np.zeros((n, 1), dtype=np.int64), rng.integers(1, 10, (n, customers))], 1)
    return coords, demands


def random_instances(n: int, nodes: int, seed: int) -> np.ndarray:
    """``n`` instances of ``nodes`` points uniform in the unit square (the authors' ``np.random.random``),
    drawn with ``seed``, rounded to 6 decimals: [n, nodes, 2]."""
    return np.round(np.random.default_rng(seed).random((n, nodes, 2)), 6)


def optimality_gap(lengths, best) -> np.ndarray:
    """``100 (L - L*) / L*`` per instance (percent; the authors' ``get_opt_gap``)."""
    L, B = np.asarray(lengths, dtype=np.float64), np.asarray(best, dtype=np.float64)
    return 100.0 * (L - B) / B


def check_tsp_nodes(n: int, where: str) -> int:
    if not isinstance(n, (int, np.integer)) or n < 4 or n > 100:
        raise ConfigError(f"{where}: TSP instances of 4..100 nodes, got {n!r}")
    return int(n)


__all__ = ["BQTransformer", "BQEncoderLayer", "bq_state", "subproblem_index", "gather_nodes", "rollout",
           "choice_logprobs", "step_logprobs", "sample_suffix_size", "suffix_subproblem", "next_node_cross_entropy",
           "tour_length", "tour_lengths", "held_karp", "brute_force_tsp", "ortools_tsp", "random_instances",
           "optimality_gap", "ORTOOLS_SCALE", "PROBLEMS", "cvrp_length", "cvrp_feasible", "exact_cvrp",
           "ortools_cvrp", "cvrp_expert_order", "cvrp_nodes", "cvrp_state", "cvrp_suffix", "sample_cvrp_begin",
           "cvrp_rollout", "cvrp_choice_logprobs", "cvrp_lengths", "cvrp_routes", "random_cvrp_instances"]
