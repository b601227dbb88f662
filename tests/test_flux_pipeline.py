"""Policy flow_matching on a diffusers FLUX.1 pipeline folder (``--model PATH`` with model_index.json naming
FluxPipeline): a tiny FluxPipeline built from configs (random weights, a character-level CLIP tokenizer written to
local files for both text encoders: nothing is downloaded), once with the guidance embedding (FLUX.1 [dev]) and a
dynamically shifted scheduler, once without (FLUX.1 [schnell]-like) and a fixed shift. The FluxTransformer2DModel
is the trained module on packed latents; the policy's transformer call, schedule, ODE and decoding are checked
against the FluxPipeline's own, its per-step log-probs against Gaussians written out here, and a trained run's
final folder (and LoRA file) against FluxPipeline.from_pretrained / load_lora_weights."""
import json
import math

import pytest
import torch

from grpolab.components import Component
from grpolab.config import Config, ConfigError
from grpolab.policies import POLICIES

pytest.importorskip("diffusers")
pytest.importorskip("peft")

WORDS = ["a", "red", "blue", "cat", "dog", "bright", "dark"]
ROWS = [{"prompt": "a red cat"}, {"prompt": "a blue dog"}, {"prompt": "a dark cat"}]
PX = 16  # image size: a 2-level VAE (scale 2) makes 8x8 latents, packed into 4x4 = 16 tokens of 4*4 channels


def _tokenizer(folder):
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, **{w + "</w>": i + 2 for i, w in enumerate(WORDS)}}
    for ch in "abcdefghijklmnopqrstuvwxyz":
        for piece in (ch, ch + "</w>"):
            vocab.setdefault(piece, len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=16,
                         pad_token="<|endoftext|>"), len(vocab)


def build_tiny_flux(path, guidance_embeds: bool):
    """A FluxPipeline of tiny random parts saved to ``path``: a FluxTransformer2DModel (1 double + 1 single block,
    2 heads of 8, rope axes 2+2+4, in_channels 16 = 4 latent channels packed 2x2), a CLIPTextModel (pooled, 16)
    and a T5 encoder (sequence, 32), a 2-level AutoencoderKL with 4 latent channels and 16 px images; the
    scheduler shifts dynamically (FLUX.1 [dev]'s config) when ``guidance_embeds``, else by a fixed shift 2."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    tok, n = _tokenizer(path.parent / "tok")
    torch.manual_seed(0)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=n, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, max_position_embeddings=16, bos_token_id=0,
                                        eos_token_id=1, pad_token_id=1, hidden_act="gelu"))
    t5 = T5EncoderModel(T5Config(vocab_size=n, d_model=32, d_ff=32, d_kv=8, num_layers=1, num_heads=2,
                                 relative_attention_num_buckets=8))
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                         attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                         pooled_projection_dim=16, guidance_embeds=guidance_embeds,
                                         axes_dims_rope=(2, 2, 4))
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
                        up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[8, 16], layers_per_block=1,
                        latent_channels=4, norm_num_groups=4, sample_size=PX, shift_factor=0.1159,
                        scaling_factor=0.3611, use_quant_conv=False, use_post_quant_conv=False)
    if guidance_embeds:  # FLUX.1 [dev]'s scheduler/scheduler_config.json
        sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    else:
        sched = FlowMatchEulerDiscreteScheduler(shift=2.0)
    FluxPipeline(scheduler=sched, vae=vae, text_encoder=clip, tokenizer=tok, text_encoder_2=t5, tokenizer_2=tok,
                 transformer=transformer).save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=[True, False], ids=["dev", "schnell"])
def flux_dir(request, tmp_path_factory):
    return build_tiny_flux(tmp_path_factory.mktemp("flux") / "pipe", request.param), request.param


def _policy(path, **over):
    cfg = Config.build({"policy": "flow_matching", "model": str(path), "data": "rows.jsonl", "reward": ["m:f"],
                        "flow_steps": 3, "flow_eval_steps": 3, **over})
    pol = Component(POLICIES.get("flow_matching"), cfg, "flow_matching").fn
    return pol, pol.load(cfg, ROWS, [], log=lambda *a: None)


def _pipeline_call(pol, prompt, latents, w, steps):
    """The policy's own FluxPipeline (its transformer is the policy's module) from ``latents`` (packed): the
    images ``[1, 3, 16, 16]`` in [0, 1], the final latents, and each transformer call's (inputs, output)."""
    calls, final = [], {}
    hook = pol.pipe.transformer.register_forward_hook(
        lambda m, args, kwargs, out: calls.append((kwargs, out[0].detach().clone())), with_kwargs=True)
    guided = pol.adapter.embeds_guidance
    extra = {"guidance_scale": w} if guided else {"true_cfg_scale": w, "negative_prompt": "" if w != 1 else None}
    try:
        with torch.no_grad():
            images = pol.pipe(prompt=prompt, height=PX, width=PX, num_inference_steps=steps, latents=latents.clone(),
                              max_sequence_length=128, output_type="pt", **extra,
                              callback_on_step_end=lambda p, i, t, kw: final.update(kw) or {},
                              callback_on_step_end_tensor_inputs=["latents"]).images
    finally:
        hook.remove()
    return images, final["latents"], calls


