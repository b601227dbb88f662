"""Turns: continue token-id sequences, and build multi-turn episodes into a RolloutBatch.

Two pieces, both below ``rollouts/`` (layer 4: they know models, tokenizers
and the batch, never strategies):

* :func:`continue_sequences` — the generation primitive. It samples one
  continuation for each *token-id* context (contexts of any lengths: a prompt,
  a prompt plus a partial completion, a whole dialogue so far), stops on EOS,
  on stop token ids and on stop strings, and returns the new tokens with the
  behaviour log-prob of each and why the row stopped. It draws through the
  one KV-cache sampler (:func:`grpolab.generation.sampling.sample_completions`)
  or, when a :class:`~grpolab.generation.vllm_engine.VLLMEngine` is given,
  through vLLM.
* :class:`Episode` and :func:`pack_episodes` — one row per episode: its prompt
  tokens, then segments appended in order (model turns ``SAMPLED`` with their
  log-probs and loss mask 1; observations ``ENVIRONMENT`` with loss mask 0 and
  behaviour log-prob 0; injected tokens ``INJECTED``), each with a span id;
  :func:`pack_episodes` right-pads them into a :class:`RolloutBatch`.

A two-turn episode is::

    ep = Episode(prompt_ids)
    out = continue_sequences(model, tok, [ep.context()], max_new_tokens=16, stop_strings=["\\n"])
    ep.add_model_turn(out.ids[0], out.logprobs[0])                 # span 1
    ep.add_observation(tok("Observation: 42\\n", add_special_tokens=False)["input_ids"])   # span 2
    out = continue_sequences(model, tok, [ep.context()], max_new_tokens=16)
    ep.add_model_turn(out.ids[0], out.logprobs[0], finish_reason=out.finish_reasons[0])    # span 3
    batch = pack_episodes(tok, [ep], rows=[row], uids=[0], group_ids=[0])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..batch import ENVIRONMENT, SAMPLED, RolloutBatch
from .plain import eos_token_ids
from .sampling import per_prompt, sample_completions

FINISH_REASONS = ("eos", "stop_token", "stop_string", "length")


# --------------------------------------------------------------------------- the primitive
@dataclass
class Continuation:
    """What :func:`continue_sequences` returns, one entry per context, in order.

    ``ids[i]``: the new tokens of row ``i`` (the EOS, stop token or the tokens
    that completed a stop string included; nothing after them).
    ``logprobs[i]``: the behaviour log-prob of each of them, ``log softmax(logits
    / temperature)[token]`` of the distribution it was drawn from (the engine's
    processed log-probs when ``from_engine``).
    ``finish_reasons[i]``: ``"eos"`` | ``"stop_token"`` | ``"stop_string"`` |
    ``"length"`` (hit its ``max_new_tokens``).
    ``from_engine``: the tokens were drawn by vLLM, so ``logprobs`` are the
    engine's (a trainer recomputes its own pi_old and weights the mismatch,
    see :func:`pack_episodes`).
    """
    ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]
    from_engine: bool = False

    def padded(self, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ids long [R, T], logprobs float [R, T], lengths long [R])``, right-padded (``T >= 1``)."""
        R = len(self.ids)
        T = max([1] + [len(a) for a in self.ids])
        ids = torch.full((R, T), pad_id, dtype=torch.long)
        lps = torch.zeros((R, T))
        for i, (a, lp) in enumerate(zip(self.ids, self.logprobs)):
            if a:
                ids[i, :len(a)] = torch.tensor(a, dtype=torch.long)
                lps[i, :len(a)] = torch.tensor(lp, dtype=torch.float32)
        return ids, lps, torch.tensor([len(a) for a in self.ids], dtype=torch.long)


