"""TRPO as an update strategy (seed 000-89): conjugate gradient, the Fisher-vector product, the trust-region step
and its line search, the recipe."""
import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from grpolab.config import Config
from grpolab.errors import ConfigError
from grpolab.recipes import recipe_overrides
from grpolab.stages.update_trpo import (TRPO, conjugate_gradient, fisher_vector_product, get_flat, kl_sum, line_search,
                                 set_flat, surrogate_sum)
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

TWICE = frozenset({"entropy_grad"})  # the causal LM's twice-differentiable forward (plain autograd log-softmax)


# ----------------------------------------------------------------------------- conjugate gradient
def test_conjugate_gradient_solves_an_spd_system():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(6, 6, generator=g, dtype=torch.float64)
    a = m @ m.T + 0.5 * torch.eye(6, dtype=torch.float64)  # symmetric positive definite
    b = torch.randn(6, generator=g, dtype=torch.float64)
    x = conjugate_gradient(lambda v: a @ v, b, iters=6, residual_tol=0.0)  # n iterations: exact in exact arithmetic
    torch.testing.assert_close(x, torch.linalg.solve(a, b), atol=1e-6, rtol=1e-6)
    # CG ends in as many iterations as A has distinct eigenvalues: A = Q diag(2, 2, 2, 5, 5, 5) Q^T needs 2
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    a2 = q @ torch.diag(torch.tensor([2.0, 2, 2, 5, 5, 5], dtype=torch.float64)) @ q.T
    x2 = conjugate_gradient(lambda v: a2 @ v, b, iters=2, residual_tol=0.0)
    torch.testing.assert_close(x2, torch.linalg.solve(a2, b), atol=1e-6, rtol=1e-6)
    # ... and one iteration does not (the test can tell)
    x1 = conjugate_gradient(lambda v: a2 @ v, b, iters=1, residual_tol=0.0)
    assert (x1 - torch.linalg.solve(a2, b)).norm() > 1e-2
    assert torch.equal(conjugate_gradient(lambda v: a @ v, torch.zeros(6, dtype=torch.float64), 10),
                       torch.zeros(6, dtype=torch.float64))


# ----------------------------------------------------------------------------- a tiny model and a batch
def _args(tmp_path, **kw):
    return {**recipe_overrides("trpo"), "model": "tiny", "task": "repeat", "prompts_per_step": 2,
            "num_generations": 4, "max_completion_length": 6, "eval_before": False, "eval_after": False,
            "tensorboard": False, "micro_batch_size": 3, "threads": 1, "out": str(tmp_path / "run"), **kw}


@pytest.fixture
def trainer_and_batch(tmp_path):
    """A trainer on the trpo recipe and one scored batch with fixed advantages (+-1 per row: the tiny model's
    rewards on `repeat` are often all 0); micro_batch_size 3 splits the 8 rows into 3 micro-batches."""
    t = Trainer(Config.build(_args(tmp_path)), log=lambda *a: None)
    t.ctx.new_step(0)
    batch, _, _ = t.collect()
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 1.0, -1.0, -1.0])[:batch.num_rows]
    batch.advantages = signs[:, None] * batch.completion_mask
    return t, batch


def _forward(t, batch, want=frozenset()):
    return t.policy.forward(t.model, batch, want=want, grad=torch.is_grad_enabled())["logprobs"]


