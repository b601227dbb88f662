"""Small helpers shared by the reward test files."""
import pytest
import torch

from grpolab.rewards.transforms import REWARD_TRANSFORMS


def tr(name, **kw):
    """Call the registered reward transform ``name``."""
    return REWARD_TRANSFORMS.get(name)(**kw)


def close(a, b, tol=1e-6):
    """Same shape and values (NaN equals NaN), compared in float64."""
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=tol, rtol=0, equal_nan=True))


#: The seeds of a learning test: ``make test`` runs seed 0, ``make test-learning`` (marker ``more_seeds``) seeds 1
#: and 2 too. Each test's margin was measured to hold on all three (its docstring has the figures).
LEARNING_SEEDS = [0, pytest.param(1, marks=pytest.mark.more_seeds), pytest.param(2, marks=pytest.mark.more_seeds)]


def tiny_decoder_model(arch: str, layers: int, dtype):
    """A tiny Llama / Qwen2 (``build_tiny``) in ``dtype`` with random biases (Qwen2's q/k/v) and norm weights,
    so every term of a decode step is exercised (tests/test_fast_decode.py, tests/test_compile_decode.py)."""
    import torch

    from grpolab.model.loading import build_tiny
    m, _ = build_tiny(["hello world 0123456789 abcdef"], arch=arch, layers=layers)
    m = m.to(dtype).eval()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(3)
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear) and mod.bias is not None:
                mod.bias.normal_(0, 0.5)
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.uniform_(0.5, 1.5)
    return m


def decoder_prompts(m):
    """Three 6-token prompts for ``m`` with left padding on two of them: ``(ids, mask)``."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, m.config.vocab_size, (3, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    mask[2, :1] = 0
    return ids, mask


def decoder_matches_hf(m, rep, steps: int, atol: float, drops: dict | None = None, capacity_extra: int = 0,
                       **decoder_kwargs):
    """A ``StaticDecoder`` over :func:`decoder_prompts` fanned out by ``rep``, stepped on random tokens against the
    Hugging Face forward of the whole sequence without a cache: logits equal within ``atol`` (and in the model's
    dtype) at every step; ``drops`` ``{t: keep}``: after step t only the rows ``keep`` stay (rows that finished).
    Returns the decoder."""
    import torch
    from transformers import DynamicCache

    from grpolab.generation.fast_decode import StaticDecoder
    ids, mask = decoder_prompts(m)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        cache = DynamicCache()
        m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, past_key_values=cache)
        dec = StaticDecoder(m, cache, rep, mask[rep], capacity=ids.shape[1] + steps + capacity_extra,
                            **decoder_kwargs)
        ctx, cmask = ids[rep], mask[rep]  # the full sequences, for the reference forward without cache
        g = torch.Generator().manual_seed(1)
        for t in range(steps):
            tok = torch.randint(4, m.config.vocab_size, (ctx.shape[0],), generator=g)
            ctx = torch.cat([ctx, tok[:, None]], 1)
            cmask = torch.cat([cmask, torch.ones_like(tok[:, None])], 1)
            cpos = (cmask.cumsum(-1) - 1).clamp(min=0)
            ref = m(input_ids=ctx, attention_mask=cmask, position_ids=cpos).logits[:, -1]
            got = dec.step(tok, cpos[:, -1])
            assert got.dtype == m.dtype
            torch.testing.assert_close(got, ref, rtol=0, atol=atol)
            if t in (drops or {}):
                keep = torch.tensor(drops[t])
                dec.keep(keep)
                ctx, cmask = ctx[keep], cmask[keep]
    return dec
