"""Policy ddpm on the diffusers folders users bring (grpolab/policies/ddpm/pipelines.py): tiny random-weight
StableDiffusionPipeline (SD 1.x, and SD 2.x's v_prediction), StableDiffusionXLPipeline and DDPMPipeline folders
and bare unconditional / class-conditional UNet2DModel folders, built from configs (tokenizers from local files:
nothing is downloaded). Checked against hand computations from the real UNet output: DDPO's DDIM step and its
log-prob (ddpo_pytorch/diffusers_patch/ddim_with_logprob.py, written out here), classifier-free guidance
(pipeline_with_logprob.py), the VAE decoding; then two Trainer steps whose final folder the diffusers pipeline
class loads and draws with, the LoRA adapters diffusers loads, and the refusals."""
import json
import math

import pytest
import torch

from grpolab.config import ConfigError

from _helpers import PIPELINE_WORDS, image_policy, tiny_clip_tokenizer

pytest.importorskip("diffusers")
pytest.importorskip("peft")

WORDS = PIPELINE_WORDS
ROWS = [{"prompt": "a red cat"}, {"prompt": "a blue dog"}]
QUIET = {"log": lambda *a: None}


# ------------------------------------------------------------------------------------------ tiny folders
def _clip(vocab: int, projection: int | None = None):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=1,
                            pad_token_id=1, hidden_act="gelu", **({"projection_dim": projection} if projection else {}))
    return CLIPTextModelWithProjection(config) if projection else CLIPTextModel(config)


def _vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
                         up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[8, 16], layers_per_block=1,
                         latent_channels=4, norm_num_groups=4, sample_size=16, scaling_factor=0.18215)


def _scheduler(prediction_type="epsilon"):
    """Stable Diffusion's DDIM config (scaled-linear betas, steps_offset 1, set_alpha_to_one false)."""
    from diffusers import DDIMScheduler

    return DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                         set_alpha_to_one=False, steps_offset=1, prediction_type=prediction_type)


def build_tiny_sd(path, prediction_type="epsilon"):
    """A StableDiffusionPipeline: a UNet2DConditionModel on 4x8x8 latents with cross-attention, a CLIP text
    encoder (16 tokens, width 16), a 2-level AutoencoderKL (16x16 RGB images)."""
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    tok, n = tiny_clip_tokenizer(path.parent / "tok")
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                                attention_head_dim=2, norm_num_groups=4)
    StableDiffusionPipeline(unet=unet, scheduler=_scheduler(prediction_type), vae=_vae(), text_encoder=_clip(n),
                            tokenizer=tok, safety_checker=None, feature_extractor=None,
                            requires_safety_checker=False).save_pretrained(path)
    return path


def build_tiny_sdxl(path):
    """A StableDiffusionXLPipeline: two CLIP encoders (the second with an 8-wide projection: the pooled text
    embeds), a UNet with text_time added conditions (6 time ids x 4 + 8), force_zeros_for_empty_prompt."""
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    tok, n = tiny_clip_tokenizer(path.parent / "tok")
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(8, 16), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=2,
                                use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=4,
                                projection_class_embeddings_input_dim=6 * 4 + 8, cross_attention_dim=32,
                                norm_num_groups=4)
    StableDiffusionXLPipeline(unet=unet, scheduler=_scheduler(), vae=_vae(), text_encoder=_clip(n), tokenizer=tok,
                              text_encoder_2=_clip(n, projection=8), tokenizer_2=tok,
                              force_zeros_for_empty_prompt=True).save_pretrained(path)
    return path


def _pixel_unet(**kw):
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                       norm_num_groups=4, attention_head_dim=4, **kw)


def build_tiny_ddpm_pipeline(path):
    """A DDPMPipeline: an unconditional pixel UNet2DModel (3x8x8, one attention block) and a DDPMScheduler."""
    from diffusers import DDPMPipeline, DDPMScheduler

    DDPMPipeline(unet=_pixel_unet(), scheduler=DDPMScheduler(num_train_timesteps=1000)).save_pretrained(path)
    return path


