"""IRPO (000-21) end to end: a pointwise generative reward model trained with GRPO under a Bradley-Terry model
(task irpo_prefs, recipe irpo_grm), then used to train a policy (reward spec grm:PATH, recipe irpo_policy)."""
import json
import math

import pytest

from grpolab.config import Config, ConfigError
from grpolab.recipes import recipe_overrides
from grpolab.tasks import get_task
from grpolab.tasks.irpo_prefs import (intergroup_bt_rewards, irpo_bt, judge_format, judge_prompt, pair_accuracy,
                                      parse_judge_score)
from grpolab.train.trainer import Trainer

S3, S1, S6 = 0.9525741268224334, 0.7310585786300049, 0.9975273768433653  # sigmoid(3), sigmoid(1), sigmoid(6)


# ---------------------------------------------------------------- score parsing (strict)

@pytest.mark.parametrize("text,score", [("The answer is right. Score: 9", 9.0), ("Score:10", 10.0),
                                        ("wrong\nScore: 0 ", 0.0), ("Score: 07", 7.0)])
def test_parse_judge_score_reads_a_final_score(text, score):
    assert parse_judge_score(text) == score


@pytest.mark.parametrize("text", ["Score: 7.", "Score: 11", "Score: 7 then more", "MyScore: 7", "score: 7",
                                  "Score: -1", "Score: 4.5", "", "no score at all", "Score: 100"])
def test_parse_judge_score_refuses_anything_else(text):
    assert parse_judge_score(text) is None


# ---------------------------------------------------------------- the intergroup Bradley-Terry reward

def test_intergroup_bt_rewards_hand_computed():
    # pair p: chosen judgements 7 and 5, rejected judgements 4 and one unparseable; pair q: chosen 6, rejected
    # unparseable only.
    scores = [7.0, 5.0, 4.0, None, 6.0, None]
    pairs = ["p", "p", "p", "p", "q", "q"]
    sides = [1, 1, 0, 0, 1, 0]
    got = intergroup_bt_rewards(scores, pairs, sides)
    expect = [S3,               # chosen 7 vs rejected {4}: sigmoid(7 - 4)
              S1,               # chosen 5 vs {4}: sigmoid(1)
              (S3 + S1) / 2,    # rejected 4 vs chosen {7, 5}: (sigmoid(7-4) + sigmoid(5-4)) / 2 = 0.84181635
              0.0,              # unparseable
              0.5,              # chosen 6, no parseable rejected judgement: no evidence
              0.0]
    assert got == pytest.approx(expect, abs=1e-12)
    assert intergroup_bt_rewards([7.0, 4.0], ["p", "p"], [1, 0], scale=2.0) == pytest.approx([S6, S6], abs=1e-12)
    # a GRM that orders the pair right earns more than one that orders it wrong, on both sides
    right = intergroup_bt_rewards([8.0, 2.0], ["p", "p"], [1, 0])
    wrong = intergroup_bt_rewards([2.0, 8.0], ["p", "p"], [1, 0])
    assert right[0] > 0.5 > wrong[0] and right[1] > 0.5 > wrong[1]
    assert right[0] + wrong[0] == pytest.approx(1.0)  # sigmoid(d) + sigmoid(-d) = 1


