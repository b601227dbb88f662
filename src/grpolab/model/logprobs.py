"""Per-token log-probs (and entropy) of completion tokens under the policy."""
from __future__ import annotations

import torch

from ..batch import RolloutBatch


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
                               with_entropy: bool = False, chunk: int = 4096):
    """``log softmax(logits / temperature)[tokens]`` and optionally the entropy.

    Works in float32 over chunks of ``chunk`` positions, so no float32
    ``[rows, T, vocab]`` log-softmax tensor is materialised beyond one chunk.
    """
    R, T, V = logits.shape
    flat = logits.reshape(R * T, V)
    tok = tokens.reshape(R * T)
    lps, ents = [], []
    for i in range(0, R * T, chunk):
        x = flat[i:i + chunk].float()
        if temperature != 1.0:
            x = x / temperature
        lse = torch.logsumexp(x, dim=-1)
        lps.append(x.gather(-1, tok[i:i + chunk, None]).squeeze(-1) - lse)
        if with_entropy:
            p = torch.softmax(x, dim=-1)
            ents.append(lse - (p * x).sum(-1))
    lp = torch.cat(lps).view(R, T)
    ent = torch.cat(ents).view(R, T) if with_entropy else None
    return lp, ent


def completion_logprobs(model, batch: RolloutBatch, temperature: float = 1.0, with_entropy: bool = False):
    """Log-prob ``[R, T]`` of every completion token (and entropy ``[R, T]`` if asked).

    Only the last ``T + 1`` positions go through the LM head (``logits_to_keep``):
    the prompt positions' vocabulary projection is never computed.
    """
    input_ids, attn, pos = sequence_inputs(batch)
    T = batch.completion_ids.shape[1]
    out = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=False,
                logits_to_keep=T + 1)
    logits = out.logits[:, -(T + 1):-1, :]
    return token_logprobs_from_logits(logits, batch.completion_ids, temperature, with_entropy)
