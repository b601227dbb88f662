"""``multichoice``: synthetic multiple-choice arithmetic, single- and multi-answer (TW-GRPO's training format).

Each problem asks which of four numbers equals ``a op b`` (``op`` in ``+ -``, operands 0..30): one option is
right, three are near misses (``v`` plus a distinct offset in -5..5, never 0). With probability
``multichoice_invert`` a row is turned into a multi-answer question by TW-GRPO's question-answer inversion
(:func:`invert_choices`): "Which of these does NOT equal a op b?", the old right option
becomes the only wrong one, 1..3 of the others are kept (right now) and the options are shuffled. The reply
gives its reasoning in ``<think> </think>`` and the letters, comma-separated, in ``<answer> </answer>``, as the
authors' prompt asks.

Rewards: ``accuracy`` (weight 1) — TW-GRPO's soft score ``|P|/|K|`` if the chosen letters ``P`` are a subset of
the key ``K``, else 0 (:func:`soft_choice_score`; with ``multichoice_soft: false`` the
binary exact-set score), 1.0 exactly when the answer is right; ``format`` (weight 1) — the authors'
``<think>..</think><answer>..</answer>`` check. ``eval`` also reports ``exact_accuracy``.

Columns: ``question`` (the wording asked), ``options`` (list of option texts), ``answer`` (letters, e.g.
``"B"`` or ``"A,C"``), ``inverted`` (bool), ``expression``.
"""
from __future__ import annotations

import random
import re
import string

from ..data import completion_text
from ..registry import TASKS, param
from .base import Task

LETTERS = string.ascii_uppercase
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def choice_set(text: str) -> set[str]:
    """The chosen option letters of ``text``: what its first ``<answer>..</answer>`` holds (the whole text when
    it has none), spaces removed, split on commas, each part stripped. ``"<answer>A, C</answer>"`` ->
    ``{"A", "C"}``; an empty answer is ``{""}`` (a choice of nothing, which no answer key contains)."""
    text = str(text)
    m = ANSWER_TAG.search(text)
    body = m.group(1).strip() if m else text.strip()
    return {part.strip() for part in body.replace(" ", "").split(",")}


def soft_choice_score(reply: str, key: str) -> float:
    """TW-GRPO's soft multi-choice score: ``|P| / |K|`` when the chosen letters ``P`` are a subset of the key's
    ``K`` (:func:`choice_set` of each), else 0 — partial credit for picking some right options and no wrong one,
    nothing for any wrong pick; 1 exactly when ``P == K``."""
    pred, gold = choice_set(reply), choice_set(key)
    return len(pred) / len(gold) if pred <= gold else 0.0


def exact_choice_score(reply: str, key: str) -> float:
    """The binary score the soft one replaces: 1 when the chosen letters equal the key's, else 0."""
    return 1.0 if choice_set(reply) == choice_set(key) else 0.0


