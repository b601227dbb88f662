"""M-GRPO (000-65): the ``m_grpo`` rollout (main agent calling a sub-agent), hierarchical credit, trajectory alignment,
the ``delegate_facts`` task and the ``m_grpo`` recipe."""
import dataclasses

import pytest
import torch

from grpolab.batch import ENVIRONMENT, SAMPLED
from grpolab.catalog import parse_provenance
from grpolab.config import Config, ConfigError
from grpolab.generation.turns import Continuation
from grpolab.recipes import recipe_overrides
from grpolab.rollouts import hierarchical as hier
from grpolab.rollouts.hierarchical import align_trajectories, parse_action
from grpolab.tasks import get_task
from grpolab.train.trainer import Trainer


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_alignment_by_hand():
    """align_trajectories(n, D): n = 0, n < D, n = D, n > D; deterministic under a seed."""
    assert align_trajectories(0, 4, gen(0)) == []  # nothing sampled: nothing to duplicate
    assert align_trajectories(3, 3, gen(0)) == [0, 1, 2]  # n = D: every trajectory once, in order
    # n > D: D distinct kept, in order; n - D dropped
    for seed in range(20):
        kept = align_trajectories(7, 3, gen(seed))
        assert len(kept) == 3 and len(set(kept)) == 3 and kept == sorted(kept) and set(kept) <= set(range(7))
    assert len({tuple(align_trajectories(7, 3, gen(s))) for s in range(20)}) > 1  # the choice is random ...
    assert align_trajectories(7, 3, gen(5)) == align_trajectories(7, 3, gen(5))  # ... and fixed by the seed
    # n < D: all n once, then D - n duplicates drawn among them
    for seed in range(20):
        filled = align_trajectories(2, 5, gen(seed))
        assert len(filled) == 5 and filled[:2] == [0, 1] and set(filled[2:]) <= {0, 1}
    assert align_trajectories(2, 5, gen(3)) == align_trajectories(2, 5, gen(3))
    assert align_trajectories(1, 4, gen(0)) == [0, 0, 0, 0]  # one sampled: every other row is its copy
    with pytest.raises(ConfigError, match="m_grpo_sub_trajectories"):
        align_trajectories(2, 0)


def test_parse_action():
    assert parse_action("<call>Where does Ann live?</call>") == ("call", "Where does Ann live?")
    assert parse_action("ok <call>Ann? unclosed") == ("call", "Ann? unclosed")
    assert parse_action("<answer>Peru</answer> <call>x</call>")[0] == "answer"  # the first tag decides
    assert parse_action("<call>x</call><answer>Peru</answer>") == ("call", "x")
    assert parse_action("Peru") == ("none", "Peru")


def test_delegate_facts_needs_the_sub_agent():
    from grpolab.tasks.delegate_tasks import delegate_accuracy, delegate_format
    task = get_task("delegate_facts", delegate_facts_rows=30, delegate_facts_eval=5)
    assert len(task.train_rows) == 25 and len(task.eval_rows) == 5
    for r in task.train_rows + task.eval_rows:
        # the sub-agent's directory says where the person lives; the main agent's facts map 3 cities to countries
        assert f"{r['person']} lives in {r['city']}." in r["sub_facts"] and r["sub_facts"].count(" lives in ") == 3
        assert f"{r['city']} is in {r['answer']}." in r["main_facts"] and len(r["candidates"]) == 3
        assert r["city"] not in r["prompt"][0]["content"]
    done = ["<answer>It is France.</answer>", "<answer>Italy</answer>", "France", "<answer>france"]
    assert delegate_accuracy(completions=done, answer=["France"] * 4) == [1, 0, 0, 1]  # only inside <answer>
    assert delegate_format(completions=done) == [1, 1, 0, 0]


