"""``visual_tools``: choose the image tools a frozen reasoner needs to answer a question (VisTA, seed 000-74).

The policy sees a ``shapes`` scene (:mod:`grpolab.policies.vision_language.scenes`) and a question, and answers the 1-based indices
of the tools it selects from the library :data:`grpolab.policies.vision_language.tools.TOOLS` (``<answer>2,4</answer>``). The tools
run on the picture; a frozen rule-based reasoner (:func:`reason`) answers the question from their outputs, and
also without any tool (:data:`PRIOR`, a fixed answer per kind of question that is sometimes right). The reward is
VisTA's table (:func:`vista_reward`): +1 when the reasoner with the selected tools is right, -0.5 when it is
wrong although its no-tool prior was right (the tools hurt), 0 when both are wrong.

Questions (one kind of information each; :data:`QUESTION_KINDS`, the tool that supplies it in brackets):

* ``count``        "how many shapes?" — 1-3 [1 count]; prior ``2``
* ``colour_count`` "how many red shapes?" — 0-3, the colour uniform over the palette [2 colours]; prior ``0``
* ``largest``      "what colour is the largest shape?" [3 largest]; prior ``red``; only scenes without a tie
* ``side``         "is the blue shape left or right?" [4 where]; prior ``left``; a colour present exactly once
* ``has_shape``    "is there a triangle?" — yes/no [5 shapes]; prior ``no``

A row's kind is drawn uniformly among those its scene allows, from its own seed (``numpy.random.default_rng(
[74, seed])``); the ground truth ``answer`` comes from the scene's metadata (shapes, colours, masks), not from the
tools (tests/test_vision_tools_avatar.py checks the tools against it).

Rows: ``{"prompt", "scene_kind": "shapes", "scene_seed", "question_kind", "question_arg", "answer"}``; train scene
seeds ``TRAIN_BASE + i`` (i < ``vista_train_size``, shuffled with the task seed), held-out ``EVAL_BASE + i``
(i < ``vista_eval_size``, in order); pre-training (``--model tiny``) uses seeds 0 … 3999 (:func:`pretraining_example`:
the needed tool for two kinds of question, random tools for the other three).

Measured (recipe vista, 100 steps, one thread, the tiny model pre-trained from the shape_grounding backbone):
held-out mean reward (200 rows, greedy) 0.290 -> 1.000 / 1.000 / 0.858 (seeds 0 / 1 / 2). With the earlier
pre-training from random weights (300 steps) and random tools for every kind of question, the model's choice
ignored the question: 100 steps at learning rate 1e-4 moved it 0.03 -> 0.06; at 3e-4 it went to the safe empty
selection after 40 steps (0.395, the no-tool prior) and to malformed answers after 100.
"""
from __future__ import annotations

import functools
import random
import re

import numpy as np

from ...data import completion_text
from ...registry import TASKS, param
from . import tiny
from .scenes import COLOURS, SHAPES, SIZE, row_images, shapes_scene
from .tools import TOOL_NAMES, run_tools
from ...tasks.base import Task

QUESTION_KINDS = {"count": 1, "colour_count": 2, "largest": 3, "side": 4, "has_shape": 5}  # kind -> needed tool
PRIOR = {"count": "2", "colour_count": "0", "largest": "red", "side": "left", "has_shape": "no"}
UNSURE = "unsure"  # the reasoner's answer when the tools it read do not settle the question
#: VisTA's reward table: tools right; tools wrong but no-tool right; both wrong
REWARD_TOOLS_RIGHT, REWARD_TOOLS_HURT, REWARD_BOTH_WRONG = 1.0, -0.5, 0.0
TOOL_LIST = " ".join(f"{i + 1} {n}" for i, n in enumerate(TOOL_NAMES))
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def question(kind: str, arg: str) -> str:
    return {"count": "how many shapes?", "colour_count": f"how many {arg} shapes?",
            "largest": "what colour is the largest shape?", "side": f"is the {arg} shape left or right?",
            "has_shape": f"is there a {arg}?"}[kind]


