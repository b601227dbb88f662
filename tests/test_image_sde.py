"""grpolab.policies._image.sde: per-step Gaussian log-probs of image samplers, against values computed here by hand
(plain Python floats from the formulas written out again), against diffusers' schedulers, and by sampling."""
import math

import pytest
import torch

from grpolab.policies._image.sde import (cps_step, dance_step, ddim_step, flow_grpo_step, flow_sigmas, gaussian_mean_kl,
                                gaussian_step_logprob, merged_flow_step)

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def t1(value, dtype=torch.float64):
    """A one-row, one-element latent [1, 1, 1, 1]."""
    return torch.tensor(value, dtype=dtype).view(1, 1, 1, 1)


def close(a, b, tol=1e-9):
    a, b = (t.detach() if isinstance(t, torch.Tensor) else t for t in (a, b))
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))


# ------------------------------------------------------------------------------------------------ schedules


def test_flow_sigmas_hand_values():
    k = 3.0
    expected = [k * u / (1 + (k - 1) * u) for u in (1.0, 0.75, 0.5, 0.25, 0.0)]
    got = flow_sigmas(4, shift=k)
    assert got.dtype == torch.float32 and got.shape == (5,)
    assert got.tolist() == pytest.approx(expected, abs=1e-7)
    assert flow_sigmas(4).tolist() == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0], abs=1e-7)


@pytest.mark.parametrize("steps,shift", [(8, 1.0), (10, 3.0), (40, 3.0)])
def test_flow_sigmas_equal_diffusers(steps, shift):
    diffusers = pytest.importorskip("diffusers")
    # the linspace schedule (DanceGRPO): diffusers shifts custom sigmas too, then appends 0
    sch = diffusers.FlowMatchEulerDiscreteScheduler(shift=shift)
    sch.set_timesteps(sigmas=torch.linspace(1, 0, steps + 1)[:-1].tolist())
    torch.testing.assert_close(flow_sigmas(steps, shift), sch.sigmas, rtol=1e-6, atol=1e-7)
    # the scheduler's own default schedule (what Flow-GRPO samples with)
    sch = diffusers.FlowMatchEulerDiscreteScheduler(shift=shift)
    sch.set_timesteps(steps)
    torch.testing.assert_close(flow_sigmas(steps, shift, schedule="diffusers"), sch.sigmas, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(flow_sigmas(steps, shift), sch.sigmas)  # the two conventions do differ


# ------------------------------------------------------------------------------------------------ Gaussian, KL


def test_gaussian_step_logprob_hand():
    x_next = torch.tensor([[0.5, -1.0], [2.0, 0.0]], dtype=torch.float64)
    mean = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)

    def row(xs, ms, s):
        return sum(-(a - b) ** 2 / (2 * s * s) - math.log(s) - HALF_LOG_2PI for a, b in zip(xs, ms)) / len(xs)

    got = gaussian_step_logprob(x_next, mean, 0.5)
    assert close(got[0], row([0.5, -1.0], [0, 0], 0.5)) and close(got[1], row([2, 0], [1, 1], 0.5))
    got = gaussian_step_logprob(x_next, mean, torch.tensor([0.5, 2.0]))
    assert close(got[0], row([0.5, -1.0], [0, 0], 0.5)) and close(got[1], row([2, 0], [1, 1], 2.0))


def test_gaussian_step_logprob_zero_std_rows_are_zero_without_nan():
    mean = torch.zeros(2, 3, requires_grad=True)
    lp = gaussian_step_logprob(torch.ones(2, 3), mean, torch.tensor([0.0, 1.0]))
    assert lp[0] == 0 and close(lp[1], -0.5 - HALF_LOG_2PI, 1e-6)
    lp.sum().backward()
    assert torch.isfinite(mean.grad).all() and (mean.grad[0] == 0).all()


