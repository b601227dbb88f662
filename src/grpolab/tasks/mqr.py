"""MQR: multi-aspect question reformulation (MathForge, seed 000-05) — offline data preparation and the
``arithmetic_mqr`` task.

Dai et al. 2026, *Harder Is Better: Boosting Mathematical Reasoning via Difficulty-Aware GRPO and Multi-Aspect
Question Reformulation* (MathForge), arXiv:2601.20614, seed 000-05. MQR rewrites every training question along
three aspects that make it harder while its gold answer stays the same:

* ``background`` — a story around the question that is not part of its mathematics but looks as if it were
  (a question that already has one gets a new, more involved one);
* ``term`` — a new abstract term that names a concept central to the question, and the question restated with it;
* ``sub_problem`` — a numerical condition with a definite value turned into an independent sub-problem (of any
  branch of mathematics) whose solution is that value.

Training data = the original questions plus every kept reformulation, concatenated (the authors' MATH set becomes
4x its size: original + one per aspect) and drawn by the ordinary shuffled sampler.

Two reformulators:

* :func:`mqr_augment` with a language model (``grpolab mqr --model M --data FILE --out FILE``): our prompts
  (:data:`ASPECT_INSTRUCTIONS`) ask the model for one reformulation per aspect, given the question and its gold
  answer; a reformulation is kept when it parses, differs from the original, and passes the answer check
  (``--check judge``: the same model is asked whether the new question's answer is still the gold answer;
  ``--check none`` keeps every parsed reformulation, as the authors' released data set does).
* :func:`arithmetic_reformulation`: a deterministic built-in reformulator for the ``arithmetic`` task's
  ``a + b`` / ``a - b`` problems, one template family per aspect, whose answer is the original by construction
  (tests/test_mqr.py checks each by hand); the ``arithmetic_mqr`` task and the ``dgpo_mathforge`` recipe train
  on it.

Provenance: authors' code — https://github.com/AMAP-ML/MathForge README.md and assets/MQR.jpg (the three aspects'
core instructions), recipes/*/grpo/config_grpo_augmented.yaml and scripts_mathforge/*/run_mathforge.sh (training
reads the augmented set YanqiDai/MathForge_MATH-augmented whose default config concatenates the configs
original, background, term and sub-problem; 4x the MATH training set); the repository has no reformulation
script, so the prompts here are our own wording of the three instructions, the reformulator is the user's model
(the paper used a strong external LLM), and the answer check is a yes/no judgement by that model (the paper
reports answer-preservation rates of its reformulations; the released set keeps all of them, which
``--check none`` reproduces). The arithmetic templates are grpolab's.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Callable

from ..errors import ConfigError
from ..registry import TASKS, param
from .arithmetic import REWARDS, SYSTEM, arithmetic, lenient_accuracy
from .base import Task

ASPECTS = ("background", "term", "sub_problem")

ASPECT_INSTRUCTIONS = {
    "background": "Wrap the problem in a short story. The story must not change the mathematics of the problem, "
                  "but it should sound as if it belonged to it (for example it may mention other numbers that "
                  "are not needed). If the problem already has a story, replace it with a new, more elaborate "
                  "one.",
    "term": "Invent a new abstract mathematical term, define it precisely for a concept that is central to the "
            "problem, and state the whole problem in terms of it.",
    "sub_problem": "Pick a number in the problem whose value is fixed and replace it by an independent "
                   "sub-problem whose answer is exactly that number. The sub-problem may come from any branch "
                   "of mathematics (algebra, geometry, number theory, combinatorics, ...).",
}

MARKER = "Reformulated problem:"


def _check_aspects(aspects) -> tuple[str, ...]:
    aspects = tuple(aspects)
    bad = [a for a in aspects if a not in ASPECTS]
    if bad or not aspects or len(set(aspects)) != len(aspects):
        raise ConfigError(f"mqr_aspects: {list(aspects)} is not valid; give one or more distinct values of: "
                          f"{', '.join(ASPECTS)}")
    return aspects


def reformulation_prompt(question: str, answer: str, aspect: str) -> list[dict]:
    """Chat messages asking a model for one ``aspect`` reformulation of ``question`` (gold answer ``answer``)."""
    _check_aspects([aspect])
    content = (f"Rewrite the math problem below so that it is harder to solve while its answer stays exactly "
               f"{answer}.\n{ASPECT_INSTRUCTIONS[aspect]}\nDo not solve the problem and do not reveal its "
               f"answer. Reply with one line that starts with '{MARKER}' followed by the new problem.\n\n"
               f"Problem: {question}")
    return [{"role": "user", "content": content}]


def parse_reformulation(text: str) -> str | None:
    """The new problem after the last :data:`MARKER` in a model's reply (None when there is none or it is
    empty)."""
    if MARKER not in text:
        return None
    out = text.rsplit(MARKER, 1)[1].strip()
    return out or None


def judge_prompt(question: str, reformulated: str, answer: str) -> list[dict]:
    """Chat messages asking whether ``reformulated`` still has the gold answer of ``question``."""
    content = (f"Original problem: {question}\nIts answer: {answer}\nRewritten problem: {reformulated}\n\n"
               f"Is the answer to the rewritten problem exactly {answer}? Reply with one word: yes or no.")
    return [{"role": "user", "content": content}]


def parse_verdict(text: str) -> bool:
    """True when the reply's first word is ``yes`` (case and punctuation ignored)."""
    words = re.findall(r"[a-zA-Z]+", text)
    return bool(words) and words[0].lower() == "yes"