@pytest.mark.parametrize("w", [1.0, 2.5])
def test_the_call_schedule_ode_and_decoding_are_the_pipelines(flux_dir, w):
    """From the same packed noise, the policy's evaluation ODE (flow_eval_steps Euler steps) gives the images
    FluxPipeline.__call__ gives: the same sigmas (scheduler.set_timesteps with the pipeline's mu, or its fixed
    shift), the same transformer inputs (packed latents, img_ids, txt_ids, timestep sigma, guidance), the same
    velocity (with true CFG for the transformer without a guidance embedding when w != 1) and the same decoding."""
    from diffusers import FluxTransformer2DModel

    from grpolab.policies.base import held_out_seed

    path, guided = flux_dir
    pol, module = _policy(path, guidance_scale=w)
    assert isinstance(module, FluxTransformer2DModel) and module is pol.pipe.transformer
    assert pol.shape == (16, 16) and pol.adapter.noise_shape == (4, 8, 8)
    assert not any(p.requires_grad for p in pol.pipe.text_encoder_2.parameters())
    row = {"prompt": "a red cat", "noise_seed": 11}
    noise = torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(held_out_seed(row, 0)))
    packed = pol.pipe._pack_latents(noise, 1, 4, 8, 8)
    images, last, calls = _pipeline_call(pol, row["prompt"], packed, w, steps=3)
    # the schedule: the pipeline's own scheduler sigmas (mu from 16 image tokens, or shift 2)
    assert torch.allclose(pol.pipe.scheduler.sigmas.float(), pol.sigmas, atol=1e-6)
    k = math.exp(0.5 + (16 - 256) * (1.15 - 0.5) / (4096 - 256)) if guided else 2.0
    assert pol.adapter.shift == pytest.approx(k, rel=1e-6)
    # every transformer call: our velocity from the same state at the same sigma
    cond = pol.encode([row["prompt"]], "cpu")
    per_step = 2 if (not guided and w != 1) else 1
    assert len(calls) == 3 * per_step
    for j in range(3):
        kw, out = calls[per_step * j]
        assert torch.allclose(kw["timestep"], pol.sigmas[j].expand(1), atol=1e-7)
        assert torch.equal(kw["img_ids"], pol.adapter.img_ids) and not kw["txt_ids"].any()
        assert (kw["guidance"] is not None) == guided and (not guided or float(kw["guidance"][0]) == w)
        if per_step == 2:  # FluxPipeline's true CFG: neg + w (pos - neg)
            out = calls[2 * j + 1][1] + w * (out - calls[2 * j + 1][1])
        with torch.no_grad():
            v = pol.velocity(module, kw["hidden_states"], pol.sigmas[j].expand(1), cond)
        assert torch.allclose(v, out, atol=1e-5), (j, (v - out).abs().max())
    # the decoding of the pipeline's own last latents, and the whole evaluation sample
    assert torch.allclose(pol.decode(last), images, atol=1e-5)
    ev = pol.sample(module, [row], [0], num_generations=1, temperature=1.0, evaluation=True)
    assert ev.row_data["images"].shape == (1, 3, PX, PX)
    assert torch.allclose(ev.row_data["images"], images, atol=1e-5)


