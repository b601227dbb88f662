"""SPO's prioritised prompt sampler (seed 000-113): weights from the advantage's live value tracker, by hand."""
import math
import types

import pytest
import torch

from grpolab.algorithms.adv_shaping import SPOValueTracker
from grpolab.config import Config
from grpolab.prompts import SAMPLERS


def attached(num_rows, tracker, **kw):
    sampler = SAMPLERS.get("spo_prioritized")(num_rows=num_rows, seed=3, **kw)
    ctx = types.SimpleNamespace(components={"advantage/spo_single_stream": types.SimpleNamespace(fn=tracker)})
    sampler.attach(ctx)
    return sampler


def tracker_with(table):
    t = SPOValueTracker(spo_prior_value=0.5)
    t.table = {u: (a, b) for u, (a, b) in table.items()}
    return t


def test_weights_and_probabilities_by_hand():
    # prompt 0 unseen: v = prior 0.5 -> sqrt(.25) + .05 = 0.55
    # prompt 1: a = 9, b = 1 -> v = 0.9 -> sqrt(.09) + .05 = 0.35
    # prompt 2: a = 4, b = 0 -> v = 1 -> 0 + .05 = 0.05
    # prompt 3: a = 2, b = 6 -> v = .25 -> sqrt(.1875) + .05 = 0.483013
    tr = tracker_with({1: (9.0, 1.0), 2: (4.0, 0.0), 3: (2.0, 6.0)})
    s = attached(4, tr)
    w = s.weights([0, 1, 2, 3])
    assert w.tolist() == pytest.approx([0.55, 0.35, 0.05, math.sqrt(0.1875) + 0.05], abs=1e-9)
    # one prompt per step: frequencies follow w / sum w = .385185, .245115, .035017, .338269 (sum w = 1.433013)
    counts = torch.zeros(4)
    for _ in range(20000):
        counts[s.next(1)[0]] += 1
    expect = torch.tensor([0.55, 0.35, 0.05, 0.483013]) / 1.433013
    assert (counts / 20000).tolist() == pytest.approx(expect.tolist(), abs=0.012)
    # k <= pool: distinct prompts; k > pool: with replacement, all from the pool
    assert sorted(s.next(4)) == [0, 1, 2, 3]
    assert len(s.next(9)) == 9


def test_reads_the_tracker_live_and_epsilon_keeps_prompts_reachable():
    tr = tracker_with({0: (10.0, 0.0), 1: (0.0, 10.0)})  # v = 1 and v = 0: weight epsilon only
    s = attached(3, tr, spo_sample_epsilon=0.0)
    # prompt 2 unseen (v = .5) is the only one with weight: always drawn
    assert {s.next(1)[0] for _ in range(50)} == {2}
    # the advantage updates the tracker: prompt 2 solved, prompt 0 now at v = .5 -> the sampler follows
    tr.table[2] = (10.0, 0.0)
    tr.table[0] = (5.0, 5.0)
    assert {s.next(1)[0] for _ in range(50)} == {0}
    # fewer prompts with weight than asked for: those first, then the others (distinct)
    draws = [s.next(2) for _ in range(50)]
    assert all(d[0] == 0 and d[1] in (1, 2) for d in draws) and {d[1] for d in draws} == {1, 2}
    # all weights 0 (epsilon 0, every prompt solved or hopeless): uniform
    tr.table[0] = (10.0, 0.0)
    assert {s.next(1)[0] for _ in range(200)} == {0, 1, 2}


def test_candidate_pool_is_an_epoch_pass():
    tr = tracker_with({})
    s = attached(6, tr, spo_candidate_pool=3)
    seen = s.next(3) + s.next(3)  # pool 3 = k 3: the whole pool each step, two steps = one epoch
    assert sorted(seen) == list(range(6))


def test_checkpoint_resumes_the_same_draws():
    tr = tracker_with({1: (9.0, 1.0), 2: (1.0, 1.0)})
    s = attached(5, tr, spo_candidate_pool=4)
    s.next(2)
    state = s.state_dict()
    tracker_state = tr.state_dict()
    want = [s.next(2) for _ in range(5)]
    tr2 = SPOValueTracker()
    tr2.load_state_dict(tracker_state)
    s2 = attached(5, tr2, spo_candidate_pool=4)
    s2.load_state_dict(state)
    assert [s2.next(2) for _ in range(5)] == want


def test_needs_the_spo_tracker(tiny_args):
    from grpolab.train.trainer import Trainer

    with pytest.raises(ValueError, match="advantage spo_single_stream"):
        Trainer(Config.build({**tiny_args, "prompt_sampler": "spo_prioritized"}), log=lambda *a: None)
    s = SAMPLERS.get("spo_prioritized")(num_rows=2)
    with pytest.raises(ValueError, match="value tracker"):
        s.attach(types.SimpleNamespace(components={}))
    with pytest.raises(ValueError, match="attach"):
        s.next(1)


def test_trainer_wires_the_tracker_and_resumes_it(tiny_args):
    """In a run the sampler reads the advantage's own tracker object; a resumed run restores both (the tracker
    through the advantage component's state) and draws what the finished run would draw next."""
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    args = {**recipe_overrides("spo_single_stream"), **tiny_args, "num_generations": 1, "steps": 4,
            "save_steps": 2, "threads": 1}
    t = Trainer(Config.build(args), log=lambda *a: None)
    assert t.sampler.tracker is t.components["advantage/spo_single_stream"].fn
    t.train(progress=False)
    assert t.sampler.tracker.table  # the advantage filled the tracker the sampler reads
    r = Trainer(Config.build(args), resume=True, log=lambda *a: None)
    assert r.step == 4 and r.sampler.tracker is r.components["advantage/spo_single_stream"].fn
    assert r.sampler.tracker.table == t.sampler.tracker.table
    assert [r.sampler.next(4) for _ in range(3)] == [t.sampler.next(4) for _ in range(3)]
