"""Seed 000-106 (FunRL / EGPO, arXiv:2508.05118): the CoT-entropy advantage, the structured-reasoning format
and single-criteria reward, the two-stage data preparation (model evaluation + AST validation), the recipe."""
import json

import pytest
import torch

from grpolab.algorithms import WEIGHTINGS
from grpolab.cli import main
from grpolab.errors import ConfigError
from grpolab.policies.causal_lm.policy import tag_token_mask
from grpolab.tasks import get_task
from grpolab.tasks.fc_data_prep import pass_rate, prepare_fc_data
from grpolab.tasks.function_calls import (TOOLS, fc_row, fc_single_criteria, fc_think_format, format_calls,
                                          parse_calls, schema_errors)

W = WEIGHTINGS.get("fc_cot_entropy_advantage")


def close(a, b, tol=1e-9):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol)


# ----------------------------------------------------------------------------- the entropy advantage

ENT = torch.tensor([[1.0, 2.0, 3.0, 9.0],
                    [0.5, 0.5, 0.5, 0.5],
                    [4.0, 4.0, 4.0, 4.0],
                    [2.0, 2.0, 2.0, 2.0]])
THINK = torch.tensor([[0., 1., 1., 0.],
                      [1., 1., 0., 0.],
                      [1., 1., 1., 1.],
                      [0., 0., 0., 0.]])          # row 3 has no <think> block
MASK = torch.ones(4, 4)
ADV = torch.tensor([3.0, -0.5, 0.0, 0.2])


def test_cot_entropy_advantage_hand_computed():
    # H (think span): row0 (2+3)/2 = 2.5; row1 (0.5+0.5)/2 = 0.5; row2 4.0; row3 no CoT -> 0.
    # scale_then_clip, lambda 0.4, kappa 2: psi = min(0.4 H, |A|/2)
    #   row0 min(1.0, 1.5) = 1.0 -> 4.0;  row1 min(0.2, 0.25) = 0.2 -> -0.3
    #   row2 min(1.6, 0) = 0 -> 0.0;      row3 min(0, 0.1) = 0 -> 0.2
    out = W(ADV, ENT, THINK, MASK, fc_entropy_lambda=0.4, fc_entropy_kappa=2.0)
    assert close(out, [4.0, -0.3, 0.0, 0.2])
    # clip_then_scale: psi = 0.4 min(H, |A|/2): row0 0.4*1.5 = 0.6 -> 3.6; row1 0.4*0.25 = 0.1 -> -0.4
    out = W(ADV, ENT, THINK, MASK, fc_entropy_form="clip_then_scale")
    assert close(out, [3.6, -0.4, 0.0, 0.2])
    # span 'completion': row0 H = (1+2+3+9)/4 = 3.75 -> min(1.5, 1.5) = 1.5 -> 4.5; row3 H = 2 -> min(0.8, 0.1)
    # = 0.1 -> 0.3; row1 H = 0.5 as before -> -0.3
    out = W(ADV, ENT, THINK, MASK, fc_entropy_span="completion")
    assert close(out, [4.5, -0.3, 0.0, 0.3])


def test_cot_entropy_advantage_relations():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(64, generator=g)
    ent = torch.rand(64, 8, generator=g) * 5
    think = (torch.rand(64, 8, generator=g) > 0.3).float()
    out = W(adv, ent, think, torch.ones(64, 8))
    # never flips a sign, never lowers an advantage, adds at most |A|/kappa
    assert bool((torch.sign(out) == torch.sign(adv)).all())
    assert bool((out >= adv).all()) and bool((out - adv <= adv.abs() / 2 + 1e-6).all())
    # lambda 0 is GRPO
    assert close(W(adv, ent, think, torch.ones(64, 8), fc_entropy_lambda=0.0), adv)
    # per-token advantages [R, T]: the cap is per token, the entropy per row
    a2 = torch.tensor([[2.0, 0.4, 0.0, 0.0]])
    # H = (1+2+3+9)/4 = 3.75 (completion span) -> lambda H = 1.5; caps 1.0, 0.2, 0, 0
    assert close(W(a2, ENT[:1], THINK[:1], MASK[:1], fc_entropy_span="completion"), [[3.0, 0.6, 0.0, 0.0]])
    with pytest.raises(ConfigError, match="fc_entropy_kappa"):
        W(adv, ent, think, torch.ones(64, 8), fc_entropy_kappa=1.0)
    with pytest.raises(ConfigError, match="fc_entropy_span"):
        W(adv, ent, think, torch.ones(64, 8), fc_entropy_span="answer")


