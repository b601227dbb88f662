"""Rollout strategies that add hints to the prompt: Scaf-GRPO, Guide, GHPO.

All three first sample the plain prompts and score them (``ctx.score``); a
prompt whose group has no success (scalar reward >= the core key
``success_threshold``, shared by every component that counts successes) may be
sampled again with guidance appended to its last user message (or to a string
prompt), built by :func:`with_hint` from the row's columns:

* ``hints`` — list of str, abstract to concrete; tier ``l`` shows ``hints[:l]``;
* ``solution`` — str, a reference solution (GHPO reveals a prefix of it).

Built-in tasks with these columns: ``countdown`` (and multi-step ``arithmetic``).
The data row is never modified (a shallow copy gets the new ``prompt``).

Every batch these strategies return carries two columns: ``hint_level`` (0 for a
plain row; the hint tier, or the GHPO stage, otherwise) and ``hint`` (the text
added, None for plain rows), and each step logs ``rollout/frac_hinted`` (the
share of returned rows with ``hint_level > 0``) through ``ctx.metric``. Hinted
rows keep the prompt uid and the group id of the prompt they stand for, and
their ``behavior_logprobs`` are the log-probs they were sampled with, under the
*hinted* context. Which context the loss conditions on (``prompt_ids``) is the
difference between the methods:

* Scaf-GRPO and GHPO train on the hinted prompt (``prompt_ids`` = hinted, so
  the importance ratio is the usual on-policy one);
* Guide trains on the hint-free prompt (``prompt_ids`` = plain), so the ratio
  is pi_theta(o | q) / pi_old(o | q, h).
"""
from __future__ import annotations

import torch

from ..batch import RolloutBatch
from ..errors import ConfigError
from ..registry import ROLLOUT_STRATEGIES
from ..registry import param

HINT_TASKS = "countdown, arithmetic (multi-step)"
# GHPO authors' hint sentence (hkgc-1/GHPO, src/ghpo/ghpo_trainer.py, _generate_and_score_completions)
SOLUTION_HEADER = ("The following text is the beginning part of the answer, which you can refer to for solving the "
                   "problem:")


# ----------------------------------------------------------------- hint text
def require_column(row: dict, column: str, strategy: str):
    """``row[column]``, or a clear error naming the column and the tasks that have it."""
    if column not in row or row[column] is None:
        what = {"hints": "a list of hint strings, abstract to concrete",
                "solution": "a reference solution string"}.get(column, "")
        raise ValueError(f"rollout strategy '{strategy}' needs a '{column}' column ({what}) in every data row; "
                         f"this row has: {', '.join(k for k in row if k != 'prompt') or 'no columns'}. "
                         f"Built-in tasks with it: {HINT_TASKS}; with --data add the column to the JSONL rows")
    return row[column]


def hint_text(hints: list[str], level: int) -> str:
    """Tier ``level`` (1-based): the first ``level`` hints, numbered."""
    if level < 1 or level > len(hints):
        raise ValueError(f"hint tier {level} is out of range: the row has {len(hints)} hints")
    return "Hints:\n" + "\n".join(f"{i + 1}. {h}" for i, h in enumerate(hints[:level]))


def solution_prefix(solution: str, fraction: float) -> str:
    """The first ``round(fraction * len(solution))`` characters of a reference solution.

    GHPO authors' rule (``x["solution_hint"][:round(len(x["solution_hint"]) * 0.25)]`` etc.; Python's
    ``round`` rounds halves to even).
    """
    return solution[:round(len(solution) * fraction)]


def with_hint(row: dict, text: str) -> dict:
    """A copy of ``row`` whose prompt ends with ``text``.

    Chat prompts get the text appended to the last user message (after a blank
    line); string prompts get it appended at the end. ``row`` is not modified.
    """
    prompt = row["prompt"]
    if isinstance(prompt, str):
        new = f"{prompt}\n\n{text}"
    else:
        users = [i for i, m in enumerate(prompt) if m.get("role") == "user"]
        if not users:
            raise ValueError("with_hint: the chat prompt has no user message to add the hint to")
        new = [dict(m) for m in prompt]
        new[users[-1]]["content"] = f"{new[users[-1]]['content']}\n\n{text}"
    out = dict(row)
    out["prompt"] = new
    return out


# ---------------------------------------------------------- shared mechanics
def _mark(batch: RolloutBatch, levels: list[int], hints: list) -> RolloutBatch:
    batch.columns["hint_level"] = list(levels)
    batch.columns["hint"] = list(hints)
    return batch


