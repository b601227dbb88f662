"""A lean decode step for Llama-family models with a preallocated (static) KV cache.

The sampler (``generation/sampling.py``) pre-fills each prompt once through the
Hugging Face model and then decodes one token per row per step. For a small
model on a CPU most of a decode step through the Hugging Face modules is not
matrix products but per-layer overhead: the cache's ``torch.cat`` of every
layer's keys and values at every step, mask construction, and Python calls of
30 decoder layers. :class:`StaticDecoder` runs the same arithmetic with

* one preallocated key/value buffer per layer (``[rows, kv_heads, capacity,
  head_dim]``), written in place at each step; rows that finish are dropped by
  compacting the buffers (at most once per step in which some row finishes);
* fused projections: ``[W_q; W_k; W_v]`` and ``[W_gate; W_up]`` as one matrix
  each (built once per sampling call from the live weights, so they always match
  the policy being sampled);
* activations kept as ``[features, rows]`` so every linear layer is ``W @ X``,
  the shape the CPU BLAS runs fastest for a few rows (see
  ``sampling.small_batch_linears``);
* grouped-query attention without repeating the keys (queries are grouped per
  key/value head instead).

It computes exactly the Hugging Face forward (RMSNorm in float32, rotary
embedding from the model's own ``rotary_emb`` module, so RoPE scaling variants
carry over; softmax attention with the model's ``1/sqrt(head_dim)`` scale) up
to floating-point summation order: ``tests/test_fast_decode.py`` checks logits,
tokens and behaviour log-probs against the Hugging Face path in float64.

Supported: ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (with its q/k/v bias)
with SiLU MLPs, full attention on every layer, no attention-logit soft-capping.
Anything else (PEFT-wrapped models, sliding windows, other architectures)
returns ``None`` from :func:`static_decoder` and the sampler keeps the Hugging
Face path.
"""
from __future__ import annotations

import torch

from ..model.hf import exact_architecture, rope



def static_decoder(model, cache, rows_index: torch.Tensor, attn: torch.Tensor, capacity: int):
    """A :class:`StaticDecoder` continuing from a pre-filled Hugging Face ``cache``, or ``None``.

    ``rows_index`` maps each output row to its prompt's entry in ``cache`` (the
    fan-out to G completions); ``attn`` is the rows' ``[rows, P]`` prompt mask;
    ``capacity`` the most tokens a row's context can reach (P + new tokens).
    """
    if not supports(model):
        return None
    return StaticDecoder(model, cache, rows_index, attn, capacity)


def supports(model) -> bool:
    """Whether :class:`StaticDecoder` computes this model's forward exactly (it reads the raw weights,
    so a PEFT-wrapped model, whose adapters it would skip, is not supported)."""
    return not hasattr(model, "peft_config") and exact_architecture(model)


def _cat(*ts):
    ts = [t for t in ts if t is not None]
    return torch.cat(ts, 0) if ts else None


