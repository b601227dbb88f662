"""A masked diffusion language model (LLaDA-style): bidirectional, decoded by iterative block-wise unmasking; one
step of the ``[rows, steps]`` layout is one completion token, its log-prob an estimate (``policies/masked_diffusion_lm/estimators.py``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ...config import ConfigError
from .estimators import ESTIMATORS, masked_entropy
from .sampler import denoise, schedule
from .tiny import dlm_model_path, encode_prompts, position_ids, prompt_text
from ...generation.counting import GENERATED
from ...generation.sampling import completion_counts, per_row
from ...registry import POLICIES, param
from ..base import PolicyBase, fanned_columns, group_identity, repeat_rows, save_pretrained_folder, saved_folder

BUILT_IN = ("repeat", "tiny")


def check_masked_dlm(cfg) -> None:
    """The text components that go through a causal LM's generation cannot drive a masked diffusion LM: a text
    generation engine, and rollout strategies other than ``plain`` (hints, injected text, tools and agent
    episodes continue a causal prefix)."""
    if cfg.rollout_strategy != "plain":
        raise ConfigError(f"rollout_strategy: '{cfg.rollout_strategy}' continues a causal prefix (hints, injected "
                          f"text, tools); policy masked_diffusion_lm samples whole completions by unmasking: use "
                          f"rollout_strategy: plain")


SHIFTED_MODEL_TYPES = ("dream",)  # config.json model_type of the dLLMs whose logits at i predict token i+1


def shifted(logits: torch.Tensor) -> torch.Tensor:
    """Dream's logits as its sampler reads them: the model (adapted from an autoregressive LM) predicts token i+1 at
    position i, so the logits for position i are the model's at i-1, the first position keeping its own:
    ``cat([logits[:, :1], logits[:, :-1]], 1)``.

    Provenance: authors' code — Dream's model folder (Dream-org/Dream-v0-Instruct-7B, the remote code its
    authors ship), generation_utils.py (``DreamGenerationMixin._sample``: ``logits = torch.cat([logits[:,:1],
    logits[:, :-1]], dim=1)`` before reading the masked positions; read in a copy of that file). Test:
    tests/test_dllm.py::test_a_dream_style_folder_reads_shifted_logits_without_dllm_json.
    """
    return torch.cat([logits[:, :1], logits[:, :-1]], 1)


def folder_settings(path: Path, wanted: dict, trust: bool, shift: str) -> tuple[bool, dict, bool]:
    """``(trust_remote_code, shape, shift_logits)`` of a model folder. ``shape`` (``gen_length``, ``block_length``,
    ``steps``, and ``mask_id`` when the tokenizer may declare none) comes from ``dllm.json`` where there is one,
    overridden by the ``dllm_*`` keys given (``wanted``, 0 = not given); ``mask_id`` else from ``config.json``'s
    ``mask_token_id`` (Dream's and LLaDA's configs declare it). The logits are shifted (:func:`shifted`) for
    ``dllm_shift_logits: true``, or with ``auto`` where dllm.json says ``shift_logits`` or ``config.json``'s
    ``model_type`` is Dream's. Without dllm.json the three sampler keys must be given."""
    own = json.loads((path / "dllm.json").read_text()) if (path / "dllm.json").is_file() else {}
    conf = json.loads((path / "config.json").read_text())
    shape = {**own, **{k: int(v) for k, v in wanted.items() if v}}
    missing = [k for k in ("gen_length", "block_length", "steps") if k not in shape]
    if missing:
        raise ConfigError(f"model: {path} has no dllm.json and the sampler's {', '.join(missing)} are not given: set "
                          f"{', '.join('dllm_' + k for k in missing)} (d1 samples LLaDA with 256, 32, 128), or write "
                          f"dllm.json {{\"gen_length\": .., \"block_length\": .., \"steps\": ..}} in the folder")
    if "mask_id" not in shape and conf.get("mask_token_id") is not None:
        shape["mask_id"] = int(conf["mask_token_id"])
    remote = trust or bool(own.get("trust_remote_code", False))
    if "auto_map" in conf and not remote and str(conf.get("model_type", "")).lower() not in _native_types():
        raise ConfigError(f"model: {path} ships its own model class (config.json auto_map, model_type "
                          f"{conf.get('model_type')!r}); to run its code set dllm_trust_remote_code: true")
    if shift == "auto":
        on = bool(own.get("shift_logits", str(conf.get("model_type", "")).lower() in SHIFTED_MODEL_TYPES))
    else:
        on = shift == "true"
    if on:
        shape["shift_logits"] = True
    else:
        shape.pop("shift_logits", None)
    return remote, shape, on


