"""mmGRPO composed with prompt optimisation (issue 43, seed 000-23): update_strategy better_together.

Expected values are worked out by hand from dspy's BetterTogether (dspy/teleprompt/bettertogether.py),
BootstrapFewShotWithRandomSearch (random_search.py) and BootstrapFewShot (bootstrap.py): the shuffles and the
random demo counts are Python's ``random.Random(seed)`` as dspy calls it, their values written out below."""
import json
import random

import pytest

from grpolab.agents.programs import with_demos
from grpolab.config import Config, ConfigError
from grpolab.generation.turns import Continuation
from grpolab.rollouts import lm_program as lp
from grpolab.stages.update_better_together import (best_candidate, candidate_demos, example_demos, p_times,
                                                   parse_strategy)
from grpolab.train import checkpoint as ckpt
from grpolab.train.trainer import Trainer

from _helpers import own_data_args


def test_strategy_schedule_by_hand():
    assert parse_strategy("P -> w -> p") == ["p", "w", "p"]
    # 'p -> w -> p' over 5 steps: the leading p before step 1, the last after the 5th (one w: all 5 steps)
    assert p_times(["p", "w", "p"], 5) == [(0, 0), (2, 5)]
    # 'w -> p -> w -> p -> p' over 5 steps: w1 ends after floor(5/2) = 2 steps, w2 after 5; then two p's
    assert p_times(parse_strategy("w -> p -> w -> p -> p"), 5) == [(1, 2), (3, 5), (4, 5)]
    with pytest.raises(ConfigError, match="no 'w'"):
        parse_strategy("p -> p")
    with pytest.raises(ConfigError, match="separated by ' -> '"):
        parse_strategy("p->w")


def test_candidates_by_hand():
    a = {"plan": {"prompt": "pa", "reply": "ra"}, "solve": {"prompt": "sa", "reply": "ta"}}
    b = {"solve": {"prompt": "sb", "reply": "tb"}}
    c = {"plan": {"prompt": "pc", "reply": "rc"}}
    traces = [a, None, b, c, None]  # rows 0, 2 and 3 succeeded
    assert candidate_demos(-3, traces, 2) == {}  # zero-shot
    # -1: the first 2 successful rows in order: 0 (a), 2 (b)
    assert candidate_demos(-1, traces, 2) == {"plan": [a["plan"]], "solve": [a["solve"], b["solve"]]}
    # seed 0: random.Random(0).shuffle([0..4]) = [2, 1, 0, 4, 3], random.Random(0).randint(1, 2) = 2:
    # the first 2 successes in that order: rows 2 (b), 0 (a)
    assert candidate_demos(0, traces, 2) == {"solve": [b["solve"], a["solve"]], "plan": [a["plan"]]}
    # seed 1: order [2, 3, 4, 0, 1], randint(1, 2) = 1: row 2 only
    assert candidate_demos(1, traces, 2) == {"solve": [b["solve"]]}
    # the first strictly best is kept: ties keep the earlier candidate
    assert best_candidate([(-3, 0.5), (-1, 0.5), (0, 0.75), (1, 0.75)]) == 0
    assert best_candidate([(-3, 0.0), (-1, 0.0)]) == -3
    # one demo per module per run; a module called twice gives one of its calls
    one = example_demos([("plan", "p1", "x"), ("solve", "s1", "y"), ("plan", "p2", "z")])
    assert one["solve"] == {"prompt": "s1", "reply": "y"}
    assert one["plan"] in ({"prompt": "p1", "reply": "x"}, {"prompt": "p2", "reply": "z"})
    assert example_demos([("plan", "p1", "x"), ("solve", "s1", "y"), ("plan", "p2", "z")]) == one  # seeded


def test_demos_in_front_of_the_prompt():
    demos = [{"prompt": "q1:", "reply": "yes"}, {"prompt": [{"role": "user", "content": "q2:"}], "reply": "no"}]
    # a text: each demo's prompt + reply + a blank line, then the prompt
    assert with_demos("q3:", demos) == "q1:yes\n\nq2:no\n\nq3:"
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "q3:"}]
    # a chat: after the system message, user / assistant pairs, then the chat's own user message
    assert with_demos(chat, demos) == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "q1:"}, {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "q2:"}, {"role": "assistant", "content": "no"}, {"role": "user", "content": "q3:"}]
    assert with_demos(chat, []) is chat and with_demos("q", None) == "q"


# ------------------------------------------------------------------------- a scripted one-module program


def echo(lm, row):
    return lm("solve", row["prompt"])


