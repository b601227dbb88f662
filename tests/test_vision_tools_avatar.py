"""VisTA (seed 000-74: image tools, the frozen reasoner, the reward table, task visual_tools, recipe vista) and AVATAR
(seed 000-104: motion clips, task motion_clips, TAS weights, the stratified replay stage, recipe avatar)."""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grpolab.batch import RolloutBatch
from grpolab.policies.vision_language.scenes import SceneObject, paint, shape_mask

from _helpers import assert_resume_is_exact

QUIET = dict(log=lambda *a: None)


# ----------------------------------------------------------------------------- VisTA: tools, reasoner, reward

def hand_scene():
    """red square [2,2,8,8] (7 x 7 = 49 px), red triangle [20,2,26,8], blue circle [20,20,28,28] (side 9, r 4.5:
    rows dy = 0, ±1, ±2 have |dx| <= 4 (9 px), dy = ±3 |dx| <= 3 (7 px), dy = ±4 |dx| <= 2 (5 px): 9 + 18 + 18 +
    14 + 10 = 69 px)."""
    objs = [SceneObject(s, c, b, shape_mask(s, b)) for s, c, b in
            (("square", "red", [2, 2, 8, 8]), ("triangle", "red", [20, 2, 26, 8]),
             ("circle", "blue", [20, 20, 28, 28]))]
    return paint(objs), objs


def test_tools_on_a_hand_made_scene():
    from grpolab.policies.vision_language.tools import TOOL_NAMES, blobs, classify, run_tools

    img, objs = hand_scene()
    assert int(objs[2].mask.sum()) == 69 and int(objs[0].mask.sum()) == 49
    bs = blobs(img)
    assert [(b.colour, classify(b), b.pixels) for b in bs] == [("red", "square", 49),
                                                                ("red", "triangle", int(objs[1].mask.sum())),
                                                                ("blue", "circle", 69)]
    assert TOOL_NAMES == ["count", "colours", "largest", "where", "shapes"]
    # raster order of first pixels: square (y 2, x 2), triangle apex (y 2, x 23), circle (y 20); centres: square
    # (5, 5) left top, triangle x 23 right, y < 16 top, circle (24, 24) right bottom
    assert run_tools(img, [1, 2, 3, 4, 5]) == [
        "count: 3 shapes", "colours: red 2, green 0, blue 1, yellow 0", "largest: blue",
        "where: red left top; red right top; blue right bottom", "shapes: circle, square, triangle"]
    assert run_tools(img, [5, 9, 0, 1]) == ["shapes: circle, square, triangle", "count: 3 shapes"]  # order kept
    blank = paint([])
    assert run_tools(blank, [1, 3, 4, 5]) == ["count: 0 shapes", "largest: none", "where: none", "shapes: none"]


def test_tools_agree_with_the_scene_metadata():
    """The tools read pixels only; on 300 generated scenes their objects are the scene's (colour, shape, area)."""
    from grpolab.policies.vision_language.scenes import shapes_scene
    from grpolab.policies.vision_language.tools import blobs, classify

    for s in range(300):
        sc = shapes_scene(s)
        want = sorted((o.colour, o.shape, int(o.mask.sum())) for o in sc.objects)
        assert sorted((b.colour, classify(b), b.pixels) for b in blobs(sc.image)) == want, s


def test_reasoner_by_hand():
    from grpolab.policies.vision_language.tasks_tools import PRIOR, UNSURE, reason
    from grpolab.policies.vision_language.tools import run_tools

    img, _ = hand_scene()
    out = dict(zip(["count", "colours", "largest", "where", "shapes"], run_tools(img, [1, 2, 3, 4, 5])))
    assert reason("count", "", [out["count"]]) == "3"
    assert reason("count", "", []) == PRIOR["count"] == "2"                 # no tool: the prior
    assert reason("count", "", [out["where"]]) == UNSURE                    # tools without the information
    assert reason("count", "", [out["where"], out["shapes"], out["count"]]) == UNSURE  # count is read 3rd, cap 2
    assert reason("count", "", [out["where"], out["shapes"], out["count"]], max_tools=3) == "3"
    assert reason("colour_count", "red", [out["colours"]]) == "2"
    assert reason("colour_count", "green", [out["shapes"], out["colours"]]) == "0"
    assert reason("largest", "", [out["largest"]]) == "blue"
    assert reason("largest", "", ["largest: tie"]) == UNSURE
    assert reason("side", "blue", [out["where"]]) == "right"
    assert reason("side", "red", [out["where"]]) == UNSURE                  # red is listed twice
    assert reason("has_shape", "triangle", [out["shapes"]]) == "yes"
    assert reason("has_shape", "triangle", []) == "no"


