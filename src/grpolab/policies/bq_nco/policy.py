"""``bq_nco``: a BQ-NCO Transformer policy that builds TSP tours / CVRP routes node by node; one step = one choice.

Each row is one instance (task ``tsp``: ``coords``, the expert tour and its length; task ``cvrp`` adds
``demands`` and ``capacity``). A sample is a whole solution from node 0: at step j the network scores the BQ
state of the solution so far (policies/bq_nco/model.py: origin = the last node, the unvisited nodes, destination = node
0; CVRP: the remaining capacity too) and an action is drawn from the masked softmax; a TSP tour of N nodes has
N - 2 steps (the last node is forced), a CVRP solution one step per customer. Reward functions receive the
tour (TSP: node ids from 0) or the route sequence (CVRP: ``[0, c.., 0, c.., 0]``).
The network, the states and the expert live in policies/bq_nco/model.py; the imitation update is the update strategy
``bq_imitation`` (policies/bq_nco/imitation.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...batch import RolloutBatch
from ...config import ConfigError
from .model import (BQTransformer, choice_logprobs, cvrp_choice_logprobs, cvrp_lengths, cvrp_rollout,
                              rollout, tour_lengths)
from ...generation.counting import GENERATED
from ...generation.sampling import completion_counts, per_row, row_temperatures
from ...registry import POLICIES, param
from ..base import (PolicyBase, fanned_columns, group_identity, load_config_module, repeat_rows, save_config_module,
                    saved_folder)

BUILT_IN = ("tiny", "bq")


def _check(cfg) -> None:
    if cfg.rollout_strategy != "plain":
        raise ConfigError(f"rollout_strategy: '{cfg.rollout_strategy}' continues a text prompt; policy bq_nco "
                          f"builds tours: use rollout_strategy: plain")


def instance_coords(rows: list[dict], where: str = "train") -> torch.Tensor:
    """``[B, N, 2]`` from each row's ``coords`` (N points [x, y]); every row must have the same N."""
    out, n = [], None
    for i, r in enumerate(rows):
        c = r.get("coords")
        try:
            a = np.asarray(c, dtype=np.float64)
            ok = c is not None and a.ndim == 2 and a.shape[1] == 2 and a.shape[0] >= 4 and np.isfinite(a).all()
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(f"policy bq_nco: {where} row {i} has no column 'coords' of N >= 4 points [x, y] (got "
                              f"{str(c)[:60]!r}); rows are routing instances (task tsp or cvrp)")
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise ConfigError(f"policy bq_nco: {where} row {i} has {a.shape[0]} nodes, row 0 has {n}; one batch of "
                              f"tours needs instances of one size")
        out.append(a)
    return torch.tensor(np.stack(out), dtype=torch.float32)


def problem_of(rows: list[dict]) -> str:
    """``cvrp`` when the rows carry ``demands`` (and ``capacity``), else ``tsp``."""
    return "cvrp" if rows and rows[0].get("demands") is not None else "tsp"


