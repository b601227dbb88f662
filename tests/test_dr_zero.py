"""Dr. Zero (seed 000-110): the proposer's reward and question parser, the alternation of the roles, HRPO's hop
clusters and a run through both phases on the tiny model."""
from types import SimpleNamespace

import pytest
import torch

import grpolab.agents.rollout as agent_rollout
from grpolab.algorithms.agentic import dr_zero_hrpo, hrpo
from grpolab.catalog import parse_provenance
from grpolab.config import Config, ConfigError
from grpolab.generation.turns import Continuation
from grpolab.recipes import recipe_overrides
from grpolab.rollouts import dr_zero as dz
from grpolab.tasks import get_task
from grpolab.tasks.dr_zero_docs import (difficulty_score, dr_zero_docs, dr_zero_reward, parse_proposal,
                                        proposal_of, proposer_format, proposer_reward)
from grpolab.train.trainer import Trainer

EPS = 1e-4
AUTHORS = "https://github.com/facebookresearch/drzero"


def test_difficulty_by_hand():
    # the authors' compute_difficulty_score: (n - k) / (n - 1) for 0 < k < n, else 0
    five = [[1] * k + [0] * (5 - k) for k in range(6)]
    assert [difficulty_score(h) for h in five] == [0.0, 1.0, 0.75, 0.5, 0.25, 0.0]  # 4/4, 3/4, 2/4, 1/4
    assert difficulty_score([0, 1]) == 1.0 and difficulty_score([1, 1, 0]) == 0.5  # (2-1)/1; (3-2)/2
    assert difficulty_score([0.0, 1.0, 0.0]) == 1.0  # order does not matter: (3-1)/2
    with pytest.raises(ValueError, match="at least 2 solver samples"):
        difficulty_score([1])


def test_question_parser_and_hop_counts():
    text = "<think>plan</think> <question> Where was Anna Pold born? </question>\n<answer> Brenn </answer>"
    assert parse_proposal(text) == ("Where was Anna Pold born?", "Brenn")
    # the last of each, as the authors' findall(...)[-1]; a missing part is empty
    assert parse_proposal("<question>a?</question><question>b?</question><answer>x</answer><answer>y</answer>") \
        == ("b?", "y")
    assert parse_proposal("<question>only a question?</question>") == ("only a question?", "")
    assert parse_proposal("Answer: 3") == ("", "")
    # the proposer's rows: the hop count in the prompt is the row's 'hops'; drawn 4:3:2:1 over 1..4
    task = dr_zero_docs(dr_zero_eval=5)
    assert len(task.eval_rows) == 5 and all(r["role"] == "solver" and r["answer"] for r in task.eval_rows)
    counts = {h: 0 for h in (1, 2, 3, 4)}
    for r in task.train_rows:
        assert r["role"] == "proposer" and r["answer"] == ""
        assert r["prompt"][-1]["content"].startswith(f"n = {r['hops']}\nSource document: {r['document']}")
        assert r["document"].startswith(f"(Title: {r['title']})\n")
        counts[r["hops"]] += 1
    assert counts[1] > counts[2] > counts[3] > counts[4] > 0, counts
    only = dr_zero_docs(dr_zero_hop_ratio=[0, 1], dr_zero_eval=1)
    assert {r["hops"] for r in only.train_rows} == {2}
    with pytest.raises(ConfigError, match="dr_zero_hop_ratio"):
        dr_zero_docs(dr_zero_hop_ratio=[0, 0])


DOC = "(Title: Anna Pold)\nAnna Pold is a baker who was born in the city of Brenn."
FINAL = "<think>done</think><question>In which country was Anna Pold born?</question><answer>Oster</answer>"
HIT = ("search", True, "Brenn is a city in Oster.")