def test_vista_reward_table_four_cases():
    from grpolab.policies.vision_language.tasks_tools import vista_reward, vista_table

    # (tools right, no-tool right) -> +1, +1, -0.5, 0
    assert [vista_table(a, b) for a, b in ((True, True), (True, False), (False, True), (False, False))] == \
        [1.0, 1.0, -0.5, 0.0]
    img, _ = hand_scene()

    def score(completions, kind, arg, answer):
        n = len(completions)
        return vista_reward(None, completions, question_kind=[kind] * n, question_arg=[arg] * n,
                            answer=[answer] * n, image=[img] * n)

    # "how many shapes?" = 3; the prior "2" is wrong: count tool -> +1; another tool -> unsure, 0; none -> prior, 0
    assert score(["<answer>1</answer>", "<answer>4</answer>", "no tags", "<answer>4,5,1</answer>"],
                 "count", "", "3") == [1.0, 0.0, 0.0, 0.0]
    # "is there a square?" = yes; the prior "no" is wrong; "is there a green...": no shape question with prior right
    # "how many green shapes?" = 0 = the prior: colours tool -> +1; a wrong tool -> unsure while the prior is right:
    # -0.5; no tool -> the prior, +1; the needed tool second of two -> +1
    assert score(["<answer>2</answer>", "<answer>3</answer>", "<answer></answer>", "<answer>3, 2</answer>"],
                 "colour_count", "green", "0") == [1.0, -0.5, 1.0, 1.0]
    with pytest.raises(ValueError, match="question_kind"):
        vista_reward(None, ["<answer>1</answer>"], answer=["3"], image=[img])


def test_selected_tools_parsing():
    from grpolab.policies.vision_language.tasks_tools import selected_tools

    assert selected_tools("<answer>1,3</answer>") == [1, 3]
    assert selected_tools("x <answer> 3 , 1,3 x2</answer><answer>5</answer>") == [3, 1]  # first tag, dedup, ints
    assert selected_tools("<answer>1,3") == [] and selected_tools("") == []
    assert selected_tools([{"role": "assistant", "content": "<answer>4</answer>"}]) == [4]  # TRL chat completions


def test_visual_tools_rows_and_answers_are_deterministic():
    from grpolab.tasks import get_task
    from grpolab.policies.vision_language.tasks_tools import QUESTION_KINDS, scene_question, vista_reward
    from grpolab.policies.vision_language.tiny import EVAL_BASE, TRAIN_BASE

    a = get_task("visual_tools", vista_train_size=30, vista_eval_size=40)
    b = get_task("visual_tools", vista_train_size=30, vista_eval_size=40)
    assert a.train_rows == b.train_rows and a.eval_rows == b.eval_rows
    assert all(r["scene_seed"] >= TRAIN_BASE for r in a.train_rows)
    assert [r["scene_seed"] for r in a.eval_rows] == list(range(EVAL_BASE, EVAL_BASE + 40))
    rows = a.eval_rows
    cols = {k: [r[k] for r in rows] for k in ("question_kind", "question_arg", "answer", "scene_kind",
                                                "scene_seed")}
    # the tool each kind needs makes the reasoner right on every row
    needed = [f"<answer>{QUESTION_KINDS[r['question_kind']]}</answer>" for r in rows]
    assert vista_reward(None, needed, **cols) == [1.0] * len(rows)
    assert scene_question(EVAL_BASE) == (rows[0]["question_kind"], rows[0]["question_arg"], rows[0]["answer"])


# ----------------------------------------------------------------------------- AVATAR: clips and the task