def scripted(texts):
    """Turns by call: call k answers its j-th context with ``texts[k][j]`` (main and sub-agent calls in the order the
    rollout makes them); records the decoded contexts and whether each call was a main-agent turn (stop strings)."""
    calls = {"k": 0}

    def sample(ctx, contexts, budgets, temperatures, stop_strings=(), model=None):
        k = calls["k"]
        calls["k"] += 1
        sample.contexts.append([ctx.tokenizer.decode(c) for c in contexts])
        sample.main.append("</call>" in stop_strings)
        ids = [ctx.tokenizer(t, add_special_tokens=False)["input_ids"][:b] for t, b in zip(texts[k], budgets)]
        return Continuation(ids, [[-1.0] * len(a) for a in ids], ["stop_string"] * len(ids))
    sample.contexts, sample.main = [], []
    return sample


def step(tmp_path, tiny_args, monkeypatch, texts, **extra):
    args = {**recipe_overrides("m_grpo"), **tiny_args, "task": "delegate_facts", "delegate_facts_rows": 12,
            "delegate_facts_eval": 2, "prompts_per_step": 1, "num_generations": 3, "max_completion_length": 40,
            "use_lora": False, "role_adapters": "shared", "m_grpo_sub_trajectories": 3, "out": str(tmp_path / "run"),
            **extra}
    tr = Trainer(Config.build(args), log=lambda *a: None)
    row = tr.rows[0]
    fake = scripted([[t.format(ans=row["answer"], who=row["person"]) for t in call] for call in texts])
    monkeypatch.setattr(hier, "sample_turns", fake)
    tr.ctx.new_step()
    b = tr.strategy(ctx=tr.ctx, rows=[row], uids=[0], group_offset=tr.ctx.allocate_groups(1), budgets=None,
                    temperatures=None)
    b.scalar_rewards = tr.scorer.scalar(b, step=tr.step)
    return tr, b, fake, row


# One query, G = 3 main rollouts (max 2 calls each):
#   m0 calls twice, then answers right; m1 calls once, then answers wrong; m2 answers wrong at once.
SCRIPT = [["<call>where does {who} live?</call>", "<call>{who}?</call>", "<answer>Lima</answer>"],  # main turn 1
          ["{who} lives in Oslo.", "Ben lives in Rome."],  # sub-agent: m0's 1st call, m1's call
          ["<call>and again?</call>", "<answer>Lima</answer>"],  # main turn 2: m0, m1
          ["Oslo."],  # sub-agent: m0's 2nd call
          ["<answer>{ans}</answer>"]]  # main turn 3: m0