def _plain(ctx, rows, uids, group_offset, budgets, temperatures):
    """Sample and score the plain prompts; returns (batch, scalar rewards, per-prompt row index lists)."""
    batch = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
    scalar = ctx.score(batch)
    _mark(batch, [0] * batch.num_rows, [None] * batch.num_rows)
    gids = batch.group_ids.tolist()
    members = [[r for r, g in enumerate(gids) if g == group_offset + i] for i in range(len(rows))]
    return batch, scalar, members


def _hinted(ctx, rows, uids, texts, levels, num_generations, temperatures):
    """Sample ``rows`` with ``texts`` added to their prompts (fresh group ids), score, mark.

    Returns (batch, scalar rewards, per-prompt row index lists).
    """
    hinted = [with_hint(r, t) for r, t in zip(rows, texts)]
    offset = ctx.allocate_groups(len(rows))
    batch = ctx.generate(hinted, uids, group_offset=offset, num_generations=num_generations,
                         temperature=temperatures)
    scalar = ctx.score(batch)
    gids = batch.group_ids.tolist()
    members = [[r for r, g in enumerate(gids) if g == offset + i] for i in range(len(rows))]
    lv = [0] * batch.num_rows
    tx = [None] * batch.num_rows
    for i, rs in enumerate(members):
        for r in rs:
            lv[r], tx[r] = levels[i], texts[i]
    return _mark(batch, lv, tx), scalar, members


def _assemble(ctx, parts: list[tuple[RolloutBatch, list[int], int]]) -> RolloutBatch:
    """Rows ``idx`` of each batch, relabelled to group ``gid``, stacked and ordered by group (stable).

    Logs ``rollout/frac_hinted``: the share of the returned rows sampled with a hint in the context.
    """
    pieces = []
    for batch, idx, gid in parts:
        if not idx:
            continue
        sub = batch.select(idx)
        sub.group_ids = torch.full_like(sub.group_ids, gid)
        pieces.append(sub)
    out = RolloutBatch.concat(pieces, pad_id=ctx.tokenizer.pad_token_id)
    order = torch.sort(out.group_ids, stable=True).indices
    out = out.select(order)
    levels = out.columns["hint_level"]
    ctx.metric("frac_hinted", sum(lv > 0 for lv in levels) / max(len(levels), 1))
    return out


def _pick(values, i):
    return None if values is None else values[i]


def _budget(ctx, budgets, i) -> int:
    return int(budgets[i]) if budgets is not None else int(ctx.cfg.num_generations)


def _solved(scalar: torch.Tensor, rows: list[int], threshold: float) -> bool:
    return bool((scalar[rows] >= threshold).any()) if rows else False


# ----------------------------------------------------------------- Scaf-GRPO
def _check_scaf_grpo(cfg) -> None:
    if cfg.scaf_patience < 1:
        raise ConfigError("scaf_patience must be >= 1 (visits without success before hints)")
    if cfg.scaf_hint_samples < 1 or cfg.scaf_replace_num < 1:
        raise ConfigError("scaf_hint_samples and scaf_replace_num must be >= 1")
    if cfg.scaf_replace_num > cfg.num_generations:
        raise ConfigError(f"scaf_replace_num={cfg.scaf_replace_num} exceeds num_generations="
                          f"{cfg.num_generations}")


