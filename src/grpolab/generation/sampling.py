"""A small batched sampler with a shared-prompt KV cache.

Each prompt is pre-filled once; its KV cache is then fanned out to its ``G``
completions (``batch_repeat_interleave``; with ragged groups, one count per
prompt, ``batch_select_indices`` with the repeat index). Rows that have finished
are dropped from the cache, so they stop costing compute. The behaviour log-prob
``log softmax(logits / temperature)[token]`` of every sampled token is recorded
as it is drawn, so no second forward pass is needed to get it.

Per-prompt temperatures: each row's behaviour log-prob is recorded under *its
own* sampling temperature (the distribution the token was really drawn from).
The training forward scales logits by ``cfg.temperature``, so for a row sampled
at another temperature the importance ratio ``pi_theta(.; T_train) /
pi_old(.; T_row)`` is not 1 even before the first update: it is the
importance weight that corrects for sampling from the tempered policy (and is
clipped like any off-policy ratio). See ``prompts/budgets.py`` (ERPO).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.hf import cache_kwarg, model_device
from .counting import GENERATED
from .fast_decode import static_decoder


@dataclass
class SampleOutput:
    completion_ids: torch.Tensor   # long [R, T], padded with pad_id (R = N*G, or sum of the counts)
    logprobs: torch.Tensor         # float [R, T], 0 on padding
    lengths: torch.Tensor          # long [R], tokens generated including EOS
    truncated: torch.Tensor        # bool [R], no EOS within max_new_tokens


def per_prompt(value, n: int, name: str) -> list:
    """``value`` as a list with one entry per prompt (a scalar is repeated)."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: {len(value)} values for {n} prompts")
        return list(value)
    return [value] * n


def completion_counts(num_samples, n: int) -> list[int]:
    """Completions per prompt (int or one per prompt), each checked ``>= 1``."""
    counts = [int(c) for c in per_prompt(num_samples, n, "num_samples")]
    if any(c < 1 for c in counts):
        raise ValueError(f"num_samples: every prompt needs at least one completion, got {counts}")
    return counts


def per_row(values, counts: list[int]) -> list:
    """``values`` (one per prompt) with prompt ``i``'s entry repeated ``counts[i]`` times: one entry per
    completion, prompt-major (the rows of the batch, :func:`completion_counts`)."""
    return [v for v, c in zip(values, counts) for _ in range(c)]


def row_temperatures(temperature, counts: list[int], device=None) -> torch.Tensor:
    """float32 ``[sum(counts)]``: one sampling temperature per completion, from one temperature for all prompts
    or one per prompt (each completion gets its prompt's)."""
    temps = per_prompt(temperature, len(counts), "temperature")
    return torch.tensor([float(t) for t in per_row(temps, counts)], dtype=torch.float32, device=device)


def sample_completions(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, **kwargs) -> SampleOutput:
    """See :func:`_sample_completions`; runs it with the decode-friendly linear layers."""
    with small_batch_linears(model):
        out = _sample_completions(model, prompt_ids, prompt_mask, **kwargs)
    GENERATED.add(len(out.lengths), int(out.lengths.sum()))
    return out


