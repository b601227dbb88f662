"""LLaDA's sampler: block-wise decoding with low-confidence remasking (ML-GSAI/LLaDA generate.py; d1's
``generate``), with a step map."""
from __future__ import annotations

import torch


def transfer_counts(block_length: int, steps_per_block: int) -> list[int]:
    """How many tokens each step of a block unmasks: ``block_length // steps`` each, the remainder one more on
    the first steps (LLaDA's ``get_num_transfer_tokens`` for a fully masked block)."""
    base, extra = divmod(block_length, steps_per_block)
    return [base + (1 if s < extra else 0) for s in range(steps_per_block)]


def schedule(gen_length: int, block_length: int, steps: int) -> list[tuple[int, int, int]]:
    """``[(step, block, count)]``: the global denoising steps, the block each works on, the tokens it unmasks."""
    if gen_length % block_length or steps % (gen_length // block_length):
        raise ValueError(f"dllm: gen_length ({gen_length}) must be a multiple of block_length ({block_length}) and "
                         f"steps ({steps}) a multiple of the number of blocks ({gen_length // block_length})")
    blocks, per = gen_length // block_length, steps // (gen_length // block_length)
    if per > block_length:
        raise ValueError(f"dllm: {per} steps per block unmask fewer than one token each (block {block_length})")
    out, s = [], 0
    for b in range(blocks):
        for n in transfer_counts(block_length, per):
            out.append((s, b, n))
            s += 1
    return out


@torch.no_grad()
def denoise(logits_fn, prompt: torch.Tensor, prompt_attn: torch.Tensor, *, gen_length: int, block_length: int,
            steps: int, temperature: float, mask_id: int, generator: torch.Generator | None = None):
    """Block-wise low-confidence remasking. Returns ``(completion [R, L], step_map [R, L], logp [R, L])``.

    The completion starts as L mask tokens after the prompt. At each step s of block b (blocks left to right,
    ``steps / blocks`` steps each, :func:`transfer_counts` tokens per step): logits = the model on the current
    sequence; a candidate x̂_k = argmax(logits_k + τ·G_k) per masked position (G Gumbel(0, 1) from ``generator``;
    τ = 0: argmax, LLaDA's ``add_gumbel_noise`` is the same argmax); confidence c_k = softmax(logits_k)[x̂_k]
    (temperature-free, LLaDA's ``low_confidence``), −∞ at unmasked positions and after block b; the ``count``
    positions of highest confidence take their candidates (ties: the lower position). A candidate may be the
    mask token itself: the position then stays masked and, as in LLaDA's ``generate`` (which sets −∞ only after
    the current block, ``x0_p[:, prompt_len + (num_block + 1) * block_length:] = -inf``, and recomputes
    ``mask_index = (x == mask_id)`` at every step), stays eligible at the later steps of its block and in every
    later block, so a later step can fill it. Only a mask proposed in the last block can remain in the
    completion (LLaDA returns it too), and then one position of that block may have no recorded step (−1): the
    block's transfers were spent on the re-masked position. ``step_map[i, k]`` = the global step at which token
    k of row i last took a candidate; ``logp[i, k]`` = log softmax(logits_k / τ)[x̂_k] at that step (τ = 0: of
    the logits; the log-probability of the drawn token given the state, not of the choice of position).

    Provenance: authors' code — https://github.com/ML-GSAI/LLaDA, generate.py (``generate``,
    ``get_num_transfer_tokens``, ``add_gumbel_noise``); rows are left-padded and batched with an attention mask
    (LLaDA's ``generate`` takes one unpadded prompt). Test:
    tests/test_dllm.py::test_a_masked_proposal_stays_eligible_in_later_blocks_as_in_llada.
    """
    R, P = prompt.shape
    L = gen_length
    x = torch.cat([prompt, torch.full((R, L), mask_id, dtype=prompt.dtype)], 1)
    attn = torch.cat([prompt_attn, torch.ones(R, L, dtype=prompt_attn.dtype)], 1)
    step_map = torch.full((R, L), -1, dtype=torch.long)
    logp = torch.zeros(R, L)
    rows = torch.arange(R)
    for s, b, count in schedule(gen_length, block_length, steps):
        logits = logits_fn(x, attn)[:, P:].float()
        if temperature > 0:
            u = torch.rand(logits.shape, generator=generator, dtype=torch.float64).clamp_min(1e-20)
            cand = (logits.double() - temperature * torch.log(-torch.log(u))).argmax(-1)
            lp = torch.log_softmax(logits / temperature, -1)
        else:
            cand = logits.argmax(-1)
            lp = torch.log_softmax(logits, -1)
        conf = torch.softmax(logits, -1).gather(-1, cand[..., None]).squeeze(-1)
        masked = x[:, P:] == mask_id
        upto = torch.arange(L) < (b + 1) * block_length  # block b and the blocks before it (LLaDA's -inf after)
        conf = torch.where(masked & upto, conf, torch.tensor(-float("inf")))
        # top-k by confidence, ties broken towards the lower position (a stable sort)
        order = torch.sort(conf, dim=-1, descending=True, stable=True).indices[:, :count]
        x[rows[:, None], P + order] = cand.gather(-1, order)
        step_map[rows[:, None], order] = s
        logp[rows[:, None], order] = lp.gather(-1, cand[..., None]).squeeze(-1).gather(-1, order)
    return x[:, P:], step_map, logp
