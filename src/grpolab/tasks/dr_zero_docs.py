"""Dr. Zero's data-free self-evolution on the built-in search world (seed 000-110): the ``dr_zero_docs`` task, the
proposer's question parser, its format check and the hard-yet-solvable reward.

Dr. Zero (Yue et al., 2026, *Dr. Zero: Self-Evolving Search Agents without Training Data*, arXiv:2601.07055) starts
from no questions at all: a **proposer** reads a document of the search corpus and writes a question whose answer
is ``n`` hops away (``n - 1`` searches), with its answer; a **solver** (the same base model) answers it with the
search tool. The solver is trained on the proposer's questions (the proposer's answer is the reference); the
proposer is rewarded for questions the solver gets right *sometimes*. The loop is the ``dr_zero`` rollout
(grpolab/rollouts/dr_zero.py); this module holds the data and the formulas.

Rows of ``dr_zero_docs`` (training): one per document of the world that ``search_qa`` searches
(:mod:`grpolab.agents.knowledge`, ``kb_seed``), in an order fixed by ``dr_zero_seed``, each with a hop count ``n``
drawn with the weights ``dr_zero_hop_ratio`` over ``n = 1, 2, ...`` (the authors' ``HOP_RATIO = [4, 3, 2, 1]`` over
hops 1-4). The prompt is the proposer's instruction and ``n = <hops>`` with the source document. Columns:
``hops``, ``document`` (``(Title: <name>)\\n<text>``), ``title``, ``answer`` (empty: the proposer writes it),
``role`` (``proposer``). Held-out rows are ``search_qa``'s held-out questions for the solver (role ``solver``):
evaluation measures the solver on questions no proposer wrote. The environment is ``search_qa``'s BM25 search
tool over the same world.

Reward ``dr_zero`` (weight 1.0), by the row's ``role``:

* solver: 1.0 for an exact match of the answer after the last ``Answer:`` with the reference (``search_qa``'s
  ``accuracy``, the authors' ``em_check``), else 0.0;
* proposer: ``0.5 * format + difficulty(hits)`` (:func:`proposer_reward`), where ``hits`` (column
  ``dr_zero_hits``, filled by the rollout) are the solver's 0/1 results on the question.
"""
from __future__ import annotations

import random
import re

from ..agents.knowledge import generate, normalise
from ..data import completion_text
from ..errors import ConfigError
from ..registry import TASKS, param
from .agent_tasks import SEARCH_DEMO, SEARCH_SYSTEM, qa_accuracy, qa_lenient_accuracy, search_qa, tool_call_syntax
from .base import Task, provides_environment

PROPOSER_SYSTEM = (
    "You write quiz questions about a fictional world, checked with a search tool that returns encyclopedia "
    "entries. Start from an entity named in the source document (hop 1) and follow one fact at a time to the "
    "next entity, one search per further hop, until hop n, the final answer. To search, reply with " +
    tool_call_syntax("search", {"query": "a name"}) + " and wait for the result. Think inside <think> </think> "
    "before each step. At the end reply with <question> a question that names only hop 1 and asks for hop n "
    "</question> <answer> the short final answer </answer>.")
