"""The causal language model: the policy every text recipe trains; one step is one token."""
from __future__ import annotations

import copy

from typing import Any

import torch

from ...data import model_texts
from ...generation.plain import plain_rollout
from ...model.logprobs import completion_logprobs, group_token_divergence
from ...errors import ConfigError
from ...registry import POLICIES, param
from ...roles import RoleModels, per_row_adapters
from ..base import PolicyBase


def tag_token_mask(tokenizer, completion_ids, attention_mask, open_tag: str = "<think>",
                   close_tag: str = "</think>"):
    """``[R, T]`` float mask: 1 on the completion tokens whose decoded characters overlap the text between the
    first ``open_tag`` and the ``close_tag`` after it (to the end when it is not closed); 0 elsewhere and on
    rows without ``open_tag``. Token boundaries come from decoding growing prefixes (special tokens kept), so
    they match the text the reward functions read."""
    R, T = completion_ids.shape
    mask = torch.zeros(R, T)
    for i in range(R):
        n = int(attention_mask[i].sum())
        ids = completion_ids[i, :n].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=False)
        o = text.find(open_tag)
        if o < 0:
            continue
        start = o + len(open_tag)
        c = text.find(close_tag, start)
        end = len(text) if c < 0 else c
        prev = 0
        for k in range(n):
            cur = len(tokenizer.decode(ids[:k + 1], skip_special_tokens=False))
            if prev < end and cur > start and cur > prev:
                mask[i, k] = 1.0
            prev = cur
    return mask


RATIO_FREE_LOSSES = ("policy_gradient",)  # losses that never read the behaviour log-probs


def _check_logprob_temperature(cfg) -> None:
    """``logprob_temperature`` other than the sampling temperature scores the training log-probs at another
    temperature than the sampler's behaviour log-probs: only a loss without a ratio (which never reads them) may
    use it."""
    T = float(cfg.params.get("logprob_temperature", 0.0) or 0.0)
    if T and T != float(cfg.temperature) and cfg.policy_loss not in RATIO_FREE_LOSSES:
        raise ConfigError(f"logprob_temperature: {T:g} differs from temperature {cfg.temperature:g}, so the "
                          f"ratio of policy_loss {cfg.policy_loss} would compare two temperatures; use it with "
                          f"policy_loss: {', '.join(RATIO_FREE_LOSSES)} (as MAGRPO), or set logprob_temperature: 0")