def test_flow_shift_replaces_the_pipelines_shift(flux_dir):
    """flow_shift other than 1 is the time shift itself: flow_shift 3 is DanceGRPO's sd3_time_shift(3,
    linspace(1, 0, T+1)) whatever the scheduler says."""
    path, _ = flux_dir
    pol, _ = _policy(path, flow_shift=3.0, flow_steps=4)
    u = torch.linspace(1, 0, 5, dtype=torch.float64)
    assert torch.allclose(pol.sigmas.double(), 3 * u / (1 + 2 * u), atol=1e-7) and pol.adapter.shift == 3.0


def _hand_logprob(kind, a, x, v, x_next, sig, nxt, sig1):
    """Flow-GRPO's / DanceGRPO's step Gaussian written out (float64): per-row mean element log-density."""
    x, v, x_next, dt = x.double(), v.double(), x_next.double(), nxt - sig
    if kind == "flow_grpo":
        s = a * math.sqrt(sig / (1 - (sig1 if sig == 1 else sig)))
        mean = x * (1 + s ** 2 / (2 * sig) * dt) + v * (1 + s ** 2 * (1 - sig) / (2 * sig)) * dt
        std = s * math.sqrt(-dt)
    else:
        x0 = x - sig * v
        mean = x + dt * v - 0.5 * a ** 2 * (-(x - x0 * (1 - sig)) / sig ** 2) * dt
        std = a * math.sqrt(-dt)
    elem = -(x_next - mean) ** 2 / (2 * std ** 2) - math.log(std) - 0.5 * math.log(2 * math.pi)
    return elem.mean(dim=tuple(range(1, elem.ndim)))


@pytest.mark.parametrize("kind", ["flow_grpo", "dance"])
def test_sampled_logprobs_are_the_hand_gaussians_and_recompute(flux_dir, kind):
    path, guided = flux_dir
    pol, module = _policy(path, flow_sde=kind, guidance_scale=3.5 if guided else 1.0)
    b = pol.sample(module, ROWS, [5, 6, 7], num_generations=[2, 1, 2], temperature=1.0,
                   generator=torch.Generator().manual_seed(0))
    assert b.step_data["x"].shape == (5, 3, 16, 16) and b.prompt_uids.tolist() == [5, 5, 6, 7, 7]
    pe, pp = b.row_data["prompt_embeds"], b.row_data["pooled_prompt_embeds"]
    assert pe.shape == (5, 128, 32) and pp.shape == (5, 16)  # T5's sequence (128 tokens), CLIP's pooled output
    assert torch.equal(pe[0], pe[1]) and not torch.equal(pe[1], pe[2])  # one prompt, one embedding
    assert b.row_data["images"].shape == (5, 3, PX, PX) and b.columns["completion"][0].shape == (PX, PX, 3)
    lp = pol.forward(module, b, grad=False)["logprobs"]
    assert (lp - b.behavior_logprobs).abs().max() < 1e-4
    sig1 = float(pol.sigmas[1])
    for j in range(3):
        sig, nxt = float(b.step_data["sigma"][0, j]), float(b.step_data["sigma_next"][0, j])
        x = b.step_data["x"][:, j]
        with torch.no_grad():
            v = pol.velocity(module, x, torch.full((5,), sig), {k: b.row_data[k] for k in ("prompt_embeds",
                                                                                           "pooled_prompt_embeds")})
        hand = _hand_logprob(kind, pol.a, x, v, b.step_data["x_next"][:, j], sig, nxt, sig1)
        assert torch.allclose(hand.float(), b.behavior_logprobs[:, j], atol=1e-4), (j, hand, b.behavior_logprobs[:, j])


def _draw(pipe, guided):
    extra = {"guidance_scale": 3.5} if guided else {}
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(prompt="a red cat", height=PX, width=PX, num_inference_steps=2, max_sequence_length=128,
                    generator=torch.Generator().manual_seed(0), output_type="pt", **extra).images