def mc_soft_reward(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """:func:`soft_choice_score` of each completion against its row's ``answer`` (letters, e.g. ``"A,C"``)."""
    return [soft_choice_score(completion_text(c), a) for c, a in zip(completions, answer)]


def mc_exact_reward(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """:func:`exact_choice_score` of each completion (the binary baseline of the soft reward)."""
    return [exact_choice_score(completion_text(c), a) for c, a in zip(completions, answer)]


THINK_ANSWER = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>[\s!]*$", re.S)


def think_answer_format(prompts=None, completions=None, **kwargs) -> list[float]:
    """1 when the reply is ``<think>...</think>`` then ``<answer>...</answer>`` at its end, each tag once."""
    out = []
    for c in completions:
        t = completion_text(c).strip()
        ok = t.count("<think>") <= 1 and t.count("<answer>") <= 1 and THINK_ANSWER.search(t) is not None
        out.append(1.0 if ok else 0.0)
    return out


def invert_choices(options: list[str], answer: str, rng: random.Random,
                   num_keep: int | None = None) -> tuple[list[str], str]:
    """TW-GRPO's question-answer inversion of a single-choice question's options.

    The one right option (``answer``, a letter) becomes the one wrong option of the negated question; of the
    other options (each right under the negation) ``num_keep`` are kept (random in 1..n-1 when ``None``: the
    authors' "random drop", so the number of answers is not a give-away), the kept ones and the old right one
    are shuffled, and the new key lists every letter but the old right option's, in order. Returns
    ``(new options, new key)``, e.g. ``(["7", "5", "9"], "A,C")`` when ``"5"`` was right.

    Provenance: authors' code — https://github.com/longmalongma/TW-GRPO,
    data/question_answer_inverse/convert_star.py (negate_answer); same draws (number kept uniform in
    1..n-1, a random subset of the wrong options, then a shuffle), with grpolab's seeded ``rng``.
    """
    letters = [s.strip() for s in str(answer).split(",") if s.strip()]
    if len(letters) != 1:
        raise ValueError(f"question-answer inversion: needs a single-choice question (one answer letter), "
                         f"got '{answer}'")
    right = LETTERS.index(letters[0])
    if not 0 <= right < len(options):
        raise ValueError(f"question-answer inversion: answer '{answer}' names no option of {len(options)}")
    wrong = [o for i, o in enumerate(options) if i != right]
    if not wrong:
        raise ValueError("question-answer inversion: needs at least two options")
    k = rng.randint(1, len(wrong)) if num_keep is None else int(num_keep)
    if not 1 <= k <= len(wrong):
        raise ValueError(f"question-answer inversion: num_keep must be in 1..{len(wrong)}, got {num_keep}")
    new = [options[right]] + rng.sample(wrong, k)
    rng.shuffle(new)
    key = ",".join(LETTERS[i] for i, o in enumerate(new) if o != options[right])
    return new, key

SYSTEM = "You are a helpful assistant that answers multiple-choice questions."
INSTRUCTION = ("Output the thinking process in <think> </think> and the final answer (the letters of every "
               "correct option, separated by , if several) in <answer> </answer> tags.")


def mc_prompt(question: str, options: list[str]) -> list[dict]:
    """The chat prompt of one question: the question, one ``X. option`` line per option, the instruction."""
    body = "\n".join([question] + [f"{LETTERS[i]}. {o}" for i, o in enumerate(options)] + [INSTRUCTION])
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": body}]


def single_choice_row(a: int, op: str, b: int, rng: random.Random) -> dict:
    """A single-choice row: the value of ``a op b`` among three distinct near misses, in random order."""
    v = a + b if op == "+" else a - b
    offsets = rng.sample([d for d in range(-5, 6) if d != 0], 3)
    options = [str(v)] + [str(v + d) for d in offsets]
    rng.shuffle(options)
    expr = f"{a} {op} {b}"
    question = f"Which of these equals {expr}?"
    return {"prompt": mc_prompt(question, options), "question": question, "options": options,
            "answer": LETTERS[options.index(str(v))], "inverted": False, "expression": expr}


def invert_row(row: dict, rng: random.Random, num_keep: int | None = None) -> dict:
    """TW-GRPO's question-answer inversion of a :func:`single_choice_row`: the negated wording, the inverted
    options and key (:func:`invert_choices`), a new prompt."""
    options, key = invert_choices(row["options"], row["answer"], rng, num_keep)
    question = f"Which of these does NOT equal {row['expression']}?"
    return {**row, "prompt": mc_prompt(question, options), "question": question, "options": options,
            "answer": key, "inverted": True}


@TASKS.register("multichoice", needs=("text",))
def multichoice(*,
                multichoice_invert: float = param(0.5, 'multichoice: probability that a row is inverted into a '
                                                  "multi-answer question (TW-GRPO's question-answer inversion; "
                                                  'the authors convert half)'),
                multichoice_soft: bool = param(True, "multichoice: TW-GRPO's soft partial-credit accuracy "
                                               '(false: 1 only for the exact set of letters)'),
                multichoice_n_eval: int = param(200, 'multichoice: held-out questions'),
                multichoice_seed: int = param(1234, 'multichoice: seed that fixes the questions, options, '
                                              'inversions and the split')) -> Task:
    """Every ``a op b`` (operands 0..30, ``+ -``) as a 4-option question, shuffled with ``multichoice_seed``;
    the first ``multichoice_n_eval`` are held out (distinct expressions: the splits share no question), and
    each row of either split is inverted with probability ``multichoice_invert``. Same seed, same rows.

    Provenance: grpolab's own — a built-in toy task (single- and multi-answer multiple choice over arithmetic)
    for TW-GRPO's soft reward and question-answer inversion; implements no published method itself.
    """
    if not 0.0 <= float(multichoice_invert) <= 1.0:
        raise ValueError(f"multichoice_invert: expected a probability in [0, 1], got {multichoice_invert}")
    problems = [(a, op, b) for a in range(31) for b in range(31) for op in "+-"]
    rng = random.Random(multichoice_seed)
    rng.shuffle(problems)
    if not 0 < multichoice_n_eval < len(problems):
        raise ValueError(f"multichoice_n_eval: expected 1..{len(problems) - 1}, got {multichoice_n_eval}")
    rows = []
    for p in problems:
        row = single_choice_row(*p, rng)
        rows.append(invert_row(row, rng) if rng.random() < multichoice_invert else row)
    accuracy = mc_soft_reward if multichoice_soft else mc_exact_reward
    n = multichoice_n_eval
    kind = "soft partial-credit" if multichoice_soft else "exact-set"
    return Task("multichoice", rows[n:], rows[:n],
                rewards=[("accuracy", accuracy, 1.0), ("format", think_answer_format, 1.0)],
                accuracy_reward="accuracy",
                description=f"4-option 'which equals a op b' questions, {multichoice_invert:g} of them inverted "
                            f"into multi-answer 'which does NOT equal' questions; {kind} accuracy",
                extra={"exact_accuracy": mc_exact_reward})