def build_bare_unet(path, **kw):
    """A bare UNet2DModel folder (config.json + weights + scheduler_config.json); ``kw``: e.g. num_class_embeds."""
    from diffusers import DDPMScheduler

    _pixel_unet(**kw).save_pretrained(path)
    DDPMScheduler(num_train_timesteps=1000).save_config(path)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    return {"sd": build_tiny_sd(root / "sd" / "pipe"), "sd_v": build_tiny_sd(root / "sd_v" / "pipe", "v_prediction"),
            "sdxl": build_tiny_sdxl(root / "sdxl" / "pipe"), "ddpm": build_tiny_ddpm_pipeline(root / "ddpm"),
            "uncond": build_bare_unet(root / "uncond"),
            "classes": build_bare_unet(root / "classes", num_class_embeds=4)}


def _loaded(path, rows=ROWS, **over):
    cfg, pol = image_policy("ddpm", model=str(path), ddpm_steps=3, ddpm_eval_steps=2, **over)
    return pol, pol.load(cfg, rows, [], **QUIET)


# ------------------------------------------------------------------------------------------ DDPO by hand
def _hand_step(pol, eps, x, xn, t, t_prev, eta=1.0):
    """DDPO's ddim_step_with_logprob written out in float64 from the model output ``eps`` (the scheduler's
    prediction_type, alphas_cumprod of DDIMScheduler.from_config of the folder's config; t' clamped to 0 before
    its final_alpha test): ``(log-prob, mean, std)``."""
    from diffusers import DDIMScheduler

    sched = DDIMScheduler.from_config(pol.scheduler_config)
    acp = sched.alphas_cumprod.double()
    a_t, a_p = float(acp[t]), float(acp[max(t_prev, 0)])
    eps = eps.double()
    if sched.config.prediction_type == "v_prediction":
        x0 = math.sqrt(a_t) * x - math.sqrt(1 - a_t) * eps
        eps = math.sqrt(a_t) * eps + math.sqrt(1 - a_t) * x
    else:
        x0 = (x - math.sqrt(1 - a_t) * eps) / math.sqrt(a_t)
    if sched.config.clip_sample:
        x0 = x0.clamp(-sched.config.clip_sample_range, sched.config.clip_sample_range)
    std = eta * math.sqrt((1 - a_p) / (1 - a_t) * (1 - a_t / a_p))
    mu = math.sqrt(a_p) * x0 + math.sqrt(1 - a_p - std * std) * eps
    lp = (-(xn - mu) ** 2 / (2 * std * std) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean()
    return float(lp), mu, std


def _clip_embeds(pipe, prompt: str) -> torch.Tensor:
    """DDPO's prompt embedding: the text encoder's last hidden state of the prompt padded to max_length."""
    ids = pipe.tokenizer([prompt], padding="max_length", max_length=pipe.tokenizer.model_max_length,
                         truncation=True, return_tensors="pt").input_ids
    return pipe.text_encoder(ids)[0]


def _assert_steps_are_ddpo(pol, module, b, eps_of, steps=(0, 1, 2)):
    """Every listed step of row 0: the behaviour log-prob, the recomputed mean and std are DDPO's from the UNet
    output ``eps_of(x, t)`` (computed by the test), to 1e-4."""
    out = pol.forward(module, b, want=frozenset({"step_mean", "step_std_dev"}), grad=False)
    for j in steps:
        x, xn = b.step_data["x"][0, j], b.step_data["x_next"][0, j]
        t, tp = int(b.step_data["t"][0, j]), int(b.step_data["t_prev"][0, j])
        with torch.no_grad():
            eps = eps_of(x[None], torch.tensor([t]))[0]
        lp, mu, std = _hand_step(pol, eps, x.double(), xn.double(), t, tp)
        assert abs(float(b.behavior_logprobs[0, j]) - lp) < 1e-4, j
        assert abs(float(out["step_std_dev"][0, j]) - std) < 1e-6 and (out["step_mean"][0, j] - mu).abs().max() < 1e-4


# ------------------------------------------------------------------------------------------ Stable Diffusion
@pytest.mark.parametrize("kind,w", [("sd", 1.0), ("sd", 3.0), ("sd_v", 3.0)])
def test_sd_steps_are_ddpo_steps_of_the_real_unet_and_recompute(folders, kind, w):
    """SD 1.x (epsilon) and 2.x (v_prediction): the latents, the text embeds in row_data (one per prompt), the
    timesteps of the pipeline's DDIM config, each step's log-prob DDPO's Gaussian of the UNet's output with CFG
    from the empty prompt's embeds, the forward's recompute equal to the behaviour log-probs."""
    from diffusers import UNet2DConditionModel

    pol, module = _loaded(folders[kind], guidance_scale=w)
    assert isinstance(module, UNet2DConditionModel) and pol.shape == (4, 8, 8)
    assert pol.prediction_type == ("v_prediction" if kind == "sd_v" else "epsilon")
    trained = {id(p) for p in module.parameters()}  # the frozen parts are on the policy, not the module
    assert not any(id(p) in trained for p in pol.net.pipe.vae.parameters())
    assert not any(p.requires_grad for p in pol.net.pipe.text_encoder.parameters())
    pipe, encoded = pol.net.pipe, []
    encode = pipe.encode_prompt
    pipe.encode_prompt = lambda prompts, *a, **k: encoded.append(list(prompts)) or encode(prompts, *a, **k)
    b = pol.sample(module, ROWS, [5, 6], num_generations=[2, 1], generator=torch.Generator().manual_seed(0))
    # each distinct prompt encoded once per sampling call (and the empty prompt once, for guidance)
    assert encoded == [["a red cat", "a blue dog"]] + ([[""]] if w != 1 else [])
    pipe.encode_prompt = None  # the forward reads the embeds from row_data: it never encodes
    assert b.step_data["x"].shape == (3, 3, 4, 8, 8) and b.prompt_uids.tolist() == [5, 5, 6]
    assert b.step_data["t"][0].tolist() == [667, 334, 1] and b.step_data["t_prev"][0].tolist() == [334, 1, -332]
    # the initial latents: N(0, I) per row from the run's generator, times init_noise_sigma (DDIM: 1)
    assert torch.equal(b.step_data["x"][:2, 0], torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(0)))
    pe = b.row_data["prompt_embeds"]
    with torch.no_grad():
        text, empty = _clip_embeds(pol.net.pipe, "a red cat"), _clip_embeds(pol.net.pipe, "")
    assert pe.shape == (3, 16, 16) and torch.equal(pe[0], pe[1]) and torch.allclose(pe[0], text[0], atol=1e-6)

    def eps_of(x, t):
        c = module(x, t, encoder_hidden_states=text).sample
        return c if w == 1 else module(x, t, encoder_hidden_states=empty).sample + w * (
            c - module(x, t, encoder_hidden_states=empty).sample)

    _assert_steps_are_ddpo(pol, module, b, eps_of)
    lp = pol.forward(module, b, grad=False)["logprobs"]
    assert (lp - b.behavior_logprobs).abs().max() < 1e-4
    pipe.encode_prompt = encode