class StopStrings:
    """The ``stop`` callback of :func:`sample_completions` for stop strings.

    After every step it decodes each running row's new tokens (only the
    continuation, never the context: like vLLM, a stop string must be
    generated) and ends the rows whose text now contains a stop string, so a
    row stops at the token that *completes* the string, which is kept. Rows are
    decoded with ``skip_special_tokens=True``. ``hits[row]`` records the string.
    """

    def __init__(self, tokenizer, strings: Sequence[str]):
        self.tok = tokenizer
        self.strings = [s for s in strings if s]
        self.hits: dict[int, str] = {}

    def __call__(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(rows), dtype=torch.bool)
        if not self.strings:
            return out
        sel = tokens[rows].tolist()
        for j, (r, ids) in enumerate(zip(rows.tolist(), sel)):
            text = self.tok.decode(ids, skip_special_tokens=True)
            for s in self.strings:
                if s in text:
                    self.hits[r] = s
                    out[j] = True
                    break
        return out


def continue_sequences(model, tokenizer, contexts: list[list[int]], *, max_new_tokens: int | list[int],
                       temperature: float | list[float] = 1.0, top_k: int = 0, top_p: float = 1.0,
                       generator: torch.Generator | None = None, eos_ids: Sequence[int] | None = None,
                       stop_token_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
                       sampling_method: str = "race", static_cache: bool = True, engine=None) -> Continuation:
    """Sample one continuation of each token-id context; see :class:`Continuation` for the result.

    ``contexts``: lists of token ids of any (non-zero) lengths; they are
    left-padded with the tokenizer's pad id into one batch and pre-filled once.
    ``max_new_tokens``: one limit, or one per context (``0`` = nothing to
    sample: an empty continuation with reason ``"length"``). With several
    limits the sampler runs to the largest and each row is cut to its own
    afterwards, so the random stream is the one of a single
    :func:`sample_completions` call of the largest budget (rows past their
    limit keep drawing; their extra tokens are discarded). ``temperature``:
    one, or one per context; ``0`` = greedy.

    Stopping: a row ends at the first token in ``eos_ids`` (default: the
    tokenizer's and model's EOS, :func:`eos_token_ids`) or ``stop_token_ids``
    (the token is kept; reason ``"eos"`` if it is an EOS id, else
    ``"stop_token"``), or at the first token after which its decoded new text
    contains one of ``stop_strings`` (the tokens that completed the string are
    kept, like vLLM's ``include_stop_str_in_output=True``; reason
    ``"stop_string"``); else at its limit (``"length"``).

    Native path: one :func:`sample_completions` call (``num_samples=1``, the
    given ``generator``, ``sampling_method``, ``static_cache``), so the
    behaviour log-probs are exactly the sampler's (under each row's
    temperature). With no stop token ids / strings and one limit this is the
    same call, with the same random draws, as sampling from the left-padded
    contexts directly.

    Engine path (``engine`` given): the contexts go to vLLM as token ids with
    the same stops, limits and temperatures (rows with limit 0 are not sent);
    one seed is drawn from ``generator`` (request ``i`` gets ``seed + i``);
    log-probs are the engine's (``from_engine=True``).
    """
    n = len(contexts)
    if any(len(c) == 0 for c in contexts):
        raise ValueError("continue_sequences: every context needs at least one token")
    limits = [int(m) for m in per_prompt(max_new_tokens, n, "max_new_tokens")]
    if any(m < 0 for m in limits):
        raise ValueError(f"continue_sequences: max_new_tokens must be >= 0, got {limits}")
    stop_token_ids = [int(t) for t in stop_token_ids]
    eos = sorted(set(eos_token_ids(tokenizer, model) if eos_ids is None else [int(e) for e in eos_ids]))
    if n == 0 or max(limits) == 0:
        return Continuation([[] for _ in range(n)], [[] for _ in range(n)], ["length"] * n, engine is not None)
    if engine is not None:
        return _engine_continue(engine, contexts, limits, temperature, top_k, top_p, generator, eos,
                                stop_token_ids, stop_strings)

    width = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for j, c in enumerate(contexts):  # left padding, like the prompts
        ids[j, width - len(c):] = torch.tensor(c, dtype=torch.long)
        mask[j, width - len(c):] = 1
    enders = sorted(set(eos) | set(stop_token_ids))
    stops = StopStrings(tokenizer, stop_strings) if any(stop_strings) else None
    out = sample_completions(model, ids, mask, num_samples=1, max_new_tokens=max(limits), eos_ids=enders,
                             pad_id=pad, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                             method=sampling_method, static_cache=static_cache, stop=stops)
    return _cut_to_limits(out, limits, eos, stop_token_ids, stops)