@torch.no_grad()
def _sample_completions(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
                       num_samples: int | list[int], max_new_tokens: int, eos_ids: list[int], pad_id: int,
                       temperature: float | list[float] = 1.0, top_k: int = 0, top_p: float = 1.0,
                       generator: torch.Generator | None = None, method: str = "race",
                       static_cache: bool = True, stop=None) -> SampleOutput:
    """Sample ``num_samples`` completions for each left-padded prompt row.

    ``num_samples`` is one count for all prompts or a list with one count per
    prompt (ragged groups, each ``>= 1``); ``temperature`` likewise (a list
    gives every completion its prompt's temperature). ``temperature == 0`` is
    greedy decoding (log-probs are then those of the untempered distribution).
    Rows of the output are grouped prompt-major: prompt ``i``'s rows follow
    prompt ``i-1``'s (rows ``i*G .. i*G+G-1`` when the count is one int).
    ``static_cache`` decodes Llama / Qwen2 models with the preallocated KV
    cache and fused projections of ``generation/fast_decode.py`` (the same
    forward; other models always use the Hugging Face forward).

    ``eos_ids`` are all the token ids that end a row (EOS and any stop token
    ids; the token is kept in the output). ``stop`` (optional) is a callable
    ``stop(rows, tokens) -> bool [len(rows)]`` called after every step with
    the output row index of every still-running row (``rows``, long) and the
    tokens drawn so far (``tokens``, ``[all rows, t + 1]``); rows it marks end
    there like an EOS (not truncated). Stop strings use it
    (``generation/turns.py``). Without ``stop`` the loop is unchanged.
    """
    dev = model_device(model)
    prompt_ids, prompt_mask = prompt_ids.to(dev), prompt_mask.to(dev)
    counts = completion_counts(num_samples, prompt_ids.shape[0])
    ckw = cache_kwarg(model)
    logits, attn, next_pos, cache, fast = _prefill(model, prompt_ids, prompt_mask, counts, max_new_tokens,
                                                   static_cache)
    rows = sum(counts)
    # one temperature per prompt -> one per row
    temps = row_temperatures(temperature, counts, dev) if isinstance(temperature, (list, tuple)) else None
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=dev)
    lps = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=dev)
    lengths = torch.zeros(rows, dtype=torch.long, device=dev)
    done = torch.zeros(rows, dtype=torch.bool, device=dev)
    active = torch.arange(rows, device=dev)  # row index of each cache entry
    eos = torch.tensor(eos_ids, dtype=torch.long, device=dev)
    for t in range(max_new_tokens):
        logp, tok = draw(logits, temperature if temps is None else temps[active], top_k, top_p, generator, method)
        tokens[active, t] = tok
        lps[active, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
        lengths[active] = t + 1
        finished = torch.isin(tok, eos)
        if stop is not None:
            finished = finished | stop(active, tokens[:, :t + 1]).to(finished.device)
        done[active[finished]] = True
        if t == max_new_tokens - 1:
            break
        keep = ~finished
        if not keep.any():
            break
        if not keep.all():  # drop finished rows from the cache: they stop costing compute
            idx = keep.nonzero().squeeze(-1)
            if fast is None:
                cache.batch_select_indices(idx)
            else:
                fast.keep(idx)
            active, tok, attn, next_pos = active[idx], tok[idx], attn[idx], next_pos[idx]
        if fast is None:
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                        use_cache=True, **{ckw: cache})
            logits = out.logits[:, -1, :].float()
        else:
            logits = fast.step(tok, next_pos).float()
        next_pos = next_pos + 1
    T = int(lengths.max()) if rows else 0
    return SampleOutput(tokens[:, :max(T, 1)].cpu(), lps[:, :max(T, 1)].cpu(), lengths.cpu(), (~done).cpu())


def _prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, counts: list[int], max_new_tokens: int,
             static_cache: bool):
    """Each prompt's forward once, fanned out to its ``counts[i]`` completions: ``(logits [R, V] of every
    completion's first token, attention mask [R, P], next positions [R], the KV cache, the static decoder of
    ``generation/fast_decode.py`` or None)``."""
    from transformers import DynamicCache

    dev = prompt_ids.device
    cache = DynamicCache()
    pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=pos,
                use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
    logits = out.logits[:, -1, :].float()
    rep = torch.repeat_interleave(torch.arange(len(counts), device=dev),
                                  torch.tensor(counts, dtype=torch.long, device=dev))
    logits, attn, next_pos = logits[rep], prompt_mask[rep], pos[rep, -1] + 1
    fast = static_decoder(model, cache, rep, attn, attn.shape[1] + max_new_tokens) if static_cache else None
    if fast is None:  # Hugging Face forward: prompt i's cache entry is gathered counts[i] times
        cache.batch_select_indices(rep)
    return logits, attn, next_pos, cache, fast


