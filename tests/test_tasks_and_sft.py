"""Tasks (arithmetic levels, rg:NAME), SFT cold start (TON, Thinkless), MOTIF, PM4GRPO and judge rewards."""
import math
import sys
from types import SimpleNamespace

import pytest
import torch

from grpolab.batch import RolloutBatch
from grpolab.config import Config, ConfigError
from grpolab.rewards import parse_reward_spec
from grpolab.rewards.judge import JudgeReward
from grpolab.rewards.process import PM4GRPOReward, conformance, lcs_length, reasoning_steps
from grpolab.rollouts.thinking import motif, motif_progress, motif_row
from grpolab.train.sft import build_examples, split_reasoning
from grpolab.tasks import TASKS, get_task

from _helpers import close, tr  # noqa: E402

NAN = float("nan")


# ---------------------------------------------------------------- tasks

def test_default_arithmetic_rows_keep_their_order_and_gain_levels():
    t = get_task("arithmetic")
    assert (len(t.train_rows), len(t.eval_rows)) == (1722, 200)
    first = t.train_rows[0]  # the default job's first training problem (seed 1234 shuffle), unchanged
    assert (first["question"], first["answer"]) == ("1 - 5", "-4")
    assert first["prompt"][1]["content"] == "Compute 1 - 5. Finish your reply with 'Answer:' followed by the number."
    assert first["level"] == 1 and first["solution"] == "1 - 5 = -4\nAnswer: -4"
    assert len(first["hints"]) == 3 and all(isinstance(h, str) for h in first["hints"])
    assert [r["name"] if isinstance(r, dict) else r[0] for r in t.rewards] == ["accuracy", "format"]


def _check_solution(row):
    lines = row["solution"].split("\n")
    assert lines[-1] == f"Answer: {row['answer']}"
    assert len(lines) - 1 == row["level"]
    value = None
    for line in lines[:-1]:  # every step "x op n = y" is right and chains from the previous one
        lhs, rhs = line.split(" = ")
        x = int(lhs.split(" ")[0])
        assert value is None or x == value
        assert eval(lhs) == int(rhs)
        value = int(rhs)
    assert value == int(row["answer"]) == eval(row["question"])


def test_arithmetic_multistep_levels_splits_and_config_keys():
    cfg = Config.build({"task": "arithmetic_multistep", "arithmetic_levels": "2,3", "arithmetic_n_train": 60,
                        "arithmetic_n_eval": 20, "arithmetic_seed": 7})
    t = get_task(cfg.task, cfg=cfg)
    assert (len(t.train_rows), len(t.eval_rows)) == (60, 20)
    assert {r["level"] for r in t.train_rows + t.eval_rows} == {2, 3}
    for r in t.train_rows + t.eval_rows:
        _check_solution(r)
    qs = [r["question"] for r in t.train_rows + t.eval_rows]
    assert len(set(qs)) == 80  # distinct problems: held-out split disjoint from training
    again = get_task("arithmetic_multistep", arithmetic_levels=[2, 3], arithmetic_n_train=60, arithmetic_n_eval=20,
                     arithmetic_seed=7)
    assert again.train_rows == t.train_rows and again.eval_rows == t.eval_rows
    other = get_task("arithmetic_multistep", arithmetic_n_train=60, arithmetic_n_eval=20, arithmetic_seed=8)
    assert other.train_rows != t.train_rows
    # training seed does not move the split: only keyword-only arithmetic_* keys are read from the config
    cfg2 = Config.build({"task": "arithmetic_multistep", "arithmetic_levels": "2,3", "arithmetic_n_train": 60,
                         "arithmetic_n_eval": 20, "arithmetic_seed": 7, "seed": 99})
    assert get_task(cfg2.task, cfg=cfg2).train_rows == t.train_rows
    # the rewards score the worked solution as correct
    acc = dict((n, f) for n, f, _ in t.rewards)["accuracy"]
    assert acc(completions=[r["solution"] for r in t.eval_rows[:5]], answer=[r["answer"] for r in t.eval_rows[:5]]) \
        == [1.0] * 5
    with pytest.raises(ValueError, match="arithmetic_levels"):
        get_task("arithmetic_multistep", arithmetic_levels=[0])


