"""The training engine's memory options: token-budget micro-batches, activation checkpointing,
per-token loss weights, peak-memory reporting."""
import copy

import torch

from grpolab.config import Config
from grpolab.train.trainer import Trainer


def _trainer(tiny_args, **over):
    return Trainer(Config.build(tiny_args, {"num_generations": 4, "prompts_per_step": 3, **over}), log=lambda *a: None)


def _batch(tr):
    tr.model.eval()
    tr.ctx.new_step()
    batch, _, _ = tr.collect()
    batch.scalar_rewards = tr.scorer.scalar(batch)
    batch.advantages = tr.compute_advantages(batch)
    return batch


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_token_budget_micro_batches_bound_padded_size(tiny_args):
    tr = _trainer(tiny_args)
    b = _batch(tr)
    P = b.prompt_ids.shape[1]
    lengths = b.completion_attention_mask.sum(-1).tolist()
    budget = 3 * (P + max(lengths))
    mbs = b.micro_batches(8, max_tokens=budget)
    assert sum(mb.num_rows for mb in mbs) == b.num_rows
    for mb in mbs:  # every chunk (of more than one row) fits the budget, and the row cap
        width = mb.prompt_ids.shape[1] + int(mb.completion_attention_mask.sum(-1).max())
        assert mb.num_rows == 1 or mb.num_rows * width <= budget
        assert mb.num_rows <= 8
    assert len(mbs) >= b.num_rows // 3
    assert [mb.num_rows for mb in b.micro_batches(5)] == [5, 5, 2]  # rows only when max_tokens = 0


def _update_equal(tiny_args, over_a, over_b, tol):
    ta, tb = _trainer(tiny_args, **over_a), _trainer(tiny_args, **over_b)
    tb.model.load_state_dict(ta.model.state_dict())
    batch = _batch(ta)
    ua, ub = ta.update(copy.deepcopy(batch)), tb.update(copy.deepcopy(batch))
    assert abs(ua["loss"] - ub["loss"]) < tol
    assert abs(ua["grad_norm"] - ub["grad_norm"]) < tol * max(1.0, ua["grad_norm"])
    assert torch.allclose(_params(ta.model), _params(tb.model), atol=tol)
    assert not torch.equal(_params(ta.model), _params(_trainer(tiny_args).model))  # the step did move


def test_token_micro_batching_gives_the_same_update(tiny_args):
    _update_equal(tiny_args, {"micro_batch_size": 16}, {"micro_batch_size": 16, "micro_batch_tokens": 40}, 1e-5)


def test_gradient_checkpointing_gives_the_same_update(tiny_args):
    _update_equal(tiny_args, {}, {"gradient_checkpointing": True}, 1e-5)


def test_token_weights_scale_the_policy_loss(tiny_args):
    tr = _trainer(tiny_args)
    b = _batch(tr)
    b.advantages = b.advantages + 0.5 * b.completion_mask  # make sure the loss is non-zero
    state = copy.deepcopy(tr.model.state_dict())
    base = tr.update(copy.deepcopy(b))
    tr.model.load_state_dict(state)
    b2 = copy.deepcopy(b)
    b2.token_weights = torch.full_like(b.completion_mask, 2.0)
    doubled = tr.update(b2)
    assert abs(doubled["loss"] - 2 * base["loss"]) < 1e-5 * max(1.0, abs(base["loss"]))
    tr.model.load_state_dict(state)
    b3 = copy.deepcopy(b)
    b3.token_weights = torch.zeros_like(b.completion_mask)
    zero = tr.update(b3)
    assert zero["loss"] == 0.0 and zero["grad_norm"] == 0.0


def test_step_metrics_report_peak_memory(tiny_args):
    tr = _trainer(tiny_args)
    m = tr.train_step()
    assert m["peak_rss_mb"] > 50  # a Python process with torch loaded holds well over 50 MB
    assert m["prompt_len"] >= 1


def test_fused_selected_logprob_matches_autograd():
    """SelectedLogProb: values, entropy and logit gradients equal log_softmax + gather (float64)."""
    from grpolab.model.logprobs import SelectedLogProb

    g = torch.Generator().manual_seed(0)
    z = torch.randn(7, 11, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 11, (7,), generator=g)
    w = torch.randn(7, generator=g, dtype=torch.float64)
    for tau in (1.0, 0.7):
        a = z.clone().requires_grad_(True)
        lp, ent = SelectedLogProb.apply(a, y, tau, True)
        (lp * w).sum().backward()
        b = z.clone().requires_grad_(True)
        ref = torch.log_softmax(b / tau, -1)
        ref_lp = ref.gather(-1, y[:, None]).squeeze(-1)
        (ref_lp * w).sum().backward()
        ref_ent = -(ref.exp() * ref).sum(-1)
        assert torch.allclose(lp, ref_lp, atol=1e-6) and torch.allclose(ent, ref_ent.detach(), atol=1e-6)
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_reference_logprobs_with_ragged_micro_batches(tiny_args):
    """beta > 0 with micro-batches of different completion widths (regression: the per-micro-batch
    trim made the reference log-probs impossible to concatenate)."""
    tr = _trainer(tiny_args, beta=0.1, micro_batch_size=3, temperature=1.5)
    b = _batch(tr)
    tr.reference_logprobs(b)
    assert b.ref_logprobs.shape == b.completion_ids.shape
    # the reference is the initial policy: before any update its log-probs are the policy's own
    own = tr.ctx.logprobs(b, model=tr.model)
    assert torch.allclose(b.ref_logprobs, own, atol=1e-5)