def draw(logits: torch.Tensor, temperature: float | torch.Tensor, top_k: int = 0, top_p: float = 1.0,
         generator: torch.Generator | None = None, method: str = "race"):
    """One token per row. Returns ``(log softmax(logits / temperature), tokens)``.

    ``temperature`` is one float or a tensor with one temperature per row;
    ``temperature <= 0`` is greedy (for that row). Two exact samplers of the
    same distribution (``method``, config key ``sampling_method``):

    * ``race`` (default): the exponential race ``argmax_i p_i / E_i`` with
      ``E_i ~ Exp(1)`` picks ``i`` with probability ``p_i``; one variate per
      vocabulary entry (about 45 ms per decode step at 32 rows x 49,152 tokens on
      2 cores). The default job's measured results (README) use this stream.
    * ``inverse_cdf``: one uniform per row against the float64 cumulative sum:
      about 1 ms per step, a different random stream for the same seed.
    """
    pick = _race if method == "race" else _inverse_cdf
    if isinstance(temperature, torch.Tensor):
        greedy = temperature <= 0
        scale = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.dtype)
        logp = torch.log_softmax(logits / scale[:, None], dim=-1)
        return logp, torch.where(greedy, logp.argmax(-1), pick(_filter(logp, top_k, top_p), generator))
    logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    if temperature <= 0:
        return logp, logp.argmax(-1)
    return logp, pick(_filter(logp, top_k, top_p), generator)


def _race(logp: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``argmax_i p_i / E_i``, ``E_i ~ Exp(1)``: one sample per row with probability ``p_i``."""
    probs = logp.exp()
    if generator is not None and generator.device != probs.device:  # e.g. a CPU generator for a GPU model
        noise = torch.empty(probs.shape, dtype=probs.dtype, device=generator.device).exponential_(generator=generator)
        return (probs / noise.to(probs.device)).argmax(-1)
    return (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(-1)


def _inverse_cdf(logp: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One sample per row from ``softmax`` weights ``exp(logp)`` (rows need not be normalised)."""
    cum = logp.exp().double().cumsum(-1)
    gen_device = generator.device if generator is not None else logp.device
    u = torch.rand(logp.shape[0], 1, generator=generator, dtype=torch.float64, device=gen_device).to(logp.device)
    u = u * cum[:, -1:]
    return torch.searchsorted(cum, u, right=True).squeeze(-1).clamp(max=logp.shape[-1] - 1)


class small_batch_linears:
    """Context manager: ``nn.Linear`` layers of ``model`` compute ``(W @ x^T)^T`` for inputs of few rows.

    During decoding every linear layer sees a handful of rows (one token per
    sequence). For such shapes the CPU BLAS runs ``W @ x^T`` about twice as
    fast as ``x @ W^T`` (measured on SmolLM2's LM head, 32 rows: 35 ms vs
    64 ms; its MLP, 32 rows: 1.3x); the result is the same product
    (summation order may differ in the last bits). Inputs with more than
    ``max_rows`` rows (8x that for layers with >= 8192 outputs, i.e. LM heads,
    where the gain holds to ~1000 rows), inputs that need gradients, and every
    layer outside the ``with`` block use the standard path.
    """

    def __init__(self, model, max_rows: int = 128):
        self.model, self.max_rows = model, max_rows
        self.patched: list = []

    def __enter__(self):
        if model_device(self.model).type != "cpu":
            return self
        for mod in self.model.modules():
            if type(mod) is torch.nn.Linear:
                mod.forward = _small_rows_forward(mod, self.max_rows)
                self.patched.append(mod)
        return self

    def __exit__(self, *exc):
        for mod in self.patched:
            del mod.forward  # back to the class's forward
        self.patched = []


def _small_rows_forward(mod: torch.nn.Linear, max_rows: int):
    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        limit = max_rows if mod.weight.shape[0] < 8192 else 8 * max_rows  # LM heads gain up to ~1000 rows
        if rows > limit or torch.is_grad_enabled():
            return torch.nn.functional.linear(x, mod.weight, mod.bias)
        out = (mod.weight @ x.reshape(rows, x.shape[-1]).t()).t()
        if mod.bias is not None:
            out = out + mod.bias
        return out.reshape(*x.shape[:-1], mod.weight.shape[0])
    return forward


def _filter(logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Restrict sampling to the top-k / nucleus set (renormalised log-probs)."""
    if top_k and top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(-1)
        drop = cum - sorted_lp.exp() > top_p
        sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
        logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_lp)
    return torch.log_softmax(logp, dim=-1)


def seeded_uniforms(seeds: list[int], counts: list[int], steps: int) -> torch.Tensor:
    """``[sum(counts), steps]`` float64 uniforms: row i's ``counts[i]`` actions draw from a generator seeded with
    ``seeds[i]`` alone, so a row's draws do not depend on the batch around it (the same before and after
    training: a held-out evaluation of the sampling distribution with common random numbers)."""
    return torch.cat([torch.rand(c, steps, generator=torch.Generator().manual_seed(int(s)), dtype=torch.float64)
                      for s, c in zip(seeds, counts)])


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The category of each row of ``probs`` [R, V] at its uniform ``uniforms`` [R]: the first v whose cumulative
    probability exceeds u · total (float64 sums)."""
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, (uniforms[:, None] * cdf[:, -1:]).contiguous())[:, 0].clamp_max(probs.shape[1] - 1)


