"""The multi-label reward model of 000-52: heads learn the built-in labels, save/load is exact, the reward spec
is the weighted sum of the heads, and the multi_label_grpo recipe trains a policy with it."""
import json

import pytest
import torch

from grpolab.rewards.multi_label_rm import (BUILTIN_LABELS, MultiLabelRewardFn, arithmetic_label_set,
                                            load_multi_label_rm, predict, rm_text, save_multi_label_rm,
                                            train_multi_label_rm)

from _helpers import LEARNING_SEEDS  # noqa: E402


def test_label_set_labels_by_hand():
    rows = arithmetic_label_set(400, seed=3)
    assert {tuple(r["labels"]) for r in rows} == {BUILTIN_LABELS}
    for r in rows:
        a, b = (int(x) for x in r["prompt"][len("Compute "):-1].split(" + "))
        nums = [int(x) for x in __import__("re").findall(r"-?\d+", r["reply"])]
        assert r["labels"]["correctness"] == float(nums[-1] == a + b)
        assert r["labels"]["format"] == float("\nAnswer: " in r["reply"] or r["reply"].startswith("Answer: "))
        assert r["labels"]["length"] == min(len(r["reply"]), 40) / 40
    right = sum(r["labels"]["correctness"] for r in rows) / len(rows)
    assert 0.35 < right < 0.65  # balanced: the constant predictor's MSE is about 0.25


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
def test_heads_learn_the_labels(seed):
    """Held-out MSE per head below the constant predictor's (the training mean), on every seed.
    Measured (2-core CPU, 250 steps, 1200 rows, 300 held out): R^2 = 1 - MSE / MSE_const
    correctness 0.172 / 0.058 / 0.058, format 0.996 / 0.998 / 0.996, length 0.972 / 0.994 / 0.987 on seeds 0 / 1 / 2.
    Margins ~3x below the smallest: correctness R^2 > 0.02 (wrong numbers outside 0..18 are the learnable part),
    format and length R^2 > 0.8."""
    torch.set_num_threads(1)  # (restored by conftest) 2 threads on a busy 2-core CPU cost 10x here
    _, _, metrics = train_multi_label_rm(arithmetic_label_set(1200, seed), seed=seed)
    for k in BUILTIN_LABELS:
        assert metrics[k]["mse"] < metrics[k]["const_mse"], (seed, metrics)
    r2 = {k: metrics[k]["r2"] for k in BUILTIN_LABELS}
    assert r2["correctness"] > 0.02, r2
    assert r2["format"] > 0.8 and r2["length"] > 0.8, r2


def _small_model(tmp_path, steps=3):
    model, tok, metrics = train_multi_label_rm(arithmetic_label_set(64, 0), steps=steps, batch_size=8)
    path = save_multi_label_rm(model, tok, tmp_path / "mlrm", [1.0, 0.5, -0.25], metrics)
    return model, tok, path


def test_save_load_round_trip_is_exact(tmp_path):
    model, tok, path = _small_model(tmp_path)
    assert (path / "model.safetensors").exists() and json.loads((path / "config.json").read_text())["labels"] == \
        list(BUILTIN_LABELS)
    loaded, tok2, cfg = load_multi_label_rm(path)
    sd, sd2 = model.state_dict(), loaded.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    texts = [rm_text(r["prompt"], r["reply"]) for r in arithmetic_label_set(10, 5)]
    assert torch.equal(predict(model, tok, texts), predict(loaded, tok2, texts))
    assert cfg["weights"] == [1.0, 0.5, -0.25]
    with pytest.raises(ValueError, match="not a multi-label reward model"):
        load_multi_label_rm(tmp_path)