def test_sd_images_are_the_pipelines_vae_decoding(folders):
    """The reward's images: the pipeline's own decoding of the last latents (vae.decode(x / scaling_factor),
    image_processor.postprocess to [0, 1]); and an evaluation sample draws from each row's fixed noise."""
    pol, module = _loaded(folders["sd"])
    b = pol.sample(module, ROWS[:1], [0], num_generations=2, generator=torch.Generator().manual_seed(1))
    pipe = pol.net.pipe
    x = b.step_data["x_next"][:, -1]
    with torch.no_grad():
        want = pipe.image_processor.postprocess(pipe.vae.decode(x / pipe.vae.config.scaling_factor).sample,
                                                output_type="pt")
    assert b.row_data["images"].shape == (2, 3, 16, 16) and (b.row_data["images"] - want).abs().max() < 1e-5
    img = b.columns["completion"][0]
    assert img.shape == (16, 16, 3) and img.dtype.name == "float32"
    rows = [{"prompt": "a cat", "noise_seed": 3}]
    e1 = pol.sample(module, rows, [0], num_generations=1, evaluation=True)
    e2 = pol.sample(module, rows, [0], num_generations=1, evaluation=True, generator=torch.Generator().manual_seed(9))
    assert torch.equal(e1.row_data["images"], e2.row_data["images"]) and (e1.behavior_logprobs == 0).all()


