"""Replay batch stages: EFRame (exploration-filter-replay), RePO (per-prompt replay) and R^2VPO (stale rows).

All keep whole rows of past batches (one-row :class:`RolloutBatch` objects,
trimmed to their own width) and put them back into later batches with the
behaviour log-probs they were sampled with, so the importance ratio
``pi_theta / pi_behaviour`` of the loss corrects for their staleness. Their
buffers and random generators are in ``state_dict`` (exact resume).
"""
from __future__ import annotations

import copy
import itertools
from collections import OrderedDict

import torch

from ..batch import RolloutBatch
from ..errors import ConfigError
from ..registry import BATCH_STAGES, param
from ._checks import require_at_least
from .batch_pruning import row_advantage, score_new_rows, set_group_advantages


def _rows(batch: RolloutBatch, index) -> list[RolloutBatch]:
    """One trimmed single-row batch per index (what the buffers store)."""
    return [batch.select([int(i)]).trim() for i in index]


def _stack(rows: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    return RolloutBatch.concat(rows, pad_id=pad_id) if len(rows) > 1 else rows[0]


def _with_group(row: RolloutBatch, gid: int) -> RolloutBatch:
    out = row.select([0])
    out.group_ids = torch.tensor([gid], dtype=torch.long)
    return out


# ----------------------------------------------------------------------------- EFRame (000-11)

def _check_eframe(cfg) -> None:
    if cfg.eframe_explore_n < 2:
        raise ConfigError(f"eframe_explore_n: exploration groups need >= 2 completions, got {cfg.eframe_explore_n}")
    require_at_least(cfg, 1, "eframe_replay_freq")
    require_at_least(cfg, 0, "eframe_replay_size")


@BATCH_STAGES.register("eframe", check=_check_eframe)
class EFRame:
    """EFRame: Exploration (extra high-temperature rollouts), Filter, Replay.

    *EFRame: Deeper Reasoning via Exploration-Filter-Replay Reinforcement
    Learning Framework* (Wang et al., 2025, arXiv:2506.22200), seed 000-11. The
    rules follow the authors' code (github.com/597358816/EFRame,
    ``verl/trainer/ray_trainer.py``):

    1. **Exploration.** A *hard* prompt is a group with zero signal and no
       success: every row has ``|A_i| < 1e-6`` and reward
       ``<= eframe_fail_reward`` (code: ``|A| < 0.01`` and reward ``< 0.01``).
       Each hard prompt gets ``eframe_explore_n`` more completions at
       temperature ``eframe_explore_temperature`` (code: 20 at 1.2), in a new
       group (``ctx.allocate_groups``), scored, with group-z-score advantages
       over that exploration group alone (as the code). Only the rare
       informative ones are kept: ``|A_i| > eframe_explore_threshold`` (code:
       1.0; with n = 20, a lone success has ``A ~ 4.4``, the failures ``-0.22``).
    2. **Filter.** Of the original rows keep those with
       ``|A_i| > eframe_filter_threshold`` (code: 0.05; drops zero-advantage
       groups); with ``eframe_filter_overlong`` also drop truncated rows with a
       positive advantage (code's ``_filtering_overlong``).
    3. **Replay.** Rows of the step's final batch with
       ``|A_i| > eframe_replay_threshold`` (code: 1.0) enter a FIFO buffer of
       capacity ``eframe_replay_size x`` (rows of the step's original batch)
       (code: 2.0). Every ``eframe_replay_freq`` steps (code: 5; steps where
       ``(step + 1) % freq == 0``), when the buffer holds at least one batch
       worth of rows, ``floor(size / n) * n`` of them (all when full) are drawn
       uniformly without replacement and replayed with their original
       behaviour log-probs and advantages.

    Choices (documented): the code replays in a *separate* optimiser update;
    a batch stage appends the replayed rows to the step's batch (one update),
    and draws them *before* the step's own rows enter the buffer (so no row
    appears twice in a batch). Replayed rows keep their original rows grouped
    together under fresh group ids. The code also accumulates filtered rows
    across steps until a full batch is ready; here each step trains on what
    survives, and if nothing survives (every group zero-advantage, no useful
    exploration) the original batch is returned unchanged (its advantages are
    zero, so it moves nothing but the step is not lost). Exploration rows are
    sampled with plain generation and always get ``group_zscore`` advantages.

    Provenance: authors' code — https://github.com/597358816/EFRame, verl/trainer/ray_trainer.py (exploration,
    filter and replay thresholds as there); replayed rows join the step's batch instead of a separate update.
    Test: tests/test_stages.py::test_eframe_explores_hard_prompts_filters_and_remembers.
    """

    def __init__(self, *,
                 eframe_explore_n: int = param(8, 'EFRame: extra completions for each hard (all-fail, '
                                               'zero-advantage) prompt'),
                 eframe_explore_temperature: float = param(1.2, 'EFRame: sampling temperature of the exploration '
                                                           'rollouts'),
                 eframe_explore_threshold: float = param(1.0, 'EFRame: keep exploration rows with |advantage| > this'),
                 eframe_fail_reward: float = param(0.0, 'EFRame: a prompt is hard when all its rewards are <= this '
                                                   'and its advantages are all zero'),
                 eframe_filter_threshold: float = param(0.05, 'EFRame: keep original rows with |advantage| > this'),
                 eframe_filter_overlong: bool = param(True, 'EFRame: drop truncated rows with a positive advantage'),
                 eframe_replay_threshold: float = param(1.0, 'EFRame: rows with |advantage| > this enter the replay '
                                                        'buffer'),
                 eframe_replay_size: float = param(2.0, 'EFRame: replay buffer capacity, in batches (x rows of the '
                                                   'first batch)'),
                 eframe_replay_freq: int = param(5, 'EFRame: replay buffered rows every N steps'),
                 seed: int = 0):
        self.explore_n = int(eframe_explore_n)
        self.explore_temperature = float(eframe_explore_temperature)
        self.explore_threshold = float(eframe_explore_threshold)
        self.fail_reward = float(eframe_fail_reward)
        self.filter_threshold = float(eframe_filter_threshold)
        self.filter_overlong = bool(eframe_filter_overlong)
        self.replay_threshold = float(eframe_replay_threshold)
        self.replay_size = float(eframe_replay_size)
        self.replay_freq = int(eframe_replay_freq)
        self.generator = torch.Generator().manual_seed(int(seed) + 1100)
        self.buffer: list[RolloutBatch] = []   # FIFO, oldest first
        self.buffer_keys: list[tuple] = []     # (step, original group id): rows replayed together
        self.capacity = 0                      # set from the first batch's row count
        self.batch_rows = 0


    # ------------------------------------------------------------ the three parts
    def hard_groups(self, batch: RolloutBatch) -> list[int]:
        """Group ids with zero signal and no success (all ``|A| < 1e-6``, all rewards ``<= fail_reward``)."""
        absadv, r = row_advantage(batch).abs(), batch.scalar_rewards
        out = []
        for g in torch.unique(batch.group_ids).tolist():
            sel = batch.group_ids == g
            rg = r[sel]
            if bool((absadv[sel] < 1e-6).all()) \
                    and bool((torch.nan_to_num(rg, nan=float("-inf")) <= self.fail_reward).all()):
                out.append(g)
        return out

    def explore(self, batch: RolloutBatch, ctx) -> RolloutBatch | None:
        hard = self.hard_groups(batch)
        if not hard:
            return None
        first = [int((batch.group_ids == g).nonzero()[0]) for g in hard]
        uids = [int(batch.prompt_uids[i]) for i in first]
        extra = ctx.generate([ctx.rows[u] for u in uids], uids, group_offset=ctx.allocate_groups(len(uids)),
                             num_generations=self.explore_n, temperature=self.explore_temperature)
        extra = score_new_rows(ctx, extra)
        keep = (row_advantage(extra).abs() > self.explore_threshold).nonzero().squeeze(-1)
        return extra.select(keep) if len(keep) else None

    def filter(self, batch: RolloutBatch) -> torch.Tensor:
        adv = row_advantage(batch)
        keep = adv.abs() > self.filter_threshold
        if self.filter_overlong:
            keep &= ~(batch.truncated & (adv > 0))
        return keep.nonzero().squeeze(-1)

    def draw_replay(self, ctx, step: int) -> RolloutBatch | None:
        n = self.batch_rows
        if (step + 1) % self.replay_freq != 0 or n == 0 or len(self.buffer) < n:
            return None
        size = len(self.buffer)
        if size >= self.capacity:
            pick = list(range(size))
        else:
            pick = sorted(torch.randperm(size, generator=self.generator)[:(size // n) * n].tolist())
        keys = list(OrderedDict.fromkeys(self.buffer_keys[i] for i in pick))
        first = ctx.allocate_groups(len(keys))
        gid = {k: first + j for j, k in enumerate(keys)}
        rows = [_with_group(self.buffer[i], gid[self.buffer_keys[i]]) for i in pick]
        return _stack(rows, ctx.pad_id)

    def remember(self, batch: RolloutBatch, step: int) -> None:
        keep = (row_advantage(batch).abs() > self.replay_threshold).nonzero().squeeze(-1).tolist()
        self.buffer.extend(_rows(batch, keep))
        self.buffer_keys.extend((int(step), int(batch.group_ids[i])) for i in keep)
        excess = len(self.buffer) - self.capacity
        if excess > 0:  # FIFO: drop the oldest
            del self.buffer[:excess], self.buffer_keys[:excess]

    def __call__(self, batch, ctx, step):
        pad = ctx.pad_id
        if self.capacity == 0:
            self.batch_rows = batch.num_rows
            self.capacity = int(round(self.replay_size * batch.num_rows))
        explored = self.explore(batch, ctx)
        kept = self.filter(batch)
        parts = ([batch.select(kept)] if len(kept) else []) + ([explored] if explored is not None else [])
        if not parts:
            ctx.log(f"[grpolab] eframe: step {step + 1}: no row passed the filter; training on the unfiltered batch")
            parts = [batch]
        out = _stack(parts, pad)
        replayed = self.draw_replay(ctx, step)
        self.remember(out, step)
        return out if replayed is None else RolloutBatch.concat([out, replayed], pad_id=pad)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "buffer": copy.deepcopy(self.buffer),
                "buffer_keys": list(self.buffer_keys), "capacity": self.capacity, "batch_rows": self.batch_rows}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.buffer = copy.deepcopy(state["buffer"])
        self.buffer_keys = [tuple(k) for k in state["buffer_keys"]]
        self.capacity, self.batch_rows = int(state["capacity"]), int(state["batch_rows"])


# ----------------------------------------------------------------------------- RePO (000-34)

REPO_STRATEGIES = ("all", "random_k", "highest_k", "recent_k", "max_variance_k")


def _check_repo_replay(cfg) -> None:
    if cfg.repo_strategy not in REPO_STRATEGIES:
        raise ConfigError(f"repo_strategy: '{cfg.repo_strategy}' is not valid; valid values: "
                          f"{', '.join(REPO_STRATEGIES)}")
    if cfg.repo_adv_norm not in ("mixed", "split"):
        raise ConfigError(f"repo_adv_norm: '{cfg.repo_adv_norm}' is not valid; valid values: mixed, split")
    require_at_least(cfg, 1, "repo_buffer_size", "repo_num_replay", "repo_min_buffer")


@BATCH_STAGES.register("repo_replay", check=_check_repo_replay)
class RePOReplay:
    """RePO: each prompt's group = its on-policy rollouts + samples replayed from its buffer.

    *RePO: Replay-Enhanced Policy Optimization* (Li, Zhou, Lam, Yang, Lu, 2025,
    arXiv:2506.09340), seed 000-34. Rules follow the authors' code
    (github.com/SihengLi99/RePO, ``src/replay_grpo_trainer.py``):

    * **Buffer.** One FIFO per prompt (keyed by ``prompt_uid``, never the
      text) of at most ``repo_buffer_size`` completions (code:
      ``max_cache_size``). After retrieval, *all* the step's on-policy rows are
      pushed, so a step replays only earlier steps' samples.
    * **Retrieval** (``repo_strategy``, needs ``>= repo_min_buffer`` entries,
      code ``min_cache_to_replay``), ``k = min(size, repo_num_replay)``:
      ``all`` (full scope: every entry), ``random_k`` (uniform without
      replacement, the stage's seeded generator), ``highest_k`` (reward-
      oriented: largest stored scalar reward, newest first on ties),
      ``recent_k`` (recency: the k newest), ``max_variance_k`` (the k-subset
      whose stored rewards have the largest population variance, ties: larger
      sum, then enumeration order — exhaustive, as the code).
    * **Off-policy rows** keep their original ``behavior_logprobs`` (the
      ratio corrects), prompt, completion, rewards and scalar reward.
    * **Advantages** (``repo_adv_norm``): ``mixed`` — the replayed rows join
      their prompt's on-policy group and the union group gets
      ``group_zscore`` (``cfg.advantage_epsilon``), as the issue describes;
      ``split`` — on-policy rows keep the trainer's advantages and the
      replayed rows of a prompt form their own group (fresh group id) with
      their own z-score (the authors' released script uses ``split``).

    Choices (documented): groups without replayed rows keep the trainer's
    advantages in ``mixed`` mode; the paper's objective sums an on-policy and
    an off-policy term, each aggregated on its own (``off_policy_loss_coef``);
    here all rows enter the configured loss aggregation together. The stored
    scalar reward is the one computed at the step the sample was drawn.

    Provenance: authors' code — https://github.com/SihengLi99/RePO, src/replay_grpo_trainer.py (per-prompt
    buffer, retrieval strategies, split normalisation); all rows enter one loss aggregation instead of separate
    on- and off-policy terms.
    Test: tests/test_stages.py::test_repo_retrieval_strategies_hand_computed,
    tests/test_stages.py::test_repo_mixed_union_group_advantages.
    """

    def __init__(self, *,
                 repo_buffer_size: int = param(16, 'RePO: per-prompt FIFO replay buffer size (completions)'),
                 repo_num_replay: int = param(8, 'RePO: off-policy completions replayed per prompt (k)'),
                 repo_strategy: str = param('highest_k', 'RePO: replay strategy',
                                            ['all', 'random_k', 'highest_k', 'recent_k', 'max_variance_k']),
                 repo_min_buffer: int = param(1, "RePO: replay only once a prompt's buffer holds this many "
                                              'completions'),
                 repo_adv_norm: str = param('mixed', "RePO: 'mixed' = z-score over on-policy + replayed (union "
                                            "group); 'split' = replayed rows z-scored on their own",
                                            ['mixed', 'split']),
                 seed: int = 0):
        self.buffer_size = int(repo_buffer_size)
        self.num_replay = int(repo_num_replay)
        self.strategy = repo_strategy
        self.min_buffer = int(repo_min_buffer)
        self.adv_norm = repo_adv_norm
        self.generator = torch.Generator().manual_seed(int(seed) + 3400)
        self.buffers: dict[int, list[RolloutBatch]] = {}  # prompt uid -> rows, oldest first


    def retrieve(self, uid: int) -> list[RolloutBatch]:
        """The buffered rows replayed for prompt ``uid`` under the configured strategy."""
        buf = self.buffers.get(uid, [])
        if len(buf) < self.min_buffer or not buf:
            return []
        if self.strategy == "all":
            return list(buf)
        k = min(len(buf), self.num_replay)
        rewards = [float(torch.nan_to_num(r.scalar_rewards, nan=float("-inf"))[0]) for r in buf]
        if self.strategy == "recent_k":
            idx = list(range(len(buf) - k, len(buf)))
        elif self.strategy == "random_k":
            idx = torch.randperm(len(buf), generator=self.generator)[:k].tolist()
        elif self.strategy == "highest_k":  # stable on (-reward, -age): newest first among equals
            idx = sorted(range(len(buf)), key=lambda i: (-rewards[i], -i))[:k]
        else:  # max_variance_k
            best, best_key = None, None
            for subset in itertools.combinations(range(len(buf)), k):
                s = torch.tensor([rewards[i] for i in subset], dtype=torch.float64)
                key = (float(s.var(unbiased=False)), float(s.sum()))
                if best_key is None or key > best_key:
                    best, best_key = subset, key
            idx = list(best)
        return [buf[i] for i in idx]

    def push(self, batch: RolloutBatch) -> None:
        for i, row in enumerate(_rows(batch, range(batch.num_rows))):
            buf = self.buffers.setdefault(int(batch.prompt_uids[i]), [])
            buf.append(row)
            del buf[:max(0, len(buf) - self.buffer_size)]

    def __call__(self, batch, ctx):
        pad = ctx.pad_id
        replayed, union_groups = [], []
        for g in torch.unique(batch.group_ids).tolist():
            sel = (batch.group_ids == g).nonzero().squeeze(-1)
            rows = self.retrieve(int(batch.prompt_uids[sel[0]]))
            if not rows:
                continue
            gid = g if self.adv_norm == "mixed" else ctx.allocate_groups(1)
            replayed.extend(_with_group(r, gid) for r in rows)
            union_groups.append(gid)
        self.push(batch)
        if not replayed:
            return batch
        out = RolloutBatch.concat([batch, _stack(replayed, pad)], pad_id=pad)
        # z-score the groups that got replayed rows (the union group, or the replay-only group)
        redo = torch.isin(out.group_ids, torch.tensor(union_groups))
        scalar = out.scalar_rewards.clone()
        part = out.select(redo.nonzero().squeeze(-1))
        set_group_advantages(ctx, part, scalar[redo])
        out.advantages = out.advantages.clone()
        out.advantages[redo] = part.advantages
        return out

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "buffers": copy.deepcopy(self.buffers)}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.buffers = {int(k): v for k, v in copy.deepcopy(state["buffers"]).items()}


# ----------------------------------------------------------------------------- R^2VPO (000-75)

def _check_r2vpo_replay(cfg) -> None:
    require_at_least(cfg, 1, "r2vpo_replay_steps")
    require_at_least(cfg, 0, "r2vpo_replay_max_rows")


@BATCH_STAGES.register("r2vpo_replay", check=_check_r2vpo_replay)
class R2VPOReplay:
    """R^2VPO's off-policy reuse of stale samples: rows of the last ``r2vpo_replay_steps`` steps are replayed.

    *R^2VPO: Ratio-Variance Regularized Policy Optimization for Efficient LLM Fine-tuning* (Luo, Han, Hu, Li,
    Hao, 2026, arXiv:2601.03320; ICML 2026 version arXiv:2605.26784), seed 000-75. The abstract: hard clipping
    makes data "unusable once it becomes slightly stale"; R^2VPO instead "dynamically reweights stale samples
    rather than discarding them", reusing them "from a replay buffer".

    * **Buffer.** After each step's retrieval, every row of the step's batch (advantages and rewards as computed
      when it was sampled, and its ``behavior_logprobs``: the log-probs of the policy that sampled it) enters the
      buffer with its step. A row sampled at step ``s`` is replayed at steps ``s+1 .. s+K`` (``K =
      r2vpo_replay_steps``) and then dropped; ``r2vpo_replay_max_rows > 0`` caps the replayed rows per step (the
      newest first; 0 = all). Replayed rows keep their original groups together under fresh group ids and carry
      column ``replay_age`` (steps since sampled; 0 for the step's own rows).
    * **Re-weighting.** Nothing is clipped or discarded: the loss's ratio is ``r = pi_theta / pi_b`` against
      each row's own behaviour policy ``b`` (its stored log-probs), and the ratio-variance term of the recipe
      (regularizer ``ratio_variance``) penalises ``lambda (r - 1)^2`` on fresh and stale tokens alike, its
      moment -- and so the multiplier ``lambda`` -- measured over both. Per token the objective
      ``-r A + lambda (r - 1)^2`` has the gradient ``-r (A - 2 lambda (r - 1)) grad log pi``: a stale sample is
      weighted by ``r (A - 2 lambda (r - 1))`` instead of ``A`` -- its importance ratio, damped the further the
      ratio has drifted from 1 and the tighter the constraint binds (the dual variable grows while stale data
      push ``E[(r - 1)^2]`` above ``delta``). That is the weighting the abstract describes ("dynamically
      reweighting", a distributional "soft brake" that "naturally down-weights" stale data).

    Metrics: ``rollout/r2vpo_replayed_rows``, ``rollout/r2vpo_replay_age_mean``. Buffer in ``state_dict``.

    Provenance: reconstructed from the abstract — the stored copies of both arXiv versions hold the abstract and
    the introduction only and no authors' code was found (searched: the code corpus for R2VPO / ratio-variance,
    the pages corpus for both arXiv versions); the buffer by age (``K`` steps), replaying every buffered row with
    its sampling-time advantage, and the re-weighting being the ratio under the ratio-variance constraint (no
    further per-sample factor) are grpolab's choices.
    Test: tests/test_r2vpo_replay.py.
    """

    def __init__(self, *,
                 r2vpo_replay_steps: int = param(2, 'R2VPO replay: a row is replayed in the K steps after the one it '
                                                 'was sampled in, then dropped'),
                 r2vpo_replay_max_rows: int = param(0, 'R2VPO replay: at most this many stale rows per step, the '
                                                    'newest first (0 = all buffered rows)')):
        self.max_age = int(r2vpo_replay_steps)
        self.max_rows = int(r2vpo_replay_max_rows)
        self.buffer: list[tuple[int, int, RolloutBatch]] = []  # (step sampled, group id then, one-row batch)

    def retrieve(self, step: int) -> list[tuple[int, int, RolloutBatch]]:
        """The buffered entries replayed at ``step`` (after dropping those older than ``K`` steps), oldest first."""
        self.buffer = [e for e in self.buffer if 0 < step - e[0] <= self.max_age]
        if self.max_rows and len(self.buffer) > self.max_rows:
            return self.buffer[len(self.buffer) - self.max_rows:]
        return list(self.buffer)

    def __call__(self, batch, ctx, step):
        picked = self.retrieve(int(step))
        batch.columns["replay_age"] = [0] * batch.num_rows
        fresh = batch
        self.buffer.extend((int(step), int(batch.group_ids[i]), row)
                           for i, row in enumerate(_rows(batch, range(batch.num_rows))))
        ages = [int(step) - s for s, _, _ in picked]
        ctx.metric("r2vpo_replayed_rows", len(picked))
        ctx.metric("r2vpo_replay_age_mean", sum(ages) / len(ages) if ages else 0.0)
        if not picked:
            return fresh
        keys = list(OrderedDict.fromkeys((s, g) for s, g, _ in picked))
        first = ctx.allocate_groups(len(keys))
        gid = {k: first + j for j, k in enumerate(keys)}
        rows = []
        for (s, g, row), age in zip(picked, ages):
            r = _with_group(row, gid[(s, g)])
            r.columns = {**r.columns, "replay_age": [age]}
            rows.append(r)
        return RolloutBatch.concat([fresh, _stack(rows, ctx.pad_id)], pad_id=ctx.pad_id)

    def state_dict(self) -> dict:
        return {"buffer": copy.deepcopy(self.buffer)}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = [(int(s), int(g), r) for s, g, r in copy.deepcopy(state["buffer"])]
