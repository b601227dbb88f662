"""The plain rollout strategy: G sampled completions per prompt (or one count per prompt: ragged)."""
from __future__ import annotations

import torch

from ..batch import RolloutBatch
from ..data import tokenize_prompts
from .sampling import completion_counts, sample_completions


def eos_token_ids(tokenizer, model) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(gen_eos)
    return sorted(i for i in ids if i is not None)


def plain_rollout(model, tokenizer, rows: list[dict], uids: list[int], *, num_generations: int | list[int],
                  max_completion_length: int, max_prompt_length: int, temperature: float | list[float],
                  top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None,
                  group_offset: int = 0, sampling_method: str = "race", static_cache: bool = True) -> RolloutBatch:
    """Sample ``num_generations`` completions for each row and pack a RolloutBatch.

    ``num_generations`` is one G or a list with one count per row (ragged
    groups, each >= 1); ``temperature`` is one float or one per row (each
    completion's behaviour log-probs are those of its own temperature). Group
    ids are ``group_offset + i`` for the i-th prompt; prompt uids are the
    dataset indices ``uids``. Data columns are repeated per completion.
    """
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, [r["prompt"] for r in rows], max_prompt_length)
    out = sample_completions(model, prompt_ids, prompt_mask, num_samples=num_generations,
                             max_new_tokens=max_completion_length, eos_ids=eos_token_ids(tokenizer, model),
                             pad_id=tokenizer.pad_token_id, temperature=temperature, top_k=top_k,
                             top_p=top_p, generator=generator, method=sampling_method, static_cache=static_cache)
    counts = completion_counts(num_generations, len(rows))
    return pack_completions(tokenizer, rows, uids, prompt_ids, prompt_mask, counts, out.completion_ids,
                            out.logprobs, out.lengths, out.truncated, group_offset=group_offset)


def pack_completions(tokenizer, rows: list[dict], uids: list[int], prompt_ids: torch.Tensor,
                     prompt_mask: torch.Tensor, counts: list[int], completion_ids: torch.Tensor,
                     logprobs: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor, *,
                     group_offset: int = 0) -> RolloutBatch:
    """A RolloutBatch from completions grouped prompt-major (``counts[i]`` rows for prompt ``i``).

    Prompt tensors, uids, group ids (``group_offset + i``) and data columns are
    repeated per prompt's own count; the completion text column is decoded
    (a chat message when the prompt is a chat). Tokens past ``lengths`` are
    padding (mask 0, log-prob 0). Used by the plain rollout and by strategies
    that pack completions they did not sample (e.g. AR3PO's reused responses).
    """
    rep = torch.tensor(counts, dtype=torch.long)
    T = completion_ids.shape[1]
    present = (torch.arange(T)[None, :] < lengths[:, None])
    columns = {k: [r.get(k) for r, c in zip(rows, counts) for _ in range(c)] for k in rows[0] if k != "prompt"}
    columns["prompt"] = [r["prompt"] for r, c in zip(rows, counts) for _ in range(c)]
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    columns["completion"] = [
        [{"role": "assistant", "content": t}] if isinstance(p, list) else t
        for p, t in zip(columns["prompt"], texts)]
    n = len(rows)
    return RolloutBatch(
        prompt_ids=prompt_ids.repeat_interleave(rep, 0), prompt_mask=prompt_mask.repeat_interleave(rep, 0),
        completion_ids=completion_ids, completion_mask=present.float(),
        behavior_logprobs=logprobs * present, completion_attention_mask=present.long(),
        group_ids=torch.arange(group_offset, group_offset + n).repeat_interleave(rep),
        prompt_uids=torch.tensor(uids, dtype=torch.long).repeat_interleave(rep),
        truncated=truncated, columns=columns)