def hit(completions, answer, **kw):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def fake_sample(ctx, contexts, budgets, temperatures, model=None):
    """The module answers yes when it sees a yes (a demo, or its prompt q0), else no."""
    texts = [ctx.tokenizer.decode(c) for c in contexts]
    fake_sample.seen.extend(texts)
    replies = ["yes" if ("yes" in t or "q0" in t) else "no" for t in texts]
    ids = [ctx.tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
    return Continuation(ids, [[-1.0] * len(a) for a in ids], ["stop_string"] * len(ids))


fake_sample.seen = []


def run_args(tmp_path, **extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}:", "answer": "yes", "note": "yes no\n"}) + "\n"
                            for i in range(4)))
    tiny = {"model": "tiny", "steps": 1, "learning_rate": 1e-3, "eval_before": False, "eval_after": False,
            "tensorboard": False, "save_steps": 1, "micro_batch_size": 16}
    return {**own_data_args(tiny, str(data)), "reward": ["test_better_together:hit"], "rollout_strategy": "lm_program",
            "program": "test_better_together:echo", "reward_transforms": ["lm_program_failures"],
            "update_strategy": "better_together", "better_together_strategy": "p -> w -> p",
            "better_together_valset_ratio": 0.5, "better_together_max_demos": 1, "better_together_candidates": 1,
            "prompts_per_step": 2, "num_generations": 2, "max_completion_length": 4, "advantage": "group_mean",
            "seed": 2, "out": str(tmp_path / "run"), **extra}


def test_one_p_step_keeps_the_best_candidate(tmp_path, monkeypatch):
    monkeypatch.setattr(lp, "sample_calls", fake_sample)
    tr = Trainer(Config.build(run_args(tmp_path)), log=lambda *a: None)
    bt = tr.update_strategy.fn
    tr.ctx.new_step(0)
    # the leading p runs before the first rollout: the pool [0, 1, 2, 3] shuffled by random.Random(2) is
    # [1, 2, 3, 0]; num_val = int(0.5 * 4) = 2: dev rows q1, q2; bootstrap rows q3, q0. The teacher (zero-shot)
    # solves q0 only: one demo (q0: -> yes). Candidates on the dev rows: -3 zero-shot: q1, q2 answer no: 0;
    # -1 (the q0 demo): both see yes: 1; seed 0 (randint(1, 1) = 1, the same demo): 1 -> the first best, -1
    b = tr.strategy(ctx=tr.ctx, rows=tr.rows[:2], uids=[0, 1], group_offset=tr.ctx.allocate_groups(2),
                    budgets=None, temperatures=None)
    assert bt.history[0]["scores"] == [[-3, 0.0], [-1, 1.0], [0, 1.0]] and bt.history[0]["best"] == -1
    assert bt.history[0]["bootstrapped"] == 1 and bt.order == [1, 2, 3, 0]
    assert bt.demos == {"solve": [{"prompt": "q0:", "reply": "yes"}]}
    # the training rollout shows the demo in front of every call's prompt; every run now answers yes
    tok = tr.ctx.tokenizer
    shown = [tok.decode(b.prompt_ids[i][b.prompt_mask[i].bool()]) for i in range(b.num_rows)]
    assert shown == ["q0:yes\n\nq0:"] * 2 + ["q0:yes\n\nq1:"] * 2
    assert b.rewards[:, 0].tolist() == [1.0] * 4


def test_demos_checkpointed_and_resumed(tmp_path, monkeypatch):
    monkeypatch.setattr(lp, "sample_calls", fake_sample)
    args = run_args(tmp_path)
    tr = Trainer(Config.build(args), log=lambda *a: None)
    tr.train(progress=False)
    bt = tr.update_strategy.fn
    # 'p -> w -> p' with steps 1: the leading p, one step, the trailing p; the trailing p reshuffles the pool
    # twice (positions w and p): random.Random(2) continues [1, 2, 3, 0] -> ... (two more shuffles); whatever
    # its dev split, the q0 demo is kept or the zero-shot program scores as well as it
    assert bt.p_done == 2 and [h["strategy"] for h in bt.history] == ["p", "p -> w -> p"]
    rng = random.Random(2)
    order = [0, 1, 2, 3]
    for _ in range(3):
        rng.shuffle(order)
    assert bt.order == order
    saved = ckpt.read_state(ckpt.latest_checkpoint(tmp_path / "run"))["components"]["update/better_together"]
    assert saved["demos"] == bt.demos and saved["p_done"] == 2
    # resumed: the demos, the pool order, the RNG and the history come back from the checkpoint
    again = Trainer(Config.build(args), resume=True, log=lambda *a: None)
    bt2 = again.update_strategy.fn
    assert bt2.demos == bt.demos and bt2.order == bt.order and bt2.history == bt.history and bt2.p_done == 2
    assert bt2.rng.random() == bt.rng.random()


def test_config_errors_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="rollout_strategy lm_program"):
        Config.build({k: v for k, v in run_args(tmp_path).items() if k not in ("program", "reward_transforms")}
                     | {"rollout_strategy": "plain"})
    with pytest.raises(ConfigError, match="raise --steps"):
        Config.build({**run_args(tmp_path), "better_together_strategy": "w -> p -> w"})