def _cut_to_limits(out, limits: list[int], eos: list[int], stop_token_ids: list[int],
                   stops: StopStrings | None) -> Continuation:
    """The sampler's rows, each cut to its own limit, with why it stopped (the native path)."""
    new, lps, reasons = [], [], []
    for j in range(len(limits)):
        length = int(out.lengths[j])
        m = min(length, limits[j])
        toks = out.completion_ids[j, :m].tolist()
        new.append(toks)
        lps.append(out.logprobs[j, :m].tolist())
        if m < length or not toks:
            reasons.append("length")  # cut at its own limit before the sampler stopped it
        elif toks[-1] in eos:
            reasons.append("eos")
        elif toks[-1] in stop_token_ids:
            reasons.append("stop_token")
        elif stops is not None and j in stops.hits:
            reasons.append("stop_string")
        else:
            reasons.append("length")
    return Continuation(new, lps, reasons)


def _engine_continue(engine, contexts, limits, temperature, top_k, top_p, generator, eos, stop_token_ids,
                     stop_strings) -> Continuation:
    n = len(contexts)
    temps = [float(t) for t in per_prompt(temperature, n, "temperature")]
    send = [i for i in range(n) if limits[i] > 0]
    seed = None
    if generator is not None:
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator, device=generator.device))
    outs = engine.continue_([contexts[i] for i in send], max_tokens=[limits[i] for i in send],
                            temperature=[temps[i] for i in send], top_k=top_k, top_p=top_p,
                            stop=[s for s in stop_strings if s], stop_token_ids=stop_token_ids, seed=seed)
    ids: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    reasons = ["length"] * n
    for i, (t, lp, finish, stop_reason) in zip(send, outs):
        ids[i], lps[i] = list(t), list(lp)
        if finish == "length":
            reasons[i] = "length"
        elif isinstance(stop_reason, str):
            reasons[i] = "stop_string"
        elif isinstance(stop_reason, int) and stop_reason not in eos:
            reasons[i] = "stop_token"
        else:
            reasons[i] = "eos"
    return Continuation(ids, lps, reasons, from_engine=True)


# --------------------------------------------------------------------------- episodes
@dataclass
class Segment:
    """A run of completion tokens with one origin, loss mask, span and (maybe) known log-probs.

    ``origin`` is stated by every caller (no default): ``SAMPLED`` for the
    policy's own tokens, ``ENVIRONMENT`` for tool / environment output (use
    :meth:`Episode.add_observation`), ``INJECTED`` only for tokens put there
    from outside the episode (hints, reference answers, teacher corrections).
    ``logprobs`` are the behaviour log-probs when known (sampled in this very
    context); ``None`` means "teacher-force them at packing". ``engine``: the
    log-probs came from the vLLM engine (recomputed by the trainer at packing,
    the engine's kept for the importance weight). ``span``: 0 = none.
    """
    ids: list[int]
    origin: int
    train: bool = False
    logprobs: list[float] | None = None
    span: int = 0
    engine: bool = False


