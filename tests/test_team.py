"""Several roles in one run (issue 26, the roles core): the ``team`` rollout, ``split_facts`` and MAGRPO."""
import json

import pytest
import torch

from grpolab.batch import ENVIRONMENT, SAMPLED
from grpolab.config import Config, ConfigError
from grpolab.generation.turns import Continuation
from grpolab.recipes import recipe_overrides
from grpolab.rollouts import team as team_mod
from grpolab.rollouts.team import parse_roles
from grpolab.tasks import get_task
from grpolab.train.trainer import Trainer

from _helpers import own_data_args, scripted_strategy_step, straight_and_resumed

EPS = 1e-4


def test_roles_are_parsed_and_bad_specs_name_the_fix():
    roles = parse_roles(["a", {"name": "b", "prompt": "B!", "view": "v", "trainable": False}])
    assert [(r.name, r.prompt, r.view, r.trainable) for r in roles] == [("a", "", None, True), ("b", "B!", "v", False)]
    assert [r.name for r in parse_roles("x, y")] == ["x", "y"]
    for bad, msg in ((["a"], "at least two"), (["a", "a"], "more than once"), (["a", {"prompt": "p"}], "no name"),
                     (["a", {"name": "b", "colour": 1}], "unknown key"), (["a", "2b"], "must be a letter"),
                     ([{"name": "a", "trainable": False}, {"name": "b", "trainable": False}], "at least one role")):
        with pytest.raises(ConfigError, match=msg):
            parse_roles(bad)
    with pytest.raises(ConfigError, match="team_reward: 'shared' is not valid"):
        Config.build({"rollout_strategy": "team", "team_reward": "shared", "roles": ["a", "b"]})
    with pytest.raises(ConfigError, match="team_answer_role: 'c' is none of the roles"):
        Config.build({"rollout_strategy": "team", "team_answer_role": "c", "roles": ["a", "b"]})
    with pytest.raises(ConfigError, match="zero_sum needs exactly two roles"):
        Config.build({"rollout_strategy": "team", "team_reward": "zero_sum", "roles": ["a", "b", "c"]})


def test_split_facts_needs_both_views():
    task = get_task("split_facts", split_facts_rows=50, split_facts_eval=10)
    assert len(task.train_rows) == 40 and len(task.eval_rows) == 10
    for r in task.train_rows + task.eval_rows:
        # the scout's view names the city, the solver's the countries of 3 cities, the person's among them
        assert r["scout_facts"] == f"{r['person']} lives in {r['city']}."
        assert f"{r['city']} is in {r['answer']}." in r["solver_facts"] and len(r["candidates"]) == 3
        assert r["answer"] not in r["scout_facts"] and r["city"] not in r["prompt"][0]["content"]
    rw = task.rewards[0][1]
    assert rw(completions=["It is France.", "Italy", "france!"], answer=["France", "France", "France"]) == [1, 0, 1]


def scripted(texts):
    """Role turns by call: call k (role k % n of round k // n) says ``texts[k][j]`` in its j-th live episode."""
    calls = {"k": 0}

    def sample(ctx, contexts, budgets, temperatures, model=None):
        k = calls["k"]
        calls["k"] += 1
        sample.contexts.append([ctx.tokenizer.decode(c) for c in contexts])
        ids = [ctx.tokenizer(t, add_special_tokens=False)["input_ids"][:b] for t, b in zip(texts[k], budgets)]
        return Continuation(ids, [[-1.0] * len(a) for a in ids], ["stop_string"] * len(ids))
    sample.contexts = []
    return sample


def user_rows(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "team.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}:", "answer": "yes", "hint": f"h{i}",
                                        "note": "abcdefghnoxyzw12"}) + "\n"
                            for i in range(4)))
    return str(path)


def hit(completions, answer, **kw):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def team_step(tmp_path, tiny_args, monkeypatch, texts, **extra):
    args = {**own_data_args(tiny_args, user_rows(tmp_path)),
            "reward": ["test_team:hit"], "rollout_strategy": "team", "prompts_per_step": 2, "num_generations": 2,
            "max_completion_length": 6, "advantage": "group_mean",
            "roles": [{"name": "scout", "view": "hint"}, {"name": "solver"}], "out": str(tmp_path / "run"),
            **extra}
    fake = scripted(texts)
    tr, b = scripted_strategy_step(args, monkeypatch, team_mod, "sample_role_turns", fake)
    return tr, b, fake