def test_motion_clips_are_deterministic_and_move():
    from grpolab.policies.vision_language.clips import DIRECTIONS, FRAMES, motion_clip
    from grpolab.policies.vision_language.scenes import row_images
    from grpolab.policies.vision_language.tools import blobs, classify

    a, b = motion_clip(5), motion_clip(5)
    assert all(np.array_equal(x, y) for x, y in zip(a.frames, b.frames))
    # pinned (NumPy PCG64: the same on any machine)
    assert (a.direction, a.step, [o.name for o in a.objects], a.objects[0].box) == \
        ("down", 7, ["blue triangle"], [5, 1, 13, 9])
    assert int(a.frames[1].sum()) == 86356
    for s in range(60):
        c = motion_clip(s)
        assert len(c.frames) == FRAMES and all(f.shape == (32, 32, 3) and f.dtype == np.uint8 for f in c.frames)
        mover = c.objects[c.target]
        dx, dy = DIRECTIONS[c.direction]
        centres = []
        for f in c.frames:
            mine = [x for x in blobs(f) if x.colour == mover.colour and classify(x) == mover.shape]
            assert len(mine) == 1
            centres.append(mine[0].centre)
        for f in range(1, FRAMES):  # the mover shifts by step pixels per frame in its direction, nothing else
            assert centres[f][0] - centres[0][0] == pytest.approx(dx * c.step * f)
            assert centres[f][1] - centres[0][1] == pytest.approx(dy * c.step * f)
        assert len(row_images({"scene_kind": "motion", "scene_seed": s})) == FRAMES


def test_motion_clips_with_a_distractor(monkeypatch):
    """MAX_DISTRACTORS 1: the still shape is the same in every frame and never touches the mover's path."""
    from grpolab.policies.vision_language import clips
    from grpolab.policies.vision_language.scenes import box_mask

    monkeypatch.setattr(clips, "MAX_DISTRACTORS", 1)
    two = 0
    for s in range(80):
        c = clips.motion_clip(s)
        if len(c.objects) < 2:
            continue
        two += 1
        still = c.objects[1]
        grown = box_mask([still.box[0] - 1, still.box[1] - 1, still.box[2] + 1, still.box[3] + 1])
        dx, dy = clips.DIRECTIONS[c.direction]
        for f, frame in enumerate(c.frames):
            assert (frame[still.mask] == clips.COLOURS[still.colour]).all()
            m = c.objects[0]
            moved = box_mask([m.box[0] + dx * c.step * f, m.box[1] + dy * c.step * f,
                              m.box[2] + dx * c.step * f, m.box[3] + dy * c.step * f])
            assert not (moved & grown).any()
    assert two > 20


def test_motion_rewards_by_hand():
    from grpolab.tasks import get_task
    from grpolab.policies.vision_language.tasks_motion import motion_accuracy, motion_format

    comps = ["<answer>left</answer>", " <answer> Left </answer>", "<answer>up</answer>", "left",
             "<answer>left</answer> because"]
    d = ["left"] * 5
    assert motion_accuracy(None, comps, direction=d) == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert motion_format(None, comps) == [1.0, 0.0, 1.0, 0.0, 0.0]  # "Left" is not a direction word
    with pytest.raises(ValueError, match="direction"):
        motion_accuracy(None, comps)
    t = get_task("motion_clips", motion_train_size=4, motion_eval_size=3)
    assert t.eval_rows[0]["scene_kind"] == "motion" and t.eval_rows[0]["prompt"].startswith("which way does the ")
    assert [w for _, _, w in t.rewards] == [1.0, 0.5] and t.accuracy_reward == "motion_accuracy"


# ----------------------------------------------------------------------------- AVATAR: TAS