def test_sdxl_steps_use_both_encoders_time_ids_and_zero_negatives(folders):
    """SDXL: prompt_embeds of both encoders concatenated and text_embeds pooled from text_encoder_2, time ids
    (original size, crop (0, 0), target size) = (16, 16, 0, 0, 16, 16), and guidance's unconditional branch
    zeros (force_zeros_for_empty_prompt): each step DDPO's Gaussian of that UNet output."""
    w = 2.5
    pol, module = _loaded(folders["sdxl"], guidance_scale=w)
    b = pol.sample(module, ROWS, [0, 1], num_generations=1, generator=torch.Generator().manual_seed(2))
    pe, pooled = b.row_data["prompt_embeds"], b.row_data["pooled_prompt_embeds"]
    assert pe.shape == (2, 16, 32) and pooled.shape == (2, 8)
    assert pol.net.time_ids.tolist() == [[16.0, 16.0, 0.0, 0.0, 16.0, 16.0]]
    pipe = pol.net.pipe
    with torch.no_grad():
        ids = pipe.tokenizer_2(["a red cat"], padding="max_length", max_length=16, return_tensors="pt").input_ids
        out2 = pipe.text_encoder_2(ids, output_hidden_states=True)
    assert torch.allclose(pooled[0], out2[0][0], atol=1e-6)  # the projected pooled output of encoder 2
    assert torch.allclose(pe[0, :, 16:], out2.hidden_states[-2][0], atol=1e-6)  # its penultimate layer
    time_ids = torch.tensor([[16.0, 16.0, 0.0, 0.0, 16.0, 16.0]])

    def eps_of(x, t):
        def call(e, p):
            return module(x, t, encoder_hidden_states=e, added_cond_kwargs={"text_embeds": p,
                                                                            "time_ids": time_ids}).sample
        c, u = call(pe[:1], pooled[:1]), call(torch.zeros_like(pe[:1]), torch.zeros_like(pooled[:1]))
        return u + w * (c - u)

    _assert_steps_are_ddpo(pol, module, b, eps_of)
    assert (pol.forward(module, b, grad=False)["logprobs"] - b.behavior_logprobs).abs().max() < 1e-4


def test_rows_without_text_prompts_and_other_pipelines_are_refused(folders, tmp_path):
    with pytest.raises(ConfigError, match="train row 1: a diffusers pipeline.*'prompt' column"):
        _loaded(folders["sd"], rows=[{"prompt": "a cat"}, {"label": 3}])
    other = tmp_path / "other"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    with pytest.raises(ConfigError, match="StableDiffusionPipeline.*StableDiffusion3Pipeline.*--policy flow_matching"):
        _loaded(other)