# 2 prompts x 2 team episodes, 1 round: the scout speaks first (call 0), then the solver (call 1)
ONE_ROUND = [["ab", "cd", "ef", "gh"], ["yes", "no", "no", "yes"]]


def test_one_row_per_role_groups_per_role_and_the_shared_reward(tmp_path, tiny_args, monkeypatch):
    tr, b, fake = team_step(tmp_path, tiny_args, monkeypatch, ONE_ROUND)
    # rows team-major: (e0 scout, e0 solver, e1 scout, e1 solver, e2 ..., e3 ...); e0, e1 of prompt 0
    assert b.columns["role"] == ["scout", "solver"] * 4 and b.row_data["role"].tolist() == [0, 1] * 4
    g = b.group_ids.tolist()
    # each role's 2 rows of one prompt are a group; 4 distinct groups (2 prompts x 2 roles)
    assert g[0] == g[2] and g[1] == g[3] and g[4] == g[6] and g[5] == g[7] and len(set(g)) == 4
    assert b.prompt_uids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # the solver's first prompt holds its instruction-less prompt and the scout's message; the scout saw its hint
    assert "h0" in fake.contexts[0][0] and "h1" in fake.contexts[0][2]
    assert "scout: ab" in fake.contexts[1][0] and "scout: gh" in fake.contexts[1][3]
    assert "h0" not in fake.contexts[1][0]  # the hint is the scout's alone
    # cooperative: every role gets the solver's (answer role's) reward: e0 yes, e1 no, e2 no, e3 yes
    assert b.rewards[:, 0].tolist() == [1, 1, 0, 0, 0, 0, 1, 1]
    # tokens: each row's completion is its own turn (SAMPLED, producer = its role)
    for i in range(8):
        n = int(b.completion_attention_mask[i].sum())
        assert (b.token_origin[i, :n] == SAMPLED).all() and (b.step_data["role"][i, :n] == i % 2).all()
        assert (b.step_data["role"][i, n:] == -1).all()
    # advantages per role group: R - mean: prompt 0 (1, 0) -> +-.5 for both roles; prompt 1 (0, 1) -> -+.5
    adv = tr.compute_advantages(b)
    per_row = [float(adv[i, 0]) for i in range(8)]
    assert per_row == pytest.approx([0.5, 0.5, -0.5, -0.5, -0.5, -0.5, 0.5, 0.5])
    m = tr.ctx.metrics
    assert m["team/reward"] == 0.5 and m["team/scout/reward"] == 0.5 and m["team/solver/reward"] == 0.5


def test_two_rounds_interleave_turns_and_observations(tmp_path, tiny_args, monkeypatch):
    texts = [["a1", "b1", "c1", "d1"], ["x1", "y1", "z1", "w1"], ["a2", "b2", "c2", "d2"], ["yes", "y", "n", "yes"]]
    tr, b, fake = team_step(tmp_path, tiny_args, monkeypatch, texts, team_rounds=2)
    # the scout's row: turn a1, the solver's message x1 (ENVIRONMENT, producer solver), turn a2
    tok = tr.ctx.tokenizer
    row = b.completion_ids[0][b.completion_attention_mask[0].bool()]
    origin = b.token_origin[0][b.completion_attention_mask[0].bool()]
    producer = b.step_data["role"][0][b.completion_attention_mask[0].bool()]
    assert tok.decode(row[origin == SAMPLED]).replace(" ", "") in ("a1a2", "a1\na2")
    env = row[origin == ENVIRONMENT]
    assert "solver: x1" in tok.decode(env) and (producer[origin == ENVIRONMENT] == 1).all()
    assert (producer[origin == SAMPLED] == 0).all()
    assert (b.completion_mask[0][b.completion_attention_mask[0].bool()] == (origin == SAMPLED).float()).all()
    # the solver's second turn context holds the scout's second message
    assert "scout: a2" in fake.contexts[3][0] and "scout: a1" in fake.contexts[3][0]
    assert b.columns["completion"][1] == "yes" and b.columns["completion"][0] == "a2"  # final messages
    assert b.columns["team_transcript"][0][0]["turns"] == ["a1", "a2"]


