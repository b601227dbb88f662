"""Synthetic GUI screens (policies/vision_language/gui.py), the gui_actions (CRAFT-GUI, seed 000-19) and gui_critic (GUI-Critic-R1,
seed 000-121) tasks and rewards (policies/vision_language/tasks_gui.py), the difficulty_curriculum sampler (prompts/curriculum.py) and
the craft_gui / gui_critic_r1 recipes. Expected values are worked out by hand in the comments."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grpolab.policies.vision_language import gui
from grpolab.policies.vision_language.gui import action_correct, critic_case, format_action, gui_screen, parse_action

QUIET = dict(log=lambda *a: None)


# ----------------------------------------------------------------------------- screens

def test_screens_are_deterministic_and_well_formed():
    for seed in range(60):
        a, b = gui_screen(seed), gui_screen(seed)
        assert np.array_equal(a.image, b.image) and a.instruction == b.instruction
        assert a.image.shape == (32, 32, 3) and a.image.dtype == np.uint8
        buttons = [e for e in a.elements if e.kind == "button"]
        fields = [e for e in a.elements if e.kind == "field"]
        assert 2 <= len(buttons) <= 4 and len(fields) <= 1 and a.difficulty == len(a.elements)
        assert len({e.colour for e in buttons}) == len(buttons)          # distinct colours: the instruction is unique
        for i, e in enumerate(a.elements):                               # a 1-px gap between any two boxes
            for f in a.elements[i + 1:]:
                assert e.box[2] + 1 < f.box[0] or f.box[2] + 1 < e.box[0] or e.box[3] + 1 < f.box[1] \
                    or f.box[3] + 1 < e.box[1]
            colour = gui.FIELD_COLOUR if e.kind == "field" else gui.COLOURS[e.colour]
            assert (a.image[e.mask] == colour).all()
        if a.action_type == "type":
            assert a.elements[a.target].kind == "field" and a.text in gui.WORDS
            assert a.instruction == f"Type '{a.text}' in the field."
        else:
            assert a.instruction == f"Tap the {a.elements[a.target].colour} button."
    assert not np.array_equal(gui_screen(0).image, gui_screen(1).image)


def test_field_is_an_outline_and_screens_are_registered():
    from grpolab.policies.vision_language.scenes import SCENE_KINDS, row_images
    m = gui.field_mask([2, 3, 6, 6])
    # a 5 x 4 box: 20 pixels, its 3 x 2 inside (x 3..5, y 4..5) left out -> 14 outline pixels
    assert m.sum() == 14 and not m[4, 3] and m[3, 2] and m[6, 6]
    assert SCENE_KINDS["gui"] is gui_screen and SCENE_KINDS["gui_marked"] is critic_case
    seed = next(s for s in range(100) if critic_case(s).proposed[0] == "click")
    case = critic_case(seed)
    x, y = case.proposed[1:]
    img = row_images({"scene_kind": "gui_marked", "scene_seed": seed})[0]
    assert tuple(img[y, x]) == gui.MARKER_COLOUR                           # the proposed click is marked
    assert np.array_equal(row_images({"scene_kind": "gui", "scene_seed": seed})[0], case.screen.image)


def test_critic_cases_labels_agree_with_the_rule():
    errors = set()
    for seed in range(300):
        case = critic_case(seed)
        s = case.screen
        ok = action_correct(case.proposed, s.action_type, s.elements[s.target].box, s.text)
        assert ok == (case.label == "Correct") and (case.error == "") == ok
        errors.add(case.error)
        assert critic_case(seed).proposed == case.proposed
    assert errors == {"", "other_element", "background", "wrong_text", "wrong_type"}
    labels = [critic_case(s).label for s in range(400)]
    assert 0.4 < labels.count("Correct") / 400 < 0.6


# ----------------------------------------------------------------------------- the action grammar

@pytest.mark.parametrize("text, expected", [
    ("click(3,4)", ("click", 3, 4)),
    ("  click( 12 , 0 ) ", ("click", 12, 0)),
    ("type(hi)", ("type", "hi")),
    ("type( ok )", ("type", "ok")),
    ("type(a)b)", ("type", "a)b")),          # everything up to the last ')'
    ("click(-1,4)", None),                     # negative
    ("click(1.5,4)", None),                    # fractional
    ("click(3)", None),
    ("click(3,4) now", None),                  # trailing text
    ("type()", None), ("type(  )", None),      # empty text
    ("tap(3,4)", None), ("", None), (None, None),
])
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_format_action_round_trips_and_click_boxes_include_corners():
    for a in [("click", 0, 31), ("type", "cat")]:
        assert parse_action(format_action(a)) == a
    box = [2, 3, 6, 8]
    assert gui.inside(2, 3, box) and gui.inside(6, 8, box) and gui.inside(4, 5, box)
    assert not gui.inside(1, 3, box) and not gui.inside(7, 8, box) and not gui.inside(2, 9, box)
    assert action_correct(("click", 6, 8), "click", box) and not action_correct(("click", 7, 8), "click", box)
    assert not action_correct(("type", "hi"), "click", box)                # wrong type
    assert action_correct(("type", "hi"), "type", None, "hi") and not action_correct(("type", "Hi"), "type", None, "hi")
    assert not action_correct(None, "type", None, "hi")
    assert not action_correct(("click", 4, 5), "click", None)             # no box: the rule cannot say yes


# ----------------------------------------------------------------------------- gui_actions rewards

def test_gui_action_rewards_by_hand():
    from grpolab.policies.vision_language.tasks_gui import answer_action, gui_action_args, gui_action_type, gui_format
    comps = ["<answer>click(4,5)</answer>",                 # inside [2,3,6,8]
             "<think>red</think> <answer>click(7,5)</answer>",  # one column right of the box
             "<answer>type(hi)</answer>",                   # wrong type for a click row
             "click(4,5)",                                   # no answer tag
             "<answer>click(4,5)</answer><answer>click(4,5)</answer>",  # two answers
             "<answer>type(hi)</answer>",                   # a type row, right word
             "<answer>type(ok)</answer>",                   # a type row, wrong word
             "<answer>click(4,5)</answer>"]                 # an unannotated click row
    types = ["click"] * 5 + ["type", "type", "click"]
    boxes = [[2, 3, 6, 8]] * 5 + [[0, 0, 15, 6], [0, 0, 15, 6], None]
    texts = [""] * 5 + ["hi", "hi", ""]
    annotated = [True] * 7 + [False]
    assert answer_action(comps[4]) is None and answer_action(comps[1]) == ("click", 7, 5)
    assert gui_format(None, comps) == [1, 1, 1, 0, 0, 1, 1, 1]
    assert gui_action_type(None, comps, action_type=types) == [1, 1, 0, 0, 0, 1, 1, 1]
    assert gui_action_args(None, comps, action_type=types, target_box=boxes, target_text=texts,
                           annotated=annotated) == [1, 0, 0, 0, 0, 1, 0, None]
    with pytest.raises(ValueError, match="target_box"):
        gui_action_args(None, comps, action_type=types)


def test_gui_judge_scores_only_the_unannotated_rows():
    from grpolab.policies.vision_language.tasks_gui import GuiJudge
    seed = next(s for s in range(100) if gui_screen(s).action_type == "click")
    s = gui_screen(seed)
    x1, y1, x2, y2 = s.elements[s.target].box
    hit, miss = f"<answer>click({x1},{y2})</answer>", f"<answer>click({x2 + 1},{y2})</answer>"
    ann = [False, False, True]
    oracle = GuiJudge("oracle")
    assert oracle(None, [hit, miss, hit], scene_seed=[seed] * 3, annotated=ann) == [1.0, 0.0, None]
    lm = GuiJudge("tiny")                              # grpolab's yes/no judge (a random tiny LM): P(yes) in (0, 1)
    out = lm(None, [hit, miss, hit], scene_seed=[seed] * 3, annotated=ann)
    assert out[2] is None and all(0.0 < v < 1.0 for v in out[:2])
    assert lm(None, [hit], scene_seed=[seed], annotated=[True]) == [None]
    from grpolab.tasks import get_task
    with pytest.raises(ValueError, match="gui_judge 'self'"):
        get_task("gui_actions", gui_judge="self", gui_train_size=2, gui_eval_size=0)
    with pytest.raises(FileNotFoundError, match="config.json"):
        GuiJudge("/nonexistent/judge")


def test_mixed_reward_weights():
    """The task's weighted sum (NaN entries left out, TRL's sum): an annotated row's maximum is 0.2 + 0.3 + 1.0 =
    1.5, an unannotated row's the same with the judge in place of the rule."""
    from grpolab.algorithms.advantages import combine_rewards
    from grpolab.tasks import get_task

    task = get_task("gui_actions", gui_judge="oracle", gui_unannotated=0.5, gui_train_size=40, gui_eval_size=4)
    names = [n for n, _, _ in task.rewards]
    weights = torch.tensor([w for _, _, w in task.rewards])
    assert names == ["gui_format", "gui_action_type", "gui_action_args", "gui_judge"]
    assert weights.tolist() == pytest.approx([0.2, 0.3, 1.0, 1.0]) and task.accuracy_reward == "gui_action_args"
    # rows: correct format + type, miss (0.2 + 0.3 = 0.5); all right (1.5); unannotated all right (1.5); nothing
    m = torch.tensor([[1, 1, 0, float("nan")], [1, 1, 1, float("nan")], [1, 1, float("nan"), 1],
                      [0, 0, 0, float("nan")]])
    assert combine_rewards(m, weights).tolist() == pytest.approx([0.5, 1.5, 1.5, 0.0])
    un = [r for r in task.train_rows if not r["annotated"]]
    assert un and all(r["action_type"] == "click" and r["target_box"] is None for r in un)
    assert all(r["annotated"] for r in task.eval_rows)
    plain = get_task("gui_actions", gui_train_size=40, gui_eval_size=4)
    assert [n for n, _, _ in plain.rewards] == names[:3] and all(r["annotated"] for r in plain.train_rows)


