"""TRPO: one KL-constrained natural-gradient step per batch (update strategy), seed 000-89."""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import ConfigError
from ..registry import UPDATE_STRATEGIES, param
from ._checks import require_at_least

EPS = 1e-8  # the reference codes' guard in the CG step and the step size (Spinning Up's EPS)


# ------------------------------------------------------------------ flat vectors
def flat_grad(y: torch.Tensor, params: list[torch.Tensor], create_graph: bool = False) -> torch.Tensor:
    """``d y / d params`` as one flat vector (zeros for parameters ``y`` does not depend on)."""
    grads = torch.autograd.grad(y, params, create_graph=create_graph, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def get_flat(params: list[torch.Tensor]) -> torch.Tensor:
    """The parameters as one float32 (or float64) vector, a copy."""
    return torch.cat([p.detach().reshape(-1).to(torch.promote_types(p.dtype, torch.float32)) for p in params])


@torch.no_grad()
def set_flat(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` into the parameters in place (the parameter objects, and so the optimiser's keys, stay)."""
    i = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[i:i + n].view_as(p).to(p.dtype))
        i += n


# ------------------------------------------------------------------ the solver
def conjugate_gradient(avp: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, iters: int,
                       residual_tol: float = 1e-10) -> torch.Tensor:
    """``iters`` conjugate-gradient iterations for ``A x = b`` from ``x = 0`` (``A`` symmetric positive definite,
    given as the product ``avp(v) = A v``)::

        r = p = b;  for k: z = A p;  a = r.r / (p.z + EPS);  x += a p;  r -= a z;  p = r + (r'.r' / r.r) p

    Stops early once ``r.r < residual_tol`` (1e-10, the authors' ``cg``), or at once when ``b = 0``."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = torch.dot(r, r)
    for _ in range(iters):
        if float(rr) == 0.0:
            break
        z = avp(p)
        alpha = rr / (torch.dot(p, z) + EPS)
        x = x + alpha * p
        r = r - alpha * z
        rr_new = torch.dot(r, r)
        p = r + (rr_new / rr) * p
        rr = rr_new
        if float(rr) < residual_tol:
            break
    return x


def fisher_vector_product(kl_terms: Iterable[Callable[[], torch.Tensor]], params: list[torch.Tensor],
                          v: torch.Tensor, damping: float) -> torch.Tensor:
    """``(H + damping I) v`` with ``H`` the Hessian of ``KL = sum of kl_terms()`` (each a scalar: one
    micro-batch's share of the mean KL) at the current parameters, by double backprop:
    ``H v = grad((grad KL) . v)``, summed over the terms."""
    v = v.detach()
    out = torch.zeros_like(v)
    # the fused attention kernels have no double backward: the math kernel for this forward
    with sdpa_kernel([SDPBackend.MATH]):
        for term in kl_terms:
            g = flat_grad(term(), params, create_graph=True)
            out += flat_grad(torch.dot(g, v), params)
    return out + damping * v


def line_search(params: list[torch.Tensor], theta0: torch.Tensor, fullstep: torch.Tensor,
                evaluate: Callable[[], tuple[float, float]], surrogate0: float, max_kl: float, coeff: float,
                iters: int) -> tuple[bool, int, float, float]:
    """Backtracking: for ``j = 0 .. iters-1`` set ``theta = theta0 + coeff^j fullstep`` and accept the first
    whose ``evaluate() = (surrogate, kl)`` is finite with ``kl <= max_kl`` and ``surrogate >= surrogate0``.
    Returns ``(accepted, j, kl, surrogate - surrogate0)``; when none is accepted the parameters are restored to
    ``theta0`` and ``j = iters``, and the KL and improvement are those of the last try."""
    kl, improve = float("nan"), float("nan")
    for j in range(iters):
        set_flat(params, theta0 + (coeff ** j) * fullstep)
        surr, kl = evaluate()
        improve = surr - surrogate0
        if math.isfinite(surr) and math.isfinite(kl) and kl <= max_kl and improve >= 0:
            return True, j, kl, improve
    set_flat(params, theta0)
    return False, iters, kl, improve


# ------------------------------------------------------------------ the objective's pieces
def surrogate_sum(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, n_tokens: float) -> torch.Tensor:
    """A micro-batch's share of ``L = (1/N) sum_t m_t exp(log pi_theta - log pi_old) A_t`` (``N``: the batch's
    loss tokens, ``sum m``)."""
    ratio = torch.exp(logprobs - old_logprobs)
    return (ratio * advantages * mask).sum() / n_tokens


def kl_sum(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, n_tokens: float) -> torch.Tensor:
    """A micro-batch's share of the mean KL(pi_old || pi_theta) over the loss tokens, k3 estimate at the sampled
    tokens: ``(1/N) sum_t m_t (r_t - 1 - log r_t)``, ``r_t = pi_theta(o_t) / pi_old(o_t)``. Each term is >= 0 and
    0 at theta_old; its Hessian there is ``(1/N) sum_t m_t s_t s_t^T`` with ``s_t = grad log pi(o_t)``."""
    log_r = logprobs - old_logprobs
    return ((torch.exp(log_r) - 1.0 - log_r) * mask).sum() / n_tokens


def _check_trpo(cfg) -> None:
    if not cfg.trpo_max_kl > 0:
        raise ConfigError(f"trpo_max_kl: must be > 0, got {cfg.trpo_max_kl}")
    require_at_least(cfg, 1, "trpo_cg_iters")
    require_at_least(cfg, 0, "trpo_cg_damping")
    if not 0 < cfg.trpo_backtrack_coeff < 1:
        raise ConfigError(f"trpo_backtrack_coeff: must be in (0, 1), got {cfg.trpo_backtrack_coeff}")
    require_at_least(cfg, 1, "trpo_backtrack_iters")
    if cfg.beta > 0:
        raise ConfigError(f"update_strategy: trpo maximises the surrogate under its KL constraint and adds no "
                          f"reference penalty; set beta: 0 (got {cfg.beta})")
    if cfg.off_policy_refresh_steps > 1 or cfg.async_rollouts:
        raise ConfigError("update_strategy: trpo's pi_old is the weights at the step's start, so its rollouts must "
                          "come from them: set off_policy_refresh_steps: 1 and async_rollouts: false")
    if cfg.regularizers:
        raise ConfigError(f"update_strategy: trpo's step uses only the surrogate ratio * advantage; it would ignore "
                          f"regularizers {list(cfg.regularizers)}: remove them")


@UPDATE_STRATEGIES.register("trpo", check=_check_trpo)
class TRPO:
    """TRPO: one natural-gradient step per batch, inside a KL trust region, found by a line search.

    *Trust Region Policy Optimization* (Schulman, Levine, Moritz, Jordan, Abbeel, 2015, arXiv:1502.05477),
    seed 000-89. With the batch's advantages ``A_t`` (the recipe: group z-scores), loss-token weights ``m_t``,
    ``N = sum m_t`` and ``theta_old`` the weights before the step (the rollout policy)::

        maximise  L(theta) = (1/N) sum_t m_t  pi_theta(o_t) / pi_old(o_t)  A_t
        s.t.      KL(theta) = (1/N) sum_t m_t (r_t - 1 - log r_t) <= delta,  r_t = pi_theta(o_t) / pi_old(o_t)

    1. ``g = grad L`` at ``theta_old``;
    2. ``x ~ F^-1 g`` by ``trpo_cg_iters`` conjugate-gradient iterations, ``F v = (H_KL + damping I) v`` by
       double backprop (``H_KL``: Hessian of the mean KL at ``theta_old``; :func:`fisher_vector_product`);
    3. full step ``beta x``, ``beta = sqrt(2 delta / (x^T F x + 1e-8))``;
    4. backtracking line search (:func:`line_search`): ``theta_old + c^j beta x`` for ``j = 0 ..
       trpo_backtrack_iters - 1`` (``c = trpo_backtrack_coeff``); the first with ``KL <= delta`` and
       ``L >= L(theta_old)`` is kept, else the weights stay ``theta_old``.

    ``log pi_old`` is recomputed with the step's starting weights by the same forward (so the ratio is exactly
    1 and ``KL = 0`` at ``theta_old``), not taken from the batch's behaviour log-probs (sampled under another
    precision or engine): rollouts must come from the current weights (``off_policy_refresh_steps: 1``, no
    ``async_rollouts``). Log-probs come from the policy's ``forward`` in the trainer's micro-batches, in the
    weights' dtype (no autocast: the CG and the line search compare small differences); every sum above is
    over the whole batch (the micro-batches' shares add up). The KL's forward must be twice differentiable:
    it asks the causal LM for ``entropy_grad`` (its plain-autograd log-softmax, not the fused one) and runs
    attention with the math kernel. Per step: one forward for ``pi_old``, one forward and backward for ``g``,
    ``trpo_cg_iters + 1`` double-backprop passes, at most ``trpo_backtrack_iters`` forwards.

    Not used for this step: the optimiser (AdamW), ``learning_rate``, ``max_grad_norm``, ``num_iterations``,
    ``policy_loss`` and ``loss_aggregation``; the learning-rate scheduler does not step either (it follows the
    optimiser's steps) and checkpoints hold the untouched, empty optimiser state.
    ``grad_norm`` is the norm of ``g``, ``loss`` is ``-L(theta_old)``. Metrics: ``trpo/kl`` (KL of the accepted
    step, or of the last try when rejected), ``trpo/surrogate_improvement`` (``L(theta_new) - L(theta_old)``;
    0 when rejected), ``trpo/expected_improvement`` (``g . step``), ``trpo/line_search_steps`` (the shrinks
    ``j`` taken; ``trpo_backtrack_iters`` when rejected), ``trpo/accepted`` (1 or 0; 0 also when ``g = 0``: no
    step).

    Defaults: delta 0.01 (the paper's experiments and the authors' code), 10 CG iterations, 10 backtracks;
    damping 0.1 and shrink 0.8 with ``kl <= delta and L >= L(theta_old)`` as in OpenAI Spinning Up's TRPO (the
    authors' modular_rl: damping 1e-3, shrink 0.5; OpenAI Baselines' trpo_mpi: damping 0.01, shrink 0.5,
    accept ``kl <= 1.5 delta`` and a surrogate no worse).

    Provenance: authors' code — https://github.com/joschu/modular_rl modular_rl/trpo.py (John Schulman's code;
    TrpoUpdater: surrogate ``exp(logp - oldlogp) . adv / N``, Fisher-vector product by differentiating
    ``grad(KL with the first argument fixed) . v``, ``+ cg_damping * p``; ``cg`` with 10 iterations and
    residual_tol 1e-10; ``lm = sqrt(0.5 s.Fs / max_kl)``, full step ``s / lm``; a 0.5**j backtracking line
    search); the KL test in the line search follows OpenAI Spinning Up spinup/algos/tf1/trpo/trpo.py
    (``backtrack_coeff**j``, ``kl <= delta and pi_l_new <= pi_l_old``, else the old parameters) and OpenAI
    Baselines trpo_mpi; read, not copied. Known differences: modular_rl's line search tests only the surrogate
    (actual improvement > 0 and > 0.1 x the expected one) and then sets ``thprev + fullstep`` whatever it
    found; here the Spinning Up acceptance rule is used. The paper and these codes differentiate the analytic
    KL of the whole action distribution (for an LM: over the vocabulary); grpolab's policies' ``forward``
    gives the sampled tokens' log-probs, so the mean KL here is the k3 estimate at the sampled tokens
    (unbiased for KL(pi_old || pi_theta) under pi_old samples), whose Hessian at theta_old is the empirical
    Fisher (mean outer product of the token scores), the "covariance of gradients" estimator the paper sets
    beside its analytic one; the line search uses the same estimate. No value function: the advantages are
    the recipe's group-relative ones, not GAE. One process only.
    Test: tests/test_trpo.py::test_conjugate_gradient_solves_an_spd_system,
    tests/test_trpo.py::test_fvp_equals_hessian_of_kl_and_empirical_fisher,
    tests/test_trpo.py::test_line_search_rejects_and_restores,
    tests/test_trpo.py::test_accepted_step_respects_the_trust_region.
    """

    def __init__(self, *,
                 trpo_max_kl: float = param(0.01, 'TRPO: trust region delta on the mean KL(pi_old || pi_theta) '
                                            '(paper and Spinning Up: 0.01)'),
                 trpo_cg_iters: int = param(10, 'TRPO: conjugate-gradient iterations for F x = g (10)'),
                 trpo_cg_damping: float = param(0.1, 'TRPO: damping added to the Fisher-vector product, (F + d I) v '
                                                '(Spinning Up 0.1; Baselines 0.01)'),
                 trpo_backtrack_coeff: float = param(0.8, 'TRPO: line-search shrink factor per try (Spinning Up '
                                                     '0.8; Baselines 0.5)'),
                 trpo_backtrack_iters: int = param(10, 'TRPO: line-search tries before keeping the old weights '
                                                   '(10)')):
        self.max_kl = float(trpo_max_kl)
        self.cg_iters = int(trpo_cg_iters)
        self.damping = float(trpo_cg_damping)
        self.coeff = float(trpo_backtrack_coeff)
        self.backtracks = int(trpo_backtrack_iters)

    def __call__(self, batch, model, ctx):
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            raise ConfigError("update_strategy: trpo runs in one process (its CG and line search do not reduce "
                              "over ranks); train without torchrun")
        cfg, policy = ctx.cfg, ctx.actions
        params = [p for p in model.parameters() if p.requires_grad]
        device = params[0].device
        mbs = [mb.to(device) for mb in batch.micro_batches(cfg.micro_batch_size, max_tokens=cfg.micro_batch_tokens)]
        n_tok = max(float(batch.completion_mask.sum()), 1.0)
        model.eval()
        want_ent = frozenset({"entropy"}) & policy.offers()
        old, ent_sum = [], 0.0
        with torch.no_grad():
            for mb in mbs:
                out = policy.forward(model, mb, want=want_ent, grad=False)
                old.append(out["logprobs"].detach())
                if want_ent:
                    ent_sum += float((out["entropy"] * mb.completion_mask).sum())

        # the double backprop needs a twice-differentiable forward: the causal LM's plain-autograd path (the one
        # it takes when a loss needs the entropy's gradient) instead of its fused log-softmax backward
        twice = frozenset({"entropy_grad"}) & policy.offers()

        def logp(mb, grad: bool, second_order: bool = False):
            return policy.forward(model, mb, want=twice if second_order else frozenset(), grad=grad)["logprobs"]

        # 1. surrogate and its gradient at theta_old
        surr0, g = 0.0, torch.zeros_like(get_flat(params))
        for mb, o in zip(mbs, old):
            s = surrogate_sum(logp(mb, True), o, mb.advantages, mb.completion_mask, n_tok)
            surr0 += float(s.detach())
            g += flat_grad(s, params).to(g.dtype)
        gnorm = float(g.norm())
        out = {"loss": -surr0, "grad_norm": gnorm, "skipped": 0, "kl": None,
               "entropy": ent_sum / n_tok if want_ent else None, "clip_frac_low": 0.0, "clip_frac_high": 0.0,
               "trpo/kl": 0.0, "trpo/surrogate_improvement": 0.0, "trpo/expected_improvement": 0.0,
               "trpo/line_search_steps": 0.0, "trpo/accepted": 0.0}
        if not (math.isfinite(gnorm) and math.isfinite(surr0)):
            ctx.log("[grpolab] trpo: non-finite surrogate or gradient; step skipped, weights unchanged")
            return {**out, "loss": float("nan"), "skipped": 1}
        if gnorm == 0.0:  # nothing to climb (e.g. every advantage 0): no step
            return out

        # 2.-3. natural-gradient direction and the full step
        kl_terms = [lambda mb=mb, o=o: kl_sum(logp(mb, True, True), o, mb.completion_mask, n_tok)
                    for mb, o in zip(mbs, old)]

        def fvp(v):
            return fisher_vector_product(kl_terms, params, v, self.damping)

        x = conjugate_gradient(fvp, g, self.cg_iters)
        beta = math.sqrt(2.0 * self.max_kl / (float(torch.dot(x, fvp(x))) + EPS))
        fullstep = beta * x

        # 4. line search
        @torch.no_grad()
        def evaluate():
            surr, kl = 0.0, 0.0
            for mb, o in zip(mbs, old):
                lp = logp(mb, False)
                surr += float(surrogate_sum(lp, o, mb.advantages, mb.completion_mask, n_tok))
                kl += float(kl_sum(lp, o, mb.completion_mask, n_tok))
            return surr, kl

        theta0 = get_flat(params)
        accepted, j, kl, improve = line_search(params, theta0, fullstep, evaluate, surr0, self.max_kl, self.coeff,
                                               self.backtracks)
        return {**out, "trpo/kl": kl, "trpo/surrogate_improvement": improve if accepted else 0.0,
                "trpo/expected_improvement": float(torch.dot(g, fullstep)) * (self.coeff ** j if accepted else 0.0),
                "trpo/line_search_steps": float(j), "trpo/accepted": float(accepted)}