class StaticDecoder:
    """Decode state: static KV buffers, fused weights, per-row positions. See the module docstring."""

    def __init__(self, model, cache, rows_index: torch.Tensor, attn: torch.Tensor, capacity: int):
        base, cfg = model.model, model.config
        self.rotary = base.rotary_emb
        self.embed = base.embed_tokens.weight
        self.norm_w, self.norm_eps = base.norm.weight, base.norm.variance_epsilon
        self.head = model.lm_head.weight
        self.head_bias = model.lm_head.bias
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            qkv_bias = None
            if a.q_proj.bias is not None:
                qkv_bias = _cat(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)[:, None]
            self.layers.append((
                layer.input_layernorm.weight[:, None], layer.input_layernorm.variance_epsilon,
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0), qkv_bias,
                a.o_proj.weight, None if a.o_proj.bias is None else a.o_proj.bias[:, None],
                layer.post_attention_layernorm.weight[:, None], layer.post_attention_layernorm.variance_epsilon,
                torch.cat([m.gate_proj.weight, m.up_proj.weight], 0),
                None if m.gate_proj.bias is None else _cat(m.gate_proj.bias, m.up_proj.bias)[:, None],
                m.down_proj.weight, None if m.down_proj.bias is None else m.down_proj.bias[:, None]))
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.head_dim ** -0.5
        dtype = self.embed.dtype  # softmax in float32 for half-precision models, else in the model's dtype
        self.softmax_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        self.inter = base.layers[0].mlp.gate_proj.weight.shape[0]
        rows, P = attn.shape
        self.length = P
        self.keys, self.values = [], []
        for layer_cache in cache.layers:
            k, v = layer_cache.keys, layer_cache.values  # [n, kv_heads, P, head_dim]
            K = k.new_zeros(rows, self.kv_heads, capacity, self.head_dim)
            V = torch.zeros_like(K)
            K[:, :, :P] = k[rows_index]
            V[:, :, :P] = v[rows_index]
            self.keys.append(K)
            self.values.append(V)
        self.valid = torch.zeros(rows, capacity, dtype=torch.bool, device=attn.device)
        self.valid[:, :P] = attn.bool()

    def keep(self, idx: torch.Tensor) -> None:
        """Keep only the cache rows ``idx`` (rows that finished leave the batch)."""
        self.keys = [K[idx] for K in self.keys]
        self.values = [V[idx] for V in self.values]
        self.valid = self.valid[idx]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row at ``positions``; returns the next-token logits ``[rows, vocab]``."""
        r, t = tokens.shape[0], self.length
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        x = self.embed[tokens].t()  # [d, r]: every linear below is W @ x
        cos, sin = self.rotary(x, positions[:, None])  # [r, 1, D]
        cos, sin = cos[:, 0, None, :], sin[:, 0, None, :]  # [r, 1, D] broadcast over heads
        self.valid[:, t] = True
        bias = torch.zeros(self.valid[:, : t + 1].shape, dtype=x.dtype, device=x.device)  # additive mask, once per step
        bias = bias.masked_fill_(~self.valid[:, : t + 1], float("-inf"))[:, None, None, :]  # [r, 1, 1, L]
        for i, (w_in, eps_in, w_qkv, b_qkv, w_o, b_o, w_post, eps_post, w_gu, b_gu, w_down, b_down) \
                in enumerate(self.layers):
            h = _rms_norm(x, w_in, eps_in)
            qkv = w_qkv @ h
            if b_qkv is not None:
                qkv = qkv + b_qkv
            qkv = qkv.t()  # [r, (H + 2 KV) D]
            qk = rope(qkv[:, :(H + KV) * D].reshape(r, H + KV, D), cos, sin)  # queries and keys at once
            K, V = self.keys[i], self.values[i]
            K[:, :, t] = qk[:, H:]
            V[:, :, t] = qkv[:, (H + KV) * D:].reshape(r, KV, D)
            q = qk[:, :H].reshape(r, KV, H // KV, D)  # queries grouped under their key/value head
            scores = (q @ K[:, :, : t + 1].transpose(-1, -2)) * self.scale  # [r, KV, H/KV, L]
            scores = scores + bias
            probs = torch.softmax(scores, dim=-1, dtype=self.softmax_dtype).to(q.dtype)
            o = (probs @ V[:, :, : t + 1]).reshape(r, H * D)  # [r, H D]
            o = w_o @ o.t()
            if b_o is not None:
                o = o + b_o
            x = x + o
            h = _rms_norm(x, w_post, eps_post)
            gu = w_gu @ h
            if b_gu is not None:
                gu = gu + b_gu
            m = w_down @ (torch.nn.functional.silu(gu[: self.inter]) * gu[self.inter:])
            if b_down is not None:
                m = m + b_down
            x = x + m
        self.length = t + 1
        h = _rms_norm(x, self.norm_w[:, None], self.norm_eps)
        logits = (self.head @ h).t()
        return logits if self.head_bias is None else logits + self.head_bias


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the feature dimension 0 of ``x [d, r]`` (in float32, like the Hugging Face module)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(0, keepdim=True) + eps)
    return weight * xf.to(x.dtype)
