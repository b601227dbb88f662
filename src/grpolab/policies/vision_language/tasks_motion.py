"""``motion_clips``: which way does the shape move? (a short clip of frames; the AVATAR recipe's task, seed 000-104).

Each row shows a ``motion`` clip (:mod:`grpolab.policies.vision_language.clips`: :data:`~grpolab.policies.vision_language.clips.FRAMES` frames, one
shape moving left / right / up / down, perhaps a still distractor) and asks "which way does the red circle move?";
the answer is one word, ``<answer>left</answer>``.

Rows: ``{"prompt", "scene_kind": "motion", "scene_seed", "direction"}``; train clip seeds ``TRAIN_BASE + i``
(i < ``motion_train_size``, shuffled with the task seed), held-out ``EVAL_BASE + i`` (i < ``motion_eval_size``, in
order); pre-training (``--model tiny``) uses seeds 0 … 3999.

Rewards (TRL's contract, ``f(prompts, completions, *, direction, **columns)``), weights as the AVATAR launcher's
``--reward_weights 1 0.5`` of its accuracy and format rewards:

* :func:`motion_accuracy` (weight 1, the accuracy): 1 when the word inside the first ``<answer>…</answer>`` is the
  direction;
* :func:`motion_format` (weight 0.5): 1 when the whole completion is ``<answer>WORD</answer>`` with WORD one of
  left / right / up / down (surrounding whitespace allowed).

Measured (recipe avatar, 60 steps, one thread, 200 held-out clips, draws at temperature 1 from each clip's seed):
accuracy 0.415 -> 0.485 / 0.48 (seeds 0 / 1); with TAS off and no replay 0.415 -> 0.425 / 0.47. Greedy accuracy
starts at 57.5% and falls to 45% / 44% (AVATAR / without) in the same 60 steps.
"""
from __future__ import annotations

import random
import re

from ...data import completion_text
from ...registry import TASKS, param
from . import tiny
from .clips import MAX_DISTRACTORS, MAX_STEP, MIN_STEP, motion_clip
from ...tasks.base import Task
from ..base import reward_column

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_FORMAT = re.compile(r"\s*<answer>\s*(left|right|up|down)\s*</answer>\s*")


def motion_row(seed: int) -> dict:
    clip = motion_clip(seed)
    mover = clip.objects[clip.target]
    return {"prompt": f"which way does the {mover.name} move?", "scene_kind": "motion", "scene_seed": int(seed),
            "direction": clip.direction}


def _answer_word(completion) -> str | None:
    m = _ANSWER.search(completion_text(completion))
    return m.group(1).strip().lower() if m else None


def _directions(reward: str, direction, n: int) -> list[str]:
    return reward_column(reward, "direction", direction, n, "left / right / up / down, one per row", "directions")


def motion_accuracy(prompts=None, completions=None, *, direction=None, **kwargs) -> list[float]:
    """r_i = 1[the word inside the first ``<answer>…</answer>`` (stripped, lower case) = the row's direction]."""
    completions = list(completions or [])
    refs = _directions("motion_accuracy", direction, len(completions))
    return [float(_answer_word(c) == r) for c, r in zip(completions, refs)]


def motion_format(prompts=None, completions=None, **kwargs) -> list[float]:
    """r_i = 1[the completion is exactly ``<answer>WORD</answer>``, WORD a direction; whitespace around allowed]."""
    return [float(_FORMAT.fullmatch(completion_text(c)) is not None) for c in completions or []]


#: pre-training steps of the tiny VLM on this task: fewer than the default 300, so that it starts part-way
PRETRAIN_ITERATIONS = 250


def pretraining_example(seed: int) -> tuple[dict, str]:
    """A row and its true one-word target, ``<answer>left</answer>``.

    Tuning (one thread, 200 held-out clips, the direction whose target the pre-trained model finds likeliest):
    with every target true the tiny LLaVA is at chance (23.5%) after 150 pre-training steps, 31% after 200, 57%
    after 250 and 94.5% after 300; with noisy targets (the vertical clips' words drawn at random from the four or
    from up / down) it stayed at chance after 300 and 600 steps, and with a still distractor shape in half the
    clips it reached 46% after 300. Hence true targets and :data:`PRETRAIN_ITERATIONS` = 250: part-way, with room
    for RL."""
    row = motion_row(seed)
    return row, f"<answer>{row['direction']}</answer>"


tiny.register_pretraining("motion_clips", pretraining_example, iterations=PRETRAIN_ITERATIONS,
                          targets=f"motion v3: true; steps {MIN_STEP}-{MAX_STEP}; distractors {MAX_DISTRACTORS}")

TRAIN_SIZE = param(400, "motion_clips: training clips (scene seeds TRAIN_BASE + i)")
EVAL_SIZE = param(200, "motion_clips: held-out clips (scene seeds EVAL_BASE + i, a fixed set)")


@TASKS.register("motion_clips", needs=("vision",))
def motion_clips(seed: int = 0, *, motion_train_size: int = TRAIN_SIZE, motion_eval_size: int = EVAL_SIZE) -> Task:
    """Name the direction a shape moves in a 3-frame clip: rewards ``motion_accuracy`` (weight 1, the accuracy)
    and ``motion_format`` (weight 0.5). Module docstring: rows, rewards.

    Provenance: grpolab's own — a toy clip task for the AVATAR recipe (arXiv 2508.03100, seed 000-104), whose
    authors train on audio-video QA; the accuracy + 0.5 x format weighting is their launcher's
    (ms-swift/examples/train/grpo/qwen2_5_omni/grpo.sh), the reward definitions here are grpolab's.
    """
    if int(motion_train_size) < 1 or int(motion_eval_size) < 0:
        raise ValueError(f"motion_clips: motion_train_size >= 1 and motion_eval_size >= 0, got {motion_train_size} "
                         f"and {motion_eval_size}")
    rows = [motion_row(tiny.TRAIN_BASE + i) for i in range(int(motion_train_size))]
    random.Random(seed).shuffle(rows)
    evals = [motion_row(tiny.EVAL_BASE + i) for i in range(int(motion_eval_size))]
    return Task("motion_clips", rows, evals,
                rewards=[("motion_accuracy", motion_accuracy, 1.0), ("motion_format", motion_format, 0.5)],
                accuracy_reward="motion_accuracy",
                description="which way a shape moves in a 3-frame clip: accuracy + 0.5 x format", extra={})
