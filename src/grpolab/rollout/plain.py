"""The plain rollout strategy: G sampled completions per prompt."""
from __future__ import annotations

import torch

from ..batch import RolloutBatch
from ..data import render_prompt
from .sampling import sample_completions


def tokenize_prompts(tokenizer, prompts: list, max_prompt_length: int):
    texts = [render_prompt(tokenizer, p) for p in prompts]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    if enc["input_ids"].shape[1] > max_prompt_length:
        raise ValueError(f"a prompt has {enc['input_ids'].shape[1]} tokens, more than max_prompt_length="
                         f"{max_prompt_length}; raise max_prompt_length or shorten the prompt")
    return enc["input_ids"], enc["attention_mask"]


def eos_token_ids(tokenizer, model) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(gen_eos)
    return sorted(i for i in ids if i is not None)


def plain_rollout(model, tokenizer, rows: list[dict], uids: list[int], *, num_generations: int,
                  max_completion_length: int, max_prompt_length: int, temperature: float,
                  top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None,
                  group_offset: int = 0) -> RolloutBatch:
    """Sample ``num_generations`` completions for each row and pack a RolloutBatch.

    Group ids are ``group_offset + i`` for the i-th prompt; prompt uids are the
    dataset indices ``uids``. Data columns are repeated per completion.
    """
    G = num_generations
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, [r["prompt"] for r in rows], max_prompt_length)
    out = sample_completions(model, prompt_ids, prompt_mask, num_samples=G,
                             max_new_tokens=max_completion_length, eos_ids=eos_token_ids(tokenizer, model),
                             pad_id=tokenizer.pad_token_id, temperature=temperature, top_k=top_k,
                             top_p=top_p, generator=generator)
    T = out.completion_ids.shape[1]
    present = (torch.arange(T)[None, :] < out.lengths[:, None])
    columns = {k: [r.get(k) for r in rows for _ in range(G)] for k in rows[0] if k != "prompt"}
    columns["prompt"] = [r["prompt"] for r in rows for _ in range(G)]
    texts = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
    columns["completion"] = [
        [{"role": "assistant", "content": t}] if isinstance(p, list) else t
        for p, t in zip(columns["prompt"], texts)]
    n = len(rows)
    return RolloutBatch(
        prompt_ids=prompt_ids.repeat_interleave(G, 0), prompt_mask=prompt_mask.repeat_interleave(G, 0),
        completion_ids=out.completion_ids, completion_mask=present.float(),
        behavior_logprobs=out.logprobs * present, completion_attention_mask=present.long(),
        group_ids=torch.arange(group_offset, group_offset + n).repeat_interleave(G),
        prompt_uids=torch.tensor(uids, dtype=torch.long).repeat_interleave(G),
        truncated=out.truncated, columns=columns)