def test_tas_weights_by_hand():
    """w_t = 1 + lambda (2t / max(L-1, 1) - 1)^2 over the column index t, L = the row's loss tokens (>= 1)."""
    from grpolab.algorithms.losses import clipped_ratio
    from grpolab.algorithms.weightings import avatar_tas, tas_weights

    lam = 0.3
    mask = torch.tensor([[1., 0, 0, 0, 0],    # L = 1: denominator clamped to 1, t = 0 -> (0 - 1)^2 = 1 -> 1.3
                         [1., 1, 0, 0, 0],    # L = 2: t = 0, 1 -> (-1)^2, (1)^2 -> 1.3, 1.3
                         [1., 1, 1, 0, 0],    # L = 3: 1.3, 1 + 0.3 * 0 = 1, 1.3
                         [1., 1, 1, 1, 1]])   # L = 5: x = -1, -0.5, 0, 0.5, 1 -> 1.3, 1.075, 1, 1.075, 1.3
    w = tas_weights(mask, lam) * mask
    want = torch.tensor([[1.3, 0, 0, 0, 0], [1.3, 1.3, 0, 0, 0], [1.3, 1.0, 1.3, 0, 0],
                         [1.3, 1.075, 1.0, 1.075, 1.3]])
    torch.testing.assert_close(w, want)
    # padding columns are not clamped (the authors' form; masked anyway): row L = 3 at t = 3 -> 1 + 0.3 * 4
    assert float(tas_weights(mask, lam)[2, 3]) == pytest.approx(2.2)
    assert torch.equal(tas_weights(mask, 0.0), torch.ones(4, 5)) and torch.equal(tas_weights(mask, -1.0),
                                                                                 torch.ones(4, 5))
    adv = torch.tensor([2.0, -1.0, 0.5, 1.0])
    out = avatar_tas(adv, mask, avatar_tas_lambda=lam) * mask
    torch.testing.assert_close(out, adv[:, None] * want)
    # weighting the advantage equals weighting the clipped surrogate (w > 0)
    g = torch.Generator().manual_seed(0)
    lp, old = torch.randn(4, 5, generator=g) * 0.3, torch.randn(4, 5, generator=g) * 0.3
    plain, _ = clipped_ratio(lp, old, adv[:, None].expand(4, 5), mask)
    shaped, _ = clipped_ratio(lp, old, avatar_tas(adv, mask, avatar_tas_lambda=lam), mask)
    torch.testing.assert_close(shaped * mask, plain * want)


# ----------------------------------------------------------------------------- AVATAR: replay stage

def test_tiers_quantiles_and_targets_by_hand():
    from grpolab.stages.batch_avatar_replay import assign_tier, quantile, target_counts, tier_capacities

    v = [0.9, 0.0, 1.0, 0.2, 0.5]         # sorted 0, .2, .5, .9, 1; n - 1 = 4
    assert quantile(v, 0.40) == 0.5      # round(1.6) = 2
    assert quantile(v, 0.75) == 0.9      # round(3.0) = 3
    assert [assign_tier(x, v) for x in (0.5, 0.6, 0.9, 0.95)] == ["hard", "medium", "medium", "easy"]
    three = [0.1, 0.3, 0.6]              # round(0.8) = 1 -> 0.3; round(1.5) = 2 (halves to even) -> 0.6
    assert (quantile(three, 0.4), quantile(three, 0.75)) == (0.3, 0.6)
    assert [assign_tier(x, three) for x in (0.3, 0.5, 0.6, 0.61)] == ["hard", "medium", "medium", "easy"]
    assert assign_tier(0.7, []) == "hard" and quantile([], 0.4) == 0.0
    r = {"easy": 0.25, "medium": 0.35, "hard": 0.40}
    assert target_counts(4, r) == {"easy": 1, "medium": 1, "hard": 2}    # 1.0, 1.4, 1.6 -> 1, 1, 2
    assert target_counts(1, r) == {"easy": 0, "medium": 0, "hard": 1}    # 0, 0, 0 -> hard (largest ratio) + 1
    assert target_counts(10, r) == {"easy": 2, "medium": 4, "hard": 4}   # 2.5 -> 2, 3.5 -> 4, 4.0 -> 4
    assert target_counts(14, r) == {"easy": 4, "medium": 5, "hard": 5}   # 3.5 -> 4, 4.9 -> 5, 5.6 -> 6: 15 > 14
    assert tier_capacities(10000, 0.25, 0.35) == {"easy": 2500, "medium": 3500, "hard": 4000}
    assert tier_capacities(10, 0.25, 0.35) == {"easy": 2, "medium": 4, "hard": 4}


def test_replayed_advantages_from_history_by_hand():
    from grpolab.stages.batch_avatar_replay import AvatarReplay, replay_advantages

    st = AvatarReplay(avatar_vcrs_window=3)
    for r in (1.0, 0.0, 0.0, 1.0):           # window 3 keeps 0, 0, 1: rbar(7) = 1/3
        st.record(7, r)
    assert st.history[7] == [0.0, 0.0, 1.0] and st.rbar(7) == pytest.approx(1 / 3) and st.rbar(9) == 0.0
    # one row: std := 1 -> A = (1 - 1/3) / (1 + 1e-4)
    one = replay_advantages(torch.tensor([1.0]), torch.tensor([st.rbar(7)]), 1.0)
    assert float(one) == pytest.approx((2 / 3) / 1.0001)
    # two rows (prompts 7, 9), rewards 1, 0: unbiased std sqrt(0.5); alpha 2
    two = replay_advantages(torch.tensor([1.0, 0.0]), torch.tensor([st.rbar(7), st.rbar(9)]), 2.0)
    s = math.sqrt(0.5) + 1e-4
    torch.testing.assert_close(two, torch.tensor([2 * (2 / 3) / s, 0.0]))
    # all-equal rewards of a unit of two (std 0): the authors' 1e-4 floor gives (r - rbar) * 1e4
    eq = replay_advantages(torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.5]), 1.0)
    torch.testing.assert_close(eq, torch.tensor([5000.0, 5000.0]))


