"""Segmentation rewards: the rewards of the ``shape_segmentation`` task, for any policy whose completions are text.

* Seg-R1 (arXiv:2506.22624, seed 000-72): ``segmentation_reward`` (0.7·IoU + 0.3·clip(S-measure, 0, 1) of the mask
  a deterministic stand-in for SAM2 returns for the completion's boxes and points; 0 without points, labels or a
  box), ``seg_r1_format_reward`` (1 when points, labels, a box and a think block parse), ``mask_iou_at_50`` (a
  pass/fail metric); the pieces ``parse_seg_r1``, ``stand_in_segment``, ``s_measure``, ``mask_iou``;
* PixelThink (arXiv:2505.23727, seed 000-116): ``pixelthink_reward`` (five 0/1 accuracy terms × the length score
  clip(1 − β(L − B), 0, 1), B from the row's ``difficulty`` and the completion's ``uncertainty``),
  ``pixelthink_box_iou``; the pieces ``pixelthink_terms``, ``pixelthink_length_budget``,
  ``pixelthink_length_score``, ``pixelthink_length``.

Seg-R1's rewards need the picture and the target's mask (columns ``image`` + ``gt_mask``, or a built-in scene
``scene_kind`` + ``scene_seed``); PixelThink's need ``target_box`` and ``target_points`` (and read ``difficulty``
and ``uncertainty``). Use them on your own data with ``--reward grpolab.policies.vision_language.rewards_segment:segmentation_reward``.
They are defined, with their formulas and sources, in ``grpolab/policies/vision_language/tasks_segment.py`` beside the task (this
package imports ``tasks``, so ``tasks`` may not import ``rewards``: tests/test_architecture.py).
"""
from __future__ import annotations

from .tasks_segment import (mask_iou, mask_iou_at_50, parse_seg_r1, pixelthink_box_iou, pixelthink_length,
                                    pixelthink_length_budget, pixelthink_length_score, pixelthink_reward,
                                    pixelthink_terms, s_measure, seg_r1_format_reward, segmentation_reward,
                                    stand_in_segment, think_content)

__all__ = ["segmentation_reward", "seg_r1_format_reward", "mask_iou_at_50", "parse_seg_r1", "stand_in_segment",
           "s_measure", "mask_iou", "think_content", "pixelthink_reward", "pixelthink_box_iou", "pixelthink_terms",
           "pixelthink_length_budget", "pixelthink_length_score", "pixelthink_length"]