def scene_question(seed: int) -> tuple[str, str, str]:
    """``(kind, arg, answer)`` of the row with scene seed ``seed`` (module docstring)."""
    scene = shapes_scene(seed)
    rng = np.random.default_rng([74, int(seed)])
    objs = scene.objects
    areas = [int(o.mask.sum()) for o in objs]
    colours = [o.colour for o in objs]
    unique = [c for c in COLOURS if colours.count(c) == 1]
    kinds = ["count", "colour_count", "has_shape"]
    if areas.count(max(areas)) == 1:
        kinds.append("largest")
    if unique:
        kinds.append("side")
    kinds.sort(key=list(QUESTION_KINDS).index)
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "count":
        return kind, "", str(len(objs))
    if kind == "colour_count":
        c = list(COLOURS)[int(rng.integers(len(COLOURS)))]
        return kind, c, str(colours.count(c))
    if kind == "largest":
        return kind, "", objs[int(np.argmax(areas))].colour
    if kind == "side":
        c = unique[int(rng.integers(len(unique)))]
        xs = np.nonzero(objs[colours.index(c)].mask)[1]
        return kind, c, "left" if xs.mean() < SIZE / 2 else "right"
    s = SHAPES[int(rng.integers(len(SHAPES)))]
    return kind, s, "yes" if any(o.shape == s for o in objs) else "no"


def vista_row(seed: int) -> dict:
    kind, arg, answer = scene_question(seed)
    return {"prompt": f"tools: {TOOL_LIST}. {question(kind, arg)}", "scene_kind": "shapes", "scene_seed": int(seed),
            "question_kind": kind, "question_arg": arg, "answer": answer}


def selected_tools(completion) -> list[int]:
    """The tool indices of a completion: the integers inside its first ``<answer>…</answer>`` (comma or space
    separated), in order, duplicates dropped (out-of-range ones are skipped by ``run_tools``); ``[]`` without an
    answer tag: the reasoner then sees no tool and answers as without tools."""
    m = _ANSWER.search(completion_text(completion))
    if not m:
        return []
    out: list[int] = []
    for tok in re.split(r"[,\s]+", m.group(1).strip()):
        if tok.isdigit() and int(tok) not in out:
            out.append(int(tok))
    return out


def reason(kind: str, arg: str, outputs: list[str], max_tools: int = 2) -> str:
    """The frozen reasoner: the answer to question ``(kind, arg)`` from the first ``max_tools`` tool outputs.

    Without any tool output it answers its prior :data:`PRIOR` (its answer without tools). Otherwise it reads
    only the line of the tool that supplies its kind's information (``count:``, ``colours:``, ``largest:``,
    ``where:``, ``shapes:``) and answers from it; when that line is not among what it reads, or does not settle
    the question (a tie, a colour listed twice), it answers :data:`UNSURE` (always wrong): the tools it was
    given displaced its guess. So with tools it is right iff the needed information is in what it reads.
    """
    read = [o for o in outputs[:max(int(max_tools), 0)] if ":" in o]
    if not read:
        return PRIOR[kind]
    lines = {o.split(":", 1)[0]: o.split(":", 1)[1].strip() for o in read}
    if kind == "count" and "count" in lines:
        return lines["count"].split()[0]
    if kind == "colour_count" and "colours" in lines:
        counts = dict(p.split() for p in lines["colours"].split(", "))
        return counts.get(arg, PRIOR[kind])
    if kind == "largest" and "largest" in lines and lines["largest"] in COLOURS:
        return lines["largest"]
    if kind == "side" and "where" in lines:
        hits = [p.split()[1] for p in lines["where"].split("; ") if p.split()[0] == arg]
        if len(hits) == 1:
            return hits[0]
    if kind == "has_shape" and "shapes" in lines:
        return "yes" if arg in lines["shapes"].split(", ") else "no"
    return UNSURE


def vista_table(tools_right: bool, no_tools_right: bool) -> float:
    """VisTA's reward: +1 if the reasoner with the tools is right; -0.5 if it is wrong but right without them;
    0 if both are wrong."""
    if tools_right:
        return REWARD_TOOLS_RIGHT
    return REWARD_TOOLS_HURT if no_tools_right else REWARD_BOTH_WRONG


def _columns(n, **cols) -> list[dict]:
    for name in ("question_kind", "question_arg", "answer"):
        if cols.get(name) is None:
            raise ValueError(f"reward 'vista' needs the data column '{name}' (rows of task visual_tools)")
    per = {k: list(v) for k, v in cols.items() if v is not None}
    bad = {k: len(v) for k, v in per.items() if len(v) != n}
    if bad:
        raise ValueError(f"reward 'vista': {n} completions but columns of lengths {bad}")
    return [{k: v[i] for k, v in per.items()} for i in range(n)]


