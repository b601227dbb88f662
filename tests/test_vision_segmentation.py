"""Task ``shape_segmentation`` and the Seg-R1 / PixelThink rewards (grpolab.policies.vision_language.rewards_segment).

Every expected value is worked out by hand in the comments (the authors' rules: Seg-R1's grpo.py and metrics.py,
PixelThink's seg_pixelthink.py), never by calling the function under test on another input.
"""
import math

import numpy as np
import pytest

from grpolab.policies.vision_language.rewards_segment import (mask_iou, mask_iou_at_50, parse_seg_r1, pixelthink_box_iou,
                                          pixelthink_length, pixelthink_length_budget, pixelthink_length_score,
                                          pixelthink_reward, pixelthink_terms, s_measure, seg_r1_format_reward,
                                          segmentation_reward, stand_in_segment)
from grpolab.tasks import get_task
from grpolab.policies.vision_language.tasks_segment import (inscribed_points, pretraining_example, scene_difficulty, segment_row,
                                          target_completion)
from grpolab.policies.vision_language import tiny
from grpolab.policies.vision_language.scenes import Scene, SceneObject, shapes_scene

# ------------------------------------------------------------------------------------------------ parser


def test_parser_reads_points_labels_and_every_box():
    text = ("<think>x</think><bbox>[1,2,3,4]</bbox> <bbox>[ 5 , 6 , 7 , 8 ]</bbox>"
            "<points>[[3,4], [5, 6]]</points><labels>[1,0]</labels>")
    points, labels, boxes = parse_seg_r1(text)
    assert points.tolist() == [[3, 4], [5, 6]]
    assert labels.tolist() == [1, 0]
    assert boxes.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    # chat-message completions (TRL's conversational form) read the same
    assert parse_seg_r1([{"role": "assistant", "content": text}])[2].tolist() == boxes.tolist()


@pytest.mark.parametrize("text, expect", [
    # a negative coordinate fails the points pattern (\d+ only): points missing, labels and box read
    ("<points>[[-1,4]]</points><labels>[1]</labels><bbox>[0,0,3,3]</bbox>", (None, [1], [[0, 0, 3, 3]])),
    # a decimal point fails the box pattern
    ("<points>[[1,4]]</points><labels>[1]</labels><bbox>[0,0,3.5,3]</bbox>", ([[1, 4]], [1], None)),
    # 2 points but 1 label: both dropped, the box stays
    ("<points>[[1,4],[2,2]]</points><labels>[1]</labels><bbox>[0,0,3,3]</bbox>", (None, None, [[0, 0, 3, 3]])),
    # '[[1,2][3,4]]' matches the pattern (the comma is optional) but is no list: the authors' eval raises and
    # their except returns nothing at all
    ("<points>[[1,2][3,4]]</points><labels>[1,1]</labels><bbox>[0,0,3,3]</bbox>", (None, None, None)),
    ("<points>[[1,2]]</points><labels>[1 0]</labels><bbox>[0,0,3,3]</bbox>", (None, None, None)),
    ("no tags at all", (None, None, None)),
])
def test_parser_edge_cases(text, expect):
    got = [None if v is None else v.tolist() for v in parse_seg_r1(text)]
    assert got == [None if e is None else e for e in expect]


def test_format_reward_by_hand():
    good = "<think>red</think><bbox>[0,0,3,3]</bbox><points>[[1,1]]</points><labels>[1]</labels>"
    empty_think = "<think>  </think><bbox>[0,0,3,3]</bbox><points>[[1,1]]</points><labels>[1]</labels>"
    no_think = "<bbox>[0,0,3,3]</bbox><points>[[1,1]]</points><labels>[1]</labels>"
    no_box = "<think>red</think><points>[[1,1]]</points><labels>[1]</labels>"
    mismatch = "<think>red</think><bbox>[0,0,3,3]</bbox><points>[[1,1],[2,2]]</points><labels>[1]</labels>"
    # the authors test the stripped think content against None: an empty block passes, a missing one fails
    assert seg_r1_format_reward(None, [good, empty_think, no_think, no_box, mismatch]) == [1.0, 1.0, 0.0, 0.0, 0.0]