class _Tok:
    """A tokenizer whose tokens are fixed strings (hand-checkable character spans)."""
    vocab = ["<think>", "a", "b", "</think>", "<answer>", "[f()]", "</answer>", "b</th", "ink>", "x"]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.vocab[i] for i in ids)


def test_think_token_mask_by_hand():
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6],       # <think> a b </think> <answer> [f()] </answer>
                        [0, 1, 7, 8, 9, 9, 9],       # <think> a "b</th" "ink>" x: the straddling token has 'b'
                        [9, 1, 2, 9, 9, 9, 9],       # no <think>
                        [0, 1, 2, 0, 0, 0, 0]])      # unclosed: to the end; only 3 tokens exist
    att = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 7, [1] * 3 + [0] * 4])
    m = tag_token_mask(_Tok(), ids, att)
    assert m.tolist() == [[0, 1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0], [0] * 7, [0, 1, 1, 0, 0, 0, 0]]


def test_token_entropy_input_is_the_policys_entropy(tiny_args):
    """The trainer hands the weighting the exact vocabulary entropy of each completion token (recomputed here
    from the logits of a plain forward pass)."""
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    cfg = Config.build({**recipe_overrides("fc_entropy_grpo"), **tiny_args, "task": "function_calls",
                        "prompts_per_step": 1, "num_generations": 2, "max_completion_length": 5})
    t = Trainer(cfg, log=lambda *a: None)
    batch, _, _ = t.collect()
    got = t.policy.advantage_inputs(t.model, batch, frozenset({"token_entropy", "think_token_mask"}),
                                    micro_batch_size=4)
    i = 0
    p = batch.prompt_ids[i][batch.prompt_mask[i] > 0]
    c = batch.completion_ids[i][batch.completion_attention_mask[i] > 0]
    with torch.no_grad():
        logits = t.model(input_ids=torch.cat([p, c])[None]).logits[0, len(p) - 1:-1].double() / cfg.temperature
    logp = torch.log_softmax(logits, -1)
    H = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(got["token_entropy"][i, :len(c)].double(), H, atol=1e-4)
    assert got["think_token_mask"].shape == batch.completion_ids.shape


# ----------------------------------------------------------------------------- call syntax, schemas, rewards

def test_parse_and_format_calls():
    assert parse_calls("[convert_currency(base_currency='JPY', target_currency='USD', amount=20000)]") == [
        {"name": "convert_currency", "arguments": {"base_currency": "JPY", "target_currency": "USD", "amount": 20000}}]
    assert parse_calls("math.hypot(x=3, y=[1, 2])") == [{"name": "math.hypot", "arguments": {"x": 3, "y": [1, 2]}}]
    assert parse_calls("[]") == []
    for bad in ("[f(1)]", "[f(a=x)]", "[f(a=1, a=2)]", "f(a=1", "[1, 2]", "<answer>f()</answer>"):
        assert parse_calls(bad) is None, bad
    calls = [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}]
    assert format_calls(calls) == "[get_weather(city='Oslo', unit='celsius')]"
    assert parse_calls(format_calls(calls)) == calls


