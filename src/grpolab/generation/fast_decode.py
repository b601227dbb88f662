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
* under autocast (``dtype: bfloat16`` / ``float16``), the products' weights cast
  to autocast's dtype once per sampling call instead of by autocast at every
  product of every step (the same rounding, so the same logits; half the bytes
  streamed per step instead of float32 read, cast and read again);
* likewise the key/value buffers held in autocast's dtype (written once per position; attention's
  products under autocast would cast the whole float32 cache of every layer at every step);
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

``compile_decode`` (config; off by default) runs the layer step compiled by
``torch.compile`` (inductor): one graph per model shape, with the rows and the
cache length dynamic (the position is a tensor and attention covers the whole
masked buffer, so no step changes a shape) and the weights passed as inputs (so
an optimiser step's in-place update is read at the next call, no recompile).
Where torch.compile cannot run (no C++ compiler, an exception while compiling)
the eager step runs and the reason is printed once (:func:`configure_compile`,
:func:`compile_failed`). Measured on the 2-core CPU it was not faster
(docs/performance.md, "Compiled decode step"), hence opt-in.

Supported: ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (with its q/k/v bias)
with SiLU MLPs, full attention on every layer, no attention-logit soft-capping.
Anything else (PEFT-wrapped models, sliding windows, other architectures)
returns ``None`` from :func:`static_decoder` and the sampler keeps the Hugging
Face path.
"""
from __future__ import annotations

import os

import torch

from ..model.hf import exact_architecture, rope



COMPILE_MODES = ("auto", "on", "off")


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

    def cast(self, weight: torch.Tensor) -> torch.Tensor:
        """A product's weight in autocast's dtype (:attr:`weight_dtype`), or as it is when autocast is off."""
        return weight if self.weight_dtype is None else weight.to(self.weight_dtype)

    def __init__(self, model, cache, rows_index: torch.Tensor, attn: torch.Tensor, capacity: int,
                 compile_layers: bool | None = None, cast_weights: bool = True):
        base, cfg = model.model, model.config
        self.rotary = base.rotary_emb
        self.embed = base.embed_tokens.weight
        self.norm_w, self.norm_eps = base.norm.weight, base.norm.variance_epsilon
        # under autocast (dtype bfloat16 / float16) every product would cast its float32 weight again at every
        # decode step (read 4 bytes, write and read 2 more per weight); cast once per sampling call instead: the
        # same rounding autocast applies, so the same logits, and half the bytes streamed per step
        self.weight_dtype = autocast_weight_dtype(self.embed.device.type) if cast_weights else None
        mat = self.cast
        self.head = mat(model.lm_head.weight)
        self.head_bias = model.lm_head.bias
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            qkv_bias = None
            if a.q_proj.bias is not None:
                qkv_bias = _cat(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)[:, None]
            self.layers.append((
                layer.input_layernorm.weight[:, None], layer.input_layernorm.variance_epsilon,
                mat(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0)), qkv_bias,
                mat(a.o_proj.weight), None if a.o_proj.bias is None else a.o_proj.bias[:, None],
                layer.post_attention_layernorm.weight[:, None], layer.post_attention_layernorm.variance_epsilon,
                mat(torch.cat([m.gate_proj.weight, m.up_proj.weight], 0)),
                None if m.gate_proj.bias is None else _cat(m.gate_proj.bias, m.up_proj.bias)[:, None],
                mat(m.down_proj.weight), None if m.down_proj.bias is None else m.down_proj.bias[:, None]))
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.head_dim ** -0.5
        dtype = self.embed.dtype  # softmax in float32 for half-precision models, else in the model's dtype
        self.softmax_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        self.inter = base.layers[0].mlp.gate_proj.weight.shape[0]
        shape = (self.heads, self.kv_heads, self.head_dim, self.scale, self.inter, self.softmax_dtype)
        self.layer_fn = layer_step(*shape)
        use = COMPILE["active"] if compile_layers is None else compile_layers
        self.compiled_fn = None
        if use:
            try:
                self.compiled_fn = _compiled_layer_step(shape)
            except Exception as e:  # noqa: BLE001 -- torch.compile itself refused: say why (once), run eager
                compile_failed(e)
        rows, P = attn.shape
        self.length = P
        self.keys, self.values = [], []
        for layer_cache in cache.layers:
            k, v = layer_cache.keys, layer_cache.values  # [n, kv_heads, P, head_dim]
            # under autocast the cache is held in autocast's dtype: attention's products would cast the whole
            # float32 cache at every step of every layer (the same rounding, once per written position instead)
            buf = (rows, self.kv_heads, capacity, self.head_dim)
            K = k.new_zeros(buf, dtype=self.weight_dtype or k.dtype)
            V = v.new_zeros(buf, dtype=self.weight_dtype or v.dtype)
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

    def _layers(self, x, cos, sin, t: int) -> torch.Tensor:
        """All decoder layers at cache position ``t``: compiled (attention over the whole masked buffer, the
        position a tensor, so shapes do not change between steps) or eager (over the ``t + 1`` filled slots).
        A single row runs eager (a size-1 dimension would specialise the compiled graph: one more compile)."""
        compiled = self.compiled_fn is not None and x.shape[1] > 1
        valid = self.valid if compiled else self.valid[:, : t + 1]
        bias = torch.zeros(valid.shape, dtype=x.dtype, device=x.device)  # additive mask, once per step
        bias = bias.masked_fill_(~valid, float("-inf"))[:, None, None, :]  # [r, 1, 1, L]
        if compiled:
            at, h = torch.tensor([t], device=x.device), x
            try:
                for i, weights in enumerate(self.layers):
                    h = self.compiled_fn(h, cos, sin, bias, self.keys[i], self.values[i], at, *weights)
                return h
            except Exception as e:  # noqa: BLE001 -- compiling failed: say why (once), then run eager
                compile_failed(e)
                self.compiled_fn = None  # the eager pass below rewrites position t of every layer's cache
                return self._layers(x, cos, sin, t)
        for i, weights in enumerate(self.layers):
            x = self.layer_fn(x, cos, sin, bias, self.keys[i], self.values[i], t, *weights)
        return x

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row at ``positions``; returns the next-token logits ``[rows, vocab]``."""
        t = self.length
        x = self.embed[tokens].t()  # [d, r]: every linear below is W @ x
        cos, sin = self.rotary(x, positions[:, None])  # [r, 1, D]
        cos, sin = cos[:, 0, None, :], sin[:, 0, None, :]  # [r, 1, D] broadcast over heads
        self.valid[:, t] = True
        x = self._layers(x, cos, sin, t)
        self.length = t + 1
        h = _rms_norm(x, self.norm_w[:, None], self.norm_eps)
        logits = (self.head @ h).t()
        return logits if self.head_bias is None else logits + self.head_bias


# compile_decode (config field; set once per process by configure_compile): "mode" as configured, "active" whether
# new decoders use the compiled step, "reason" why (printed once; CausalLMPolicy.compile_decode_reason)
COMPILE: dict = {"mode": "off", "active": False, "reason": "compile_decode off (the default): eager decode step",
                 "log": print}
_COMPILED: dict = {}  # (heads, kv_heads, head_dim, scale, intermediate, softmax dtype) -> compiled layer_step


def compile_unavailable() -> str | None:
    """Why ``torch.compile`` cannot run the decode step here (no compiler, an unsupported platform), else None.
    A failure this check does not foresee is caught at the first compiled step (:func:`compile_failed`)."""
    import shutil
    import sys
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if sys.platform == "win32":
        return "torch.compile's C++ backend is not set up on Windows here"
    try:
        import torch._dynamo as _dynamo  # noqa: F401
        from torch._inductor import config as inductor_config
    except Exception as e:  # noqa: BLE001
        return f"torch.compile cannot be imported: {type(e).__name__}: {e}"
    cxx = inductor_config.cpp.cxx
    names = [c for c in (cxx if isinstance(cxx, (list, tuple)) else [cxx]) if c] or ["g++", "c++", "clang++"]
    if os.environ.get("CXX"):
        names.insert(0, os.environ["CXX"])
    if not any(shutil.which(c) for c in names):
        return f"no C++ compiler for inductor's CPU backend (looked for {', '.join(names)} on PATH)"
    return None


def configure_compile(mode, log=print) -> str:
    """Set the process's ``compile_decode`` (``"auto"``, ``"on"``/true, ``"off"``/false) and return the reason
    of the outcome, printed once. ``auto`` compiles where torch.compile can run; ``on`` likewise (it falls back
    to eager, saying why, where it cannot); ``off`` never compiles."""
    mode = {True: "on", False: "off"}.get(mode, mode)
    if mode not in COMPILE_MODES:
        from ..errors import ConfigError
        raise ConfigError(f"compile_decode: {mode!r} is not one of {', '.join(COMPILE_MODES)}")
    if COMPILE["mode"] == mode and COMPILE.get("configured"):
        return COMPILE["reason"]
    why = compile_unavailable() if mode != "off" else None
    if mode == "off":
        active, reason = False, "compile_decode off: eager decode step"
    elif why:
        active, reason = False, f"compile_decode {mode}: eager decode step, since {why}"
    else:
        active, reason = True, (f"compile_decode {mode}: decoder layers compiled with torch.compile (inductor, "
                                f"dynamic rows and cache length), once per process at the first decode step")
    COMPILE.update(mode=mode, active=active, reason=reason, log=log, configured=True)
    log(f"[grpolab] {reason}")
    return reason


def compile_failed(error: Exception) -> None:
    """A compiled decode step raised: record why and print it (once); the process decodes eagerly from then on."""
    first = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    COMPILE.update(active=False, reason=f"compile_decode {COMPILE['mode']}: eager decode step, since compiling it "
                                        f"failed ({type(error).__name__}: {first})")
    _COMPILED.clear()
    COMPILE["log"](f"[grpolab] {COMPILE['reason']}")


def _compiled_layer_step(shape: tuple):
    """The compiled :func:`layer_step` for these shapes, made once per process (dynamic rows and cache length:
    rows leave the batch as they finish, prompts differ in length, and neither recompiles)."""
    if shape not in _COMPILED:
        _COMPILED[shape] = torch.compile(layer_step(*shape), dynamic=True)
    return _COMPILED[shape]


def layer_step(H: int, KV: int, D: int, scale: float, inter: int, softmax_dtype: torch.dtype):
    """One decoder layer's decode step for a model's shapes: ``x [d, r] -> x [d, r]``, writing the step's key
    and value into ``K``/``V`` at position ``t`` (the weights are arguments, so a compiled copy reads the live
    weights at every call)."""
    def step(x, cos, sin, bias, K, V, t, w_in, eps_in, w_qkv, b_qkv, w_o, b_o, w_post, eps_post, w_gu, b_gu,
             w_down, b_down):
        r = x.shape[1]
        h = _rms_norm(x, w_in, eps_in)
        qkv = w_qkv @ h
        if b_qkv is not None:
            qkv = qkv + b_qkv
        qkv = qkv.t()  # [r, (H + 2 KV) D]
        qk = rope(qkv[:, :(H + KV) * D].reshape(r, H + KV, D), cos, sin)  # queries and keys at once
        if isinstance(t, int):  # eager: attend over the filled part of the cache
            K[:, :, t] = qk[:, H:]
            V[:, :, t] = qkv[:, (H + KV) * D:].reshape(r, KV, D)
            K, V = K[:, :, : t + 1], V[:, :, : t + 1]
        else:  # compiled: position as a tensor, attention over the whole buffer (masked), so no shape changes
            K.index_copy_(2, t, qk[:, H:, None].to(K.dtype))
            V.index_copy_(2, t, qkv[:, (H + KV) * D:].reshape(r, KV, 1, D).to(V.dtype))
        q = qk[:, :H].reshape(r, KV, H // KV, D)  # queries grouped under their key/value head
        scores = (q @ K.transpose(-1, -2)) * scale  # [r, KV, H/KV, L]
        scores = scores + bias
        probs = torch.softmax(scores, dim=-1, dtype=softmax_dtype).to(q.dtype)
        o = (probs @ V).reshape(r, H * D)  # [r, H D]
        o = w_o @ o.t()
        if b_o is not None:
            o = o + b_o
        x = x + o
        h = _rms_norm(x, w_post, eps_post)
        gu = w_gu @ h
        if b_gu is not None:
            gu = gu + b_gu
        m = w_down @ (torch.nn.functional.silu(gu[: inter]) * gu[inter:])
        if b_down is not None:
            m = m + b_down
        x = x + m
        return x
    return step


def autocast_weight_dtype(device_type: str):
    """The half-precision dtype autocast runs matrix products in on ``device_type``, or None (autocast off)."""
    if not torch.is_autocast_enabled(device_type):
        return None
    dtype = torch.get_autocast_dtype(device_type)
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the feature dimension 0 of ``x [d, r]`` (in float32, like the Hugging Face module)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(0, keepdim=True) + eps)
    return weight * xf.to(x.dtype)