def _native_types() -> set[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return set(CONFIG_MAPPING_NAMES)


@POLICIES.register("masked_diffusion_lm", check=check_masked_dlm)
class MaskedDiffusionLM(PolicyBase):
    """A masked diffusion LM over text (LLaDA's formulation on a ``transformers`` ``*ForMaskedLM``).

    Acting: the prompt's text (``dllm.tiny.prompt_text``: a chat's last user message), left-padded, then L =
    ``dllm_gen_length`` mask tokens, decoded by LLaDA's block-wise low-confidence remasking
    (``dllm.sampler.denoise``: ``dllm_block_length`` blocks left to right, ``dllm_steps`` steps in all, a fixed
    number of tokens unmasked per step, the most confident ones, candidates drawn with Gumbel noise at the run's
    ``temperature``). Held-out evaluation decodes greedily (temperature 0), as text does. The completion is the
    L tokens; ``completion_mask`` is 1 up to and including the first ``<eos>`` (d1's mask), the text is what
    precedes it; no ``<eos>`` = ``truncated``. ``row_data["step_map"]`` [R, L]: the global denoising step at
    which each token was unmasked; ``row_data["completion_full"]`` [R, L]: all L tokens (a micro-batch's columns
    past the last ``<eos>`` are trimmed, and the bidirectional model reads them); ``row_data["mask_seed"]`` [R]:
    the row's mask seed (drawn from the run's generator); ``step_data["sampler_logprobs"]``: log softmax(logits/τ)
    of the drawn token at its step.

    Log-probs: the likelihood is intractable; ``dllm_logprob`` picks the estimator (``policies/masked_diffusion_lm/estimators.py``:
    ``onestep``, d1's one-step unmasking; ``elbo_mc``, the ELBO by double Monte Carlo; ``elbo_sdmc``, GDPO's
    semi-deterministic Monte Carlo; ``step_replay``, DiPO's replay of the step map). Behaviour (old), reference and current log-probs of a
    batch all use the row's ``mask_seed``, so the ratio is exactly 1 before the first optimiser step and compares
    like with like afterwards. With the standard update every inner pass (``num_iterations``) reuses the rows'
    seeds; d1 redraws them at each pass, with old and reference log-probs recomputed under them: update strategy
    ``mask_reseed`` (``policies/masked_diffusion_lm/stages_mask_reseed.py``, recipe ``diffu_grpo``). ``forward`` always scores the full L tokens (``completion_full``).

    Model ``repeat`` / ``tiny`` (the default): a character-level ``BertForMaskedLM`` (hidden 64, 2 layers, 4
    heads, no dropout) pre-trained in-process on first use (``policies/masked_diffusion_lm/tiny.py``: LLaDA's SFT loss on the ``repeat``
    task's prompts with answers of random length 1-4, 200 steps, about 10 s on one thread, cached in
    ``$GRPOLAB_CACHE/repeat-dlm-<hash>``); L = 8, 2 blocks of 4, 4 steps. Base held-out greedy ``match`` = 0.44
    on the repeat task's 40 held-out rows [measured]. A folder saved by :meth:`save` (``save_pretrained`` of model and tokenizer + ``dllm.json``) loads
    as well; a real dLLM is docs/dllm.md (untested here).

    Capabilities: ``tokens`` and ``text`` (completions decode to text: text tasks and reward functions apply);
    the text components that continue a causal prefix are refused at start-up (:func:`check_masked_dlm`).
    ``forward`` offers ``entropy`` / ``entropy_grad``: the vocabulary entropy per completion position with the
    whole completion masked (:func:`~grpolab.policies.masked_diffusion_lm.estimators.masked_entropy`), for entropy terms and the metric.

    Provenance: grpolab's own — a tiny stand-in for LLaDA-8B (ML-GSAI/LLaDA generate.py) as d1 trains it
    (dllm-reasoning/d1, diffu-grpo/diffu_grpo_trainer.py: ``generate``, the completion mask at the first EOS).
    Test: tests/test_dllm.py::test_sampler_schedule_and_step_map, tests/test_dllm.py::test_ratio_is_one_before_the_first_update.
    """

    step = "a completion token"
    capabilities = frozenset({"tokens", "text"})
    description = "a masked diffusion LM (bidirectional, block-wise unmasking); one step = a completion token"
    default_model = "repeat"
    default_task = "repeat"
    # float32 whatever the dtype key: the same numbers on AVX2 and AVX512-BF16 CPUs, and the ELBO estimators'
    # 1/p weights (up to 1000) would magnify bfloat16 rounding (an 8B dLLM on a GPU would want this lifted)
    float32_only = True
    uses_mask_seeds = True  # row_data["mask_seed"] drives the estimators (update strategy mask_reseed redraws it)

    def __init__(self, *, model: str, temperature: float,
                 dllm_logprob: str = param("onestep", "masked_diffusion_lm: the per-token log-prob estimator: "
                                           "'onestep' (d1: every completion token masked, one forward), "
                                           "'elbo_mc' (the ELBO by double Monte Carlo), 'elbo_sdmc' (GDPO: "
                                           "quadrature in t, masks drawn) or 'step_replay' (DiPO: the sampler's "
                                           "step map replayed)", ["onestep", "elbo_mc", "elbo_sdmc", "step_replay"]),
                 p_mask_prompt: float = param(0.15, "masked_diffusion_lm onestep: probability of masking each "
                                              "prompt token in the log-prob forward (d1's p_mask_prompt)"),
                 dllm_elbo_samples: int = param(4, "masked_diffusion_lm elbo_mc / elbo_sdmc: Monte Carlo samples "
                                                "(t, mask), or quadrature nodes, per row = forwards per log-prob"),
                 dllm_gen_length: int = param(0, "masked_diffusion_lm: completion length L in tokens (0 = the "
                                              "model's dllm.json)"),
                 dllm_block_length: int = param(0, "masked_diffusion_lm: block length of the sampler (0 = the "
                                                "model's)"),
                 dllm_steps: int = param(0, "masked_diffusion_lm: denoising steps over the whole completion (0 = "
                                         "the model's)"),
                 dllm_trust_remote_code: bool = param(False, "masked_diffusion_lm: load a --model folder's own "
                                                      "model class (its config.json auto_map, as LLaDA and Dream "
                                                      "ship) through AutoModel; dllm.json 'trust_remote_code' "
                                                      "says the same"),
                 dllm_shift_logits: str = param("auto", "masked_diffusion_lm: 'auto' (shift where the folder is a "
                                                "Dream model, config.json model_type Dream), 'true' or 'false': "
                                                "the logits at position i predict token i+1 and are moved right "
                                                "by one, as Dream's generation_utils does",
                                                ["auto", "true", "false"])):
        if dllm_logprob not in ESTIMATORS:
            raise ConfigError(f"dllm_logprob: one of {sorted(ESTIMATORS)}, got {dllm_logprob!r}")
        if not 0.0 <= p_mask_prompt <= 1.0:
            raise ConfigError(f"p_mask_prompt: a probability in [0, 1], got {p_mask_prompt}")
        if dllm_elbo_samples < 1:
            raise ConfigError(f"dllm_elbo_samples: >= 1, got {dllm_elbo_samples}")
        self.model_name, self.temperature = model, float(temperature)
        self.estimator = dllm_logprob
        self.estimator_params = {"p_mask_prompt": float(p_mask_prompt), "elbo_samples": int(dllm_elbo_samples)}
        self.wanted = {"gen_length": dllm_gen_length, "block_length": dllm_block_length, "steps": dllm_steps}
        self.trust_remote_code, self.shift_setting = bool(dllm_trust_remote_code), str(dllm_shift_logits).lower()
        if self.shift_setting not in ("auto", "true", "false"):
            raise ConfigError(f"dllm_shift_logits: one of auto, true, false, got {dllm_shift_logits!r}")
        self.shape: dict = {}
        self.shift_logits = False  # set by load(): Dream's logits at i predict token i+1 (shift_logits)
        self.takes_positions = True  # set by load(): whether the model's forward takes position_ids

    @property
    def pad_id(self) -> int:
        return self.tokenizer.eos_token_id if self.tokenizer is not None else 2

    @property
    def mask_id(self) -> int:
        """The tokenizer's mask token, else the folder's ``config.json`` ``mask_token_id`` (Dream, LLaDA), else
        ``mask_id`` of ``dllm.json`` (set at load)."""
        tid = self.tokenizer.mask_token_id
        return int(self.shape["mask_id"]) if tid is None else tid

    # ---------------------------------------------------------------- loading
    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``repeat`` / ``tiny`` (the built-in model, pre-trained on first use and cached) or a folder: a
        ``transformers`` masked LM (``AutoModelForMaskedLM``) or, with ``dllm_trust_remote_code`` (or dllm.json
        ``trust_remote_code``), the folder's own class through ``AutoModel`` (LLaDA's ``LLaDAModelLM``, Dream's
        ``DreamModel``); a tokenizer with an eos token. What the folder says itself is read from it
        (:func:`folder_settings`); ``dllm.json`` is needed only for what it cannot say (docs/dllm.md)."""
        import inspect

        from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

        if self.model_name in BUILT_IN:
            path = dlm_model_path(log=log)
        else:
            path = saved_folder(self.model_name, "masked_diffusion_lm", ("config.json",),
                                "'repeat' (the built-in tiny model) or a folder (config.json + safetensors, a "
                                "tokenizer; dllm.json where the folder cannot say the sampler's shape)")
        remote, self.shape, self.shift_logits = folder_settings(Path(path), self.wanted, self.trust_remote_code,
                                                                self.shift_setting)
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=remote)
        if self.tokenizer.mask_token_id is None and "mask_id" not in self.shape or self.tokenizer.eos_token_id is None:
            raise ConfigError(f"model: the tokenizer in {path} needs an eos token and a mask token (or config.json "
                              f"'mask_token_id', or dllm.json 'mask_id')")
        schedule(self.shape["gen_length"], self.shape["block_length"], self.shape["steps"])  # validates
        cls = AutoModel if remote else AutoModelForMaskedLM
        module = cls.from_pretrained(path, torch_dtype=torch.float32, trust_remote_code=remote).eval()
        # positions over real tokens when the model takes them (BERT-style absolute positions); else its own
        self.takes_positions = "position_ids" in inspect.signature(module.forward).parameters
        return module

    def save(self, module, path) -> None:
        """``save_pretrained`` of the model and the tokenizer, and ``dllm.json`` (L, block, steps)."""
        path = save_pretrained_folder(module, path, self.tokenizer)
        (path / "dllm.json").write_text(json.dumps(self.shape, indent=2) + "\n")

    # ---------------------------------------------------------------- acting
    def logits_fn(self, module):
        """``(ids, attn) -> logits`` with positions counted over real tokens (left padding moves none) when the
        model's forward takes ``position_ids``; moved right by one (:func:`shifted`) for a Dream-style model."""
        dev = next(module.parameters()).device
        takes = self.takes_positions

        shift = self.shift_logits

        def fn(ids, attn):
            ids, attn = ids.to(dev), attn.to(dev)
            kw = {"position_ids": position_ids(attn)} if takes else {}
            logits = module(input_ids=ids, attention_mask=attn, **kw).logits.cpu()
            return shifted(logits) if shift else logits
        return fn

    def estimate(self, module, prompt_ids, prompt_mask, row_data, width: int | None = None) -> torch.Tensor:
        """Per-token log-prob estimates ``[R, width]`` (``dllm_logprob``) of the full L-token completions
        ``row_data["completion_full"]`` with the rows' ``mask_seed`` (and ``step_map``)."""
        completion = row_data["completion_full"].cpu()
        ids = torch.cat([prompt_ids.cpu(), completion], 1)
        attn = torch.cat([prompt_mask.cpu(), torch.ones_like(completion)], 1)
        out = ESTIMATORS[self.estimator](self.logits_fn(module), ids, attn, prompt_ids.shape[1], self.mask_id,
                                         row_data["mask_seed"].cpu(), step_map=row_data["step_map"].cpu(),
                                         temperature=self.temperature, **self.estimator_params)
        return out[:, :width]

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        """G completions per row by :func:`~grpolab.policies.masked_diffusion_lm.sampler.denoise`; behaviour log-probs by the estimator
        under ``module`` with each row's mask seed (evaluation: the sampler's own log-probs, nothing trains on
        them). The generated-token tally (budgets, ``grpolab compare`` at equal tokens) counts all L positions of
        each completion: the sampler draws them all, the ones after the eos included."""
        from ...batch import RolloutBatch

        if not self.shape:
            raise RuntimeError("policy masked_diffusion_lm: load() the model before sampling")
        counts = completion_counts(num_generations, len(rows))
        R = sum(counts)
        prompt, pmask = encode_prompts(self.tokenizer, [r["prompt"] for r in rows])
        prompt, pmask = repeat_rows(prompt, counts), repeat_rows(pmask, counts)
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        temp = 0.0 if evaluation else (self.temperature if temperature is None else float(temperature))
        ids, step_map, slp = denoise(self.logits_fn(module), prompt, pmask, gen_length=self.shape["gen_length"],
                                     block_length=self.shape["block_length"], steps=self.shape["steps"],
                                     temperature=temp, mask_id=self.mask_id, generator=gen)
        GENERATED.add(R, R * ids.shape[1])  # every one of the L positions is drawn, past the eos too
        seeds = torch.randint(0, 2 ** 31 - 1, (R,), generator=gen)
        eos = ids == self.tokenizer.eos_token_id
        has = eos.any(-1)
        first = torch.where(has, eos.float().argmax(-1), torch.full((R,), ids.shape[1]))
        cmask = (torch.arange(ids.shape[1])[None] <= first[:, None]).float()
        texts = [self.tokenizer.decode(ids[i, :int(first[i])].tolist()) for i in range(R)]
        row_data = {"mask_seed": seeds, "completion_full": ids.clone(), "step_map": step_map}
        lps = slp if evaluation else self.estimate(module, prompt, pmask, row_data)
        columns = fanned_columns(rows, counts)
        columns["prompt"] = per_row([r["prompt"] for r in rows], counts)
        columns["completion"] = texts
        return RolloutBatch(
            prompt_ids=prompt, prompt_mask=pmask, completion_ids=ids.long(), completion_mask=cmask,
            behavior_logprobs=lps.float() * cmask, completion_attention_mask=torch.ones_like(ids).long(),
            truncated=~has, columns=columns, **group_identity(counts, uids, group_offset),
            step_data={"sampler_logprobs": slp.float()}, row_data=row_data)

    def offers(self) -> frozenset[str]:
        """``entropy`` / ``entropy_grad``: the vocabulary entropy per completion token with the whole completion
        masked (``dllm.estimators.masked_entropy``; one more forward)."""
        return frozenset({"entropy", "entropy_grad"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """``logprobs`` [R, T]: the ``dllm_logprob`` estimate of ``mb``'s tokens under ``module`` with the rows'
        mask seeds (with gradients when ``grad``); ``entropy`` (detached) / ``entropy_grad`` when asked."""
        dev = mb.completion_mask.device
        W = mb.completion_ids.shape[1]
        with torch.set_grad_enabled(grad):
            out = {"logprobs": self.estimate(module, mb.prompt_ids, mb.prompt_mask, mb.row_data, W).to(dev)}
            if want & {"entropy", "entropy_grad"}:
                with torch.set_grad_enabled(grad and "entropy_grad" in want):
                    completion = mb.row_data["completion_full"].cpu()
                    ids = torch.cat([mb.prompt_ids.cpu(), completion], 1)
                    attn = torch.cat([mb.prompt_mask.cpu(), torch.ones_like(completion)], 1)
                    ent = masked_entropy(self.logits_fn(module), ids, attn, mb.prompt_ids.shape[1],
                                         self.mask_id)[:, :W].to(dev)
                out["entropy"], out["entropy_grad"] = ent.detach(), ent
        return out

    def describe(self, batch, i: int) -> dict:
        """The prompt's text and the completion's text."""
        return {"prompt": prompt_text(batch.columns["prompt"][i]), "completion": str(batch.columns["completion"][i])}
