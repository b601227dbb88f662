"""The autoregressive image policy (policies/ar_image/policy.py), its codebook (policies/ar_image/codebook.py), AR-GRPO's reward map
and task digits_multi, and the group_dpo loss (algorithms/losses.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grpolab.config import Config

from _helpers import LEARNING_SEEDS  # noqa: E402


@pytest.fixture(scope="module")
def policy_and_model():
    from grpolab.policies.ar_image.policy import ARImagePolicy
    policy = ARImagePolicy(model="digits", temperature=1.0, top_k=0, top_p=1.0)
    return policy, policy.load(None, [], [], log=lambda *a: None)


def test_codebook_round_trip_error_is_bounded():
    from grpolab.policies.ar_image.codebook import K, ROUND_TRIP_MSE_BOUND, TOKENS, load_codebook, patches, unpatch
    from grpolab.policies._image.digits import load_digits_tensor

    images, _ = load_digits_tensor()
    assert torch.equal(unpatch(patches(images)), images)  # the patch layout is a bijection
    book = load_codebook(log=lambda *a: None)
    codes = book.encode(images)
    assert codes.shape == (len(images), TOKENS) and int(codes.min()) >= 0 and int(codes.max()) < K
    rec = book.decode(codes)
    assert rec.shape == images.shape
    assert float((rec - images).pow(2).mean()) < ROUND_TRIP_MSE_BOUND
    assert torch.equal(book.encode(rec), codes)  # a decoded image encodes to its own codes
    # raster order: code j covers patch row j // 4, patch column j % 4
    x = torch.full((1, 1, 8, 8), -1.0)
    x[0, 0, 2:4, 4:6] = 1.0  # patch row 1, column 2: token 6
    c = book.encode(x)[0]
    assert int(c[6]) != int(c[0]) and len(set(c.tolist()) - {int(c[0])}) == 1


def test_sample_shapes_and_columns(policy_and_model):
    policy, model = policy_and_model
    rows = [{"prompt": "3", "label": 3}, {"prompt": "7", "label": 7}]
    b = policy.sample(model, rows, [10, 11], group_offset=4, num_generations=3, temperature=1.0,
                      generator=torch.Generator().manual_seed(0))
    assert b.completion_ids.shape == (6, 16) and b.behavior_logprobs.shape == (6, 16)
    assert b.prompt_ids.tolist()[0] == [policy.vocab["bos"], policy.vocab["class_offset"] + 3]
    assert b.group_ids.tolist() == [4, 4, 4, 5, 5, 5] and b.prompt_uids.tolist() == [10] * 3 + [11] * 3
    assert not b.truncated.any() and bool((b.completion_mask == 1).all())
    assert b.row_data["images"].shape == (6, 1, 8, 8) and b.row_data["cond"].tolist() == [3] * 3 + [7] * 3
    img = b.columns["completion"][0]
    assert isinstance(img, np.ndarray) and img.shape == (8, 8, 1) and img.dtype == np.float32
    assert 0.0 <= img.min() and img.max() <= 1.0
    assert b.columns["label"] == [3, 3, 3, 7, 7, 7] and policy.pad_id == policy.vocab["pad"]
    assert (b.behavior_logprobs <= 0).all()


def test_recomputed_logprobs_equal_behaviour(policy_and_model):
    """Behaviour log-probs from the sampler (KV cache, one token at a time) equal the full forward's."""
    policy, model = policy_and_model
    rows = [{"prompt": str(k), "label": k} for k in (0, 5, 9)]
    b = policy.sample(model, rows, [0, 1, 2], num_generations=4, temperature=1.0,
                      generator=torch.Generator().manual_seed(1))
    out = policy.forward(model, b, want=frozenset({"entropy", "token_logprobs"}), grad=False)
    torch.testing.assert_close(out["logprobs"], b.behavior_logprobs, atol=2e-5, rtol=1e-5)
    assert out["token_logprobs"] is out["logprobs"] and out["entropy"].shape == (12, 16)


def test_seeded_evaluation_repeats_and_decode_of_non_codes(policy_and_model):
    policy, model = policy_and_model
    from grpolab.policies._image.tasks import digit_eval_rows

    rows = digit_eval_rows([1, 2], 2)
    a = policy.sample(model, rows, [0, 1, 2, 3], num_generations=1, temperature=0.0, evaluation=True)
    b = policy.sample(model, rows, [0, 1, 2, 3], num_generations=1, temperature=0.0, evaluation=True)
    assert torch.equal(a.completion_ids, b.completion_ids)
    bad = torch.full((1, 16), policy.vocab["bos"])  # a non-code token decodes as background
    assert float(policy.decode(bad).abs().max()) == 0.0