def test_spec_is_the_weighted_sum(tmp_path):
    """Heads with zero weights and biases 0.2, 0.6, 0.4 predict those constants; label weights 1, 0.5, -0.25:
    the sum is 0.2 + 0.3 - 0.1 = 0.4 for every text."""
    from grpolab.rewards import parse_reward_spec
    model, tok, _ = _small_model(tmp_path)
    for name, b in zip(BUILTIN_LABELS, (0.2, 0.6, 0.4)):
        torch.nn.init.zeros_(model.heads[name].weight)
        torch.nn.init.constant_(model.heads[name].bias, b)
    path = save_multi_label_rm(model, tok, tmp_path / "const", [1.0, 0.5, -0.25])
    prompts, comps = ["Compute 1 + 2.", "Compute 3 + 3."], ["Answer: 3", "It is 7."]
    total = parse_reward_spec(f"mlrm:{path}=2")
    assert total.name == "mlrm" and total.weight == 2.0
    assert total.fn(prompts=prompts, completions=comps) == pytest.approx([0.4, 0.4], abs=1e-6)
    head = parse_reward_spec(f"mlrm:{path}#format=0")
    assert head.name == "mlrm_format" and head.weight == 0.0
    assert head.fn(prompts=prompts, completions=comps) == pytest.approx([0.6, 0.6], abs=1e-6)
    # a trained model: the sum spec equals sum_k w_k * head_k, batched equals one by one
    _, _, trained = _small_model(tmp_path / "t", steps=5)
    fns = {k: MultiLabelRewardFn(str(trained), k) for k in BUILTIN_LABELS}
    heads = {k: f(prompts=prompts, completions=comps) for k, f in fns.items()}
    s = MultiLabelRewardFn(str(trained))(prompts=prompts, completions=comps)
    for i in range(2):
        want = heads["correctness"][i] + 0.5 * heads["format"][i] - 0.25 * heads["length"][i]
        assert s[i] == pytest.approx(want, abs=1e-5)
        assert MultiLabelRewardFn(str(trained))(prompts=prompts[i:i + 1], completions=comps[i:i + 1]) == \
            pytest.approx([s[i]], abs=1e-5)
    with pytest.raises(ValueError, match="no head 'safety'"):
        parse_reward_spec(f"mlrm:{trained}#safety")


def test_multi_label_grpo_recipe_smoke(tiny_args, tmp_path, monkeypatch):
    """The recipe trains the built-in reward model on first use (cached under $GRPOLAB_CACHE), logs each head and
    trains the policy on their weighted mean."""
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.metrics import read_metrics
    from grpolab.train.trainer import Trainer

    rec = recipe_overrides("multi_label_grpo")
    assert rec["advantage"] == "multi_label_zscore" and all(r.startswith("mlrm:builtin#") for r in rec["reward"])
    args = {**tiny_args, **rec, "steps": 2, "prompts_per_step": 2, "num_generations": 3, "max_completion_length": 8}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    rows = read_metrics(t.out)
    assert len(rows) == 2
    for k in BUILTIN_LABELS:
        assert rows[-1][f"rewards/mlrm_{k}/mean"] is not None and rows[-1][f"rewards/mlrm_{k}/unscorable"] == 0


def test_rm_train_command(tmp_path, capsys):
    from grpolab.cli import main
    from grpolab.rewards import parse_reward_spec
    rows = [{"prompt": f"say {i}", "completion": "yes" * (i % 3 + 1), "polite": float(i % 2), "short": 1.0 / (i + 1)}
            for i in range(12)]
    data = tmp_path / "labels.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rm"
    assert main(["rm-train", "--out", str(out), "--data", str(data), "--labels", "polite,short",
                 "--weights", "1,2", "--steps", "2"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["labels"] == ["polite", "short"] and set(shown["held_out"]) == {"polite", "short"}
    spec = parse_reward_spec(f"mlrm:{out}")
    heads = [parse_reward_spec(f"mlrm:{out}#{k}").fn(prompts=["say 1"], completions=["yes"])[0]
             for k in ("polite", "short")]
    assert spec.fn(prompts=["say 1"], completions=["yes"])[0] == pytest.approx(heads[0] + 2 * heads[1], abs=1e-5)
    assert main(["rm-train", "--out", str(out), "--data", str(data), "--labels", "polite,safety"]) == 2
    assert "no column 'safety'" in capsys.readouterr().err
