"""``shape_segmentation``: segment the named shape of a synthetic scene (Seg-R1's and PixelThink's rewards).

Rows (``grpolab.policies.vision_language.scenes.shapes_scene``: 1–3 shapes on a 32 × 32 canvas, one of them the target):

* train rows: scene seeds ``tiny.TRAIN_BASE + i`` for i < ``segment_train_size`` (400), shuffled with the task's
  ``seed``; held-out rows: seeds ``tiny.EVAL_BASE + i`` for i < ``segment_eval_size`` (200), in order (a fixed set;
  the tiny VLM pre-trains on seeds 0 … 3999: the three sets are disjoint);
* columns ``prompt`` (e.g. ``"Segment the red circle."``), ``scene_kind`` (``"shapes"``), ``scene_seed``,
  ``target`` (the name), ``target_box`` ``[x1, y1, x2, y2]`` (inclusive), ``target_points`` (two points inside the
  target: :func:`inscribed_points`, PixelThink's "centres of the two largest inscribed circles") and
  ``difficulty`` (:func:`scene_difficulty`, the per-image score PixelThink reads).

``segment_format`` chooses the output format, the prompt and the rewards:

* ``seg_r1`` (Seg-R1, arXiv:2506.22624, seed 000-72): ``<think>…</think><bbox>[x1,y1,x2,y2]</bbox>
  <points>[[x,y],…]</points><labels>[1,0,…]</labels>``; rewards :func:`segmentation_reward` (weight 1) and
  :func:`seg_r1_format_reward` (weight 1), as the authors' run sums them; metric :func:`mask_iou_at_50` (weight 0,
  the accuracy);
* ``pixelthink`` (PixelThink, arXiv:2505.23727, seed 000-116): ``<think>…</think><answer>{"bbox":[x1,y1,x2,y2],
  "points_1":[x,y],"points_2":[x,y]}</answer>``; reward :func:`pixelthink_reward` (accuracy 0–5 × length score,
  weight 1); metric :func:`pixelthink_box_iou` (weight 0, the accuracy).

The prompt names the format (``"Segment the red circle."`` for Seg-R1, ``"Find the red circle: box and points."``
for PixelThink), so one pre-trained tiny model knows both: its pre-training examples (``register_pretraining``)
alternate between the two formats (even seeds Seg-R1, odd seeds PixelThink).

**The difficulty score** (PixelThink reads an external per-image score, from a model's annotation, with fallback
3.0; ours is computed from the scene, on a 0–10 scale like theirs):
``d = 2·(n − 1) + 0.5·(13 − s) + 1.5·[another shape shares the target's colour or its shape]`` with ``n`` the number
of shapes (1–3), ``s`` the target's side in pixels (7–13: a smaller target is harder) and the last term for a
distractor that can be confused with the target. PixelThink's branches are kept with the authors' thresholds:
easy ``d < 3.5`` (every one-shape scene: d ≤ 3), medium ``3.5 ≤ d < 5``, hard ``d ≥ 5``.

**Measured** (CPU, one thread, the tiny VLM pre-trained with :data:`PRETRAIN` from the vision backbone; greedy
held-out means over 200 scenes). ``grpolab train --recipe seg_r1 --steps 20 --segment_eval_size 200 --threads 1
--seed S --out DIR`` with the recipe's first batch, G 4 × 8 scenes (now G 8 × 16, with which the seeded held-out
reward rises: docs/vision.md): segmentation reward 0.229 before; after 20 steps 0.170, 0.197, 0.177 (seeds 0, 1, 2), mask
IoU ≥ 0.5 from 15.5% to 1.5%, 9.5%, 5%; 100 steps (seed 0): 0.213 and 9.5%, while the sampled training reward
rose (20-step means: segmentation 0.137 → 0.223, format 0.76 → 0.92, IoU ≥ 0.5 3% → 10%): at this scale RL brings
the temperature-1 policy up to the greedy one and no further (the tiny model localises poorly: greedy box IoU 0.13).
``--recipe pixelthink --steps 20`` (seed 0): reward 1.92 → 2.13 (box IoU term 6.5% both), the think block
(characters, greedy) from 15.7 / 27.7 / 31.4 (easy / medium / hard) to 10.2 / 10.9 / 12.0: the easy branch meets
its budget (9.6), and the other two shorten with it (one policy; nothing in the answer needs the reasoning here).

The reward functions are defined here and published as ``grpolab.policies.vision_language.rewards_segment`` (the ``rewards`` package
imports ``tasks``, so ``tasks`` may not import ``rewards``: tests/test_architecture.py).
"""
from __future__ import annotations

import ast
import functools
import json
import math
import random
import re

import numpy as np

from ...data import completion_text
from ...registry import TASKS, param
from ...tasks.base import Task

# ---------------------------------------------------------------------------------------------------- Seg-R1
_INT = r"\s*\d+\s*"
_POINTS_RE = re.compile(r"<points>\s*(\[\s*(?:\[" + _INT + "," + _INT + r"\]\s*,?\s*)+\])\s*</points>")
_LABELS_RE = re.compile(r"<labels>\s*(\[\s*(?:\d+\s*,?\s*)+\])\s*</labels>")
_BBOX_RE = re.compile(r"<bbox>\s*(\[" + _INT + "," + _INT + "," + _INT + "," + _INT + r"\])\s*</bbox>")
_THINK_RE = re.compile(r"<think>([\s\S]*?)</think>")