# ------------------------------------------------------------------------------------------ pixel UNet2DModels
@pytest.mark.parametrize("kind", ["ddpm", "uncond"])
def test_an_unconditional_unet_ignores_the_rows_condition(folders, kind):
    """A DDPMPipeline's UNet and a bare unconditional UNet2DModel: any rows (their prompt is not a class), the
    UNet called without class labels, DDPO's steps (clip_sample: the DDPMScheduler's default), images
    (x/2 + 0.5).clamp(0, 1); guidance has nothing to guide and is refused."""
    rows = [{"prompt": "whatever"}, {"label": 99}]
    pol, module = _loaded(folders[kind], rows=rows)
    assert pol.shape == (3, 8, 8) and pol.clip
    b = pol.sample(module, rows, [3, 4], num_generations=2, generator=torch.Generator().manual_seed(0))
    assert b.prompt_uids.tolist() == [3, 3, 4, 4] and b.columns["prompt"][0] == "whatever"
    _assert_steps_are_ddpo(pol, module, b, lambda x, t: module(x, t).sample)
    assert (pol.forward(module, b, grad=False)["logprobs"] - b.behavior_logprobs).abs().max() < 1e-4
    assert torch.equal(b.row_data["images"], (b.step_data["x_next"][:, -1] / 2 + 0.5).clamp(0, 1))
    with pytest.raises(ConfigError, match="guidance_scale: 2 guides a conditional model; this UNet2DModel is "
                                          "unconditional"):
        _loaded(folders[kind], rows=rows, guidance_scale=2.0)


def test_a_class_conditional_unet_states_its_classes_and_needs_its_unconditional_class(folders, tmp_path):
    """num_class_embeds 4: classes 0..3 (none is taken as unconditional); guidance needs
    ddpm_unconditional_class (then 0..2 are asked for), and the folder this policy saves records it."""
    path = folders["classes"]
    with pytest.raises(ConfigError, match="held-out row 0: class 4 is outside the model's classes 0..3"):
        cfg, pol = image_policy("ddpm", model=str(path))
        pol.load(cfg, [{"label": 3}], [{"label": 4}], **QUIET)
    pol, module = _loaded(path, rows=[{"label": 3}])  # w = 1: every class, the last one too
    with pytest.raises(ConfigError, match=r"guidance_scale: 2 needs the class-conditional model's unconditional "
                                          r"class .* set ddpm_unconditional_class to one of its classes 0\.\.3"):
        _loaded(path, rows=[{"label": 1}], guidance_scale=2.0)
    with pytest.raises(ConfigError, match="ddpm_unconditional_class: 7 is not one of the model's classes 0..3"):
        _loaded(path, rows=[{"label": 1}], guidance_scale=2.0, ddpm_unconditional_class=7)
    with pytest.raises(ConfigError, match="train row 0: class 3 is outside the model's classes 0..2"):
        _loaded(path, rows=[{"label": 3}], guidance_scale=2.0, ddpm_unconditional_class=3)
    w = 2.0
    pol, module = _loaded(path, rows=[{"label": 1}], guidance_scale=w, ddpm_unconditional_class=3)
    b = pol.sample(module, [{"label": 1}], [0], num_generations=1, generator=torch.Generator().manual_seed(0))

    def eps_of(x, t):
        c, u = (module(x, t, class_labels=torch.tensor([k])).sample for k in (1, 3))
        return u + w * (c - u)

    _assert_steps_are_ddpo(pol, module, b, eps_of)
    pol.save(module, tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "grpolab_ddpm.json").read_text()) == {"unconditional_class": 3}
    again, _ = _loaded(tmp_path / "saved", rows=[{"label": 1}], guidance_scale=w)  # the record: no setting needed
    assert again.net.unconditional == 3


def test_the_digits_model_keeps_label_10_and_its_saved_folder_records_it(tmp_path):
    """The built-in model guides with its label 10 without any setting, and --model OUT/final of it too."""
    pol, module = _loaded("digits", rows=[{"prompt": "3"}], guidance_scale=2.0)
    assert pol.net.unconditional == 10 and pol.net.classes == 11
    pol.save(module, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "grpolab_ddpm.json").read_text()) == {"unconditional_class": 10}
    again, _ = _loaded(tmp_path / "m", rows=[{"prompt": "3"}], guidance_scale=2.0)
    assert again.net.unconditional == 10
    with pytest.raises(ConfigError, match="class 10 is outside the model's classes 0..9"):
        _loaded(tmp_path / "m", rows=[{"prompt": "10"}])