# ----------------------------------------------------------------------------- rows

def question_of(row: dict) -> str:
    """A row's question: its ``prompt`` string, or the content of the last user message of a chat prompt."""
    p = row.get("prompt")
    if isinstance(p, str):
        return p
    if isinstance(p, list):
        for m in reversed(p):
            if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
                return m["content"]
    raise ConfigError("mqr: a row's 'prompt' must be a string or chat messages with a user message")


def with_question(row: dict, question: str) -> dict:
    """A copy of ``row`` whose question (see :func:`question_of`) is ``question``."""
    p = row["prompt"]
    if isinstance(p, str):
        return {**row, "prompt": question}
    i = max(k for k, m in enumerate(p) if isinstance(m, dict) and m.get("role") == "user")
    return {**row, "prompt": [*p[:i], {**p[i], "content": question}, *p[i + 1:]]}


@dataclass
class MQRReport:
    """What :func:`mqr_augment` produced: the rows to train on (originals first, then the kept reformulations by
    aspect) and, per aspect, how many were kept and why the others were dropped."""
    rows: list[dict]
    kept: dict = field(default_factory=dict)
    dropped: dict = field(default_factory=dict)

    def summary(self) -> dict:
        n = sum(1 for r in self.rows if r.get("mqr_aspect") == "original")
        return {"original": n, "kept": self.kept, "dropped": self.dropped, "rows": len(self.rows)}


def mqr_augment(rows: list[dict], reformulate: Callable[[list[list[dict]]], list[str]], *,
                aspects=ASPECTS, check: str = "judge", answer_column: str = "answer",
                judge: Callable[[list[list[dict]]], list[str]] | None = None) -> MQRReport:
    """Original rows plus one reformulation per row and aspect, each kept only if it passes.

    ``reformulate(prompts) -> replies``: one reply per chat prompt (:func:`reformulation_prompt`), e.g. a
    language model's greedy completion. A reply is dropped as ``unparsed`` (no :data:`MARKER` line), ``unchanged``
    (same text as the question) or ``answer_changed`` (``check="judge"``: ``judge(prompts) -> replies`` —
    ``reformulate`` itself when not given — answers :func:`judge_prompt` with anything but yes).
    ``check="none"`` keeps every parsed, changed reformulation. Kept rows copy the original row (its answer
    and every other column) with the new question, and carry ``mqr_aspect`` and ``mqr_source`` (the original's
    index); originals get ``mqr_aspect = "original"``. Only the question text is rewritten: keep answer-format
    instructions in a system message (as the authors' ``system_prompt``), or the model may rewrite them too.
    """
    aspects = _check_aspects(aspects)
    if check not in ("judge", "none"):
        raise ConfigError(f"mqr check: '{check}' is not valid; valid values: judge, none")
    judge = judge or reformulate
    for i, r in enumerate(rows):
        if answer_column not in r:
            raise ConfigError(f"mqr: row {i} has no '{answer_column}' column (the gold answer that every "
                              f"reformulation must keep); name it with --answer-column")
    questions = [question_of(r) for r in rows]
    out = [{**r, "mqr_aspect": "original", "mqr_source": i} for i, r in enumerate(rows)]
    report = MQRReport(out)
    for aspect in aspects:
        replies = reformulate([reformulation_prompt(q, str(r[answer_column]), aspect)
                               for q, r in zip(questions, rows)])
        drops = {"unparsed": 0, "unchanged": 0, "answer_changed": 0}
        cands = []
        for i, text in enumerate(replies):
            new = parse_reformulation(text)
            if new is None:
                drops["unparsed"] += 1
            elif new.strip() == questions[i].strip():
                drops["unchanged"] += 1
            else:
                cands.append((i, new))
        if check == "judge" and cands:
            verdicts = judge([judge_prompt(questions[i], new, str(rows[i][answer_column])) for i, new in cands])
            passed = [c for c, v in zip(cands, verdicts) if parse_verdict(v)]
            drops["answer_changed"] = len(cands) - len(passed)
            cands = passed
        out.extend({**with_question(rows[i], new), "mqr_aspect": aspect, "mqr_source": i} for i, new in cands)
        report.kept[aspect] = len(cands)
        report.dropped[aspect] = drops
    return report