@ROLLOUT_STRATEGIES.register("scaf_grpo", check=_check_scaf_grpo, columns=("hints",), needs=("text",))
class ScafGRPO:
    """Scaf-GRPO: tiered in-prompt hints for stagnating prompts (Zhang et al. 2025, arXiv:2510.19807;
    seed 000-61 = 004-02).

    Per prompt uid a tracker counts consecutive visits whose on-policy group had
    no success (reward >= ``success_threshold``). A prompt *stagnates* when
    that count reaches ``scaf_patience`` and the exploration phase
    (``scaf_warmup_steps``) is over. For a stagnating prompt, hinted completions
    (``scaf_hint_samples`` per tier) are sampled with tier ``l`` = ``hints[:l]``
    (abstract to concrete; the authors' tiers are knowledge, planning, solution
    steps); at the *minimal* tier that yields a success, up to
    ``scaf_replace_num`` successful hinted completions replace that many failed
    on-policy completions of the group. The group keeps its size and id and
    regains a non-zero advantage; the hinted rows train on the hinted prompt
    (the authors' default ``replace_hint_prompt=False``: the whole sample,
    prompt included, is replaced; the method is "on-policy" w.r.t. the hinted
    context). If no tier succeeds the group stays all-wrong.

    Schedules: ``search`` (default, the authors' code, which samples every hint
    level of an all-wrong prompt in the same step and keeps the minimal one that
    succeeds) tries tiers 1, 2, ... in rounds within the step and stops at the
    first success; ``escalate`` tries one tier per visit: tier 1 at the first
    stagnating visit, one tier higher after each visit whose hinted samples also
    failed, the same tier after a hinted success. A prompt whose plain group
    succeeds is no longer stagnating: its count and tier reset (hints stop).

    Choices made (the paper leaves them open or our data differ): the
    authors' stagnation test is "all-wrong group after the warm-up"
    (``scaf_patience = 1``); a larger patience waits for that many consecutive
    failed visits. The number of hinted samples per tier is a parameter.

    Provenance: authors' code — https://github.com/dvlab-research/Scaf-GRPO,
    hint_mix_grpo/trainer/ray_trainer.py (tiered hints for all-wrong prompts after the warm-up, minimal
    succeeding tier, replace_hint_prompt=False); scaf_patience > 1 and the escalate schedule are grpolab's
    options.
    Test: tests/test_rollout_hints.py::test_scaf_search_uses_minimal_successful_tier_in_one_step.
    """

    def __init__(self, *,
                 scaf_patience: int = param(1, 'Scaf-GRPO: a prompt stagnates after this many consecutive visits '
                                            "whose group had no success (1 = the authors' code: an all-wrong group "
                                            'after the exploration phase)'),
                 scaf_warmup_steps: int = param(0, 'Scaf-GRPO: exploration phase; no hints before this step (the '
                                                'authors use 50 of their training steps)'),
                 scaf_schedule: str = param('search', "Scaf-GRPO: 'search' tries tiers 1, 2, ... in the same step "
                                            "until one yields a success (the authors' code); 'escalate' tries one "
                                            'tier per visit, one tier higher after each failed visit',
                                            ['search', 'escalate']),
                 scaf_hint_samples: int = param(2, 'Scaf-GRPO: hinted completions sampled per stagnating prompt and '
                                                'tier'),
                 scaf_replace_num: int = param(1, 'Scaf-GRPO: failed on-policy completions of a stagnating group '
                                               'replaced by successful hinted ones at the minimal tier (the authors '
                                               'use 1)'),
                 scaf_max_level: int = param(0, "Scaf-GRPO: highest hint tier used (0 = all of a row's hints)"),
                 success_threshold: float = 1.0):
        self.patience = scaf_patience
        self.warmup = scaf_warmup_steps
        self.schedule = scaf_schedule
        self.samples = scaf_hint_samples
        self.replace_num = scaf_replace_num
        self.max_level = scaf_max_level
        self.threshold = success_threshold
        self.streak: dict[int, int] = {}  # uid -> consecutive visits without success
        self.level: dict[int, int] = {}   # uid -> tier for the next stagnating visit (escalate)


    def _levels(self, row) -> int:
        n = len(require_column(row, "hints", "scaf_grpo"))
        if n == 0:
            raise ValueError("rollout strategy 'scaf_grpo': a row has an empty 'hints' list")
        return min(n, self.max_level) if self.max_level > 0 else n

    def __call__(self, ctx, rows, uids, group_offset, budgets=None, temperatures=None, step: int = 0):
        plain, scalar, members = _plain(ctx, rows, uids, group_offset, budgets, temperatures)
        stagnating = []
        for i, uid in enumerate(uids):
            uid = int(uid)
            if _solved(scalar, members[i], self.threshold):
                self.streak.pop(uid, None)
                self.level.pop(uid, None)
                continue
            self.streak[uid] = self.streak.get(uid, 0) + 1
            if step >= self.warmup and self.streak[uid] >= self.patience:
                stagnating.append(i)
        top = {i: self._levels(rows[i]) for i in stagnating}
        if self.schedule == "search":
            tier = {i: 1 for i in stagnating}
            last = dict(top)
        else:
            tier = {i: min(self.level.get(int(uids[i]), 1), top[i]) for i in stagnating}
            last = dict(tier)
        chosen: dict[int, tuple[RolloutBatch, list[int]]] = {}
        pending = list(stagnating)
        while pending:
            hb, hs, hm = _hinted(ctx, [rows[i] for i in pending], [uids[i] for i in pending],
                                 [hint_text(rows[i]["hints"], tier[i]) for i in pending],
                                 [tier[i] for i in pending], self.samples, [_pick(temperatures, i) for i in pending]
                                 if temperatures is not None else None)
            still = []
            for j, i in enumerate(pending):
                wins = [r for r in hm[j] if float(hs[r]) >= self.threshold]
                if wins:
                    chosen[i] = (hb, wins[:min(self.replace_num, len(members[i]))])
                    if self.schedule == "escalate":
                        self.level[int(uids[i])] = tier[i]
                elif tier[i] < last[i]:
                    tier[i] += 1
                    still.append(i)
                elif self.schedule == "escalate":
                    self.level[int(uids[i])] = min(tier[i] + 1, top[i])
            pending = still
        parts = []
        for i in range(len(rows)):
            gid = group_offset + i
            keep = members[i]
            if i in chosen:
                hb, wins = chosen[i]
                parts.append((plain, keep[:len(keep) - len(wins)], gid))  # the last failed rows make way
                parts.append((hb, wins, gid))
            else:
                parts.append((plain, keep, gid))
        return _assemble(ctx, parts)

    def state_dict(self) -> dict:
        return {"streak": dict(self.streak), "level": dict(self.level)}

    def load_state_dict(self, state: dict) -> None:
        self.streak = {int(k): int(v) for k, v in state["streak"].items()}
        self.level = {int(k): int(v) for k, v in state["level"].items()}