def test_schema_errors_hand_made():
    ok = [{"name": "book_hotel", "arguments": {"hotel": "Blue Inn", "nights": 2, "breakfast": True}}]
    assert schema_errors(ok, TOOLS) == []
    cases = {
        "not among the tools": [{"name": "book_flight", "arguments": {"to": "Lima"}}],
        "unknown argument 'room'": [{"name": "book_hotel", "arguments": {"hotel": "X", "nights": 1, "room": 3}}],
        "missing required argument 'nights'": [{"name": "book_hotel", "arguments": {"hotel": "X"}}],
        "'2' is not of type integer": [{"name": "book_hotel", "arguments": {"hotel": "X", "nights": "2"}}],
        "True is not of type integer": [{"name": "book_hotel", "arguments": {"hotel": "X", "nights": True}}],
        "'kelvin' is not one of": [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "kelvin"}}],
        "no call": [],
    }
    for expected, calls in cases.items():
        errs = schema_errors(calls, TOOLS)
        assert len(errs) == 1 and expected in errs[0], (expected, errs)
    # number accepts integers and floats; the OpenAI/TRL wrapper is read too
    wrapped = [{"type": "function", "function": t} for t in TOOLS]
    assert schema_errors([{"name": "convert_currency", "arguments": {"base_currency": "EUR", "target_currency": "USD",
                                                                      "amount": 2.5}}], wrapped) == []


def test_format_and_single_criteria_rewards():
    gold = [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "arguments": {"city": "Lima"}}]
    comps = [
        "<think>two cities</think><answer>[get_weather(city='Lima'), get_weather(city='Oslo')]</answer>",  # 1, 1
        "<think>two cities</think> <answer>[get_weather(city='Oslo')]</answer>",        # format 1, wrong calls 0
        "<answer>[get_weather(city='Oslo'), get_weather(city='Lima')]</answer>",         # no think: 0, 0
        "<think> </think><answer>[get_weather(city='Oslo'), get_weather(city='Lima')]</answer>",  # blank: 0, 0
        "<think>x</think><answer>get_weather('Oslo')</answer>",                           # positional: 0, 0
        "<think>x</think><answer>[get_weather(city='oslo'), get_weather(city='LIMA')]</answer> more",  # tail: 0, 0
        "<think>x</think><answer>[get_weather(city='oslo'), get_weather(city='LIMA')]</answer>",  # case-folded: 1, 1
    ]
    assert fc_think_format(completions=comps) == [1, 1, 0, 0, 0, 0, 1]
    assert fc_single_criteria(completions=comps, gold_tool_calls=[gold] * len(comps)) == [1, 0, 0, 0, 0, 0, 1]
    # the reference may also be given as Python call syntax or JSON text
    assert fc_single_criteria(completions=comps[:1], gold_tool_calls=[format_calls(gold)]) == [1]
    assert fc_single_criteria(completions=comps[:1], gold_tool_calls=[json.dumps(gold)]) == [1]


def test_builtin_task_rows_are_valid_and_solvable():
    t = get_task("function_calls", function_calls_n_train=50, function_calls_n_eval=10)
    assert len(t.train_rows) == 50 and len(t.eval_rows) == 10
    assert not {r["question"] for r in t.train_rows} & {r["question"] for r in t.eval_rows}
    for r in t.train_rows:
        assert schema_errors(r["gold_tool_calls"], r["tools"]) == []
        perfect = f"<think>ok</think><answer>{r['answer']}</answer>"
        assert fc_single_criteria(completions=[perfect], gold_tool_calls=[r["gold_tool_calls"]]) == [1.0]


# ----------------------------------------------------------------------------- two-stage data preparation

def _prep_rows():
    """Three valid rows of the built-in format plus three hand-made invalid references."""
    good = [fc_row("What is the weather in Oslo?", [{"name": "get_weather", "arguments": {"city": "Oslo"}}]),
            fc_row("Book 2 nights at the Blue Inn.", [{"name": "book_hotel", "arguments": {"hotel": "Blue Inn",
                                                                                         "nights": 2}}]),
            fc_row("Where is the Old Mill?", [{"name": "get_location", "arguments": {"place": "Old Mill"}}])]
    bad = [fc_row("Fly me to Lima.", [{"name": "book_flight", "arguments": {"to": "Lima"}}]),
           fc_row("Book 3 nights at Sea View.", [{"name": "book_hotel", "arguments": {"hotel": "Sea View",
                                                                                    "nights": "three"}}]),
           {**fc_row("Weather in Riga?", []), "gold_tool_calls": "get_weather(Riga)"}]   # unreadable reference
    return good + bad