# ----------------------------------------------------------------------------- the Fisher-vector product
def test_fvp_equals_hessian_of_kl_and_empirical_fisher(trainer_and_batch):
    """On a handful of parameters (the final norm's 64 weights), ``fisher_vector_product`` equals
    ``(H + d I) v`` with ``H`` the Hessian of the mean k3 KL from torch.autograd.functional.hessian, at
    theta_old and at a perturbed point; at theta_old ``H`` also equals the empirical Fisher
    ``(1/N) sum_t m_t s_t s_t^T`` built from per-token gradients (a third computation)."""
    t, batch = trainer_and_batch
    w = t.model.model.norm.weight
    mask, n = batch.completion_mask, float(batch.completion_mask.sum())
    with torch.no_grad():
        old = _forward(t, batch)
    v = torch.randn(w.numel(), generator=torch.Generator().manual_seed(1))
    damping = 0.1

    class Wrapped(torch.nn.Module):  # so that functional_call swaps the weight inside the policy's forward
        def __init__(self, model):
            super().__init__()
            self.inner = model

        def forward(self, mb):
            return t.policy.forward(self.inner, mb, want=TWICE, grad=True)["logprobs"]

    wrapped = Wrapped(t.model)

    def kl_of(x):
        lp = torch.func.functional_call(wrapped, {"inner.model.norm.weight": x}, (batch,))
        log_r = lp - old
        return ((log_r.exp() - 1 - log_r) * mask).sum() / n

    for shift in (0.0, 0.3):
        with torch.no_grad():
            w.add_(shift * torch.randn(w.shape, generator=torch.Generator().manual_seed(2)))
        with sdpa_kernel([SDPBackend.MATH]):
            h = torch.autograd.functional.hessian(kl_of, w.detach().clone())
        fvp = fisher_vector_product([lambda: kl_sum(_forward(t, batch, TWICE), old, mask, n)], [w], v, damping)
        torch.testing.assert_close(fvp, h @ v + damping * v, atol=1e-5, rtol=1e-4)
        fisher = torch.zeros(w.numel(), w.numel())
        lp = _forward(t, batch, TWICE)  # (the fused log-softmax backward frees its buffer: one grad per graph)
        for r, c in mask.nonzero().tolist():
            s = torch.autograd.grad(lp[r, c], w, retain_graph=True)[0]
            fisher += mask[r, c] * torch.outer(s, s) / n
        if shift == 0.0:
            torch.testing.assert_close(h, fisher, atol=1e-5, rtol=1e-4)
            assert float(torch.linalg.eigvalsh(h).min()) > -1e-6  # PSD at theta_old (k3's Hessian there)
        else:  # away from theta_old the Hessian is no longer the empirical Fisher
            assert (h - fisher).abs().max() > 1e-4, (h - fisher).abs().max()


def test_fvp_sums_over_micro_batches(trainer_and_batch):
    """The FVP over micro-batches (each term one micro-batch's share) equals the one over the whole batch."""
    t, batch = trainer_and_batch
    params = [p for p in t.model.parameters()]
    mask, n = batch.completion_mask, float(batch.completion_mask.sum())
    with torch.no_grad():
        old = _forward(t, batch)
    v = torch.randn(sum(p.numel() for p in params), generator=torch.Generator().manual_seed(3))
    whole = fisher_vector_product([lambda: kl_sum(_forward(t, batch, TWICE), old, mask, n)], params, v, 0.0)
    parts = []
    for lo, hi in ((0, 3), (3, 8)):
        mb = batch.select(list(range(lo, hi)))
        parts.append(lambda mb=mb, o=old[lo:hi], m=mask[lo:hi]: kl_sum(_forward(t, mb, TWICE), o, m, n))
    torch.testing.assert_close(fisher_vector_product(parts, params, v, 0.0), whole, atol=1e-5, rtol=1e-4)
    assert whole.norm() > 0


# ----------------------------------------------------------------------------- the step
def _surrogate_and_kl(t, batch, old):
    """Independent evaluation on the whole batch: mean ratio * A and mean k3 KL over the loss tokens."""
    with torch.no_grad():
        lp = _forward(t, batch)
    m = batch.completion_mask
    ratio = torch.exp(lp - old)
    surr = float((ratio * batch.advantages * m).sum() / m.sum())
    kl = float(((ratio - 1 - torch.log(ratio)) * m).sum() / m.sum())
    return surr, kl


