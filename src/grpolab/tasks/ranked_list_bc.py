"""ConvRec-R1's Stage 1 on the built-in ``ranked_list`` task: behaviour-cloning targets by Remap-Reflect-Adjust.

ConvRec-R1 (Zhu et al., 2025, "Rank-GRPO: Training LLM-based Conversational Recommender Systems with
Reinforcement Learning", arXiv:2510.20150, Sec. 3 and App. "Details for the Remap-Reflect-Adjust Pipeline";
seed 000-91) distils a black-box teacher LLM's zero-shot lists into catalogue-grounded demonstrations for a
supervised warm start, before Stage 2 (Rank-GRPO). Every step keeps one score per catalogue item and the
demonstration is the top ``N`` of the final scores:

1. **Remap** — the teacher's raw list ``u_1..u_m`` (its own item space, possibly off-catalogue or hallucinated)
   is mapped onto the catalogue ``C``:
   ``s_remap = p^T (S_item-item + I_ic) + lambda * s_context`` with ``p_k = 1 / sqrt(k)`` for the teacher's rank
   ``k``, ``S_item-item[u, v]`` the similarity of teacher item ``u`` and catalogue item ``v``, ``I_ic[u, v] = 1`` for
   an exact match and ``s_context[v]`` the conversation-item similarity (the paper: cosine similarities of text
   embeddings of generated item metadata; ``lambda = 1``).
2. **Reflect** — the top ``N_r > N`` items of ``s_remap`` are judged by the teacher in the conversation's context on
   ``{-2, -1, 0, 1, 2}``: ``s_reflect = s_remap + gamma * r_reflect`` (``gamma = 0.5``; unjudged items get 0).
3. **Adjust** — item-wise multiplicative and additive biases ``w, b`` (one per catalogue item, shared by every
   conversation): ``s_final = w * s_reflect + b``, fitted by maximising the multinomial log-likelihood of the
   training conversations' ground-truth items under ``softmax(s_final)`` over the catalogue, with the penalty
   ``0.01 (||w - 1||^2 + ||b||^2)``.

Here (no LLM can be queried offline): the catalogue is the task's item universe, the integers 1..99; the teacher
is rule-based (:func:`teacher_list`: the prompt's numbers from the largest down, each item replaced with
probability ``convrec_teacher_noise`` by a hallucinated neighbour ``v +- d``, ``d`` in 1..3, which may be missing
from the prompt or off the catalogue); item-item similarity is numeric closeness ``exp(-|u - v| / tau)``
(``convrec_sim_scale``) in place of embedding cosine; conversation-item similarity is 1 for a number the prompt
mentions, else 0; the judge (:func:`judge`) scores 2 for one of the three largest, 0 for another number of the
prompt, -2 for a number the prompt does not contain (the task's answer key). ``grpolab sft --sft_mode convrec``
turns the demonstrations into the warm start (docs/sft.md); recipe ``rank_grpo`` is Stage 2.
"""
from __future__ import annotations

import math
import random

import numpy as np
import torch

from ..registry import declared_params, param

CATALOGUE = tuple(range(1, 100))  # the ranked_list task's item universe: the numbers a prompt draws from


def teacher_list(numbers, rng: random.Random, *, noise: float, length: int) -> list[int]:
    """The rule-based stand-in for the black-box teacher: ``length`` items, the prompt's numbers from the largest
    down, each replaced with probability ``noise`` by a hallucinated neighbour ``v + d`` (``d`` uniform in
    ``{-3, -2, -1, 1, 2, 3}``), which may be absent from the prompt or off the catalogue."""
    out = []
    for v in sorted(numbers, reverse=True)[:length]:
        if rng.random() < noise:
            v = v + rng.choice((-3, -2, -1, 1, 2, 3))
        out.append(int(v))
    return out