def test_channel_off_per_role_zero_sum_and_frozen_roles(tmp_path, tiny_args, monkeypatch):
    _, b, fake = team_step(tmp_path, tiny_args, monkeypatch, ONE_ROUND, team_channel="off")
    assert not any("scout:" in c for c in fake.contexts[1])  # alone: the solver never hears the scout
    # per_role: each row on its own final message ("ab", "cd", ... never contain "yes")
    _, b, _ = team_step(tmp_path / "p", tiny_args, monkeypatch, ONE_ROUND, team_reward="per_role")
    assert b.rewards[:, 0].tolist() == [0, 1, 0, 0, 0, 0, 0, 1]
    # zero_sum: the answer role's reward, the other role its negation
    _, b, _ = team_step(tmp_path / "z", tiny_args, monkeypatch, ONE_ROUND, team_reward="zero_sum")
    assert b.rewards[:, 0].tolist() == [-1, 1, 0, 0, 0, 0, -1, 1]
    # a frozen role plays and is scored, then leaves the batch: only the solver's rows are trained
    _, b, _ = team_step(tmp_path / "f", tiny_args, monkeypatch, ONE_ROUND,
                        roles=[{"name": "scout", "view": "hint", "trainable": False}, {"name": "solver"}])
    assert b.columns["role"] == ["solver"] * 4 and b.rewards[:, 0].tolist() == [1, 0, 0, 1]


def test_magrpo_recipe_trains_and_evaluates_the_team(tiny_args, tmp_path):
    from grpolab.train.metrics import read_metrics
    args = {**recipe_overrides("magrpo"), **tiny_args, "task": "split_facts", "steps": 2, "prompts_per_step": 2,
            "num_generations": 2, "max_completion_length": 6, "split_facts_rows": 24, "split_facts_eval": 4,
            "eval_steps": 2, "save_steps": 2, "out": str(tmp_path / "magrpo")}
    cfg = Config.build(args)
    assert (cfg.rollout_strategy, cfg.advantage, cfg.policy_loss) == ("team", "group_mean", "policy_gradient")
    tr = Trainer(cfg, log=lambda *a: None)
    tr.train(progress=False)
    rows = read_metrics(args["out"])
    assert len([r for r in rows if "loss" in r]) >= 2
    assert any("rollout/team/solver/reward" in r for r in rows) and any("rollout/team/reward" in r for r in rows)
    assert torch.isfinite(torch.tensor([r["loss"] for r in rows if r.get("loss") is not None])).all()


def test_held_out_evaluation_reports_the_team_and_each_role(tmp_path, tiny_args, monkeypatch):
    """Greedy team episodes on 2 held-out rows (answer 'yes'): the scout says yes, yes; the solver no, yes. The
    team's accuracy is the answer role's (the solver: 1/2); each role's own final message is scored too
    (scout 2/2, solver 1/2), with its turn length in tokens."""
    from grpolab.train.evaluate import evaluate
    tr, _, _ = team_step(tmp_path, tiny_args, monkeypatch, ONE_ROUND)
    monkeypatch.setattr(team_mod, "sample_role_turns", scripted([["yes", "yes"], ["no", "yes"]]))
    got = evaluate(None, tr.rows[:2], tr.rewards, rollout=tr._eval_rollout(), accuracy_reward="hit")
    assert got["accuracy"] == 0.5 and got["roles/solver/accuracy"] == 0.5 and got["roles/scout/accuracy"] == 1.0
    n_yes, n_no = (len(tr.tok(t, add_special_tokens=False)["input_ids"]) for t in ("yes", "no"))
    assert got["roles/scout/completion_len"] == n_yes and got["roles/solver/completion_len"] == (n_no + n_yes) / 2
    assert got["n"] == 2 and got["reward_mean"] == got["roles/solver/reward_mean"]