_QUESTION = re.compile(r"<question>(.*?)</question>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_THINK = re.compile(r"^\s*<think>(.*?)</think>", re.S)
SEARCH_TOOL = "search"
PROPOSER, SOLVER = "proposer", "solver"


# ------------------------------------------------------------------------------------------ the formulas
def parse_proposal(text: str) -> tuple[str, str]:
    """``(question, answer)`` of a proposer's final turn: the text of its last ``<question>...</question>`` and
    last ``<answer>...</answer>``, stripped; ``""`` for a part that is missing (as the authors' ``re.findall(...)[-1]``
    or ``""``)."""
    qs, ans = _QUESTION.findall(str(text)), _ANSWER.findall(str(text))
    return (qs[-1].strip() if qs else ""), (ans[-1].strip() if ans else "")


def difficulty_score(hits: list[float]) -> float:
    """The hard-yet-solvable reward of a question from the solver's ``n >= 2`` results on it (1 right, 0 wrong),
    ``k`` of them right:

    ``d = (n - k) / (n - 1)`` for ``0 < k < n``; ``d = 0`` when no sample solved it (unsolvable, or its answer is
    wrong) and when every sample did (trivial).

    So the reward is highest (1.0) for a question exactly one sample solved and falls linearly as more do
    (``n = 5``: ``k = 1, 2, 3, 4`` give ``1, 0.75, 0.5, 0.25``).

    Provenance: authors' code — https://github.com/facebookresearch/drzero verl/custom_reward/reward_function.py
    (compute_difficulty_score); the same rule. Test: tests/test_dr_zero.py::test_difficulty_by_hand.
    """
    n = len(hits)
    if n < 2:
        raise ValueError(f"dr_zero: the difficulty of a question needs at least 2 solver samples, got {n} "
                         f"(dr_zero_solver_samples)")
    k = sum(1 for h in hits if float(h) > 0.5)
    return 0.0 if k in (0, n) else (n - k) / (n - 1)


def proposer_format(turns: list[str], calls: list[tuple[str, bool, str]], hops: int, document: str,
                    final: str) -> float:
    """The format check of a proposer's episode, in [0, 1]:

    ``f = (1 + think + tool + answer) / 4`` when the question is whole, else 0, where

    * whole: the final turn has a non-empty ``<question>`` and ``<answer>``, and the normalised answer is not part
      of the normalised question;
    * ``think``: the share of the proposer's turns that start with ``<think>...</think>``;
    * ``tool``: with ``c`` search calls, all of them answered without error and ``c > 0``: ``min((1 + c) / n, 1)``;
      otherwise 1.0 for a one-hop question (no search needed) and 0.0 for ``n > 1``;
    * ``answer``: 1.0 when the normalised answer (at most 5 words) is ``yes``/``no`` or occurs in the source
      document or the search results read (these count only in the ``c > 0`` case above), 0.5 for 6 to 10 words,
      else 0.0.

    ``calls``: ``(tool name, answered without error, output)`` of every tool call of the episode.

    Provenance: authors' code — https://github.com/facebookresearch/drzero verl/custom_reward/reward_function.py
    (compute_challenger_format_scores); grpolab's differences: a valid call is one the environment ran without
    error (the authors: a JSON ``search`` call with a ``query_list``), and the tool outputs are the episode's
    records, not read back from the chat text. Test: tests/test_dr_zero.py::test_proposer_reward_by_hand.
    """
    question, answer = parse_proposal(final)
    if not question or not answer or normalise(answer) in normalise(question):
        return 0.0
    think = sum(1 for t in turns if _THINK.match(str(t).strip())) / max(1, len(turns))
    good = [out for name, ok, out in calls if name == SEARCH_TOOL and ok]
    seen = document
    tool = 1.0 if hops == 1 else 0.0
    if good and len(good) == len(calls):
        tool = min((1 + len(good)) / hops, 1.0)
        seen = "\n\n".join([document] + good)
    ans = normalise(answer)
    words = len(ans.split())
    grounded = ans in ("yes", "no") or ans in normalise(seen)
    found = (1.0 if 0 < words <= 5 else 0.5 if 0 < words <= 10 else 0.0) if grounded else 0.0
    return (1.0 + think + tool + found) / 4


def proposer_reward(fmt: float, hits: list[float] | None) -> float:
    """A proposer's reward: ``0.5 * format + difficulty(hits)``; ``hits`` is None when the question failed the
    format check (the solver is not asked: reward 0)."""
    if fmt <= 0 or hits is None:
        return 0.0
    return 0.5 * fmt + difficulty_score(hits)


def episode_calls(episode: dict) -> tuple[list[str], list[tuple[str, bool, str]]]:
    """``(turn texts, tool calls)`` of an episode record (``columns['episode']``) for :func:`proposer_format`."""
    turns = episode.get("turns") or []
    calls = [(c.get("name") or "", c.get("error") is None and c.get("arguments") is not None, c.get("output") or "")
             for t in turns for c in t.get("tool_calls") or []]
    return [t.get("text") or "" for t in turns], calls


def proposal_of(episode: dict, hops, document: str, final: str) -> tuple[str, str, float]:
    """``(question, answer, format)`` of one proposer episode."""
    turns, calls = episode_calls(episode or {})
    q, a = parse_proposal(final)
    return q, a, proposer_format(turns, calls, int(hops), str(document), final)


def dr_zero_reward(prompts=None, completions=None, role=None, answer=None, hops=None, document=None, episode=None,
                   dr_zero_hits=None, **kwargs) -> list[float]:
    """Per row, by its ``role``: the solver's exact match, or the proposer's ``0.5 * format + difficulty``
    (module docstring)."""
    if role is None:
        raise ValueError("dr_zero_docs' reward reads the column 'role' (proposer or solver) that the dr_zero rollout "
                         "sets (rollout_strategy: dr_zero)")
    texts = [completion_text(c) for c in completions]
    solved = qa_accuracy(completions=texts, answer=[a or "" for a in (answer or [""] * len(texts))])
    out = []
    for i, r in enumerate(role):
        if r == SOLVER:
            out.append(solved[i])
        elif r == PROPOSER:
            if episode is None or hops is None or document is None:
                raise ValueError("dr_zero_docs' proposer reward reads the columns 'episode', 'hops' and 'document'")
            _, _, fmt = proposal_of(episode[i], hops[i], document[i], texts[i])
            out.append(proposer_reward(fmt, None if dr_zero_hits is None else dr_zero_hits[i]))
        else:
            raise ValueError(f"dr_zero_docs: role '{r}' is neither {PROPOSER} nor {SOLVER}")
    return out


def solver_row(question: str, answer: str, hops, demo: bool = True) -> dict:
    """The solver's row for a proposed question: ``search_qa``'s instruction (and worked example) and the question;
    the proposer's answer is the reference."""
    prompt = ([{"role": "system", "content": SEARCH_SYSTEM}] + (list(SEARCH_DEMO) if demo else []) +
              [{"role": "user", "content": question}])
    return {"prompt": prompt, "question": question, "answer": answer, "hops": hops, "role": SOLVER}


# ------------------------------------------------------------------------------------------------ the task
@TASKS.register("dr_zero_docs", needs=("text",))
@provides_environment
def dr_zero_docs(*,
                 dr_zero_hop_ratio: list = param([4, 3, 2, 1], "dr_zero_docs: weights of the hop counts 1, 2, ... the "
                                                 "proposer is asked for (the authors' 4:3:2:1 over 1-4 hops)"),
                 dr_zero_seed: int = param(1234, "dr_zero_docs: seed of the documents' order and hop counts"),
                 dr_zero_eval: int = param(40, "dr_zero_docs: held-out search_qa questions the solver is evaluated on"),
                 dr_zero_kb_seed: int = param(0, "dr_zero_docs: the search world (search_qa's kb_seed)")) -> Task:
    """Documents of the search world with a hop count each, for the proposer; ``search_qa``'s held-out questions
    for the solver (module docstring).

    Provenance: authors' code — https://github.com/facebookresearch/drzero process_train.py (the proposer's rows:
    one corpus document, cut to 256 tokens there, with a hop count drawn 4:3:2:1 over 1-4 hops, data_source
    search_zero_<hops>); grpolab's choices: the built-in world's documents (a few sentences each) in place of
    Wikipedia, grpolab's shorter proposer instruction (verl/prompts.py's DEFAULT_CHALLENGER_PREFIX is written for
    a 3B model), search_qa's held-out questions for evaluation. Test:
    tests/test_dr_zero.py::test_question_parser_and_hop_counts.
    """
    try:
        weights = [float(w) for w in dr_zero_hop_ratio]
    except (TypeError, ValueError):
        weights = []
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"dr_zero_hop_ratio: non-negative weights of hop counts 1, 2, ..., not all 0, got "
                          f"{dr_zero_hop_ratio!r}")
    kb = generate(dr_zero_kb_seed)
    rng = random.Random(dr_zero_seed)
    docs = list(kb.documents)
    rng.shuffle(docs)
    rows = []
    for title, text in docs:
        hops = rng.choices(range(1, len(weights) + 1), weights=weights)[0]
        document = f"(Title: {title})\n{text}"
        rows.append({"prompt": [{"role": "system", "content": PROPOSER_SYSTEM},
                                {"role": "user", "content": f"n = {hops}\nSource document: {document}"}],
                     "hops": hops, "document": document, "title": title, "answer": "", "role": PROPOSER})
    qa = search_qa(n_eval=dr_zero_eval, kb_seed=dr_zero_kb_seed)
    evals = [{**r, "role": SOLVER, "document": ""} for r in qa.eval_rows]
    return Task("dr_zero_docs", rows, evals, rewards=[("dr_zero", dr_zero_reward, 1.0)], accuracy_reward="dr_zero",
                description="documents of the search world with a hop count each: the proposer writes questions, "
                            "the solver answers them with search (rollout_strategy dr_zero)",
                extra={"environment": qa.extra["environment"], "lenient_accuracy": qa_lenient_accuracy})