# --------------------------------------------------------------------------------- the stand-in segmenter
BG, RED, BLUE = (0, 0, 0), (200, 0, 0), (0, 0, 200)


def hand_scene() -> np.ndarray:
    """8 × 8, black background; red block A rows 1-2 × cols 1-3 (6 px), blue block rows 5-6 × cols 4-6 (6 px),
    red block B rows 5-6 × cols 0-1 (4 px, same colour as A, not touching it)."""
    img = np.zeros((8, 8, 3), dtype=np.uint8)
    img[1:3, 1:4] = RED
    img[5:7, 4:7] = BLUE
    img[5:7, 0:2] = RED
    return img


def cells(mask) -> set:
    return {(int(y), int(x)) for y, x in np.argwhere(mask)}


RED_A = {(y, x) for y in (1, 2) for x in (1, 2, 3)}
RED_B = {(y, x) for y in (5, 6) for x in (0, 1)}
BLUE_C = {(y, x) for y in (5, 6) for x in (4, 5, 6)}


def test_stand_in_segmenter_on_a_hand_drawn_scene():
    img = hand_scene()
    # a box around A with a positive point on A: A's red region
    assert cells(stand_in_segment(img, [[2, 1]], [1], [[0, 0, 4, 3]])) == RED_A
    # the point alone (no box): the connected red region under it, not the other red block
    assert cells(stand_in_segment(img, [[2, 1]], [1], None)) == RED_A
    # a box over the whole canvas and no point: every non-background pixel (6 + 6 + 4 = 16)
    assert cells(stand_in_segment(img, None, None, [[0, 0, 7, 7]])) == RED_A | RED_B | BLUE_C
    # ... minus the region of a negative point on the blue block: 16 - 6 = 10 pixels
    assert cells(stand_in_segment(img, [[5, 5]], [0], [[0, 0, 7, 7]])) == RED_A | RED_B
    # two boxes OR-ed, each with the point inside it
    two = stand_in_segment(img, [[2, 1], [5, 5]], [1, 1], [[0, 0, 4, 3], [3, 4, 7, 7]])
    assert cells(two) == RED_A | BLUE_C
    # a point outside the only box is not used for it: the box alone gives its non-background pixels (A)
    assert cells(stand_in_segment(img, [[5, 5]], [1], [[0, 0, 4, 3]])) == RED_A
    # the region is cut by the box: a box over columns 0-2 only keeps A's 4 pixels in it
    assert cells(stand_in_segment(img, [[1, 1]], [1], [[0, 0, 2, 3]])) == {(1, 1), (1, 2), (2, 1), (2, 2)}
    # a positive point off the canvas selects nothing; without a box that leaves an empty mask
    assert not stand_in_segment(img, [[40, 1]], [1], None).any()


# ---------------------------------------------------------------------------------------- IoU and S-measure
def test_iou_by_hand():
    a = np.zeros((4, 4), bool)
    a[:, :2] = True       # 8 px
    b = np.zeros((4, 4), bool)
    b[:, :3] = True       # 12 px, contains a
    assert mask_iou(a, b) == pytest.approx(8 / 12)
    assert mask_iou(np.zeros((2, 2), bool), np.zeros((2, 2), bool)) == 0.0