def test_kill_9_of_a_team_run_resumes_exactly(tmp_path):
    """A magrpo run (two roles) killed with SIGKILL after its 3rd step and resumed matches the uninterrupted run
    metric for metric (every role's) and weight for weight."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file

    from grpolab.cli import main
    from grpolab.train.metrics import read_metrics
    from test_training import TIMING

    def cli(out):
        return [sys.executable, "-m", "grpolab", "train", "--recipe", "magrpo", "--model", "tiny", "--steps", "5",
                "--prompts_per_step", "2", "--num_generations", "2", "--max_completion_length", "5",
                "--split_facts_rows", "24", "--split_facts_eval", "4", "--learning_rate", "3e-3",
                "--eval_before", "false", "--eval_after", "false", "--tensorboard", "false", "--save_steps", "2",
                "--threads", "1", "--dtype", "float32", "--out", str(out), "--quiet"]
    ref, out = tmp_path / "ref", tmp_path / "killed"
    assert main(cli(ref)[3:]) == 0
    proc = subprocess.Popen(cli(out), env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and len(read_metrics(out)) < 3:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_metrics(out)) < 5
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    a, b = read_metrics(ref), read_metrics(out)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5] and "rollout/team/scout/reward" in b[-1]
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k not in TIMING} == {k: v for k, v in rb.items() if k not in TIMING}
    wa, wb = load_file(str(ref / "final" / "model.safetensors")), load_file(str(out / "final" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_propose_solve_game_rewards_by_hand(tiny_args, tmp_path, monkeypatch):
    """Per-role rewards of the proposer/solver game on scripted turns (limit 9 for row 0, 20 for row 1)."""
    from grpolab.tasks.team_tasks import proposed_question
    assert proposed_question("What is 3 + 4?", 9) == (3, 4) and proposed_question("12+1", 9) is None
    assert proposed_question("no question", 9) is None
    assert proposed_question("A+B = 3+4", 9) == (3, 4)  # the letters are no numbers
    for ambiguous in ("A+B = 1 + 2 + 3 + ... +", "3+4 or 5+6?"):  # a chain, two sums: no one question
        assert proposed_question(ambiguous, 9) is None, ambiguous
    args = {**recipe_overrides("team_self_play"), **tiny_args, "task": "propose_solve", "prompts_per_step": 2,
            "num_generations": 2, "max_completion_length": 8, "propose_solve_rows": 8, "propose_solve_eval": 2,
            "out": str(tmp_path / "game")}
    tr = Trainer(Config.build(args), log=lambda *a: None)
    # row 0 (limit 9): e0 proposer "3+4" solver "7" (solved); e1 "8+9" / "16" (wrong)
    # row 1 (limit 20): e2 "15+5" / "20" (solved); e3 "30+1" (invalid: 30 > 20) / "31"
    monkeypatch.setattr(team_mod, "sample_role_turns", scripted([["3+4", "8+9", "15+5", "30+1"],
                                                                 ["7", "16", "20", "31"]]))
    tr.ctx.new_step()
    rows = [r for r in tr.rows if r["limit"] == 9][:1] + [r for r in tr.rows if r["limit"] == 20][:1]
    b = tr.strategy(ctx=tr.ctx, rows=rows, uids=[0, 1], group_offset=tr.ctx.allocate_groups(2), budgets=None,
                    temperatures=None)
    got = b.rewards[:, 0].tolist()
    # (proposer, solver) per episode: e0 (0, 1); e1 (1, 0); e2 (0, 1); e3 (0, unscorable)
    assert got[:7] == [0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0] and got[7] != got[7]
    assert tr.ctx.metrics["team/proposer/reward"] == pytest.approx(0.25)


def test_role_adapters_one_lora_per_role_trained_on_its_own_rows(tmp_path, tiny_args, monkeypatch):
    """role_adapters lora: one adapter per role on the shared base; each role samples with its adapter, each row's
    log-probs go through its role's adapter, and a step moves each adapter only through its own rows."""
    with pytest.raises(ConfigError, match="needs use_lora: true"):
        Config.build({"rollout_strategy": "team", "role_adapters": "lora", "roles": ["a", "b"]})
    extra = {"use_lora": True, "lora_r": 4, "lora_alpha": 8, "lora_target_modules": "q_proj,v_proj",
             "role_adapters": "lora", "learning_rate": 1e-2}
    tr, b, _ = team_step(tmp_path, tiny_args, monkeypatch, ONE_ROUND, **extra)
    model = tr.model
    assert sorted(model.peft_config) == ["scout", "solver"]
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert lora and all(p.requires_grad for p in lora.values())  # every adapter trainable after sampling
    # make the adapters differ, then: a row's log-probs are those of its role's adapter alone
    with torch.no_grad():
        for n, p in lora.items():
            if ".solver." in n and "lora_B" in n:
                p.add_(0.5)
    lp = tr.ctx.logprobs(b, model=model)
    for i, name in ((0, "scout"), (1, "solver")):
        model.set_adapter(name)
        alone = tr.ctx.logprobs(b.select([i]), model=model)
        n = int(b.completion_attention_mask[i].sum())
        assert torch.allclose(lp[i, :n], alone[0, :n], atol=1e-5), name
    model.set_requires_grad(list(model.peft_config), True)
    as_solver = b.select([0])
    as_solver.row_data["role"] = torch.tensor([1])  # the scout's row through the solver's adapter: different
    assert not torch.allclose(lp[0], tr.ctx.logprobs(as_solver, model=model)[0])
    moved = moved_by_a_solver_step(tr, b, lora)  # a training step on the solver's rows only moves its adapter
    assert moved and all(".solver." in n for n in moved)


