"""Step cost of a latent Stable Diffusion pipeline (a user's `StableDiffusionPipeline` folder) against its FLOP floor
(docs/benchmarks.md, "A latent pipeline: step cost against the FLOP floor"; issue 41).

    .venv/bin/python scripts/bench_latent_pipeline.py [--steps 5] [--threads 2] [--ddim 10] [--width 64]
        [--model PATH]   # a StableDiffusionPipeline folder of your own instead of the built one

Without ``--model`` it builds, in-process and with random weights, a Stable-Diffusion-1.x-shaped pipeline small
enough for a CPU (nothing is downloaded): an UNet2DConditionModel on 4 x 16 x 16 latents with SD 1.x's block
layout (CrossAttnDownBlock2D x 2 + DownBlock2D, mirrored up blocks, a cross-attention mid block) at widths
(W, 2W, 2W), a 4-layer CLIP text encoder of width W and a 3-level AutoencoderKL (16 x 16 latents -> 64 x 64 RGB
images), with SD's DDIM scheduler config. It then runs :func:`bench_images.measure` on the ``ddpo`` recipe with
that folder as ``model`` (policy ddpm: DDIM sampling with eta 1 and per-step log-probs, classifier-free guidance
5.0 as DDPO samples, the VAE decoding every image for the reward, the UNet's PPO update on the sampled steps),
a brightness reward, 4 prompts x 4 images a step, ``--ddim`` denoising steps.

The floor is the step's FLOPs (FlopCounterMode over one whole step) over the measured float32 matmul rate, as in
scripts/bench_images.py. Timings never enter the test suite.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/_helpers.py: the tiny CLIP tokenizer

PROMPTS = ["a red cat", "a blue dog", "a bright image", "a dark dog", "a red image", "a bright cat",
           "a dark image", "a blue cat"]


def build_pipeline(path: Path, width: int) -> Path:
    """The random-weight SD-1.x-shaped pipeline described in the module docstring, saved to ``path``."""
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from _helpers import tiny_clip_tokenizer

    torch.manual_seed(0)
    tok, n = tiny_clip_tokenizer(path.parent / "tokenizer_src")  # one token per word of PIPELINE_WORDS
    text = CLIPTextModel(CLIPTextConfig(vocab_size=n, hidden_size=width, intermediate_size=4 * width,
                                        num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=16,
                                        bos_token_id=0, eos_token_id=1, pad_token_id=1))
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(width, 2 * width, 2 * width),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=width, attention_head_dim=8, norm_num_groups=16)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 3,
                        up_block_types=["UpDecoderBlock2D"] * 3, block_out_channels=[16, 32, 32], layers_per_block=1,
                        latent_channels=4, norm_num_groups=16, sample_size=64, scaling_factor=0.18215)
    sched = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                          set_alpha_to_one=False, steps_offset=1)
    StableDiffusionPipeline(unet=unet, scheduler=sched, vae=vae, text_encoder=text, tokenizer=tok,
                            safety_checker=None, feature_extractor=None,
                            requires_safety_checker=False).save_pretrained(path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ddim", type=int, default=10, help="denoising steps per image (ddpm_steps)")
    ap.add_argument("--width", type=int, default=64, help="the UNet's first block width (built pipeline only)")
    ap.add_argument("--model", default=None, help="your own StableDiffusionPipeline folder")
    a = ap.parse_args(argv)
    import torch

    from bench_images import against_floor, cost_cells, measure
    from grpolab.bench import matmul_flops_per_s

    work = Path(tempfile.mkdtemp(prefix="bench_latent_"))
    model = Path(a.model) if a.model else build_pipeline(work / "sd", a.width)
    (work / "bright.py").write_text("def score(completions, **kw):\n"
                                    "    return [float(c.float().mean()) for c in completions]\n")
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    os.chdir(work)
    torch.set_num_threads(a.threads)
    rate = matmul_flops_per_s()
    over = {"model": str(model), "data": str(work / "prompts.jsonl"), "reward": [str(work / "bright.py") + ":score"],
            "ddpm_steps": a.ddim, "ddpm_eval_steps": a.ddim, "prompts_per_step": 4, "num_generations": 4,
            "tensorboard": False}
    m = against_floor(measure("ddpo", a.steps, a.threads, over, without=("task",)), rate)
    print(f"float32 matmul rate {rate / 1e9:.1f} GFLOP/s, {a.threads} threads, {a.steps} timed steps after 2 warm-up,"
          f" {a.ddim} DDIM steps\n")
    print("| model | parameters (trainer.model) | images per step | step (median) | step FLOPs | floor | step / floor |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {'your folder' if a.model else f'SD 1.x-shaped, width {a.width}'} | {cost_cells(m)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
