"""The DDPM image policy (grpolab/policies/ddpm/policy.py, DDPO's DDIM sampler with log-probs): sampling, exact
recomputation of the behaviour log-probs, the step against DDPO's formula computed by hand (here, not with
policies/_image/sde.py), the last step's clamp quirk, evaluation with fixed noises, the KL's std, the config rules, saving,
and a short run through the trainer."""
import functools
import json
import math

import pytest
import torch

from grpolab.config import Config, ConfigError
from grpolab.policies import POLICIES
from grpolab.registry import declared_params

from _helpers import (LEARNING_SEEDS, assert_bad_rows_and_models_are_named,  # noqa: E402
                      assert_saved_model_loads_the_same, assert_token_kl_and_text_engines_are_refused, image_policy,
                      loaded_image_policy, recipe_before_after, sample_packed_steps)

pytest.importorskip("diffusers")

#: the digits DDPM's timesteps for T = 10 (DDIMScheduler, "leading" spacing, steps_offset raised to 1)
TIMESTEPS = [901, 801, 701, 601, 501, 401, 301, 201, 101, 1]


_policy = functools.partial(image_policy, "ddpm")  # (config, policy) with the given settings


@pytest.fixture(scope="module")
def ddpm():
    return loaded_image_policy("ddpm")


def _alphas_cumprod():
    """ᾱ of the digits DDPM from its scheduler (DDPMScheduler, linear betas 1e-4..0.02, 1000 steps), float64."""
    from diffusers import DDPMScheduler

    from grpolab.policies._image.digits import scheduler_config
    return DDPMScheduler.from_config(scheduler_config("ddpm")).alphas_cumprod.double()


