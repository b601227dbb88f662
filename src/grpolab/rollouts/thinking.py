"""Rollout strategies for thinking modes: MOTIF multi-round thinking (seed 004-04)."""
from __future__ import annotations

import re

import torch

from ..errors import ConfigError
from ..data import completion_text
from ..registry import ROLLOUT_STRATEGIES
from ..registry import param
from .tempsamp import append_instruction

_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)


def motif_progress(text: str, max_chars: int) -> str:
    """What a round hands to the next: the ``<answer>`` part when there is one (MOTIF's format),
    else the whole round; stripped and cut to its last ``max_chars`` characters."""
    found = _ANSWER_TAG.findall(text)
    part = (found[-1] if found else text).strip()
    return part[-max_chars:] if max_chars > 0 else part


def motif_row(row: dict, progress: str, round_done: int, final: bool) -> dict:
    """``row`` with the progress of round ``round_done`` appended to its (last user) prompt, as the
    authors' code does: ``Progress in round r: "..."``, plus the final-round instruction."""
    note = f' Progress in round {round_done}: "{progress}"'
    note += (" Current round is the final round. Provide a final answer." if final
             else " Continue from this progress.")
    return append_instruction(row, note)


def _check_motif(cfg) -> None:
    if cfg.motif_rounds < 1 or cfg.motif_rollouts < 1:
        raise ConfigError(f"motif: motif_rounds and motif_rollouts must be >= 1, got {cfg.motif_rounds} and "
                          f"{cfg.motif_rollouts}")


@ROLLOUT_STRATEGIES.register("motif", check=_check_motif, needs=("text",))
def motif(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
          motif_rounds: int = param(3, 'MOTIF: thinking rounds per answer (the last one gives the final answer)'),
          motif_rollouts: int = param(4, 'MOTIF: continuations of rounds 2..R sampled per first-round completion; '
                                      'its reward is their mean final-round reward'),
          motif_progress_chars: int = param(200, "MOTIF: a round's progress handed to the next round is cut to its "
                                            'last this many characters')):
    """MOTIF: Modular Thinking via Reinforcement Fine-tuning (Mitra and Ulukus, 2025, arXiv:2507.02851; 004-04).

    The model reasons over ``R = motif_rounds`` rounds; round ``r+1`` sees the
    original prompt plus the *progress* of round ``r`` (``Progress in round r:
    "..."``; the last round is told to give the final answer), so the total
    reasoning can exceed one context. Following the authors' code:

    1. round 1: ``G`` completions per prompt are sampled (``ctx.generate``) —
       these are the rows GRPO trains on (all tokens SAMPLED, exact behaviour
       log-probs);
    2. for each round-1 completion, ``M = motif_rollouts`` continuations of
       rounds 2..R are sampled without gradient (round 2: M samples from the
       prompt with that completion's progress; later rounds: one sample each
       from the previous round's progress);
    3. the configured reward functions score each continuation's *final*
       round (its prompt includes the previous round's progress), and the
       round-1 row's reward matrix is the mean over its M continuations
       (NaN-aware): a Monte-Carlo estimate of the expected final outcome of
       that first round. The trainer then combines, transforms and
       normalises these rewards within the G round-1 completions as usual.

    So what is trained is the first round's tokens, with the outcome reward of
    the rounds they lead to; later rounds' texts are never trained on (and
    never enter the batch). The paper's progress is the round's ``<answer>``
    part; tasks here answer as ``Answer: N``, so a round without ``<answer>``
    hands on its whole text, cut to its last ``motif_progress_chars``
    characters (grpolab's choice of "summary"). The authors' reward (2 for a
    correct final answer in the answer tags, 1 anywhere in the final text) is
    replaced by the task's own rewards. ``motif_rounds = 1`` is plain GRPO.
    Columns added: ``motif_final`` (first continuation's final round).

    Provenance: authors' code — https://github.com/purbeshmitra/MOTIF, motif.py (multi-round rollouts, the
    progress prompt and the first-round reward from M continuations); the task's own rewards replace the
    authors' 2 / 1 answer-tag reward.
    Test: tests/test_tasks_and_sft.py::test_motif_rewards_are_the_mean_final_round_rewards.
    """
    batch = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
    if motif_rounds <= 1:
        return batch
    R, M = batch.num_rows, motif_rollouts
    src = (batch.group_ids - group_offset).tolist()  # prompt index of every round-1 row
    progress = [completion_text(c) for c in batch.columns["completion"]]
    state_rows, state_uids = [rows[s] for s in src], [uids[s] for s in src]  # one per continuation
    cont = None
    for r in range(2, motif_rounds + 1):
        final = r == motif_rounds
        aug = [motif_row(row, motif_progress(p, motif_progress_chars), r - 1, final)
               for row, p in zip(state_rows, progress)]
        cont = ctx.generate(aug, state_uids, group_offset=group_offset, num_generations=M if r == 2 else 1)
        if r == 2:  # from now on one state per (round-1 row, continuation), row-major
            state_rows = [row for row in state_rows for _ in range(M)]
            state_uids = [u for u in state_uids for _ in range(M)]
        progress = [completion_text(c) for c in cont.columns["completion"]]
    ctx.score(cont)  # scores the final rounds: cont.rewards [R * M, K]
    K = cont.rewards.shape[1]
    batch.rewards = torch.nanmean(cont.rewards.view(R, M, K), dim=1)
    batch.reward_names = list(cont.reward_names)
    batch.columns["motif_final"] = [cont.columns["completion"][i * M] for i in range(R)]
    return batch