# --------------------------------------------------------------------- Guide
@ROLLOUT_STRATEGIES.register("guide", columns=("hints",), needs=("text",))
def guide(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
          success_threshold: float = 1.0,
          guide_hint_level: int = param(0, "Guide: number of the row's hints (abstract to concrete) put in the "
                                        'hinted context (0 = all)'),
          guide_keep_failed: bool = param(False, 'Guide: keep the failed unguided completions next to the hinted '
                                          'ones in the group (false = the hinted group replaces them)')):
    """Guide (Guide-GRPO): hints for all-wrong prompts, trained as if the hint were absent
    (Nath et al. 2025, "Adaptive Guidance Accelerates Reinforcement Learning of Reasoning
    Models", arXiv:2506.13923; seed 004-16).

    The plain prompts q are sampled and scored. A prompt whose completions all
    fail (reward < ``success_threshold``) is sampled again, as many
    completions as its group had, with the hint h = the first
    ``guide_hint_level`` of the row's ``hints`` (0 = all) added to the context:
    o ~ pi_old(. | q, h). In the training batch these rows keep the HINT-FREE
    prompt q in ``prompt_ids`` while ``behavior_logprobs`` are the log-probs
    under (q, h) they were sampled with, so the configured policy loss sees the
    importance ratio

        w_t = pi_theta(o_t | q, o_<t) / pi_old(o_t | q, h, o_<t)

    and optimises the policy for the context without the hint. Rows stay
    ``SAMPLED`` (the completion tokens are the policy's own); they are marked by
    the ``hint_level`` / ``hint`` columns. The hinted rows are scored with the
    hinted prompt shown to reward functions (what the model saw); the
    ``prompt`` column is then set back to q.

    The hinted group *replaces* the failed group (authors' default;
    ``guide_keep_failed`` keeps both in one group instead). The authors' loss
    treats the hinted rows as off-policy: their ratio is shaped to
    ``r / (r + gamma)`` (gamma = the 0.9 quantile of the ratios) and not
    clipped, while plain rows keep the clipped ratio: the ``guide_grpo`` recipe
    selects that objective (``policy_loss: guide_off_policy``). The authors'
    accuracy filter (groups with accuracy 0 or 1 dropped, hinted groups too)
    is ``dynamic_sampling: true`` on the accuracy reward; the recipe leaves it
    off because on the tiny countdown runs every group would be dropped.

    Provenance: authors' code — https://github.com/vaskar-open-source-research/guide_rl,
    verl/verl/trainer/ppo/ray_trainer.py (RayPPOTrainer.rollout and
    _roll_with_prompt_variant: groups with accuracy below reroll_threshold
    0.001 are regenerated from the hint prompt, the hint-free prompt is put back
    into input_ids, the old log-probs come from the hinted prompt
    (importance_weighted_reroll), rows marked off-policy) and
    verl/verl/trainer/ppo/core_algos.py (compute_policy_loss); settings from
    verl/experiments/math_reasoning/configs/guide_paper_experiments/guide_grpo_qwen.sh
    (8 samples, no KL, clip 0.2, accuracy bounds 0.001/0.999 for plain and
    hinted groups, mixin off). Known differences: the hint text comes from the
    row's ``hints`` list (the authors' data has one prepared hint prompt per
    problem); their optional chain-of-thought reroll (reroll_with_cot, off in
    the paper's script) is not included.
    Test: tests/test_rollout_hints.py::test_guide_hints_only_failed_prompts_and_trains_on_the_plain_prompt.
    """
    plain, scalar, members = _plain(ctx, rows, uids, group_offset, budgets, temperatures)
    failed = [i for i in range(len(rows)) if not _solved(scalar, members[i], success_threshold)]
    parts = []
    hinted_for: dict[int, list[int]] = {}
    if failed:
        hb, hinted_for = _guide_hinted(ctx, rows, uids, failed, plain, members, budgets, temperatures,
                                       guide_hint_level)
    for i in range(len(rows)):
        gid = group_offset + i
        if i in hinted_for:
            if guide_keep_failed:
                parts.append((plain, members[i], gid))
            parts.append((hb, hinted_for[i], gid))
        else:
            parts.append((plain, members[i], gid))
    return _assemble(ctx, parts)


