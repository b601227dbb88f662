"""TempSamp-R1 rollouts (seed 000-112): ground-truth solution mixed into every group, hybrid CoT / non-CoT prompts."""
from __future__ import annotations

import copy

import torch

from ..errors import ConfigError
from ..registry import ROLLOUT_STRATEGIES, param
from .injection import REFERENCE_TEMPLATE, reference_rows, replace_rows, template_columns

COT_COLUMN = "tempsamp_cot"


def append_instruction(row: dict, text: str) -> dict:
    """A copy of ``row`` whose prompt (a string, or the last user message of a chat) ends with ``text``."""
    out = dict(row)
    prompt = row["prompt"]
    if isinstance(prompt, str):
        out["prompt"] = prompt + text
    else:
        msgs = copy.deepcopy(prompt)
        users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
        i = users[-1] if users else len(msgs) - 1
        msgs[i]["content"] = msgs[i]["content"] + text
        out["prompt"] = msgs
    return out


def hybrid_cot_rows(rows: list[dict], fraction: float, generator: torch.Generator, cot_instruction: str,
                    direct_instruction: str) -> list[dict]:
    """Each prompt is put in CoT mode with probability ``fraction`` (one uniform draw per prompt from
    ``generator``: CoT iff ``u < fraction``), else in non-CoT mode; the mode's instruction is appended to
    its prompt and the mode is recorded in the column ``tempsamp_cot`` (True = CoT)."""
    u = torch.rand(len(rows), generator=generator)
    out = []
    for row, x in zip(rows, u.tolist()):
        cot = x < fraction
        new = append_instruction(row, cot_instruction if cot else direct_instruction)
        new[COT_COLUMN] = cot
        out.append(new)
    return out


def _check_tempsamp(cfg) -> None:
    if not 0 <= cfg.tempsamp_cot_fraction <= 1:
        raise ConfigError(f"tempsamp_cot_fraction: must be in [0, 1], got {cfg.tempsamp_cot_fraction}")


@ROLLOUT_STRATEGIES.register("tempsamp_r1", check=_check_tempsamp, columns=template_columns, needs=("text",))
def tempsamp_r1(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                injection_reference_template: str = REFERENCE_TEMPLATE,
                tempsamp_gt_injection: bool = param(True, 'tempsamp_r1: replace the last rollout of every group by '
                                                    "the ground-truth solution (the authors' use_gt_injection)"),
                tempsamp_hybrid_cot: bool = param(True, 'tempsamp_r1: hybrid CoT training (each prompt in CoT or '
                                                  'non-CoT mode, set by an appended instruction)'),
                tempsamp_cot_fraction: float = param(0.5, 'tempsamp_r1: probability that a prompt (its whole group) '
                                                     'is trained in CoT mode rather than non-CoT mode (hybrid CoT '
                                                     'training; 1 = always CoT, 0 = always non-CoT)'),
                tempsamp_cot_instruction: str = param(' Think step by step before giving the final answer.',
                                                      'tempsamp_r1: text appended to the prompt in CoT mode'),
                tempsamp_direct_instruction: str = param(' Give the final answer directly, without reasoning.',
                                                         'tempsamp_r1: text appended to the prompt in non-CoT '
                                                         'mode')):
    """TempSamp-R1 mixed-policy group and hybrid CoT training (Li et al., 2025,
    "TempSamp-R1: Effective Temporal Sampling with Reinforcement Fine-Tuning
    for Video LLMs", arXiv:2509.18056, seed 000-112).

    1. Hybrid CoT (``tempsamp_hybrid_cot``): every prompt is put in CoT mode with probability
       ``p = tempsamp_cot_fraction`` (a draw from the run's seeded generator),
       otherwise in non-CoT mode; ``tempsamp_cot_instruction`` or
       ``tempsamp_direct_instruction`` is appended to its prompt, and the
       whole group is sampled, scored and trained with that prompt (column
       ``tempsamp_cot``). One model thus learns both inference modes.
    2. Ground-truth injection (``tempsamp_gt_injection``): the group is sampled as usual (G rollouts),
       then its last rollout is replaced by the ground-truth solution
       ``y* = injection_reference_template`` (formatted with the data row) +
       EOS, so each group is G - 1 on-policy samples + 1 off-policy solution.
       ``y*`` is marked INJECTED, enters the loss, and its behaviour log-prob
       is teacher-forced under the behaviour policy
       ``log pi_old(y*_t | x, y*_<t)``, so its ratio is
       ``pi_theta(y*_t | .) / pi_old(y*_t | .)`` like any sampled token. It is
       scored by the task's rewards like any completion and takes part in the
       group mean / std of the advantage (use it with
       ``tempsamp_soft_advantage``, whose plateau above tau keeps the
       ground-truth row from dominating the group).

    Provenance: authors' code — https://github.com/ZhangZikun6666/TempSamp-R1,
    verl/trainer/ray_trainer.py (RayPPOTrainer._inject_gt_rollout_in_gen_output:
    one slot per group, gt_replace_index -1 = the last, overwritten by the
    ground-truth response + EOS, in response_mask) and
    scripts/timelens/timelens_tempsamp.yaml (n = 8: "7 on-policy samples + 1 GT
    sample", "GT row participates in group mean/std ... like any other
    rollout"; old log-probs recomputed by the actor for every row, vLLM
    rollout log-probs forbidden with injection). That repository calls itself
    "an open-source implementation of TempSamp-R1", not the HVision-NKU code
    named in the paper (not in the searched store). Known differences: the
    authors keep the *tail* of an over-long ground truth (front cut), here the
    head is kept and the row flagged truncated (grpolab's rule for every
    completion); the ground truth is built from the row's answer column (the
    authors' build_gt_response formats timestamps). The hybrid CoT part is
    reconstructed from the abstract ("a hybrid Chain-of-Thought (CoT)
    training paradigm ... optimizes a single unified model to support both
    CoT and non-CoT inference modes"); that code has no CoT mode. grpolab's
    choices: a per-prompt Bernoulli(p) mode with p = 0.5, the mode set by an
    appended instruction, the same ground-truth solution (no reasoning) in
    both modes. A ground truth cut to ``max_completion_length`` is logged
    once per run (it usually earns no reward).
    Test: tests/test_tempsamp_rollout.py::test_gt_replaces_last_row_of_every_group,
    tests/test_tempsamp_rollout.py::test_hybrid_cot_modes_hand_computed,
    tests/test_tempsamp_rollout.py::test_hybrid_groups_share_one_mode_and_train_on_its_prompt.
    """
    if tempsamp_hybrid_cot:
        rows = hybrid_cot_rows(rows, tempsamp_cot_fraction, ctx.generator, tempsamp_cot_instruction,
                               tempsamp_direct_instruction)
    batch = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
    if not tempsamp_gt_injection:
        return batch
    groups = [int(g) for g in torch.unique(batch.group_ids)]
    idx = [int((batch.group_ids == g).nonzero()[-1]) for g in groups]
    src = [rows[g - group_offset] for g in groups]
    new = reference_rows(ctx, src, batch.prompt_uids[idx].tolist(), groups, train=True,
                         template=injection_reference_template)
    cut = int(new.truncated.sum())
    if cut and not getattr(ctx, "_tempsamp_cut_logged", False):  # a cut ground truth usually earns no reward
        ctx.log(f"tempsamp_r1: {cut} of {len(groups)} ground-truth solutions were cut to max_completion_length="
                f"{ctx.cfg.max_completion_length} (raise it or shorten injection_reference_template)")
        ctx._tempsamp_cut_logged = True
    return replace_rows(batch, idx, new, ctx.tokenizer.pad_token_id)