def test_rg_task_adapter():
    pytest.importorskip("reasoning_gym")
    t = get_task("rg:chain_sum", rg_train_size=30, rg_eval_size=10, rg_seed=5)
    assert t.name == "rg:chain_sum" and t.accuracy_reward == "rg_score"
    assert len(t.train_rows) == 30 and 0 < len(t.eval_rows) <= 10
    assert not {r["question"] for r in t.train_rows} & {r["question"] for r in t.eval_rows}
    row = t.train_rows[0]
    assert row["prompt"][-1]["content"].endswith("Finish your reply with 'Answer:' followed by the answer.")
    score = dict((n, f) for n, f, _ in t.rewards)["rg_score"]
    wrong = str(int(row["answer"]) + 1)
    got = score(completions=[f"so\nAnswer: {row['answer']}", f"Answer: {wrong}", "no answer here"],
                rg_entry=[row["rg_entry"]] * 3, rg_split=["train"] * 3)
    assert got == [1.0, 0.0, 0.0]
    assert get_task("rg:chain_sum", rg_train_size=30, rg_eval_size=10, rg_seed=5).train_rows == t.train_rows
    # config validation accepts rg:NAME; unknown names list close ones
    assert "rg:chain_sum" in TASKS and "rg:" not in TASKS and "nope" not in TASKS
    Config.build({"task": "rg:chain_sum"})
    with pytest.raises(ValueError, match="did you mean rg:chain_sum"):
        get_task("rg:chain_summ")


def test_rg_task_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import fails
    with pytest.raises(ValueError, match=r"pip install 'grpolab\[gym\]'"):
        get_task("rg:chain_sum")


# ---------------------------------------------------------------- PM4GRPO conformance

def test_conformance_hand_computed():
    # s = [a, b, c], t = [a, c]: LCS 2, alignment cost 3 + 2 - 4 = 1, fitness 1 - 1/5 = 0.8,
    # precision 2/3, f1 = 2 * 0.8 * 0.6667 / 1.4667 = 0.72727
    c = conformance(["a", "b", "c"], ["a", "c"])
    assert c["fitness"] == pytest.approx(0.8) and c["precision"] == pytest.approx(2 / 3)
    assert c["f1"] == pytest.approx(2 * 0.8 * (2 / 3) / (0.8 + 2 / 3))
    # s = [a], t = [a, b, c]: LCS 1, cost 2, fitness 1 - 2/4 = 0.5, precision 1, f1 = 2*0.5/1.5 = 2/3
    c = conformance(["a"], ["a", "b", "c"])
    assert (c["fitness"], c["precision"]) == (0.5, 1.0) and c["f1"] == pytest.approx(2 / 3)
    assert conformance(["x", "y"], ["x", "y"])["f1"] == 1.0
    assert conformance(["x"], ["y"]) == {"fitness": 0.0, "precision": 0.0, "f1": 0.0}
    assert conformance([], [])["f1"] == 1.0 and conformance([], ["a"])["f1"] == 0.0
    assert lcs_length(list("abcbdab"), list("bdcaba")) == 4  # the textbook example


