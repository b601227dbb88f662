"""``ranked_list``: a ranked-list task with per-rank rewards, for rank-level methods (Rank-GRPO, seed 000-91).

Each prompt lists six distinct numbers (1..99) and asks for the three largest, one per line, largest first. The
reply is a ranked list of ``K = 3`` items: item k is the k-th line of the completion (lines split at ``\\n``, empty
lines count, as the authors' token segmentation counts them; :mod:`grpolab.stages.rank_items` marks the same
lines as token spans). The item of line k is the first integer on it after a list marker (``1.``, ``2)``, ``-``); it is a *hit* (``h_k = 1``) when it is one
of the three largest and not already named on an earlier line.

Rewards, one column per rank, as Rank-GRPO's causal log-decay reward (the authors' ``reward_func_log_decay``,
github.com/yaochenzhu/Rank-GRPO ``libs/reward_funcs.py``): rank k earns the DCG of the list from rank k on,

    ``rank_k = sum_{j=k}^{K} h_j / log2(j + 1)``,

so an item is credited only with what it and the items after it achieve, never with earlier items (no
non-causal credit). ``rank_1`` is the list's DCG@3 (weight 1, the run's total reward); ``rank_2``, ``rank_3`` have
weight 0 (read per span by the advantage, not summed). Rows: ``prompt``, ``numbers``, ``top`` (the three
largest, largest first), ``answer`` (``top`` one per line).
"""
from __future__ import annotations

import math
import random
import re

from ..data import completion_text
from ..registry import TASKS
from .base import Task

K = 3
SYSTEM = "You are a helpful assistant that answers with a ranked list, one item per line."
_INT = re.compile(r"-?\d+")
_MARKER = re.compile(r"^\s*(?:\d+[.)]|[-*])\s+")  # a list marker before the item: "1. ", "2) ", "- "


def list_hits(text: str, top, k: int = K) -> list[int]:
    """``h_1..h_k``: 1 when line j's first integer (after a list marker such as ``1.``) is in ``top`` and not
    named on an earlier line."""
    lines = text.split("\n")
    gold, seen, hits = {int(v) for v in top}, set(), []
    for j in range(k):
        found = _INT.search(_MARKER.sub("", lines[j], count=1)) if j < len(lines) else None
        value = int(found.group()) if found else None
        hit = value is not None and value in gold and value not in seen
        if value is not None:
            seen.add(value)
        hits.append(int(hit))
    return hits


def rank_rewards(hits: list[int]) -> list[float]:
    """``r_k = sum_{j>=k} h_j / log2(j + 1)`` (1-based ranks): the DCG of the list from rank k on."""
    gains = [h / math.log2(j + 2) for j, h in enumerate(hits)]
    return [sum(gains[k:]) for k in range(len(gains))]


def _rank_reward(k: int):
    def reward(prompts=None, completions=None, top=None, **kwargs) -> list[float]:
        return [rank_rewards(list_hits(completion_text(c), t))[k] for c, t in zip(completions, top)]

    reward.__name__ = f"rank_{k + 1}"
    return reward


def _row(rng: random.Random) -> dict:
    numbers = rng.sample(range(1, 100), 6)
    top = sorted(numbers, reverse=True)[:K]
    content = (f"Here are six numbers: {', '.join(map(str, numbers))}. List the three largest, largest first, "
               f"one number per line and nothing else.")
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
            "numbers": numbers, "top": top, "answer": "\n".join(map(str, top))}


@TASKS.register("ranked_list", needs=("text",))
def ranked_list(n_train: int = 1000, n_eval: int = 100, seed: int = 1234) -> Task:
    """``n_train + n_eval`` prompts with distinct number sets drawn with ``seed``; the first ``n_eval`` are held
    out (no set is in both splits). Per-rank rewards ``rank_1..rank_3`` (module docstring).

    Provenance: grpolab's own — a built-in ranked-list task for rank-level methods (``rank_grpo``); its per-rank
    reward follows the authors' causal log-decay reward (github.com/yaochenzhu/Rank-GRPO,
    libs/reward_funcs.py reward_func_log_decay), with a top-3 set in place of the movie catalogue.
    """
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n_train + n_eval:
        row = _row(rng)
        key = frozenset(row["numbers"])
        if key not in seen:
            seen.add(key)
            rows.append(row)
    rewards = [(f"rank_{k + 1}", _rank_reward(k), 1.0 if k == 0 else 0.0) for k in range(K)]
    return Task("ranked_list", rows[n_eval:], rows[:n_eval], rewards=rewards,
                description="the three largest of six numbers, one per line; per-rank DCG rewards rank_1..rank_3")
