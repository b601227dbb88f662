"""The episodes of the control policies (``control``, ``mardpg``) as a group fan-out: ``counts[i]`` episodes of row
``i``, each from the row's seeded start state (:func:`start_episodes`), packed prompt-major as one
:class:`~grpolab.batch.RolloutBatch` whose ``[rows, steps]`` layout holds every agent of every environment step
(:func:`pack_episodes`)."""
from __future__ import annotations

import numpy as np
import torch

from ...batch import RolloutBatch
from ...generation.counting import GENERATED
from ...generation.sampling import completion_counts, per_row, row_temperatures
from ..base import fanned_columns, group_identity
from .envs import env_key, row_seed


def start_episodes(pool, rows: list[dict], num_generations, temperature):
    """``(counts, temperatures [R], environments, seeds, start observations [R, N, D])`` of the episodes: row
    ``i``'s ``counts[i]`` episodes (``num_generations``: one count for all rows or one per row) each get the row's
    ``temperature`` (one for all rows or one per row), an environment of the row's kind from ``pool``, reset with
    the episode's seed (``envs.row_seed``) and, in a turn-taking game, the row's seat ``agent`` (``aec.py``)."""
    counts = completion_counts(num_generations, len(rows))
    ep_rows = per_row(rows, counts)
    envs = pool.take([env_key(r) for r in ep_rows])
    seeds = [row_seed(r, i) for i, r in enumerate(ep_rows)]
    cur = torch.from_numpy(np.stack([e.reset(s, r.get("agent")) for e, s, r in zip(envs, seeds, ep_rows)]))
    return counts, row_temperatures(temperature, counts), envs, seeds, cur


def pack_episodes(rows: list[dict], counts: list[int], uids: list[int], seeds: list[int], *, group_offset: int,
                  lengths: torch.Tensor, obs: torch.Tensor, act: torch.Tensor, lps: torch.Tensor, rew: torch.Tensor,
                  terminal: torch.Tensor, truncated: torch.Tensor, last_obs: torch.Tensor,
                  zero_logprobs: bool = False, step_extra: dict | None = None,
                  step_inputs: dict | None = None) -> RolloutBatch:
    """The episodes as a RolloutBatch: step ``(t, n)`` (time t, agent n) is column ``t·N + n`` of ``T·N``
    (T = the longest episode), on the mask up to the episode's length; ``step_data`` ``obs`` / ``action``, the
    per-step log-probs (zeros with ``zero_logprobs``), ``row_data`` ``step_rewards`` (and each ``step_extra``
    tensor ``[R, Tmax, N]``, masked alike; each ``step_inputs`` tensor ``[R, Tmax, N, ...]`` joins ``step_data``, e.g.
    the legal-action masks of a turn-taking game), ``terminal``, ``last_obs``, ``agents``, ``agent_returns`` [R, N];
    ``columns["completion"]`` is the episode's return averaged over agents, ``episode_length`` its steps.
    ``obs`` / ``act`` are ``[R, Tmax, N, ...]``, ``lps`` / ``rew`` ``[R, Tmax, N]``."""
    R, _, N = lps.shape
    T = int(lengths.max())
    steps = torch.arange(T)[None, :, None].expand(R, T, N)
    mask = (steps < lengths[:, None, None]).reshape(R, T * N).float()
    GENERATED.add(R, int(lengths.sum()) * N)

    def flat(x):  # [R, Tmax, N, ...] -> [R, T·N, ...]
        return x[:, :T].reshape(R, T * N, *x.shape[3:])

    agent_returns = rew[:, :T].sum(1)  # [R, N]
    ep_rows = per_row(rows, counts)
    columns = fanned_columns(rows, counts)
    columns["prompt"] = [str(r.get("prompt", f"{r['env']} seed {r['seed']}")) for r in ep_rows]
    columns["completion"] = [float(v) for v in agent_returns.mean(1)]
    columns["episode_length"] = [int(v) for v in lengths]
    lp_flat = flat(lps) * mask
    return RolloutBatch(
        prompt_ids=torch.tensor(seeds, dtype=torch.long)[:, None], prompt_mask=torch.ones(R, 1, dtype=torch.long),
        completion_ids=torch.arange(T * N).expand(R, T * N).clone(), completion_mask=mask,
        behavior_logprobs=torch.zeros_like(lp_flat) if zero_logprobs else lp_flat,
        completion_attention_mask=mask.long(), truncated=truncated, columns=columns,
        **group_identity(counts, uids, group_offset),
        step_data={"obs": flat(obs), "action": flat(act), **{k: flat(v) for k, v in (step_inputs or {}).items()}},
        row_data={"step_rewards": flat(rew) * mask, "terminal": terminal, "last_obs": last_obs,
                  "agents": torch.full((R,), N, dtype=torch.long), "agent_returns": agent_returns,
                  **{k: flat(v) * mask for k, v in (step_extra or {}).items()}})