def test_rows_and_pretraining_targets():
    from grpolab.tasks import get_task
    from grpolab.policies.vision_language.tasks_gui import action_row, critic_row, gui_action_args, critic_format, critic_label, \
        critic_suggestion
    from grpolab.policies.vision_language.tiny import EVAL_BASE, PRETRAINING, TRAIN_BASE
    assert PRETRAINING["gui_actions"] is action_row and PRETRAINING["gui_critic"] is critic_row
    t = get_task("gui_actions", gui_train_size=10, gui_eval_size=3)
    assert sorted(r["scene_seed"] for r in t.train_rows) == list(range(TRAIN_BASE, TRAIN_BASE + 10))
    assert [r["scene_seed"] for r in t.eval_rows] == [EVAL_BASE, EVAL_BASE + 1, EVAL_BASE + 2]
    for seed in range(40):  # every pre-training target earns the full reward
        row, target = action_row(seed)
        assert gui_action_args(None, [target], action_type=[row["action_type"]], target_box=[row["target_box"]],
                               target_text=[row["target_text"]]) == [1.0]
        row, target = critic_row(seed)
        cols = dict(action_type=[row["action_type"]], target_box=[row["target_box"]], target_text=[row["target_text"]])
        assert critic_format(None, [target]) == [1.0] and critic_label(None, [target], label=[row["label"]]) == [1.0]
        assert critic_suggestion(None, [target], **cols) == [1.0]
        assert row["prompt"][0]["content"].endswith(f"Action: {row['proposed']}")