def make_batch(rewards, uids, group_ids, lp, T=3):
    R = len(rewards)
    scalar = torch.tensor(rewards, dtype=torch.float32)
    b = RolloutBatch(prompt_ids=torch.full((R, 2), 5), prompt_mask=torch.ones(R, 2, dtype=torch.long),
                     completion_ids=torch.arange(R)[:, None].repeat(1, T) + 1, completion_mask=torch.ones(R, T),
                     behavior_logprobs=torch.tensor(lp, dtype=torch.float32)[:, None].repeat(1, T),
                     group_ids=torch.tensor(group_ids), prompt_uids=torch.tensor(uids),
                     truncated=torch.zeros(R, dtype=torch.bool), rewards=scalar[:, None].clone(), reward_names=["r"],
                     scalar_rewards=scalar, columns={"prompt": [f"p{u}" for u in uids]})
    b.completion_attention_mask = torch.ones(R, T, dtype=torch.long)
    b.advantages = (scalar - scalar.mean())[:, None] * b.completion_mask
    return b


class Ctx:
    def __init__(self, weightings=(), lam=0.3):
        self.cfg = SimpleNamespace(advantage_weightings=list(weightings), avatar_tas_lambda=lam, beta=0.0)
        self.pad_id = 0
        self.next_group = 100
        self.metrics = {}

    def allocate_groups(self, n):
        self.next_group += n
        return self.next_group - n

    def metric(self, k, v):
        self.metrics[k] = v


def test_buffer_mixing_replaces_units():
    """Step 1 (empty buffer) trains on its own rows and stores them; step 2 replaces one unit by the oldest unit
    of the tier the draw names, with an advantage from the history of step 1."""
    from grpolab.stages.batch_avatar_replay import AvatarReplay

    st = AvatarReplay(avatar_off_policy_batches=1, avatar_on_policy_batches=None, avatar_replay_min_size=2,
                      avatar_replay_strategy="fifo", seed=0)
    ctx = Ctx()
    b1 = make_batch([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], [0, 0, 1, 1], [-1.0, -2.0, -3.0, -4.0])
    out1 = st(batch=b1, ctx=ctx, step=0)
    assert out1 is b1 and ctx.metrics["avatar_replayed_units"] == 0
    # tiers as the rows arrive: row 0 (prompt 0, 1): rbars [1] -> hard; row 1: rbar(0) = .5, rbars [.5] -> hard;
    # row 2 (prompt 1, 1): rbars [.5, 1]: q40 = .5 (round(.4) = 0), q75 = 1 (round(.75) = 1): 1 -> medium; row 3 too
    assert [len(st.tiers[t]) for t in ("easy", "medium", "hard")] == [0, 2, 2]
    assert [float(e["batch"].behavior_logprobs[0, 0]) for e in st.tiers["hard"]] == [-1.0, -2.0]
    b2 = make_batch([0.0, 0.0, 0.0, 0.0], [0, 0, 1, 1], [2, 2, 3, 3], [-5.0, -6.0, -7.0, -8.0])
    out2 = st(batch=b2, ctx=ctx, step=1)
    assert out2.num_rows == 4 and ctx.metrics["avatar_replayed_units"] == 1
    lp = out2.behavior_logprobs[:, 0].tolist()
    # one draw: target_counts(1) -> hard; fifo -> its oldest unit, step 1's row 0 (prompt 0, reward 1), in place
    # of one on-policy row (drawn uniformly); the other rows stay where they were
    i = lp.index(-1.0)
    expected = [-5.0, -6.0, -7.0, -8.0]
    expected[i] = -1.0
    assert lp == expected
    # A = (1 - rbar(0)) / (1 + 1e-4) with rbar(0) = mean(1, 0) = 0.5 (the history before step 2's rewards)
    assert float(out2.advantages[i, 0]) == pytest.approx(0.5 / 1.0001)
    assert int(out2.group_ids[i]) == 100 and float(out2.scalar_rewards[i]) == 1.0
    others = [j for j in range(4) if j != i]
    assert torch.equal(out2.advantages[others], b2.advantages[[j for j in range(4) if j != i]])
    # every step-2 unit entered the buffer (the replaced one too) and the histories
    assert len(st) == 8 and st.history[0] == [1.0, 0.0, 0.0, 0.0]
    # the on-policy floor: 4 units, at least 4 on-policy -> nothing replaced; below min size -> nothing replaced
    floor = AvatarReplay(avatar_off_policy_batches=2, avatar_on_policy_batches=4, avatar_replay_min_size=1)
    floor(batch=make_batch([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], [0, 0, 1, 1], [-1.0] * 4), ctx=Ctx())
    b3 = make_batch([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], [0, 0, 1, 1], [-2.0] * 4)
    assert floor(batch=b3, ctx=Ctx()) is b3
    small = AvatarReplay(avatar_off_policy_batches=2, avatar_on_policy_batches=None, avatar_replay_min_size=9)
    small(batch=make_batch([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], [0, 0, 1, 1], [-1.0] * 4), ctx=Ctx())
    assert small(batch=b3, ctx=Ctx()) is b3