def test_reward_functions_read_the_pair_columns():
    comps = ["ok Score: 7", "ok Score: 5", "bad Score: 4", "blah", "Score: 6", "x", "Score: 2", "Score: 3"]
    pairs = ["p", "p", "p", "p", "q", "q", "r", "r"]
    sides = [1, 1, 0, 0, 1, 0, 1, 0]
    assert irpo_bt(completions=comps, irpo_pair=pairs, irpo_side=sides)[:6] == \
        pytest.approx([S3, S1, (S3 + S1) / 2, 0.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="paraphrase_sets.*irpo_pair"):  # prompts drawn one by one: no pair whole
        irpo_bt(completions=comps[:3], irpo_pair=["p", "q", "r"], irpo_side=[1, 0, 1])
    assert judge_format(completions=comps) == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    # chosen above the mean of the rejected scores / rejected below the chosen mean; q's chosen has no
    # parseable opponent (None), q's rejected is unparseable with an opponent (0); r is ordered wrong (0, 0)
    assert pair_accuracy(completions=comps, irpo_pair=pairs, irpo_side=sides) == \
        [1.0, 1.0, 1.0, 0.0, None, 0.0, 0.0, 0.0]


# ---------------------------------------------------------------- the task and its sampler

def test_task_rows_come_in_pairs_and_the_sampler_keeps_them_together():
    from grpolab.prompts.paraphrase import ParaphraseSetSampler
    t = get_task("irpo_prefs")
    rows = t.train_rows
    assert len(rows) == 2 * 1722 and len(t.eval_rows) == 2 * 200
    for a, b in zip(rows[0:40:2], rows[1:40:2]):
        assert a["irpo_pair"] == b["irpo_pair"] and (a["irpo_side"], b["irpo_side"]) == (1, 0)
        assert a["response"] == f"Answer: {a['answer']}" == a["chosen"] == b["chosen"]
        assert b["response"] == b["rejected"] and 1 <= abs(int(b["rejected"].split()[-1]) - int(a["answer"])) <= 3
        assert a["prompt"] == judge_prompt(a["question"], a["response"])
    sampler = ParaphraseSetSampler(len(rows), seed=0, rows=rows, paraphrase_set_column="irpo_pair")
    for _ in range(5):
        picked = sampler.next(8)
        pairs = [rows[i]["irpo_pair"] for i in picked]
        assert all(pairs.count(p) == 2 for p in pairs)


# ---------------------------------------------------------------- grm:PATH, the trained GRM as a reward

def test_grm_reward_judges_each_completion_once_with_the_training_prompt(tmp_path, monkeypatch):
    from grpolab.rewards import parse_reward_spec
    from grpolab.rewards.grm import GenerativeRewardModel
    (tmp_path / "config.json").write_text("{}")
    r = parse_reward_spec(f"grm:{tmp_path}=0.5")
    assert r.name == "grm" and r.weight == 0.5 and isinstance(r.fn, GenerativeRewardModel)
    seen = []
    monkeypatch.setattr(r.fn, "judgements", lambda prompts: seen.extend(prompts) or ["fine. Score: 8", "garbage"])
    got = r.fn(prompts=[[{"role": "user", "content": "Compute 1 + 2."}]] * 2, completions=["Answer: 3", "Answer: 4"],
               question=["1 + 2", "1 + 2"])
    assert got == [8.0, None]  # an unparseable judgement is unscorable, never a silent 0
    assert seen == [judge_prompt("1 + 2", "Answer: 3"), judge_prompt("1 + 2", "Answer: 4")]
    with pytest.raises(ConfigError, match="is missing.*irpo_grm"):
        parse_reward_spec(f"grm:{tmp_path / 'missing'}")


# ---------------------------------------------------------------- recipes and the two-phase flow

def test_recipes_name_their_parts():
    p1, p2 = recipe_overrides("irpo_grm"), recipe_overrides("irpo_policy")
    assert p1["task"] == "irpo_prefs" and p1["prompt_sampler"] == "paraphrase_sets"
    assert p1["paraphrase_set_column"] == "irpo_pair" and p1["prompts_per_step"] % 2 == 0
    assert p2["reward_transforms"] == ["irpo_bradley_terry"] and p2["irpo_reward_column"] == "grm"


def _args(recipe, out, **over):
    return {**recipe_overrides(recipe), "model": "tiny", "micro_batch_size": 32, "threads": 1, "eval_before": False,
            "eval_after": False, "tensorboard": False, "save_steps": 1000, "out": str(out), **over}


def test_phase_two_without_a_grm_stops_and_names_it(tmp_path):
    assert recipe_overrides("irpo_policy")["reward"] == ["grm:runs/irpo_grm/final"]  # phase 1's default output
    with pytest.raises(ConfigError, match="missing.*irpo_grm"):
        Trainer(Config.build(_args("irpo_policy", tmp_path / "p2", steps=1, reward=[f"grm:{tmp_path / 'missing'}"])),
                log=lambda *a: None)


def test_format_warmup_rows_are_label_free():
    from grpolab.tasks.irpo_prefs import format_warmup_rows
    rows = get_task("irpo_prefs").train_rows[:400]
    warm = format_warmup_rows(rows, seed=3)
    assert [w["prompt"] for w in warm] == [r["prompt"] for r in rows]
    scores = [parse_judge_score(w["completion"]) for w in warm]
    assert all(s is not None for s in scores) and len(set(scores)) == 11  # the format, every score 0..10
    assert scores == [parse_judge_score(w["completion"]) for w in format_warmup_rows(rows[::-1], seed=3)]  # row order
    # label-free: the targets do not depend on the side (the same draws whichever response a row judges)
    flipped = [{**r, "irpo_side": 1 - r["irpo_side"]} for r in rows]
    assert [w["completion"] for w in format_warmup_rows(flipped, seed=3)] == [w["completion"] for w in warm]


def test_two_phases_train_the_grm_then_a_policy_with_it(tmp_path):
    """A label-free format warm-up of the tiny GRM (grpolab sft, 40 steps: a random tiny model writes no
    parseable score, so IRPO would have no signal), phase 1: two GRPO steps of the GRM on preference pairs, saved
    to OUT/final, phase 2: one policy step on arithmetic whose reward column 'grm' is the saved GRM's judgement of
    each completion."""
    from grpolab.cli import main
    from grpolab.tasks.irpo_prefs import format_warmup_rows
    data = tmp_path / "warm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in format_warmup_rows(get_task("irpo_prefs").train_rows[:200])))
    assert main(["sft", "--model", "tiny", "--data", str(data), "--out", str(tmp_path / "sft"), "--sft_steps", "40",
                 "--sft_batch_size", "8", "--sft_learning_rate", "3e-3", "--threads", "1"]) == 0
    out1 = tmp_path / "grm"
    t = Trainer(Config.build(_args("irpo_grm", out1, model=str(tmp_path / "sft"), steps=2, prompts_per_step=4,
                                   num_generations=4, max_completion_length=8)), log=lambda *a: None)
    t.train(progress=False)
    rows = [json.loads(x) for x in open(out1 / "metrics.jsonl")]
    assert len(rows) == 2 and (out1 / "final" / "config.json").exists()
    assert all(r["reward_errors"] == 0 for r in rows)
    # measured (seed 0): 94% of the judgements parse and the BT rewards spread (std 0.26, 0.30): a GRPO signal
    assert all(r["rewards/judge_format/mean"] > 0.5 and r["reward_std"] > 0.05 for r in rows)
    out2 = tmp_path / "policy"
    t = Trainer(Config.build(_args("irpo_policy", out2, steps=1, prompts_per_step=2, num_generations=4,
                                   max_completion_length=8, grm_max_new_tokens=8,
                                   reward=[f"grm:{out1 / 'final'}"])), log=lambda *a: None)
    assert list(t.scorer.names) == ["accuracy", "format", "grm"]
    t.train(progress=False)
    rows = [json.loads(x) for x in open(out2 / "metrics.jsonl")]
    assert len(rows) == 1 and rows[0]["reward_errors"] == 0
    assert rows[0]["rewards/grm/unscorable"] < 8 and rows[0]["rewards/grm/mean"] is not None  # the GRM scored
    assert math.isfinite(rows[0]["reward_mean"])