# ------------------------------------------------------------------------------------------ training, saving
def _run_args(tmp_path, monkeypatch, model, rows, **over) -> dict:
    """The ddpo recipe on ``model`` with a brightness reward file, 2 steps of 2 prompts x 2 images of 2 DDIM
    steps, one thread (``over`` on top)."""
    from grpolab.recipes import recipe_overrides

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bright.py").write_text("def score(completions, **kw):\n"
                                        "    return [float(c.mean()) for c in completions]\n")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {k: v for k, v in recipe_overrides("ddpo").items() if k != "task"}
    return {**recipe, "model": str(model), "data": "prompts.jsonl", "reward": ["./bright.py:score"], "steps": 2,
            "ddpm_steps": 2, "ddpm_eval_steps": 2, "num_generations": 2, "prompts_per_step": 2, "eval_before": False,
            "eval_after": False, "save_steps": 2, "stall_steps": 0, "tensorboard": False, "threads": 1,
            "out": str(tmp_path / "run"), **over}


def _train(tmp_path, monkeypatch, model, rows, **over):
    """Two Trainer steps (:func:`_run_args`); returns the run folder and the trainer."""
    from grpolab.config import Config
    from grpolab.train.trainer import Trainer

    cfg = Config.build(_run_args(tmp_path, monkeypatch, model, rows, **over))
    trainer = Trainer(cfg, **QUIET)
    if cfg.use_lora:
        assert type(trainer.model).__name__ == "PeftModel"
    trainer.train(progress=False)
    return tmp_path / "run", trainer


def _checkpoint_keys(run) -> set:
    from safetensors.torch import load_file

    from grpolab.train.checkpoint import checkpoint_dirs
    return set(load_file(str(checkpoint_dirs(run)[-1] / "weights.safetensors")))


def _moved(a, b) -> bool:
    sb = b.state_dict()
    return any(not torch.equal(v, sb[k]) for k, v in a.state_dict().items())


@pytest.mark.parametrize("kind", ["sd", "sdxl", "ddpm"])
def test_training_a_pipeline_saves_the_users_pipeline_with_the_trained_unet(folders, tmp_path, monkeypatch, kind):
    """final/ is the source pipeline folder with unet/ replaced: its diffusers class loads it and draws images
    (2 steps), the UNet moved, the frozen parts' files as they were; the checkpoints hold only the UNet."""
    import diffusers

    src = folders[kind]
    run, trainer = _train(tmp_path, monkeypatch, src, ROWS)
    final = run / "final"
    unet_keys = set(trainer.model.state_dict())
    assert _checkpoint_keys(run) == unet_keys  # the trained UNet only: no VAE, no text encoder
    cls = getattr(diffusers, json.loads((src / "model_index.json").read_text())["_class_name"])
    pipe = cls.from_pretrained(final)
    pipe.set_progress_bar_config(disable=True)
    assert _moved(pipe.unet, cls.from_pretrained(src).unet)
    for frozen in ("scheduler/scheduler_config.json", "vae/diffusion_pytorch_model.safetensors") if kind != "ddpm" \
            else ("scheduler/scheduler_config.json",):
        assert (final / frozen).read_bytes() == (src / frozen).read_bytes()
    kw = {"batch_size": 1} if kind == "ddpm" else {"prompt": "a red cat"}
    images = pipe(**kw, num_inference_steps=2, output_type="np").images
    assert images.shape == (1, 16, 16, 3) if kind != "ddpm" else (1, 8, 8, 3)
    assert (images >= 0).all() and (images <= 1).all()
    pol, again = _loaded(final)  # and --model final trains on
    assert not _moved(again, trainer.model)


