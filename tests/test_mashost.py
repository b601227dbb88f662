"""MasHost (seed 000-22): the construction episode (task and rollout ``mas_build``), the built system's reward,
HRPO's advantage (``mashost_hrpo``) and the recipe ``mashost``."""
import json
from types import SimpleNamespace

import pytest
import torch

from grpolab.algorithms.adv_actionwise import ACTION_REWARD, mashost_hrpo
from grpolab.algorithms.advantages import combine_rewards, group_zscore
from grpolab.config import Config, ConfigError
from grpolab.recipes import recipe_overrides
from grpolab.rollouts.mas_build import mark_actions
from grpolab.tasks import get_task
from grpolab.tasks.mas_build import parse_construction, run_system
from grpolab.train.trainer import Trainer

EPS = 1e-4
GOLD = "agent 1: extract <- [query]\nagent 2: add <- [1]\nagent 3: answer <- [2]\nend"


def test_construction_lines_are_parsed_with_their_faults():
    text = ("agent 1: extract <- [query]\n\nagent 2: add <- [1]\nagent 2: max <- [1]\nagent 3: answer <- [2]\n"
            "hello world\nend\nagent 9: add <- [1]")
    con = parse_construction(text)
    # blank line 2 is no action; line 4 reuses number 2 (out of order, not in the system); line 6 is malformed;
    # line 8 comes after end and is ignored
    assert [a.line for a in con.actions] == [1, 3, 4, 5, 6, 7]
    assert [a.kind for a in con.actions] == ["agent", "agent", "agent", "agent", "malformed", "end"]
    assert [a.faults for a in con.actions] == [[], [], ["out of order"], [], ["malformed"], []]
    assert [a.reward for a in con.actions] == [0.0, 0.0, -1.0, 0.0, -1.0, 0.0]
    assert (con.n_agents, con.n_edges, con.malformed, con.irrational, con.ended) == (3, 3, 1, 2, True)
    assert con.agents == {1: ("extract", ["query"]), 2: ("add", [1]), 3: ("answer", [2])}

    bad = ("agent 1: extract <- [query, 1]\n"   # 1 is itself: nonexistent (link dropped)
           "agent 2: add <- [query, 1, 1]\n"    # 1 twice; the query goes only to extract
           "Agent 3: ADD <- 2\n"                # a second add (case and brackets are free)
           "agent 4: juggle <- [3]\n"           # not on the menu: no agent
           "agent 4: answer <- [3, 5]\n"        # 5 does not exist (dropped): one input left
           "agent 5: verify <- [4]\n"           # after the answer, and nobody listens to it
           "end")
    con = parse_construction(bad)
    assert [a.faults for a in con.actions] == [
        ["nonexistent input"], ["repeated input", "query to a non-extract"], ["duplicate role"],
        ["unknown role"], ["nonexistent input"], ["after the answer", "output unused"], []]
    # system: 5 agents; links: 1 <- query; 2 <- query, 1; 3 <- 2; 4 <- 3; 5 <- 4  = 6
    assert (con.n_agents, con.n_edges, con.irrational, con.malformed) == (5, 6, 6, 0)
    # 2 + 3: extract [2, 3] -> add 5 (the query link is ignored) -> add 5 -> answer 5
    assert run_system(con, "What is 2 + 3?") == 5

    # no end, an empty input list (so nobody listens to extract), an input that is no agent number: malformed;
    # the end without an answer
    con = parse_construction("agent 1: extract <- [query]\nagent 2: max <- []\nagent 3: answer <- [two]")
    assert [a.faults for a in con.actions] == [["output unused"], ["no input agent", "output unused"], ["malformed"]]
    assert not con.ended and run_system(con, "Which is the largest of 3 and 4?") is None
    con = parse_construction("agent 1: extract <- [query]\nend")
    assert con.actions[-1].faults == ["no answer agent"] and con.actions[0].faults == ["output unused"]
    assert parse_construction("").actions == []


