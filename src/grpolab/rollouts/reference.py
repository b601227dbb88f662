"""AAPO's reference rollout: policy completions, plus reference-model completions that are scored, not trained on."""
from __future__ import annotations

import math

import torch

from ..algorithms.adv_shaping import AAPO_REF_COLUMN
from ..registry import ROLLOUT_STRATEGIES, param


@ROLLOUT_STRATEGIES.register("aapo_reference")
def aapo_reference(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                   aapo_ref_column: str = AAPO_REF_COLUMN,
                   aapo_ref_samples: str = param('row', "AAPO: reference completions per prompt: one per policy "
                                                 "completion, paired by index ('row', the authors') or one shared "
                                                 "by the prompt's group ('prompt', cheaper)", ['row', 'prompt'])):
    """AAPO reference rollout (Xiong et al., 2025, arXiv:2505.14264, seed 000-48): r_ref for every row.

    The policy samples its G completions per prompt as the ``plain`` rollout
    does. The frozen reference model (the initial policy:
    :meth:`RolloutContext.reference_policy`, a frozen copy, or for LoRA the
    policy with its adapters off) samples completions of the same prompts with
    the same settings (temperature, top-k/p, max_completion_length); they are
    scored like the policy's (reward functions, weights, reward transforms)
    and then dropped: they are not rows of the batch and are never trained on.
    The batch column ``aapo_ref_column`` (default ``ref_reward``) gets, for
    each row, the scalar reward of its reference completion (None if
    unscorable): ``row`` pairs the k-th policy completion of a group with the
    k-th reference completion of the same prompt (G reference completions per
    prompt); ``prompt`` samples one reference completion per prompt and gives
    its reward to every row of the group. The batch is returned scored
    (``batch.rewards`` set), so the column is not handed to reward functions.
    ``rollout/aapo_ref_reward`` logs the mean reference reward.

    A component that samples from the reference model sets
    ``needs_reference_model``, so the trainer keeps the frozen copy even with
    ``beta = 0`` (the aapo recipe's).

    Provenance: authors' code — https://github.com/JianxXiong/AAPO,
    open-r1/trainer/AAPOTrainer.py (AAPOTrainer._generate_and_score_completions);
    matches: ``self.ref_model.generate`` (TRL's frozen copy of the initial
    model, kept because their configs set beta 0.1, a KL their compute_loss
    never uses) on the same G-times repeated prompts with the policy's
    generation config, the completion tokens after the prompt, scored by the
    same reward functions and weights, paired by index (``row``). Known
    differences: ``prompt`` is grpolab's cheaper option; open-rs's copy of the
    trainer slices the prompt tokens instead of the completion, a bug that
    open-r1 fixes; with a vLLM engine configured the engine samples the
    policy's completions and grpolab's sampler the reference's.
    Test: tests/test_rollout_reference.py::test_reference_rows_come_from_the_frozen_model_and_are_not_trained_on,
    tests/test_rollout_reference.py::test_reference_rollout_one_sample_per_prompt_and_ragged_groups.
    """
    if aapo_ref_samples not in ("row", "prompt"):
        raise ValueError(f"aapo_ref_samples: '{aapo_ref_samples}' is not valid; valid values: row, prompt")
    batch = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
    counts = budgets if budgets is not None else [ctx.cfg.num_generations] * len(rows)
    with ctx.reference_policy() as ref:
        ref_batch = ctx.generate(rows, uids, group_offset=group_offset, temperature=temperatures, model=ref,
                                 num_generations=list(counts) if aapo_ref_samples == "row" else 1)
    ctx.score(batch)
    ref_rewards = ctx.score(ref_batch).tolist()
    by_group: dict[int, list[float]] = {}
    for g, r in zip(ref_batch.group_ids.tolist(), ref_rewards):
        by_group.setdefault(g, []).append(r)
    seen: dict[int, int] = {}
    column = []
    for g in batch.group_ids.tolist():
        k = seen.get(g, 0)
        seen[g] = k + 1
        r = by_group[g][k if aapo_ref_samples == "row" else 0]
        column.append(None if math.isnan(r) else float(r))
    batch.columns[aapo_ref_column] = column
    scored = torch.tensor([r for r in ref_rewards if not math.isnan(r)])
    if scored.numel():
        ctx.metric("aapo_ref_reward", float(scored.mean()))
    return batch


aapo_reference.needs_reference_model = True