def test_two_level_advantages_by_hand(tmp_path, tiny_args, monkeypatch):
    tr, b, fake, row = step(tmp_path, tiny_args, monkeypatch, SCRIPT)
    assert row["answer"] != "Lima" or pytest.skip("the drawn row's answer is the scripted wrong one")
    assert fake.main == [True, False, True, False, True]  # main turn, sub calls, main turn, sub call, main turn
    # rows: 3 main rows, then D = 3 sub rows (m0 call 0, m0 call 1, m1 call 0): no drop, no duplicate
    assert b.columns["role"] == ["main"] * 3 + ["sub"] * 3 and b.row_data["role"].tolist() == [0, 0, 0, 1, 1, 1]
    info = b.columns["m_grpo"]
    assert [(i["level"], i["rollout"], i["call"]) for i in info] == [
        ("main", 0, -1), ("main", 1, -1), ("main", 2, -1), ("sub", 0, 0), ("sub", 0, 1), ("sub", 1, 0)]
    g = b.group_ids.tolist()
    assert g[0] == g[1] == g[2] and g[3] == g[4] == g[5] and g[0] != g[3]  # a group per level
    # rewards: accuracy + 0.2 format. m0 right: 1.2; m1, m2 wrong (closed <answer>): 0.2
    # sub rows inherit their caller's: m0, m0, m1 -> 1.2, 1.2, 0.2
    assert b.scalar_rewards.tolist() == pytest.approx([1.2, 0.2, 0.2, 1.2, 1.2, 0.2])
    # group z-score (Bessel std, eps 1e-4): main mean 1.6/3 = .5333, deviations (2/3, -1/3, -1/3),
    # std = sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3) = .57735; A = (2/3, -1/3, -1/3) / (.57735 + 1e-4)
    # sub mean 2.6/3 = .8667, deviations (1/3, 1/3, -2/3), the same std: A = (1/3, 1/3, -2/3) / (.57735 + 1e-4)
    s = 3 ** -0.5 + 1e-4
    adv = tr.compute_advantages(b)
    assert [float(adv[i, 0]) for i in range(6)] == pytest.approx(
        [2 / 3 / s, -1 / 3 / s, -1 / 3 / s, 1 / 3 / s, 1 / 3 / s, -2 / 3 / s], abs=1e-5)
    # each role's rows carry their role: main rows' turns are the main agent's, the replies they read the sub's
    for i in range(6):
        live = b.completion_attention_mask[i].bool()
        origin, producer = b.token_origin[i][live], b.step_data["role"][i][live]
        assert (producer[origin == SAMPLED] == (0 if i < 3 else 1)).all()
        assert (producer[origin == ENVIRONMENT] == 1).all() and (b.step_data["role"][i][~live] == -1).all()
        assert (b.completion_mask[i][live] == (origin == SAMPLED).float()).all()
    tok = tr.ctx.tokenizer
    m0 = b.completion_ids[0][b.completion_attention_mask[0].bool()]
    env = tok.decode(m0[b.token_origin[0][b.completion_attention_mask[0].bool()] == ENVIRONMENT])
    assert f"sub: {row['person']} lives in Oslo." in env and "sub: Oslo." in env
    assert (b.token_origin[2][b.completion_attention_mask[2].bool()] == SAMPLED).all()  # m2 never called
    # what each agent saw: the main agent its facts, the sub-agent its directory and the subtask only
    assert row["main_facts"] in fake.contexts[0][0] and row["sub_facts"] not in fake.contexts[0][0]
    sub_ctx = fake.contexts[1][0]
    assert row["sub_facts"] in sub_ctx and f"where does {row['person']} live?" in sub_ctx
    assert row["main_facts"] not in sub_ctx and "In which country" not in sub_ctx
    assert b.columns["completion"][3] == [{"role": "assistant", "content": f"{row['person']} lives in Oslo."}]
    m = tr.ctx.metrics
    assert m["m_grpo/calls"] == 1.0 and m["m_grpo/sub_sampled"] == 3 and m["m_grpo/sub_dropped"] == 0
    assert m["m_grpo/main/reward"] == pytest.approx(1.6 / 3) and m["m_grpo/sub/reward"] == pytest.approx(2.6 / 3)


