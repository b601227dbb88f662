"""Per-token log-probs (and entropy) of completion tokens under the policy."""
from __future__ import annotations

import math

import torch

from ..batch import RolloutBatch
from .grouped_forward import grouped_hidden_states, supports as grouped_supports
from .hf import base_model, cache_kwarg, model_device


def sequence_inputs(batch: RolloutBatch):
    """``input_ids``, ``attention_mask`` and ``position_ids`` for prompt + completion.

    Prompts are left-padded and completions right-padded, so the completion
    occupies the last ``T`` positions; position ids count real tokens only.
    """
    comp_attn = batch.completion_attention_mask
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    attn = torch.cat([batch.prompt_mask, comp_attn.to(batch.prompt_mask.dtype)], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attn, pos


def token_logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float,
                               with_entropy: bool = False, chunk: int = 4096, entropy_grad: bool = False):
    """``log softmax(logits / temperature)[tokens]`` and optionally the entropy.

    Works in float32 over chunks of ``chunk`` positions, so no float32
    ``[rows, T, vocab]`` log-softmax tensor is materialised beyond one chunk.
    The log-prob (and the entropy as a metric) go through
    :class:`SelectedLogProb`, one fused pass over the vocabulary each way;
    when a regulariser needs the entropy's gradient, autograd differentiates
    the plain formulas instead.
    """
    R, T, V = logits.shape
    flat = logits.reshape(R * T, V)
    tok = tokens.reshape(R * T)
    lps, ents = [], []
    for i in range(0, R * T, chunk):
        rows = flat if R * T <= chunk else flat[i:i + chunk]  # one chunk: no slice (its backward zero-fills)
        if with_entropy and entropy_grad:
            x = _wide(rows)
            if temperature != 1.0:
                x = x / temperature
            lse = torch.logsumexp(x, dim=-1)
            lps.append(x.gather(-1, tok[i:i + chunk, None]).squeeze(-1) - lse)
            ents.append(lse - (torch.softmax(x, dim=-1) * x).sum(-1))
        else:
            lp, ent = SelectedLogProb.apply(rows, tok[i:i + chunk], float(temperature), with_entropy)
            lps.append(lp)
            ents.append(ent)
    lp = torch.cat(lps).view(R, T)
    ent = torch.cat(ents).view(R, T) if with_entropy else None
    return lp, ent