def vista_reward(prompts=None, completions=None, *, question_kind=None, question_arg=None, answer=None,
                 scene_kind=None, scene_seed=None, image=None, images=None, max_tools: int = 2,
                 **kwargs) -> list[float]:
    """r_i = VisTA's table (:func:`vista_table`) of the reasoner's answer with the completion's tools (run on the
    row's picture) and without tools, against the row's ``answer``."""
    completions = list(completions or [])
    rows = _columns(len(completions), question_kind=question_kind, question_arg=question_arg, answer=answer,
                    scene_kind=scene_kind, scene_seed=scene_seed, image=image, images=images)
    out = []
    for c, row in zip(completions, rows):
        picture = row_images(row, "reward 'vista'")[0]
        outputs = run_tools(picture, selected_tools(c))
        with_tools = reason(row["question_kind"], row["question_arg"], outputs, max_tools)
        without = PRIOR[row["question_kind"]]
        out.append(vista_table(with_tools == str(row["answer"]), without == str(row["answer"])))
    return out


#: question kinds whose needed tool the pre-training targets show; the others' targets are random tools
PRETRAIN_TAUGHT = ("count", "has_shape")


def pretraining_example(seed: int) -> tuple[dict, str]:
    """A row and a short target: the needed tool for the kinds in :data:`PRETRAIN_TAUGHT`, one or two tools drawn
    uniformly for the other kinds (whose needed tool is left for RL to find)."""
    row = vista_row(seed)
    if row["question_kind"] in PRETRAIN_TAUGHT:
        return row, f"<answer>{QUESTION_KINDS[row['question_kind']]}</answer>"
    rng = np.random.default_rng([74, 1, int(seed)])
    k = 1 + int(rng.integers(2))
    picks = [int(i) + 1 for i in rng.choice(len(TOOL_NAMES), size=k, replace=False)]
    return row, "<answer>" + ",".join(map(str, picks)) + "</answer>"


tiny.register_pretraining("visual_tools", pretraining_example,
                         targets=f"vista v2: needed tool for {PRETRAIN_TAUGHT}, else 1-2 uniform")

TRAIN_SIZE = param(400, "visual_tools: training rows (scene seeds TRAIN_BASE + i)")
EVAL_SIZE = param(200, "visual_tools: held-out rows (scene seeds EVAL_BASE + i, a fixed set)")
MAX_TOOLS = param(2, "visual_tools: tool outputs the frozen reasoner reads (the first ones selected)")


@TASKS.register("visual_tools", needs=("vision",))
def visual_tools(seed: int = 0, *, vista_train_size: int = TRAIN_SIZE, vista_eval_size: int = EVAL_SIZE,
                 vista_max_tools: int = MAX_TOOLS) -> Task:
    """Select the image tools a frozen reasoner needs (VisTA's setting in miniature): reward ``vista`` (+1 / -0.5
    / 0), also the accuracy (1 = the reasoner with the selected tools is right). Module docstring: rows, tools,
    reasoner.

    Provenance: grpolab's own — a toy task for VisTA (arXiv 2505.20289, seed 000-74; paper only, no code
    checked): the reward table is the paper's; the tool library (grpolab.policies.vision_language.tools), the questions, the
    rule-based reasoner standing in for the frozen VLM/GPT-4o reasoner, its fixed no-tool prior, its "unsure"
    when the tools it read lack the information (which makes the -0.5 case reachable) and its reading of only
    the first vista_max_tools outputs (so that selecting every tool is not free) are grpolab's choices.
    """
    if int(vista_train_size) < 1 or int(vista_eval_size) < 0 or int(vista_max_tools) < 1:
        raise ValueError(f"visual_tools: vista_train_size >= 1, vista_eval_size >= 0 and vista_max_tools >= 1, got "
                         f"{vista_train_size}, {vista_eval_size} and {vista_max_tools}")
    rows = [vista_row(tiny.TRAIN_BASE + i) for i in range(int(vista_train_size))]
    random.Random(seed).shuffle(rows)
    evals = [vista_row(tiny.EVAL_BASE + i) for i in range(int(vista_eval_size))]
    reward = functools.partial(vista_reward, max_tools=int(vista_max_tools))
    reward.__name__ = "vista"
    return Task("visual_tools", rows, evals, rewards=[("vista", reward, 1.0)], accuracy_reward="vista",
                description="select image tools for a frozen rule-based reasoner (VisTA's reward table)", extra={})
