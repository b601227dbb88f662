"""LC-R1 (seed 000-100): the valid-thinking crop, the compress bonus at the end-of-thinking token, and a training
step where both act (expected values from the authors' rules, zxiangx/LC-R1 grpo_trainer.py)."""
import math

import pytest
import torch

from grpolab.algorithms import WEIGHTINGS
from grpolab.batch import INJECTED, SAMPLED
from grpolab.config import Config
from grpolab.data import completion_text, model_texts
from grpolab.data import tokenize_prompts
from grpolab.generation.plain import pack_completions
from grpolab.model.loading import load_policy
from grpolab.recipes import recipe_overrides
from grpolab.registry import ROLLOUT_STRATEGIES
from grpolab.rewards import BatchScorer, RewardFn, RewardScorer
from grpolab.rollouts.context import RolloutContext
from grpolab.tasks import get_task

MARK = "Answer:"


def replies(row):
    """Four completions of an arithmetic row: cropped, answer not in the reasoning, wrong, no reasoning."""
    q, a = row["question"], int(row["answer"])
    return [f"{q} = {a}. so yes: {a}.\nAnswer: {a}",
            f"so yes.\nAnswer: {a}",
            f"{q} = {a + 1}.\nAnswer: {a + 1}",
            f"Answer: {a}"]


def fake_generate(ctx):
    """ctx.generate that packs the fixed replies (teacher-forced behaviour log-probs, EOS at the end)."""
    tok = ctx.tokenizer

    def generate(rows, uids, *, group_offset, num_generations=None, temperature=None, model=None):
        texts = [t for r in rows for t in replies(r)]
        ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
        T = max(map(len, ids))
        comp = torch.full((len(ids), T), tok.pad_token_id, dtype=torch.long)
        for i, x in enumerate(ids):
            comp[i, :len(x)] = torch.tensor(x)
        p_ids, p_mask = tokenize_prompts(tok, [r["prompt"] for r in rows], ctx.cfg.max_prompt_length)
        lengths = torch.tensor([len(x) for x in ids])
        b = pack_completions(tok, rows, uids, p_ids, p_mask, [4] * len(rows), comp, torch.zeros(len(ids), T),
                             lengths, torch.zeros(len(ids), dtype=torch.bool), group_offset=group_offset)
        b.behavior_logprobs = ctx.logprobs(b)
        return b
    return generate


@pytest.fixture(scope="module")
def parts():
    task = get_task("arithmetic")
    rows = task.train_rows[:8]
    model, tok = load_policy("tiny", task_texts=model_texts(task.train_rows[:50]), seed=0, log=lambda *a: None)
    model.eval()
    for r in rows:
        for t in replies(r):
            assert tok.decode(tok(t, add_special_tokens=False)["input_ids"]) == t  # one token per character
    cfg = Config.build({**recipe_overrides("lc_r1"), "model": "tiny", "num_generations": 4,
                        "max_completion_length": 40, "micro_batch_size": 16})
    return cfg, model, tok, rows, [RewardFn(n, f, w) for n, f, w in task.rewards]


