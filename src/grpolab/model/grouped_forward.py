"""Prefix Grouper's training forward as one pass: prompts and completions share every matrix product.

``logprobs.shared_prefix_logits`` encodes each distinct prompt once through the
model's KV-cache path: a prompt forward, then a completion forward on the
gathered cache. Every weight then sees two products per micro-batch, one of
them with only the prompt's few tokens as rows, and the backward adds the two
weight gradients. On a CPU both cost more than their FLOPs (measured on the
SmolLM2 benchmark job: the 42-token products ran at about 12 GFLOP/s, and the
prompt part took about 5 s of a 28 s update).

:func:`grouped_hidden_states` runs the same arithmetic with the prompt tokens
and the completion tokens stacked into one ``[tokens, d]`` matrix for every
linear layer and norm (the model's own modules, so LoRA adapters apply), and
attention done per part:

* prompt tokens: causal attention within their prompt (pad keys masked);
* completion tokens of row ``i``: attention over prompt ``inverse[i]``'s keys
  and values (gathered; the gather's backward sums the G rows' gradients) and
  the row's own earlier completion tokens.

Masks, positions (the model's ``rotary_emb``), the softmax scale and the
grouped-query heads are those of the model's SDPA attention, so log-probs and
every parameter's gradient equal the plain repeated-prompt forward up to
summation order (``tests/test_batch_and_model.py``, float64). Padding queries
attend to themselves only, so no row of the attention is empty (an empty row
would make NaNs whose zero gradients still poison the weight gradients).

Supported: the Llama / Qwen2 family (``rollout.fast_decode.exact_architecture``),
with or without PEFT adapters; other models use the KV-cache path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .hf import base_model, exact_architecture, rope as _rope


def supports(model) -> bool:
    base = base_model(model)  # PEFT-wrapped is fine: the model's own modules apply the adapters
    if not exact_architecture(base):
        return False
    attn = base.model.layers[0].self_attn
    return not any(hasattr(attn, n) for n in ("q_norm", "k_norm"))  # Qwen3-style q/k norms: not handled


def grouped_hidden_states(model, x, p_mask, p_pos, inverse, c_attn, c_pos):
    """Final hidden states ``(first [R, 1, d], completion [R, T, d])``.

    ``x`` is the embedding of the ``U`` distinct (left-padded) prompts'
    tokens followed by the ``[R, T]`` completion tokens, flattened
    (``[U P + R T, d]``); ``p_mask`` / ``p_pos`` are the prompts' mask and
    positions, ``inverse[i]`` row ``i``'s prompt, ``c_attn`` / ``c_pos`` the
    completions' attention mask and positions. ``first[i]`` is the hidden state
    of prompt ``inverse[i]``'s last position (it predicts completion token 0).
    """
    base = base_model(model)
    dec, cfg = base.model, base.config
    U, P = p_mask.shape
    R, T = c_attn.shape
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    pcos, psin = dec.rotary_emb(x, p_pos)  # [U, P, D]
    ccos, csin = dec.rotary_emb(x, c_pos)  # [R, T, D]
    pcos, psin, ccos, csin = pcos[:, None], psin[:, None], ccos[:, None], csin[:, None]
    dev = p_mask.device
    # prompt part: causal over real tokens; a padding query sees itself only
    causal_p = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
    pm = p_mask.bool()
    p_allowed = causal_p[None] & pm[:, None, :]
    p_allowed = p_allowed | (torch.eye(P, dtype=torch.bool, device=dev)[None] & ~pm[:, :, None])
    # completion part: the row's prompt keys, then its own earlier tokens
    cm = c_attn.bool()
    causal_c = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    own = causal_c[None] & cm[:, None, :]
    own = own | (torch.eye(T, dtype=torch.bool, device=dev)[None] & ~cm[:, :, None])
    c_allowed = torch.cat([pm[inverse][:, None, :].expand(R, T, P), own], dim=2)  # [R, T, P + T]
    p_allowed, c_allowed = p_allowed[:, None], c_allowed[:, None]
    n_p = U * P
    scale = D ** -0.5
    for layer in dec.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = a.q_proj(h), a.k_proj(h), a.v_proj(h)
        qp = _rope(q[:n_p].view(U, P, H, D).transpose(1, 2), pcos, psin)
        kp = _rope(k[:n_p].view(U, P, KV, D).transpose(1, 2), pcos, psin)
        vp = v[:n_p].view(U, P, KV, D).transpose(1, 2)
        qc = _rope(q[n_p:].view(R, T, H, D).transpose(1, 2), ccos, csin)
        kc = _rope(k[n_p:].view(R, T, KV, D).transpose(1, 2), ccos, csin)
        vc = v[n_p:].view(R, T, KV, D).transpose(1, 2)
        op = F.scaled_dot_product_attention(qp, _repeat(kp, H // KV), _repeat(vp, H // KV),
                                            attn_mask=p_allowed, scale=scale)
        kc = torch.cat([kp[inverse], kc], dim=2)
        vc = torch.cat([vp[inverse], vc], dim=2)
        oc = F.scaled_dot_product_attention(qc, _repeat(kc, H // KV), _repeat(vc, H // KV),
                                            attn_mask=c_allowed, scale=scale)
        o = torch.cat([op.transpose(1, 2).reshape(n_p, H * D), oc.transpose(1, 2).reshape(R * T, H * D)])
        x = x + a.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    x = dec.norm(x)
    first = x[:n_p].view(U, P, -1)[:, -1:, :][inverse]
    return first, x[n_p:].view(R, T, -1)


def _repeat(x: torch.Tensor, n: int) -> torch.Tensor:
    """Key/value heads repeated for their ``n`` query heads (as the model's ``repeat_kv``)."""
    if n == 1:
        return x
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)