# ----------------------------------------------------------------------------- gui_critic rewards

def test_critic_rewards_by_hand():
    from grpolab.policies.vision_language.tasks_gui import critic_format, critic_label, critic_score, critic_suggestion
    comps = ["<score>Correct</score><suggestion>click(4,5)</suggestion>",
             "<think>x</think><score>\nIncorrect\n</score> <suggestion>click(9,9)</suggestion>",
             "<score>Incorrect</score><suggestion>type(hi)</suggestion>",
             "<score>correct</score><suggestion>click(4,5)</suggestion>",       # lower case: not a label
             "<suggestion>click(4,5)</suggestion>",                            # no score
             "<score>Correct</score><suggestion>press it</suggestion>",        # unparsable suggestion
             "<score>In correct</score><suggestion>click(4,5)</suggestion>"]   # spaces removed as in test.py
    labels = ["Correct", "Correct", "Incorrect", "Correct", "Correct", "Correct", "Incorrect"]
    box = [2, 3, 6, 8]
    assert critic_score(comps[1]) == "Incorrect" and critic_score(comps[6]) == "Incorrect"
    assert critic_score(comps[3]) is None and critic_score(comps[4]) is None
    # format: the tags in order with a word and a parsable action; "In correct" is not a word of the format
    assert critic_format(None, comps) == [1, 1, 1, 0, 0, 0, 0]
    assert critic_label(None, comps, label=labels) == [1, 0, 1, 0, 0, 1, 1]
    # suggestion: a click inside [2,3,6,8] with a score present; (9,9) misses; type(hi) is the wrong type
    assert critic_suggestion(None, comps, action_type=["click"] * 7, target_box=[box] * 7) == [1, 0, 0, 0, 0, 0, 1]
    # the S-GRPO sum with the task's weights 0.5 / 1 / 1: row 0 -> 2.5, row 1 -> 0.5, row 2 -> 1.5, row 6 -> 2.0
    from grpolab.tasks import get_task
    w = [w for _, _, w in get_task("gui_critic", gui_train_size=2, gui_eval_size=0).rewards]
    assert w == [0.5, 1.0, 1.0]
    f, lab, sug = critic_format(None, comps), critic_label(None, comps, label=labels), \
        critic_suggestion(None, comps, action_type=["click"] * 7, target_box=[box] * 7)
    totals = [w[0] * a + w[1] * b + w[2] * c for a, b, c in zip(f, lab, sug)]
    assert totals == [2.5, 0.5, 1.5, 0.0, 0.0, 1.0, 2.0]


