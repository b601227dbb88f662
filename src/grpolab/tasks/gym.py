"""``rg:NAME``: any dataset of the reasoning-gym package as a grpolab task.

``--task rg:chain_sum`` builds the train rows from
``reasoning_gym.create_dataset(NAME, size=rg_train_size, seed=rg_seed)`` and the
held-out rows from a second dataset with seed ``rg_seed + rg_train_size``.
reasoning-gym draws item ``i`` from ``Random(seed + i)``, so the two splits
use disjoint seed ranges (``seed + 1`` would repeat the train items shifted by
one); held-out questions that still occur in the train split are dropped, so
the splits never share a question. ``rg_config`` (a mapping, or a
JSON object on the command line) passes extra dataset options, e.g.
``{"min_terms": 2, "max_terms": 3}``.

The prompt is the dataset's question followed by "Finish your reply with
'Answer:' followed by the answer." Rewards:

* ``rg_score`` (weight 1.0, the accuracy reward): the dataset's own
  ``score_answer(extracted, entry)`` on the text after the last ``Answer:``
  (up to the end of that line); 0.0 when there is no ``Answer:``.

  Many reasoning-gym scorers evaluate the answer as Python (``eval``,
  ``sympy.parse_expr``), so ``score_answer`` never runs in the training
  process: it runs in the sandbox (:mod:`grpolab.sandbox`, docs/safety.md), a
  worker process that builds the two datasets once and scores each reward call
  in a fresh child with CPU, memory and wall-clock limits, no network and no
  file writes outside a scratch directory. ``rg_sandbox: item`` (default) gives
  every answer its own child, so one answer's code cannot touch another's
  score; ``call`` scores a whole reward call in one child (faster, but one
  crafted answer can patch the scorer for the answers after it). In
  ``call`` mode a child that times out or crashes is retried answer by answer.
  An answer whose scoring times out (``rg_score_timeout``), crashes or raises
  scores 0.0, as reasoning-gym scores an answer whose evaluation fails.
* ``format`` (weight 0.5): 1.0 if the reply ends with an ``Answer: ...`` line.

Columns: ``question``, ``answer`` (the dataset's reference answer),
``rg_entry`` (the dataset entry: question, answer, metadata; what
``score_answer`` reads) and ``rg_split`` (``train`` / ``eval``).

reasoning-gym is optional (``pip install 'grpolab[gym]'``); it is imported only
when an ``rg:`` task is built.
"""
from __future__ import annotations

import difflib
import json
import math
import re

from ..registry import TASKS
from .base import Task
from ..data import completion_text
from ..registry import param
from ..sandbox import Limits, Sandbox
from ..sandbox import gym as sandboxed

GYM_PREFIX = "rg:"
ANSWER_LINE = re.compile(r"Answer:[ \t]*([^\n]*)")
FORMAT = re.compile(r"Answer:[ \t]*\S[^\n]*\s*$")
INSTRUCTION = "Finish your reply with 'Answer:' followed by the answer."


def _import_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError("task 'rg:...' needs the optional package reasoning-gym: "
                         "pip install 'grpolab[gym]'") from None
    return reasoning_gym


SCORE_MEMORY_MB = 2048  # address space of a scoring child (the worker with sympy loaded uses about 250 MiB)