def test_proposer_reward_by_hand():
    # f = (1 + think + tool + answer) / 4; reward = 0.5 f + (n - k)/(n - 1)
    # A: 2 hops, both turns think, 1 good search (tool min((1+1)/2, 1) = 1), 'oster' in the search result (1 word: 1)
    turns = ["<think>city first</think><tool_call>...</tool_call>", FINAL]
    f = proposer_format(turns, [HIT], 2, DOC, FINAL)
    assert f == 1.0
    assert proposer_reward(f, [1, 0, 0, 0, 0]) == 1.5  # 0.5 + 4/4
    # B: 3 hops, one search: tool 2/3; think 1 of 2 turns; f = (1 + 0.5 + 2/3 + 1)/4 = 0.7916667; k = 3 of 5: 0.5
    f = proposer_format(["no think", FINAL], [HIT], 3, DOC, FINAL)
    assert f == pytest.approx((1 + 0.5 + 2 / 3 + 1) / 4)
    assert proposer_reward(f, [1, 1, 1, 0, 0]) == pytest.approx(0.5 * 0.7916667 + 0.5)
    # C: 2 hops, no search: tool 0, and 'oster' is not in the document alone: answer 0; f = (1+1+0+0)/4 = 0.5;
    # solved by every sample: difficulty 0 (trivial), reward 0.25
    f = proposer_format([FINAL], [], 2, DOC, FINAL)
    assert f == 0.5 and proposer_reward(f, [1] * 5) == 0.25
    # D: a failed call among two: the searches do not count (tool 0 for 2 hops, results unread): f = 0.5
    assert proposer_format(turns, [HIT, ("search", False, "Error")], 2, DOC, FINAL) == 0.5
    # E: 1 hop, no search (tool 1), no think, a 7-word answer found in the document (0.5): f = (1+0+1+0.5)/4
    final = "<question>What does the entry say?</question><answer>baker who was born in city of</answer>"
    f = proposer_format([final], [], 1, DOC, final)
    assert f == 0.625 and proposer_reward(f, [0] * 5) == 0.3125  # unsolved by every sample: difficulty 0
    # F: not whole: the answer inside the question, or a part missing: f = 0, reward 0 whatever the solver did
    leak = "<question>Is Brenn in Oster?</question><answer>Oster</answer>"
    assert proposer_format([leak], [HIT], 2, DOC, leak) == 0.0 and proposer_reward(0.0, [1, 0]) == 0.0
    assert proposer_format(["<answer>Oster</answer>"], [HIT], 2, DOC, "<answer>Oster</answer>") == 0.0
    # the task's reward function, by role: the proposer's from its episode record, the solver's exact match
    episode = {"turns": [{"text": turns[0], "tool_calls": [{"name": "search", "arguments": {"query": "Brenn"},
                                                            "output": HIT[2], "error": None}]},
                         {"text": FINAL, "tool_calls": []}]}
    assert proposal_of(episode, 2, DOC, FINAL) == ("In which country was Anna Pold born?", "Oster", 1.0)
    got = dr_zero_reward(completions=[FINAL, "Answer: oster", "Answer: Brenn"], role=["proposer", "solver", "solver"],
                         answer=["", "Oster", "Oster"], hops=[2, 2, 2], document=[DOC, "", ""],
                         episode=[episode, None, None], dr_zero_hits=[[0, 1, 1, 1, 1], None, None])
    assert got == [0.5 + 0.25, 1.0, 0.0]  # 0.5 x 1 + (5-4)/4; exact match; wrong


def test_alternation_schedule():
    assert [dz.phase(t, 2) for t in range(8)] == ["proposer", "proposer", "solver", "solver"] * 2
    assert [dz.phase(t, 1) for t in range(4)] == ["proposer", "solver"] * 2
    assert {dz.phase(t, 10) for t in range(10)} == {"proposer"} and dz.phase(10, 10) == "solver"
    for bad, msg in (({"dr_zero_solver_samples": 1}, "dr_zero_solver_samples must be >= 2"),
                     ({"dr_zero_steps_per_phase": 0}, "dr_zero_steps_per_phase must be >= 1"),
                     ({"role_adapters": "lora"}, "needs use_lora: true"),
                     ({"dr_zero_solver_groups": "prompt"}, "dr_zero_solver_groups")):
        with pytest.raises(ConfigError, match=msg):
            Config.build({**recipe_overrides("dr_zero"), "use_lora": False, "role_adapters": "shared", **bad})


def _batch(hops, roles):
    return SimpleNamespace(columns={"hops": hops, "role": roles})