def test_lc_r1_rollout_crops_correct_rows(parts):
    cfg, model, tok, rows, rewards = parts
    ctx = RolloutContext(cfg, tok, rows, policy=model, scorer=BatchScorer(RewardScorer(rewards)),
                         generator=torch.Generator().manual_seed(1))
    ctx.generate = fake_generate(ctx)
    ctx.new_step(0)
    row = rows[0]
    q, a = row["question"], row["answer"]
    b = ROLLOUT_STRATEGIES.get("lc_r1")(ctx=ctx, rows=[row], uids=[0], group_offset=0,
                                        lc_answer_column="answer", lc_think_end=MARK)
    texts = [completion_text(c) for c in b.columns["completion"]]
    # row 0: R = "q = a. so yes: a.\n" (one token per character), R' = "q = a." -> cropped to R' + "Answer: a"
    R, Rp = f"{q} = {a}. so yes: {a}.\n", f"{q} = {a}."
    assert texts[0] == f"{Rp}Answer: {a}"
    assert b.columns["lc_compress"][0] == pytest.approx(1 - len(Rp) / (len(R) + 1e-4))
    assert b.columns["lc_think_end"][0] == len(Rp)  # the marker's first token in the cropped row
    # row 1: correct, the answer is not in the reasoning "so yes.\n" -> -1 at the marker, not cropped
    assert texts[1] == f"so yes.\nAnswer: {a}" and b.columns["lc_compress"][1] == -1.0
    assert b.columns["lc_think_end"][1] == len("so yes.\n")
    # row 2: wrong -> 0; row 3: correct without reasoning -> -1 at token 0 (authors: lengths == 0)
    assert b.columns["lc_compress"][2] == 0.0
    assert b.columns["lc_compress"][3] == -1.0 and b.columns["lc_think_end"][3] == 0
    # the rows' rewards are those of the uncropped completions (all correct but row 2)
    assert b.rewards[:, 0].tolist() == [1.0, 1.0, 0.0, 1.0]
    # cropped tokens: the tail is INJECTED with teacher-forced log-probs in its new context; lengths shrink
    n0 = len(texts[0]) + 1
    assert int(b.completion_attention_mask[0].sum()) == n0
    assert (b.token_origin[0, :len(Rp)] == SAMPLED).all() and (b.token_origin[0, len(Rp):n0] == INJECTED).all()
    lp = ctx.logprobs(b)
    assert torch.allclose(b.behavior_logprobs, lp, atol=1e-5)
    assert ctx.metrics["lc_cropped"] == 1 and ctx.metrics["lc_correct"] == 3
    assert ctx.metrics["lc_answer_not_in_thinking"] == 2


def test_lc_compress_bonus_is_added_at_one_token():
    from types import SimpleNamespace
    fn = WEIGHTINGS.get("lc_compress_bonus")
    adv = torch.tensor([0.5, -0.25, 0.0])
    mask = torch.ones(3, 5)
    b = SimpleNamespace(columns={"lc_compress": [0.6, -1.0, 0.0], "lc_think_end": [2, 0, 3]})
    out = fn(adv, mask, b, lc_compress_weight=1.0)
    expected = adv[:, None].repeat(1, 5)
    expected[0, 2] += 0.6
    expected[1, 0] -= 1.0  # row 2: wrong, no bonus
    assert torch.allclose(out, expected)
    with pytest.raises(ValueError, match="rollout_strategy: lc_r1"):
        fn(adv, mask, SimpleNamespace(columns={}))


def test_lc_r1_training_steps_crop_and_shape_the_advantage(parts, tmp_path):
    from grpolab.train.trainer import Trainer
    cfg = Config.build({**recipe_overrides("lc_r1"), "model": "tiny", "steps": 2, "prompts_per_step": 2,
                        "num_generations": 4, "max_completion_length": 40, "micro_batch_size": 16,
                        "num_iterations": 2, "eval_before": False, "eval_after": False, "tensorboard": False,
                        "save_steps": 10, "out": str(tmp_path / "run")})
    t = Trainer(cfg, log=lambda *a: None)
    t.ctx.generate = fake_generate(t.ctx)
    seen = {}
    real = t.compute_advantages

    def spy(batch):
        adv = real(batch)
        seen["batch"], seen["adv"] = batch, adv
        return adv
    t.compute_advantages = spy
    for _ in range(2):
        m = t.train_step()
        assert m["skipped"] == 0 and math.isfinite(m["loss"]) and m["rollout/lc_cropped"] == 2
    b, adv = seen["batch"], seen["adv"]
    # authors: A_i = (r_i + len_i) - mean_g(r + len), plus the compress reward at the end-of-thinking token
    L = (b.completion_attention_mask.sum(-1) - 1).double()  # tokens before EOS
    r = b.scalar_rewards.double()
    for g in b.group_ids.unique():
        idx = (b.group_ids == g).nonzero().squeeze(-1)
        right = b.rewards[idx, 0] == 1  # all four replies have the format and one 'Answer:'
        x = b.rewards[idx].double() @ torch.tensor([1.0, 0.5], dtype=torch.float64)  # accuracy + .5 format
        x = x + 1 - L[idx] / (L[idx][right].max() + 1e-4)
        assert torch.allclose(r[idx], x, atol=1e-6)
        A = (x - x.mean())[:, None] * b.completion_mask[idx]
        for j, i in enumerate(idx.tolist()):
            c, p = b.columns["lc_compress"][i], b.columns["lc_think_end"][i]
            if c != 0:
                A[j, p] += c
        assert torch.allclose(adv[idx].double(), A, atol=1e-5)