def _right(row):
    return f"<think>params ok</think><answer>{row['answer']}</answer>"


def test_prepare_fc_data_two_stages_by_hand():
    rows = _prep_rows()
    # stage 1 stub model, 4 attempts per row: row 0 solved 4/4 (dropped), row 1 solved 1/4, row 2 0/4;
    # the invalid rows 'solved' 4/4, 2/4 and 0/4 (their references are wrong, a model cannot tell)
    wrong = "<think>hmm</think><answer>[get_location(place='Paris')]</answer>"
    plan = {0: 4, 1: 1, 2: 0, 3: 4, 4: 2, 5: 0}
    calls = []

    def generate(prompts, n):
        calls.append((len(prompts), n))
        return [[_right(rows[i])] * plan[i] + [wrong] * (n - plan[i]) for i in range(len(prompts))]

    rep = prepare_fc_data(rows, generate=generate, attempts=4)
    assert calls == [(6, 4)]
    # stage 1 drops rows 0 and 3 (pass rate 1.0 >= 1.0); stage 2 drops rows 4 (type) and 5 (unreadable)
    assert [r["question"] for r in rep.kept] == [rows[1]["question"], rows[2]["question"]]
    assert [r["fc_pass_rate"] for r in rep.kept] == [0.25, 0.0]
    stages = {r["question"]: (r["fc_drop_stage"], r["fc_drop_reason"]) for r in rep.dropped}
    assert stages[rows[0]["question"]][0] == 1 and "100% of 4 attempts" in stages[rows[0]["question"]][1]
    assert stages[rows[3]["question"]][0] == 1
    assert stages[rows[4]["question"]] == (2, "call 0: book_hotel.nights: 'three' is not of type integer")
    assert stages[rows[5]["question"]][0] == 2 and "not readable" in stages[rows[5]["question"]][1]
    assert rep.summary() == {"rows": 6, "kept": 2, "dropped_stage1_model_evaluation": 2,
                             "dropped_stage2_ast_validation": 2, "stage1_ran": True}
    # a lower threshold drops 'mostly solved' rows too: 0.5 drops rows 0, 3 and 4 (2/4 = 0.5) in stage 1
    rep = prepare_fc_data(rows, generate=generate, attempts=4, drop_pass_rate=0.5)
    assert sorted(r["question"] for r in rep.dropped if r["fc_drop_stage"] == 1) == sorted(
        rows[i]["question"] for i in (0, 3, 4))
    # without stage 1: only the AST validation; the invalid flight row is caught there
    rep = prepare_fc_data(rows, attempts=0)
    assert [r["question"] for r in rep.kept] == [r["question"] for r in rows[:3]]
    assert "'book_flight' is not among the tools" in rep.dropped[0]["fc_drop_reason"]
    # a judge drops what it rejects, in stage 1
    rep = prepare_fc_data(rows, attempts=0, judge=lambda r: "Oslo" not in r["question"])
    assert rep.dropped[0]["fc_drop_stage"] == 1 and rep.dropped[0]["fc_drop_reason"] == "rejected by the judge"
    assert pass_rate(rows[1], [_right(rows[1]), "x", "y"]) == pytest.approx(1 / 3)


def test_prepare_fc_data_errors_name_the_fix():
    rows = _prep_rows()
    with pytest.raises(ConfigError, match="needs a model"):
        prepare_fc_data(rows, attempts=2)
    with pytest.raises(ConfigError, match="no column 'tools'"):
        prepare_fc_data([{"prompt": "p", "gold_tool_calls": []}], attempts=0)
    with pytest.raises(ConfigError, match="drop_pass_rate"):
        prepare_fc_data(rows, attempts=0, drop_pass_rate=0.0)