def _literal(text: str):
    """A bracketed list of non-negative integers as nested Python lists (``ast.literal_eval``: no ``eval``);
    None when it does not read (``[[1,2][3,4]]`` matches the patterns but is no list)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def parse_seg_r1(text) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """``(points [P, 2], labels [P], boxes [B, 4])`` of a Seg-R1 completion, each None when missing.

    As the authors' ``parse_custom_format``: the first ``<points>[[x,y],…]</points>``, the first
    ``<labels>[l,…]</labels>`` and every ``<bbox>[x1,y1,x2,y2]</bbox>``, non-negative integers only (a minus sign
    or a decimal point fails the pattern); when both points and labels read but their counts differ, both are
    None; when a matched block does not evaluate as a list (``[[1,2][3,4]]``, ``[1 0]``), all three are None (the
    authors' ``eval`` raises and their ``except`` returns nothing). Labels are 1 for a foreground point and
    anything else for a background point (SAM reads 0).
    """
    text = completion_text(text)
    m_points, m_labels = _POINTS_RE.search(text), _LABELS_RE.search(text)
    found = [m.group(1) for m in (m_points, m_labels) if m] + _BBOX_RE.findall(text)
    values = [_literal(f) for f in found]
    if any(v is None for v in values):
        return None, None, None  # the authors' parser returns nothing when one block fails to evaluate
    points = np.asarray(values.pop(0), dtype=np.int64) if m_points else None
    labels = np.asarray(values.pop(0), dtype=np.int64).reshape(-1) if m_labels else None
    if points is not None and labels is not None:
        if not (points.ndim == 2 and points.shape[1] == 2 and len(labels) == points.shape[0]):
            points, labels = None, None
    return points, labels, (np.asarray(values, dtype=np.int64) if values else None)


def think_content(text) -> str | None:
    """The stripped text of the first ``<think>…</think>`` block, None when there is none."""
    m = _THINK_RE.search(completion_text(text))
    return m.group(1).strip() if m else None


def background_colour(image: np.ndarray) -> tuple:
    """The most frequent colour of the image's border pixels (ties: the smallest RGB triple): the canvas colour
    of the built-in scenes."""
    img = np.asarray(image)
    border = np.concatenate([img[0], img[-1], img[1:-1, 0], img[1:-1, -1]]).reshape(-1, img.shape[-1])
    colours, counts = np.unique(border, axis=0, return_counts=True)
    return tuple(int(v) for v in colours[int(np.argmax(counts))])


def _region(image: np.ndarray, within: np.ndarray, x: int, y: int) -> np.ndarray:
    """The 4-connected pixels of ``within`` that have the exact colour of pixel (x, y) and reach it."""
    from scipy.ndimage import label

    same = within & np.all(image == image[y, x], axis=-1)
    if not same[y, x]:
        return np.zeros_like(within)
    comps, _ = label(same)  # default structure: 4-connectivity
    return comps == comps[y, x]


def stand_in_segment(image, points=None, labels=None, boxes=None) -> np.ndarray:
    """bool [H, W]: a deterministic stand-in for SAM2 prompted by boxes and points (SAM2 is frozen in Seg-R1).

    * With boxes: each box (inclusive corners, clipped to the canvas) is prompted with the points inside it
      (inclusive bounds, as the authors select them). A positive point (label 1) selects the 4-connected region of
      its exact colour, inside the box, that contains it; the box's mask is the union of its positive points'
      regions, or, with no positive point inside, every pixel of the box whose colour differs from the background
      (:func:`background_colour`: SAM's answer to a box alone, "the object in the box"); then the regions of its
      negative points are removed. The masks of several boxes are OR-ed, as in the authors' reward.
    * Without boxes: the same with the whole canvas as the box, from the points alone (an empty mask without a
      positive point).
    * Points outside the canvas select nothing.
    """
    img = np.asarray(image)
    h, w = img.shape[:2]
    full = np.zeros((h, w), dtype=bool)
    pts = np.zeros((0, 2), dtype=np.int64) if points is None else np.asarray(points, dtype=np.int64).reshape(-1, 2)
    lab = np.ones(len(pts), dtype=np.int64) if labels is None else np.asarray(labels, dtype=np.int64).reshape(-1)
    scopes = []
    if boxes is not None and len(boxes):
        for b in np.asarray(boxes, dtype=np.int64).reshape(-1, 4):
            inside = (pts[:, 0] >= b[0]) & (pts[:, 0] <= b[2]) & (pts[:, 1] >= b[1]) & (pts[:, 1] <= b[3])
            scopes.append((_box(b, h, w), pts[inside], lab[inside], True))
    else:
        scopes.append((np.ones((h, w), dtype=bool), pts, lab, False))
    bg = background_colour(img)
    for within, p, lb, is_box in scopes:
        m = np.zeros((h, w), dtype=bool)
        on = (p[:, 0] >= 0) & (p[:, 0] < w) & (p[:, 1] >= 0) & (p[:, 1] < h)
        pos = [(int(x), int(y)) for (x, y), l, o in zip(p, lb, on) if o and l == 1]
        neg = [(int(x), int(y)) for (x, y), l, o in zip(p, lb, on) if o and l != 1]
        for x, y in pos:
            m |= _region(img, within, x, y)
        if not pos and is_box:
            m = within & ~np.all(img == np.asarray(bg, dtype=img.dtype), axis=-1)
        for x, y in neg:
            m &= ~_region(img, within, x, y)
        full |= m
    return full


def _box(b, h: int, w: int) -> np.ndarray:
    x1, y1, x2, y2 = (int(v) for v in b)
    m = np.zeros((h, w), dtype=bool)
    x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, w - 1), min(y2, h - 1)
    if x2 >= x1 and y2 >= y1:
        m[y1:y2 + 1, x1:x2 + 1] = True
    return m


_EPS = float(np.spacing(1))


def _s_object(x: np.ndarray, inside: np.ndarray) -> float:
    v = x[inside]
    mean = float(v.mean())
    sd = float(v.std(ddof=1)) if v.size > 1 else 0.0  # MATLAB's std of one value is 0
    return 2 * mean / (mean * mean + 1 + sd + _EPS)


def _ssim(pred: np.ndarray, gt: np.ndarray) -> float:
    n = pred.size
    if n == 0:
        return 0.0  # an empty quadrant has weight 0
    x, y = float(pred.mean()), float(gt.mean())
    sx = float(((pred - x) ** 2).sum()) / (n - 1 + _EPS)
    sy = float(((gt - y) ** 2).sum()) / (n - 1 + _EPS)
    sxy = float(((pred - x) * (gt - y)).sum()) / (n - 1 + _EPS)
    a = 4 * x * y * sxy
    b = (x * x + y * y) * (sx + sy)
    if a != 0:
        return a / (b + _EPS)
    return 1.0 if b == 0 else 0.0


def s_measure(pred, gt, alpha: float = 0.5) -> float:
    """Structure measure S = α·S_object + (1 − α)·S_region (Fan, Cheng, Liu, Li and Borji, ICCV 2017), α = 0.5.

    ``pred`` is a foreground map in [0, 1] (a binary mask here), ``gt`` a binary mask. With ȳ = mean(gt):
    ȳ = 0 gives ``1 − mean(pred)``, ȳ = 1 gives ``mean(pred)``; otherwise

    * S_object = ȳ·O(pred·gt on gt) + (1 − ȳ)·O((1 − pred)·(1 − gt) on 1 − gt), O(v) = 2·v̄ / (v̄² + 1 + σ_v + eps)
      (σ the sample standard deviation, 0 for one value);
    * S_region: the GT's centroid, each coordinate ``round(mean) + 1`` (NumPy rounds halves to even, as the authors'
      Python does; MATLAB rounds them up), splits both maps into four quadrants ``[0:y, 0:x]``, ``[0:y, x:W]``,
      ``[y:H, 0:x]``, ``[y:H, x:W]`` weighted by their share of the area; each scores
      SSIM = 4·x̄·ȳ·σ_xy / ((x̄² + ȳ²)(σ_x + σ_y) + eps) (covariances over N − 1 + eps; 1 when numerator and
      denominator are both 0, 0 when only the numerator is);
    * S = max(0, α·S_object + (1 − α)·S_region).

    Provenance: authors' code — https://github.com/chenqiu1024/Seg-R1, seg-r1/src/open_r1/utils/metrics.py
    (class Smeasure, after PySODMetrics; the fork's first commit is the authors' tree); re-implemented here, with
    two guards the Python code lacks (a one-value σ is 0 and N − 1 + eps, as in Fan's MATLAB), so one-pixel
    objects or quadrants give numbers instead of NaN.
    Test: tests/test_vision_segmentation.py::test_s_measure_on_a_4x4_case_by_hand.
    """
    p = np.asarray(pred, dtype=np.float64)
    g = np.asarray(gt).astype(bool)
    y = float(g.mean())
    if y == 0:
        return 1.0 - float(p.mean())
    if y == 1:
        return float(p.mean())
    gf = g.astype(np.float64)
    s_obj = y * _s_object(p * gf, g) + (1 - y) * _s_object((1 - p) * (1 - gf), ~g)
    h, w = g.shape
    cy, cx = np.argwhere(g).mean(axis=0).round()
    cx, cy = int(cx) + 1, int(cy) + 1
    area = h * w
    w1, w2, w3 = cx * cy / area, cy * (w - cx) / area, (h - cy) * cx / area
    parts = [(slice(0, cy), slice(0, cx), w1), (slice(0, cy), slice(cx, w), w2),
             (slice(cy, h), slice(0, cx), w3), (slice(cy, h), slice(cx, w), 1 - w1 - w2 - w3)]
    s_reg = sum(wt * _ssim(p[r, c], gf[r, c]) for r, c, wt in parts if wt > 0)
    return max(0.0, alpha * s_obj + (1 - alpha) * s_reg)


def mask_iou(a, b) -> float:
    """|a ∩ b| / |a ∪ b| of two boolean masks; 0 when both are empty."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 0.0


def _scenes(n: int, scene_kind, scene_seed, image, gt_mask, reward: str):
    """``[(image, gt mask)]`` of the batch: from ``image`` + ``gt_mask`` columns when given, else from the built-in
    scene ``scene_kind`` / ``scene_seed`` (its target's mask)."""
    from .scenes import SCENE_KINDS, to_array

    if image is not None and gt_mask is not None:
        out = [(to_array(im, f"reward '{reward}'"), np.asarray(m, dtype=bool)) for im, m in zip(image, gt_mask)]
    elif scene_seed is not None:
        kinds = list(scene_kind) if scene_kind is not None else ["shapes"] * len(scene_seed)
        out = []
        for kind, seed in zip(kinds, scene_seed):
            if kind not in SCENE_KINDS:
                raise ValueError(f"reward '{reward}': scene_kind {kind!r} is not a built-in scene "
                                 f"({sorted(SCENE_KINDS)})")
            scene = _scene(kind, int(seed))
            out.append((scene.image, scene.objects[scene.target].mask))
    else:
        raise ValueError(f"reward '{reward}' needs the picture and the ground-truth mask: the columns 'image' and "
                         f"'gt_mask', or a built-in scene ('scene_kind' and 'scene_seed')")
    if len(out) != n:
        raise ValueError(f"reward '{reward}': {n} completions but {len(out)} pictures")
    return out


@functools.lru_cache(maxsize=4096)
def _scene(kind: str, seed: int):
    from .scenes import SCENE_KINDS
    return SCENE_KINDS[kind](seed)


def _predicted_masks(completions, scene_kind, scene_seed, image, gt_mask, name: str):
    """``(stand-in mask or None, ground-truth mask)`` per completion: None when its points, labels or boxes do not
    parse (Seg-R1's rewards give 0 there)."""
    texts = [completion_text(c) for c in completions or []]
    out = []
    for text, (img, gt) in zip(texts, _scenes(len(texts), scene_kind, scene_seed, image, gt_mask, name)):
        points, labels, boxes = parse_seg_r1(text)
        ok = points is not None and len(points) > 0 and labels is not None and boxes is not None
        out.append((stand_in_segment(img, points, labels, boxes) if ok else None, gt))
    return out


def segmentation_reward(prompts=None, completions=None, *, scene_kind=None, scene_seed=None, image=None,
                        gt_mask=None, **kwargs) -> list[float]:
    """Seg-R1's segmentation reward: ``r = 0.7·IoU(M, M*) + 0.3·clip(S(M, M*), 0, 1)``, 0 when the completion has
    no points, no labels or no box (:func:`parse_seg_r1`).

    M is the mask the frozen segmenter returns for the completion's prompts — here :func:`stand_in_segment`, a
    deterministic stand-in for SAM2 (each box with the points inside it, boxes OR-ed) — and M* the target's mask
    (the ``gt_mask`` column, or the built-in scene's target); S is :func:`s_measure` (α = 0.5).

    Source: Seg-R1 (You and Wu, "Seg-R1: Segmentation Can Be Surprisingly Simple with Reinforcement Learning",
    arXiv:2506.22624, seed 000-72).

    Provenance: authors' code — https://github.com/chenqiu1024/Seg-R1, seg-r1/src/open_r1/grpo.py
    (segmentation_reward, parse_custom_format, SAMWrapper; the fork's first commit is the authors' tree); the
    weights, the missing-prompt rule and the per-box point selection match; SAM2 (hiera-large, 768 × 768) is
    replaced by the colour-region stand-in above. One deliberate difference: the authors' reward binarises the already-binary GT
    again at > 128 (``_prepare_data``), so their S-measure is computed against an empty GT and reduces to
    1 − mean(M); here S is computed against the true mask, as the paper states the reward.
    Test: tests/test_vision_segmentation.py::test_segmentation_reward_weights_iou_and_s_measure.
    """
    out = []
    for m, gt in _predicted_masks(completions, scene_kind, scene_seed, image, gt_mask, "segmentation_reward"):
        out.append(0.0 if m is None else
                   0.7 * mask_iou(m, gt) + 0.3 * min(1.0, max(0.0, s_measure(m.astype(np.float64), gt))))
    return out


def seg_r1_format_reward(prompts=None, completions=None, **kwargs) -> list[float]:
    """Seg-R1's format reward: 1 when the completion's points, labels and at least one box parse
    (:func:`parse_seg_r1`) and it has a ``<think>…</think>`` block, else 0.

    Provenance: authors' code — https://github.com/chenqiu1024/Seg-R1, seg-r1/src/open_r1/grpo.py
    (format_reward); as there, the think block must be present but may be empty (the authors test the stripped
    content against None, and an empty string is not None).
    Test: tests/test_vision_segmentation.py::test_format_reward_by_hand.
    """
    out = []
    for c in completions or []:
        points, labels, boxes = parse_seg_r1(c)
        out.append(float(points is not None and labels is not None and boxes is not None
                         and think_content(c) is not None))
    return out


def mask_iou_at_50(prompts=None, completions=None, *, scene_kind=None, scene_seed=None, image=None, gt_mask=None,
                   **kwargs) -> list[float]:
    """1 when the stand-in segmenter's mask for the completion has IoU ≥ 0.5 with the target's mask (0 when
    points, labels or box are missing, as in :func:`segmentation_reward`): the task's accuracy (weight 0).

    Provenance: grpolab's own — a pass/fail metric for the log (the papers report mIoU / S-measure).
    """
    return [0.0 if m is None else float(mask_iou(m, gt) >= 0.5)
            for m, gt in _predicted_masks(completions, scene_kind, scene_seed, image, gt_mask, "mask_iou_at_50")]


# ------------------------------------------------------------------------------------------------ PixelThink
#: PixelThink's pixel thresholds are for 840 × 840 images (RefCOCOg resized, the authors' refCOCOg_9k_840); on the
#: 32-px canvas each is multiplied by 32 / 840
CANVAS_SCALE = 32 / 840
_THINK_ANSWER_RE = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_JSON_RE = re.compile(r"{[^}]+}")


def _json_answer(text: str):
    m = _JSON_RE.search(text)
    if not m:
        return None
    try:
        return json.loads(m.group(0))
    except ValueError:
        return None


def pixelthink_box_iou_value(a, b) -> float:
    """The authors' box IoU on inclusive pixel boxes: the intersection counts only when ``ix1 < ix2`` and
    ``iy1 < iy2`` (boxes that share a single row or column do not overlap), areas ``(x2 − x1 + 1)(y2 − y1 + 1)``."""
    ix1, iy1, ix2, iy2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = (ix2 - ix1 + 1) * (iy2 - iy1 + 1) if (ix1 < ix2 and iy1 < iy2) else 0
    union = (a[2] - a[0] + 1) * (a[3] - a[1] + 1) + (b[2] - b[0] + 1) * (b[3] - b[1] + 1) - inter
    return float(inter) / union


def pixelthink_terms(text, target_box, target_points, *, iou_threshold: float = 0.5,
                     box_l1_threshold: float = 10.0 * CANVAS_SCALE,
                     point_l1_threshold: float = 100.0 * CANVAS_SCALE) -> list[float]:
    """PixelThink's five 0/1 accuracy terms of one completion, in the authors' order:

    1. think/answer format: the whole completion (stripped of outer whitespace) is
       ``<think>…</think>`` + optional whitespace + ``<answer>…</answer>``;
    2. answer format: the first ``{…}`` (no ``}`` inside) is JSON with ``bbox`` (a list of 4) and ``points_1``,
       ``points_2`` (lists of 2);
    3. box IoU: IoU(bbox, target_box) > ``iou_threshold`` (:func:`pixelthink_box_iou_value`);
    4. points: both points inside the predicted bbox (inclusive) and the order-invariant mean distance to the
       target's two points, ``min(d(p1,g1) + d(p2,g2), d(p1,g2) + d(p2,g1)) / 2``, < ``point_l1_threshold``;
    5. box L1: the mean absolute difference of the four coordinates < ``box_l1_threshold``.

    A term whose inputs do not read scores 0 (the authors catch every exception to 0).
    """
    text = completion_text(text)
    t1 = float(_THINK_ANSWER_RE.fullmatch(text.strip()) is not None)
    data = _json_answer(text)
    t2 = 0.0
    box = None
    if isinstance(data, dict):
        b, p1, p2 = data.get("bbox"), data.get("points_1"), data.get("points_2")
        t2 = float(isinstance(b, list) and len(b) == 4 and isinstance(p1, list) and len(p1) == 2
                   and isinstance(p2, list) and len(p2) == 2)
        if isinstance(b, list) and len(b) == 4 and all(isinstance(v, (int, float)) for v in b):
            box = [float(v) for v in b]
    gt = [float(v) for v in target_box]
    t3 = t5 = t4 = 0.0
    if box is not None:
        try:
            t3 = float(pixelthink_box_iou_value(box, gt) > iou_threshold)
        except ZeroDivisionError:
            t3 = 0.0
        t5 = float(sum(abs(u - v) for u, v in zip(box, gt)) / 4 < box_l1_threshold)
        try:
            p1 = [int(data["points_1"][0]), int(data["points_1"][1])]
            p2 = [int(data["points_2"][0]), int(data["points_2"][1])]
        except (KeyError, TypeError, ValueError, IndexError):
            p1 = p2 = None
        if p1 is not None:
            inside = all(box[0] <= p[0] <= box[2] and box[1] <= p[1] <= box[3] for p in (p1, p2))
            g1, g2 = [[float(v) for v in g] for g in target_points]
            d = min(math.dist(p1, g1) + math.dist(p2, g2), math.dist(p1, g2) + math.dist(p2, g1)) / 2
            t4 = float(inside and d < point_l1_threshold)
    return [t1, t2, t3, t4, t5]


def pixelthink_length_budget(difficulty: float, uncertainty: float, *, hard_threshold: float = 5.0,
                             medium_threshold: float = 3.5, hard_budget: float = 25.6, easy_budget: float = 9.6,
                             uncertainty_scale: float = 2.5) -> float | None:
    """PixelThink's budget B: hard (d ≥ ``hard_threshold``) ``hard_budget + uncertainty_scale · u``; medium
    (``medium_threshold`` ≤ d < ``hard_threshold``) no budget (None); easy ``easy_budget``. The defaults are the
    tiny setting's (the authors' 256, 96 and 25, in words of the response, divided by 10); thresholds the
    authors'."""
    if difficulty >= hard_threshold:
        return hard_budget + uncertainty_scale * uncertainty
    if difficulty >= medium_threshold:
        return None
    return easy_budget


def pixelthink_length_score(length: float, budget: float | None, *, beta: float = 1 / 50) -> float:
    """``s = clip(1 − β·(L − B), 0, 1)``; 1 without a budget (the tiny default β = 1/50 is the authors' 1/500 × 10,
    matching the budgets divided by 10)."""
    if budget is None:
        return 1.0
    return max(0.0, min(1.0, 1.0 - beta * (length - budget)))


def pixelthink_length(text, unit: str = "think_chars") -> int:
    """L of a completion: ``think_chars``, the characters of the stripped think content (the authors'
    ``reward_reasoning_tokens`` mode, counted by the tiny VLM's one-token-per-character tokenizer; 0 without a
    think block), or ``words``, the whitespace-separated words of the whole completion (the authors' default,
    ``reward_word_tokens``)."""
    text = completion_text(text)
    if unit == "words":
        return len(text.split())
    if unit == "think_chars":
        return len(think_content(text) or "")
    raise ValueError(f"pixelthink length unit must be 'think_chars' or 'words', got {unit!r}")


def pixelthink_reward(prompts=None, completions=None, *, target_box=None, target_points=None, difficulty=None,
                      uncertainty=None, length_unit: str = "think_chars", hard_threshold: float = 5.0,
                      medium_threshold: float = 3.5, hard_budget: float = 25.6, easy_budget: float = 9.6,
                      uncertainty_scale: float = 2.5, beta: float = 1 / 50, iou_threshold: float = 0.5,
                      box_l1_threshold: float = 10.0 * CANVAS_SCALE, point_l1_threshold: float = 100.0 * CANVAS_SCALE,
                      **kwargs) -> list[float]:
    """PixelThink's reward ``R = A · s``: A ∈ {0, …, 5} the sum of the five accuracy terms
    (:func:`pixelthink_terms`), s = clip(1 − β·(L − B), 0, 1) the length score with the budget B from the image's
    ``difficulty`` and the completion's ``uncertainty`` (:func:`pixelthink_length_budget`; s = 1 on the medium
    branch) and L the completion's length (:func:`pixelthink_length`).

    ``uncertainty`` (a column the VLM sampler supplies per completion: the mean over its tokens of
    1 − (p_top1 − p_top2)) is clipped to [0, 1]; a completion without one is scored with u = 0 and a row without a
    ``difficulty`` with the authors' fallback 3.0 (easy).

    Tiny setting (the task's parameters): L in think characters and the budgets divided by 10 with β × 10
    (authors: L in words, easy 96, hard 256 + 25·u, β = 1/500): our completions are a few dozen characters. The
    pixel thresholds are the authors' 10 px (box L1) and 100 px (points) on 840 × 840 images, times 32 / 840
    (0.381 px and 3.81 px on the 32-px canvas); the IoU threshold 0.5 and the difficulty thresholds 3.5 and 5.0
    are theirs.

    Source: PixelThink (Wang et al., "PixelThink: Towards Efficient Chain-of-Pixel Reasoning", arXiv:2505.23727,
    seed 000-116).

    Provenance: authors' code — https://github.com/songw-zju/PixelThink,
    verl/utils/reward_score/seg_pixelthink.py (pixelthink_accuracy_reward, pixelthink_length_budget,
    pixelthink_length_score, seg_pixelthink_compute_score) and verl/utils/reward_score/length.py; the terms,
    their strict inequalities, the box IoU's inclusive areas and overlap test, the branches and the clip match; the budgets, β and the pixel
    thresholds are rescaled as said; the ground truth comes as columns (target_box, target_points) instead of the
    authors' ``<box>…</box><points>…</points>`` string.
    Test: tests/test_vision_segmentation.py::test_pixelthink_reward_terms_budget_and_product.
    """
    texts = [completion_text(c) for c in completions or []]
    n = len(texts)
    if target_box is None or target_points is None:
        raise ValueError("reward 'pixelthink_reward' needs the columns 'target_box' ([x1, y1, x2, y2]) and "
                         "'target_points' ([[x, y], [x, y]])")
    diffs = list(difficulty) if difficulty is not None else [3.0] * n
    uncs = list(uncertainty) if uncertainty is not None else [0.0] * n
    out = []
    for text, box, pts, d, u in zip(texts, target_box, target_points, diffs, uncs):
        acc = sum(pixelthink_terms(text, box, pts, iou_threshold=iou_threshold, box_l1_threshold=box_l1_threshold,
                                   point_l1_threshold=point_l1_threshold))
        u = 0.0 if u is None or not math.isfinite(float(u)) else min(1.0, max(0.0, float(u)))
        budget = pixelthink_length_budget(3.0 if d is None else float(d), u, hard_threshold=hard_threshold,
                                          medium_threshold=medium_threshold, hard_budget=hard_budget,
                                          easy_budget=easy_budget, uncertainty_scale=uncertainty_scale)
        out.append(acc * pixelthink_length_score(pixelthink_length(text, length_unit), budget, beta=beta))
    return out


def pixelthink_box_iou(prompts=None, completions=None, *, target_box=None, iou_threshold: float = 0.5,
                       **kwargs) -> list[float]:
    """PixelThink's box-IoU term alone (1 when the answer's bbox has IoU > 0.5 with the target's box): the task's
    accuracy in the PixelThink format (weight 0).

    Provenance: authors' code — https://github.com/songw-zju/PixelThink,
    verl/utils/reward_score/seg_pixelthink.py (seg_iou_reward); reported alone as a metric.
    """
    if target_box is None:
        raise ValueError("reward 'pixelthink_box_iou' needs the column 'target_box'")
    pts = [[[0, 0], [0, 0]]] * len(target_box)
    return [pixelthink_terms(c, b, p, iou_threshold=iou_threshold)[2]
            for c, b, p in zip(completions or [], target_box, pts)]


# ------------------------------------------------------------------------------------------------------ rows
def scene_difficulty(scene) -> float:
    """``d = 2·(n − 1) + 0.5·(13 − s) + 1.5·[a distractor shares the target's colour or shape]`` (module
    docstring): n shapes, s the target's side in pixels."""
    t = scene.objects[scene.target]
    side = t.box[2] - t.box[0] + 1
    confusable = any(o is not t and (o.colour == t.colour or o.shape == t.shape) for o in scene.objects)
    return 2.0 * (len(scene.objects) - 1) + 0.5 * (13 - side) + 1.5 * float(confusable)


def inscribed_points(mask) -> list[list[int]]:
    """Two points inside a mask, for PixelThink's "centres of the two largest inscribed circles" (grpolab's own
    rule): with D(p) the Euclidean distance from pixel p to the nearest pixel outside the mask
    (``scipy.ndimage.distance_transform_edt`` of the mask padded with a background border), p1 = argmax D and
    p2 = argmax min(D(p), ‖p − p1‖) (the centre of the largest inscribed circle that leaves p1 out; p1 itself for
    a one-pixel mask); ties go to the first pixel in row-major order. ``[[x1, y1], [x2, y2]]``."""
    from scipy.ndimage import distance_transform_edt

    m = np.asarray(mask, dtype=bool)
    if not m.any():
        raise ValueError("inscribed_points: the mask is empty")
    dist = distance_transform_edt(np.pad(m, 1))[1:-1, 1:-1]
    y1, x1 = np.unravel_index(int(np.argmax(dist)), dist.shape)
    ys, xs = np.mgrid[0:m.shape[0], 0:m.shape[1]]
    second = np.where(m, np.minimum(dist, np.hypot(xs - x1, ys - y1)), -1.0)
    if second.max() <= 0:
        return [[int(x1), int(y1)], [int(x1), int(y1)]]
    y2, x2 = np.unravel_index(int(np.argmax(second)), second.shape)
    return [[int(x1), int(y1)], [int(x2), int(y2)]]


FORMATS = ("seg_r1", "pixelthink")


def _prompt(name: str, fmt: str) -> str:
    return f"Segment the {name}." if fmt == "seg_r1" else f"Find the {name}: box and points."


def segment_row(seed: int, fmt: str = "seg_r1") -> dict:
    """The data row of the shapes scene ``seed`` in format ``fmt`` (module docstring: columns)."""
    if fmt not in FORMATS:
        raise ValueError(f"segment_format must be one of {FORMATS}, got {fmt!r}")
    scene = _scene("shapes", int(seed))
    t = scene.objects[scene.target]
    return {"prompt": _prompt(t.name, fmt), "scene_kind": "shapes", "scene_seed": int(seed), "target": t.name,
            "target_box": [int(v) for v in t.box], "target_points": inscribed_points(t.mask),
            "difficulty": scene_difficulty(scene)}


def target_completion(row: dict, fmt: str) -> str:
    """The completion the tiny VLM imitates in pre-training. Seg-R1: ``<think>NAME</think><bbox>[box]</bbox>
    <points>[[x,y]]</points><labels>[1]</labels>`` (one positive point, the first inscribed point). PixelThink:
    ``<think>NAMES</think><answer>{"bbox":[box],"points_1":[x,y],"points_2":[x,y]}</answer>`` with the target's
    name followed by the other shapes' names (so the reasoning grows with the scene: the length reward has
    something to cut)."""
    box = ",".join(str(v) for v in row["target_box"])
    (ax, ay), (bx, by) = row["target_points"]
    if fmt == "seg_r1":
        return (f"<think>{row['target']}</think><bbox>[{box}]</bbox><points>[[{ax},{ay}]]</points>"
                f"<labels>[1]</labels>")
    scene = _scene(row["scene_kind"], int(row["scene_seed"]))
    others = [o.name for i, o in enumerate(scene.objects) if i != scene.target]
    think = ", ".join([row["target"]] + others)
    return (f'<think>{think}</think><answer>{{"bbox":[{box}],"points_1":[{ax},{ay}],'
            f'"points_2":[{bx},{by}]}}</answer>')


def pretraining_example(seed: int) -> tuple[dict, str]:
    """Pre-training example ``seed`` (scene seed ``seed`` < 4000): even seeds in Seg-R1's format, odd seeds in
    PixelThink's."""
    fmt = FORMATS[int(seed) % 2]
    row = segment_row(seed, fmt)
    return row, target_completion(row, fmt)


#: pre-training from the vision backbone: 12,000 examples (scene seeds 0 … 11,999, disjoint from the RL rows), 800
#: steps. With the defaults (4,000 examples, 300 steps) the greedy held-out box had IoU 0.06 with the target's box
#: and its point fell on the target 9% of the time; with these, 0.13 and 18.5% (seg_r1 format, 200 held-out scenes,
#: /tmp analysis of the cached models) — both far below the reward's maximum, leaving RL room
PRETRAIN = {"examples": 12000, "iterations": 800}


def _register_pretraining() -> None:
    from . import tiny
    tiny.register_pretraining("shape_segmentation", pretraining_example, **PRETRAIN)


_register_pretraining()

TRAIN_SIZE = param(400, "shape_segmentation: training scenes (scene seeds tiny.TRAIN_BASE + i)")
EVAL_SIZE = param(200, "shape_segmentation: held-out scenes (scene seeds tiny.EVAL_BASE + i, a fixed set)")
FORMAT = param("seg_r1", "shape_segmentation: output format and rewards, Seg-R1's (boxes, points, labels; "
                         "IoU + S-measure and format rewards) or PixelThink's (think + JSON answer; accuracy x "
                         "length score)", choices=list(FORMATS))
LENGTH_UNIT = param("think_chars", "shape_segmentation (pixelthink): the length L, characters of the think content "
                                   "(the authors' reasoning-token mode under the char tokenizer) or words of the "
                                   "completion (the authors' default)", choices=["think_chars", "words"])
EASY_BUDGET = param(9.6, "shape_segmentation (pixelthink): the easy branch's length budget (authors: 96 words)")
HARD_BUDGET = param(25.6, "shape_segmentation (pixelthink): the hard branch's base budget (authors: 256 words)")
UNC_SCALE = param(2.5, "shape_segmentation (pixelthink): hard budget added per unit of uncertainty (authors: 25)")
BETA = param(0.02, "shape_segmentation (pixelthink): length-penalty slope beta (authors: 1/500 per word)")


@TASKS.register("shape_segmentation", needs=("vision",))
def shape_segmentation(seed: int = 0, *, segment_train_size: int = TRAIN_SIZE, segment_eval_size: int = EVAL_SIZE,
                       segment_format: str = FORMAT, pixelthink_length_unit: str = LENGTH_UNIT,
                       pixelthink_easy_budget: float = EASY_BUDGET, pixelthink_hard_budget: float = HARD_BUDGET,
                       pixelthink_uncertainty_scale: float = UNC_SCALE, pixelthink_beta: float = BETA) -> Task:
    """Segment the named shape of a synthetic scene: Seg-R1's rewards (``segment_format: seg_r1``) or PixelThink's
    (``pixelthink``) (module docstring: rows, formats, difficulty).

    Provenance: grpolab's own — a built-in toy segmentation task (synthetic scenes, grpolab.policies.vision_language.scenes) for the
    vision-language policy; its rewards follow the authors' code of Seg-R1 (seed 000-72) and PixelThink
    (seed 000-116), with a stand-in segmenter for SAM2.
    """
    if segment_format not in FORMATS:
        raise ValueError(f"segment_format must be one of {FORMATS}, got {segment_format!r}")
    if int(segment_train_size) < 1 or int(segment_eval_size) < 0:
        raise ValueError(f"shape_segmentation: segment_train_size >= 1 and segment_eval_size >= 0, got "
                         f"{segment_train_size} and {segment_eval_size}")
    from .tiny import EVAL_BASE, TRAIN_BASE

    train = [segment_row(TRAIN_BASE + i, segment_format) for i in range(int(segment_train_size))]
    random.Random(seed).shuffle(train)
    held_out = [segment_row(EVAL_BASE + i, segment_format) for i in range(int(segment_eval_size))]
    if segment_format == "seg_r1":
        rewards = [("segmentation", segmentation_reward, 1.0), ("format", seg_r1_format_reward, 1.0),
                   ("mask_iou_at_50", mask_iou_at_50, 0.0)]
        accuracy, what = "mask_iou_at_50", "Seg-R1: 0.7 IoU + 0.3 S-measure of a stand-in segmenter's mask, format"
    else:
        bound = functools.partial(pixelthink_reward, length_unit=pixelthink_length_unit,
                                  easy_budget=float(pixelthink_easy_budget), hard_budget=float(pixelthink_hard_budget),
                                  uncertainty_scale=float(pixelthink_uncertainty_scale), beta=float(pixelthink_beta))
        functools.update_wrapper(bound, pixelthink_reward)
        rewards = [("pixelthink", bound, 1.0), ("box_iou", pixelthink_box_iou, 0.0)]
        accuracy, what = "box_iou", "PixelThink: five accuracy terms x the difficulty/uncertainty length score"
    return Task("shape_segmentation", train, held_out, rewards=rewards, accuracy_reward=accuracy,
                description=f"segment the named shape of a synthetic 32-px scene; {what}",
                extra={})