@pytest.mark.parametrize("kind", ["sd", "sdxl"])
def test_a_lora_run_writes_adapters_that_diffusers_loads(folders, tmp_path, monkeypatch, kind):
    """use_lora on a pipeline: ddpo-pytorch's attention targets (to_q/to_k/to_v/to_out.0) only train and are
    checkpointed; final/ holds the merged UNet and pytorch_lora_weights.safetensors, which
    ``load_lora_weights`` puts on the source pipeline to give the merged UNet's output (lora_alpha kept)."""
    import diffusers

    src = folders[kind]
    run, trainer = _train(tmp_path, monkeypatch, src, ROWS, use_lora=True, lora_r=4, lora_alpha=8,
                          learning_rate=1e-2)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} <= {"to_q", "to_k", "to_v", "0"}
    saved = _checkpoint_keys(run)
    assert saved and all("lora_" in k for k in saved)  # the adapters only
    final = run / "final"
    assert (final / "pytorch_lora_weights.safetensors").exists()
    cls = getattr(diffusers, json.loads((src / "model_index.json").read_text())["_class_name"])
    base, merged = cls.from_pretrained(src), cls.from_pretrained(final)
    base.load_lora_weights(final)
    x, t = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([500])
    kw = {"encoder_hidden_states": torch.randn(1, 16, 32 if kind == "sdxl" else 16)}
    if kind == "sdxl":
        kw["added_cond_kwargs"] = {"text_embeds": torch.randn(1, 8),
                                   "time_ids": torch.tensor([[16.0, 16, 0, 0, 16, 16]])}
    with torch.no_grad():
        with_lora, want = base.unet(x, t, **kw).sample, merged.unet(x, t, **kw).sample
        plain = cls.from_pretrained(src).unet(x, t, **kw).sample
    assert (with_lora - want).abs().max() < 1e-5 and (want - plain).abs().max() > 1e-6


def test_a_lora_run_on_a_pixel_unet_writes_peft_adapters(folders, tmp_path, monkeypatch):
    """A DDPMPipeline's UNet2DModel (diffusers loads no LoRA into one): final/adapter is PEFT's adapter folder,
    which PeftModel.from_pretrained puts on the source UNet to give the merged UNet."""
    from diffusers import UNet2DModel
    from peft import PeftModel

    src = folders["ddpm"]
    run, _ = _train(tmp_path, monkeypatch, src, ROWS, use_lora=True, lora_r=4, lora_alpha=8, learning_rate=1e-2)
    final = run / "final"
    base = PeftModel.from_pretrained(UNet2DModel.from_pretrained(src / "unet"), final / "adapter")
    merged = UNet2DModel.from_pretrained(final / "unet")
    x, t = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([300, 700])
    with torch.no_grad():
        assert (base(x, t).sample - merged(x, t).sample).abs().max() < 1e-5



def test_a_resumed_sd_run_is_the_straight_run(folders, tmp_path, monkeypatch):
    """4 steps straight against 2 steps, a new Trainer and --resume to 4 (the checkpoint holds the UNet, the
    frozen parts come from the folder again): the same UNet to the bit and the same metrics but timings.
    (The subprocess kill -9 and 2-rank twins of tests/test_image_reliability.py cost over a minute each with
    this pipeline on the 2-core machine: one 8-step CLI run of it took 67 s, 11 s of them training.)"""
    from grpolab.train.metrics import read_metrics

    from _helpers import straight_and_resumed

    base = _run_args(tmp_path, monkeypatch, folders["sd"], ROWS, ddpm_steps=3)
    a, _, c, _ = straight_and_resumed(base, tmp_path)
    pc = dict(c.model.named_parameters())
    assert all(torch.equal(v, pc[k]) for k, v in a.model.named_parameters())
    timing = {"rollout_s", "train_s", "tokens_per_s", "train_seconds_total", "peak_rss_mb"}
    ma, mc = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in mc] == [r["step"] for r in ma] == [1, 2, 3, 4]
    for ra, rc in zip(ma, mc):
        assert {k: v for k, v in ra.items() if k not in timing} == {k: v for k, v in rc.items() if k not in timing}