def moved_by_a_solver_step(tr, b, params: dict) -> set[str]:
    """The names of ``params`` that one update on the solver's rows of ``b`` (rows 1, 3, 5, 7) changed."""
    before = {n: p.detach().clone() for n, p in params.items()}
    b.scalar_rewards = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    b.advantages = tr.compute_advantages(b)
    solver_rows = b.select([1, 3, 5, 7])
    solver_rows.advantages = b.advantages[[1, 3, 5, 7]]
    tr.update(solver_rows)
    return {n for n, p in params.items() if not torch.equal(p, before[n])}


def longer(completions, **kw):
    """A reward that varies with the tiny model's random replies (so the adapters move): length, capped at 5."""
    return [min(len(c), 5) / 5 for c in completions]


def role_run_args(tmp_path, tiny_args):
    """A two-role team run on the user's rows rewarded by ``longer``, checkpointed every 2 steps, no evaluation."""
    return {**own_data_args(tiny_args, user_rows(tmp_path)),
            "reward": ["test_team:longer"], "rollout_strategy": "team", "advantage": "group_mean",
            "roles": [{"name": "scout", "view": "hint"}, {"name": "solver"}], "prompts_per_step": 2,
            "num_generations": 2, "max_completion_length": 5, "save_steps": 2, "eval_before": False,
            "eval_after": False}


def test_role_adapters_resume_exactly(tmp_path, tiny_args):
    """4 steps straight, and 2 steps then a resume from the step-2 checkpoint: the same adapters to the bit; the
    adapters moved, and final/<role> holds the base with that role's adapter merged in."""
    base = {**role_run_args(tmp_path, tiny_args), "use_lora": True, "lora_r": 4, "lora_alpha": 8,
            "lora_target_modules": "q_proj,v_proj", "role_adapters": "lora", "learning_rate": 3e-2,
            "dtype": "float32"}
    a, _, c, _ = straight_and_resumed(base, tmp_path)
    pa, pc = dict(a.model.named_parameters()), dict(c.model.named_parameters())
    for k, v in pa.items():
        assert torch.equal(v, pc[k]), k
    for role in ("scout", "solver"):  # each adapter was trained (lora_B starts at zero)
        assert any(float(v.abs().sum()) > 0 for k, v in pa.items() if f"lora_B.{role}." in k), role
    from safetensors.torch import load_file
    scout, solver = (load_file(str(tmp_path / "a" / "final" / r / "model.safetensors")) for r in ("scout", "solver"))
    assert scout.keys() == solver.keys() and not all(torch.equal(scout[k], solver[k]) for k in scout)