@pytest.mark.parametrize("lora", [False, True])
def test_training_saves_a_flux_pipeline_that_diffusers_loads(flux_dir, tmp_path, monkeypatch, lora):
    """Two steps of the flow_grpo_images recipe with a brightness reward: OUT/final is the FLUX folder with the
    trained transformer (FluxPipeline.from_pretrained draws 2-step images with it); with LoRA the adapters target
    Flow-GRPO's FLUX list and final/pytorch_lora_weights.safetensors, loaded by load_lora_weights on the source
    pipeline, gives the merged final pipeline's images."""
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from test_flow_pipeline import train_pipeline

    path, guided = flux_dir
    final, trainer = train_pipeline(path, tmp_path, monkeypatch, guidance_scale=3.5 if guided else 1.0,
                                    use_lora=lora, lora_r=4, lora_alpha=8)
    if lora:  # only the adapters trained, on Flow-GRPO's FLUX targets (double- and single-stream blocks)
        names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert names and all("lora_" in n for n in names)
        assert any(".ff.net.0.proj." in n for n in names) and any(".attn.add_q_proj." in n for n in names)
        assert any("single_transformer_blocks.0.attn.to_q." in n for n in names)
    assert json.loads((final / "model_index.json").read_text())["_class_name"] == "FluxPipeline"
    for frozen in ("text_encoder_2/model.safetensors", "vae/diffusion_pytorch_model.safetensors"):
        assert (final / frozen).read_bytes() == (path / frozen).read_bytes()  # the frozen parts as they were
    before = FluxTransformer2DModel.from_pretrained(path / "transformer").state_dict()
    trained = FluxPipeline.from_pretrained(final)
    after = trained.transformer.state_dict()
    assert any(not torch.equal(after[k], before[k]) for k in before)  # the trained transformer is what loads
    drawn = _draw(trained, guided)
    assert drawn.shape == (1, 3, PX, PX) and torch.isfinite(drawn).all()
    assert (final / "pytorch_lora_weights.safetensors").exists() == lora
    if lora:  # the source pipeline with the adapters loaded is the merged final pipeline
        base = FluxPipeline.from_pretrained(path)
        plain = _draw(base, guided)
        base.load_lora_weights(final)
        adapted = _draw(base, guided)
        assert not torch.allclose(adapted, plain, atol=1e-6)
        assert torch.allclose(adapted, drawn, atol=1e-4), (adapted - drawn).abs().max()


def test_the_text_flow_grpo_recipe_on_an_image_run_names_flow_grpo_images(flux_dir, capsys):
    """--recipe flow_grpo is AgentFlow's (agent episodes on text): with an image policy or a pipeline folder as
    --model it is refused naming the image Flow-GRPO recipe, flow_grpo_images; on text it builds as before."""
    from grpolab.cli import main
    from grpolab.recipes import recipe_overrides

    path, _ = flux_dir
    text = recipe_overrides("flow_grpo")
    for given in ({"policy": "flow_matching"}, {"model": str(path)}, {"model": str(path), "policy": "flow_matching"}):
        with pytest.raises(ConfigError, match=r"recipe flow_grpo: .*AgentFlow.*--recipe flow_grpo_images "
                                              r"\(Flow-GRPO: Training Flow Matching Models"):
            Config.build(text, {"recipe": "flow_grpo", **given})
    with pytest.raises(ConfigError, match="FluxPipeline folder, which policy causal_lm does not load"):
        Config.build(text, {"recipe": "flow_grpo", "model": str(path)})
    assert main(["config", "--recipe", "flow_grpo", "--model", str(path)]) == 2
    assert "--recipe flow_grpo_images" in capsys.readouterr().err
    assert Config.build(text, {"recipe": "flow_grpo"}).rollout_strategy == "agent"  # the text run is unchanged
    images = recipe_overrides("flow_grpo_images")
    assert Config.build(images, {"recipe": "flow_grpo_images", "model": str(path)}).policy == "flow_matching"
