"""Per-token log-prob estimators of a masked diffusion LM (the likelihood itself is intractable).

Every estimator has one signature, ``fn(logits_fn, ids, attn, prompt_len, mask_id, seeds, **params) -> [R, L]``:
``ids`` [R, P + L] = the left-padded prompt (``prompt_len`` = P positions) followed by the L completion tokens,
``attn`` [R, P + L] the real (non-pad) positions, ``seeds`` [R] the mask seed of each row. All of a row's random draws (which positions are masked, the times t) come from a
``torch.Generator`` seeded with that row's seed, so the behaviour (old), reference and current log-probs of one
batch use the same masks and differ only by the weights: a ratio compares like with like, and equals 1 exactly
while the weights have not moved. ``logits_fn(ids, attn) -> [R, P + L, V]`` is a bidirectional masked LM's
forward (a ``transformers`` ``*ForMaskedLM``; the policy supplies it).

Registered by name in :data:`ESTIMATORS` (the policy's ``dllm_logprob`` parameter). ``step_replay`` also reads
the sampler's step map (``step_map`` [R, L]) and ``temperature``; the others ignore them.
"""
from __future__ import annotations

import numpy as np
import torch

#: LLaDA's floor on the masking probability: p = (1 - eps) t + eps (ML-GSAI/LLaDA get_log_likelihood.py).
EPS = 1e-3


def _generators(seeds: torch.Tensor) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(int(s)) for s in seeds.tolist()]


def _token_logp(logits_fn, noisy: torch.Tensor, attn: torch.Tensor, ids: torch.Tensor, P: int) -> torch.Tensor:
    """log softmax(logits_k)[y_k] at the completion positions k (``[R, L]``)."""
    logits = logits_fn(noisy, attn)[:, P:].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)


def onestep(logits_fn, ids, attn, prompt_len: int, mask_id: int, seeds, *, p_mask_prompt: float = 0.15,
            **_) -> torch.Tensor:
    """diffu-GRPO's one-step unmasking estimate (d1).

    Every completion token is replaced by the mask token; each real prompt token independently with probability
    ``p_mask_prompt`` (a uniform draw u < p from the row's generator, one per real prompt token counted from the
    prompt's end, so left padding does not move the draws); one forward pass; per token
    ``log π(y_k | q) ≈ log softmax(logits_k)[y_k]`` (no ELBO weight, no 1/t, no temperature).

    Paper: Zhao et al., "d1: Scaling Reasoning in Diffusion Large Language Models via Reinforcement Learning",
    arXiv:2504.12216 (not in seed-catalog.md; issue 25 names it as the common baseline).

    Provenance: authors' code — https://github.com/dllm-reasoning/d1, diffu-grpo/diffu_grpo_trainer.py
    (forward_process, _get_per_token_logps); except where the seed lives: d1 draws one seed per inner iteration for the whole batch
    (``mask_seeds``) and masks with the global RNG; here each row has its own seed and generator (drawn by the
    sampler; update strategy ``mask_reseed`` derives a new one per inner pass, as d1's iterations).
    d1 also masks left-padding prompt positions; here pads are never masked (they are not attended to).
    Test: tests/test_dllm.py::test_onestep_equals_log_softmax_by_hand.
    """
    P = prompt_len
    noisy = ids.clone()
    for i, g in enumerate(_generators(seeds)):
        n = int(attn[i, :P].sum())
        hit = torch.rand(n, generator=g) < p_mask_prompt
        noisy[i, P - n:P][hit] = mask_id
    noisy[:, P:] = mask_id
    return _token_logp(logits_fn, noisy, attn, ids, P)


def elbo_mc(logits_fn, ids, attn, prompt_len: int, mask_id: int, seeds, *, elbo_samples: int = 4, **_) -> torch.Tensor:
    """The masked-diffusion ELBO by double Monte Carlo, per token.

    For n = ``elbo_samples`` draws j: t_j ~ U(0, 1), p_j = (1 − ε) t_j + ε (ε = 1e-3, LLaDA), each completion token
    masked independently with probability p_j (the prompt never), one forward pass; token k's term is
    ``(1/n) Σ_j 1[k masked in j] · log softmax(logits_jk)[y_k] / p_j``. The row sum is the ELBO estimate
    ``E_t E_{y_t} [(1/t) Σ_{masked k} log π(y_k | y_t, q)] ≤ log π(y | q)`` (LLaDA's bound with a linear schedule;
    GDPO's sequence-level surrogate, eq. of L_ELBO). n forward passes per row.

    Paper: Rojas et al., "Improving Reasoning for Diffusion Language Models via Group Diffusion Policy
    Optimization" (GDPO), arXiv:2510.08554 (seed 000-101), as the double-MC baseline it improves on; the bound is
    LLaDA's (Nie et al., ML-GSAI/LLaDA get_log_likelihood.py forward_process).

    Provenance: paper equations — GDPO's L_ELBO (no authors' code found), with LLaDA's ε floor on t; ours: the
    per-token split of the sequence sum, so that the trainer's token-level ratio and KL apply.
    Test: tests/test_dllm.py::test_elbo_mc_by_hand.
    """
    P = prompt_len
    R, L = ids.shape[0], ids.shape[1] - P
    gens = _generators(seeds)
    out = torch.zeros(R, L)
    for _j in range(elbo_samples):
        t = torch.stack([torch.rand((), generator=g) for g in gens])
        p = (1 - EPS) * t + EPS
        masked = torch.stack([torch.rand(L, generator=g) for g in gens]) < p[:, None]
        noisy = ids.clone()
        noisy[:, P:][masked] = mask_id
        lp = _token_logp(logits_fn, noisy, attn, ids, P)
        out = out + masked * lp / p[:, None]
    return out / elbo_samples


