"""BQ-NCO's training: imitation of expert tours on sampled suffix sub-problems (update strategy ``bq_imitation``)."""
from __future__ import annotations

import math

import numpy as np
import torch

from .model import (cvrp_expert_order, cvrp_suffix, next_node_cross_entropy, sample_cvrp_begin,
                              sample_suffix_size, suffix_subproblem)
from ...errors import ConfigError
from ...registry import UPDATE_STRATEGIES


def _check(cfg) -> None:
    if cfg.policy != "bq_nco":
        raise ConfigError(f"update_strategy: bq_imitation trains the BQ-NCO network on expert tours; it needs "
                          f"policy: bq_nco (got {cfg.policy})")


def _first_rows(batch) -> list[int]:
    first: dict[int, int] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        first.setdefault(g, i)
    return list(first.values())


def expert_closed_tours(batch) -> torch.Tensor:
    """One ``[N + 1, 2]`` closed expert tour per group of ``batch`` (its first row): the instance's nodes in the
    order of the row's ``expert_tour``, the first node repeated at the end (the authors' ``reorder``)."""
    coords, tours = batch.columns.get("coords"), batch.columns.get("expert_tour")
    out = []
    for i in _first_rows(batch):
        if coords is None or tours is None or coords[i] is None or tours[i] is None:
            raise ConfigError("update_strategy: bq_imitation needs the data columns 'coords' and 'expert_tour' "
                              "(task tsp), or 'coords', 'demands', 'capacity' and 'expert_routes' (task cvrp), one "
                              "per row")
        c, t = np.asarray(coords[i], dtype=np.float32), [int(v) for v in tours[i]]
        if sorted(t) != list(range(len(c))):
            raise ConfigError(f"update_strategy: bq_imitation: row {i}'s column 'expert_tour' is not a tour of its "
                              f"{len(c)} nodes: {t}")
        out.append(torch.from_numpy(c[t + t[:1]]))
    return torch.stack(out)


def expert_cvrp_sequences(batch) -> dict[str, torch.Tensor]:
    """The expert sequences of a CVRP batch, one per group (policies/bq_nco/model.py ``cvrp_expert_order``): ``nodes``
    [B, N+2, 2], ``demands``, ``remaining``, ``via`` [B, N+2] in the sequence's order, ``capacity`` [B]."""
    cols = {k: batch.columns.get(k) for k in ("coords", "demands", "capacity", "expert_routes")}
    out: dict[str, list] = {"nodes": [], "demands": [], "remaining": [], "via": [], "capacity": []}
    for i in _first_rows(batch):
        if any(v is None or v[i] is None for v in cols.values()):
            raise ConfigError("update_strategy: bq_imitation on CVRP rows needs the data columns 'coords', "
                              "'demands', 'capacity' and 'expert_routes' (task cvrp), one per row")
        c, d, cap = np.asarray(cols["coords"][i], dtype=np.float32), [int(v) for v in cols["demands"][i]], \
            int(cols["capacity"][i])
        order, via, remaining = cvrp_expert_order(d, cap, [list(r) for r in cols["expert_routes"][i]])
        out["nodes"].append(torch.from_numpy(c[order]))
        out["demands"].append(torch.tensor([d[v] for v in order]))
        out["remaining"].append(torch.tensor(remaining))
        out["via"].append(torch.tensor(via))
        out["capacity"].append(torch.tensor(float(cap)))
    return {k: torch.stack(v) for k, v in out.items()}