def test_a_hand_written_system_earns_accuracy_minus_its_costs():
    task = get_task("mas_build", mas_build_rows=20, mas_build_eval=5)
    assert (len(task.train_rows), len(task.eval_rows)) == (15, 5)
    assert [(n, w) for n, _, w in task.rewards] == [("accuracy", 1.0), ("agents", -0.05), ("edges", -0.02),
                                                     ("irrational", 0.0)]
    q = "What is 4 + 9 + 2?"
    texts = [GOLD,
             GOLD.replace("add", "max"),                                    # the wrong operation: 9, not 15
             "agent 1: extract <- [query]\nagent 2: add <- [1]\nagent 3: verify <- [2]\nagent 4: answer <- [3]\nend",
             "agent 1: extract <- [query]\nagent 2: add <- [1]\nend",     # no answer agent
             "nothing useful"]
    cols = [fn(completions=texts, question=[q] * 5, answer=["15"] * 5) for _, fn, _ in task.rewards]
    matrix = torch.tensor(cols).T
    assert matrix.tolist() == [[1, 3, 3, 0], [0, 3, 3, 0], [1, 4, 4, 0], [0, 2, 2, 2], [0, 0, 0, 1]]
    R = combine_rewards(matrix, torch.tensor([w for _, _, w in task.rewards]))
    # 1 - 3(0.05) - 3(0.02) = 0.79; 0 - 0.21; 1 - 4(0.05) - 4(0.02) = 0.72; -2(0.05) - 2(0.02) = -0.14; 0
    assert R.tolist() == pytest.approx([0.79, -0.21, 0.72, -0.14, 0.0])
    # the costs are the task's parameters
    cheap = get_task("mas_build", mas_build_rows=20, mas_build_eval=5, mas_build_agent_cost=0.1,
                     mas_build_edge_cost=0.0)
    assert [w for _, _, w in cheap.rewards] == [1.0, -0.1, -0.0, 0.0]
    # every row's gold system is right and earns 0.79; the three operations all occur
    rows = task.train_rows + task.eval_rows
    for r in rows:
        gold = GOLD.replace("add", r["op"])
        assert run_system(parse_construction(gold), r["question"]) == int(r["answer"])
    assert {r["op"] for r in get_task("mas_build").train_rows} == {"add", "multiply", "max"}


def hrpo_batch(action_rewards):
    return SimpleNamespace(step_data={ACTION_REWARD: torch.tensor(action_rewards, dtype=torch.float32)})


def test_hrpo_advantage_by_hand():
    rewards = torch.tensor([0.79, -0.21, -0.21, -0.21, 0.5, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    # per token: the reward of the token's action (0 rational, -1 irrational, 0 off every action)
    act = [[0, 0, 0, 0], [-1, -1, 0, 0], [0, -1, -1, 0], [-1, -1, -1, -1], [0, 0, -1, 0], [0, 0, 0, 0]]
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]],
                        dtype=torch.float32)
    adv = mashost_hrpo(rewards, groups, mask, hrpo_batch(act), mashost_action_weight=0.5)
    # group 0: mean 0.04, deviations 0.75, -0.25 x3; Bessel var (0.5625 + 3 x 0.0625) / 3 = 0.25, std 0.5
    hi, lo = 0.75 / (0.5 + EPS), -0.25 / (0.5 + EPS)
    # group 1: equal rewards, trajectory term 0
    want = torch.tensor([[hi, hi, hi, 0],
                         [lo - 0.5, lo - 0.5, lo, lo],
                         [lo, lo - 0.5, lo - 0.5, lo],
                         [lo - 0.5] * 4,
                         [0, 0, -0.5, 0],
                         [0, 0, 0, 0]])
    assert torch.allclose(adv, want, atol=1e-6)
    # lambda = 0, or every action rational: GRPO's z-score on every token
    z = group_zscore(rewards, groups)[:, None] * mask
    assert torch.allclose(mashost_hrpo(rewards, groups, mask, hrpo_batch(act), mashost_action_weight=0.0), z)
    assert torch.allclose(mashost_hrpo(rewards, groups, mask, hrpo_batch([[0] * 4] * 6)), z)
    with pytest.raises(ConfigError, match="needs batch.step_data\\['action_reward'\\]"):
        mashost_hrpo(rewards, groups, mask, SimpleNamespace(step_data={}))


def _tiny_tokenizer():
    from grpolab.model.loading import load_policy
    rows = get_task("mas_build", mas_build_rows=20, mas_build_eval=5).train_rows
    texts = [m["content"] for r in rows for m in r["prompt"]] + ["oops more x"]
    return load_policy("tiny", task_texts=texts, log=lambda *a: None)[1]


def test_actions_are_marked_on_their_lines():
    tok = _tiny_tokenizer()
    texts = [GOLD, "oops\n\nagent 1: add <- [query]\nend\nmore"]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    T = max(map(len, ids)) + 2
    completion_ids, mask = torch.zeros(2, T, dtype=torch.long), torch.zeros(2, T)
    for i, seq in enumerate(ids):
        completion_ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
    batch = SimpleNamespace(completion_ids=completion_ids, completion_mask=mask, span_ids=torch.zeros(2, T),
                            step_data={}, columns={"completion": texts})
    stats = mark_actions(batch, tok)
    # row 0: four rational actions on lines 1-4; row 1: line 1 malformed, line 3 add fed by the query (no agent
    # input, unused), line 4 end without an answer: all -1; line 2 (blank) and line 5 (after end) no action
    line_reward = [{1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}, {1: -1.0, 3: -1.0, 4: -1.0}]
    for i, seq in enumerate(ids):
        for t in range(T):
            if t >= len(seq):
                assert batch.span_ids[i, t] == 0 and batch.step_data[ACTION_REWARD][i, t] == 0
                continue
            # the line of the token's first character, from the text's character offsets
            line = texts[i][:len(tok.decode(seq[:t]))].count("\n") + 1
            assert batch.span_ids[i, t] == (line if line in line_reward[i] else 0)
            assert batch.step_data[ACTION_REWARD][i, t] == line_reward[i].get(line, 0.0)
    assert stats == {"malformed_lines": 0.5, "irrational_actions": 1.5, "actions": 3.5, "agents": 2.0,
                     "edges": 2.0, "ended": 1.0}