def test_separate_role_models_each_trained_on_its_own_rows(tmp_path, tiny_args, monkeypatch):
    """role_adapters separate: every role a full copy of the model; each role samples with its own copy (the
    sampler is handed that copy), each row's log-probs are its role's model's, and a step on the solver's rows
    moves the solver's model only."""
    from grpolab.roles import RoleModels
    with pytest.raises(ConfigError, match="use role_adapters: lora"):
        Config.build({"rollout_strategy": "team", "role_adapters": "separate", "roles": ["a", "b"], "use_lora": True})
    with pytest.raises(ConfigError, match="generation_engine: native"):
        Config.build({"rollout_strategy": "team", "role_adapters": "separate", "roles": ["a", "b"],
                      "generation_engine": "vllm"})
    tr, b, fake = team_step(tmp_path, tiny_args, monkeypatch, ONE_ROUND, role_adapters="separate",
                            learning_rate=1e-2)
    model = tr.model
    assert isinstance(model, RoleModels) and model.names == ["scout", "solver"]
    assert model.roles["scout"] is not model.roles["solver"]
    assert model.config is model.roles["scout"].config  # what a trainer reads of a model: the first role's
    with pytest.raises(TypeError, match="one model per role"):
        model(torch.zeros(1, 2, dtype=torch.long))
    # make the copies differ, then: a row's log-probs are those of its role's model alone
    with torch.no_grad():
        for p in model.roles["solver"].parameters():
            p.add_(0.01 * torch.randn_like(p))
    lp = tr.ctx.logprobs(b, model=model)
    for i, name in ((0, "scout"), (1, "solver")):
        alone = tr.ctx.logprobs(b.select([i]), model=model.roles[name])
        n = int(b.completion_attention_mask[i].sum())
        assert torch.allclose(lp[i, :n], alone[0, :n], atol=1e-5), name
    other = tr.ctx.logprobs(b.select([0]), model=model.roles["solver"])
    assert not torch.allclose(lp[0], other[0])
    moved = moved_by_a_solver_step(tr, b, dict(model.named_parameters()))  # only the solver's model moves
    assert moved and all(n.startswith("roles.solver.") for n in moved)


def test_separate_role_models_sample_with_their_own_copy(tmp_path, tiny_args, monkeypatch):
    seen, again = [], scripted(ONE_ROUND)
    tr, _, _ = team_step(tmp_path, tiny_args, monkeypatch, ONE_ROUND, role_adapters="separate")

    def spy(ctx, contexts, budgets, temperatures, model=None):
        seen.append(model)
        return again(ctx, contexts, budgets, temperatures, model)
    monkeypatch.setattr(team_mod, "sample_role_turns", spy)
    tr.ctx.new_step()
    tr.strategy(ctx=tr.ctx, rows=tr.rows[:2], uids=[0, 1], group_offset=tr.ctx.allocate_groups(2), budgets=None,
                temperatures=None)
    # the behaviour policy is the trained module itself (on-policy): its scout copy, then its solver copy
    assert seen == [tr.model.roles["scout"], tr.model.roles["solver"]]


def test_separate_role_models_resume_exactly_and_save_each_role(tmp_path, tiny_args):
    """4 steps straight vs 2 + resume: every role's model equal to the bit; the two roles' models moved apart;
    final/<role> is each role's own model folder."""
    base = {**role_run_args(tmp_path, tiny_args), "role_adapters": "separate", "learning_rate": 3e-2,
            "dtype": "float32"}
    a, _, c, _ = straight_and_resumed(base, tmp_path)
    pa, pc = dict(a.model.named_parameters()), dict(c.model.named_parameters())
    assert pa.keys() == pc.keys() and all(torch.equal(v, pc[k]) for k, v in pa.items())
    scout, solver = a.model.roles["scout"].state_dict(), a.model.roles["solver"].state_dict()
    assert not all(torch.equal(scout[k], solver[k]) for k in scout)
    from safetensors.torch import load_file
    for role in ("scout", "solver"):
        saved = load_file(str(tmp_path / "a" / "final" / role / "model.safetensors"))
        own = a.model.roles[role].state_dict()
        assert all(torch.equal(v, own[k]) for k, v in saved.items()), role


def test_the_loss_is_formed_per_role_by_hand():
    """token_mean over a two-role step: role 0 has row A (2 tokens of loss 1), role 1 rows B (4 tokens of 2) and C
    (2 tokens of 4). Joint: (2 + 8 + 8) / 8 = 2.25; per role: 2/2 + (8 + 8)/6 = 1 + 8/3. Split into micro-batches
    [A, B] and [C], the sum of their losses is the same; seq_mean_token_mean per role: 1 + (2 + 4)/2 = 4."""
    from types import SimpleNamespace

    from grpolab.algorithms import AGGREGATIONS, aggregate_loss, step_totals
    loss = torch.tensor([[1.0, 1, 0, 0], [2, 2, 2, 2], [4, 4, 0, 0]])
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    role = torch.tensor([0, 1, 1])

    def mb(rows):
        return SimpleNamespace(completion_mask=mask[rows], row_data={"role": role[rows]})
    whole, parts = [mb([0, 1, 2])], [mb([0, 1]), mb([2])]
    token_mean, seq_mean = AGGREGATIONS.get("token_mean"), AGGREGATIONS.get("seq_mean_token_mean")
    totals = step_totals(whole, constant=4)
    assert sorted(totals) == [0, 1] and (totals[0].num_tokens, totals[1].num_tokens) == (2, 6)
    assert float(aggregate_loss(token_mean, loss, mask, totals, role)) == pytest.approx(1 + 8 / 3)
    split = step_totals(parts, constant=4)
    assert float(sum(aggregate_loss(token_mean, loss[r], mask[r], split, role[r]) for r in ([0, 1], [2]))) == \
        pytest.approx(1 + 8 / 3)
    assert float(aggregate_loss(seq_mean, loss, mask, totals, role)) == pytest.approx(4.0)
    one_role = step_totals([SimpleNamespace(completion_mask=mask, row_data={"role": torch.zeros(3)})], constant=4)
    assert float(aggregate_loss(token_mean, loss, mask, one_role, torch.zeros(3))) == pytest.approx(2.25)  # joint
    no_roles = step_totals([SimpleNamespace(completion_mask=mask, row_data={})], constant=4)
    assert float(aggregate_loss(token_mean, loss, mask, no_roles)) == pytest.approx(2.25)