def test_pm4grpo_reward_on_texts():
    text = "<think>\n12 + 5 = 17. Then  17 - 3 = 14.\n</think>\nAnswer: 14"
    assert reasoning_steps(text) == ["12 + 5 = 17", "then 17 - 3 = 14"]
    assert reasoning_steps("3 + 4 = 7\nAnswer: 7", abstract_numbers=True) == ["# + # = #"]
    solution = "12 + 5 = 17\n17 - 3 = 14\nAnswer: 14"
    r = PM4GRPOReward()
    comps = ["12 + 5 = 17\n17 - 3 = 14\nAnswer: 14",   # same steps: 1
             "12 + 5 = 17\nAnswer: 14",                # s=[a], t=[a,b]: fitness 1 - 1/3, precision 1 -> f1 0.8
             "Answer: 14",                             # no steps: 0
             [{"role": "assistant", "content": "9 * 9 = 81\n12 + 5 = 17\n17 - 3 = 14"}]]  # s=[x,a,b]: f=0.8, p=2/3
    got = r(prompts=None, completions=comps, solution=[solution] * 3 + [None])
    assert got[:3] == pytest.approx([1.0, 0.8, 0.0]) and got[3] is None
    got = PM4GRPOReward(pm4grpo_measure="fitness")(completions=comps[3:], solution=[solution])
    assert got == pytest.approx([0.8])
    # abstraction compares procedure: "3 + 4 = 7" conforms to "12 + 5 = 17"
    assert PM4GRPOReward(pm4grpo_abstract_numbers=True)(completions=["3 + 4 = 7"], solution=["12 + 5 = 17"]) == [1.0]
    spec = parse_reward_spec("pm4grpo=0.5", cfg=Config.build({"reward": ["pm4grpo"], "pm4grpo_measure": "precision"}))
    assert spec.name == "pm4grpo" and spec.weight == 0.5 and spec.fn.measure == "precision"
    with pytest.raises(ValueError, match="teacher"):
        r(completions=["x"], answer=["1"])


# ---------------------------------------------------------------- judge rewards

def test_judge_tiny_p_yes_in_unit_interval_deterministic_and_batch_invariant():
    prompts = ["Compute 2 + 3.", [{"role": "user", "content": "Compute 1 + 1."}], "Say hi", "x"]
    comps = ["Answer: 5", [{"role": "assistant", "content": "Answer: 2"}], "hi there, long reply " * 3, ""]
    spec = parse_reward_spec("judge:tiny=0.5")
    assert spec.name == "judge" and spec.weight == 0.5
    j8 = spec.fn
    a = j8(prompts=prompts, completions=comps)
    assert all(0.0 <= v <= 1.0 for v in a) and len(set(a)) > 1
    assert j8(prompts=prompts, completions=comps) == a  # deterministic
    j1 = JudgeReward("tiny", judge_batch_size=1)
    assert close(j1(prompts=prompts, completions=comps), a, tol=1e-5)  # batched == one by one
    # the formula: softmax over the two answer tokens' logits at the last position
    text, _ = j1.text(prompts[0], comps[0])
    ids = j1.tok(text, return_tensors="pt")["input_ids"]
    last = j1.model(input_ids=ids).logits[0, -1]
    ly, ln = float(last[j1.yes_id]), float(last[j1.no_id])
    assert a[0] == pytest.approx(math.exp(ly) / (math.exp(ly) + math.exp(ln)), abs=1e-5)


def test_judge_self_copies_initial_policy(tmp_path):
    from grpolab.model.loading import load_policy
    from grpolab.data import model_texts
    with pytest.raises(ValueError, match="judge:self"):
        parse_reward_spec("judge:self")
    with pytest.raises(FileNotFoundError):
        parse_reward_spec(f"judge:{tmp_path}")
    cfg = Config.build({"model": "tiny", "task": "repeat", "reward": ["judge:self"], "judge_question": "ok?"})
    j = parse_reward_spec("judge:self", cfg=cfg).fn
    j.load()
    t = get_task("repeat")
    policy, _ = load_policy("tiny", task_texts=model_texts(t.train_rows + t.eval_rows), seed=cfg.seed)
    for p, q in zip(j.model.parameters(), policy.parameters()):
        assert torch.equal(p, q)
    assert not any(p.requires_grad for p in j.model.parameters())
    assert j.question == "ok?"


# ---------------------------------------------------------------- Thinkless mode reward