# ----------------------------------------------------------------------------- the curriculum

def test_curriculum_order_and_pool():
    from grpolab.prompts.curriculum import DifficultyCurriculumSampler, unlocked_count
    diffs = [3, 1, 2, 1, 3, 2, 5, 4]
    rows = [{"difficulty": d} for d in diffs]
    s = DifficultyCurriculumSampler(8, seed=0, rows=rows, curriculum_start=0.25, curriculum_steps=4)
    # sorted by difficulty: {1, 3} (difficulty 1), {2, 5} (2), {0, 4} (3), 7 (4), 6 (5); ties in a seeded order
    assert sorted(s.order[:2]) == [1, 3] and sorted(s.order[2:4]) == [2, 5] and sorted(s.order[4:6]) == [0, 4]
    assert s.order[6:] == [7, 6]
    # m(t) = ceil(8 * min(1, 0.25 + 0.75 t / 4)): t=0 -> 2, t=1 -> ceil(3.5) = 4, t=2 -> 5, t=3 -> ceil(6.5) = 7, 4 -> 8
    assert [unlocked_count(8, t, 0.25, 4) for t in range(6)] == [2, 4, 5, 7, 8, 8]
    assert unlocked_count(8, 0, 0.01, 4) == 1 and unlocked_count(8, 0, 0.25, 0) == 8
    assert sorted(s.next(2)) == [1, 3]                 # only the easiest level at step 0
    assert sorted(s.next(4)) == [1, 1, 3, 3]           # cycling through fresh permutations of the pool
    s.feedback(prompt_uids=[1], rewards=[1.0])
    assert set(s.next(4)) == {1, 3, 2, 5}              # step 1: four rows unlocked, each drawn once
    for _ in range(3):
        s.feedback()
    assert sorted(s.next(8)) == list(range(8))
    with pytest.raises(ValueError, match="row 1 has no 'difficulty'"):
        DifficultyCurriculumSampler(2, rows=[{"difficulty": 1}, {}])


def test_curriculum_state():
    from grpolab.prompts.curriculum import DifficultyCurriculumSampler
    rows = [{"difficulty": i % 4} for i in range(20)]
    a = DifficultyCurriculumSampler(20, seed=3, rows=rows, curriculum_steps=5)
    a.next(3), a.feedback(), a.next(3)
    b = DifficultyCurriculumSampler(20, seed=3, rows=rows, curriculum_steps=5)
    b.load_state_dict(a.state_dict())
    for _ in range(4):
        assert a.next(5) == b.next(5)
        a.feedback(), b.feedback()


def test_curriculum_config_checks():
    from grpolab.config import Config, ConfigError
    with pytest.raises(ConfigError, match="curriculum_start"):
        Config.build({"prompt_sampler": "difficulty_curriculum", "curriculum_start": 0.0})
    with pytest.raises(ConfigError, match="curriculum_steps"):
        Config.build({"prompt_sampler": "difficulty_curriculum", "curriculum_steps": -1})


# ----------------------------------------------------------------------------- recipes (needs the VLM policy)

@pytest.mark.parametrize("recipe, task, seed_id, arxiv", [("craft_gui", "gui_actions", "000-19", "2508.11360"),
                                                          ("gui_critic_r1", "gui_critic", "000-121", "2506.04614")])
def test_recipe_trains_two_steps(tmp_path, recipe, task, seed_id, arxiv):
    """Two steps of each recipe on the smoke runs' tiny VLM (``vlm_pretrain_steps`` 5: a few steps from random
    weights; the tasks' full pre-training takes minutes)."""
    from grpolab.config import Config
    from grpolab.recipes import load_recipe, recipe_overrides
    from grpolab.train.trainer import Trainer

    r = load_recipe(recipe)
    assert r["seed"] == seed_id and arxiv in r["citation"]
    cfg = Config.build({**recipe_overrides(recipe), "steps": 2, "prompts_per_step": 2, "num_generations": 4,
                        "gui_train_size": 8, "gui_eval_size": 4, "save_steps": 100, "micro_batch_size": 8,
                        "vlm_pretrain_steps": 5, "out": str(tmp_path / "run"), "stall_steps": 0, "threads": 1})
    assert cfg.task == task and cfg.policy == "vision_language"
    summary = Trainer(cfg, **QUIET).train(progress=False)
    for k in ("before", "after"):
        assert 0.0 <= summary[k]["reward_mean"] <= (1.5 if task == "gui_actions" else 2.5)