def test_s_measure_degenerate_ground_truths_and_identity():
    pred = np.zeros((4, 4))
    pred[0, :] = 1.0                                     # a quarter of the map
    assert s_measure(pred, np.zeros((4, 4), bool)) == pytest.approx(1 - 0.25)   # empty GT: 1 - mean(pred)
    assert s_measure(pred, np.ones((4, 4), bool)) == pytest.approx(0.25)        # full GT: mean(pred)
    gt = np.zeros((6, 6), bool)
    gt[1:4, 2:5] = True
    # pred = gt: each object score is 2·1 / (1 + 1 + 0) = 1 and every quadrant's SSIM is 1 (identical maps)
    assert s_measure(gt.astype(float), gt) == pytest.approx(1.0)


def test_s_measure_on_a_4x4_case_by_hand():
    gt = np.zeros((4, 4), bool)
    gt[:, :2] = True          # left half
    pred = np.zeros((4, 4))
    pred[:, :3] = 1.0         # left three columns
    # Object score (ȳ = 0.5). Foreground: pred on the 8 GT pixels is all 1: 2·1/(1 + 1 + 0) = 1.
    # Background: (1 - pred)·(1 - gt) on the 8 other pixels is four 0 (column 2) and four 1 (column 3): mean 0.5,
    # sample std sqrt(8·0.25/7) = sqrt(2/7); score 2·0.5/(0.25 + 1 + sqrt(2/7)).
    o_bg = 1 / (1.25 + math.sqrt(2 / 7))
    s_object = 0.5 * 1 + 0.5 * o_bg                  # 0.780187...
    # Region score. GT centroid: mean x 0.5, mean y 1.5; NumPy rounds halves to even: 0 and 2; + 1: x = 1, y = 3.
    # Quadrants (weights x·y/16 = 3/16, y(4-x)/16 = 9/16, (4-y)x/16 = 1/16, 3/16):
    #  LT rows 0-2 × col 0: gt 1, pred 1, constant: SSIM 1;  LB row 3 × col 0: one pixel: 1.
    #  RT rows 0-2 × cols 1-3 (9 px): gt column 1 (ȳ 1/3), pred columns 1-2 (x̄ 2/3); σx = σy = 2/8 = 0.25,
    #    σxy = (3·(1/3)(2/3) - 3·(1/3)(1/3) + 3·(2/3)(1/3)) / 8 = 1/8; SSIM = 4·(2/3)(1/3)(1/8) / ((5/9)·0.5) = 0.4.
    #  RB row 3 × cols 1-3 (3 px): gt [1,0,0], pred [1,1,0]: σx = σy = 1/3, σxy = 1/6;
    #    SSIM = 4·(2/3)(1/3)(1/6) / ((5/9)(2/3)) = (4/27)/(10/27) = 0.4.
    s_region = 3 / 16 * 1 + 9 / 16 * 0.4 + 1 / 16 * 1 + 3 / 16 * 0.4   # 0.55
    assert s_measure(pred, gt) == pytest.approx(0.5 * s_object + 0.5 * s_region, abs=1e-9)   # 0.665094
    assert s_measure(pred, gt, alpha=1.0) == pytest.approx(s_object, abs=1e-9)
    assert s_measure(pred, gt, alpha=0.0) == pytest.approx(s_region, abs=1e-9)


def test_s_measure_one_pixel_object_is_finite():
    gt = np.zeros((5, 5), bool)
    gt[2, 2] = True
    # one foreground value: its σ is 0 (MATLAB), not NaN (NumPy's ddof=1 of one value)
    assert math.isfinite(s_measure(gt.astype(float), gt)) and s_measure(gt.astype(float), gt) == pytest.approx(1.0)


