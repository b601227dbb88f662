"""The causal language model: the policy every text recipe trains; one step is one token."""
from __future__ import annotations

from typing import Any

from ..model.logprobs import completion_logprobs
from ..registry import POLICIES
from .base import PolicyBase


@POLICIES.register("causal_lm")
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
    description = "a causal language model (Hugging Face); one step = one token"

    def __init__(self, *, temperature: float, shared_prefix_forward: bool, gradient_checkpointing: bool,
                 use_lora: bool, lora_r: int, lora_alpha: int, lora_target_modules: list):
        self.temperature = float(temperature)
        # the shared-prefix forward runs the prompt once per group; activation checkpointing re-runs each row
        self.shared_prefix = bool(shared_prefix_forward) and not gradient_checkpointing
        self.shared_prefix_no_grad = bool(shared_prefix_forward)  # nothing is checkpointed without gradients
        self.checkpointing = bool(gradient_checkpointing)
        self.lora = (int(lora_r), int(lora_alpha), list(lora_target_modules)) if use_lora else None

    def prepare(self, module):
        """LoRA adapters (PEFT, ``use_lora``) and activation checkpointing (``gradient_checkpointing``)."""
        if self.lora is not None:
            from ..model.loading import apply_lora
            module = apply_lora(module, *self.lora)
        if self.checkpointing:
            enable = getattr(module, "activation_checkpointing_enable", None)  # transformers >= 5.x name
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            module.config.use_cache = False
        return module

    def offers(self) -> frozenset[str]:
        return frozenset({"entropy", "entropy_grad"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """``logprobs`` [R, T] of ``mb``'s completion tokens under ``module``; with ``entropy`` or
        ``entropy_grad`` in ``want``, the vocabulary entropy [R, T] too (``entropy`` detached; the entropy
        carries gradients only when ``entropy_grad`` is asked for)."""
        if not want & {"entropy", "entropy_grad"}:
            shared = self.shared_prefix if grad else self.shared_prefix_no_grad
            return {"logprobs": completion_logprobs(module, mb, self.temperature, shared_prefix=shared)[0]}
        logp, ent = completion_logprobs(module, mb, self.temperature, with_entropy=True,
                                        shared_prefix=self.shared_prefix, entropy_grad="entropy_grad" in want)
        return {"logprobs": logp, "entropy": ent.detach(), "entropy_grad": ent}