def test_alignment_in_the_rollout_drops_duplicates_and_is_seeded(tmp_path, tiny_args, monkeypatch):
    # D = 2 < 3 sampled: one dropped at random; the kept ones are two distinct of the three
    _, b, _, _ = step(tmp_path / "d", tiny_args, monkeypatch, SCRIPT, m_grpo_sub_trajectories=2)
    sub = [(i["rollout"], i["call"]) for i in b.columns["m_grpo"] if i["level"] == "sub"]
    assert len(sub) == 2 and len(set(sub)) == 2 and set(sub) <= {(0, 0), (0, 1), (1, 0)}
    tr, b2, _, _ = step(tmp_path / "d2", tiny_args, monkeypatch, SCRIPT, m_grpo_sub_trajectories=2)
    assert [(i["rollout"], i["call"]) for i in b2.columns["m_grpo"] if i["level"] == "sub"] == sub  # same seed
    assert tr.ctx.metrics["m_grpo/sub_dropped"] == 1 and tr.ctx.metrics["m_grpo/sub_duplicated"] == 0
    # D = 5 > 3 sampled: the three, then two duplicates, identical to their originals row for row
    tr, b, _, _ = step(tmp_path / "u", tiny_args, monkeypatch, SCRIPT, m_grpo_sub_trajectories=5)
    info = b.columns["m_grpo"]
    assert len(info) == 3 + 5 and [i["duplicate"] for i in info[3:]] == [False] * 3 + [True] * 2
    assert tr.ctx.metrics["m_grpo/sub_duplicated"] == 2 and tr.ctx.metrics["m_grpo/sub_dropped"] == 0
    first = {(i["rollout"], i["call"]): r for r, i in enumerate(info) if i["level"] == "sub" and not i["duplicate"]}
    for r in (6, 7):
        o = first[(info[r]["rollout"], info[r]["call"])]
        tensors = {f.name: getattr(b, f.name) for f in dataclasses.fields(b)}
        tensors.update({f"step_data.{k}": v for k, v in b.step_data.items()})
        tensors.update({f"row_data.{k}": v for k, v in b.row_data.items()})
        rowwise = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor) and v.dim() and len(v) == len(info)}
        assert {"completion_ids", "completion_mask", "token_origin", "rewards", "group_ids"} <= set(rowwise)
        for name, v in rowwise.items():  # every per-row tensor, the behaviour log-probs and rewards included
            assert torch.equal(v[r], v[o]) or (v.is_floating_point() and torch.allclose(v[r], v[o], equal_nan=True)), name
        assert torch.equal(b.step_data["role"][r], b.step_data["role"][o])
        assert b.columns["completion"][r] == b.columns["completion"][o]
    # no call at all (every rollout answers at once): no sub rows
    tr, b, _, _ = step(tmp_path / "z", tiny_args, monkeypatch, [["<answer>{ans}</answer>"] * 3])
    assert b.columns["role"] == ["main"] * 3 and tr.ctx.metrics["m_grpo/queries_without_calls"] == 1
    # a frozen sub-agent (the paper's baseline) plays and is scored, then leaves the batch
    roles = [dict(r) for r in recipe_overrides("m_grpo")["roles"]]
    roles[1]["trainable"] = False
    _, b, _, _ = step(tmp_path / "f", tiny_args, monkeypatch, SCRIPT, roles=roles)
    assert b.columns["role"] == ["main"] * 3


def test_bad_settings_name_the_fix():
    with pytest.raises(ConfigError, match="exactly two roles"):
        Config.build({"rollout_strategy": "m_grpo", "roles": ["a", "b", "c"]})
    with pytest.raises(ConfigError, match="needs use_lora: true"):
        Config.build({"rollout_strategy": "m_grpo", "roles": ["a", "b"], "role_adapters": "lora"})
    with pytest.raises(ConfigError, match="use role_adapters: lora"):
        Config.build({"rollout_strategy": "m_grpo", "roles": ["a", "b"], "role_adapters": "separate",
                      "use_lora": True})
    with pytest.raises(ConfigError, match="m_grpo_sub_trajectories must be >= 1"):
        Config.build({"rollout_strategy": "m_grpo", "roles": ["a", "b"], "m_grpo_sub_trajectories": 0})


def calling(real):
    """The real sampler, except that a main agent's first turn is a scripted call (the random tiny model never
    writes one): so the sub-agent plays and both roles train."""
    def sample(ctx, contexts, budgets, temperatures, stop_strings=(), model=None):
        sample.evaluating.append(model is not None)  # the held-out evaluation passes its model
        out = real(ctx, contexts, budgets, temperatures, stop_strings, model=model)
        if "</call>" in stop_strings:  # a main-agent turn (a sub-agent turn stops at </tool_call>)
            for j, c in enumerate(contexts):
                if "sub:" not in ctx.tokenizer.decode(c):
                    out.ids[j] = ctx.tokenizer("<call>Where?</call>", add_special_tokens=False)["input_ids"]
                    out.logprobs[j] = [-1.0] * len(out.ids[j])
        return out
    sample.evaluating = []
    return sample


def longer(completions, **kw):
    """A reward that varies with the tiny model's random final messages (so advantages are non-zero)."""
    return [len(str(c)) % 7 / 7 for c in completions]