def masked_entropy(logits_fn, ids, attn, prompt_len: int, mask_id: int) -> torch.Tensor:
    """The vocabulary entropy ``[R, L]`` at each completion position with every completion token masked and the
    prompt intact: H_k = −Σ_v p_kv log p_kv, p_k = softmax(logits_k) (one forward, no random draw) [ours: what
    "the policy's entropy at token k" means for a masked diffusion LM here; entropy terms and the entropy metric
    read it]."""
    noisy = ids.clone()
    noisy[:, prompt_len:] = mask_id
    logp = torch.log_softmax(logits_fn(noisy, attn)[:, prompt_len:].float(), -1)
    return -(logp.exp() * logp).sum(-1)


def quadrature(n: int) -> tuple[list[float], list[float]]:
    """Gauss-Legendre nodes and weights of order ``n`` on [0, 1] (the weights sum to 1)."""
    x, w = np.polynomial.legendre.leggauss(n)
    return [float((v + 1) / 2) for v in x], [float(v / 2) for v in w]


def elbo_sdmc(logits_fn, ids, attn, prompt_len: int, mask_id: int, seeds, *, elbo_samples: int = 4,
              **_) -> torch.Tensor:
    """GDPO's semi-deterministic Monte Carlo ELBO, per token.

    The same integrand as :func:`elbo_mc`, f(t) = E_{y_t}[(1/p(t)) Σ_k 1[k masked] log π(y_k | y_t, q)] with
    p(t) = (1 − ε) t + ε, but the integral over t is a deterministic Gauss-Legendre quadrature of order n =
    ``elbo_samples`` on [0, 1] (nodes t_i, weights w_i, Σ w_i = 1); only the mask is drawn, one per node, from the
    row's generator. Token k's term is Σ_i w_i · 1[k masked at node i] · log softmax(logits_ik)[y_k] / p(t_i):
    n forward passes per row, the budget of :func:`elbo_mc` with the same n. The time variable carries most of the
    double-MC variance (GDPO's analysis), and it is gone here; the quadrature's own error is deterministic.

    Paper: Rojas et al., "Improving Reasoning for Diffusion Language Models via Group Diffusion Policy
    Optimization" (GDPO), arXiv:2510.08554 (seed 000-101).

    Provenance: reconstructed from the abstract — GDPO (arXiv:2510.08554) and the reference notes on its paper
    and project page (reference/beyond-text-images-dllm.md §14; no authors' code found); the quadrature rule
    (Gauss-Legendre), one mask per node and ε are our choices; the paper's node count is not extracted. Test: tests/test_dllm.py::test_sdmc_has_lower_variance_than_double_mc.
    """
    P = prompt_len
    R, L = ids.shape[0], ids.shape[1] - P
    gens = _generators(seeds)
    out = torch.zeros(R, L)
    for t, w in zip(*quadrature(elbo_samples)):
        p = (1 - EPS) * t + EPS
        masked = torch.stack([torch.rand(L, generator=g) for g in gens]) < p
        noisy = ids.clone()
        noisy[:, P:][masked] = mask_id
        out = out + w * masked * _token_logp(logits_fn, noisy, attn, ids, P) / p
    return out


def step_replay(logits_fn, ids, attn, prompt_len: int, mask_id: int, seeds, *, step_map: torch.Tensor,
                temperature: float = 1.0, **_) -> torch.Tensor:
    """DiPO's log-prob of the decoding trajectory, by replaying the sampler's step map.

    For each denoising step s of the rollout, rebuild the state the sampler saw: completion tokens unmasked at a
    step < s are revealed, those unmasked at s or later are masks (the prompt is never masked); one forward; each
    token unmasked at step s scores log softmax(logits_k / τ)[y_k] (τ = the sampling temperature; 0 → 1). Token k's
    log-prob is its term at its own step, so the row sum is the log-probability of the sampled tokens along the
    actual trajectory (the choice of which positions to unmask, a function of the confidences, is not scored).
    S forward passes per row (S = the sampler's steps); no random draw (``seeds`` unused). Under the sampling
    weights it reproduces the sampler's own log-probs (``step_data["sampler_logprobs"]``).

    Paper: Zhu et al., "DiRL: An Efficient Post-Training Framework for Diffusion Language Models" (DiPO),
    arXiv:2512.22234 (seed 000-73).

    Provenance: reconstructed from the abstract — DiPO (arXiv:2512.22234) and the reference notes' summary of the
    authors' code (OpenMOSS/DiRL train/grpo.py forward_process and the SDAR model's RL loss,
    reference/beyond-text-images-dllm.md §15), not read here; differences: a fully bidirectional model (theirs is block-causal with KV cache), one forward per
    step over the whole batch instead of one training row per (sample, step), no ``shrink``.
    Test: tests/test_dllm.py::test_step_replay_reproduces_the_sampler.
    """
    P = prompt_len
    out = torch.zeros(ids.shape[0], ids.shape[1] - P)
    tau = temperature if temperature > 0 else 1.0
    for s in sorted(set(step_map.flatten().tolist()) - {-1}):
        noisy = ids.clone()
        noisy[:, P:][step_map >= s] = mask_id
        logits = logits_fn(noisy, attn)[:, P:].float() / tau
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
        out = out + torch.where(step_map == s, lp, torch.zeros_like(lp))
    return out


ESTIMATORS = {"onestep": onestep, "elbo_mc": elbo_mc, "elbo_sdmc": elbo_sdmc, "step_replay": step_replay}
