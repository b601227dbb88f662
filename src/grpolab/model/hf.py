"""Hugging Face model internals shared by the training forward and the decoders.

The unwrapped model under PEFT, its device, the name of the KV-cache argument,
the rotary embedding, and which architectures the hand-written forwards
(``generation/fast_decode.py``, ``model/grouped_forward.py``) compute exactly.
"""
from __future__ import annotations

import inspect

import torch

EXACT_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


def base_model(model):
    """The Hugging Face model inside a PEFT wrapper (the model itself when not wrapped)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def model_device(model) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def cache_kwarg(model) -> str:
    """Newer transformers name the KV-cache argument ``cache`` (``past_key_values`` is deprecated)."""
    return "cache" if "cache" in inspect.signature(base_model(model).forward).parameters else "past_key_values"


def exact_architecture(model) -> bool:
    """A Llama / Qwen2 model whose forward the re-implementations here and in ``model/grouped_forward.py``
    compute exactly: SiLU MLPs, RMSNorm, full attention on every layer, no soft-capping."""
    if type(model).__name__ not in EXACT_ARCHITECTURES:
        return False
    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "attn_logit_softcapping", None):
        return False
    if getattr(cfg, "attention_dropout", 0.0) and model.training:
        return False
    base = model.model
    return all(type(m).__name__.endswith("RMSNorm") for layer in base.layers
               for m in (layer.input_layernorm, layer.post_attention_layernorm))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding ``x cos + rotate_half(x) sin`` (the Hugging Face Llama convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