def test_mashost_refuses_a_rollout_without_actions_and_bad_settings():
    with pytest.raises(ConfigError, match="mashost_hrpo needs the per-action rewards that rollout_strategy "
                                          "mas_build writes; got rollout_strategy: plain"):
        Config.build({"advantage": "mashost_hrpo", "rollout_strategy": "plain"})
    with pytest.raises(ConfigError, match="mashost_action_weight: expected a weight >= 0"):
        Config.build({**recipe_overrides("mashost"), "mashost_action_weight": -1})
    with pytest.raises(ConfigError, match="mas_build_eval"):
        get_task("mas_build", mas_build_rows=10, mas_build_eval=10)
    with pytest.raises(ConfigError, match="mas_build_edge_cost: expected a cost >= 0"):
        get_task("mas_build", mas_build_edge_cost=-0.1)


def test_mashost_step_on_scripted_systems_then_trains(tiny_args, tmp_path, monkeypatch):
    """One step of the recipe on scripted constructions (rewards and advantages by hand), then a 2-step run
    on the tiny model's own samples."""
    from grpolab.generation.plain import pack_completions
    args = {**recipe_overrides("mashost"), **tiny_args, "task": "mas_build", "prompts_per_step": 1,
            "num_generations": 2, "max_completion_length": 24, "mas_build_rows": 12, "mas_build_eval": 2, "steps": 2,
            "out": str(tmp_path / "run")}
    tr = Trainer(Config.build(args), log=lambda *a: None)
    row = next(r for r in tr.rows if r["op"] == "max")
    texts = [GOLD.replace("add", "max"), "agent 1: extract <- [query]\nagent 2: add <- [1]\nend"]

    def scripted(rows, uids, *, group_offset, num_generations=None, temperature=None, model=None):
        tok = tr.ctx.tokenizer
        seqs = [tok.encode(t, add_special_tokens=False) for t in texts]
        T = max(map(len, seqs))
        ids = torch.full((2, T), tok.pad_token_id)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
        prompt = torch.tensor([tok.encode("q", add_special_tokens=False)])
        return pack_completions(tok, rows, uids, prompt, torch.ones_like(prompt), [2], ids, torch.zeros(2, T),
                                torch.tensor([len(s) for s in seqs]), torch.zeros(2, dtype=torch.bool),
                                group_offset=group_offset)

    monkeypatch.setattr(tr.ctx, "generate", scripted)
    tr.ctx.new_step()
    b = tr.strategy(ctx=tr.ctx, rows=[row], uids=[0], group_offset=tr.ctx.allocate_groups(1), budgets=None,
                    temperatures=None)
    tr.scorer.score(b)
    b.scalar_rewards = tr.scorer.scalar(b, step=0)
    # system 0 is right: 1 - 0.15 - 0.06 = 0.79; system 1 has no answer: -0.1 - 0.04 = -0.14
    assert b.scalar_rewards.tolist() == pytest.approx([0.79, -0.14])
    adv = tr.compute_advantages(b)
    # two rows: deviations +-0.465, Bessel std 0.93 / sqrt(2) = 0.6576...; z = +-0.465 / (0.6576 + 1e-4)
    z = 0.465 / (0.93 / 2 ** 0.5 + EPS)
    line = [torch.tensor([texts[i][:len(tr.ctx.tokenizer.decode(b.completion_ids[i, :t]))].count("\n") + 1
                          for t in range(b.completion_ids.shape[1])]) for i in range(2)]
    m = b.completion_mask
    assert torch.allclose(adv[0], z * m[0], atol=1e-5)
    # system 1: line 2 (add, unused) and line 3 (end without an answer) are irrational: -0.5 on their tokens
    want1 = (-z - 0.5 * ((line[1] == 2) | (line[1] == 3)).float()) * m[1]
    assert torch.allclose(adv[1], want1, atol=1e-5)
    assert tr.ctx.metrics["mashost/irrational_actions"] == 1.0
    monkeypatch.undo()
    tr.train(progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert len(rows) == 2 and all(r["loss"] is not None and r["skipped"] == 0 for r in rows)
    assert all("rollout/mashost/malformed_lines" in r for r in rows)
