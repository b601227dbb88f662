"""PTA-GRPO (000-108): the pta_plans rollout (N reasonings per sampled plan) and the plan reward on its groups."""
import pytest
import torch

from grpolab.config import Config, ConfigError
from grpolab.data import completion_text, model_texts
from grpolab.generation.turns import Continuation
from grpolab.model.loading import load_policy
from grpolab.registry import ROLLOUT_STRATEGIES
from grpolab.rewards.scoring import parse_reward_spec
from grpolab.rollouts.context import RolloutContext
from grpolab.tasks import get_task

MAX_LEN = 40


@pytest.fixture(scope="module")
def parts():
    rows = get_task("arithmetic_multistep").train_rows[:4]
    model, tok = load_policy("tiny", task_texts=model_texts(rows) + ["<plan>\n1. add guess\n</plan>\nAnswer: -"],
                             seed=0, log=lambda *a: None)
    cfg = Config.build({"model": "tiny", "task": "arithmetic_multistep", "num_generations": 4,
                        "max_completion_length": MAX_LEN, "rollout_strategy": "pta_plans",
                        "pta_plans_per_prompt": 2, "pta_plan_max_tokens": 30})
    return cfg, model.eval(), tok, rows


def test_pta_plans_groups_and_plan_reward(parts, monkeypatch):
    cfg, model, tok, rows = parts
    ctx = RolloutContext(cfg, tok, rows, policy=model, scorer=None, generator=torch.Generator().manual_seed(0))
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    plan_a, plan_b = "<plan>\n1. add 4\n</plan>", "<plan>\n1. guess\n</plan>"
    a0, a1 = rows[0]["answer"], rows[1]["answer"]
    calls = []

    def fake_continue(contexts, *, max_new_tokens=None, temperature=None, stop_strings=(), **kw):
        calls.append((contexts, max_new_tokens, stop_strings))
        if len(calls) == 1:  # plans: 2 prompts x M = 2 -> A, B for each prompt
            texts = [plan_a, plan_b, plan_a, plan_b]
            reasons = ["stop_string"] * 4
        else:  # N = 2 reasonings per plan, in plan order
            texts = [f"\nAnswer: {a0}", f"\nAnswer: {a0}",            # prompt 0, plan A: 2 of 2 right
                     f"\nAnswer: {a0}", "\nAnswer: -1",                 # prompt 0, plan B: 1 of 2
                     "\nAnswer: -1", "\nAnswer: -1",                    # prompt 1, plan A: 0 of 2
                     f"\nAnswer: {a1}", "\nAnswer: -1"]                 # prompt 1, plan B: 1 of 2
            reasons = ["eos"] * 8
        ids = [enc(t) for t in texts]
        return Continuation(ids, [[-1.0] * len(x) for x in ids], reasons)

    monkeypatch.setattr(ctx, "continue_", fake_continue)
    ctx.new_step(1)
    b = ROLLOUT_STRATEGIES.get("pta_plans")(ctx=ctx, rows=rows[:2], uids=[0, 1], group_offset=0,
                                            pta_plans_per_prompt=2, pta_plan_max_tokens=30)
    assert b.num_rows == 8 and b.group_ids.tolist() == [0] * 4 + [1] * 4
    assert calls[0][2] == ["</plan>"] and calls[0][1] == 30
    # every reasoning is sampled after its prompt and its plan, within what the plan left of max_completion_length
    plan_ids = [enc(t) for t in (plan_a, plan_b, plan_a, plan_b)]
    for j, c in enumerate(calls[1][0]):
        assert c[-len(plan_ids[j // 2]):] == plan_ids[j // 2]
    assert calls[1][1] == [MAX_LEN - len(plan_ids[j // 2]) for j in range(8)]
    texts = [completion_text(c) for c in b.columns["completion"]]
    assert texts[0].startswith(plan_a) and texts[2].startswith(plan_b) and texts[5].startswith(plan_a)
    assert b.span_ids[0].max().item() == 2 and bool((b.completion_mask.sum(-1) > len(plan_ids[0])).all())
    # the plan reward: each plan's success rate over its own N = 2 reasonings
    fn = parse_reward_spec("pta_plan").fn
    out = fn(prompts=b.columns["prompt"], completions=b.columns["completion"], answer=b.columns["answer"])
    assert out == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.0, 0.0, 0.5, 0.5])


def test_pta_plans_plan_that_ends_the_reply(parts, monkeypatch):
    cfg, model, tok, rows = parts
    ctx = RolloutContext(cfg, tok, rows, policy=model, scorer=None, generator=torch.Generator().manual_seed(0))
    seen = []

    def fake_continue(contexts, *, max_new_tokens=None, **kw):
        seen.append(max_new_tokens)
        n = len(contexts)
        if len(seen) == 1:
            return Continuation([[5, 6]] * n, [[-1.0, -1.0]] * n, ["eos", "length"])
        return Continuation([[7] if m else [] for m in max_new_tokens], [[-1.0] if m else [] for m in max_new_tokens],
                            ["eos" if m else "length" for m in max_new_tokens])

    monkeypatch.setattr(ctx, "continue_", fake_continue)
    ctx.new_step(1)
    b = ROLLOUT_STRATEGIES.get("pta_plans")(ctx=ctx, rows=rows[:1], uids=[0], group_offset=0,
                                            pta_plans_per_prompt=2, pta_plan_max_tokens=30)
    assert seen[1] == [0, 0, MAX_LEN - 2, MAX_LEN - 2]  # an EOS-ended plan gets no reasoning
    assert b.completion_mask.sum(-1).tolist() == [2, 2, 3, 3]


def test_pta_plans_checks_the_split():
    with pytest.raises(ConfigError, match="multiple of"):
        Config.build({"rollout_strategy": "pta_plans", "num_generations": 4, "pta_plans_per_prompt": 3})