# -------------------------------------------------------------------------------------- Seg-R1's reward
def test_segmentation_reward_weights_iou_and_s_measure():
    img = hand_scene()
    gt = np.zeros((8, 8), bool)
    for y, x in RED_A:
        gt[y, x] = True
    think = "<think>red</think>"
    exact = think + "<bbox>[0,0,4,3]</bbox><points>[[2,1]]</points><labels>[1]</labels>"
    # whole-canvas box, a negative point on blue: mask = A ∪ B (10 px); IoU = 6/10
    both_reds = think + "<bbox>[0,0,7,7]</bbox><points>[[5,5]]</points><labels>[0]</labels>"
    no_labels = think + "<bbox>[0,0,4,3]</bbox><points>[[2,1]]</points>"
    no_box = think + "<points>[[2,1]]</points><labels>[1]</labels>"   # would segment A, but a box is required
    got = segmentation_reward(None, [exact, both_reds, no_labels, no_box], image=[img] * 4, gt_mask=[gt] * 4)
    assert got[0] == pytest.approx(0.7 * 1 + 0.3 * 1)       # IoU 1, S 1
    pred = np.zeros((8, 8))
    for y, x in RED_A | RED_B:
        pred[y, x] = 1.0
    assert got[1] == pytest.approx(0.7 * 0.6 + 0.3 * min(1.0, max(0.0, s_measure(pred, gt))))
    assert 0.42 < got[1] < 0.72                              # the S term is in (0, 1)
    assert got[2:] == [0.0, 0.0]
    assert mask_iou_at_50(None, [exact, both_reds, no_box], image=[img] * 3, gt_mask=[gt] * 3) == [1.0, 1.0, 0.0]


def test_pretraining_targets_segment_their_scene_exactly():
    # the Seg-R1 target (the target's box and its first inscribed point) reproduces the target's mask through the
    # stand-in on built-in scenes: IoU 1 and S 1, so reward 1, format 1
    examples = [pretraining_example(s) for s in range(0, 40, 2)]
    texts = [t for _, t in examples]
    rewards = segmentation_reward(None, texts, scene_kind=[r["scene_kind"] for r, _ in examples],
                                  scene_seed=[r["scene_seed"] for r, _ in examples])
    assert rewards == pytest.approx([1.0] * len(texts))
    assert seg_r1_format_reward(None, texts) == [1.0] * len(texts)


# ---------------------------------------------------------------------------------------- PixelThink
GT_BOX, GT_POINTS = [10, 10, 19, 19], [[12, 12], [17, 17]]


def answer(box, p1, p2, think="a"):
    return (f'<think>{think}</think><answer>{{"bbox":{box},"points_1":{p1},"points_2":{p2}}}</answer>')


def test_pixelthink_accuracy_terms_by_hand():
    t = lambda text: pixelthink_terms(text, GT_BOX, GT_POINTS)  # noqa: E731
    # exact box, points given in the other order (the distance is order-invariant): all five terms
    assert t(answer([10, 10, 19, 19], [17, 17], [12, 12])) == [1, 1, 1, 1, 1]
    # box [10,10,19,20]: L1 mean 1/4 = 0.25 < 10·32/840 = 0.381 -> term 5 holds; IoU 100/110 > 0.5
    assert t(answer([10, 10, 19, 20], [12, 12], [17, 17])) == [1, 1, 1, 1, 1]
    # box [10,10,20,20]: L1 mean 2/4 = 0.5 >= 0.381 -> 0; IoU 100/121 = 0.83 -> 1
    assert t(answer([10, 10, 20, 20], [12, 12], [17, 17])) == [1, 1, 1, 1, 0]
    # box [10,10,19,14]: inter 10·5 = 50, union 100 + 50 - 50 = 100: IoU 0.5 is not > 0.5; L1 5/4 -> 0
    # points: (12,12) inside, (17,17) outside the predicted box -> term 4 fails
    assert t(answer([10, 10, 19, 14], [12, 12], [17, 17])) == [1, 1, 0, 0, 0]
    # points inside: (12,12) and (17,14): mean distance (0 + 3)/2 = 1.5 < 100·32/840 = 3.81 -> 1;
    # (12,12) and (17,10): (0 + 7)/2 = 3.5 < 3.81 -> 1; (10,10) and (17,10): min((2.83 + 7), (7.07 + 8.60))/2
    # = 4.91 -> 0
    assert t(answer([10, 10, 19, 19], [12, 12], [17, 14]))[3] == 1
    assert t(answer([10, 10, 19, 19], [12, 12], [17, 10]))[3] == 1
    assert t(answer([10, 10, 19, 19], [10, 10], [17, 10]))[3] == 0
    # a box sharing a single column with the target: the authors' overlap test (ix1 < ix2) gives IoU 0
    assert t(answer([19, 10, 25, 19], [20, 12], [21, 12]))[2] == 0
    # text after </answer>: the think/answer full match fails, the rest holds
    assert t(answer([10, 10, 19, 19], [12, 12], [17, 17]) + " done") == [0, 1, 1, 1, 1]
    # single quotes (the authors' prompt hint) are no JSON: only the tag format holds
    assert t("<think>a</think><answer>{'bbox': [10,10,19,19], 'points_1': [12,12], 'points_2': [17,17]}</answer>"
             ) == [1, 0, 0, 0, 0]
    # a bbox of 3 numbers: format 2 fails and every geometric term with it
    assert t(answer([10, 10, 19], [12, 12], [17, 17])) == [1, 0, 0, 0, 0]