def _wide(x: torch.Tensor) -> torch.Tensor:
    """float32 for half-precision logits; float32 / float64 logits stay as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


class SelectedLogProb(torch.autograd.Function):
    """``(log softmax(z / tau)[y], entropy)`` of logit rows ``z`` in few passes over the vocabulary.

    Forward: ``x = z / tau``, ``lse = logsumexp(x)`` (one fused kernel),
    ``p = exp(x - lse)``, ``logp_y = x_y - lse``, entropy ``H = lse - <p, x>``
    (a row-wise dot product without a ``[N, V]`` temporary; a metric: no gradient).
    Backward: ``dL/dz = g * (onehot(y) - p) / tau``, computed in place in the
    saved ``p``: the softmax is kept instead of the logits (same size), so it is
    never recomputed. Same values and gradients as autograd through
    ``log_softmax`` + ``gather`` (tested), with about a third of the vocabulary
    passes (measured: the exp / subtract / multiply passes were 2.5 s of a
    4-micro-batch SmolLM2 update on 2 CPU cores).
    """

    @staticmethod
    def forward(ctx, logits, tokens, temperature: float, with_entropy: bool):
        x = _wide(logits)
        if temperature != 1.0:
            x = x / temperature
        lse = torch.logsumexp(x, dim=-1)
        p = torch.sub(x, lse[:, None]).exp_()
        lp = x.gather(-1, tokens[:, None]).squeeze(-1) - lse
        ent = None
        if with_entropy:
            ent = lse - torch.bmm(p[:, None, :], x[:, :, None]).view(-1)
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(p, tokens)
        ctx.temperature, ctx.logit_dtype = temperature, logits.dtype
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent=None):
        p, tokens = ctx.saved_tensors
        grad = p.mul_(-g_lp[:, None])  # p is not needed again: the gradient is built in its memory
        grad.scatter_add_(-1, tokens[:, None], g_lp[:, None])
        if ctx.temperature != 1.0:
            grad = grad.div_(ctx.temperature)
        return grad.to(ctx.logit_dtype), None, None, None


def completion_logprobs(model, batch: RolloutBatch, temperature: float = 1.0, with_entropy: bool = False,
                        shared_prefix: bool = True, entropy_grad: bool = False):
    """Log-prob ``[R, T]`` of every completion token (and entropy ``[R, T]`` if asked).

    With ``shared_prefix`` (the default) rows whose prompt tokens are identical
    (a GRPO group) share one prompt forward pass: see
    :func:`shared_prefix_logits`. Otherwise each row runs prompt + completion
    in full. Either way only completion positions go through the LM head.
    The batch is moved to the model's device; the outputs stay there.
    """
    batch = batch.to(model_device(model))
    if shared_prefix:
        logits = shared_prefix_logits(model, batch)
        return token_logprobs_from_logits(logits, batch.completion_ids, temperature, with_entropy,
                                          entropy_grad=entropy_grad)
    input_ids, attn, pos = sequence_inputs(batch)
    T = batch.completion_ids.shape[1]
    out = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=False,
                logits_to_keep=T + 1)
    logits = out.logits[:, -(T + 1):-1, :]
    return token_logprobs_from_logits(logits, batch.completion_ids, temperature, with_entropy,
                                      entropy_grad=entropy_grad)


# Causal LMs whose logits are exactly ``lm_head(last hidden state)`` (no soft-capping or logit scale):
# for them the shared-prefix forward works on hidden states (see shared_prefix_logits).
PLAIN_HEAD = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")


def shared_prefix_logits(model, batch: RolloutBatch) -> torch.Tensor:
    """Completion logits ``[R, T, V]`` with each distinct prompt encoded once.

    The distinct prompts of the batch are run once (with gradients) into a KV
    cache; the cache is gathered out to every row that shares the prompt and the
    completions run on top of it. Attention, positions and masks are the same
    as in the plain forward, so outputs and gradients are identical (the prompt
    gradients from the G rows are summed by the gather's backward). This is the
    shared-prefix forward of Prefix Grouper (seed 000-12), done through the
    model's own KV-cache path so any Hugging Face decoder supports it.

    For the architectures in ``PLAIN_HEAD`` it runs on hidden states: the
    prompt and completion tokens are embedded in one lookup (for a tied
    embedding, with a sparse gradient that lands in the LM head's dense one),
    and the LM head runs once, on the prompt's last hidden state and the
    completion's. That is the same arithmetic with two dense ``[vocab, d]``
    gradient tensors fewer per micro-batch (about 1.5 s of a 4-micro-batch
    SmolLM2 update on 2 CPU cores; docs/performance.md).
    """
    states, head = shared_prefix_states(model, batch)
    return states if head is None else head(states)


def shared_prefix_states(model, batch: RolloutBatch):
    """``(states, head)``: what :func:`shared_prefix_logits` computes before the LM head.

    For ``PLAIN_HEAD`` models ``states`` is the last hidden state ``[R, T, d]``
    and ``head`` the LM head (logits = ``head(states)``); for other models
    ``states`` is the logits ``[R, T, V]`` and ``head`` is None.
    """
    from transformers import DynamicCache


    uniq, inverse = torch.unique(torch.cat([batch.prompt_ids, batch.prompt_mask], dim=1), dim=0,
                                 return_inverse=True)
    P = batch.prompt_ids.shape[1]
    p_ids, p_mask = uniq[:, :P], uniq[:, P:]
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
    comp_attn = batch.completion_attention_mask.to(batch.prompt_mask.dtype)
    attn = torch.cat([batch.prompt_mask, comp_attn], dim=1)
    start = batch.prompt_mask.sum(-1, keepdim=True)
    pos = start + (comp_attn.cumsum(-1) - 1).clamp(min=0)
    T = batch.completion_ids.shape[1]
    cache = DynamicCache()
    ckw = cache_kwarg(model)
    parts = _plain_head_parts(model)
    if parts is not None:
        decoder, head, embed = parts
        ids = torch.cat([p_ids.reshape(-1), batch.completion_ids.reshape(-1)])
        sparse = head.weight is embed.weight and embed.weight.requires_grad and torch.is_grad_enabled()
        emb = torch.nn.functional.embedding(ids, embed.weight, padding_idx=embed.padding_idx, sparse=sparse)
        if grouped_supports(model):  # one pass: prompts and completions share every matrix product
            first, hidden = grouped_hidden_states(model, emb, p_mask, p_pos, inverse, comp_attn, pos)
            return torch.cat([first, hidden[:, :T - 1, :]], dim=1), head
        n_p = p_ids.numel()
        out = decoder(inputs_embeds=emb[:n_p].view(*p_ids.shape, -1), attention_mask=p_mask, position_ids=p_pos,
                      use_cache=True, **{ckw: cache})
        first = out.last_hidden_state[:, -1:, :][inverse]  # predicts completion token 0
        cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else cache
        cache.batch_select_indices(inverse)
        out = decoder(inputs_embeds=emb[n_p:].view(*batch.completion_ids.shape, -1), attention_mask=attn,
                      position_ids=pos, use_cache=True, **{ckw: cache})
        return torch.cat([first, out.last_hidden_state[:, :T - 1, :]], dim=1), head
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, use_cache=True,
                logits_to_keep=1, **{ckw: cache})
    first = out.logits[:, -1:, :][inverse]  # predicts completion token 0
    cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else cache
    cache.batch_select_indices(inverse)
    out = model(input_ids=batch.completion_ids, attention_mask=attn, position_ids=pos, use_cache=True,
                logits_to_keep=T, **{ckw: cache})
    return torch.cat([first, out.logits[:, :-1, :]], dim=1), None


def _plain_head_parts(model):
    """``(decoder, lm_head, input embedding)`` of a ``PLAIN_HEAD`` model (PEFT-wrapped or not), else None."""
    base = base_model(model)
    if type(base).__name__ not in PLAIN_HEAD:
        return None
    embed = base.get_input_embeddings()
    if type(embed) is not torch.nn.Embedding or embed.max_norm is not None or embed.scale_grad_by_freq:
        return None
    return base.get_decoder(), base.get_output_embeddings(), embed


def tw_group_divergence(logprobs: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """TW-GRPO's per-row divergence from the group at each position: ``[G, c]``.

    ``logprobs [G, c, V]``: the G rows' next-token log-probabilities at c
    positions; ``alive [G, c]``: the row has a token there (otherwise it takes
    the uniform distribution, ``-log V``). With ``m = mean_i lp_i`` (log space)
    and ``k3(d) = exp(d) - d - 1``, ``d = clamp(m - lp_i, -11, 11)``, returns
    ``D_i = sum_v k3(d_v)`` (the authors' compute_token_importance_kl_logs_uniform
    before its mean over rows; see ``tw_token_weight``).
    """
    V = logprobs.shape[-1]
    lp = torch.where(alive[..., None].bool(), logprobs, torch.full((), -math.log(V), dtype=logprobs.dtype,
                                                                   device=logprobs.device))
    d = (lp.mean(0, keepdim=True) - lp).clamp_(-11.0, 11.0)
    return (torch.exp(d) - d - 1).sum(-1)


def group_token_divergence(model, batch: RolloutBatch, temperature: float = 1.0, rows: int = 16,
                           max_tokens: int = 0, max_elements: int = 1 << 26) -> torch.Tensor:
    """:func:`tw_group_divergence` of every row and position of ``batch`` under ``model``: ``[R, T]`` (CPU, float32).

    Exact and memory-light: group by group, the group's rows run through the
    shared-prefix forward (micro-batches of ``rows`` rows / ``max_tokens``
    tokens) up to the pre-head hidden states ``[G, T_g, d]`` (``T_g`` = the
    group's longest completion); then, ``c`` positions at a time with
    ``G * c * V <= max_elements``, the LM head gives the logits, ``log_softmax(logits
    / temperature)`` in float32 the distributions, and :func:`tw_group_divergence`
    reduces them to ``[G, c]``. Peak extra memory: the group's hidden states
    plus a few ``[G, c, V]`` float32 chunks (a model outside ``PLAIN_HEAD``
    keeps the group's logits ``[G, T_g, V]`` instead of hidden states). Cost:
    one forward of the batch without gradient, plus one LM-head pass —
    about a reference-model forward. Positions past ``T_g`` are 0. Run it
    under ``torch.no_grad()``.
    """
    dev = model_device(model)
    R, T = batch.completion_ids.shape
    out = torch.zeros(R, T, dtype=torch.float32)
    alive_all = batch.completion_attention_mask > 0
    for g in torch.unique(batch.group_ids):
        idx = (batch.group_ids == g).nonzero().squeeze(-1)
        sub = batch.select(idx).trim()
        Tg = int(sub.completion_attention_mask.sum(-1).max()) if len(idx) else 0
        if Tg == 0:
            continue
        parts = [shared_prefix_states(model, mb.to(dev)) for mb in sub.micro_batches(rows, trim=False,
                                                                                      max_tokens=max_tokens)]
        head = parts[0][1]
        states = torch.cat([p[0] for p in parts])[:, :Tg]
        alive = alive_all[idx, :Tg].to(dev)
        V = head.weight.shape[0] if head is not None else states.shape[-1]
        c = max(1, max_elements // (len(idx) * V))
        for t0 in range(0, Tg, c):
            x = states[:, t0:t0 + c]
            logits = _wide(head(x) if head is not None else x)
            if temperature != 1.0:
                logits = logits / temperature
            div = tw_group_divergence(torch.log_softmax(logits, dim=-1), alive[:, t0:t0 + c])
            out[idx, t0:t0 + div.shape[1]] = div.float().cpu()
    return out