@UPDATE_STRATEGIES.register("bq_imitation", check=_check)
def bq_imitation(batch, model, optimizer, ctx, step):
    """BQ-NCO's imitation step, ``num_iterations`` times per batch: draw one suffix size
    ``s ~ U{4..N+1}`` for the whole mini-batch, cut each instance's expert tour to its suffix sub-problem
    (origin = the expert's node at ``N + 1 - s``, the rest of the expert tour, destination = the start node;
    policies/bq_nco/model.py ``suffix_subproblem``) and minimise

        CE = mean_b -log softmax(f_theta(sub_b))[1]

    (position 1 is the expert's next node) with the run's optimiser (gradients clipped to ``max_grad_norm``
    when it is > 0). The mini-batch is the step's instances (one per group; the sampled tours of the rollout
    are not used). The suffix sizes come from a generator seeded with ``(seed, step)``, so a resumed run draws
    the same ones. CVRP rows (task cvrp): the expert routes as the authors' reordered sequence (depot, customers
    route after route, depot; policies/bq_nco/model.py ``cvrp_expert_order``), one start ``b ~ U{0..N-2}`` per pass,
    the sequence from b to the end with the remaining capacity at b as the sub-problem, and the target action
    ``2 + via`` (node 1, directly or via the depot). Metrics: ``bq/suffix_size`` (the last pass's sub-problem
    size in nodes), ``bq/next_node_accuracy`` (share of instances whose highest score is the expert's action,
    last pass).

    Paper: Drakulic et al., "BQ-NCO: Bisimulation Quotienting for Efficient Neural Combinatorial Optimization",
    NeurIPS 2023, arXiv:2301.03313 (seed 000-97).

    Provenance: authors' code — https://github.com/naver/bq-nco learning/tsp/dataloading/dataset.py
    (collate_func_with_sample_suffix: one ``subproblem_size = randint(4, nb_nodes + 1)`` per mini-batch,
    ``begin_idx = nb_nodes + 1 - subproblem_size``, the tail of the reordered closed tour), learning/tsp/
    traj_learner.py (``nn.CrossEntropyLoss`` against index 1, Adam, no clipping), learning/cvrp/dataloading/
    dataset.py (collate_func_with_sample: ``begin_idx = randint(0, nb_nodes - 3)``) and learning/cvrp/
    traj_learner.py (ground truth 2, plus 1 via the depot); read, not copied. Our
    choices: the trainer's optimiser (AdamW) and schedule instead of Adam with decay 0.99 every 50 epochs; the
    step's instances as the mini-batch (the authors: 512). Test: tests/test_bq_nco.py::test_suffix_sampling_as_authors,
    tests/test_bq_nco.py::test_cross_entropy_hand_computed, tests/test_bq_nco.py::test_cvrp_expert_sequence_and_suffix.
    """
    cfg = ctx.cfg
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    cvrp = batch.columns.get("demands") is not None
    if cvrp:
        seq = {k: v.to(device) for k, v in expert_cvrp_sequences(batch).items()}
        n = seq["nodes"].shape[1] - 2  # customers
    else:
        closed = expert_closed_tours(batch).to(device)
        n = closed.shape[1] - 1  # nodes
    rng = np.random.default_rng([int(cfg.seed), int(step)])
    model.train()
    losses, s, acc, gnorm = [], 0, 0.0, 0.0
    for _ in range(max(int(cfg.num_iterations), 1)):
        if cvrp:
            begin = sample_cvrp_begin(n, rng)
            feats, target = cvrp_suffix(seq["nodes"], seq["demands"], seq["capacity"], seq["remaining"],
                                        seq["via"], begin)
            s = feats.shape[1]
        else:
            s = sample_suffix_size(n, rng)
            feats, target = suffix_subproblem(closed, s), torch.ones(len(closed), dtype=torch.long, device=device)
        scores = model(feats)
        loss = next_node_cross_entropy(scores, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm and cfg.max_grad_norm > 0:
            gnorm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        else:
            gnorm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))
        if not math.isfinite(float(loss.detach())):
            optimizer.zero_grad(set_to_none=True)
            model.eval()
            return {"loss": float("nan"), "grad_norm": gnorm, "skipped": 1, "kl": None, "entropy": None,
                    "clip_frac_low": 0.0, "clip_frac_high": 0.0, "bq/suffix_size": float(s),
                    "bq/next_node_accuracy": 0.0}
        optimizer.step()
        losses.append(float(loss.detach()))
        acc = float((scores.argmax(-1) == target).float().mean())
    model.eval()
    return {"loss": sum(losses) / len(losses), "grad_norm": gnorm, "skipped": 0, "kl": None, "entropy": None,
            "clip_frac_low": 0.0, "clip_frac_high": 0.0, "bq/suffix_size": float(s), "bq/next_node_accuracy": acc}