@dataclass
class Episode:
    """One row being built turn by turn: ``prompt`` token ids, then segments in order.

    Turns are numbered in ``span_ids`` from 1 (0 means "no span" in a
    RolloutBatch): every :meth:`add_model_turn` and :meth:`add_observation`
    opens the next span, so a model turn, an observation and a second model
    turn are spans 1, 2, 3. :meth:`add` appends with an explicit span (0 by
    default: no turn structure, as the injection strategies use it).
    ``truncated`` is set from the last model turn's finish reason
    (``"length"``); callers may set it themselves.
    """
    prompt: list[int]
    segments: list[Segment] = field(default_factory=list)
    truncated: bool = False
    turns: int = 0

    def completion_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.ids]

    def __len__(self) -> int:
        return sum(len(s.ids) for s in self.segments)

    def context(self) -> list[int]:
        """Prompt + every segment so far: what the next turn is sampled from."""
        return list(self.prompt) + self.completion_ids()

    def add(self, segment: Segment) -> "Episode":
        self.segments.append(segment)
        return self

    def add_model_turn(self, ids: list[int], logprobs: list[float], *, finish_reason: str | None = None,
                       engine: bool = False, train: bool = True) -> "Episode":
        """The policy's own tokens (``SAMPLED``, loss mask ``train``, their behaviour log-probs), as a new turn."""
        if len(ids) != len(logprobs):
            raise ValueError(f"add_model_turn: {len(ids)} tokens but {len(logprobs)} log-probs")
        self.turns += 1
        self.segments.append(Segment(list(ids), SAMPLED, train, list(logprobs), self.turns, engine))
        if finish_reason is not None:
            self.truncated = finish_reason == "length"
        return self

    def add_observation(self, ids: list[int]) -> "Episode":
        """Environment / tool output (``ENVIRONMENT``: attended to, loss mask 0, behaviour log-prob 0), as a new
        turn."""
        self.turns += 1
        self.segments.append(Segment(list(ids), ENVIRONMENT, False, [0.0] * len(ids), self.turns))
        return self


def pack_episodes(tokenizer, episodes: list[Episode], rows: list[dict], uids: list[int], group_ids: list[int], *,
                  max_length: int | None = None, logprobs_fn: Callable[[RolloutBatch], torch.Tensor] | None = None,
                  is_cap: float | None = None) -> RolloutBatch:
    """A RolloutBatch with one row per episode.

    ``prompt_ids`` / ``prompt_mask``: the episodes' prompts, left-padded with
    the pad id. Completion tensors: the segments in order, right-padded;
    ``completion_mask`` = the segment's ``train`` (ENVIRONMENT tokens are 0),
    ``completion_attention_mask`` = 1 on every token, ``token_origin`` and
    ``span_ids`` from the segments, ``behavior_logprobs`` the known log-probs.
    ``max_length`` cuts every row to that many completion tokens (a cut row
    keeps its own ``truncated`` flag: callers decide). ``truncated`` is each
    episode's flag; ``group_ids`` / ``prompt_uids`` as given; columns: the
    data columns of ``rows`` (without ``prompt``), ``prompt``, and
    ``completion`` (the decoded completion, a chat message when the prompt is a
    chat; special tokens skipped).

    Unknown log-probs (segments with ``logprobs=None``) and engine log-probs
    need ``logprobs_fn(batch) -> [R, T]`` (the behaviour policy's
    teacher-forced log-probs, e.g. ``RolloutContext.logprobs``): unknown ones
    are replaced by it; for engine tokens it becomes the behaviour log-prob and
    ``token_weights`` gets the truncated importance weight
    ``min(exp(trainer - engine), is_cap)`` there (1 elsewhere), as for the
    engine's plain rollouts.
    """
    n = len(episodes)
    ids, origin, train, lps, known, spans, eng = _flatten(episodes, max_length)

    pad = tokenizer.pad_token_id
    P = max([1] + [len(ep.prompt) for ep in episodes])
    p_ids = torch.full((n, P), pad, dtype=torch.long)
    p_mask = torch.zeros((n, P), dtype=torch.long)
    T = max([1] + [len(a) for a in ids])
    c_ids = torch.full((n, T), pad, dtype=torch.long)
    c_origin = torch.full((n, T), SAMPLED, dtype=torch.int8)
    c_train = torch.zeros((n, T))
    c_lp = torch.zeros((n, T))
    c_known = torch.ones((n, T), dtype=torch.bool)
    c_span = torch.zeros((n, T), dtype=torch.long)
    c_eng = torch.zeros((n, T), dtype=torch.bool)
    present = torch.zeros((n, T), dtype=torch.long)
    for i, ep in enumerate(episodes):
        if ep.prompt:
            p_ids[i, P - len(ep.prompt):] = torch.tensor(ep.prompt, dtype=torch.long)
            p_mask[i, P - len(ep.prompt):] = 1
        m = len(ids[i])
        if m:
            c_ids[i, :m] = torch.tensor(ids[i])
            c_origin[i, :m] = torch.tensor(origin[i], dtype=torch.int8)
            c_train[i, :m] = torch.tensor(train[i], dtype=torch.float)
            c_lp[i, :m] = torch.tensor(lps[i])
            c_known[i, :m] = torch.tensor(known[i])
            c_span[i, :m] = torch.tensor(spans[i], dtype=torch.long)
            c_eng[i, :m] = torch.tensor(eng[i])
            present[i, :m] = 1

    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
    columns["prompt"] = [r["prompt"] for r in rows]
    texts = tokenizer.batch_decode(c_ids, skip_special_tokens=True)
    columns["completion"] = [[{"role": "assistant", "content": t}] if isinstance(p, list) else t
                             for p, t in zip(columns["prompt"], texts)]
    batch = RolloutBatch(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids,
                         completion_mask=c_train * present, behavior_logprobs=c_lp * present,
                         completion_attention_mask=present, token_origin=c_origin, span_ids=c_span,
                         group_ids=torch.tensor(group_ids, dtype=torch.long),
                         prompt_uids=torch.tensor(uids, dtype=torch.long),
                         truncated=torch.tensor([ep.truncated for ep in episodes], dtype=torch.bool),
                         columns=columns)
    if not bool(c_known.all()):
        _teacher_force(batch, c_known, c_lp, c_eng, present, logprobs_fn, is_cap)
    return batch