def _hand_step(module, x, xn, label, t, t_prev, eta, w=1.0):
    """DDPO's ddim_step_with_logprob written out: (log-prob, mean, std) of x -> xn, in float64."""
    acp = _alphas_cumprod()
    a_t, a_p = float(acp[t]), float(acp[max(t_prev, 0)])  # the code clamps t' before its final_alpha test
    with torch.no_grad():
        def eps_of(c):
            return module(x[None].float(), torch.tensor([t]), class_labels=torch.tensor([c])).sample[0].double()
        eps = eps_of(label) if w == 1.0 else eps_of(10) + w * (eps_of(label) - eps_of(10))
    x0 = ((x - math.sqrt(1 - a_t) * eps) / math.sqrt(a_t)).clamp(-1, 1)  # clip_sample: true
    var = (1 - a_p) / (1 - a_t) * (1 - a_t / a_p)
    std = eta * math.sqrt(var)
    mu = math.sqrt(a_p) * x0 + math.sqrt(1 - a_p - std * std) * eps
    lp = (-(xn - mu) ** 2 / (2 * std * std) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean()
    return float(lp), mu, std


def test_the_policy_names_its_model_shares_guidance_scale_and_refuses_eta_0():
    cfg, pol = _policy()
    assert cfg.model == "digits" and POLICIES.get("ddpm").step == "denoising step"
    assert POLICIES.get("ddpm").capabilities == {"gaussian_steps", "images"} and POLICIES.get("ddpm").float32_only
    assert set(cfg.params) >= {"ddpm_steps", "ddpm_eta", "ddpm_eval_steps", "guidance_scale"}
    assert not any(k.startswith("flow_") for k in cfg.params)  # keys only when selected
    shared = declared_params(POLICIES.get("ddpm"))["guidance_scale"]
    assert shared is declared_params(POLICIES.get("flow_matching"))["guidance_scale"]  # one declaration
    assert Config.build({"policy": "ddpm"}).task == "digits"  # the policy's default_task
    with pytest.raises(ConfigError, match="task 'arithmetic' needs a policy with text.*ddpm"):
        Config.build({"policy": "ddpm", "task": "arithmetic"})
    with pytest.raises(ConfigError, match=r"ddpm_eta: the training sampler needs eta above 0 \(eta = 0 is "
                                          r"deterministic DDIM, whose steps have no log-prob"):
        _policy(ddpm_eta=0.0)
    with pytest.raises(ConfigError, match="ddpm_steps / ddpm_eval_steps: at least 1"):
        _policy(ddpm_steps=0)


def test_sampling_packs_steps_and_recomputes_the_same_logprobs(ddpm):
    pol, module, rows = ddpm
    b = sample_packed_steps(pol, module, rows)
    T = pol.T
    assert T == 10
    # t' = t - N/T; every step has noise (t > 0), the last one ends below 0 (the clamp quirk, next tests)
    assert b.step_data["t"][0].tolist() == TIMESTEPS
    assert b.step_data["t_prev"][3].tolist() == [t - 100 for t in TIMESTEPS]
    assert torch.equal(b.step_data["x"][:, 1:], b.step_data["x_next"][:, :-1])
    # the first recomputation under the same weights is the behaviour log-prob (ratio 1), to float32 rounding
    out = pol.forward(module, b, want=frozenset({"step_mean", "step_std_dev"}), grad=False)
    assert (out["logprobs"] - b.behavior_logprobs).abs().max() < 1e-5
    assert out["step_mean"].shape == (6, T, 1, 8, 8) and (out["step_std_dev"] > 0).all()
    # only the steps on the mask run; the others are 0
    b.completion_mask[:, ::2] = 0
    out = pol.forward(module, b, want=frozenset({"step_mean", "step_std_dev"}), grad=False)
    lp = out["logprobs"]
    assert (lp[:, ::2] == 0).all() and (lp[:, 1::2] - b.behavior_logprobs[:, 1::2]).abs().max() < 1e-5
    assert (out["step_std_dev"][:, ::2] == 0).all() and (out["step_mean"][:, ::2] == 0).all()


@pytest.mark.parametrize("w", [1.0, 2.0])
def test_a_step_logprob_is_the_hand_gaussian(ddpm, w):
    """log p of step j = mean over the 64 pixels of log N(x'; mu, std^2) with DDPO's DDIM mean and std
    (ddim_with_logprob.py), from the scheduler's alphas_cumprod, the clipped x0 and CFG on epsilon."""
    _, module, rows = ddpm
    cfg, pol = _policy(guidance_scale=w)
    pol.load(cfg, rows, [], log=lambda *a: None)
    b = pol.sample(module, rows[1:2], [0], num_generations=1, temperature=1.0,
                   generator=torch.Generator().manual_seed(3))
    out = pol.forward(module, b, want=frozenset({"step_mean", "step_std_dev"}), grad=False)
    for j in (0, 2, 7):
        x, xn = b.step_data["x"][0, j].double(), b.step_data["x_next"][0, j].double()
        t = TIMESTEPS[j]
        lp, mu, std = _hand_step(module, x, xn, 1, t, t - 100, 1.0, w)
        assert abs(float(b.behavior_logprobs[0, j]) - lp) < 1e-4, j
        assert abs(float(out["step_std_dev"][0, j]) - std) < 1e-6 and (out["step_mean"][0, j] - mu).abs().max() < 1e-4


def test_the_last_step_uses_alphas_cumprod_0(ddpm):
    """The last step t = 1 -> t' = -99: DDPO's code clamps t' to 0 before testing t' >= 0, so it uses ᾱ[0], not
    final_alpha_cumprod (1 with diffusers' default set_alpha_to_one, which would make the step noiseless)."""
    pol, module, rows = ddpm
    b = pol.sample(module, rows[2:], [0], num_generations=2, temperature=1.0,
                   generator=torch.Generator().manual_seed(4))
    acp = _alphas_cumprod()
    want_std = math.sqrt((1 - acp[0]) / (1 - acp[1]) * (1 - acp[1] / acp[0]))  # η = 1
    out = pol.forward(module, b, want=frozenset({"step_std_dev"}), grad=False)
    # float32's 1 - ā1/ā0 (ā ≈ 0.9999) keeps ~4 digits: relative 1e-4
    assert abs(float(out["step_std_dev"][0, -1]) / want_std - 1) < 1e-4 and want_std > 0.007
    for i in range(2):
        x, xn = b.step_data["x"][i, -1].double(), b.step_data["x_next"][i, -1].double()
        lp, _, _ = _hand_step(module, x, xn, 2, 1, -99, 1.0)
        # std ≈ 0.0074: a float32 mean off by 1e-7 moves the log-prob by ~1e-5
        assert abs(float(b.behavior_logprobs[i, -1]) - lp) < 1e-3


def test_the_kl_regularizer_gets_the_step_std_so_it_is_the_exact_gaussian_kl(ddpm):
    """step_std_dev = eta * sigma_t, the std of both step Gaussians: gaussian_mean_kl is then the mean over
    elements of KL(N(mu_theta, std^2) || N(mu_ref, std^2)) (DDPO has no KL; no sqrt(-dsigma) factor as Flow-GRPO's)."""
    from grpolab.algorithms.regularizers import gaussian_mean_kl
    pol, module, rows = ddpm
    ref = type(module).from_config(module.config)
    ref.load_state_dict({k: v + 0.01 * torch.randn_like(v) for k, v in module.state_dict().items()})
    cfg2, pol2 = _policy(ddpm_eta=0.5)
    pol2.load(cfg2, rows, [], log=lambda *a: None)
    b = pol2.sample(module, rows, [0, 1, 2], num_generations=1, temperature=1.0,
                    generator=torch.Generator().manual_seed(5))
    want = frozenset({"step_mean", "step_std_dev"})
    out, ref_out = pol2.forward(module, b, want=want, grad=False), pol2.forward(ref, b, want=want, grad=False)
    term, logged = gaussian_mean_kl(out["step_mean"], ref_out["step_mean"], out["step_std_dev"], b.completion_mask,
                               gaussian_kl_beta=1.0)
    s = out["step_std_dev"][..., None, None, None].expand_as(out["step_mean"]).double()
    exact = torch.distributions.kl_divergence(torch.distributions.Normal(out["step_mean"].double(), s),
                                              torch.distributions.Normal(ref_out["step_mean"].double(), s))
    assert torch.allclose(term.double(), exact.mean(dim=(2, 3, 4)), rtol=1e-4, atol=1e-7)
    assert (term > 0).all() and torch.equal(logged["gaussian_kl"], term)
    # and the std is the one the step's log-prob uses: eta * sigma_t
    acp = _alphas_cumprod()
    t = torch.tensor(TIMESTEPS)
    sigma = ((1 - acp[(t - 100).clamp(min=0)]) / (1 - acp[t]) * (1 - acp[t] / acp[(t - 100).clamp(min=0)])).sqrt()
    assert torch.allclose(out["step_std_dev"][0].double(), 0.5 * sigma, rtol=1e-4)  # float32: see the last step


def test_evaluation_is_ddim_eta_0_from_each_rows_fixed_noise(ddpm):
    _, module, _ = ddpm
    cfg, pol = _policy(ddpm_eval_eta=0.0)
    pol.load(cfg, [], [], log=lambda *a: None)
    rows = [{"prompt": "4", "noise_seed": 11}, {"prompt": "4", "noise_seed": 12}]
    e1 = pol.sample(module, rows, [0, 1], num_generations=1, temperature=0.0, evaluation=True)
    e2 = pol.sample(module, rows[::-1], [0, 1], num_generations=1, temperature=0.0, evaluation=True,
                    generator=torch.Generator().manual_seed(99))
    assert torch.equal(e1.row_data["images"][0], e2.row_data["images"][1])  # the noise follows the row
    assert not torch.equal(e1.row_data["images"][0], e1.row_data["images"][1])
    assert e1.behavior_logprobs.shape == (2, 1) and (e1.behavior_logprobs == 0).all()
    # η = 0: every step is the DDIM mean x' = sqrt(ā_t') x̂0 + sqrt(1 - ā_t') eps (ā_t' = ā[max(t', 0)]), by hand
    acp = _alphas_cumprod()
    x = torch.randn((1, 1, 8, 8), generator=torch.Generator().manual_seed(11)).double()
    for t in TIMESTEPS:  # ddpm_eval_steps = 10: the same timesteps
        with torch.no_grad():
            eps = module(x.float(), torch.tensor([t]), class_labels=torch.tensor([4])).sample.double()
        x0 = ((x - (1 - acp[t]).sqrt() * eps) / acp[t].sqrt()).clamp(-1, 1)
        a_p = acp[max(t - 100, 0)]
        x = a_p.sqrt() * x0 + (1 - a_p).sqrt() * eps
    assert (e1.row_data["images"][0] - (x[0].clamp(-1, 1) + 1) / 2).abs().max() < 1e-4


def test_evaluation_by_default_is_the_training_sampler_with_each_rows_fixed_draws(ddpm):
    """ddpm_eval_eta null (the default) = ddpm_eta: a held-out row is sampled by the sampler RL trains, its initial
    noise from its noise_seed and its step noises from noise_seed + STEP_NOISE_OFFSET, whatever the generator and
    the row's place; by hand: the DDIM step with std eta * sigma_t and those noises."""
    from grpolab.policies.ddpm.policy import STEP_NOISE_OFFSET
    pol, module, _ = ddpm
    assert pol.eval_eta == pol.eta == 1.0
    rows = [{"prompt": "4", "noise_seed": 11}, {"prompt": "4", "noise_seed": 12}]
    e1 = pol.sample(module, rows, [0, 1], num_generations=1, evaluation=True)
    e2 = pol.sample(module, rows[::-1], [0, 1], num_generations=1, evaluation=True,
                    generator=torch.Generator().manual_seed(99))
    assert torch.equal(e1.row_data["images"][0], e2.row_data["images"][1])
    acp = _alphas_cumprod()
    x = torch.randn((1, 1, 8, 8), generator=torch.Generator().manual_seed(11)).double()
    z = torch.randn((1, 10, 1, 8, 8), generator=torch.Generator().manual_seed(11 + STEP_NOISE_OFFSET)).double()
    for j, t in enumerate(TIMESTEPS):
        with torch.no_grad():
            eps = module(x.float(), torch.tensor([t]), class_labels=torch.tensor([4])).sample.double()
        x0 = ((x - (1 - acp[t]).sqrt() * eps) / acp[t].sqrt()).clamp(-1, 1)
        a_t, a_p = acp[t], acp[max(t - 100, 0)]
        std = ((1 - a_p) / (1 - a_t) * (1 - a_t / a_p)).sqrt()
        x = a_p.sqrt() * x0 + (1 - a_p - std ** 2).sqrt() * eps + std * z[:, j]
    assert (e1.row_data["images"][0] - (x[0].clamp(-1, 1) + 1) / 2).abs().max() < 1e-4
    with pytest.raises(ConfigError, match="ddpm_eval_eta"):
        _policy(ddpm_eval_eta=-1.0)


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
def test_ddpo_raises_jpeg_compressibility_on_every_seed(tmp_path, seed):
    """The ddpo recipe on DDPO's JPEG-compressibility task (digits_compress), 12 steps: the held-out reward
    (-kB of each image's JPEG; the training sampler, eta 1, from each row's fixed draws) rises. Measured (this
    machine, avx512_bf16): -0.810 -> -0.752 / -0.754 / -0.787 (seeds 0, 1, 2; seed 3: -0.771); asserted: a rise
    of 0.01 kB. On the digits task the classifier's confidence does not rise in 12-40 steps (docs/images.md)."""
    _, before, after = recipe_before_after("ddpo", "jpeg_compressibility", tmp_path, seed, task="digits_compress")
    assert after > before + 0.01, (before, after)


def test_bad_rows_and_models_are_named(ddpm, tmp_path):
    cfg2, pol2 = assert_bad_rows_and_models_are_named(_policy, tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="has no scheduler_config.json"):
        pol2.load(cfg2, [{"prompt": "1"}], [], log=lambda *a: None)
    cfg3, pol3 = _policy(ddpm_steps=2000)
    with pytest.raises(ConfigError, match="at most the model's 1000 training timesteps"):
        pol3.load(cfg3, [{"prompt": "1"}], [], log=lambda *a: None)


def test_save_then_load_gives_the_same_model_and_schedule(ddpm, tmp_path):
    pol, module, rows = ddpm
    pol2, again = assert_saved_model_loads_the_same(_policy, pol, module, rows, tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "scheduler_config.json").read_text())
    assert saved["_class_name"] == "DDPMScheduler" and saved["steps_offset"] == 0  # as loaded, not the DDIM one
    assert pol2.timesteps == pol.timesteps and torch.equal(pol2.alphas_cumprod, pol.alphas_cumprod)
    e1 = pol.sample(module, [{"prompt": "7", "noise_seed": 3}], [0], num_generations=1, evaluation=True)
    e2 = pol2.sample(again, [{"prompt": "7", "noise_seed": 3}], [0], num_generations=1, evaluation=True)
    assert torch.equal(e1.row_data["images"], e2.row_data["images"])