def test_gaussian_mean_kl_hand():
    mean = torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[0.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    got = gaussian_mean_kl(mean, ref, torch.tensor([0.5, 2.0]))
    assert close(got[0], (1 + 4) / 2 / (2 * 0.25)) and close(got[1], (9 + 0) / 2 / (2 * 4.0))
    assert gaussian_mean_kl(mean, mean, 0.7).abs().max() == 0


# ------------------------------------------------------------------------------------------------ Flow-GRPO


def flow_grpo_hand(x, v, sig, sig_next, a, z, sub=None):
    """Flow-GRPO's sde step on one element, plain floats."""
    dt = sig_next - sig
    denom_sigma = (sub if sub is not None else sig_next) if sig == 1 else sig
    s = a * math.sqrt(sig / (1 - denom_sigma))
    mu = x * (1 + s * s * dt / (2 * sig)) + v * (1 + s * s * (1 - sig) / (2 * sig)) * dt
    std = s * math.sqrt(-dt)
    xn = mu + std * z
    lp = -(xn - mu) ** 2 / (2 * std * std) - math.log(std) - HALF_LOG_2PI
    return xn, lp, mu, std, s


@pytest.mark.parametrize("sig,sig_next", [(1.0, 0.9), (0.6, 0.45), (0.2, 0.0)])
def test_flow_grpo_step_hand(sig, sig_next):
    x, v, a, z = 0.3, -1.2, 0.7, 0.8
    out = flow_grpo_step(t1(x), t1(v), sig, sig_next, a, noise=t1(z))
    xn, lp, mu, std, s = flow_grpo_hand(x, v, sig, sig_next, a, z)
    assert close(out.x_next, xn) and close(out.mean, mu) and close(out.logprob, lp)
    assert close(out.std, std) and close(out.std_dev_t, s)
    assert out.logprob.shape == (1,) and out.std.shape == (1,) and out.std_dev_t.shape == (1,)


def test_flow_grpo_first_step_replaces_only_the_denominator():
    # σ = 1: s = a·√(1/(1 − σ̃)) with σ̃ the schedule's σ_1, given explicitly here (≠ σ')
    out = flow_grpo_step(t1(0.3), t1(-1.2), 1.0, 0.8, 0.7, sigma_max_sub=0.9, noise=t1(0.8))
    xn, lp, mu, std, s = flow_grpo_hand(0.3, -1.2, 1.0, 0.8, 0.7, 0.8, sub=0.9)
    assert close(out.std_dev_t, s) and close(out.std, 0.7 * math.sqrt(10) * math.sqrt(0.2))
    assert close(out.mean, mu) and close(out.logprob, lp)


def test_flow_grpo_per_row_sigma_equals_separate_calls():
    g = torch.Generator().manual_seed(0)
    x, v, z = torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4,
                                                                                                    generator=g)
    sig, sig_next = torch.tensor([1.0, 0.7, 0.3]), torch.tensor([0.9, 0.5, 0.0])
    out = flow_grpo_step(x, v, sig, sig_next, 0.7, noise=z)
    for r in range(3):
        one = flow_grpo_step(x[r:r + 1], v[r:r + 1], float(sig[r]), float(sig_next[r]), 0.7, noise=z[r:r + 1])
        torch.testing.assert_close(out.x_next[r:r + 1], one.x_next)
        torch.testing.assert_close(out.logprob[r:r + 1], one.logprob)
        torch.testing.assert_close(out.std[r:r + 1], one.std)