def test_replayed_rows_get_tas_weights_and_units_of_two():
    from grpolab.stages.batch_avatar_replay import AvatarReplay

    st = AvatarReplay(avatar_off_policy_batches=1, avatar_on_policy_batches=None, avatar_replay_min_size=1,
                      avatar_unit_rows=2, avatar_replay_strategy="uniform")
    ctx = Ctx(weightings=["avatar_tas"], lam=0.3)
    b1 = make_batch([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], [0, 0, 1, 1], [-1.0, -2.0, -3.0, -4.0])
    st(batch=b1, ctx=ctx)
    assert len(st) == 2  # two units of two rows
    out = st(batch=make_batch([0.0] * 4, [0, 0, 1, 1], [2, 2, 3, 3], [-5.0, -6.0, -7.0, -8.0]), ctx=ctx)
    lp = out.behavior_logprobs[:, 0].tolist()
    w = torch.tensor([1.3, 1.0, 1.3])  # L = 3
    if -1.0 in lp:  # unit (prompt 0: rewards 1, 0; rbar(0) = .5): A = (r - .5) / (sqrt(.5) + 1e-4)
        i = lp.index(-1.0)
        a = 0.5 / (math.sqrt(0.5) + 1e-4)
        torch.testing.assert_close(out.advantages[i:i + 2], torch.stack([a * w, -a * w]))
    else:  # unit (prompt 1: rewards 1, 1; rbar(1) = 1): A = 0
        i = lp.index(-3.0)
        assert torch.equal(out.advantages[i:i + 2], torch.zeros(2, 3))
    assert out.group_ids[i] == out.group_ids[i + 1] == 100


def test_priority_scores_and_state_round_trip():
    from grpolab.stages.batch_avatar_replay import AvatarReplay

    st = AvatarReplay(avatar_off_policy_batches=2, avatar_on_policy_batches=None, avatar_replay_min_size=1, seed=3)
    ctx = Ctx()
    b1 = make_batch([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1], [0, 0, 1, 1], [-1.0, -2.0, -3.0, -4.0])
    st(batch=b1, ctx=ctx)
    # score = 1.0 * mean(A) - 0.1 * 0 (beta 0: no KL term); A = r - mean(r) = .5, -.5, 0, 0
    scores = sorted(e["score"] for t in st.tiers.values() for e in t)
    assert scores == pytest.approx([-0.5, 0.0, 0.0, 0.5])
    other = AvatarReplay(avatar_off_policy_batches=2, avatar_on_policy_batches=None, avatar_replay_min_size=1,
                         seed=99)
    other.load_state_dict(copy.deepcopy(st.state_dict()))
    for s in range(3):
        nb = make_batch([0.0, 1.0, 0.0, 1.0], [0, 0, 1, 1], [0, 0, 1, 1], [-10.0 - s] * 4)
        x, y = st(batch=nb, ctx=Ctx()), other(batch=copy.deepcopy(nb), ctx=Ctx())
        assert torch.equal(x.behavior_logprobs, y.behavior_logprobs) and torch.equal(x.advantages, y.advantages)
    from grpolab.train.checkpoint import decode_state, encode_state
    back = decode_state(encode_state(st.state_dict()))  # what a checkpoint holds (tensors and plain data)
    third = AvatarReplay(seed=5)
    third.load_state_dict(back)
    assert third.history == st.history and len(third) == len(st)