# ----------------------------------------------------------------------------- the built-in reformulator

NAMES = ["Mira", "Tomas", "Anouk", "Kenji", "Lena", "Rafael"]
STORIES = [
    "{name} has kept bees for {n} years. At the village fair {name} chalks the puzzle {q} on the honey stall's "
    "price board. What number does the puzzle on the board equal?",
    "On day {n} of a voyage, the navigator of the ship Aster writes the calculation {q} in the logbook to pass "
    "the time. What is the result of the navigator's calculation?",
    "The library received {n} new atlases this week. On the returns desk the librarian, {name}, left a note "
    "that reads {q}. What is the value of the expression on the note?",
]
TERMS = ["vell", "tarn", "quorl", "lumen", "brisk", "orrel"]
TERM_DEFINITIONS = {
    "+": "For whole numbers x and y, the {t} of (x, y) is the number reached by starting at x and taking y unit "
         "steps up the number line.",
    "-": "For whole numbers x and y, the {t} of (x, y) is the number reached by starting at x and taking y unit "
         "steps down the number line.",
}


def _rng(a: int, op: str, b: int, aspect: str, seed: int) -> random.Random:
    return random.Random(f"mqr:{seed}:{a}{op}{b}:{aspect}")  # a str seed is hashed deterministically (SHA-512)


def arithmetic_reformulation(a: int, op: str, b: int, aspect: str, seed: int = 0) -> str:
    """The ``aspect`` reformulation of ``a op b`` (``op`` ``+`` or ``-``); its value is ``a op b``.

    * ``background``: one of :data:`STORIES` with the expression inside and an unneeded number ``n`` (2..40);
    * ``term``: ``a op b`` defined as an invented term (:data:`TERMS`) of the pair, by counting unit steps up
      (``+``) or down (``-``) from x;
    * ``sub_problem``: the second operand ``b`` becomes ``n``, the solution of ``k n + c = k b + c`` (algebra;
      ``k`` 2..9, ``c`` 1..20) or the remainder of ``q d + b`` divided by ``d`` (number theory; ``d = b + e``,
      ``e`` 1..9, ``q`` 2..9), then the question asks for ``a op n``.

    Choices drawn from a random generator seeded by ``seed``, the problem and the aspect: the same inputs give
    the same text.
    """
    _check_aspects([aspect])
    if op not in TERM_DEFINITIONS:
        raise ValueError(f"arithmetic_reformulation: op must be + or -, got {op!r}")
    rng = _rng(a, op, b, aspect, seed)
    q = f"{a} {op} {b}"
    if aspect == "background":
        story = rng.choice(STORIES)
        return story.format(name=rng.choice(NAMES), n=rng.randint(2, 40), q=q)
    if aspect == "term":
        t = rng.choice(TERMS)
        return f"{TERM_DEFINITIONS[op].format(t=t)} What is the {t} of ({a}, {b})?"
    if rng.random() < 0.5:
        k, c = rng.randint(2, 9), rng.randint(1, 20)
        sub = f"Let n be the solution of {k}n + {c} = {k * b + c}."
    else:
        e, m = rng.randint(1, 9), rng.randint(2, 9)
        d = b + e
        sub = f"Let n be the remainder when {m * d + b} is divided by {d}."
    return f"{sub} Compute {a} {op} n."