def test_hrpo_groups_by_hop_count():
    # proposer rows: one cluster per hop count over the batch. hop 1: [1.5, 0.5], mean 1, Bessel std sqrt(0.5);
    # hop 2: [1.0, 0.0], mean 0.5, std sqrt(0.5); hop 3: one row, mean 0 and std 1 (the authors' singleton rule)
    r = torch.tensor([1.5, 0.5, 1.0, 0.0, 0.8])
    b = _batch([1, 1, 2, 2, 3], ["proposer"] * 5)
    s = 0.5 ** 0.5
    want = torch.tensor([0.5 / (s + EPS), -0.5 / (s + EPS), 0.5 / (s + EPS), -0.5 / (s + EPS), 0.8 / (1 + EPS)])
    a = dr_zero_hrpo(r, torch.tensor([0, 1, 2, 3, 4]), b)
    assert torch.allclose(a, want, atol=1e-6)
    assert torch.allclose(a[:4], hrpo(r, torch.arange(5), b)[:4], atol=1e-6)  # clusters of 2+: hrpo's
    # solver rows of hop 2: per question (groups 7, 8) or per hop count over the batch
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    b = _batch([2, 2, 2, 2], ["solver"] * 4)
    g = torch.tensor([7, 7, 8, 8])
    q = dr_zero_hrpo(r, g, b, dr_zero_solver_groups="question")
    assert torch.allclose(q, torch.tensor([0.5 / (s + EPS), -0.5 / (s + EPS), 0.0, 0.0]), atol=1e-6)
    h = dr_zero_hrpo(r, g, b, dr_zero_solver_groups="hops")  # mean 0.25; std sqrt((0.75^2 + 3 x 0.25^2)/3) = 0.5
    assert torch.allclose(h, torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + EPS), atol=1e-6)
    # a NaN (unscored) row gets 0 and leaves the statistics; proposer and solver rows never share a cluster
    r = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    a = dr_zero_hrpo(r, torch.tensor([0, 1, 2, 2]), _batch([1, 1, 1, 1], ["proposer", "proposer", "solver", "solver"]),
                     dr_zero_solver_groups="hops")
    assert torch.allclose(a, torch.tensor([1 / (1 + EPS), 0.0, -0.5 / (s + EPS), 0.5 / (s + EPS)]), atol=1e-6)
    with pytest.raises(ValueError, match="column 'role'"):
        dr_zero_hrpo(r, torch.arange(4), SimpleNamespace(columns={"hops": [1] * 4}))


def scripted_roles(right_every=2, proposal="<think>a</think><question>Is it true?</question><answer>yes</answer>",
                   by_position=False):
    """A scripted policy: the proposer (its prompt shows a source document) always writes ``proposal``; the solver
    answers 'yes' on every ``right_every``-th of its calls and 'no' otherwise (``by_position``: 'yes' in the even
    positions of each batched call, so a resumed run is scripted as the uninterrupted one)."""
    state = {"solver": 0, "proposer": 0}

    def sample(ctx, contexts, max_new_tokens, temperatures, stop_strings, model=None):
        out = []
        for j, c in enumerate(contexts):
            if "Source document:" in ctx.tokenizer.decode(c):
                state["proposer"] += 1
                out.append(proposal)
            else:
                state["solver"] += 1
                right = j % 2 == 0 if by_position else state["solver"] % right_every == 0
                out.append("Answer: yes" if right else "Answer: no")
        ids = [ctx.tokenizer(t, add_special_tokens=False)["input_ids"] for t in out]
        return Continuation(ids, [[-1.0] * len(a) for a in ids], ["eos"] * len(ids))
    sample.state = state
    return sample


def _lora(model, role):
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{role}." in n and "lora_" in n}


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_alternating_run_trains_one_role_per_step_and_resumes_exactly(tiny_args, monkeypatch, tmp_path):
    """3 steps, one per phase (proposer, solver, proposer): each step moves its role's LoRA adapter only; the
    frozen role keeps its weights to the bit. 2 steps then a resume from the step-2 checkpoint end with the same
    adapters as the 3 straight steps. Evaluation plays the solver on held-out search_qa questions."""
    fake = scripted_roles(by_position=True)
    monkeypatch.setattr(agent_rollout, "sample_turns", fake)
    base = {**recipe_overrides("dr_zero"), **tiny_args, "task": "dr_zero_docs", "prompts_per_step": 2,
            "num_generations": 2, "dr_zero_steps_per_phase": 1, "dr_zero_solver_samples": 3, "max_turns": 2,
            "lora_target_modules": "q_proj,v_proj", "policy_loss": "policy_gradient", "learning_rate": 3e-2,
            "dr_zero_eval": 3, "save_steps": 2, "dtype": "float32"}
    a = Trainer(Config.build({**base, "steps": 3, "eval_after": True, "out": str(tmp_path / "a")}),
                log=lambda *x: None)
    assert sorted(a.model.peft_config) == ["proposer", "solver"]
    snaps, metrics = [(_lora(a.model, "proposer"), _lora(a.model, "solver"))], []
    step = a.train_step

    def recorded():
        metrics.append(step())
        snaps.append((_lora(a.model, "proposer"), _lora(a.model, "solver")))
        return metrics[-1]
    a.train_step = recorded
    summary = a.train(progress=False)
    for t in range(3):
        (p0, s0), (p1, s1) = snaps[t], snaps[t + 1]
        trained = "proposer" if t % 2 == 0 else "solver"
        assert metrics[t]["rollout/dr_zero/phase"] == float(t % 2)
        assert _same(s0, s1) != (trained == "solver") and _same(p0, p1) != (trained == "proposer"), t
    # step 0: 2 questions x 3 solver samples (not trained); step 1: 2 questions x num_generations 2 (trained)
    assert metrics[0]["rollout/dr_zero/valid_questions"] == 1.0
    assert metrics[0]["rollout/dr_zero/solver_success"] == 0.5  # 'yes' at positions 0, 2, 4 of 6
    assert fake.state["proposer"] == 3 * 2  # 2 documents a step; in the solver step the frozen proposer's
    assert fake.state["solver"] == 6 + 4 + 6 + 3  # and 3 held-out questions, one greedy episode each
    assert {"accuracy", "lenient_accuracy"} <= set(summary["after"]), summary["after"]
    Trainer(Config.build({**base, "steps": 2, "out": str(tmp_path / "b")}), log=lambda *x: None).train(progress=False)
    c = Trainer(Config.build({**base, "steps": 3, "out": str(tmp_path / "b")}), resume=True, log=lambda *x: None)
    assert c.step == 2  # resumed from the step-2 checkpoint: step 2 (a proposer step) runs again
    c.train(progress=False)
    pa, pc = dict(a.model.named_parameters()), dict(c.model.named_parameters())
    assert all(torch.equal(v, pc[k]) for k, v in pa.items())


