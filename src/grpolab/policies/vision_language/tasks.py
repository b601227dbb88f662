"""``shape_grounding``: draw a box around the named shape of a synthetic scene (visual grounding).

A row shows a 32 × 32 scene of 1–3 coloured shapes (``policies/vision_language/scenes.py``, ``scene_kind: shapes``) and asks for
the box of one of them by name: ``{"prompt": [{"role": "user", "content": "Box the red circle."}],
"scene_kind": "shapes", "scene_seed": s, "target": "red circle", "target_box": [x1, y1, x2, y2]}``. The answer
is ``<answer>[x1,y1,x2,y2]</answer>`` in pixels (0 … 31, corners included). Train rows: scene seeds
``TRAIN_BASE + i`` (``vision_train_size``, 400, shuffled by the task's seed); held-out rows ``EVAL_BASE + i``
(``vision_eval_size``, 200, a fixed set); the tiny VLM pre-trains on seeds 0 … 3,999 (``policies/vision_language/tiny.py``).

Rewards (TRL's contract ``f(prompts, completions, *, target_box, **columns)``; published as
``grpolab.policies.vision_language.rewards``):

* :func:`box_iou` (weight 1): IoU of the answered box with ``target_box``, as pixel sets (0 when no box parses);
* :func:`box_hit` (weight 0, the accuracy): 1 when that IoU is at least 0.5.
"""
from __future__ import annotations

import random
import re

from ...data import completion_text
from ...registry import TASKS, param
from ...tasks.base import Task
from ..base import reward_column

BOX = re.compile(r"\[\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*\]")
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def parse_box(text) -> list[float] | None:
    """The first ``[x1,y1,x2,y2]`` inside ``<answer>…</answer>`` (the whole text when there is no answer tag),
    or None."""
    text = completion_text(text)
    m = ANSWER.search(text)
    b = BOX.search(m.group(1) if m else text)
    return [float(v) for v in b.groups()] if b else None


def _targets(name: str, target_box, n: int) -> list:
    return reward_column(name, "target_box", target_box, n, "[x1, y1, x2, y2] per row", "target boxes")


def box_iou(prompts=None, completions=None, *, target_box=None, **kwargs) -> list[float]:
    """r_i = |B̂_i ∩ B_i| / |B̂_i ∪ B_i| over pixels (``scenes.box_mask``: corners included, clipped to the 32 × 32
    canvas); 0 when the completion has no box.

    Source: the IoU reward of visual-grounding GRPO (e.g. Seg-R1's and PixelThink's box terms, seeds 000-72,
    000-116); this pixel-set form is [ours].
    """
    from .scenes import box_mask, iou
    comps = list(completions or [])
    out = []
    for c, t in zip(comps, _targets("box_iou", target_box, len(comps))):
        b = parse_box(c)
        out.append(0.0 if b is None else iou(box_mask(b), box_mask(t)))
    return out


def box_hit(prompts=None, completions=None, *, target_box=None, **kwargs) -> list[float]:
    """r_i = 1[box_iou_i ≥ 0.5] (the task's accuracy)."""
    return [float(v >= 0.5) for v in box_iou(prompts, completions, target_box=target_box)]


def grounding_row(seed: int) -> tuple[dict, str]:
    """``(row, target completion)`` of scene ``seed``."""
    from .scenes import shapes_scene
    scene = shapes_scene(seed)
    obj = scene.objects[scene.target]
    row = {"prompt": [{"role": "user", "content": [{"type": "text", "text": f"Box the {obj.name}."},
                                                   {"type": "image"}]}], "scene_kind": "shapes",
           "scene_seed": int(seed), "target": obj.name, "target_box": list(obj.box)}
    return row, "<answer>[{},{},{},{}]</answer>".format(*obj.box)


TRAIN_SIZE = param(400, "vision tasks: training rows (scene seeds TRAIN_BASE + i)")
EVAL_SIZE = param(200, "vision tasks: held-out rows (scene seeds EVAL_BASE + i, a fixed set)")


@TASKS.register("shape_grounding", needs=("vision",))
def shape_grounding(seed: int = 0, *, vision_train_size: int = TRAIN_SIZE, vision_eval_size: int = EVAL_SIZE) -> Task:
    """Box the named shape of a synthetic scene: reward ``box_iou`` (weight 1), accuracy ``box_hit`` (IoU ≥ 0.5)
    (module docstring: rows, rewards).

    Provenance: grpolab's own — a built-in toy grounding task for the vision-language policy's tests and demos.
    """
    from .tiny import EVAL_BASE, TRAIN_BASE

    if int(vision_train_size) < 1 or int(vision_eval_size) < 0:
        raise ValueError(f"shape_grounding: vision_train_size >= 1 and vision_eval_size >= 0, got "
                         f"{vision_train_size} and {vision_eval_size}")
    rows = [grounding_row(TRAIN_BASE + i)[0] for i in range(int(vision_train_size))]
    random.Random(seed).shuffle(rows)
    return Task("shape_grounding", rows, [grounding_row(EVAL_BASE + i)[0] for i in range(int(vision_eval_size))],
                rewards=[("box_iou", box_iou, 1.0), ("box_hit", box_hit, 0.0)], accuracy_reward="box_hit",
                description="box the named shape of a synthetic 32x32 scene: IoU reward", extra={})


def _register_pretraining() -> None:
    from .tiny import register_pretraining
    # 1,000 steps: the model sees (held-out greedy IoU 0.25 with 1-3 shapes; 300 steps: 0.09, the picture ignored)
    register_pretraining("shape_grounding", grounding_row, iterations=1000)


_register_pretraining()