def _guide_hinted(ctx, rows, uids, failed: list[int], plain, members, budgets, temperatures, hint_level: int):
    """Guide's hinted groups of the ``failed`` prompts: sampled with the hint in the context, then given the plain
    prompt tokens and ``prompt`` column. Returns ``(hinted batch, {prompt: its rows in it})``."""
    texts, levels = [], []
    for i in failed:
        hints = require_column(rows[i], "hints", "guide")
        if not hints:
            raise ValueError("rollout strategy 'guide': a row has an empty 'hints' list")
        lv = len(hints) if hint_level <= 0 else min(hint_level, len(hints))
        texts.append(hint_text(hints, lv))
        levels.append(lv)
    hb, _, hm = _hinted(ctx, [rows[i] for i in failed], [uids[i] for i in failed], texts, levels,
                        [_budget(ctx, budgets, i) for i in failed],
                        [_pick(temperatures, i) for i in failed] if temperatures is not None else None)
    # the loss conditions on the hint-free prompt: copy the plain prompt tokens into the hinted rows
    src = torch.zeros(hb.num_rows, dtype=torch.long)
    hinted_for: dict[int, list[int]] = {}
    for j, i in enumerate(failed):
        for r in hm[j]:
            src[r] = members[i][0]
            hb.columns["prompt"][r] = rows[i]["prompt"]
        hinted_for[i] = hm[j]
    hb.prompt_ids = plain.prompt_ids[src]
    hb.prompt_mask = plain.prompt_mask[src]
    return hb, hinted_for


# ---------------------------------------------------------------------- GHPO
def _check_ghpo(cfg) -> None:
    fr = [float(f) for f in cfg.ghpo_fractions]
    if not fr or any(not 0 < f < 1 for f in fr) or fr != sorted(fr):
        raise ConfigError(f"ghpo_fractions must be ascending fractions in (0, 1), got {cfg.ghpo_fractions}")