@pytest.mark.parametrize("delta", [0.01, 1e-4])
def test_accepted_step_respects_the_trust_region(trainer_and_batch, delta):
    """The accepted step has KL(pi_old || pi_new) <= delta and a higher surrogate (both recomputed here on the
    whole batch, not from the strategy's micro-batch sums), the logged values match, and the weights moved."""
    t, batch = trainer_and_batch
    with torch.no_grad():
        old = _forward(t, batch)
    surr0, kl0 = _surrogate_and_kl(t, batch, old)
    assert kl0 == 0.0  # ratio exactly 1 at theta_old
    before = get_flat(list(t.model.parameters()))
    step = TRPO(trpo_max_kl=delta)
    out = step(batch=batch, model=t.model, ctx=t.ctx)
    surr1, kl1 = _surrogate_and_kl(t, batch, old)
    assert out["trpo/accepted"] == 1.0 and out["skipped"] == 0
    assert 0 < kl1 <= delta
    assert surr1 > surr0
    assert out["trpo/kl"] == pytest.approx(kl1, rel=1e-3, abs=1e-9)
    assert out["trpo/surrogate_improvement"] == pytest.approx(surr1 - surr0, rel=1e-3, abs=1e-7)
    assert out["loss"] == pytest.approx(-surr0, abs=1e-6)
    # the first try is sized so that 0.5 s^T (F + dI) s = delta, so after j shrinks by 0.8 the quadratic model's
    # KL is about delta 0.8^(2j) (less the damping's share): the step uses its trust region, it is not a timid one
    assert kl1 > 0.5 * delta * 0.8 ** (2 * out["trpo/line_search_steps"])
    after = get_flat(list(t.model.parameters()))
    assert (after - before).norm() > 0
    assert math.isfinite(out["grad_norm"]) and out["grad_norm"] > 0


def test_expected_improvement_is_first_order(trainer_and_batch):
    """With a tiny delta the surrogate's actual gain approaches the linear prediction g . step."""
    t, batch = trainer_and_batch
    out = TRPO(trpo_max_kl=1e-6)(batch=batch, model=t.model, ctx=t.ctx)
    assert out["trpo/accepted"] == 1.0
    assert out["trpo/surrogate_improvement"] == pytest.approx(out["trpo/expected_improvement"], rel=0.05)


def test_zero_advantages_leave_the_weights_unchanged(trainer_and_batch):
    """A surrogate that cannot improve (every advantage 0: g = 0): no step, the weights bit for bit the same."""
    t, batch = trainer_and_batch
    batch.advantages = torch.zeros_like(batch.advantages)
    before = [p.detach().clone() for p in t.model.parameters()]
    out = TRPO()(batch=batch, model=t.model, ctx=t.ctx)
    assert out["trpo/accepted"] == 0.0 and out["grad_norm"] == 0.0
    assert all(torch.equal(a, p) for a, p in zip(before, t.model.parameters()))


def test_line_search_rejects_and_restores():
    """The line search keeps theta0 (exactly) when no try qualifies: a KL always above delta, or a surrogate
    worse at every try (a concave bump L = g.s - c|s|^2 too steep for the 10 shrunk steps); and accepts the
    first qualifying try, j = the shrinks taken (hand: KL = 4|s|^2 <= 0.01 needs |s| <= 0.05; with
    |fullstep| = 0.12 and coeff 0.5 the tries are |s| = 0.12 (KL 0.0576), 0.06 (0.0144), 0.03 (0.0036): j = 2,
    improvement g.s = 0.03)."""
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    theta0 = get_flat([p])
    fullstep = torch.tensor([0.12, 0.0], dtype=torch.float64)

    def always_far():
        return 1.0, 1.0  # surrogate up, KL 1 > delta

    ok, j, kl, _ = line_search([p], theta0, fullstep, always_far, 0.0, 0.01, 0.8, 10)
    assert not ok and j == 10 and kl == 1.0 and torch.equal(p.detach(), theta0)

    g, c = torch.tensor([1.0, 0.0], dtype=torch.float64), 1e3

    def steep():  # the smallest try, s = 0.8^9 * 0.12 = 0.0161: g.s - c s^2 = 0.0161 - 0.259 < 0
        s = p.detach() - theta0
        return float(g @ s - c * s @ s), 0.0

    ok, j, _, improve = line_search([p], theta0, fullstep, steep, 0.0, 0.01, 0.8, 10)
    assert not ok and improve < 0 and torch.equal(p.detach(), theta0)

    def quadratic_kl():
        s = p.detach() - theta0
        return float(g @ s), float(4 * s @ s)

    ok, j, kl, improve = line_search([p], theta0, fullstep, quadratic_kl, 0.0, 0.01, 0.5, 10)
    assert ok and j == 2 and kl == pytest.approx(0.0036) and improve == pytest.approx(0.03)
    torch.testing.assert_close(p.detach(), theta0 + 0.25 * fullstep)