@pytest.mark.parametrize("step", [flow_grpo_step, dance_step, cps_step])
def test_noise_level_zero_is_the_euler_step(step):
    g = torch.Generator().manual_seed(1)
    x, v = torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    for sig, sig_next in ((1.0, 0.875), (0.5, 0.25), (0.125, 0.0)):
        out = step(x, v, sig, sig_next, 0.0, noise=torch.randn(2, 3, 4, 4, generator=g))
        euler = x + (sig_next - sig) * v
        torch.testing.assert_close(out.mean, euler, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(out.x_next, euler, rtol=1e-6, atol=1e-6)
        assert (out.std == 0).all() and (out.logprob == 0).all()


@pytest.mark.parametrize("step,expected_std", [
    (flow_grpo_step, lambda s, s2, a: a * math.sqrt(s / (1 - s)) * math.sqrt(s - s2)),
    (dance_step, lambda s, s2, a: a * math.sqrt(s - s2)),
    (cps_step, lambda s, s2, a: s2 * math.sin(a * math.pi / 2)),
])
def test_empirical_std_of_x_next(step, expected_std):
    sig, sig_next, a, n = 0.6, 0.45, 0.7, 10_000
    x, v = torch.full((n, 1), 0.3), torch.full((n, 1), -1.2)
    out = step(x, v, sig, sig_next, a, generator=torch.Generator().manual_seed(2))
    std = expected_std(sig, sig_next, a)
    assert close(out.std[0], std, 1e-6)
    emp = (out.x_next - out.mean).std().item()
    assert abs(emp - std) < 3 * std / math.sqrt(2 * n)  # the sd of a sample std is ≈ std/√(2n)
    assert abs((out.x_next - out.mean).mean().item()) < 3 * std / math.sqrt(n)


def _ddim_args():
    import numpy as np
    betas = np.linspace(1e-4, 0.02, 1000)
    return torch.tensor(np.cumprod(1 - betas), dtype=torch.float32)


@pytest.mark.parametrize("name", ["flow_grpo", "dance", "dance_legacy", "cps", "ddim"])
def test_recompute_with_x_next_gives_the_sampling_logprob(name):
    g = torch.Generator().manual_seed(3)
    x, v = torch.randn(4, 2, 3, 3, generator=g), torch.randn(4, 2, 3, 3, generator=g)
    acp = _ddim_args()
    call = {"flow_grpo": lambda **kw: flow_grpo_step(x, v, 0.8, 0.6, 0.7, **kw),
            "dance": lambda **kw: dance_step(x, v, 0.8, 0.6, 0.7, **kw),
            "dance_legacy": lambda **kw: dance_step(x, v, 0.8, 0.6, 0.7, legacy_logprob=True, **kw),
            "cps": lambda **kw: cps_step(x, v, 0.8, 0.6, 0.7, **kw),
            "ddim": lambda **kw: ddim_step(x, v, 500, 400, acp, 1.0, **kw)}[name]
    sampled = call(generator=torch.Generator().manual_seed(4))
    again = call(x_next=sampled.x_next)
    assert torch.equal(again.x_next, sampled.x_next)
    torch.testing.assert_close(again.logprob, sampled.logprob, rtol=0, atol=0)
    with pytest.raises(ValueError):
        call(x_next=sampled.x_next, noise=torch.zeros_like(x))


def test_generator_reproduces_and_noise_is_used():
    x, v = torch.zeros(2, 4), torch.ones(2, 4)
    a = flow_grpo_step(x, v, 0.5, 0.25, 0.7, generator=torch.Generator().manual_seed(5))
    b = flow_grpo_step(x, v, 0.5, 0.25, 0.7, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.x_next, b.x_next)
    z = torch.randn(2, 4, generator=torch.Generator().manual_seed(5))
    c = flow_grpo_step(x, v, 0.5, 0.25, 0.7, noise=z)
    torch.testing.assert_close(c.x_next, c.mean + c.std.view(-1, 1) * z)


def test_merged_step_is_flow_grpo_from_k_to_k_plus_m():
    sigmas = flow_sigmas(8, 3.0)
    x, v, z = t1(0.3), t1(-1.2), t1(0.8)
    out = merged_flow_step(x, v, sigmas, 2, 3, 0.7, noise=z)
    ref = flow_grpo_step(x, v, sigmas[2], sigmas[5], 0.7, noise=z)
    assert torch.equal(out.x_next, ref.x_next) and torch.equal(out.logprob, ref.logprob)
    # from σ_0 = 1 the denominator uses the schedule's σ_1, not σ_m
    out = merged_flow_step(x, v, sigmas, 0, 2, 0.7, noise=z)
    xn, lp, mu, std, s = flow_grpo_hand(0.3, -1.2, 1.0, float(sigmas[2]), 0.7, 0.8, sub=float(sigmas[1]))
    assert close(out.std_dev_t, s, 1e-6) and close(out.logprob, lp, 1e-6) and close(out.mean, mu, 1e-6)


# ------------------------------------------------------------------------------------------------ DanceGRPO, CPS


def test_dance_step_hand_and_legacy_quirk():
    x, v, sig, sig_next, eta, z = 0.3, -1.2, 0.6, 0.45, 0.7, 0.8
    dt = sig_next - sig
    x0 = x - sig * v
    score = -(x - (1 - sig) * x0) / sig ** 2
    mu = x + dt * v - 0.5 * eta ** 2 * score * dt
    std = eta * math.sqrt(sig - sig_next)
    xn = mu + std * z
    quad = -(xn - mu) ** 2 / (2 * std ** 2)
    out = dance_step(t1(x), t1(v), sig, sig_next, eta, noise=t1(z))
    assert close(out.mean, mu) and close(out.x_next, xn) and close(out.std, std) and close(out.std_dev_t, std)
    assert close(out.logprob, quad - math.log(std) - HALF_LOG_2PI)  # the code since DanceGRPO 9ac72b4
    legacy = dance_step(t1(x), t1(v), sig, sig_next, eta, noise=t1(z), legacy_logprob=True)
    assert close(legacy.logprob, quad)  # before 9ac72b4: no −log std − ½log2π
    assert close(out.logprob - legacy.logprob, -math.log(std) - HALF_LOG_2PI)


def test_dance_mean_equals_flow_grpo_mean_at_equal_noise_scale():
    # μ_dance(η) = μ_flow_grpo(s = η) and η√(σ−σ') = s√(−Δ): only the σ-dependence of the noise scale differs
    g = torch.Generator().manual_seed(6)
    x, v = torch.randn(2, 8, generator=g, dtype=torch.float64), torch.randn(2, 8, generator=g, dtype=torch.float64)
    sig, sig_next, a = 0.6, 0.45, 0.7
    flow = flow_grpo_step(x, v, sig, sig_next, a, noise=torch.zeros_like(x))
    dance = dance_step(x, v, sig, sig_next, float(flow.std_dev_t[0]), noise=torch.zeros_like(x))
    torch.testing.assert_close(dance.mean, flow.mean)
    torch.testing.assert_close(dance.std, flow.std)


@pytest.mark.parametrize("sig,sig_next", [(0.6, 0.45), (0.25, 0.0)])
def test_cps_step_hand(sig, sig_next):
    x, v, a, z = 0.3, -1.2, 0.8, 0.8
    std = sig_next * math.sin(a * math.pi / 2)
    x0, x1 = x - sig * v, x + (1 - sig) * v
    mu = (1 - sig_next) * x0 + math.sqrt(sig_next ** 2 - std ** 2) * x1
    xn = mu + std * z
    out = cps_step(t1(x), t1(v), sig, sig_next, a, noise=t1(z))
    assert close(out.mean, mu) and close(out.x_next, xn) and close(out.std, std)
    assert close(out.logprob, -(xn - mu) ** 2)  # constants and the variance dropped, as the code


# ------------------------------------------------------------------------------------------------ DDIM (DDPO)


def test_ddim_step_hand_eta_one():
    acp = _ddim_args().double()
    x, e, z, t, tp = 0.3, -1.2, 0.8, 500, 400
    at, ap = float(acp[t]), float(acp[tp])
    x0 = (x - math.sqrt(1 - at) * e) / math.sqrt(at)
    var = (1 - ap) / (1 - at) * (1 - at / ap)
    std = math.sqrt(var)
    mu = math.sqrt(ap) * x0 + math.sqrt(1 - ap - std ** 2) * e
    xn = mu + std * z
    lp = -(xn - mu) ** 2 / (2 * std ** 2) - math.log(std) - HALF_LOG_2PI
    out = ddim_step(t1(x), t1(e), t, tp, acp, 1.0, noise=t1(z))
    assert close(out.mean, mu) and close(out.x_next, xn) and close(out.std, std) and close(out.logprob, lp)


@pytest.mark.parametrize("prediction_type,clip", [("epsilon", True), ("epsilon", False), ("sample", False),
                                                  ("v_prediction", True)])
@pytest.mark.parametrize("t", [900, 500])
def test_ddim_eta_zero_mean_equals_diffusers(prediction_type, clip, t):
    diffusers = pytest.importorskip("diffusers")
    sch = diffusers.DDIMScheduler(num_train_timesteps=1000, prediction_type=prediction_type, clip_sample=clip)
    sch.set_timesteps(10)
    assert t in sch.timesteps.tolist()
    g = torch.Generator().manual_seed(7)
    x, out = torch.randn(2, 3, 4, 4, generator=g) * 1.5, torch.randn(2, 3, 4, 4, generator=g)
    expected = sch.step(out, t, x, eta=0.0).prev_sample
    got = ddim_step(x, out, t, t - 100, sch.alphas_cumprod, 0.0, clip_sample=clip,
                    clip_range=sch.config.clip_sample_range, prediction_type=prediction_type)
    torch.testing.assert_close(got.mean, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.x_next, expected, rtol=1e-5, atol=1e-5)
    assert (got.std == 0).all() and (got.logprob == 0).all()


def test_ddim_last_step_clamp_quirk():
    diffusers = pytest.importorskip("diffusers")
    acp = _ddim_args().double()
    # t' = t − 100 < 0 is clamped to 0 before the `t' >= 0 ? ᾱ[t'] : final_alpha_cumprod` test: ᾱ[0] is used
    x, e, z, t = 0.3, -1.2, 0.8, 20
    at, ap = float(acp[t]), float(acp[0])
    x0 = (x - math.sqrt(1 - at) * e) / math.sqrt(at)
    std = math.sqrt((1 - ap) / (1 - at) * (1 - at / ap))
    mu = math.sqrt(ap) * x0 + math.sqrt(1 - ap - std ** 2) * e
    out = ddim_step(t1(x), t1(e), t, t - 100, acp, 1.0, noise=t1(z))
    assert close(out.mean, mu) and close(out.std, std)
    # diffusers (set_alpha_to_one=True, the default) uses final_alpha_cumprod = 1 there: a different mean
    sch = diffusers.DDIMScheduler(num_train_timesteps=1000, clip_sample=False)
    sch.set_timesteps(10)
    xs, es = torch.randn(1, 4), torch.randn(1, 4)
    ours = ddim_step(xs, es, 0, -100, sch.alphas_cumprod, 0.0).mean
    theirs = sch.step(es, 0, xs, eta=0.0).prev_sample
    assert not torch.allclose(ours, theirs)
    # at t = 0 the clamp gives ᾱ_{t'} = ᾱ_t: σ_t = 0, the step is the identity (unclipped) with log-prob 0
    last = ddim_step(xs, es, 0, -100, sch.alphas_cumprod, 1.0, noise=torch.randn(1, 4))
    torch.testing.assert_close(last.x_next, xs, rtol=1e-5, atol=1e-5)
    assert last.std[0] == 0 and last.logprob[0] == 0
    # per-row timesteps
    rows = ddim_step(xs.expand(2, 4), es.expand(2, 4), torch.tensor([500, 20]), torch.tensor([400, -80]),
                     sch.alphas_cumprod, 1.0, noise=torch.zeros(2, 4))
    for r, (tt, tp) in enumerate(((500, 400), (20, -80))):
        one = ddim_step(xs, es, tt, tp, sch.alphas_cumprod, 1.0, noise=torch.zeros(1, 4))
        torch.testing.assert_close(rows.mean[r:r + 1], one.mean)
        torch.testing.assert_close(rows.logprob[r:r + 1], one.logprob)


# ------------------------------------------------------------------------------------------------ dtypes


def test_bf16_inputs_give_finite_float32_logprobs():
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(2, 4, 8, 8, generator=g) * 3).bfloat16()
    v = (torch.randn(2, 4, 8, 8, generator=g) * 3).bfloat16()
    acp = _ddim_args()
    outs = [flow_grpo_step(x, v, 1.0, 0.97, 0.7, generator=g), flow_grpo_step(x, v, 0.02, 0.0, 0.7, generator=g),
            dance_step(x, v, 0.3, 0.2, 0.7, generator=g), cps_step(x, v, 0.3, 0.2, 0.7, generator=g),
            ddim_step(x, v, 900, 800, acp, 1.0, generator=g)]
    for out in outs:
        assert out.logprob.dtype == torch.float32 and out.mean.dtype == torch.float32
        assert torch.isfinite(out.logprob).all() and torch.isfinite(out.x_next).all()
    # a bf16 x_next stored and recomputed: still float32 and finite
    again = flow_grpo_step(x, v, 1.0, 0.97, 0.7, x_next=outs[0].x_next.bfloat16())
    assert again.logprob.dtype == torch.float32 and torch.isfinite(again.logprob).all()
    assert gaussian_mean_kl(outs[0].mean.bfloat16(), outs[0].mean, outs[0].std_dev_t).dtype == torch.float32