def checked_score(value) -> float:
    """A score a scoring child sent back, as a reward: a finite number in [0, 1] (reasoning-gym's range for
    every dataset), else 0.0. The child ran the model's answer, so the value is the answer's to forge: a
    ``1e300``, a ``NaN``, a string or a list must cost that answer its score, never the run."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    return float(value) if 0.0 <= value <= 1.0 else 0.0


def score_in_sandbox(box: Sandbox, answers: list[str | None], entries: list[dict], splits: list[str],
                     per_item: bool = False) -> list[float]:
    """reasoning-gym scores of ``answers`` (None = no ``Answer:`` line, 0.0), computed in ``box``'s children.

    One child for all answers (``per_item`` False), retried one child per answer if that child fails or sends
    back anything but one score per answer; an answer whose child fails, or whose score is not a number in
    [0, 1] (:func:`checked_score`), scores 0.0. Never raises for what an answer did.
    """
    out = [0.0] * len(answers)
    todo = [(i, (s, a, e)) for i, (a, e, s) in enumerate(zip(answers, entries, splits)) if a is not None]
    if not todo:
        return out
    if not per_item:
        res = box.call(sandboxed.score_many, [t for _, t in todo])
        if res.ok and isinstance(res.value, list) and len(res.value) == len(todo):
            for (i, _), v in zip(todo, res.value):
                out[i] = checked_score(v)
            return out
    for (i, _), res in zip(todo, box.map(sandboxed.score, [t for _, t in todo])):
        out[i] = checked_score(res.value) if res.ok else 0.0
    return out


def gym_names() -> list[str]:
    """Every dataset name reasoning-gym registers."""
    from reasoning_gym.factory import DATASETS
    return sorted(DATASETS)


def extract_answer(text: str) -> str | None:
    """What follows the last ``Answer:`` up to the end of its line (stripped); None if absent."""
    found = ANSWER_LINE.findall(text)
    return found[-1].strip() if found else None


def _options(rg_config) -> dict:
    if rg_config in (None, ""):
        return {}
    if isinstance(rg_config, str):
        try:
            rg_config = json.loads(rg_config)
        except json.JSONDecodeError as e:
            raise ValueError(f"rg_config: expected a JSON object, got {rg_config!r} ({e})") from None
    if not isinstance(rg_config, dict):
        raise ValueError(f"rg_config: expected a mapping of dataset options, got {rg_config!r}")
    return dict(rg_config)


def _row(entry: dict, split: str) -> dict:
    content = f"{entry['question']}\n{INSTRUCTION}"
    return {"prompt": [{"role": "user", "content": content}], "question": entry["question"],
            "answer": str(entry["answer"]), "rg_entry": {"question": entry["question"], "answer": entry["answer"],
                                                         "metadata": entry.get("metadata", {})},
            "rg_split": split}


@TASKS.register(GYM_PREFIX, prefix="NAME (reasoning-gym)", needs=("text",))
def gym_task(name: str, *,
             rg_train_size: int = param(1000, 'rg:NAME: training rows (reasoning-gym dataset of this size, seed '
                                        'rg_seed)'),
             rg_eval_size: int = param(200, 'rg:NAME: held-out rows (seed rg_seed + rg_train_size; shared questions '
                                       'dropped)'),
             rg_seed: int = param(1234, 'rg:NAME: dataset seed of the training split'),
             rg_config: dict | str | None = param(None, 'rg:NAME: extra reasoning-gym dataset options (mapping or '
                                                  'JSON object)'),
             rg_sandbox: str = param("item", "rg:NAME: sandbox children for scoring: 'item' = one per answer "
                                     "(an answer cannot touch another's score), 'call' = one per reward call "
                                     "(faster; one crafted answer can change the scores of the others)",
                                     ["item", "call"]),
             rg_score_timeout: float = param(20.0, "rg:NAME: wall-clock and CPU seconds a scoring child may run "
                                             "(one reward call, or one answer with rg_sandbox item)")) -> Task:
    """The reasoning-gym dataset ``name`` as a :class:`Task` (see the module docstring).

    Provenance: grpolab's own — an adapter of the reasoning-gym package's datasets and their score_answer;
    implements no published method.
    """
    rg = _import_gym()
    names = gym_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join('rg:' + c for c in close)}?" if close else ""
        raise ValueError(f"task 'rg:{name}': reasoning-gym has no dataset '{name}'{hint} "
                         f"({len(names)} datasets, e.g. {', '.join(names[:6])})")
    opts = _options(rg_config)
    sizes = {"train": (rg_train_size, rg_seed), "eval": (rg_eval_size, rg_seed + rg_train_size)}
    datasets = {split: rg.create_dataset(name, size=size, seed=seed, **opts) for split, (size, seed) in sizes.items()}
    train = [_row(e, "train") for e in datasets["train"]]
    seen = {r["question"] for r in train}
    held = [_row(e, "eval") for e in datasets["eval"]]
    held = [r for r in held if r["question"] not in seen]

    if not (rg_score_timeout > 0):
        raise ValueError(f"rg_score_timeout: must be > 0 seconds, got {rg_score_timeout}")
    limits = Limits(cpu_s=rg_score_timeout, wall_s=rg_score_timeout, memory_mb=SCORE_MEMORY_MB)
    box = Sandbox(limits=limits, preload=[(sandboxed.preload, (split, name, size, seed, opts))
                                          for split, (size, seed) in sizes.items()])
    box.start(background=True)  # the worker builds its datasets while the model loads

    def rg_score(prompts=None, completions=None, rg_entry=None, rg_split=None, **kwargs) -> list[float]:
        return score_in_sandbox(box, [extract_answer(completion_text(c)) for c in completions], rg_entry,
                                rg_split, per_item=rg_sandbox == "item")

    def format_reward(prompts=None, completions=None, **kwargs) -> list[float]:
        return [1.0 if FORMAT.search(completion_text(c)) else 0.0 for c in completions]

    return Task(f"rg:{name}", train, held, rewards=[("rg_score", rg_score, 1.0), ("format", format_reward, 0.5)],
                accuracy_reward="rg_score",
                description=f"reasoning-gym '{name}' (seeds {rg_seed} / {rg_seed + rg_train_size}), "
                            f"'Answer: ...' format")