def seeded_draws(seeds: list[int], counts: list[int], steps: int, temperature: float):
    """A seeded held-out evaluation's draws for :func:`decode_tokens`: ``(temps, greedy, uniforms)``, every
    completion at ``temperature`` (none greedy) from the :func:`seeded_uniforms` of its prompt's seed."""
    rows = sum(counts)
    return (torch.full((rows,), float(temperature)), torch.zeros(rows, dtype=torch.bool),
            seeded_uniforms(seeds, counts, steps))


def draw_rows(logits: torch.Tensor, temps: torch.Tensor, greedy: torch.Tensor, generator=None,
              uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``logits`` [R, V] from the full softmax(logits / τ_r) (no top-k / top-p): the argmax
    where ``greedy``; elsewhere one ``torch.multinomial`` draw per row from ``generator`` (made only when some
    row samples), or, with ``uniforms`` [R] (a seeded evaluation), :func:`inverse_cdf` at each row's uniform."""
    scale = torch.where(greedy, torch.ones_like(temps), temps.clamp_min(1e-6))
    probs = torch.softmax(logits / scale[:, None], -1)
    tok = logits.argmax(-1)
    if uniforms is not None:
        return torch.where(greedy, tok, inverse_cdf(probs, uniforms))
    if not bool(greedy.all()):
        tok = torch.where(greedy, tok, torch.multinomial(probs, 1, generator=generator)[:, 0])
    return tok


def decode_tokens(next_logits, rows: int, max_tokens: int, *, eos: int, pad: int, temps: torch.Tensor,
                  greedy: torch.Tensor, temperature: float, generator=None, uniforms: torch.Tensor | None = None,
                  observe=None):
    """The token loop of the policies that run their own model (speech_to_text, vision_language): ``rows``
    completions of at most ``max_tokens`` tokens, each token drawn by :func:`draw_rows` (``uniforms``
    [rows, max_tokens]: a seeded evaluation's, column t at step t), its behaviour log-prob
    ``log softmax(logits / temperature)[o_t]`` (the training temperature). ``next_logits(fed)`` returns the
    float32 CPU logits [rows, V] of the next token after feeding ``fed`` [rows] (None at the first step; rows
    that ended are fed ``pad``); ``observe(t, logits, live)`` (optional) sees each step's logits. A row ends at
    its first ``eos`` (kept); the loop stops when every row has. Returns ``(tokens [rows, max_tokens] padded with
    ``pad``, log-probs, completion mask (float, 1 up to the EOS included), done [rows])``; the sampled tokens
    are counted in the run's generated-token tally."""
    out = torch.full((rows, max_tokens), pad, dtype=torch.long)
    lps, cmask = torch.zeros(rows, max_tokens), torch.zeros(rows, max_tokens)
    done = torch.zeros(rows, dtype=torch.bool)
    fed = None
    for t in range(max_tokens):
        logits = next_logits(fed)
        tok = draw_rows(logits, temps, greedy, generator, None if uniforms is None else uniforms[:, t])
        logp = torch.log_softmax(logits / temperature, -1).gather(-1, tok[:, None])[:, 0]
        live = ~done
        out[live, t], lps[live, t], cmask[live, t] = tok[live], logp[live], 1.0
        if observe is not None:
            observe(t, logits, live)
        done = done | (tok == eos)
        if bool(done.all()):
            break
        fed = torch.where(live, tok, torch.full_like(tok, pad))
    GENERATED.add(rows, int(cmask.sum()))  # the run's budgets and generated_tokens count sampled tokens
    return out, lps, cmask, done