def test_pixelthink_budget_branches_and_clipping():
    # authors' thresholds: hard d >= 5.0, medium 3.5 <= d < 5.0 (no budget), easy below
    assert pixelthink_length_budget(5.0, 0.4) == pytest.approx(25.6 + 2.5 * 0.4)       # 26.6
    assert pixelthink_length_budget(4.99, 0.4) is None
    assert pixelthink_length_budget(3.5, 0.9) is None
    assert pixelthink_length_budget(3.49, 0.9) == pytest.approx(9.6)
    # the authors' constants when asked for: 256 + 25·u, 96
    assert pixelthink_length_budget(7, 1.0, hard_budget=256, uncertainty_scale=25) == 281
    # s = clip(1 - β(L - B), 0, 1), β = 1/50: over budget 30 vs 26.6 -> 1 - 0.02·3.4 = 0.932
    assert pixelthink_length_score(30, 26.6) == pytest.approx(0.932)
    assert pixelthink_length_score(5, 9.6) == 1.0                  # under budget: 1 + 0.092 clipped to 1
    assert pixelthink_length_score(100, 9.6) == 0.0                # 1 - 0.02·90.4 < 0: clipped to 0
    assert pixelthink_length_score(10 ** 6, None) == 1.0           # medium: no budget
    assert pixelthink_length_score(596, 96, beta=1 / 500) == pytest.approx(0.0)   # authors' β: 500 over -> 0
    # L: characters of the stripped think content, or words of the whole completion
    assert pixelthink_length("<think> red circle </think><answer>x</answer>") == 10
    # words: '<think>red', 'circle</think>', '<answer>x', 'y</answer>'
    assert pixelthink_length("<think>red circle</think> <answer>x y</answer>", "words") == 4
    assert pixelthink_length("no think") == 0


def test_pixelthink_reward_terms_budget_and_product():
    think = "red circle, blue square"                     # 23 characters
    text = answer([10, 10, 19, 19], [12, 12], [17, 17], think=think)   # accuracy 5
    half = answer([10, 10, 20, 20], [12, 12], [17, 14], think=think)   # accuracy 4 (box L1 0.5 fails)
    n = 6
    got = pixelthink_reward(None, [text, text, text, half, text, text], target_box=[GT_BOX] * n,
                            target_points=[GT_POINTS] * n, difficulty=[6.0, 1.0, 4.0, 1.0, 6.0, None],
                            uncertainty=[0.4, 0.4, 0.4, 0.0, 3.0, None])
    # hard, u 0.4: B = 26.6 >= 23 -> s 1 -> 5.   easy: B 9.6, s = 1 - 0.02·13.4 = 0.732 -> 3.66.
    # medium: 5.   easy, accuracy 4: 4·0.732 = 2.928.   hard, u 3 clipped to 1: B 28.1 -> 5.
    # no difficulty: the authors' fallback 3.0 (easy) -> 3.66
    assert got == pytest.approx([5.0, 5 * 0.732, 5.0, 4 * 0.732, 5.0, 5 * 0.732])
    # the authors' word count instead: '<think>red', 'circle,', 'blue', 'square</think><answer>{…}</answer>': 4 words,
    # under every budget -> 5
    assert pixelthink_reward(None, [text], target_box=[GT_BOX], target_points=[GT_POINTS], difficulty=[1.0],
                             length_unit="words") == [5.0]
    assert pixelthink_box_iou(None, [text, half, "x"], target_box=[GT_BOX] * 3) == [1.0, 1.0, 0.0]