def remap_scores(teacher: list[int], numbers, *, sim_scale: float, lam: float,
                 catalogue=CATALOGUE) -> torch.Tensor:
    """``s_remap[v] = sum_k (S[u_k, v] + [u_k == v]) / sqrt(k) + lam * [v in numbers]`` over the catalogue, with
    ``S[u, v] = exp(-|u - v| / sim_scale)`` (float64, ``[|C|]``)."""
    cat = torch.tensor(catalogue, dtype=torch.float64)
    s = torch.zeros(len(catalogue), dtype=torch.float64)
    for k, u in enumerate(teacher, start=1):
        s += (torch.exp(-(cat - u).abs() / sim_scale) + (cat == u).double()) / math.sqrt(k)
    mentioned = torch.tensor([v in set(numbers) for v in catalogue], dtype=torch.float64)
    return s + lam * mentioned


def judge(v: int, numbers, top) -> int:
    """The rule-based judge on ``{-2..2}``: 2 for one of the prompt's three largest, 0 for another of its numbers,
    -2 for a number the prompt does not contain."""
    return 2 if v in set(top) else (0 if v in set(numbers) else -2)


def top_items(scores: torch.Tensor, n: int) -> list[int]:
    """Indices of the ``n`` largest scores, largest first; ties by catalogue order (a stable sort)."""
    return torch.sort(scores, descending=True, stable=True).indices[:n].tolist()


def reflect_scores(s_remap: torch.Tensor, numbers, top, *, candidates: int, gamma: float,
                   catalogue=CATALOGUE) -> torch.Tensor:
    """``s_reflect = s_remap + gamma * r``: ``r`` is the judge's score on the top ``candidates`` items, 0 elsewhere."""
    r = torch.zeros_like(s_remap)
    for i in top_items(s_remap, candidates):
        r[i] = judge(catalogue[i], numbers, top)
    return s_remap + gamma * r


def fit_adjust(scores: torch.Tensor, positives: list[list[int]], *, reg: float, iters: int = 500):
    """``(w, b)`` minimising ``mean_i -sum_{v in positives_i} log softmax(w * scores_i + b)[v]
    + reg (||w - 1||^2 + ||b||^2)`` (convex in ``w, b``), by L-BFGS (scipy) with the analytic gradient
    ``d/dz_i = n_i softmax(z_i) - counts_i`` (float64). ``scores``: ``[n, |C|]``; ``positives``: catalogue indices of
    each conversation's ground-truth items."""
    from scipy.optimize import minimize

    s = scores.detach().to(torch.float64).numpy()
    n, C = s.shape
    counts = np.zeros((n, C))
    for i, pos in enumerate(positives):
        for v in pos:
            counts[i, v] += 1.0
    sizes = counts.sum(1, keepdims=True)

    def objective(x):
        w, b = x[:C], x[C:]
        z = w * s + b
        z = z - z.max(1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(1, keepdims=True))
        dz = sizes * np.exp(logp) - counts
        value = -(counts * logp).sum() / n + reg * (((w - 1) ** 2).sum() + (b ** 2).sum())
        grad = np.concatenate([(dz * s).sum(0) / n + 2 * reg * (w - 1), dz.sum(0) / n + 2 * reg * b])
        return value, grad

    x0 = np.concatenate([np.ones(C), np.zeros(C)])
    res = minimize(objective, x0, jac=True, method="L-BFGS-B",
                   options={"maxiter": iters, "gtol": 1e-10, "ftol": 1e-15})
    return torch.from_numpy(res.x[:C].copy()), torch.from_numpy(res.x[C:].copy())


