"""``arithmetic_prefs``: offline preference pairs over the ``arithmetic`` prompts, each labelled by one of two
labeller groups that disagree.

Built for Group Robust Preference Optimization (recipe ``group_robust_dpo``; Ramesh et al., 2024,
arXiv:2405.20304, seed 000-57), whose data are preference pairs ``(x, y_w, y_l)`` each with the group ``g`` of
the labeller who compared them.

Every prompt of the ``arithmetic`` task (``a +/- b``, operands 0..30, the same held-out split) gets two
candidate replies, both with the right value ``v``:

* the *formatted* reply ``Answer: v`` (the arithmetic task's strict format), and
* an *alternative* reply, one of ``v``, ``= v``, ``v.``, ``It is v.`` (drawn per prompt with ``seed``):
  shorter or differently formatted.

Group 0 (``A``, the majority) prefers the formatted reply; group 1 (``B``, the minority, a share
``arithmetic_prefs_minority_share`` of the training rows, 0.25 by default) prefers the alternative one. The
groups disagree on every pair, and by default the prompt does not say who labelled it, so one policy cannot please
both: a loss averaged over the pairs favours the majority, a worst-group objective does not. With
``arithmetic_prefs_tag_group`` the system message ends with ``Reader: group A.`` / ``Reader: group B.`` (the
paper's group-conditioned prompts), and a policy can learn both preferences.

Rows: ``prompt``, ``question``, ``answer`` (as in ``arithmetic``), ``chosen`` and ``rejected`` (the labeller's
preferred and dispreferred reply), ``labeller_group`` (0 or 1). Training rows: one labelled pair per
training prompt of ``arithmetic`` (its group drawn with ``seed``); held-out rows: every held-out prompt twice,
once labelled by each group (so a group's held-out preference accuracy is measured on the same prompts for both
groups).

Reward ``preferred`` (weight 1, the accuracy reward): 1.0 if the completion is the row's ``chosen`` reply
(whitespace stripped), else 0.0 — on the pair rows of the ``preference_pairs`` rollout it tells the chosen row
from the rejected one; on sampled completions (evaluation) it is the share of replies the row's labeller would
have chosen, word for word.
"""
from __future__ import annotations

import random

from ..data import completion_text
from ..registry import TASKS, param
from .arithmetic import arithmetic
from .base import Task

ALTERNATIVES = ("{v}", "= {v}", "{v}.", "It is {v}.")
GROUP_NAMES = ("A", "B")


def preferred(prompts=None, completions=None, chosen=None, **kwargs) -> list[float]:
    """1.0 where the completion is the row's ``chosen`` reply (whitespace stripped), else 0.0."""
    return [float(completion_text(c).strip() == str(w).strip()) for c, w in zip(completions, chosen)]


def _pair(row: dict, alt: str, group: int, tag: bool = False) -> dict:
    formatted = f"Answer: {row['answer']}"
    chosen, rejected = (formatted, alt) if group == 0 else (alt, formatted)
    prompt = row["prompt"]
    if tag:  # the paper's group-conditioned prompt x_g: the system message names the labeller group
        prompt = [{**prompt[0], "content": f"{prompt[0]['content']} Reader: group {GROUP_NAMES[group]}."},
                  *prompt[1:]]
    return {"prompt": prompt, "question": row["question"], "answer": row["answer"],
            "chosen": chosen, "rejected": rejected, "labeller_group": group}


@TASKS.register("arithmetic_prefs", needs=("text",))
def arithmetic_prefs(*,
                     arithmetic_prefs_minority_share: float = param(
                         0.25, "arithmetic_prefs: share of the training pairs labelled by group B (the minority)"),
                     arithmetic_prefs_seed: int = param(
                         0, "arithmetic_prefs: seed of the alternative replies and of the labeller of each training "
                            "pair"),
                     arithmetic_prefs_tag_group: bool = param(
                         False, "arithmetic_prefs: name the labeller group in the system message (the paper's "
                                "group-conditioned prompts x_g), so one policy can please both groups")) -> Task:
    """Preference pairs with two disagreeing labeller groups over the ``arithmetic`` prompts (module docstring).

    Provenance: grpolab's own — a built-in toy preference data set with labeller groups, for Group Robust
    Preference Optimization (arXiv:2405.20304, seed 000-57); the paper's data (synthetic bandits, GlobalOpinionQA)
    are not used.
    """
    if not 0.0 < arithmetic_prefs_minority_share < 1.0:
        raise ValueError(f"arithmetic_prefs_minority_share: must be in (0, 1), got "
                         f"{arithmetic_prefs_minority_share}")
    base = arithmetic()
    rng = random.Random(arithmetic_prefs_seed)
    train = []
    for row in base.train_rows:
        alt = rng.choice(ALTERNATIVES).format(v=row["answer"])
        train.append(_pair(row, alt, int(rng.random() < arithmetic_prefs_minority_share),
                           arithmetic_prefs_tag_group))
    held = []
    for row in base.eval_rows:
        alt = rng.choice(ALTERNATIVES).format(v=row["answer"])
        held += [_pair(row, alt, 0, arithmetic_prefs_tag_group), _pair(row, alt, 1, arithmetic_prefs_tag_group)]
    return Task("arithmetic_prefs", train, held, rewards=[("preferred", preferred, 1.0)],
                accuracy_reward="preferred",
                description="arithmetic prompts, two replies, labeller groups A (majority: 'Answer: v') and B "
                            "(minority: a shorter or differently formatted reply) that disagree on every pair")