def test_set_flat_keeps_the_parameter_objects():
    lin = torch.nn.Linear(2, 2)
    ids = [id(q) for q in lin.parameters()]
    set_flat(list(lin.parameters()), torch.arange(6.0))
    assert [id(q) for q in lin.parameters()] == ids
    assert lin.weight.tolist() == [[0.0, 1.0], [2.0, 3.0]] and lin.bias.tolist() == [4.0, 5.0]


def test_surrogate_and_kl_hand_values():
    # two tokens, ratios e^0.1 and e^-0.2, advantages 1 and -2, N = 2:
    # L = (e^0.1 - 2 e^-0.2) / 2 = (1.105171 - 1.637462) / 2 = -0.266146
    # KL = ((e^0.1 - 1 - 0.1) + (e^-0.2 - 1 + 0.2)) / 2 = (0.005171 + 0.018731) / 2 = 0.011951
    lp, old = torch.tensor([[0.1, -0.2]]), torch.zeros(1, 2)
    m, a = torch.ones(1, 2), torch.tensor([[1.0, -2.0]])
    assert float(surrogate_sum(lp, old, a, m, 2.0)) == pytest.approx(-0.266146, abs=1e-6)
    assert float(kl_sum(lp, old, m, 2.0)) == pytest.approx(0.011951, abs=1e-6)


# ----------------------------------------------------------------------------- config and the recipe
def test_config_refuses_what_trpo_would_ignore():
    base = {**recipe_overrides("trpo"), "model": "tiny", "task": "repeat"}
    with pytest.raises(ConfigError, match="beta"):
        Config.build({**base, "beta": 0.04})
    with pytest.raises(ConfigError, match="off_policy_refresh_steps"):
        Config.build({**base, "off_policy_refresh_steps": 2})
    with pytest.raises(ConfigError, match="trpo_backtrack_coeff"):
        Config.build({**base, "trpo_backtrack_coeff": 1.0})
    with pytest.raises(ConfigError, match="trpo_max_kl"):
        Config.build({**base, "trpo_max_kl": 0.0})


def test_recipe_trains_checkpoints_and_resumes(tmp_path):
    """The trpo recipe trains 2 steps through the trainer (metrics, scheduler, checkpoint), and a resumed run
    continues; the optimiser is never stepped (its state stays empty)."""
    args = _args(tmp_path, steps=2, save_steps=2, micro_batch_size=16)
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    rows = read_metrics(args["out"])
    assert len(rows) == 2
    for r in rows:
        assert r["skipped"] == 0 and r["trpo/accepted"] in (0.0, 1.0)
        assert r["trpo/kl"] <= 0.01 and math.isfinite(r["grad_norm"]) and r["lr"] > 0
        if r["trpo/accepted"]:
            assert r["trpo/surrogate_improvement"] >= 0
    assert len(t.optimizer.state) == 0
    t2 = Trainer(Config.build({**args, "steps": 3}), resume=True, log=lambda *a: None)
    assert t2.step == 2
    t2.train(progress=False)
    assert [r["step"] for r in read_metrics(args["out"])] == [1, 2, 3]