def test_thinkless_mode_reward_hand_computed():
    b = SimpleNamespace(columns={"completion": ["<short>Answer: 5", "<think>\n2+3\n</think>\nAnswer: 5",
                                                "Answer: 5", "<short>Answer: 6", "<short>x"]})
    m = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [NAN, 1.0]])
    out = tr("thinkless_mode_reward", rewards=torch.zeros(5), reward_matrix=m, reward_names=["accuracy", "format"],
             batch=b, thinkless_gamma=0.25)
    # short+correct 1; think+correct 1 - 0.25; no control token counts as think; wrong -1; unscorable NaN
    assert close(out, [1.0, 0.75, 0.75, -1.0, NAN])


# ---------------------------------------------------------------- SFT formats

def test_split_reasoning_and_sft_formats():
    assert split_reasoning("1 + 2 = 3\n3 * 2 = 6\nAnswer: 6") == ("1 + 2 = 3\n3 * 2 = 6", "Answer: 6")
    assert split_reasoning("<think>a b</think>\nAnswer: 1") == ("a b", "Answer: 1")
    rows = [{"prompt": "p", "solution": "1 + 2 = 3\nAnswer: 3"}, {"prompt": "q", "solution": "(7 - 3) * 5"}]
    assert [e.target for e in build_examples(rows)] == ["1 + 2 = 3\nAnswer: 3", "Answer: (7 - 3) * 5"]
    keep = build_examples(rows[:1], sft_mode="ton", ton_dropout_prob=0.0)[0]
    assert keep.target == "<think>\n1 + 2 = 3\n</think>\nAnswer: 3" and not keep.dropped
    drop = build_examples(rows[:1], sft_mode="ton", ton_dropout_prob=1.0)[0]
    assert drop.target == "<think>\n\n</think>\nAnswer: 3" and drop.dropped
    tl = build_examples(rows[:1], sft_mode="thinkless")
    assert [e.target for e in tl] == ["<think>\n1 + 2 = 3\n</think>\nAnswer: 3", "<short>Answer: 3"]


def test_ton_dropout_rate_is_respected_and_seeded():
    rows = [{"prompt": "p", "solution": f"{i} + 1 = {i + 1}\nAnswer: {i + 1}"} for i in range(2000)]
    ex = build_examples(rows, sft_mode="ton", ton_dropout_prob=0.3, seed=3)
    rate = sum(e.dropped for e in ex) / len(ex)
    assert abs(rate - 0.3) < 0.035  # binomial sd = sqrt(.3 * .7 / 2000) = 0.010
    assert all(e.target.startswith("<think>\n\n</think>") == e.dropped for e in ex)
    again = build_examples(rows, sft_mode="ton", ton_dropout_prob=0.3, seed=3)
    assert [e.dropped for e in again] == [e.dropped for e in ex]
    assert [e.dropped for e in build_examples(rows, sft_mode="ton", ton_dropout_prob=0.3, seed=4)] != \
        [e.dropped for e in ex]


