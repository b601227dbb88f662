"""SRPO's two-stage cross-domain schedule (``srpo_two_stage``, seed 000-50): which rows are drawable at which step."""
import pytest

from grpolab.prompts import SAMPLERS

# rows 0, 2, 4 are math ("multistep"), rows 1, 3, 5 are the second domain ("copy")
ROWS = [{"task": t} for t in ("multistep", "copy") * 3]
MATH, ALL = {0, 2, 4}, set(range(6))


def make(stage2_step, seed=0, **kw):
    return SAMPLERS.get("srpo_two_stage")(num_rows=6, seed=seed, rows=ROWS, srpo_stage2_step=stage2_step,
                                          srpo_stage1_tasks=["multistep"], **kw)


def mixed(s, uids, step):
    """Feedback in which every drawn prompt got one right and one wrong completion (never skipped)."""
    pu = [u for u in uids for _ in range(2)]
    s.feedback(prompt_uids=pu, rewards=[1.0, 0.0] * len(uids), step=step)


def play(s, steps, drawn):
    """At each of ``steps``, ``s`` draws 2 rows (appended to ``drawn``) and gets :func:`mixed` feedback on them."""
    for step in steps:
        g = s.next(2)
        drawn.append(g)
        mixed(s, g, step)


def test_stage1_draws_only_stage1_rows_then_all():
    s = make(stage2_step=4)
    for step in range(4):  # steps 0..3: stage 1, each next(3) is one pass over the 3 math rows
        got = s.next(3)
        assert set(got) == MATH  # one full pass of the 3 math rows (no skip: mixed feedback)
        mixed(s, got, step)
    assert s.stage == 1 and s.step == 4
    got = s.next(6)  # step 4: stage 2, a new pass over all 6 rows
    assert s.stage == 2 and sorted(got) == sorted(ALL)
    mixed(s, got, 4)
    assert set(s.next(6)) == ALL


def test_switch_abandons_the_stage1_pass():
    s = make(stage2_step=1)
    first = s.next(2)  # 2 of the 3 math rows; the third is left in the stage-1 pass
    assert set(first) <= MATH and len(set(first)) == 2
    mixed(s, first, 0)
    got = s.next(6)  # step 1: the stage-1 pass is dropped, the 6 come from a fresh pass over all rows
    assert sorted(got) == [0, 1, 2, 3, 4, 5]


def test_history_resampling_crosses_the_stage_boundary():
    s = make(stage2_step=1)
    got = s.next(3)  # epoch 1 = the stage-1 pass over {0, 2, 4}
    assert set(got) == MATH
    # row 0: both completions correct (all correct -> skipped in epoch 2); rows 2, 4 mixed
    s.feedback(prompt_uids=[0, 0, 2, 2, 4, 4], rewards=[1.0, 1.0, 1.0, 0.0, 0.0, 1.0], step=0)
    got = s.next(5)  # epoch 2 over all 6 rows, row 0 skipped -> exactly the other five
    assert sorted(got) == [1, 2, 3, 4, 5] and s.skipped == 1


def test_stage2_step_zero_is_srpo_history():
    a, b = make(stage2_step=0, seed=3), SAMPLERS.get("srpo_history")(num_rows=6, seed=3)
    for step in range(3):
        ga, gb = a.next(4), b.next(4)
        assert ga == gb  # same generator, same pool: the same draws
        mixed(a, ga, step)
        mixed(b, gb, step)


def test_checkpoint_resume_makes_the_same_choices():
    ref = make(stage2_step=2, seed=7)
    seq_ref = []
    play(ref, range(5), seq_ref)
    a = make(stage2_step=2, seed=7)
    seq = []
    play(a, range(2), seq)
    state = a.state_dict()
    b = make(stage2_step=2, seed=99)  # another seed: everything must come from the state
    b.load_state_dict(state)
    play(b, range(2, 5), seq)
    assert seq == seq_ref
    assert all(set(g) <= MATH for g in seq_ref[:2]) and set().union(*seq_ref[2:]) - MATH  # stage 2 reached copy rows


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="no row has one"):
        SAMPLERS.get("srpo_two_stage")(num_rows=6, rows=ROWS, srpo_stage1_tasks=["code"])
    with pytest.raises(ValueError, match="column"):
        SAMPLERS.get("srpo_two_stage")(num_rows=2, rows=[{"task": "copy"}, {}], srpo_stage1_tasks=["copy"])
    with pytest.raises(ValueError, match=">= 0"):
        make(stage2_step=-1)
    state = make(stage2_step=1).state_dict()
    other = SAMPLERS.get("srpo_two_stage")(num_rows=6, rows=ROWS, srpo_stage1_tasks=["copy"])
    with pytest.raises(ValueError, match="stage-1 rows"):
        other.load_state_dict(state)


def test_recipe_sampler_on_multitask_mix():
    """The srpo_two_stage recipe's sampler, built by the trainer's build_sampler on multitask_mix: steps
    0..9 draw only 3-step arithmetic rows, step 10 on also the copy rows."""
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.tasks import get_task
    from grpolab.train.trainer import build_sampler

    over = recipe_overrides("srpo_two_stage")
    assert over["prompt_sampler"] == "srpo_two_stage" and over["srpo_stage2_step"] == 10
    rows = get_task("multitask_mix", n_train=40, n_eval=4).train_rows
    cfg = Config(**{k: v for k, v in over.items() if k in Config.__dataclass_fields__},
                 params={k: v for k, v in over.items() if k not in Config.__dataclass_fields__})
    s = build_sampler(cfg, rows)
    for step in range(10):
        got = s.next(4)
        assert {rows[i]["task"] for i in got} == {"multistep"}
        mixed(s, got, step)
    got = s.next(40)  # step 10: one pass over all 40 rows (none all-correct)
    assert sorted(got) == list(range(40)) and {rows[i]["task"] for i in got} == {"copy", "multistep"}