def instance_demands(rows: list[dict], n: int, where: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """``(demands [B, N+1], capacity [B])`` of CVRP rows: ``demands`` with the depot's 0 first, integers
    ``<= capacity``."""
    dem, cap = [], []
    for i, r in enumerate(rows):
        d, c = r.get("demands"), r.get("capacity")
        try:
            ok = (d is not None and len(d) == n and float(d[0]) == 0 and c is not None and float(c) > 0
                  and all(0 <= float(v) <= float(c) for v in d))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(f"policy bq_nco: {where} row {i} needs the columns 'demands' ({n} numbers, the "
                              f"depot's 0 first, each <= capacity) and 'capacity' (task cvrp); got {d!r}, {c!r}")
        dem.append([float(v) for v in d])
        cap.append(float(c))
    return torch.tensor(dem), torch.tensor(cap)


def save_bq(module: BQTransformer, path) -> None:
    save_config_module(module, path)


def load_bq(path) -> BQTransformer:
    return load_config_module(BQTransformer, path, "bq_nco")[0]


@POLICIES.register("bq_nco", check=_check)
class BQNCOPolicy(PolicyBase):
    """A BQ-NCO policy for the TSP and the CVRP: a Transformer encoder over the current sub-problem (origin,
    remaining nodes, destination; policies/bq_nco/model.py :class:`~grpolab.policies.bq_nco.model.BQTransformer`) scores the
    next action, ``pi(a | state) = softmax(score / tau)_a`` over the feasible ones. A sample is a whole solution
    built from node 0; step j's log-prob is ``log pi(a_j | BQ state j)``, recomputed by :meth:`forward` from the
    stored solution (the states are rebuilt, one network pass per step for the whole micro-batch). Evaluation
    (temperature 0) is the authors' greedy decoding (beam 1).

    TSP (rows with ``coords``): an action is the next node; the last node is forced and is no step, so N - 2
    steps for N nodes; the completion is the tour ``[0, t_1, ..., t_{N-1}]``. CVRP (rows with ``coords`` of
    the depot and N customers, ``demands``, ``capacity``): an action is (customer, directly or via the depot),
    the remaining capacity a node feature, a direct move beyond it masked; N steps; the completion is the route
    sequence ``[0, c.., 0, c.., 0]``.

    Paper: Drakulic et al., "BQ-NCO: Bisimulation Quotienting for Efficient Neural Combinatorial Optimization",
    NeurIPS 2023, arXiv:2301.03313 (seed 000-97).

    Provenance: authors' code — https://github.com/naver/bq-nco model/model.py (BQModel: a linear node embedding
    plus learnt begin/end embeddings, an encoder without positional encoding, one score per node, origin and
    destination masked with -inf), model/encoder.py (ReZero residuals, no normalisation, ReLU feed-forward),
    learning/tsp/decoding.py (greedy decoding over progressively smaller sub-problems: the selected node becomes
    the origin, the rest keep their order, the destination stays last), learning/cvrp/decoding.py (two scores per
    node, direct or via the depot; the capacity refilled via the depot; features demand / C and remaining / C);
    read, not copied. Our choices: a small
    network (64-dim, 2 layers, 4 heads, feed-forward 128; the authors' 192 / 9 / 12 / 512) with PyTorch's
    multi-head attention; decoding always starts at node 0; no kNN restriction and no beam search; the
    sampled (temperature tau) tours and their per-step log-probs, which GRPO needs, are grpolab's own (the
    paper trains by imitation only). Test: tests/test_bq_nco.py::test_bq_state_hand_computed,
    tests/test_bq_nco.py::test_network_masks_ends_and_is_equivariant,
    tests/test_bq_nco.py::test_policy_forward_equals_sample_logprobs,
    tests/test_bq_nco.py::test_cvrp_state_mask_and_forward.
    """

    step = "node choice"
    capabilities = frozenset()
    description = "a BQ-NCO Transformer building TSP / CVRP solutions (seed 000-97); one step = one node choice"
    default_model = "tiny"
    default_task = "tsp"
    float32_only = True

    def __init__(self, *, model: str, temperature: float,
                 bq_dim: int = param(64, "bq_nco: embedding size of the encoder (authors: 192)"),
                 bq_layers: int = param(2, "bq_nco: encoder layers (authors: 9)"),
                 bq_heads: int = param(4, "bq_nco: attention heads (authors: 12)"),
                 bq_ff: int = param(128, "bq_nco: feed-forward size of each layer (authors: 512)")):
        if bq_dim < 1 or bq_layers < 1 or bq_heads < 1 or bq_ff < 1 or bq_dim % bq_heads:
            raise ConfigError(f"bq_dim, bq_layers, bq_heads, bq_ff: positive, bq_dim a multiple of bq_heads; got "
                              f"{bq_dim}, {bq_layers}, {bq_heads}, {bq_ff}")
        self.model_name, self.temperature = model, float(temperature)
        self.arch = {"dim": int(bq_dim), "layers": int(bq_layers), "heads": int(bq_heads), "ff": int(bq_ff)}

    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``tiny`` / ``bq`` (a new network of the ``bq_*`` sizes for the rows' problem, TSP or CVRP,
        initialised with the run's seed) or a folder :meth:`save` wrote (e.g. the ``final`` folder of a
        ``bq_nco`` imitation run)."""
        if not rows:
            raise ConfigError("policy bq_nco: no train rows")
        problem = problem_of(rows)
        for where, part in (("train", rows), ("held-out", eval_rows)):
            if part:
                n = instance_coords(part[:1], where).shape[1]
                if problem == "cvrp":
                    instance_demands(part[:1], n, where)
        if self.model_name in BUILT_IN:
            module = BQTransformer(**self.arch, problem=problem)
            log(f"[grpolab] policy bq_nco: a new BQ Transformer for {problem.upper()} ({self.arch['layers']} "
                f"layers, dim {self.arch['dim']}, {sum(p.numel() for p in module.parameters())} parameters)")
        else:
            path = saved_folder(self.model_name, "bq_nco", ("config.json",),
                                "a folder it saved (config.json + model.safetensors)",
                                builds="'tiny' (a new BQ Transformer)")
            module = load_bq(path)
            if module.problem != problem:
                raise ConfigError(f"model: {path} was trained for {module.problem.upper()}; the rows are "
                                  f"{problem.upper()} instances")
        return module.float()

    def save(self, module, path) -> None:
        save_bq(module, path)

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        counts = completion_counts(num_generations, len(rows))
        device = next(module.parameters()).device
        coords = repeat_rows(instance_coords(rows), counts).to(device)
        R, N = coords.shape[:2]
        tau = row_temperatures(temperature if temperature is not None else self.temperature, counts).to(device)
        columns = fanned_columns(rows, counts)
        columns["prompt"] = per_row([str(r.get("prompt", f"instance {u}")) for r, u in zip(rows, uids)], counts)
        if module.problem == "cvrp":
            demands, capacity = (repeat_rows(t, counts).to(device) for t in instance_demands(rows, N))
            customers, via, choices, logprobs, remaining = cvrp_rollout(
                module, coords, demands, capacity, greedy=evaluation, temperature=tau, generator=generator)
            lengths = cvrp_lengths(coords, customers, via)
            columns["completion"] = [[0, *[v for c, f in zip(cu, vi) for v in ((0, c) if f else (c,))], 0]
                                     for cu, vi in zip(customers.tolist(), via.tolist())]
            row_data = {"coords": coords.cpu(), "demands": demands.cpu(), "capacity": capacity.cpu(),
                        "customers": customers.cpu(), "remaining": remaining.cpu()}
        else:
            tours, choices, logprobs = rollout(module, coords, greedy=evaluation, temperature=tau,
                                               generator=generator)
            lengths = tour_lengths(coords, tours)
            columns["completion"] = [[int(v) for v in t] for t in tours.cpu()]
            row_data = {"coords": coords.cpu(), "tour": tours.cpu()}
        T = choices.shape[1]
        GENERATED.add(R, R * T)
        columns["tour_length"] = [float(v) for v in lengths.cpu()]
        ones = torch.ones(R, T)
        return RolloutBatch(
            prompt_ids=torch.zeros(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1, dtype=torch.long),
            completion_ids=choices.cpu(), completion_mask=ones,
            behavior_logprobs=logprobs.float().cpu(), completion_attention_mask=ones.long(),
            truncated=torch.zeros(R, dtype=torch.bool), columns=columns, row_data=row_data,
            **group_identity(counts, uids, group_offset))

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """Per-step log-probs [R, T] of the stored choices (``completion_ids``: actions in each step's
        sub-problem) along the stored tours, under ``module``; 0 off the attention mask."""
        device = next(module.parameters()).device
        mask = mb.completion_attention_mask.to(device) > 0
        rd = {k: v.to(device) for k, v in mb.row_data.items() if torch.is_tensor(v)}
        with torch.set_grad_enabled(grad):
            if module.problem == "cvrp":
                lp = cvrp_choice_logprobs(module, rd["coords"], rd["demands"], rd["capacity"], rd["customers"],
                                          rd["remaining"], mb.completion_ids.to(device), self.temperature, steps=mask)
            else:
                lp = choice_logprobs(module, rd["coords"], rd["tour"], mb.completion_ids.to(device),
                                     self.temperature, steps=mask)
            return {"logprobs": torch.where(mask, lp, torch.zeros_like(lp))}

    def describe(self, batch, i: int) -> dict:
        tour = batch.columns["completion"][i]
        return {"prompt": str(batch.columns["prompt"][i]),
                "completion": "-".join(map(str, tour)) + f" (length {batch.columns['tour_length'][i]:.4f})"}