def test_sft_thinkless_trains_saves_loads_and_feeds_grpo(tmp_path):
    import json

    from grpolab.cli import main
    from grpolab.model.loading import load_policy
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer
    out = tmp_path / "sft"
    argv = ["sft", "--model", "tiny", "--task", "arithmetic_multistep", "--out", str(out), "--sft_mode", "thinkless",
            "--sft_steps", "12", "--sft_batch_size", "8", "--sft_learning_rate", "3e-3", "--arithmetic_n_train", "40",
            "--arithmetic_n_eval", "8", "--threads", "1"]
    assert main(argv) == 0
    summary = json.loads((out / "sft_summary.json").read_text())
    losses = summary["losses"]
    assert summary["examples"] == 80 and summary["added_tokens"] == 2  # paired long/short targets
    # measured drop (first loss - mean of the last 3), issue 22: 1.291 with float32 on AVX512 kernels, bf16 autocast
    # (GRPOLAB_CPU_KIND=avx512_bf16) and ATEN_CPU_CAPABILITY=avx2 alike (seed 0); seeds 1, 2: 1.273, 1.326 (AVX2)
    assert sum(losses[-3:]) / 3 < losses[0] - 0.5, losses
    model, tok = load_policy(str(out))
    for t in ("<short>", "<think>"):  # atomic tokens, kept when decoding
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.decode(ids, skip_special_tokens=True) == t
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    assert main(argv) == 2  # --out taken: refused
    # GRPO with the thinkless recipe starts from the SFT model
    args = {**recipe_overrides("thinkless"), "model": str(out), "steps": 1, "prompts_per_step": 2,
            "num_generations": 4, "max_completion_length": 6, "eval_before": False, "eval_after": False,
            "tensorboard": False, "arithmetic_n_train": 40, "arithmetic_n_eval": 8, "threads": 1,
            "out": str(tmp_path / "rl")}
    t = Trainer(Config.build(args), log=lambda *a: None)
    batch, _, _ = t.collect()
    scalar = t.scorer.scalar(batch)
    assert set(torch.unique(scalar).tolist()) <= {-1.0, 0.9, 1.0}  # the Thinkless reward values


# ---------------------------------------------------------------- MOTIF

def test_motif_progress_and_row():
    assert motif_progress("<reasoning>r</reasoning><answer> step two </answer>", 100) == "step two"
    assert motif_progress("abcdefgh", 3) == "fgh"
    row = {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], "answer": "1"}
    r = motif_row(row, "xy", 1, final=False)
    assert r["prompt"][1]["content"] == 'Q Progress in round 1: "xy" Continue from this progress.'
    assert row["prompt"][1]["content"] == "Q"  # the source row is untouched
    assert motif_row({"prompt": "Q"}, "z", 2, final=True)["prompt"] == \
        'Q Progress in round 2: "z" Current round is the final round. Provide a final answer.'


class FakeCtx:
    """Generates completion text '<prompt-tag>|k' and scores by a table; records prompts."""

    def __init__(self):
        self.prompts = []

    def generate(self, rows, uids, *, group_offset, num_generations=None, temperature=None, model=None):
        G = num_generations or 2
        self.prompts.append([r["prompt"] for r in rows])
        R = len(rows) * G
        comps = [f"{r['tag']}{len(self.prompts)}.{k}" for r in rows for k in range(G)]
        return RolloutBatch(prompt_ids=torch.zeros(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1),
                            completion_ids=torch.zeros(R, 2, dtype=torch.long), completion_mask=torch.ones(R, 2),
                            behavior_logprobs=torch.zeros(R, 2),
                            group_ids=torch.arange(group_offset, group_offset + len(rows)).repeat_interleave(G),
                            prompt_uids=torch.tensor(uids).repeat_interleave(G), truncated=torch.zeros(R, dtype=bool),
                            columns={"completion": comps, "tag": [r["tag"] for r in rows for _ in range(G)]})

    def score(self, batch):
        # reward column 0: 1.0 for final completions ending in ".0" (first sample), else 0; column 1: NaN for
        # every ".1" sample of prompt tag b
        c0 = [1.0 if c.endswith(".0") else 0.0 for c in batch.columns["completion"]]
        c1 = [NAN if (c.startswith("b") and c.endswith(".1")) else 2.0 for c in batch.columns["completion"]]
        batch.rewards = torch.tensor([c0, c1]).T
        batch.reward_names = ["acc", "x"]
        return batch.rewards.sum(-1)


