"""A vision-language model: a causal LM whose prompt holds pictures (``transformers``' image-text-to-text classes);
one step of the ``[rows, steps]`` layout is one completion token."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

from ...config import ConfigError
from ...generation.sampling import completion_counts, decode_tokens, row_temperatures, seeded_draws
from ...registry import POLICIES, param
from ..base import PolicyBase, check_own_sampler, fanned_columns, group_identity, repeat_rows, save_pretrained_folder

BUILT_IN = ("tiny",)


def check_vlm(cfg) -> None:
    """What drives a text-only causal LM cannot drive this one: a text generation engine (vLLM here runs text
    models only), rollout strategies other than ``plain`` (hints, injected text and tools continue a prompt
    without its pictures), ``top_k`` / ``top_p`` (the sampler draws from the full softmax)."""
    check_own_sampler(cfg, "shows pictures that those rollouts would not carry")


@POLICIES.register("vision_language", check=check_vlm)
class VisionLanguagePolicy(PolicyBase):
    """A vision-language model (``transformers`` ``AutoModelForImageTextToText``, e.g. LLaVA) with its processor:
    completions sampled token by token from a prompt that holds the row's pictures.

    Conditions (TRL's VLM convention, ``policies/vision_language/prompts.py``): a row's ``prompt`` (chat messages or a string) and its
    pictures: ``images`` (a list), ``image`` (one), or a built-in synthetic scene (``scene_kind`` + ``scene_seed``,
    ``policies/vision_language/scenes.py``). One image placeholder per picture goes before the first user message's text; the
    processor's chat template writes the prompt and expands each placeholder into the model's image tokens.
    ``prompt_ids`` hold the prompt with its image tokens (left-padded); the pictures' tensors travel in
    ``row_data`` in the model family's layout (``policies/vision_language/layouts.py``): LLaVA's
    ``pixel_values`` [R, k, 3, H, W] (k pictures per row, the same for every row of a run), Idefics3 / SmolVLM's
    tiles with their ``pixel_attention_mask``, Qwen2-VL / Qwen2.5-VL's flattened patches with ``image_grid_thw``
    (these two: any number of pictures per row).

    Acting: the prompt (with its pictures) runs once per row, then each action continues its own copy of the row's
    KV cache one token at a time, each token drawn from softmax(logits / τ) at the run's ``temperature`` from the
    run's generator; behaviour log-prob log softmax(logits / τ)[o_t]. Held-out evaluation
    (``vlm_eval_sampling``): ``greedy`` (the default: argmax) or ``seeded`` (draws at the run's temperature by
    inverse CDF from uniforms of a generator seeded with the row's ``scene_seed``: the same draws before and after
    training, whatever the batch; it measures the sampling distribution RL trains). The completion runs to the
    first EOS included (``completion_mask`` 1 there, 0 after) or
    ``max_completion_length`` tokens (``truncated``). ``columns["completion"]`` is the decoded text (special tokens
    other than tags dropped); ``columns["uncertainty"]`` is PixelThink's per-response uncertainty (seed 000-116): the
    mean over the response's tokens of 1 − (p₁ − p₂), the two largest probabilities of the untempered softmax.
    Position ids count each row's real tokens (0 at its first), in sampling and in :meth:`forward` alike (Qwen2-VL:
    the model's mRoPE ids from ``get_rope_index``, each sampled token one further on every axis).

    ``forward``: the model on prompt + completion with the pictures, log softmax(logits / τ) at each completion
    token: equal to the behaviour log-probs (tests/test_vision.py::test_recomputed_logprobs_equal_behaviour);
    ``entropy`` of that softmax per token.

    Model ``tiny`` (the default): LLaVA (CLIP ViT 2 layers + Llama 2 layers, width 64) with a character tokenizer,
    pre-trained in-process on the run's task and cached (``policies/vision_language/tiny.py``); or a folder with a model and its
    processor (``save_pretrained``: LLaVA, Idefics3 / SmolVLM, Qwen2-VL / Qwen2.5-VL; tests/test_vlm_models.py).
    A real VLM on a GPU: docs/vision.md.

    Capabilities: ``tokens``, ``text`` (text reward functions on the decoded completion) and ``vision``.

    Provenance: grpolab's own — the VLM policy of TRL's GRPOTrainer convention (``trl/trainer/grpo_trainer.py``:
    an image column next to a conversational prompt, the processor applies the chat template, the pictures'
    tensors are passed to every forward), written here for grpolab's policy interface.
    """

    step = "token"
    capabilities = frozenset({"tokens", "text", "vision"})
    description = "a vision-language model (image-text-to-text, e.g. LLaVA); one step = one token"
    default_model = "tiny"
    default_task = "shape_grounding"
    float32_only = True  # the tiny model (instances loading a folder: False): the same numbers on every CPU kind

    def __init__(self, *, model: str, task: str, temperature: float, max_completion_length: int,
                 max_prompt_length: int,
                 vlm_eval_sampling: str = param("greedy", "vision_language: held-out evaluation decoding: 'greedy' = "
                                                "argmax; 'seeded' = draws at the run's temperature from each row's "
                                                "own seed (scene_seed), the same draws before and after training",
                                                ["greedy", "seeded"]),
                 vlm_pretrain_steps: int = param(0, "vision_language: pre-training steps of the built-in tiny VLM "
                                                  "(model tiny); 0 = the task's tuned count (fewer: quick smoke "
                                                  "runs from random weights on at most steps x 64 examples, a "
                                                  "separate cache entry)")):
        self.model_name, self.task_name = model, task
        self.temperature = float(temperature)
        self.max_completion_length, self.max_prompt_length = int(max_completion_length), int(max_prompt_length)
        if vlm_eval_sampling not in ("greedy", "seeded"):
            raise ConfigError(f"vlm_eval_sampling: 'greedy' or 'seeded', got {vlm_eval_sampling!r}")
        self.eval_sampling = vlm_eval_sampling
        self.processor = None
        self.float32_only = model in BUILT_IN  # a loaded folder runs in the run's dtype (bf16 on a GPU)
        self.pretrain_steps = int(vlm_pretrain_steps)
        self.image_token_id: int | None = None
        from .layouts import LAYOUTS
        self.layout = LAYOUTS["stacked"]  # the built-in tiny LLaVA's; load() sets the folder's

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    # ---------------------------------------------------------------- loading
    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``tiny`` (pre-trained on the run's task on first use, cached) or a model folder with its
        processor."""
        from transformers import AutoModelForImageTextToText

        from .layouts import LAYOUTS, layout_for, load_processor
        from .scenes import row_images
        from .tiny import vlm_model_path

        if self.model_name not in BUILT_IN and not (Path(self.model_name) / "config.json").exists():
            raise ConfigError(f"model: policy vision_language loads 'tiny' (the built-in tiny VLM) or a model "
                              f"folder with its processor; {self.model_name} has no config.json")
        self.layout = LAYOUTS["stacked"] if self.model_name in BUILT_IN else layout_for(
            _folder_config(Path(self.model_name)))
        counts = set()
        for where, part in (("train", rows), ("held-out", eval_rows)):
            for i, row in enumerate(part[:200]):
                try:
                    counts.add(len(row_images(row, f"{where} row {i}")))
                except ValueError as e:
                    raise ConfigError(str(e)) from None
        if len(counts) > 1 and self.layout.same_count:
            raise ConfigError(f"data: every row must show the same number of pictures (LLaVA stacks them); the rows "
                              f"show {sorted(counts)}")
        if self.model_name in BUILT_IN:
            from .tiny import BACKBONE_TASK, PRETRAINING
            task = self.task_name if isinstance(self.task_name, str) else ""
            if task not in PRETRAINING:  # the user's own data: the backbone (it sees shapes, colours, positions)
                log(f"[grpolab] model tiny: task {task!r} registers no pre-training examples (vision tasks that "
                    f"do: {sorted(PRETRAINING)}); using the {BACKBONE_TASK} backbone")
                task = BACKBONE_TASK
            path = vlm_model_path(task, self.pretrain_steps, log=log)
        else:
            path = Path(self.model_name)
        self.processor = load_processor(path)
        self.tokenizer = getattr(self.processor, "tokenizer", None)
        if self.tokenizer is None:
            raise ConfigError(f"model: {path} has no processor with a tokenizer (policy vision_language needs an "
                              f"image-text-to-text model folder: AutoProcessor + AutoModelForImageTextToText)")
        if self.tokenizer.pad_token_id is None:  # as TRL: pad with EOS
            self.tokenizer.pad_token = self.tokenizer.eos_token
        module = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
        module.config.use_cache = True
        self.use_loaded(module, self.processor)
        return module

    def use_loaded(self, module, processor) -> None:
        """Act with ``module`` and ``processor`` (a folder's, or the Python API's loaded pair): the tokenizer,
        the image token and the picture layout of the model's family (``layouts.py``)."""
        from .layouts import layout_for
        self.processor, self.tokenizer = processor, processor.tokenizer
        self.layout = layout_for(module.config)
        image_token = getattr(module.config, "image_token_id", None)
        self.image_token_id = getattr(module.config, "image_token_index", None) if image_token is None else image_token

    def save(self, module, path) -> None:
        """``save_pretrained`` of the model and the processor: ``--model PATH`` loads it."""
        save_pretrained_folder(module, path, self.processor)

    # ---------------------------------------------------------------- acting
    def _encode(self, rows):
        """``(input_ids, attention_mask, row data)``: the prompts with their image tokens and each row's picture
        tensors in the model family's layout (``policies/vision_language/layouts.py``)."""
        from .prompts import encode_prompts
        layout = self.layout
        try:
            enc = encode_prompts(self.processor, rows, self.max_prompt_length, same_count=layout.same_count,
                                 nested=layout.name == "split")
            data = layout.row_data(enc["outputs"], len(rows), self.image_token_id)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return enc["input_ids"], enc["attention_mask"], data

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        """Up to ``max_completion_length`` tokens per action with a KV cache (class docstring)."""
        from ...batch import RolloutBatch

        if self.processor is None:
            raise RuntimeError("policy vision_language: load() the model before sampling")
        counts = completion_counts(num_generations, len(rows))
        R = sum(counts)
        device = next(module.parameters()).device
        ids_u, am_u, data_u = self._encode(rows)
        index = repeat_rows(torch.arange(len(rows)), counts)  # action i continues row index[i]
        ids, am, data = ids_u[index], am_u[index], {k: v[index] for k, v in data_u.items()}
        temps = row_temperatures(temperature if temperature is not None else self.temperature, counts)
        greedy, uniforms, T = temps <= 0, None, self.max_completion_length
        if evaluation and self.eval_sampling == "seeded":  # each row's uniforms from its own seed: its draws do not
            seeds = [int(r["scene_seed"]) if r.get("scene_seed") is not None else int(u)  # depend on the batch
                     for r, u in zip(rows, uids)]
            temps, greedy, uniforms = seeded_draws(seeds, counts, T, self.temperature)
        ids_u, am_u = ids_u.to(device), am_u.to(device)  # the prompts run once per row; each of its actions
        inputs = self.layout.inputs(module, ids_u, am_u, {k: v.to(device) for k, v in data_u.items()},  # continues
                                    self.image_token_id)                                        # its cache entry
        o = module(input_ids=ids_u, attention_mask=am_u, use_cache=True, **inputs)
        past = o.past_key_values
        past.reorder_cache(index.to(device))
        pos = self.layout.last_positions(inputs["position_ids"])[..., index.to(device), :]
        first, am_d = self._logits(o.logits[:, -1]).cpu()[index], am.to(device)
        ckw = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"

        def next_logits(fed):
            nonlocal past, am_d, pos
            if fed is None:
                return first
            am_d = torch.cat([am_d, torch.ones(R, 1, dtype=am_d.dtype, device=device)], 1)
            pos = self.layout.next_positions(pos)
            o = module(input_ids=fed[:, None].to(device), attention_mask=am_d, position_ids=pos, use_cache=True,
                       **{ckw: past})
            past = o.past_key_values
            return self._logits(o.logits[:, -1]).cpu()

        unc = torch.zeros(R, T)

        def uncertainty(t, logits, live):  # PixelThink's 1 - (p1 - p2) of the untempered softmax
            top2 = torch.softmax(logits, -1).topk(2, dim=-1).values
            unc[live, t] = (1.0 - (top2[live, 0] - top2[live, 1])).clamp(0, 1)

        out, lps, cmask, done = decode_tokens(next_logits, R, T, eos=self.tokenizer.eos_token_id,
                                              pad=self.tokenizer.pad_token_id, temps=temps, greedy=greedy,
                                              temperature=max(self.temperature, 1e-6), generator=generator,
                                              uniforms=uniforms, observe=uncertainty)
        columns = fanned_columns(rows, counts)
        for k in ("image", "images"):
            columns.pop(k, None)
        columns["completion"] = self.tokenizer.batch_decode(
            [o_[m > 0].tolist() for o_, m in zip(out, cmask)], skip_special_tokens=False)
        columns["completion"] = [self.text(c) for c in columns["completion"]]
        n = cmask.sum(-1).clamp_min(1)
        columns["uncertainty"] = ((unc * cmask).sum(-1) / n).tolist()
        return RolloutBatch(
            prompt_ids=ids, prompt_mask=am, completion_ids=out, completion_mask=cmask,
            behavior_logprobs=lps * cmask, completion_attention_mask=cmask.long(), truncated=~done,
            columns=columns, row_data=data, **group_identity(counts, uids, group_offset))

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        """float32 logits with the image placeholder token excluded (-inf): a completion never writes one, in
        sampling and in :meth:`forward` alike (its log-probs are over the same support)."""
        logits = logits.float()
        if self.image_token_id is not None and 0 <= self.image_token_id < logits.shape[-1]:
            logits = logits.clone()
            logits[..., self.image_token_id] = float("-inf")
        return logits

    def text(self, decoded: str) -> str:
        """The completion's text: special tokens (pad, EOS, BOS, image, unknown) dropped, tags kept."""
        tok = self.tokenizer
        for s in {tok.pad_token, tok.eos_token, tok.bos_token, tok.unk_token, "<image>"} - {None}:
            decoded = decoded.replace(s, "")
        return decoded

    def perturb_inputs(self, row: dict, strength: float, generator: torch.Generator) -> dict:
        """DeepVideo-R1's frame-level Gaussian noise (seed 000-04): a copy of ``row`` with ``frame_noise_std =
        strength`` (pixel-value std ``255 strength``) and a ``frame_noise_seed`` drawn from ``generator``; every
        picture of the row is then rendered noisy (:func:`~grpolab.policies.vision_language.scenes.noisy_frames`)."""
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator))
        return {**row, "frame_noise_std": float(strength), "frame_noise_seed": seed}

    def offers(self) -> frozenset[str]:
        """``entropy`` / ``entropy_grad`` of softmax(logits / τ) per token."""
        return frozenset({"entropy", "entropy_grad"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """``logprobs`` [R, T] of ``mb``'s completion tokens: the model on prompt + completion with the pictures."""
        device = next(module.parameters()).device
        P = mb.prompt_ids.shape[1]
        ids = torch.cat([mb.prompt_ids, mb.completion_ids], 1).to(device)
        am = torch.cat([mb.prompt_mask, torch.ones_like(mb.completion_ids)], 1).to(device)
        data = {k: v.to(device) for k, v in mb.row_data.items() if k in _PICTURE_KEYS}
        with torch.set_grad_enabled(grad):
            inputs = self.layout.inputs(module, ids, am, data, self.image_token_id)
            logits = module(input_ids=ids, attention_mask=am, use_cache=False, **inputs).logits[:, P - 1:-1]
            logits = self._logits(logits)
            logp_all = torch.log_softmax(logits / max(self.temperature, 1e-6), -1)
            out = {"logprobs": logp_all.gather(-1, mb.completion_ids.to(device)[..., None])[..., 0]}
            if want & {"entropy", "entropy_grad"}:
                finite = logp_all.masked_fill(torch.isinf(logp_all), 0.0)  # the excluded image token: 0 · log 0 = 0
                ent = -(logp_all.exp() * finite).sum(-1)
                out["entropy"], out["entropy_grad"] = ent.detach(), ent
        return out

    def describe(self, batch, i: int) -> dict:
        """The prompt's text, the completion, and the row's pictures as one PNG strip (``picture``, a data URI,
        4 px per pixel) for the completions log and the report."""
        from ...media import grid_png, png_data_uri

        prompt = batch.columns.get("prompt")
        pics = self.layout.pictures(batch.row_data, i, self.processor).float()  # [k, 3, H, W], normalised
        ip = getattr(self.processor, "image_processor", None)
        mean, std = getattr(ip, "image_mean", None), getattr(ip, "image_std", None)
        if mean is not None and std is not None:  # undo (x - mean) / std
            x01 = pics * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]
        else:
            lo, hi = pics.amin(dim=(1, 2, 3), keepdim=True), pics.amax(dim=(1, 2, 3), keepdim=True)
            x01 = (pics - lo) / (hi - lo).clamp_min(1e-6)
        return {"prompt": prompt_text(prompt[i]) if prompt is not None else "",
                "completion": str(batch.columns["completion"][i]),
                "picture": png_data_uri(grid_png(x01, 1, len(x01), scale=4, pad=1))}


_PICTURE_KEYS = ("pixel_values", "pixel_attention_mask", "image_grid_thw")


def _folder_config(path: Path):
    """A model folder's config (``AutoConfig``), for its layout before the weights load."""
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model: {path}/config.json could not be read ({e})") from None


def prompt_text(prompt) -> str:
    """A prompt's text: a string as is; chat messages' text blocks joined (pictures as ``[image]``)."""
    if isinstance(prompt, str):
        return prompt
    parts = []
    for m in prompt or []:
        c = m.get("content") if isinstance(m, dict) else m
        if isinstance(c, str):
            parts.append(c)
        else:
            parts += ["[image]" if b.get("type") == "image" else str(b.get("text", "")) for b in c or []]
    return " ".join(parts)