@ROLLOUT_STRATEGIES.register("ghpo", check=_check_ghpo, columns=("solution",), needs=("text",))
class GHPO:
    """GHPO: difficulty-aware adaptive prompt refinement with partial reference solutions
    (Liu et al. 2025, "GHPO: Adaptive Guidance for Stable and Efficient LLM Reinforcement
    Learning", arXiv:2507.10628; seed 000-94).

    Difficulty detection: the plain group of every prompt is sampled and scored;
    a prompt with no success (reward >= ``success_threshold``) is "beyond
    the model's reach". Its prompt is refined by appending the authors' hint
    sentence (:data:`SOLUTION_HEADER`) and the first ``round(omega * len)``
    characters of the row's ``solution`` (:func:`solution_prefix`), and the
    group is resampled from the refined prompt with the same number of
    completions; the refined group *replaces* the plain one and trains on the
    refined prompt (``prompt_ids`` = refined: imitation of the revealed part
    plus RL on the rest). Prompts the model can solve stay on-policy and
    unchanged.

    Multi-stage schedule, ``omega`` in ``ghpo_fractions`` (authors: 0.25, 0.5,
    0.75):

    * ``within_step`` (default, the authors' code): stage 1, and if the refined
      group still has no success stage 2, ... in the same step; the first group
      with a success (or the last stage's) is kept;
    * ``across_visits`` (grpolab's option, not in the authors' code): one stage
      per visit; a prompt's stage moves up after a visit whose refined group
      also failed, stays after a refined success, and resets once the plain
      prompt is solved.

    Provenance: authors' code — https://github.com/hkgc-1/GHPO,
    src/ghpo/ghpo_trainer.py (GHPOTrainer._generate_and_score_completions):
    groups whose accuracy rewards are all <= 0 are regenerated with
    ``hint_prompt + solution_hint[:round(len * 0.25)]`` appended to the user
    message, then those still all wrong with 0.5, then 0.75, each refined group
    replacing the previous one and training on the refined prompt; the loss is
    the TRL GRPO clipped ratio (recipe config_ghpo.yaml: beta 0, 8 generations,
    scale_rewards true, loss_type bnpo = token mean). Known differences: the
    authors test the first reward function (accuracy) <= 0, here the scalar
    reward < ``success_threshold`` (on the built-in tasks, accuracy 1 +
    0.5 format, threshold 1.0 is the same test); the hint sentence follows a
    blank line (the authors: a newline and a space); the code's padding trick
    that regenerates the first group of a batch with its plain prompt when no
    group failed (to keep distributed generation in step) is not reproduced.
    Test: tests/test_rollout_hints.py::test_ghpo_reveals_growing_fractions_within_a_step.

    ``hint_level`` is the stage (1-based); ``hint`` the text appended.
    """

    def __init__(self, *,
                 ghpo_fractions: list = param([0.25, 0.5, 0.75], 'GHPO: ascending fractions of the reference '
                                              'solution revealed at stage 1, 2, ... (characters, rounded)'),
                 ghpo_schedule: str = param('within_step', "GHPO: 'within_step' refines a failed prompt stage by "
                                            "stage in the same step until a completion succeeds; 'across_visits' "
                                            'moves one stage per failed visit and resets when the prompt is solved',
                                            ['within_step', 'across_visits']),
                 success_threshold: float = 1.0):
        self.fractions = [float(f) for f in ghpo_fractions]
        self.schedule = ghpo_schedule
        self.threshold = success_threshold
        self.stage: dict[int, int] = {}  # uid -> stage (1-based) for the next failed visit (across_visits)


    def text(self, row: dict, stage: int) -> str:
        solution = require_column(row, "solution", "ghpo")
        return f"{SOLUTION_HEADER}\n{solution_prefix(str(solution), self.fractions[stage - 1])}"

    def __call__(self, ctx, rows, uids, group_offset, budgets=None, temperatures=None, step: int = 0):
        plain, scalar, members = _plain(ctx, rows, uids, group_offset, budgets, temperatures)
        failed = []
        for i, uid in enumerate(uids):
            if _solved(scalar, members[i], self.threshold):
                self.stage.pop(int(uid), None)
            else:
                failed.append(i)
        S = len(self.fractions)
        stage = {i: (1 if self.schedule == "within_step" else min(self.stage.get(int(uids[i]), 1), S))
                 for i in failed}
        chosen: dict[int, tuple[RolloutBatch, list[int]]] = {}
        pending = list(failed)
        while pending:
            hb, hs, hm = _hinted(ctx, [rows[i] for i in pending], [uids[i] for i in pending],
                                 [self.text(rows[i], stage[i]) for i in pending], [stage[i] for i in pending],
                                 [_budget(ctx, budgets, i) for i in pending],
                                 [_pick(temperatures, i) for i in pending] if temperatures is not None else None)
            still = []
            for j, i in enumerate(pending):
                chosen[i] = (hb, hm[j])
                ok = _solved(hs, hm[j], self.threshold)
                if self.schedule == "across_visits":
                    self.stage[int(uids[i])] = stage[i] if ok else min(stage[i] + 1, S)
                elif not ok and stage[i] < S:
                    stage[i] += 1
                    still.append(i)
            pending = still
        parts = [(*chosen[i], group_offset + i) if i in chosen else (plain, members[i], group_offset + i)
                 for i in range(len(rows))]
        return _assemble(ctx, parts)

    def state_dict(self) -> dict:
        return {"stage": dict(self.stage)}

    def load_state_dict(self, state: dict) -> None:
        self.stage = {int(k): int(v) for k, v in state["stage"].items()}
