"""``behavior_logprobs: trainer``: pi_old from the training forward after the built-in sampler, the sampler's own
mismatch corrected by a truncated importance weight (generation/vllm_engine.trainer_behavior), for half-precision
sampling where the two differ (docs/benchmarks.md, Speed II)."""
import pytest
import torch

from grpolab.config import Config
from grpolab.errors import ConfigError
from grpolab.recipes import recipe_overrides
from grpolab.train.trainer import Trainer


def _batch(tiny_args, source):
    t = Trainer(Config.build({**tiny_args, "steps": 1, "dtype": "bfloat16", "vllm_is_cap": 1.0005,
                              "behavior_logprobs": source}), log=lambda *a: None)
    with t.precision():
        batch, _ = t.generate(4)
    return t, batch


def test_trainer_pi_old_and_weights_in_bf16(tiny_args):
    """The same seed samples the same tokens either way; with 'trainer' the behaviour log-probs are the training
    forward's (under the same bf16 autocast) and each token's weight is min(exp(trainer - sampled), cap)."""
    ts, sampled = _batch(tiny_args, "sampler")
    tt, trained = _batch(tiny_args, "trainer")
    assert torch.equal(sampled.completion_ids, trained.completion_ids) and sampled.token_weights is None
    with ts.precision():
        forward = ts.ctx.logprobs(sampled)
    assert torch.equal(trained.behavior_logprobs, forward)
    mask = sampled.completion_attention_mask > 0
    diff = forward - sampled.behavior_logprobs
    assert diff[mask].abs().max() > 0  # bf16: decode step and training forward round differently
    expected = torch.where(mask, torch.exp(diff).clamp(max=1.0005), torch.ones_like(diff))
    torch.testing.assert_close(trained.token_weights, expected, rtol=0, atol=0)
    assert (trained.token_weights[mask] < 1).any() and (trained.token_weights[mask] == 1.0005).any()  # both sides
    per_row = (diff.abs() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    assert trained.columns["sampler_logprob_mismatch"] == pytest.approx(per_row.tolist(), abs=0)


def test_a_step_logs_the_mismatch(tiny_args):
    t = Trainer(Config.build({**tiny_args, "steps": 1, "dtype": "bfloat16", "behavior_logprobs": "trainer"}),
                log=lambda *a: None)
    m = t.train_step()
    assert m["sampler_logprob_mismatch"] > 0 and "sampler_logprob_mismatch" not in Trainer(
        Config.build({**tiny_args, "steps": 1}), log=lambda *a: None).train_step()


def test_refused_for_a_policy_without_text(tmp_path):
    cfg = Config.build({**recipe_overrides("grpo_control"), "behavior_logprobs": "trainer", "out": str(tmp_path)})
    with pytest.raises(ConfigError, match="behavior_logprobs: 'trainer' .* policy 'control' is not one"):
        Trainer(cfg, log=lambda *a: None)