def test_save_and_load_round_trip(policy_and_model, tmp_path):
    from grpolab.policies.ar_image.policy import ARImagePolicy
    policy, model = policy_and_model
    policy.save(model, tmp_path / "m")
    other = ARImagePolicy(model=str(tmp_path / "m"), temperature=1.0, top_k=0, top_p=1.0)
    m2 = other.load(None, [], [], log=lambda *a: None)
    assert other.vocab == policy.vocab and torch.equal(other.codebook.table, policy.codebook.table)
    rows = [{"prompt": "4", "label": 4}]
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    x = policy.sample(model, rows, [0], num_generations=2, temperature=1.0, generator=g())
    y = other.sample(m2, rows, [0], num_generations=2, temperature=1.0, generator=g())
    assert torch.equal(x.completion_ids, y.completion_ids)


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
def test_ar_grpo_raises_the_held_out_confidence_on_every_seed(tmp_path, seed):
    """The ar_grpo recipe on the digits task (the classifier's confidence alone), 20 steps: the held-out
    confidence of the asked class rises. 200 held-out rows (20 seeded draws per class): with the default 50 the
    seeded draws move too much between two models to show a rise of this size. Measured (this machine,
    avx512_bf16): 0.448 -> 0.559 / 0.553 / 0.522 (seeds 0, 1, 2; seed 3: 0.577); asserted: a rise of 0.03."""
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    cfg = Config.build({**recipe_overrides("ar_grpo"), "task": "digits", "digits_eval_noises": 20, "steps": 20,
                        "seed": seed, "save_steps": 100, "out": str(tmp_path / "run"), "stall_steps": 0, "threads": 1})
    summary = Trainer(cfg, log=lambda *a: None).train(progress=False)
    before, after = (summary[k]["rewards/digit_confidence/mean"] for k in ("before", "after"))
    assert after > before + 0.03, (before, after)


def test_ar_grpo_step_map_and_digits_multi_weights():
    from grpolab.registry import TASKS
    from grpolab.policies._image.tasks import step_map

    # AR-GRPO's discrete_reward_map(score, [0, 0.3, 0.6, 1], [-1, 0.5, 1, 1.5]); >= 1 -> 1.5 (theirs: IndexError)
    assert [step_map(v) for v in (-0.1, 0.0, 0.29, 0.3, 0.59, 0.6, 0.99, 1.0)] == \
        [-1.0, 0.5, 0.5, 1.0, 1.0, 1.5, 1.5, 1.5]
    task = TASKS.get("digits_multi")()
    assert [(n, w) for n, _, w in task.rewards] == [("digit_confidence", 5.0), ("digit_confidence_steps", 1.0),
                                                    ("jpeg_compressibility", 1.0), ("digit_correct", 0.0)]


def test_group_dpo_hand_value_and_ties():
    """One group of 3 with rewards [1, 3, 2]: y_w = row 1, y_l = row 0; a tie group forms no pair."""
    from grpolab.algorithms.losses import group_dpo
    from grpolab.batch import RolloutBatch

    T = 2
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5], [-1.0, -1.0], [-1.0, -1.0], [-2.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.5], [-1.0, -1.0], [-1.0, -1.0], [-0.5, -0.5], [-0.5, -0.5]])
    mask = torch.ones(5, T)
    gid = torch.tensor([0, 0, 0, 1, 1])
    rewards = torch.tensor([1.0, 3.0, 2.0, 0.7, 0.7])
    b = RolloutBatch(prompt_ids=torch.zeros(5, 1, dtype=torch.long), prompt_mask=torch.ones(5, 1, dtype=torch.long),
                     completion_ids=torch.zeros(5, T, dtype=torch.long), completion_mask=mask,
                     behavior_logprobs=logp.detach(), completion_attention_mask=mask.long(), group_ids=gid,
                     prompt_uids=gid, truncated=torch.zeros(5, dtype=torch.bool), scalar_rewards=rewards)
    loss, metrics = group_dpo(logp, logp.detach(), torch.zeros(5), mask, gid, ref_logprobs=ref, batch=b,
                              dpo_beta=0.1)
    # h = S_theta - S_ref: row 1: -1 - (-2) = 1; row 0: -3 - (-3) = 0; margin 1
    pair = -math.log(1 / (1 + math.exp(-0.1 * 1.0)))
    expected = torch.tensor([pair * 1.5, pair * 1.5, 0.0, 0.0, 0.0])  # L_g * n_g / 2 on the pair's rows
    torch.testing.assert_close(loss, expected[:, None].expand(5, T))
    assert metrics["dpo_pair_frac"][:, 0].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    # gradient of the first-token column (L_g * n_g/2 on both pair rows, so twice): d/dh_w = -2 * 1.5 * beta *
    # sigmoid(-beta * margin) on y_w's tokens (S sums them), the opposite on y_l's
    loss[:, 0].sum().backward()
    g = 2 * 1.5 * 0.1 * (1 / (1 + math.exp(0.1)))
    torch.testing.assert_close(logp.grad[:, 0], torch.tensor([g, -g, 0.0, 0.0, 0.0]))
    # without scalar rewards: the advantages decide (monotone within a group); ties again give nothing
    loss2, _ = group_dpo(logp.detach(), logp.detach(), torch.tensor([-1.0, 1.0, 0.0, 0.0, 0.0]), mask, gid,
                         ref_logprobs=ref, batch=None, dpo_beta=0.1)
    torch.testing.assert_close(loss2, expected[:, None].expand(5, T))
    with pytest.raises(ValueError, match="reference"):
        group_dpo(logp, logp, torch.zeros(5), mask, gid, batch=b)


def test_group_dpo_config_needs_reference_logprobs():
    from grpolab.config import ConfigError
    with pytest.raises(ConfigError, match="beta > 0"):
        Config.build({"policy_loss": "group_dpo", "model": "tiny", "task": "repeat", "num_generations": 4,
                      "micro_batch_size": 8})
    Config.build({"policy_loss": "group_dpo", "policy": "ar_image", "task": "digits", "num_generations": 4,
                  "micro_batch_size": 8})  # ar_image offers the reference's token_logprobs
