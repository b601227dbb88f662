"""The LLM strategy selector of the multi-head diffusion planner (seed 000-55, policies/ddpm_planner/selector.py).

Expected values are re-derived here: the choice from a direct forward of the language model (log-softmax of the
next-token logits after the chat-templated question), the evaluation from the fixed-head trajectories and the
reward formulas written out by hand; never from the selector's own scoring.
"""
import math

import numpy as np
import pytest
import torch

from grpolab.config import Config
from grpolab.policies import POLICIES
from grpolab.policies.ddpm_planner.selector import (INSTRUCTIONS, StrategySelector, describe_scene,
                                                   evaluate_selection, head_trajectories, instruction_reward)
from grpolab.policies.ddpm_planner.tasks import toy_planner

ROW = {"start": [-1.0, 0.1], "goal": [1.0, -0.3], "obstacle": [0.2, 0.05, 0.15]}


@pytest.fixture(scope="module")
def tiny_selector():
    return StrategySelector.load("tiny")


@pytest.fixture(scope="module")
def planner():
    cfg = Config.build({"policy": "ddpm_planner", "model": "planner", "task": "toy_planner"})
    policy = POLICIES.get("ddpm_planner")(model="planner")
    task = toy_planner(n_scenes=2, n_eval_scenes=3)
    module = policy.load(cfg, task.train_rows, task.eval_rows, log=lambda *a: None)
    rows = [r for r in task.eval_rows if r["head"] == 0]  # one row per scene
    return policy, module, rows


def test_scene_description():
    q = describe_scene(ROW, "Please hurry.")
    assert q.startswith("Scene: the car starts at (-1.00, 0.10) and must reach (1.00, -0.30); an obstacle of "
                        "radius 0.15 is at (0.20, 0.05).\nInstruction: Please hurry.\n")
    assert q.endswith("Answer with one word: fast or safe.")


def test_selector_chooses_the_most_likely_name(tiny_selector):
    sel = tiny_selector
    tok, lm = sel.tokenizer, sel.model
    for text, _ in (INSTRUCTIONS[0], INSTRUCTIONS[3]):
        q = describe_scene(ROW, text)
        ids = tok(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                          add_generation_prompt=True), add_special_tokens=False)["input_ids"]
        want = []
        for name in ("fast", "safe"):  # the tiny tokenizer: one token per character, summed over the name
            ans = tok(name, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                lp = torch.log_softmax(lm(input_ids=torch.tensor([ids + ans])).logits[0].float(), -1)
            want.append(sum(float(lp[len(ids) - 1 + j, a]) for j, a in enumerate(ans)))
        got = sel.scores(q)
        assert got == pytest.approx(want, abs=1e-4)
        head, probs = sel.choose(q)
        assert head == int(np.argmax(want))
        z = [math.exp(w - max(want)) for w in want]
        assert probs == pytest.approx([v / sum(z) for v in z], abs=1e-5)


def test_evaluation_against_fixed_heads(planner):
    policy, module, rows = planner
    traj = head_trajectories(policy, module, rows, 2)
    # the instruction rewards written out: fast = ((p_8 - s) . u) / 8, u = (g - s) / |g - s|;
    # safe = min(min_k |p_k - o| - rho, 0.25) - 10 mean_k |D_{k+1} - D_k|^2
    p, row = traj[1][0].astype(np.float64), rows[0]
    s, g, o = np.array(row["start"]), np.array(row["goal"]), np.array(row["obstacle"])
    u = (g - s) / np.linalg.norm(g - s)
    assert instruction_reward(traj[1][0], row, 0) == pytest.approx(float((p[-1] - s) @ u) / 8)
    d = np.diff(np.vstack([s, p]), axis=0)
    safe = min(float(np.min(np.linalg.norm(p - o[:2], axis=1)) - o[2]), 0.25) - 10 * float(
        np.mean(np.sum(np.diff(d, axis=0) ** 2, 1)))
    assert instruction_reward(traj[1][0], row, 1) == pytest.approx(safe)

    def per_pair(h_of):  # mean over scenes x instructions of the instruction's reward of head h_of(text, want)
        return float(np.mean([instruction_reward(traj[h_of(t, w)][i], r, w) for i, r in enumerate(rows)
                              for t, w in INSTRUCTIONS]))

    keyword = lambda q: 0 if any(k in q for k in ("hurry", "quickly", "rush")) else 1  # noqa: E731
    out = evaluate_selection(policy, module, rows, keyword)
    assert out["selection_accuracy"] == 1.0 and out["choices"] == [[0, 0, 0, 1, 1, 1]] * len(rows)
    assert out["reward_llm"] == pytest.approx(out["reward_oracle"]) == pytest.approx(per_pair(lambda t, w: w))
    assert out["reward_fixed_0"] == pytest.approx(per_pair(lambda t, w: 0))
    assert out["reward_fixed_1"] == pytest.approx(per_pair(lambda t, w: 1))
    always_fast = evaluate_selection(policy, module, rows, lambda q: 0)
    assert always_fast["selection_accuracy"] == 0.5
    assert always_fast["reward_llm"] == pytest.approx(out["reward_fixed_0"])
    with pytest.raises(ValueError, match="heads 0..1"):
        evaluate_selection(policy, module, rows[:1], lambda q: 2)


def test_llm_selector_in_the_evaluation(planner, tiny_selector):
    """The tiny LM as the selector: its choices are its own argmax (a mechanics check; the tiny LM is random)."""
    policy, module, rows = planner
    out = evaluate_selection(policy, module, rows[:1], lambda q: tiny_selector.choose(q)[0], INSTRUCTIONS[:2])
    want = [tiny_selector.choose(describe_scene(rows[0], t))[0] for t, _ in INSTRUCTIONS[:2]]
    assert out["choices"] == [want]
    assert out["selection_accuracy"] == pytest.approx(np.mean([h == w for h, (_, w) in zip(want, INSTRUCTIONS)]))
