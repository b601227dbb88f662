"""A next-scale (VAR) image generator: one step of the ``[rows, steps]`` layout is one image token of one scale,
``span_ids`` = the scale (1 = coarsest); the setting of "VAR RL Done Right" (seed 000-27)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ...config import ConfigError
from ...generation.sampling import completion_counts, row_temperatures
from ...registry import POLICIES, param
from ..base import PolicyBase, held_out_seed, repeat_rows, saved_folder
from .._image.flow import BUILT_IN, check_row_classes, condition_of, pack_images


# beta > 0 is allowed: the log-probs are exact categorical token log-probs, so the token KL estimators apply as for
# text (a text generation engine is refused by the one guard of policies that sample in the trainer: config.py)
@POLICIES.register("var_image")
class VARImagePolicy(PolicyBase):
    """A class-conditional next-scale image model (VAR-style): residual token maps at 1×1, 2×2, 4×4, 8×8 (85
    tokens over one 32-value scalar codebook) predicted scale by scale by a tiny block-causal transformer
    (``policies/var_image/model.py``: tokens, codebook, model, pre-training, cache).

    One step is one token: ``completion_ids`` [R, 85] are the codes (scale 1 at column 0, scale 2 at 1–4,
    scale 3 at 5–20, scale 4 at 21–84, each map in raster order), ``span_ids`` the scale number 1..4, and
    log π(o_t) = log softmax(logits_t / τ)[o_t] with the logits of token t given the class and every coarser
    scale (exact categorical log-probs: every token component — KL estimators, clip variants, token weights,
    entropy terms — applies). Sampling is 4 forwards, one per scale, drawing every token of the scale in
    parallel at temperature τ (the run's ``temperature``; no top-k / top-p); each forward runs all 86 positions
    with the not yet drawn codes at 0 (the block-causal mask hides them), so the behaviour log-probs and
    :meth:`forward`'s recomputed ones come from the same computation. Images are decoded by the codebook
    (Σ_k up(v[c_k]), clamped to [−1, 1], mapped to [0, 1]) into ``row_data["images"]`` ([R, 1, 8, 8]);
    ``columns["completion"]`` holds them as float32 NumPy [8, 8, 1] (the image reward contract).

    Evaluation (``evaluation=True``; ``var_eval_sampling``): ``seeded`` (default) draws each held-out row at
    temperature 1, the rows of a chunk that share a seed (``base.held_out_seed``: the row's ``noise_seed``, else
    derived from its uid and prompt) together from a generator seeded with it (the same draws before and after
    training: the held-out accuracy measures the distribution RL trains);
    ``greedy`` takes the argmax code of every token (one image per class).

    Model ``digits`` / ``tiny`` (the default): pre-trained on first use by cross-entropy on all 85 tokens of the
    1,797 scikit-learn digits (teacher forcing; AdamW 3e-3, cosine, batch 64, ``images.var.PRETRAIN_ITERATIONS``
    fixed steps, one thread, seed 0) and cached in ``$GRPOLAB_CACHE/digits-var-<hash>`` with its codebook. A
    folder written by :meth:`save` (``config.json``, ``model.safetensors``, ``var_codebook.safetensors``) loads
    as well.

    Differences from VAR (Tian et al., 2024): a scalar residual codebook on pixels instead of a multi-scale
    VQ-VAE on latents, 4 scales instead of 10, no classifier-free guidance, no Φ refinement convolutions.

    Paper: Sun et al., "VAR RL Done Right", arXiv:2601.02256 (seed 000-27) trains VAR models with GRPO.

    Provenance: grpolab's own — a tiny stand-in for the VAR models of 000-27 (next-scale prediction over
    residual token maps, all tokens of a scale in parallel); no code of the paper was found.
    Test: tests/test_var_image.py::test_recomputed_logprobs_equal_behaviour.
    """

    step = "image token"
    capabilities = frozenset({"tokens", "images", "scales"})
    description = "a next-scale (VAR) image model: token maps 1x1..8x8; one step = one image token of one scale"
    default_model = "digits"
    default_task = "digits"  # the task a run with this policy and no --task / --data trains on
    float32_only = True

    def __init__(self, *, model: str, temperature: float,
                 var_eval_sampling: str = param("seeded", "var_image: held-out evaluation draws: 'seeded' = "
                                                "temperature 1 from each row's noise_seed (the same draws before "
                                                "and after), 'greedy' = argmax of every token (one image per "
                                                "class)", ["seeded", "greedy"])):
        if var_eval_sampling not in ("seeded", "greedy"):
            raise ConfigError(f"var_eval_sampling: 'seeded' or 'greedy', got {var_eval_sampling!r}")
        self.model_name, self.temperature, self.eval_sampling = model, float(temperature), var_eval_sampling
        self.codebook = None

    # ---------------------------------------------------------------- loading
    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``digits`` / ``tiny`` (built in, pre-trained on first use and cached) or a saved folder."""
        from .model import NUM_CLASSES, load_var, var_model_path

        if self.model_name in BUILT_IN:
            path = var_model_path(log=log)
        else:
            path = saved_folder(self.model_name, "var_image",
                                ("config.json", "model.safetensors", "var_codebook.safetensors"),
                                "'digits' (the built-in tiny model) or a folder it saved (config.json, "
                                "model.safetensors, var_codebook.safetensors)")
        module, self.codebook = load_var(path)
        check_row_classes(rows, eval_rows, NUM_CLASSES)
        return module

    def save(self, module, path) -> None:
        """``config.json`` + ``model.safetensors`` + ``var_codebook.safetensors``: ``--model PATH`` loads it."""
        from .model import save_var
        save_var(module, self.codebook, path)

    # ---------------------------------------------------------------- acting
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[R, 85]`` → images ``[R, 1, 8, 8]`` in [0, 1]."""
        return ((self.codebook.decode(codes.cpu()).clamp(-1, 1) + 1) / 2).float()

    @staticmethod
    @torch.no_grad()
    def draw(module, labels: torch.Tensor, temps: torch.Tensor, generator, *, greedy: bool = False,
             codes: torch.Tensor | None = None, from_scale: int = 1, to_scale: int | None = None):
        """``(codes [R, 85], logprobs [R, 85])``: scales ``from_scale``..``to_scale`` (default 4) drawn one forward each (the coarser
        scales of ``codes`` kept: a continuation of a prefix); log-probs at temperature ``temps`` [R] (0 at the
        kept scales). ``greedy``: argmax codes."""
        from .model import OFFSETS, SCALES, TOKENS

        dev = next(module.parameters()).device
        R = len(labels)
        codes = torch.zeros(R, TOKENS, dtype=torch.long) if codes is None else codes.clone().long()
        codes, labels, temps = codes.to(dev), labels.to(dev), temps.to(dev).float()
        logps = torch.zeros(R, TOKENS, device=dev)
        for k in range(from_scale - 1, SCALES if to_scale is None else to_scale):
            a, b = OFFSETS[k], OFFSETS[k + 1]
            logits = module(codes, labels)[:, a:b].float()
            lp = torch.log_softmax(logits / temps.clamp(min=1e-6)[:, None, None], -1)
            if greedy:
                new = logits.argmax(-1)
            else:
                new = torch.multinomial(lp.exp().reshape(-1, lp.shape[-1]), 1,
                                        generator=generator).reshape(R, b - a)
            codes[:, a:b] = new
            logps[:, a:b] = lp.gather(-1, new[..., None])[..., 0]
        return codes.cpu(), logps.cpu()

    def pack(self, rows, uids, counts, codes, logps, *, group_offset: int):
        """A RolloutBatch of full images (``pack_images``) with the codes as ``completion_ids`` and the scales as
        ``span_ids``."""
        from .model import scale_ids

        labels = repeat_rows(torch.tensor([condition_of(r) for r in rows]), counts)
        batch = pack_images(rows, uids, counts, labels, self.decode(codes), logprobs=logps,
                            group_offset=group_offset)
        return replace(batch, completion_ids=codes.long(), span_ids=scale_ids().expand(len(codes), -1).clone())

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        """85 tokens per action in 4 forwards; training draws at the run's temperature from ``generator``;
        ``evaluation``: ``var_eval_sampling`` (seeded per row at temperature 1, or greedy)."""
        if self.codebook is None:
            raise RuntimeError("policy var_image: load() the model before sampling (it decodes with the codebook)")
        counts = completion_counts(num_generations, len(rows))
        labels = repeat_rows(torch.tensor([condition_of(r) for r in rows]), counts)
        R = len(labels)
        if evaluation and self.eval_sampling == "seeded":
            seeds = [held_out_seed(r, u) for r, u in zip(rows, uids)]  # noise_seed, else derived from the row
            row_seed = repeat_rows(torch.tensor(seeds), counts)
            codes = torch.zeros(R, 85, dtype=torch.long)
            logps = torch.zeros(R, 85)
            for seed in sorted(set(seeds)):
                at = (row_seed == seed).nonzero()[:, 0]
                g = torch.Generator(device=next(module.parameters()).device.type).manual_seed(seed)
                codes[at], logps[at] = self.draw(module, labels[at], torch.ones(len(at)), g)
        elif evaluation:
            codes, logps = self.draw(module, labels, torch.ones(R), generator, greedy=True)
        else:
            temps = row_temperatures(self.temperature if temperature is None else temperature, counts)
            codes, logps = self.draw(module, labels, temps, generator)
        return self.pack(rows, uids, counts, codes, logps, group_offset=group_offset)

    def offers(self) -> frozenset[str]:
        """``entropy`` / ``entropy_grad``: the entropy of each token's distribution over the 32 codes."""
        return frozenset({"entropy", "entropy_grad"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """``logprobs`` [R, 85] of ``mb``'s codes under ``module`` (one teacher-forced forward, temperature τ);
        ``entropy`` (detached) / ``entropy_grad``: the per-token entropy over the codebook."""
        dev = next(module.parameters()).device
        codes = mb.completion_ids.to(dev).long().clone()  # the gather index is saved for backward
        with torch.set_grad_enabled(grad):
            logits = module(codes, mb.row_data["cond"].to(dev)).float()
            lp = torch.log_softmax(logits / self.temperature, -1)
            out = {"logprobs": lp.gather(-1, codes[..., None].long())[..., 0]}
            if want & {"entropy", "entropy_grad"}:
                ent = -(lp.exp() * lp).sum(-1)
                out.update(entropy=ent.detach(), entropy_grad=ent)
        return out

    def describe(self, batch, i: int) -> dict:
        """The asked class and the image as a 32x32 PNG data URI (the completions log, the report)."""
        from ...media import thumbnail_data_uri
        return {"prompt": str(batch.columns["prompt"][i]), "completion": "",
                "image": thumbnail_data_uri(batch.row_data["images"][i])}