def remap_reflect_adjust(rows: list[dict], *, seed: int = 0,
                         convrec_teacher_noise: float = param(0.3, 'ConvRec-R1 stage 1: probability that the '
                                                              "rule-based teacher hallucinates an item (a neighbour "
                                                              'of the true number)'),
                         convrec_teacher_length: int = param(5, "ConvRec-R1 stage 1: items in the teacher's raw "
                                                             'list'),
                         convrec_sim_scale: float = param(2.0, 'ConvRec-R1 Remap: item-item similarity '
                                                          'exp(-|u - v| / scale)'),
                         convrec_remap_lambda: float = param(1.0, 'ConvRec-R1 Remap: weight lambda of the '
                                                             "conversation-item similarity (the paper's 1)"),
                         convrec_reflect_candidates: int = param(6, 'ConvRec-R1 Reflect: top N_r remapped items '
                                                                 'the judge scores (N_r > the list length)'),
                         convrec_reflect_gamma: float = param(0.5, "ConvRec-R1 Reflect: weight gamma of the judge's "
                                                              "-2..2 scores (the paper's 0.5)"),
                         convrec_adjust_reg: float = param(0.01, 'ConvRec-R1 Adjust: penalty on ||w - 1||^2 + '
                                                           "||b||^2 (the paper's 0.01)"),
                         convrec_list_length: int = param(3, 'ConvRec-R1 stage 1: items N in a demonstration')
                         ) -> tuple[list[str], dict]:
    """Demonstrations (one item per line, the top ``convrec_list_length`` of ``s_final``) for ``ranked_list`` rows
    (columns ``numbers``, ``top``), and a summary (hit rates of the teacher's raw lists and of the
    demonstrations, off-catalogue teacher items). Module docstring: the three steps.

    Provenance: paper equations — ConvRec-R1 (Zhu et al., 2025, arXiv:2510.20150), Sec. 3.1 and the appendix on the
    Remap-Reflect-Adjust pipeline (s_remap with p_k = 1/sqrt(k) and lambda = 1, Reflect on the top N_r > N with
    -2..2 scores and gamma = 0.5, Adjust w, b by the regularised multinomial likelihood with 0.01), as read from a
    detailed summary of the paper (the paper's own text was not in the store). The authors' repository
    (github.com/yaochenzhu/Rank-GRPO) releases the resulting SFT data set and ``train_sft.py`` (TRL's SFTTrainer on
    the demonstrations), not the pipeline's code. grpolab's stand-ins, because no LLM or embedding model can be
    queried offline: the rule-based teacher and judge (the task's answer key), numeric item similarity, and
    "mentioned in the prompt" as the conversation-item similarity; the mean over conversations in the Adjust
    objective is grpolab's choice.
    """
    missing = [c for c in ("numbers", "top") if any(c not in r for r in rows)]
    if missing or not rows:
        raise ValueError(f"sft_mode convrec (ConvRec-R1's Remap-Reflect-Adjust) needs rows of the ranked_list task "
                         f"(columns 'numbers' and 'top'); missing: {', '.join(missing) or 'rows'}; use "
                         f"--task ranked_list")
    if convrec_reflect_candidates < convrec_list_length:
        raise ValueError(f"convrec_reflect_candidates ({convrec_reflect_candidates}) must be >= convrec_list_length "
                         f"({convrec_list_length})")
    rng = random.Random(seed)
    index = {v: i for i, v in enumerate(CATALOGUE)}
    teachers = [teacher_list(r["numbers"], rng, noise=convrec_teacher_noise, length=convrec_teacher_length)
                for r in rows]
    reflected = torch.stack([
        reflect_scores(remap_scores(t, r["numbers"], sim_scale=convrec_sim_scale, lam=convrec_remap_lambda),
                       r["numbers"], r["top"], candidates=convrec_reflect_candidates, gamma=convrec_reflect_gamma)
        for t, r in zip(teachers, rows)])
    w, b = fit_adjust(reflected, [[index[v] for v in r["top"]] for r in rows], reg=convrec_adjust_reg)
    final = w * reflected + b
    demos = [[CATALOGUE[i] for i in top_items(final[j], convrec_list_length)] for j in range(len(rows))]

    def hit_rate(lists):
        return sum(len(set(x[:convrec_list_length]) & set(r["top"])) for x, r in zip(lists, rows)) / (
            convrec_list_length * len(rows))

    summary = {"teacher_hit_rate": hit_rate(teachers), "demo_hit_rate": hit_rate(demos),
               "teacher_off_catalogue": sum(v not in index for t in teachers for v in t)}
    return ["\n".join(map(str, d)) for d in demos], summary


declared_params(remap_reflect_adjust)  # its param() defaults become values (a `grpolab sft` component, not registered)