@pytest.mark.parametrize("adapters", ["shared", "lora", "separate"])
def test_m_grpo_recipe_trains(adapters, tiny_args, tmp_path, monkeypatch):
    """The recipe, one step on the tiny model: the shared model, one LoRA adapter per role, and a separate model per
    role (the paper's distinct LLMs): each role's adapter / model moves."""
    from grpolab.train.metrics import read_metrics
    fake = calling(hier.sample_turns)
    monkeypatch.setattr(hier, "sample_turns", fake)
    args = {**recipe_overrides("m_grpo"), **tiny_args, "task": "delegate_facts", "steps": 1, "prompts_per_step": 2,
            "num_generations": 2, "max_completion_length": 8, "delegate_facts_rows": 12, "delegate_facts_eval": 2,
            "m_grpo_sub_trajectories": 3, "learning_rate": 3e-2, "out": str(tmp_path / adapters)}
    if adapters != "shared":  # a reward that varies, so each adapter / model gets a non-zero advantage
        args["reward"] = ["test_m_grpo:longer"]
    if adapters == "shared":  # and the held-out evaluation: one greedy main rollout per row (with its calls)
        args.update(use_lora=False, role_adapters="shared", eval_after=True)
    elif adapters == "separate":
        args.update(use_lora=False, role_adapters="separate")
    else:
        args.update(lora_r=4, lora_alpha=8, lora_target_modules="q_proj,v_proj")
    tr = Trainer(Config.build(args), log=lambda *a: None)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train(progress=False)
    (r,) = read_metrics(args["out"])
    # each of the 2 queries: 2 rollouts, one call each -> 2 sampled < D = 3 -> 1 duplicate per query
    assert r["rollout/m_grpo/sub_sampled"] == 4 and r["rollout/m_grpo/sub_dropped"] == 0
    assert r["rollout/m_grpo/sub_duplicated"] == 2
    assert r["loss"] is not None and torch.isfinite(torch.tensor(r["loss"]))
    if adapters == "shared":
        import json
        after = json.loads((tmp_path / adapters / "summary.json").read_text())["after"]
        assert after["n"] == 2 and 0 <= after["accuracy"] <= 1
        # evaluation played main turns and sub-agent calls: [main, sub, main, ...] with its model
        assert fake.evaluating.count(True) >= 3
    if adapters == "lora":
        assert sorted(tr.model.peft_config) == ["main", "sub"]
        for role in ("main", "sub"):  # lora_B starts at zero: a role's adapter moved only if its rows trained it
            assert any(float(p.detach().abs().sum()) > 0 for n, p in tr.model.named_parameters() if f"lora_B.{role}." in n)
    if adapters == "separate":
        assert tr.model.names == ["main", "sub"]
        for role in ("main", "sub"):  # both copies started as the run's model; each moved through its own rows
            assert any(not torch.equal(p, before[n]) for n, p in tr.model.named_parameters()
                       if n.startswith(f"roles.{role}.")), role


def test_provenance_and_recipe_citation():
    for fn in (hier.m_grpo, align_trajectories):
        p = parse_provenance(fn.__doc__)
        assert p["kind"] == "reconstructed from the abstract" and "2511.13288" in fn.__doc__ and "000-65" in fn.__doc__
        assert p["tests"] and all(t.startswith("tests/test_m_grpo.py::") for t in p["tests"])
    rec = recipe_overrides("m_grpo")
    assert rec["rollout_strategy"] == "m_grpo" and rec["task"] == "delegate_sums"
    assert rec["m_grpo_sub_tools"] == ["calculator"] and rec["m_grpo_sub_turns"] == 3


# ------------------------------------------------------------- multi-turn tool-using sub-agents (issue 43)


def test_delegate_sums_needs_the_sub_agents_notes():
    from grpolab.tasks.delegate_tasks import sums_accuracy
    task = get_task("delegate_sums", delegate_sums_rows=20, delegate_sums_eval=4)
    assert len(task.train_rows) == 16 and len(task.eval_rows) == 4
    import re
    for r in task.train_rows:
        # the asked person's order is in the sub-agent's notes only; the answer is quantity * price + shipping
        q, price, ship = map(int, re.search(rf"{r['person']} buys (\d+) \w+ at (\d+) coins each plus (\d+) coins",
                                            r["sub_facts"]).groups())
        assert r["answer"] == str(q * price + ship) and r["sub_facts"].count(" buys ") == 3
        assert r["sub_facts"] not in r["main_facts"] and r["answer"] not in r["prompt"][0]["content"]
    done = ["<answer>It is 1,234.</answer>", "<answer>12340</answer>", "1234", "<answer>1234"]
    assert sums_accuracy(completions=done, answer=["1234"] * 4) == [1, 0, 0, 1]