def test_ctde_joint_reward_by_hand(tmp_path, tiny_args, monkeypatch):
    """ctde_joint_reward on scripted two-round team episodes: R - .05 turns - .05 (coordination chars / 100)."""
    from grpolab.rewards.transforms import ctde_costs
    t = [{"role": "scout", "turns": ["Ann lives in Rome.", "yes"]}, {"role": "solver", "turns": ["where?", "Italy"]}]
    # 4 turns; coordination: every message but the solver's last: 18 + 3 + 6 = 27 characters
    assert ctde_costs(t, None) == (4, 27) and ctde_costs(t, "scout") == (4, 18 + 6 + 5)  # the scout answers
    texts = [["a1", "b1", "c1", "d1"], ["x1", "y1", "z1", "w1"], ["a2", "bb2", "c2", "d2"], ["yes", "y", "n", "yes"]]
    tr, b, _ = team_step(tmp_path, tiny_args, monkeypatch, texts, team_rounds=2,
                         reward_transforms=["ctde_joint_reward"], ctde_speed_weight=0.05, ctde_cost_weight=0.05)
    # e0: 4 turns, coordination a1 x1 a2 = 6 chars, R 1 -> 1 - .2 - .05 * .06 = .797
    # e1: coordination b1 y1 bb2 = 7 chars, R 0 -> -.2 - .0035 = -.2035; e2: 6 chars, R 0 -> -.203; e3: R 1 -> .797
    want = [0.797, 0.797, -0.2035, -0.2035, -0.203, -0.203, 0.797, 0.797]
    assert b.scalar_rewards.tolist() == pytest.approx(want, abs=1e-6)


def test_report_of_a_team_run_shows_its_roles(tiny_args, tmp_path):
    """grpolab report on a two-role run: the page builds, with the evaluation, the logged completions and the
    per-role curves (reward, turn length, held-out accuracy of the team and of each role)."""
    from grpolab.cli import main
    out = tmp_path / "magrpo"
    args = {**recipe_overrides("magrpo"), **tiny_args, "task": "split_facts", "prompts_per_step": 2,
            "num_generations": 2, "max_completion_length": 5, "split_facts_rows": 24, "split_facts_eval": 4,
            "log_completions_steps": 1, "eval_before": True, "eval_after": True, "eval_steps": 1, "steps": 3,
            "out": str(out)}
    Trainer(Config.build(args), log=lambda *a: None).train(progress=False)
    page = tmp_path / "report.html"
    assert main(["report", str(out), "--out", str(page)]) == 0
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "grpolab report: magrpo" in html
    assert "accuracy" in html and "You are the solver" in html  # evaluation table; a logged solver prompt
    for title in ("team reward per role", "team turn length per role", "held-out accuracy: team and each role"):
        assert title in html, title
    for key in ("rollout/team/scout/reward", "rollout/team/solver/turn_tokens", "eval/roles/scout/accuracy"):
        assert key in html, key


