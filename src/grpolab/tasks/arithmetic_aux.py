"""``arithmetic_aux``: arithmetic with an optional auxiliary step, for GCPO's Group Contrastive Masking (000-56).

GeometryZero (arXiv:2506.07160) rewards an *auxiliary construction* (an extra line drawn in a geometry proof)
up or down by whether it helps within the group. This task is its small text stand-in: the prompt allows the
model to write intermediate results between ``<aux>`` and ``</aux>`` before the answer. On multi-step questions
(``level`` >= 2: ``+ - *`` chains) writing the intermediate results is expected to help; on one-step questions
(``level`` 1: ``a +/- b``) it is noise. The auxiliary step is recognised by :data:`AUX_PATTERN` (the default of
the ``gcpo_aux_mask`` transform's ``gcpo_aux_pattern``).

Rewards: ``accuracy`` (weight 1.0) and ``format`` (weight 0.5), those of ``arithmetic`` (the auxiliary step is
not rewarded by the task; ``gcpo_aux_mask`` does that). Columns: ``question``, ``answer``, ``level``,
``solution`` (level 1: ``Answer: v``; level >= 2: the steps inside ``<aux>...</aux>``, then ``Answer: v``).
"""
from __future__ import annotations

from ..registry import TASKS, param
from .arithmetic import REWARDS, SYSTEM, lenient_accuracy, multistep_rows
from .base import Task

AUX_OPEN, AUX_CLOSE = "<aux>", "</aux>"
AUX_PATTERN = r"<aux>.*?</aux>"  # an <aux>...</aux> span (possibly empty) anywhere in the reply, re.S


def aux_prompt(question: str) -> list[dict]:
    content = (f"Compute {question}. If it helps, first write intermediate results between {AUX_OPEN} and "
               f"{AUX_CLOSE}. Finish your reply with 'Answer:' followed by the number.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]


def aux_row(row: dict) -> dict:
    """An ``arithmetic`` / ``arithmetic_multistep`` row re-asked with the optional auxiliary step."""
    steps, answer = row["solution"].split("\n")[:-1], row["answer"]
    if row["level"] >= 2:
        solution = f"{AUX_OPEN}{'; '.join(steps)}{AUX_CLOSE}\nAnswer: {answer}"
    else:
        solution = f"Answer: {answer}"
    return {"prompt": aux_prompt(row["question"]), "question": row["question"], "answer": answer,
            "level": row["level"], "solution": solution}


@TASKS.register("arithmetic_aux", needs=("text",))
def arithmetic_aux(*,
                   aux_levels: list = param([1, 2, 3], 'arithmetic_aux: operation counts to draw problems from '
                                            '(1 = a +/- b, where the auxiliary step is noise)'),
                   aux_max_operand: int = param(20, 'arithmetic_aux: operands are 0..this (factors 2..5)'),
                   aux_n_train: int = param(600, 'arithmetic_aux: training problems'),
                   aux_n_eval: int = param(100, 'arithmetic_aux: held-out problems'),
                   aux_seed: int = param(4321, 'arithmetic_aux: seed that fixes the problems and the split')) -> Task:
    """``aux_n_train + aux_n_eval`` distinct problems (by question), each of a level drawn uniformly from
    ``aux_levels``, drawn with ``aux_seed``; the first ``aux_n_eval`` are held out (disjoint splits). The prompt
    offers an optional ``<aux>...</aux>`` auxiliary step. Same seed, same rows.

    Provenance: grpolab's own — a built-in toy task (arithmetic with an optional auxiliary step, a stand-in for
    GeometryZero's auxiliary constructions) for the gcpo_geometry recipe; implements no published method.
    """
    levels = sorted({int(x) for x in aux_levels})
    if not levels or levels[0] < 1:
        raise ValueError(f"aux_levels: expected operation counts >= 1, got {aux_levels}")
    rows = [aux_row(r) for r in multistep_rows(levels, aux_max_operand, aux_seed, aux_n_train + aux_n_eval,
                                               "arithmetic_aux")]
    return Task("arithmetic_aux", rows[aux_n_eval:], rows[:aux_n_eval], rewards=list(REWARDS),
                accuracy_reward="accuracy",
                description=f"{'/'.join(map(str, levels))}-step + - * problems with an optional <aux>...</aux> "
                            f"step for intermediate results, strict 'Answer: N' format",
                extra={"lenient_accuracy": lenient_accuracy})
