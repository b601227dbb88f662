"""Policy flow_matching on a diffusers Stable Diffusion 3 pipeline folder (``--model PATH`` with model_index.json):
the same code path as the digits UNet, on a tiny SD3 pipeline built from configs (random weights, tokenizers from
local files: nothing is downloaded). The transformer is the trained module; the VAE and the text encoders stay
frozen on the policy; prompts are encoded once per sampling call into row_data; images are the VAE's decoding."""
import json

import pytest
import torch

from grpolab.components import Component
from grpolab.config import Config, ConfigError
from grpolab.policies import POLICIES

from _helpers import PIPELINE_WORDS, tiny_clip_tokenizer

pytest.importorskip("diffusers")
pytest.importorskip("peft")

WORDS = PIPELINE_WORDS


def build_tiny_sd3(path):
    """A StableDiffusion3Pipeline of tiny random components saved to ``path``: an SD3Transformer2DModel on 4x8x8
    latents, a 2-level AutoencoderKL (16x16 RGB images), two CLIP text encoders with projection, a T5 encoder,
    and one character-level CLIP tokenizer written to local files (used for all three encoders)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, \
        StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    tok, n_vocab = tiny_clip_tokenizer(path.parent / "tok")
    torch.manual_seed(0)

    def clip():
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=n_vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=16, projection_dim=32, bos_token_id=0, eos_token_id=1, pad_token_id=1,
            hidden_act="gelu"))

    t5 = T5EncoderModel(T5Config(vocab_size=n_vocab, d_model=32, d_ff=32, d_kv=8, num_layers=1, num_heads=2,
                                 relative_attention_num_buckets=8))
    transformer = SD3Transformer2DModel(sample_size=8, patch_size=1, in_channels=4, num_layers=1,
                                        attention_head_dim=8, num_attention_heads=2, caption_projection_dim=16,
                                        joint_attention_dim=32, pooled_projection_dim=64, out_channels=4)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
                        up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[8, 16], layers_per_block=1,
                        latent_channels=4, norm_num_groups=4, sample_size=16, shift_factor=0.0609,
                        scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False)
    pipe = StableDiffusion3Pipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                                    vae=vae, text_encoder=clip(), tokenizer=tok, text_encoder_2=clip(),
                                    tokenizer_2=tok, text_encoder_3=t5, tokenizer_3=tok)
    pipe.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pipe_dir(tmp_path_factory):
    return build_tiny_sd3(tmp_path_factory.mktemp("sd3") / "pipe")


ROWS = [{"prompt": "a red cat"}, {"prompt": "a blue dog"}, {"prompt": "a dark image"}]


def _policy(pipe_dir, **over):
    cfg = Config.build({"policy": "flow_matching", "model": str(pipe_dir), "data": "rows.jsonl", "reward": ["m:f"],
                        "flow_steps": 3, **over})
    return cfg, Component(POLICIES.get("flow_matching"), cfg, "flow_matching").fn


@pytest.mark.parametrize("w", [1.0, 3.0])
def test_a_pipeline_samples_and_recomputes_its_logprobs(pipe_dir, w):
    from diffusers import SD3Transformer2DModel

    cfg, pol = _policy(pipe_dir, guidance_scale=w)
    module = pol.load(cfg, ROWS, [], log=lambda *a: None)
    assert isinstance(module, SD3Transformer2DModel) and pol.shape == (4, 8, 8)
    trained = {id(p) for p in module.parameters()}  # the frozen parts are not the module's
    assert not any(id(p) in trained for p in pol.pipe.vae.parameters())
    assert not any(p.requires_grad for p in pol.pipe.text_encoder.parameters())
    b = pol.sample(module, ROWS, [5, 6, 7], num_generations=[2, 1, 2], temperature=1.0,
                   generator=torch.Generator().manual_seed(0))
    assert b.step_data["x"].shape == (5, 3, 4, 8, 8) and b.prompt_uids.tolist() == [5, 5, 6, 7, 7]
    pe, pp = b.row_data["prompt_embeds"], b.row_data["pooled_prompt_embeds"]
    assert pe.shape == (5, 128 + 16, 32) and pp.shape == (5, 64)  # T5 tokens + CLIP tokens; two pooled CLIPs
    assert torch.equal(pe[0], pe[1]) and not torch.equal(pe[1], pe[2])  # one prompt, one embedding
    img = b.columns["completion"][0]
    assert b.row_data["images"].shape == (5, 3, 16, 16)
    assert img.shape == (16, 16, 3) and img.dtype.name == "float32" and 0 <= img.min() and img.max() <= 1
    assert b.columns["prompt"] == ["a red cat", "a red cat", "a blue dog", "a dark image", "a dark image"]
    lp = pol.forward(module, b, grad=False)["logprobs"]
    assert (lp - b.behavior_logprobs).abs().max() < 1e-4
    # the velocity is the transformer's at timestep 1000*sigma, as StableDiffusion3Pipeline passes it
    sig = torch.full((1,), 0.5)
    cond = {k: v[:1] for k, v in b.row_data.items() if k.endswith("prompt_embeds")}
    with torch.no_grad():
        v = pol.velocity(module, b.step_data["x"][:1, 1], sig, cond)
        v_c = module(hidden_states=b.step_data["x"][:1, 1], timestep=sig * 1000,
                     encoder_hidden_states=cond["prompt_embeds"],
                     pooled_projections=cond["pooled_prompt_embeds"]).sample
        if w != 1.0:
            neg = pol.pipe.encode_prompt("", None, None, device="cpu", do_classifier_free_guidance=False,
                                         max_sequence_length=128)
            v_u = module(hidden_states=b.step_data["x"][:1, 1], timestep=sig * 1000, encoder_hidden_states=neg[0],
                         pooled_projections=neg[2]).sample
            v_c = v_u + w * (v_c - v_u)
    assert torch.allclose(v, v_c, atol=1e-5)
    ev = pol.sample(module, [{"prompt": "a cat", "noise_seed": 3}], [0], num_generations=1, temperature=0.0,
                    evaluation=True)
    assert ev.row_data["images"].shape == (1, 3, 16, 16)


def test_rows_without_text_prompts_and_other_pipelines_are_refused(pipe_dir, tmp_path):
    cfg, pol = _policy(pipe_dir)
    with pytest.raises(ConfigError, match="held-out row 0.*'prompt' column"):
        pol.load(cfg, ROWS, [{"label": 3}], log=lambda *a: None)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    cfg, pol = _policy(other)
    with pytest.raises(ConfigError, match="StableDiffusion3Pipeline.*FluxPipeline.*'StableDiffusionPipeline'.*"
                                          "policy ddpm"):
        pol.load(cfg, ROWS, [], log=lambda *a: None)


@pytest.mark.parametrize("lora", [False, True])
def test_training_a_pipeline_saves_one_that_loads_back(pipe_dir, tmp_path, monkeypatch, lora):
    """Two GRPO steps of the flow_grpo_images recipe on the tiny pipeline with a brightness reward; the final
    folder is a pipeline (model_index.json) that --model loads, with the trained transformer."""
    from diffusers import SD3Transformer2DModel

    from grpolab.train.trainer import Trainer

    cfg = pipeline_run_config(pipe_dir, tmp_path, monkeypatch, use_lora=lora, lora_r=4, lora_alpha=8)
    trainer = Trainer(cfg, log=lambda *a: None)
    if lora:
        assert type(trainer.model).__name__ == "PeftModel"
        assert all("lora_" in n for n, p in trainer.model.named_parameters() if p.requires_grad)
    trainer.train(progress=False)
    final = tmp_path / "run" / "final"
    assert (final / "model_index.json").exists() and (final / "transformer" / "config.json").exists()
    for frozen in ("text_encoder/model.safetensors", "vae/diffusion_pytorch_model.safetensors"):
        assert (final / frozen).read_bytes() == (pipe_dir / frozen).read_bytes()  # the frozen parts as they were
    before = SD3Transformer2DModel.from_pretrained(pipe_dir / "transformer")
    cfg2, pol = _policy(final)
    after = pol.load(cfg2, ROWS, [], log=lambda *a: None)
    assert isinstance(after, SD3Transformer2DModel) and pol.pipe.vae is not None
    moved = any(not torch.equal(a, b) for a, b in zip(after.state_dict().values(), before.state_dict().values()))
    assert moved  # the trained transformer is what --model loads



def pipeline_run_config(model, tmp_path, monkeypatch, **over) -> Config:
    """The config of two steps of the flow_grpo_images recipe on the pipeline folder ``model`` with a brightness
    reward (2 prompts x 2 images, 2 denoising steps), run in ``tmp_path`` (its out: ``run``); ``over`` on top."""
    from grpolab.recipes import recipe_overrides

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bright.py").write_text("def score(completions, **kw):\n"
                                        "    return [float(c.mean()) for c in completions]\n")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    recipe = {k: v for k, v in recipe_overrides("flow_grpo_images").items() if k != "task"}
    return Config.build({**recipe, "model": str(model), "data": "prompts.jsonl", "reward": ["./bright.py:score"],
                         "steps": 2, "flow_steps": 2, "num_generations": 2, "prompts_per_step": 2,
                         "eval_before": False, "eval_after": False, "save_steps": 100, "stall_steps": 0,
                         "out": str(tmp_path / "run"), **over})


def train_pipeline(model, tmp_path, monkeypatch, **over):
    """Two steps of ``pipeline_run_config`` at learning rate 1e-2; returns ``(the run's final folder, trainer)``."""
    from grpolab.train.trainer import Trainer

    cfg = pipeline_run_config(model, tmp_path, monkeypatch, **{"learning_rate": 1e-2, **over})
    trainer = Trainer(cfg, log=lambda *a: None)
    trainer.train(progress=False)
    return tmp_path / "run" / "final", trainer


def test_lora_adapters_load_into_the_source_pipeline(pipe_dir, tmp_path, monkeypatch):
    """A LoRA run's final folder holds diffusers' LoRA file (StableDiffusion3Pipeline.save_lora_weights, rank and
    alpha in its metadata): load_lora_weights on the source pipeline changes its images to the merged final
    pipeline's."""
    from diffusers import StableDiffusion3Pipeline

    final, _ = train_pipeline(pipe_dir, tmp_path, monkeypatch, use_lora=True, lora_r=4, lora_alpha=8)
    assert (final / "pytorch_lora_weights.safetensors").exists()

    def draw(pipe):
        pipe.set_progress_bar_config(disable=True)
        with torch.no_grad():
            return pipe(prompt="a red cat", height=16, width=16, num_inference_steps=2, guidance_scale=1.0,
                        max_sequence_length=128, generator=torch.Generator().manual_seed(0), output_type="pt").images

    merged = draw(StableDiffusion3Pipeline.from_pretrained(final))
    base = StableDiffusion3Pipeline.from_pretrained(pipe_dir)
    plain = draw(base)
    base.load_lora_weights(final)
    adapted = draw(base)
    assert not torch.allclose(adapted, plain, atol=1e-6) and torch.allclose(adapted, merged, atol=1e-4)