def test_compare_of_team_runs_reads_each_roles_held_out_accuracy(tmp_path):
    """grpolab compare on two team arms (channel on / off): every run finishes, and the table has the team's
    accuracy and each role's (``--metric accuracy,roles/solver/accuracy``)."""
    from grpolab.compare import main as compare
    out = tmp_path / "cmp"
    rc = compare(["--variant", "on=--recipe magrpo", "--variant", "off=--recipe magrpo --team_channel off",
                  "--seeds", "0", "--model", "tiny", "--task", "split_facts", "--split_facts_rows", "24",
                  "--split_facts_eval", "4", "--steps", "2", "--prompts_per_step", "2", "--num_generations", "2",
                  "--max_completion_length", "4", "--eval_steps", "2", "--tensorboard", "false",
                  "--metric", "accuracy,roles/solver/accuracy,roles/scout/accuracy", "--no-report",
                  "--out", str(out)], log=lambda *a: None)
    assert rc == 0
    data = json.loads((out / "compare.json").read_text())
    assert sorted(r["arm"] for r in data["runs"]) == ["off", "on"]
    md = (out / "compare.md").read_text()
    assert "roles/solver/accuracy" in md and "roles/scout/accuracy" in md and "| `off` |" in md


def test_simultaneous_roles_hear_each_other_only_in_the_next_round(tmp_path, tiny_args, monkeypatch):
    """``team_order: simultaneous`` (CoMLRL's MAGRPO: the agents of a turn generate at once): in round 1 the solver
    does not hear the scout's round-1 message; in round 2 each role hears the other's round-1 message and the
    solver not the scout's round-2 one. ``in_turn`` (grpolab's default) lets the solver hear the scout at once."""
    texts = [["a1", "b1", "c1", "d1"], ["x1", "y1", "z1", "w1"], ["a2", "b2", "c2", "d2"], ["yes", "y", "n", "yes"]]
    _, _, fake = team_step(tmp_path, tiny_args, monkeypatch, texts, team_rounds=2, team_order="simultaneous")
    assert not any("scout:" in c for c in fake.contexts[1])  # solver, round 1: nothing heard yet
    assert "solver: x1" in fake.contexts[2][0] and "solver: w1" in fake.contexts[2][3]  # scout, round 2
    assert "scout: a1" in fake.contexts[3][0] and "scout: a2" not in fake.contexts[3][0]  # solver, round 2
    _, _, fake = team_step(tmp_path / "t", tiny_args, monkeypatch, texts, team_rounds=2)
    assert "scout: a1" in fake.contexts[1][0] and "scout: a2" in fake.contexts[3][0]
    with pytest.raises(ConfigError, match="team_order"):
        Config.build({"rollout_strategy": "team", "roles": ["a", "b"], "team_order": "turns"})


def test_magrpo_scores_untempered_log_probs_as_comlrl(tmp_path, tiny_args, monkeypatch):
    """CoMLRL samples at temperature 0.6 and trains log_softmax(logits) of the sampled tokens; recipe magrpo does
    the same (logprob_temperature 1.0), grpolab's default is log_softmax(logits / 0.6). By hand from the native
    forward (model(input_ids, attention_mask, position_ids).logits at the positions before each completion
    token). A ratio loss with a different scoring temperature is refused."""
    args = {**recipe_overrides("magrpo"), "team_rounds": 1, "roles": [{"name": "scout", "view": "hint"},
                                                                    {"name": "solver"}]}
    args.pop("task")
    tr, b, _ = team_step(tmp_path, tiny_args, monkeypatch, ONE_ROUND, **args)
    assert tr.cfg.temperature == 0.6 and tr.policy.score_temperature == 1.0
    from grpolab.model.logprobs import sequence_inputs
    ids, attn, pos = sequence_inputs(b)
    with torch.no_grad():
        logits = tr.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
        got = tr.ctx.logprobs(b)
    P, T = b.prompt_ids.shape[1], b.completion_ids.shape[1]
    z = logits[:, P - 1:P + T - 1]
    m = b.completion_attention_mask.bool()
    for temp, want_from in ((1.0, got), (0.6, None)):
        want = torch.log_softmax(z / temp, -1).gather(-1, b.completion_ids[..., None]).squeeze(-1)
        if want_from is None:
            tr.policy.score_temperature = 0.6
            with torch.no_grad():
                want_from = tr.ctx.logprobs(b)
        assert torch.allclose(want_from[m], want[m], atol=1e-4), temp
    with pytest.raises(ConfigError, match="logprob_temperature: 1 differs from temperature 0.6"):
        Config.build({**recipe_overrides("magrpo"), "policy_loss": "clipped_ratio"})