def tool_step(tmp_path, tiny_args, monkeypatch, texts, **extra):
    args = {**recipe_overrides("m_grpo"), **tiny_args, "task": "delegate_sums", "delegate_sums_rows": 12,
            "delegate_sums_eval": 2, "prompts_per_step": 1, "num_generations": 2, "max_completion_length": 96,
            "max_episode_tokens": 512, "use_lora": False, "role_adapters": "shared", "m_grpo_sub_trajectories": 2,
            "m_grpo_sub_turns": 2, "out": str(tmp_path / "run"), **extra}
    tr = Trainer(Config.build(args), log=lambda *a: None)
    row = tr.rows[0]
    fake = scripted(texts)
    monkeypatch.setattr(hier, "sample_turns", fake)
    tr.ctx.new_step()
    b = tr.strategy(ctx=tr.ctx, rows=[row], uids=[0], group_offset=tr.ctx.allocate_groups(1), budgets=None,
                    temperatures=None)
    return tr, b, fake, row


CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23 + 4"}}</tool_call>'
# G = 2 main rollouts, each calls once. Sub-agent episode of m0: turn 1 calls the calculator (17 * 23 + 4 = 395),
# turn 2 replies. m1's: turn 1 calls an unknown tool (an error text comes back), turn 2 calls the calculator again,
# but 2 = m_grpo_sub_turns is the last turn: it is the reply, its call is not run.
TOOL_SCRIPT = [["<call>what does Ann pay?</call>", "<call>Ann?</call>"],  # main turn 1
               [CALC, '<tool_call>{"name": "search", "arguments": {}}</tool_call>'],  # sub turn 1 (both episodes)
               ["It is 395.", CALC],  # sub turn 2
               ["<answer>395</answer>", "<answer>1</answer>"]]  # main turn 2


def test_sub_agent_runs_tools_over_several_turns(tmp_path, tiny_args, monkeypatch):
    tr, b, fake, row = tool_step(tmp_path, tiny_args, monkeypatch, TOOL_SCRIPT)
    assert fake.main == [True, False, False, True]
    # the sub-agent's prompt shows its tool (Hermes text) and its notes; its 2nd turn reads the tool's answer
    assert '"name":"calculator"' in fake.contexts[1][0] and row["sub_facts"] in fake.contexts[1][0]
    assert "<tool_response>\n395\n</tool_response>" in fake.contexts[2][0]
    assert "Error: unknown tool 'search'; the tools are: calculator" in fake.contexts[2][1]
    assert b.columns["role"] == ["main", "main", "sub", "sub"]
    tok = tr.ctx.tokenizer
    for i, reply in ((2, "It is 395."), (3, CALC)):
        live = b.completion_attention_mask[i].bool()
        origin = b.token_origin[i][live].tolist()
        runs = [o for k, o in enumerate(origin) if k == 0 or o != origin[k - 1]]
        assert runs == [SAMPLED, ENVIRONMENT, SAMPLED]  # a model turn, the tool's answer (not trained on), a model turn
        assert (b.completion_mask[i][live] == (b.token_origin[i][live] == SAMPLED).float()).all()
        assert b.columns["completion"][i] == [{"role": "assistant", "content": reply}]
    # the main agent reads each episode's final reply
    m0 = b.completion_ids[0][b.completion_attention_mask[0].bool()]
    assert "sub: It is 395." in tok.decode(m0[b.token_origin[0][b.completion_attention_mask[0].bool()] == ENVIRONMENT])
    m = tr.ctx.metrics
    # 4 sub turns over 2 episodes; 2 tool calls run (calculator, the unknown search), 1 an error
    assert m["m_grpo/sub/turns"] == 2.0 and m["m_grpo/sub/tool_calls"] == 1.0 and m["m_grpo/sub/tool_errors"] == 1
    ended = [t[1]["ended_by"] for t in b.columns["team_transcript"][2:]]
    assert ended == ["answered", "max_turns"]
    with pytest.raises(ConfigError, match="m_grpo_sub_turns must be >= 1"):
        Config.build({"rollout_strategy": "m_grpo", "roles": ["a", "b"], "m_grpo_sub_turns": 0})