def test_motif_rewards_are_the_mean_final_round_rewards():
    ctx = FakeCtx()
    rows = [{"prompt": "A", "tag": "a"}, {"prompt": "B", "tag": "b"}]
    b = motif(ctx, rows, [10, 11], group_offset=3, budgets=2, temperatures=None, motif_rounds=3, motif_rollouts=2,
              motif_progress_chars=50)
    assert b.num_rows == 4 and b.group_ids.tolist() == [3, 3, 4, 4]
    # round 2: one prompt per round-1 row (4), 2 samples each; round 3: one per continuation (8), 1 sample each
    assert len(ctx.prompts[1]) == 4 and len(ctx.prompts[2]) == 8
    assert ctx.prompts[1][0] == 'A Progress in round 1: "a1.0" Continue from this progress.'
    assert ctx.prompts[2][1] == ('A Progress in round 2: "a2.1" Current round is the final round. '
                                 'Provide a final answer.')
    # final round samples are all ".0" (1 sample each) -> acc 1 for every continuation; column x: 2, NaN rows none
    assert close(b.rewards, [[1.0, 2.0]] * 4) and b.reward_names == ["acc", "x"]
    assert b.columns["motif_final"][0] == "a3.0"
    # with 2 rounds the final round is round 2: samples ".0" and ".1" -> acc mean 0.5; x for tag b: nanmean(2, NaN) = 2
    ctx = FakeCtx()
    b = motif(ctx, rows, [10, 11], group_offset=0, budgets=2, motif_rounds=2, motif_rollouts=2,
              motif_progress_chars=50)
    assert close(b.rewards, [[0.5, 2.0]] * 4)
    assert motif(FakeCtx(), rows, [0, 1], 0, budgets=2, motif_rounds=1).rewards is None  # plain: trainer scores
    with pytest.raises(ConfigError):
        Config.build({"rollout_strategy": "motif", "motif_rollouts": 0})


def test_motif_end_to_end_on_tiny(tiny_args):
    from grpolab.train.trainer import Trainer
    args = {**tiny_args, "rollout_strategy": "motif", "motif_rounds": 2, "motif_rollouts": 2, "prompts_per_step": 2,
            "task": "arithmetic_multistep", "arithmetic_n_train": 20, "arithmetic_n_eval": 4, "threads": 1}
    t = Trainer(Config.build(args), log=lambda *a: None)
    batch, errors, _ = t.collect()
    assert errors == 0 and batch.num_rows == 8 and batch.rewards.shape == (8, 2)
    assert len(batch.columns["motif_final"]) == 8
    assert (batch.token_origin == 0).all()  # only first-round, sampled tokens are trained
    metrics = t.train_step()
    assert math.isfinite(metrics["loss"])


def test_sft_reads_every_data_format_csv(tmp_path):
    """grpolab sft --data takes the same formats and column mapping as grpolab train (docs/data.md): a CSV."""
    import json

    from grpolab.cli import main
    data = tmp_path / "d.csv"
    data.write_text("question,answer\n" + "".join(f"what is {i} plus 1?,{i + 1}\n" for i in range(6)))
    out = tmp_path / "sft"
    assert main(["sft", "--model", "tiny", "--data", str(data), "--prompt_column", "question", "--out", str(out),
                 "--sft_steps", "2", "--sft_batch_size", "4", "--threads", "1"]) == 0
    assert json.loads((out / "sft_summary.json").read_text())["examples"] == 6


def test_a_training_reward_named_like_an_eval_metric_keeps_both(tiny_args):
    """--reward grpolab.tasks.arithmetic:lenient_accuracy on arithmetic (whose evaluation reports its own
    lenient_accuracy) trains on it and evaluates both, without a name clash."""
    from grpolab.train.trainer import Trainer
    args = {**tiny_args, "task": "arithmetic", "eval_problems": 4, "threads": 1,
            "reward": ["grpolab.tasks.arithmetic:lenient_accuracy"], "reward_weights": [0, 0, 1]}
    t = Trainer(Config.build(args), log=lambda *a: None)
    res = t.evaluate()
    assert "lenient_accuracy" in res and "rewards/lenient_accuracy/mean" in res
    assert res["lenient_accuracy"] == res["rewards/lenient_accuracy/mean"]   # the same function, both ways
    assert not any(k.startswith("rewards/eval:") for k in res)
