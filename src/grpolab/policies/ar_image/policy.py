"""An autoregressive image generator over codebook tokens: the text machinery with image tokens (AR-GRPO's
setting); one step of the ``[rows, steps]`` layout is one image token."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ...config import ConfigError
from ...generation.sampling import completion_counts, per_row, sample_completions
from ...model.logprobs import completion_logprobs
from ...registry import POLICIES, param
from ..base import (PolicyBase, fanned_columns, group_identity, held_out_seed, repeat_rows, save_pretrained_folder,
                    saved_folder, timed_pretraining)
from .._image.flow import BUILT_IN, check_row_classes, condition_of, image_rows

NUM_CLASSES = 10
#: Pre-training iterations, tuned once for a base held-out accuracy (temperature-1 samples seeded per row,
#: classifier argmax = asked class) inside 0.3–0.85 so RL has room [measured, 20 seeded draws per class]: 100 → 0.11,
#: 200 → 0.445 (classes 0–4: 0.44, 5–9: 0.45; final loss 1.87). 200 iterations took 26 s on one thread of a heavily
#: loaded 2-core machine (load average 16).
PRETRAIN_ITERATIONS = 200


def vocabulary(k: int) -> dict:
    """The token layout for a codebook of ``k`` codes: codes 0..k−1, class tokens k..k+9, bos, pad."""
    return {"codes": k, "class_offset": k, "bos": k + NUM_CLASSES, "pad": k + NUM_CLASSES + 1,
            "size": k + NUM_CLASSES + 2}


def tiny_llama_config(vocab: dict, hidden: int = 64, layers: int = 2) -> dict:
    """The LlamaConfig of the tiny image model: grpolab's tiny text model's shape (``model/loading.py``
    ``build_tiny``: hidden 64, 2 layers, 4 heads, 2 KV heads, MLP 2x, tied embeddings) on the image vocabulary."""
    from .codebook import TOKENS
    return dict(vocab_size=vocab["size"], hidden_size=hidden, intermediate_size=2 * hidden,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=2 + TOKENS, pad_token_id=vocab["pad"], bos_token_id=vocab["bos"],
                eos_token_id=None, tie_word_embeddings=True)


def pretrain_recipe() -> dict:
    """Everything that determines the pre-trained weights (hashed into the cache folder's name)."""
    from .codebook import K, codebook_recipe
    vocab = vocabulary(K)
    return {"kind": "ar", "version": 1, "codebook": codebook_recipe(), "vocab": vocab,
            "llama": tiny_llama_config(vocab), "iterations": PRETRAIN_ITERATIONS, "batch_size": 128,
            "optimizer": "AdamW", "learning_rate": 3e-3, "weight_decay": 0.0, "lr_schedule": "cosine",
            "loss": "next-token cross-entropy on the 16 code tokens",
            "data": "sklearn.datasets.load_digits, all 1797, pixel/8-1, codebook codes", "seed": 0,
            "dtype": "float32", "threads": 1}


def build_model(recipe: dict, seed: int = 0):
    """A freshly initialised ``LlamaForCausalLM`` of the recipe (its init drawn under ``seed``)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(**recipe["llama"])).float()


def pretrain(recipe: dict | None = None, log=None):
    """``(model, codebook, loss_curve)``: the tiny Llama pre-trained by next-token cross-entropy on
    [bos, class, 16 codes] of every digit (loss on the codes only), not cached (see :func:`ar_model_path`)."""
    from ...model.cache import fit, pretraining
    from .codebook import fit_codebook
    from .._image.digits import load_digits_tensor

    recipe = recipe or pretrain_recipe()
    vocab = recipe["vocab"]
    book, _ = fit_codebook(recipe["codebook"])
    images, labels = load_digits_tensor()
    codes = book.encode(images)
    seqs = torch.cat([torch.full((len(codes), 1), vocab["bos"]), (labels + vocab["class_offset"])[:, None],
                      codes], dim=1)
    target = seqs.clone()
    target[:, :2] = -100  # no loss on the prompt
    model = build_model(recipe, seed=recipe["seed"])
    g = torch.Generator().manual_seed(recipe["seed"])
    with pretraining(recipe):
        losses = fit(model, len(seqs), recipe, lambda idx: model(input_ids=seqs[idx], labels=target[idx]).loss,
                     g, name="ar", log=log)
    return model, book, losses


def ar_model_path(log=print) -> Path:
    """Folder with the pre-trained tiny autoregressive digits model, built on first use: ``config.json`` +
    ``model.safetensors`` (``save_pretrained``), ``codebook.safetensors``, ``vocab.json``, ``meta.json``."""
    from ...model.cache import cached_build, cached_path

    recipe = pretrain_recipe()

    def build(tmp: Path) -> dict:
        (model, book, _), meta = timed_pretraining(recipe["seed"], pretrain, recipe)
        model.save_pretrained(tmp, safe_serialization=True)
        book.save(tmp)
        (tmp / "vocab.json").write_text(json.dumps(recipe["vocab"], indent=2) + "\n")
        return meta

    message = (f"[grpolab] pre-training the tiny autoregressive digits model (Llama, 2 layers, width 64, over a "
               f"64-code k-means codebook of 2x2 patches; {recipe['iterations']} steps, one time, about 10-30 s) "
               f"and caching it in {cached_path('digits-ar', recipe)}")
    return cached_build("digits-ar", recipe, build, log=log, message=message)


@POLICIES.register("ar_image")
class ARImagePolicy(PolicyBase):
    """A class-conditional autoregressive image model: a tiny causal transformer (``transformers``
    ``LlamaForCausalLM``) over the 16 codebook tokens of an 8×8 digit, sampled and scored exactly as text.

    Tokens: a k-means codebook of K = 64 centres over 2×2 patches (``policies/ar_image/codebook.py``) turns a digit into 16
    codes in raster order; the vocabulary is the K codes, 10 class tokens (K + c), ``bos`` and ``pad``
    (``vocab.json``). Prompt = [bos, class token of c]; the completion is always 16 tokens (no EOS;
    ``truncated`` False: a full image is complete). One step is one token: ``completion_ids`` are token ids and
    log π(o_t) = log softmax(logits_t / τ)[o_t], computed by the text path's
    ``model.logprobs.completion_logprobs`` and sampled by ``generation.sampling.sample_completions`` unchanged,
    so every token component (KL estimators, clip variants, token weights, entropy terms) applies. The model can
    emit a non-code token (a class token, bos or pad: unlikely after pre-training but with a log-prob like any
    other); its patch decodes as background (−1 on the model's scale, 0 after the mapping to [0, 1]) [ours]. The
    image is decoded by the codebook, mapped from [−1, 1] to [0, 1], and kept in ``row_data["images"]``
    ([R, 1, 8, 8]); ``columns["completion"]`` holds the images as float32 NumPy [8, 8, 1] (the image reward
    contract); ``row_data["cond"]`` the class.

    Evaluation (``evaluation=True``; ``ar_eval_sampling``): ``seeded`` (default) draws the held-out rows at
    temperature 1, the rows of an evaluation chunk that share a seed (``base.held_out_seed``: the row's
    ``noise_seed``, e.g. the digits tasks' 5 fixed seeds per class, else derived from its uid and prompt) together
    from a generator seeded with it, so the held-out set measures the sampling
    distribution that RL trains, with the same random draws before and after training (a row's draw depends on
    its seed and its place among that seed's rows of the chunk: fixed for a given held-out set and
    ``eval_batch_size``); ``greedy`` is argmax decoding (one image per class, whatever the seed: the 50
    held-out rows are then 10 images repeated). Seeded sampling is the default because the greedy image of a
    class is a single point of the distribution: the accuracy would move in steps of 1/10 of the classes.

    Model ``digits`` / ``tiny`` (the default): pre-trained on first use by next-token cross-entropy on
    [bos, class, codes] of all 1,797 scikit-learn digits (AdamW 3e-3, cosine, batch 128,
    :data:`PRETRAIN_ITERATIONS` fixed steps, one thread, seed 0; cached in ``$GRPOLAB_CACHE/digits-ar-<hash>``
    with its codebook). Base held-out accuracy [measured, seeded draws, 20 per class]: 0.445 on
    all ten classes (0.44 on 0–4, 0.45 on 5–9): RL has room. A folder saved by :meth:`save` (``save_pretrained`` + ``codebook.safetensors`` +
    ``vocab.json``) loads as well. Training temperature: the run's ``temperature``; ``top_k`` / ``top_p``
    apply to training draws as for text.

    Differences from AR-GRPO's LlamaGen: no classifier-free guidance (their C2I script samples with CFG 2.0),
    a k-means codebook instead of a VQ-GAN, 16 tokens instead of 576.

    Paper: Yuan et al., "AR-GRPO: Training Autoregressive Image Generation Models via Reinforcement Learning",
    arXiv:2508.06924 (seed 004-15).

    Provenance: grpolab's own — a tiny stand-in for AR-GRPO's class-conditional LlamaGen over VQ tokens
    (https://github.com/Kwai-Klear/AR-GRPO, autoregressive/models/gpt.py): k-means codebook, tiny Llama, no CFG.
    Test: tests/test_ar_image.py::test_recomputed_logprobs_equal_behaviour.
    """

    step = "image token"
    capabilities = frozenset({"tokens", "images"})
    description = "an autoregressive image model over codebook tokens (tiny Llama); one step = one image token"
    default_model = "digits"
    default_task = "digits"  # the task a run with this policy and no --task / --data trains on

    def __init__(self, *, model: str, temperature: float, top_k: int, top_p: float,
                 ar_eval_sampling: str = param("seeded", "ar_image: held-out evaluation draws: 'seeded' = "
                                               "temperature 1 from each row's noise_seed (the same draws before "
                                               "and after), 'greedy' = argmax (one image per class)",
                                               ["seeded", "greedy"])):
        if ar_eval_sampling not in ("seeded", "greedy"):
            raise ConfigError(f"ar_eval_sampling: 'seeded' or 'greedy', got {ar_eval_sampling!r}")
        self.model_name, self.temperature = model, float(temperature)
        self.top_k, self.top_p, self.eval_sampling = int(top_k), float(top_p), ar_eval_sampling
        self.vocab: dict = {}
        self.codebook = None

    @property
    def pad_id(self) -> int:
        return self.vocab["pad"]

    # ---------------------------------------------------------------- loading
    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``digits`` / ``tiny`` (the built-in model, pre-trained on first use and cached) or a folder
        written by :meth:`save`."""
        from transformers import LlamaForCausalLM

        from .codebook import Codebook

        if self.model_name in BUILT_IN:
            path = ar_model_path(log=log)
        else:
            path = saved_folder(self.model_name, "ar_image", ("config.json", "codebook.safetensors", "vocab.json"),
                                "'digits' (the built-in tiny model) or a folder it saved (config.json + "
                                "safetensors, codebook.safetensors, vocab.json)")
        self.codebook = Codebook.load(path)
        self.vocab = json.loads((Path(path) / "vocab.json").read_text())
        check_row_classes(rows, eval_rows, NUM_CLASSES)
        return LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()

    def save(self, module, path) -> None:
        """``save_pretrained`` (config.json + model.safetensors), the codebook and the vocabulary layout:
        ``--model PATH`` loads it."""
        path = save_pretrained_folder(module, path)
        self.codebook.save(path)
        (path / "vocab.json").write_text(json.dumps(self.vocab, indent=2) + "\n")

    # ---------------------------------------------------------------- acting
    def prompts(self, labels: torch.Tensor) -> torch.Tensor:
        """[bos, class token] per label: ``[N, 2]``."""
        return torch.stack([torch.full_like(labels, self.vocab["bos"]), labels + self.vocab["class_offset"]], 1)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens ``[R, 16]`` → images ``[R, 1, 8, 8]`` in [0, 1]; a non-code token decodes as background."""
        codes = tokens.clamp(max=self.vocab["codes"] - 1)
        x = self.codebook.decode(codes.cpu())
        bad = (tokens.cpu() >= self.vocab["codes"])
        if bool(bad.any()):
            from .codebook import PATCH, unpatch
            mask = unpatch(bad[..., None].expand(*bad.shape, PATCH * PATCH).float()) > 0
            x = x.masked_fill(mask, -1.0)
        return ((x.clamp(-1, 1) + 1) / 2).float()

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        """16 tokens per action by the text sampler; training draws at the run's temperature / top_k / top_p
        from ``generator``; ``evaluation``: ``ar_eval_sampling`` (seeded per row, or greedy)."""
        from ...batch import RolloutBatch
        from .codebook import TOKENS

        if not self.vocab:
            raise RuntimeError("policy ar_image: load() the model before sampling (it reads the vocabulary)")
        counts = completion_counts(num_generations, len(rows))
        labels = torch.tensor([condition_of(r) for r in rows])
        prompt = self.prompts(labels)
        kw = dict(max_new_tokens=TOKENS, eos_ids=[], pad_id=self.pad_id, static_cache=False)
        if evaluation and self.eval_sampling == "seeded":
            # one draw per noise_seed: the rows of a chunk with the same seed are sampled together from a
            # generator seeded with it (the digits tasks' held-out rows are noise-major: one call per seed)
            seeds = [held_out_seed(r, u) for r, u in zip(rows, uids)]  # noise_seed, else derived from the row
            ids = torch.zeros(sum(counts), TOKENS, dtype=torch.long)
            lps = torch.zeros(sum(counts), TOKENS)
            starts = torch.tensor([0] + counts).cumsum(0).tolist()
            for seed in sorted(set(seeds)):
                idx = [i for i, s in enumerate(seeds) if s == seed]
                g = torch.Generator(device=next(module.parameters()).device.type).manual_seed(seed)
                out = sample_completions(module, prompt[idx], torch.ones(len(idx), 2, dtype=torch.long),
                                         num_samples=[counts[i] for i in idx], temperature=1.0, generator=g, **kw)
                at = [j for i in idx for j in range(starts[i], starts[i + 1])]
                ids[at], lps[at] = out.completion_ids, out.logprobs
        else:
            temp = 0.0 if evaluation else (self.temperature if temperature is None else temperature)
            out = sample_completions(module, prompt, torch.ones(len(rows), 2, dtype=torch.long), num_samples=counts,
                                     temperature=temp, generator=generator,
                                     top_k=0 if evaluation else self.top_k, top_p=1.0 if evaluation else self.top_p,
                                     **kw)
            ids, lps = out.completion_ids, out.logprobs
        R = len(ids)
        images = self.decode(ids)
        columns = fanned_columns(rows, counts)
        columns["prompt"] = per_row([str(r.get("prompt", "")) for r in rows], counts)
        columns["completion"] = image_rows(images)
        ones = torch.ones(R, TOKENS)
        return RolloutBatch(
            prompt_ids=repeat_rows(prompt, counts), prompt_mask=torch.ones(R, 2, dtype=torch.long),
            completion_ids=ids.long(), completion_mask=ones, behavior_logprobs=lps.float(),
            completion_attention_mask=ones.long(), truncated=torch.zeros(R, dtype=torch.bool), columns=columns,
            row_data={"cond": repeat_rows(labels, counts), "images": images},
            **group_identity(counts, uids, group_offset))

    def offers(self) -> frozenset[str]:
        """``entropy`` / ``entropy_grad`` as for text; ``token_logprobs`` = the log-probs again, so that a loss
        can ask the frozen reference for them (``ref_token_logprobs``: ``group_dpo`` without the KL term)."""
        return frozenset({"entropy", "entropy_grad", "token_logprobs"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """``logprobs`` [R, 16] of ``mb``'s tokens under ``module`` (``model.logprobs.completion_logprobs``, the
        text path; the group's shared prompt runs once); ``entropy`` / ``entropy_grad``: the vocabulary
        entropy per token, as for text; ``token_logprobs``: the same tensor as ``logprobs``."""
        with torch.set_grad_enabled(grad):
            if not want & {"entropy", "entropy_grad"}:
                out = {"logprobs": completion_logprobs(module, mb, self.temperature)[0]}
            else:
                logp, ent = completion_logprobs(module, mb, self.temperature, with_entropy=True,
                                                entropy_grad="entropy_grad" in want)
                out = {"logprobs": logp, "entropy": ent.detach(), "entropy_grad": ent}
        if "token_logprobs" in want:
            out["token_logprobs"] = out["logprobs"]
        return out

    def describe(self, batch, i: int) -> dict:
        """The asked class and the image as a 32x32 PNG data URI (the completions log, the report)."""
        from ...media import thumbnail_data_uri
        return {"prompt": str(batch.columns["prompt"][i]), "completion": "",
                "image": thumbnail_data_uri(batch.row_data["images"][i])}