def test_avatar_replay_settings_are_checked_at_start_up():
    from grpolab.config import Config, ConfigError
    from grpolab.recipes import recipe_overrides

    base = recipe_overrides("avatar")
    assert Config.build({**base, "avatar_on_policy_batches": None}).avatar_on_policy_batches is None
    for bad, msg in (({"avatar_replay_hard_ratio": 0.5}, "sum to 1"), ({"avatar_replay_strategy": "lifo"}, "lifo"),
                     ({"avatar_unit_rows": 0}, "avatar_unit_rows"), ({"avatar_priority_temperature": 0.0}, "> 0")):
        with pytest.raises(ConfigError, match=msg):
            Config.build({**base, **bad})
    with pytest.raises(ConfigError, match="vision"):  # a vision task with the (text) causal LM
        Config.build({"task": "motion_clips", "num_generations": 4, "micro_batch_size": 8})


# ----------------------------------------------------------------------------- recipes: short runs

def _short(name, extra, tmp_path, steps=2):
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    # vlm_pretrain_steps: a 20-step tiny model from random weights (a smoke run; no backbone to build)
    cfg = Config.build({**recipe_overrides(name), "steps": steps, "save_steps": 100, "stall_steps": 0,
                        "threads": 1, "vlm_pretrain_steps": 20, "out": str(tmp_path / "run"), **extra})
    return Trainer(cfg, **QUIET).train(progress=False)


def test_vista_recipe_trains_two_steps(tmp_path):
    from grpolab.recipes import load_recipe

    r = load_recipe("vista")
    assert r["seed"] == "000-74" and "2505.20289" in r["citation"]
    assert r["parameters"]["num_generations"] == 4
    s = _short("vista", {"vista_train_size": 8, "vista_eval_size": 8, "prompts_per_step": 2}, tmp_path)
    for k in ("before", "after"):
        assert -0.5 <= s[k]["rewards/vista/mean"] <= 1.0


def test_avatar_recipe_trains_with_replay(tmp_path):
    import json

    s = _short("avatar", {"motion_train_size": 8, "motion_eval_size": 8, "prompts_per_step": 2,
                          "num_generations": 4, "avatar_replay_min_size": 4}, tmp_path, steps=2)
    for k in ("before", "after"):
        assert 0.0 <= s[k]["rewards/motion_accuracy/mean"] <= 1.0
    m = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["rollout/avatar_replayed_units"] for x in m] == [0.0, 4.0]  # step 2: 8 units, 4 replayed
    assert [x["rollout/avatar_buffer_units"] for x in m] == [8.0, 16.0]


def test_avatar_resume_after_a_checkpoint_gives_the_same_weights(tmp_path):
    """4 steps straight, and 2 steps then a resume to 4 from the step-2 checkpoint (a new Trainer): the replay
    buffer, the reward histories and the stage's generator come back with the checkpoint, so the replayed units of
    steps 3-4 and the weights are the same to the bit."""
    import json

    from grpolab.recipes import recipe_overrides

    base = {**recipe_overrides("avatar"), "seed": 1, "save_steps": 2, "stall_steps": 0, "threads": 1,
            "prompts_per_step": 2, "num_generations": 4, "motion_train_size": 8, "motion_eval_size": 8,
            "avatar_replay_min_size": 4, "avatar_replay_strategy": "priority", "vlm_pretrain_steps": 20}
    assert_resume_is_exact(base, tmp_path, "motion_accuracy", **QUIET)
    ma = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["loss"] for x in ma][2:] == [x["loss"] for x in mb if x["step"] > 2]
    assert [x["rollout/avatar_buffer_units"] for x in ma] == [8.0, 16.0, 24.0, 32.0]
    assert [x["rollout/avatar_buffer_units"] for x in mb if x["step"] > 2] == [24.0, 32.0]  # the buffer came back