def test_decoupled_processes_share_only_statistics(tmp_path, monkeypatch):
    """Main and sub agent trained by two processes (the sub-agent's a subprocess), each with its own model, that
    exchange only the sub-agent calls, the replies and the main rollouts' rewards through a directory."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import m_grpo_decoupled_script as script
    from grpolab.train.metrics import read_metrics
    store = tmp_path / "store"
    common = {"model": "tiny", "task": "delegate_sums", "delegate_sums_rows": 12, "delegate_sums_eval": 2, "steps": 1,
              "prompts_per_step": 2, "num_generations": 2, "max_completion_length": 96, "max_episode_tokens": 512,
              "use_lora": False, "role_adapters": "shared", "m_grpo_sub_trajectories": 2, "m_grpo_store": str(store),
              "m_grpo_store_timeout": 240, "eval_before": False, "eval_after": False, "tensorboard": False,
              "save_steps": 1, "learning_rate": 3e-3, "micro_batch_size": 16}
    here = Path(__file__).parent
    cli = [sys.executable, "-m", "grpolab", "--import", "m_grpo_decoupled_script", "train", "--recipe", "m_grpo",
           "--m_grpo_decoupled", "sub", "--out", str(tmp_path / "sub")]
    for k, v in common.items():
        cli += [f"--{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    env = {**os.environ, "GRPOLAB_M_GRPO_SCRIPT": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    with open(tmp_path / "sub.log", "w") as log:
        proc = subprocess.Popen(cli, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            monkeypatch.setattr(hier, "sample_turns", script.scripted_turns)
            main = Trainer(Config.build({**recipe_overrides("m_grpo"), **common, "m_grpo_decoupled": "main",
                                         "out": str(tmp_path / "main")}), log=lambda *a: None)
            main.train(progress=False)
            assert proc.wait(timeout=240) == 0, (tmp_path / "sub.log").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    m, s = read_metrics(tmp_path / "main"), read_metrics(tmp_path / "sub")
    assert [r["step"] for r in m] == [r["step"] for r in s] == [1]
    for rm, rs in zip(m, s):
        # every main rollout calls once: 2 queries x G = 2 -> 4 sub-agent episodes, D = 2 per query, none dropped
        assert rm["rollout/m_grpo/sub_sampled"] == rs["rollout/m_grpo/sub_sampled"] == 4
        assert rs["rollout/m_grpo/sub_dropped"] == rs["rollout/m_grpo/sub_duplicated"] == 0
        assert rs["rollout/m_grpo/sub/turns"] == 2 and rs["rollout/m_grpo/sub/tool_calls"] == 1
        # hierarchical credit across the processes: the sub rows carry their callers' rewards, so their mean is
        # the main rows' mean; the main process trains main rows only, the sub process sub rows only
        assert rs["reward_mean"] == pytest.approx(rm["reward_mean"])
        assert rm["loss"] is not None and rs["loss"] is not None
    # each query's answer is right (1.2) or off by one (0.2)
    assert all(min(abs(r["reward_mean"] - v) for v in (0.2, 0.7, 1.2)) < 1e-6 for r in m)
    # what passed between them: per step the calls, the replies and the rewards, nothing else
    files = sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())
    assert files == [f"step{k}/{n}" for k in (0,) for n in ("calls0.json", "replies0.json", "stats.json")]
    stats = json.loads((store / "step0" / "stats.json").read_text())
    assert set(stats) == {"rewards", "reward_names"} and len(stats["rewards"]) == 4
    assert json.loads((store / "step0" / "replies0.json").read_text())[0].startswith("It is ")