def test_fc_prep_cli(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _prep_rows()))
    out, dropped = tmp_path / "kept.jsonl", tmp_path / "dropped.jsonl"
    assert main(["fc-prep", "--data", str(data), "--attempts", "0", "--out", str(out), "--dropped",
                 str(dropped)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["kept"] == 3 and summary["dropped_stage2_ast_validation"] == 3
    assert len(out.read_text().splitlines()) == 3 and len(dropped.read_text().splitlines()) == 3
    # stage 1 with a real (tiny, untrained) model: it solves nothing, so stage 1 keeps every row
    assert main(["fc-prep", "--data", str(data), "--model", "tiny", "--attempts", "2", "--max-new-tokens", "4",
                 "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"rows": 6, "kept": 3, "dropped_stage1_model_evaluation": 0,
                       "dropped_stage2_ast_validation": 3, "stage1_ran": True}
    assert all(json.loads(line)["fc_pass_rate"] == 0.0 for line in out.read_text().splitlines())
    assert main(["fc-prep", "--data", str(data), "--out", str(out)]) == 2   # stage 1 without --model


def test_prepared_rows_train_with_the_recipe(tmp_path, capsys):
    """The rows fc-prep keeps are training data for the recipe, scored by the single-criteria reward."""
    from grpolab.train.metrics import read_metrics

    data, kept = tmp_path / "rows.jsonl", tmp_path / "kept.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _prep_rows()))
    assert main(["fc-prep", "--data", str(data), "--attempts", "0", "--out", str(kept)]) == 0
    out = tmp_path / "run"
    assert main(["train", "--recipe", "fc_entropy_grpo", "--model", "tiny", "--data", str(kept), "--reward",
                 "grpolab.tasks.function_calls:fc_single_criteria", "--steps", "1", "--prompts_per_step", "2",
                 "--num_generations", "2", "--max_completion_length", "4", "--eval_split", "0.34",
                 "--eval_before", "false", "--eval_after", "false", "--tensorboard", "false", "--out", str(out)]) == 0
    rows = read_metrics(out)
    assert len(rows) == 1 and "rewards/fc_single_criteria/mean" in rows[0]


# ----------------------------------------------------------------------------- the recipe

def test_fc_entropy_grpo_recipe_trains_with_the_entropy_term(tiny_args):
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.metrics import read_metrics
    from grpolab.train.trainer import Trainer

    rec = recipe_overrides("fc_entropy_grpo")
    assert rec["task"] == "function_calls" and rec["advantage_weightings"] == ["fc_cot_entropy_advantage"]
    cfg = Config.build({**rec, **tiny_args, "task": "function_calls", "steps": 2, "prompts_per_step": 2,
                        "num_generations": 2, "max_completion_length": 8})
    t = Trainer(cfg, log=lambda *a: None)
    t.train(progress=False)
    rows = read_metrics(tiny_args["out"])
    assert len(rows) == 2 and all(r["skipped"] == 0 for r in rows) and "rewards/format/mean" in rows[0]


def test_trainer_adds_the_entropy_term_to_grpo_advantages(tiny_args):
    """The trainer's advantages are group z-scores plus min(0.4 H_i, |A_i|/2), H_i from the policy's entropy."""
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    cfg = Config.build({**recipe_overrides("fc_entropy_grpo"), **tiny_args, "task": "function_calls",
                        "prompts_per_step": 1, "num_generations": 2, "max_completion_length": 6,
                        "fc_entropy_span": "completion"})   # the untrained model writes no <think> block
    t = Trainer(cfg, log=lambda *a: None)
    batch, _, _ = t.collect()
    batch.scalar_rewards = torch.tensor([1.0, 0.0])
    # group z-score of (1, 0): mean 0.5, sample std 0.7071 -> +-0.7071 (std + 1e-4 in the denominator)
    a = 0.5 / (2 ** 0.5 / 2 + 1e-4)
    ent = t.policy.advantage_inputs(t.model, batch, frozenset({"token_entropy"}), micro_batch_size=4)["token_entropy"]
    m = batch.completion_mask
    H = (ent * m).sum(-1) / m.sum(-1)
    psi = torch.minimum(0.4 * H, torch.tensor(a / 2))
    adv = t.compute_advantages(batch)
    want = torch.stack([a + psi[0], -a + psi[1]])[:, None] * m
    assert torch.allclose(adv.double(), want.double(), atol=1e-4), (adv, want)