def test_rows_roles_and_rewards_of_each_phase(tiny_args, monkeypatch, tmp_path):
    monkeypatch.setattr(agent_rollout, "sample_turns", scripted_roles(right_every=3))
    args = {**recipe_overrides("dr_zero"), **tiny_args, "task": "dr_zero_docs", "prompts_per_step": 2,
            "num_generations": 2, "dr_zero_steps_per_phase": 1, "dr_zero_solver_samples": 3, "max_turns": 2,
            "lora_target_modules": "q_proj,v_proj", "dr_zero_eval": 2}
    tr = Trainer(Config.build(args), log=lambda *a: None)

    def step(t):
        tr.ctx.new_step(t)
        return tr.strategy(ctx=tr.ctx, rows=tr.rows[:2], uids=[0, 1], group_offset=tr.ctx.allocate_groups(2),
                           budgets=None, temperatures=None)
    b = step(0)  # proposer: one row per document, its hops; the solver asked 3 times per question
    assert b.columns["role"] == ["proposer"] * 2 and b.row_data["role"].tolist() == [0, 0]
    assert b.columns["hops"] == [r["hops"] for r in tr.rows[:2]] and b.group_ids.tolist() == [0, 1]
    assert b.columns["dr_zero_hits"] == [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]  # 'yes' on the 3rd, 6th call
    fmt = [(1 + 1 + (1.0 if h == 1 else 0.0) + 1) / 4 for h in b.columns["hops"]]  # think, tool, 'yes' (1 word)
    assert b.rewards[:, 0].tolist() == pytest.approx([0.5 * f + 1.0 for f in fmt])  # (3 - 1)/(3 - 1) = 1
    b = step(1)  # solver: the proposer's question and answer, num_generations episodes per question
    assert b.columns["role"] == ["solver"] * 4 and b.row_data["role"].tolist() == [1] * 4
    assert b.columns["answer"] == ["yes"] * 4 and b.columns["question"] == ["Is it true?"] * 4
    assert b.group_ids.tolist() == [0, 0, 1, 1] and b.prompt_uids.tolist() == [0, 0, 1, 1]
    assert b.rewards[:, 0].tolist() == [0.0, 0.0, 1.0, 0.0]  # solver calls 7..10 after 6 in step 0: right on 9
    # a proposer that writes no valid question leaves the solver nothing: no batch (the trainer skips the step),
    # and a warning that names the fix
    monkeypatch.setattr(agent_rollout, "sample_turns", scripted_roles(proposal="<question>yes?</question>"))
    logged = []
    monkeypatch.setattr(tr.ctx, "log", logged.append)
    assert step(1) is None
    assert any("no question that passes the format check" in line and "skipped" in line for line in logged)
    tr.rows[0] = {k: v for k, v in tr.rows[0].items() if k != "document"}  # data without the proposer's document
    with pytest.raises(ConfigError, match="needs the column.s. document"):
        step(0)


def test_provenance_names_the_authors_code():
    from grpolab.registry import ADVANTAGES, ROLLOUT_STRATEGIES, TASKS
    for fn in (ROLLOUT_STRATEGIES.get("dr_zero"), ADVANTAGES.get("dr_zero_hrpo"), TASKS.get("dr_zero_docs"),
               difficulty_score, proposer_format):
        p = parse_provenance(fn.__doc__)
        assert p["kind"] == "authors' code" and p["url"] == AUTHORS, fn
    rec = recipe_overrides("dr_zero")
    assert (rec["rollout_strategy"], rec["advantage"], rec["task"]) == ("dr_zero", "dr_zero_hrpo", "dr_zero_docs")
    assert get_task("dr_zero_docs", dr_zero_eval=3).rewards[0][0] == "dr_zero"