# ------------------------------------------------------------------------------------------- task rows
def test_difficulty_formula_by_hand():
    m = np.zeros((32, 32), bool)
    target = SceneObject("circle", "red", [0, 0, 8, 8], m)                 # side 9
    same_colour = SceneObject("square", "red", [20, 20, 26, 26], m)
    other = SceneObject("triangle", "blue", [0, 20, 6, 26], m)
    # n 3: 2·2 = 4; side 9: 0.5·4 = 2; a red distractor: 1.5 -> 7.5 (hard)
    assert scene_difficulty(Scene(None, [target, same_colour, other], 0)) == 7.5
    # n 2 without a confusable distractor: 2 + 2 = 4 (medium)
    assert scene_difficulty(Scene(None, [target, other], 0)) == 4.0
    # n 1, side 13: 0 (easy)
    assert scene_difficulty(Scene(None, [SceneObject("square", "red", [0, 0, 12, 12], m)], 0)) == 0.0


def test_inscribed_points_by_hand():
    m = np.zeros((7, 7), bool)
    m[1:6, 1:6] = True        # a 5 × 5 square
    # D is 3 at the centre (3,3) (the nearest outside pixel is 3 away); p2 maximises min(D, |p - p1|): the pixels
    # at (3,2)/(2,3)/(4,3)/(3,4) give min(2, 1) = 1, (2,2) gives min(2, 1.41) = 1.41, the first in row-major order
    assert inscribed_points(m) == [[3, 3], [2, 2]]
    one = np.zeros((4, 4), bool)
    one[1, 2] = True
    assert inscribed_points(one) == [[2, 1], [2, 1]]


def test_rows_are_deterministic_disjoint_and_shuffled_by_seed():
    a = get_task("shape_segmentation", segment_train_size=30, segment_eval_size=10)
    b = get_task("shape_segmentation", segment_train_size=30, segment_eval_size=10)
    c = get_task("shape_segmentation", seed=1, segment_train_size=30, segment_eval_size=10)
    assert a.train_rows == b.train_rows and a.eval_rows == b.eval_rows
    train = {r["scene_seed"] for r in a.train_rows}
    held = [r["scene_seed"] for r in a.eval_rows]
    assert train == set(range(tiny.TRAIN_BASE, tiny.TRAIN_BASE + 30))
    assert held == list(range(tiny.EVAL_BASE, tiny.EVAL_BASE + 10))            # fixed, in order
    assert {r["scene_seed"] for r in c.train_rows} == train and c.train_rows != a.train_rows   # shuffled by seed
    assert c.eval_rows == a.eval_rows
    pretraining = set(range(tiny.pretrain_recipe("shape_segmentation")["examples"]))   # scene seeds 0 … 11,999
    assert len(pretraining) == 12000 and not train & pretraining and not set(held) & pretraining
    row = a.eval_rows[0]
    scene = shapes_scene(row["scene_seed"])
    t = scene.objects[scene.target]
    assert row["prompt"] == f"Segment the {t.name}." and row["target"] == t.name
    assert row["target_box"] == t.box and row["scene_kind"] == "shapes"
    assert row["difficulty"] == scene_difficulty(scene)
    x1, y1, x2, y2 = t.box
    assert all(t.mask[y, x] for x, y in row["target_points"])                  # the points lie on the target