@POLICIES.register("causal_lm", check=_check_logprob_temperature)
class CausalLMPolicy(PolicyBase):
    """A causal language model (Hugging Face ``AutoModelForCausalLM``): completions sampled token by token.

    One step is one token: ``completion_ids`` are token ids, the log-prob of step ``t`` is
    ``log softmax(logits_t / temperature)[token_t]``, and :meth:`forward` offers the vocabulary entropy
    ``H_t = -sum_v p_t(v) log p_t(v)`` (``entropy``: without gradient; ``entropy_grad``: with it, for the
    components that differentiate through it). Rows whose prompts are identical share one prompt forward
    (``shared_prefix_forward``, off under activation checkpointing).

    Provenance: grpolab's own — the causal LM of every text GRPO trainer (TRL's GRPOTrainer, verl's actor); the
    log-prob and entropy arithmetic is grpolab/model/logprobs.py, the sampler grpolab/generation/.
    """

    step = "token"
    capabilities = frozenset({"tokens", "text"})
    text_engines = True  # vLLM, Ray workers and compiled decode sample for it
    description = "a causal language model (Hugging Face); one step = one token"

    def __init__(self, *, temperature: float, shared_prefix_forward: bool, gradient_checkpointing: bool,
                 use_lora: bool, lora_r: int, lora_alpha: int, lora_target_modules: list,
                 max_completion_length: int, max_prompt_length: int, top_k: int, top_p: float,
                 sampling_method: str, static_kv_cache: bool, compile_decode: str, tiny_arch: str, seed: int,
                 logprob_temperature: float = param(0.0, "causal_lm: the temperature of the training log-probs, "
                                                    "log softmax(logits / T): 0 = the sampling temperature (TRL's "
                                                    "logits.div_(temperature)); 1.0 = the untempered log_softmax("
                                                    "logits) of CoMLRL's MAGRPO (recipe magrpo); needs a ratio-free "
                                                    "loss (policy_gradient) when it differs from temperature")):
        self.temperature = float(temperature)
        if logprob_temperature < 0:
            raise ConfigError(f"logprob_temperature: >= 0 (0 = the sampling temperature), got {logprob_temperature}")
        # the temperature of every training-side log-prob (policy, reference, entropy); the sampler's behaviour
        # log-probs stay at the sampling temperature
        self.score_temperature = float(logprob_temperature) or self.temperature
        self.max_completion_length, self.max_prompt_length = int(max_completion_length), int(max_prompt_length)
        self.top_k, self.top_p, self.sampling_method = int(top_k), float(top_p), sampling_method
        self.static_cache, self.tiny_arch, self.seed = bool(static_kv_cache), tiny_arch, int(seed)
        self.compile_decode = compile_decode
        # the shared-prefix forward runs the prompt once per group; activation checkpointing re-runs each row
        self.shared_prefix = bool(shared_prefix_forward) and not gradient_checkpointing
        self.shared_prefix_no_grad = bool(shared_prefix_forward)  # nothing is checkpointed without gradients
        self.checkpointing = bool(gradient_checkpointing)
        self.lora = (int(lora_r), int(lora_alpha), list(lora_target_modules)) if use_lora else None
        # named LoRA adapters a rollout asks for (a team with role_adapters lora: one per role, grpolab/roles.py);
        # the trainer sets them before prepare()
        self.adapters: list[str] = []
        self.role_models: list[str] = []  # role_adapters separate: one copy of the model per role, made in prepare()

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``cfg.model``: ``smollm2``, ``tiny`` (a small model built from a config, its vocabulary from the data's
        text and ``extra_texts``) or a local folder / hub name (grpolab/model/loading.py)."""
        from ...model.loading import load_policy
        texts = model_texts(rows + eval_rows) + list(extra_texts)
        model, self.tokenizer = load_policy(cfg.model, task_texts=texts, tiny_arch=self.tiny_arch, seed=self.seed,
                                            log=log)
        if self.static_cache:  # the decode step compiled or not, and why (logged once per process)
            from ...generation.fast_decode import configure_compile
            self.compile_decode_reason = configure_compile(self.compile_decode, log=log)
        return model

    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature, generator=None,
               evaluation=False):
        """Completions by the KV-cache sampler (grpolab/generation/), stopped at EOS or
        ``max_completion_length``; ``columns["completion"]`` is the decoded text (a message list for chat
        prompts). Training draws use the run's ``top_k`` / ``top_p`` / ``sampling_method`` /
        ``static_kv_cache``; ``evaluation`` draws (greedy at ``temperature`` 0, or pass@k) the plain
        temperature sampler, the same for every run."""
        if evaluation:
            return plain_rollout(module, self.tokenizer, rows, uids, num_generations=num_generations,
                                 max_completion_length=self.max_completion_length,
                                 max_prompt_length=self.max_prompt_length, temperature=temperature,
                                 generator=generator, group_offset=group_offset)
        return plain_rollout(module, self.tokenizer, rows, uids, num_generations=num_generations,
                             max_completion_length=self.max_completion_length,
                             max_prompt_length=self.max_prompt_length, temperature=temperature,
                             top_k=self.top_k, top_p=self.top_p, generator=generator, group_offset=group_offset,
                             sampling_method=self.sampling_method, static_cache=self.static_cache)

    def save(self, module, path) -> None:
        """Weights as safetensors plus config and tokenizer (``save_pretrained``): a Hugging Face model folder."""
        from ...model.loading import save_policy
        save_policy(module, self.tokenizer, path)

    def describe(self, batch, i: int) -> dict:
        """The prompt and completion tokens decoded (special tokens dropped)."""
        p = batch.prompt_ids[i][batch.prompt_mask[i] > 0]
        c = batch.completion_ids[i][batch.completion_attention_mask[i] > 0]
        return {"prompt": self.tokenizer.decode(p, skip_special_tokens=True),
                "completion": self.tokenizer.decode(c, skip_special_tokens=True)}

    def advantage_inputs(self, module, batch, want: frozenset[str], *, micro_batch_size: int,
                         max_tokens: int = 0) -> dict:
        """Inputs of advantage components that need the model: ``token_group_divergence`` [R, T] (TW-GRPO's
        per-token divergence across the group's completions, grpolab/model/logprobs.py); ``token_entropy``
        [R, T] (the vocabulary entropy of every completion token under the current policy at the sampling
        temperature, no gradient; seed 000-106's CoT entropy); ``think_token_mask`` [R, T] (1 on the
        completion tokens inside the first ``<think>…</think>``, :func:`tag_token_mask`)."""
        out = {}
        if "token_group_divergence" in want:
            out["token_group_divergence"] = group_token_divergence(module, batch, self.score_temperature,
                                                                   micro_batch_size, max_tokens)
        if "token_entropy" in want:
            T = batch.completion_ids.shape[1]
            parts = []
            for mb in batch.micro_batches(micro_batch_size, trim=False, max_tokens=max_tokens):
                ent = completion_logprobs(module, mb, self.score_temperature, with_entropy=True,
                                          shared_prefix=self.shared_prefix_no_grad)[1]
                parts.append(ent.detach().float().cpu()[:, :T])
            out["token_entropy"] = torch.cat(parts) * batch.completion_attention_mask.float()
        if "think_token_mask" in want:
            out["think_token_mask"] = tag_token_mask(self.tokenizer, batch.completion_ids,
                                                     batch.completion_attention_mask)
        return out

    def prepare(self, module):
        """LoRA adapters (PEFT, ``use_lora``) and activation checkpointing (``gradient_checkpointing``)."""
        if self.lora is not None:
            from ...model.loading import apply_lora
            module = apply_lora(module, *self.lora, adapters=self.adapters)
        if self.checkpointing:
            enable = getattr(module, "activation_checkpointing_enable", None)  # transformers >= 5.x name
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            module.config.use_cache = False
        if self.role_models:  # role_adapters separate: every role its own copy (grpolab/roles.py RoleModels)
            module = RoleModels({name: copy.deepcopy(module) for name in self.role_models})
        return module

    def _forward_by_role(self, module: RoleModels, mb, *, want: frozenset[str], grad: bool) -> dict[str, Any]:
        """:meth:`forward` of each role's rows under that role's model, put back in row order."""
        if "role" not in mb.row_data:
            raise ValueError("role_adapters: separate: the batch has no row_data['role'] (the team rollout sets "
                             "it); cannot tell which role's model a row goes through")
        role = mb.row_data["role"].long().cpu()
        order, parts = [], []
        for r in sorted(set(role.tolist())):
            rows = (role == r).nonzero().flatten()
            order.append(rows)
            parts.append(self.forward(module.roles[module.names[r]], mb.select(rows), want=want, grad=grad))
        back = torch.argsort(torch.cat(order)).to(parts[0]["logprobs"].device)
        return {k: torch.cat([p[k] for p in parts])[back] for k in parts[0]}

    def offers(self) -> frozenset[str]:
        return frozenset({"entropy", "entropy_grad"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """``logprobs`` [R, T] of ``mb``'s completion tokens under ``module``; with ``entropy`` or
        ``entropy_grad`` in ``want``, the vocabulary entropy [R, T] too (``entropy`` detached; the entropy
        carries gradients only when ``entropy_grad`` is asked for)."""
        if isinstance(module, RoleModels):  # each role's rows through that role's own model
            return self._forward_by_role(module, mb, want=want, grad=grad)
        if self.adapters and "role" in mb.row_data:  # each row through its role's adapter (PEFT mixed batch)
            names = [self.adapters[int(r)] for r in mb.row_data["role"]]
            with per_row_adapters(module, names):
                logp, ent = completion_logprobs(module, mb, self.score_temperature, shared_prefix=False,
                                                with_entropy=bool(want & {"entropy", "entropy_grad"}),
                                                entropy_grad="entropy_grad" in want)
            out = {"logprobs": logp}
            if ent is not None:
                out.update(entropy=ent.detach(), entropy_grad=ent)
            return out
        if not want & {"entropy", "entropy_grad"}:
            shared = self.shared_prefix if grad else self.shared_prefix_no_grad
            return {"logprobs": completion_logprobs(module, mb, self.score_temperature, shared_prefix=shared)[0]}
        logp, ent = completion_logprobs(module, mb, self.score_temperature, with_entropy=True,
                                        shared_prefix=self.shared_prefix, entropy_grad="entropy_grad" in want)
        return {"logprobs": logp, "entropy": ent.detach(), "entropy_grad": ent}