def test_token_kl_and_text_engines_are_refused_with_the_fix():
    assert_token_kl_and_text_engines_are_refused(_policy)


def test_three_trainer_steps_on_the_digits_task(tmp_path):
    """policy ddpm through the unchanged trainer: 3 steps on the digits task with the KL to the reference and a
    random half of the steps (DDPO's timestep_fraction), a finite loss, and final/ loadable by --model."""
    from grpolab.train.trainer import Trainer
    out = tmp_path / "run"
    cfg = Config.build({"policy": "ddpm", "task": "digits", "steps": 3, "prompts_per_step": 2, "num_generations": 4,
                        "ddpm_steps": 4, "ddpm_eval_steps": 4, "learning_rate": 1e-4, "seed": 0, "out": str(out),
                        "regularizers": ["gaussian_mean_kl"], "gaussian_kl_beta": 0.01,
                        "batch_stages": ["denoising_steps"], "steps_fraction": 0.5, "steps_order": "random",
                        "eval_problems": 4, "eval_before": False, "eval_after": True, "stall_steps": 0,
                        "dtype": "float32"})
    summary = Trainer(cfg, log=lambda *a: None).train(progress=False)
    assert summary["after"] is not None and math.isfinite(summary["after"]["reward_mean"])
    metrics = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3] and all(math.isfinite(m["loss"]) for m in metrics)
    assert all(0 < m["grad_norm"] < float("inf") for m in metrics) and metrics[0]["completion_len_mean"] == 4
    # step 1 starts at the reference (KL 0); after an update the policy's step means have moved away from it
    assert metrics[0]["gaussian_kl"] == 0 and all(m["gaussian_kl"] > 0 for m in metrics[1:])
    assert (out / "final" / "diffusion_pytorch_model.safetensors").exists()
    assert (out / "final" / "scheduler_config.json").exists()
    cfg2, pol2 = _policy(model=str(out / "final"))
    trained = pol2.load(cfg2, [{"prompt": "3"}], [], log=lambda *a: None)
    _, pol3 = _policy()
    base = pol3.load(cfg2, [{"prompt": "3"}], [], log=lambda *a: None)
    assert any(not torch.equal(p, q) for p, q in zip(trained.parameters(), base.parameters()))
