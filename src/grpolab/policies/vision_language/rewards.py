"""Vision-language rewards: the rewards of the ``shape_grounding`` task, for any policy whose completions hold a
box ``[x1,y1,x2,y2]`` (inside ``<answer>…</answer>``).

* ``box_iou``: IoU of the answered box with the row's ``target_box`` as pixel sets (0 when no box parses);
* ``box_hit``: 1.0 when that IoU is at least 0.5.

Use them on your own data with ``--reward grpolab.policies.vision_language.rewards:box_iou`` (a ``target_box`` column). They are
defined, with their formulas and sources, in ``grpolab/policies/vision_language/tasks.py`` beside the task (``tasks`` may not import
``rewards``: tests/test_architecture.py).
"""
from __future__ import annotations

from .tasks import box_hit, box_iou, parse_box

__all__ = ["box_iou", "box_hit", "parse_box"]