def _flatten(episodes: list[Episode], max_length: int | None) -> tuple[list[list], ...]:
    """Per episode, its segments' per-token lists ``(ids, origin, train, logprobs, known, spans, engine)``, each
    cut to ``max_length`` tokens when given (``known``: a sampled log-prob not from the engine)."""
    L = max_length
    cut = (lambda x: x[:L]) if L is not None else (lambda x: x)
    ids, origin, train, lps, known, spans, eng = [], [], [], [], [], [], []
    for ep in episodes:
        a, o, t, lp, k, sp, e = [], [], [], [], [], [], []
        for s in ep.segments:
            a += s.ids
            o += [s.origin] * len(s.ids)
            t += [s.train] * len(s.ids)
            lp += s.logprobs if s.logprobs is not None else [0.0] * len(s.ids)
            k += [s.logprobs is not None and not s.engine] * len(s.ids)
            sp += [s.span] * len(s.ids)
            e += [s.engine] * len(s.ids)
        for dst, src in zip((ids, origin, train, lps, known, spans, eng), (a, o, t, lp, k, sp, e)):
            dst.append(cut(src))
    return ids, origin, train, lps, known, spans, eng


def _teacher_force(batch: RolloutBatch, c_known, c_lp, c_eng, present, logprobs_fn, is_cap) -> None:
    """Unknown behaviour log-probs replaced by ``logprobs_fn(batch)``; engine tokens get it too, and the truncated
    importance weight ``min(exp(trainer - engine), is_cap)`` in ``token_weights`` (see :func:`pack_episodes`)."""
    if logprobs_fn is None:
        raise ValueError("pack_episodes: some tokens have no known behaviour log-prob (injected, or drawn by "
                         "the engine); pass logprobs_fn to teacher-force them")
    forced = logprobs_fn(batch)
    batch.behavior_logprobs = torch.where(c_known, c_lp, forced) * present
    if bool(c_eng.any()):
        from .vllm_engine import importance_weights
        w = importance_weights(forced, c_lp, (c_eng & (present > 0)).float(),
                               float("inf") if is_cap is None else is_cap)
        batch.token_weights = w