def test_formats_choose_prompt_rewards_and_pretraining_targets():
    seg = get_task("shape_segmentation", segment_train_size=4, segment_eval_size=2)
    pix = get_task("shape_segmentation", segment_train_size=4, segment_eval_size=2, segment_format="pixelthink")
    assert [n for n, _, _ in seg.rewards] == ["segmentation", "format", "mask_iou_at_50"]
    assert [w for _, _, w in seg.rewards] == [1.0, 1.0, 0.0] and seg.accuracy_reward == "mask_iou_at_50"
    assert [n for n, _, _ in pix.rewards] == ["pixelthink", "box_iou"] and pix.accuracy_reward == "box_iou"
    assert pix.eval_rows[0]["prompt"].startswith("Find the ") and pix.eval_rows[0]["prompt"].endswith("box and points.")
    with pytest.raises(ValueError, match="segment_format"):
        get_task("shape_segmentation", segment_format="sam")
    # the pre-training examples alternate the formats and are the rows' own targets
    r0, t0 = pretraining_example(0)
    r1, t1 = pretraining_example(1)
    assert r0["prompt"].startswith("Segment") and t0.startswith("<think>") and "<labels>[1]</labels>" in t0
    assert r1["prompt"].startswith("Find") and t1.endswith("</answer>") and '"points_2"' in t1
    assert t1 == target_completion(segment_row(1, "pixelthink"), "pixelthink")
    # every PixelThink target scores all five accuracy terms
    for s in range(1, 40, 2):
        row, text = pretraining_example(s)
        assert pixelthink_terms(text, row["target_box"], row["target_points"]) == [1, 1, 1, 1, 1]
    assert "shape_segmentation" in tiny.PRETRAINING


# ------------------------------------------------------------------------------------- recipes end to end
QUIET = dict(log=lambda *a: None)
SMOKE = {"vlm_pretrain_steps": 5}  # a quickly built cache entry from random weights: a smoke run needs no skill


@pytest.mark.parametrize("recipe, reward, top", [("seg_r1", "segmentation", 1.0), ("pixelthink", "pixelthink", 5.0)])
def test_recipe_trains_one_step_on_the_tiny_model(tmp_path, monkeypatch, recipe, reward, top):
    from grpolab.config import Config
    from grpolab.recipes import load_recipe, recipe_overrides
    from grpolab.policies.vision_language import tasks_segment as vision_segment
    from grpolab.train.trainer import Trainer

    seen = []   # the sampler's per-completion uncertainty reaches PixelThink's reward as a column
    original = vision_segment.pixelthink_reward

    def spy(prompts=None, completions=None, **kw):
        seen.append(kw.get("uncertainty"))
        return original(prompts, completions, **kw)
    monkeypatch.setattr(vision_segment, "pixelthink_reward", spy)

    r = load_recipe(recipe)
    assert r["seed"] == {"seg_r1": "000-72", "pixelthink": "000-116"}[recipe]
    cfg = Config.build({**recipe_overrides(recipe), "steps": 1, "prompts_per_step": 4, "num_generations": 4,
                        "segment_train_size": 8, "segment_eval_size": 4, "save_steps": 100, **SMOKE,
                        "out": str(tmp_path / "run"), "stall_steps": 0, "threads": 1})
    summary = Trainer(cfg, **QUIET).train(progress=False)
    assert summary["skipped_steps"] == 0       # a finite loss and gradient: the optimiser stepped
    if recipe == "pixelthink":
        training = [u for u in seen if u is not None]
        assert training and all(0.0 <= x <= 1.0 for u in training for x in u)
    for k in ("before", "after"):
        assert 0.0 <= summary[k][f"rewards/{reward}/mean"] <= top