def _arithmetic_prompt(text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{text} Finish your reply with 'Answer:' followed by the number."}]


def _parse_question(question: str) -> tuple[int, str, int]:
    m = re.fullmatch(r"(\d+) ([+-]) (\d+)", question)
    if m is None:
        raise ValueError(f"arithmetic_mqr: expected a level-1 problem 'a + b' / 'a - b', got {question!r}")
    return int(m.group(1)), m.group(2), int(m.group(3))


@TASKS.register("arithmetic_mqr", needs=("text",))
def arithmetic_mqr(*,
                   mqr_aspects: list = param(list(ASPECTS), 'arithmetic_mqr: MQR aspects whose reformulation of '
                                             'each training problem is added to the originals (of background, '
                                             'term, sub_problem)'),
                   mqr_seed: int = param(0, 'arithmetic_mqr: seed of the built-in reformulations\' wording')) -> Task:
    """The ``arithmetic`` task with MQR: each training problem plus its reformulation along each of
    ``mqr_aspects`` (:func:`arithmetic_reformulation`), all with the original's answer; (1 + len(aspects)) x the
    training rows, originals first (the uniform sampler shuffles them). Held-out rows are the original problems
    only. Columns as ``arithmetic`` plus ``mqr_aspect`` (``original`` or the aspect) and ``mqr_source`` (index
    of the original training row); a reformulated row's ``question`` is its new text.

    Provenance: grpolab's own — a built-in toy task: the authors' MQR aspects (MathForge, arXiv:2601.20614,
    seed 000-05; https://github.com/AMAP-ML/MathForge assets/MQR.jpg) applied to a + b / a - b by grpolab's
    deterministic templates, mixed as the authors' augmented set (originals plus every reformulation).
    """
    aspects = _check_aspects(mqr_aspects)
    base = arithmetic()
    train = [{**r, "mqr_aspect": "original", "mqr_source": i} for i, r in enumerate(base.train_rows)]
    for aspect in aspects:
        for i, r in enumerate(base.train_rows):
            a, op, b = _parse_question(r["question"])
            text = arithmetic_reformulation(a, op, b, aspect, mqr_seed)
            train.append({**r, "prompt": _arithmetic_prompt(text), "question": text, "mqr_aspect": aspect,
                          "mqr_source": i})
    return Task("arithmetic_mqr", train, list(base.eval_rows), rewards=list(REWARDS), accuracy_reward="accuracy",
                description=f"arithmetic with MQR reformulations ({', '.join(aspects)}) added to the originals",
                extra={"lenient_accuracy": lenient_accuracy})


# ----------------------------------------------------------------------------- grpolab mqr

def hf_reply(model, tokenizer, *, max_new_tokens: int = 256, temperature: float = 0.0, seed: int = 0):
    """``reply(prompts) -> texts`` from a Hugging Face causal LM: one completion per chat prompt (greedy at
    ``temperature`` 0), rendered with the tokenizer's chat template (:func:`grpolab.data.render_prompt`)."""
    import torch

    from ..data import render_prompt

    def reply(prompts: list) -> list[str]:
        torch.manual_seed(seed)
        out = []
        for p in prompts:
            enc = tokenizer(render_prompt(tokenizer, p), return_tensors="pt", add_special_tokens=False)
            sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                     **sampling)
            out.append(tokenizer.decode(ids[0][enc["input_ids"].shape[1]:], skip_special_tokens=True))
        return out
    return reply


def main(argv: list[str] | None = None) -> int:
    """``grpolab mqr``: MQR reformulation of a data set with a model; writes originals + kept rows as JSONL."""
    import argparse
    from pathlib import Path

    from ..data import model_texts, to_json
    from .base import add_rows_source, source_rows

    p = argparse.ArgumentParser(prog="grpolab mqr", description="Multi-aspect question reformulation (MathForge "
                                "MQR, seed 000-05): a model rewrites each question along each aspect "
                                f"({', '.join(ASPECTS)}) to make it harder with the same gold answer; the "
                                "originals and the kept reformulations are written as JSONL for "
                                "`grpolab train --recipe dgpo_mathforge --data OUT`.")
    add_rows_source(p, "rows with prompt and the gold answer (JSONL, JSON, CSV, Parquet, ...)",
                    "a built-in task's training rows")
    p.add_argument("--model", required=True, help="reformulating model: 'smollm2', 'tiny' or a model folder")
    p.add_argument("--out", required=True, help="JSONL file for the originals and the kept reformulations")
    p.add_argument("--aspects", default=",".join(ASPECTS), help=f"comma-separated, of {', '.join(ASPECTS)}")
    p.add_argument("--check", default="judge", choices=["judge", "none"],
                   help="judge: keep a reformulation only if the model says its answer is the gold answer; "
                        "none: keep every parsed one (the authors' released set)")
    p.add_argument("--answer-column", default="answer", help="column of the gold answer (default answer)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    a = p.parse_args(argv)
    rows = source_rows(a)
    aspects = _check_aspects(s.strip() for s in a.aspects.split(",") if s.strip())
    from ..model.loading import load_policy
    # a tiny model's tokenizer must cover the instructions as well as the rows
    texts = model_texts(rows) + [m["content"] for asp in aspects for m in reformulation_prompt("", "", asp)] \
        + [m["content"] for m in judge_prompt("", "", "")] + [MARKER, "yes", "no"]
    model, tok = load_policy(a.model, task_texts=texts)
    model.eval()
    reply = hf_reply(model, tok, max_new_tokens=a.max_new_tokens, temperature=a.temperature)
    report = mqr_augment(rows, reply, aspects=aspects, check=a.check, answer_column=a.answer_column)
    Path(a.out).write_text("".join(to_json(r) + "\n" for r in report.rows))
    print(json.dumps(report.summary()))
    return 0
