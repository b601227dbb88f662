"""RolloutBatch: the one data structure that travels through the pipeline.

Shapes (R rows = completions, P prompt tokens, T completion tokens, K reward
functions)::

    prompt_ids        long  [R, P]  left-padded context the *loss* conditions on
    prompt_mask       long  [R, P]  1 = real token
    completion_ids    long  [R, T]  right-padded completion tokens
    completion_mask   float [R, T]  1 = token enters the loss (0 = padding or masked)
    completion_attention_mask long [R, T]  1 = token exists (attended to), even if
                                    left out of the loss (tool output, masked)
    behavior_logprobs float [R, T]  log-prob of each token under the context and
                                    policy it was produced with (0 where injected
                                    tokens had no policy log-prob)
    token_origin      int8  [R, T]  SAMPLED / INJECTED / ENVIRONMENT
    span_ids          long  [R, T]  0 = none; >0 marks turns, steps, tool spans
    group_ids         long  [R]     rows sharing a group are compared to each other
    prompt_uids       long  [R]     stable id of the source prompt (dataset index),
                                    never derived from the prompt text
    truncated         bool  [R]     hit max_completion_length without EOS
    rewards           float [R, K]  one column per reward function, NaN = unscorable
    scalar_rewards    float [R]     combined scalar reward (weights, then transforms),
                                    filled with the advantages
    advantages        float [R, T]  filled by the advantage stage
    token_weights     float [R, T]  optional per-token weights on the policy loss
                                    (e.g. the truncated importance weight between a
                                    generation engine and the trainer); None = 1
    step_data   {name: [R, T, ...]} per-step tensors of non-token actions (a column
                                    of [R, T] is one *step*: a token, a denoising
                                    step, an image token); empty for text
    row_data    {name: [R, ...]}    per-row tensors (a class label, initial noise,
                                    images); empty for text

Everything per-row that is not a tensor (prompt text, completion text, data
columns handed to reward functions) sits in ``columns`` as lists of length R.

Why these fields cover later variants without change:

* hints / reference answers / teacher corrections: injected tokens are marked
  ``INJECTED`` in ``token_origin`` and excluded from ``completion_mask`` when
  they should not be trained on; the loss context (``prompt_ids``) may differ
  from the generation context, and ``behavior_logprobs`` keeps the latter's
  log-probs so the importance ratio is exact.
* tool / multi-turn: environment tokens are ``ENVIRONMENT`` with mask 0;
  turns are ``span_ids``.
* trees, replay, ragged groups: ``group_ids`` is explicit and groups may have
  any size; replayed rows carry their original ``behavior_logprobs``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

SAMPLED, INJECTED, ENVIRONMENT = 0, 1, 2


def _leading(lead: tuple[int, ...]) -> str:
    """``(2, 5)`` -> ``"(2, 5, ...)"``: a shape whose leading dimensions are ``lead``."""
    return "(" + ", ".join(str(n) for n in lead) + ", ...)"


@dataclass
class RolloutBatch:
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    behavior_logprobs: torch.Tensor
    group_ids: torch.Tensor
    prompt_uids: torch.Tensor
    truncated: torch.Tensor
    completion_attention_mask: torch.Tensor | None = None
    token_origin: torch.Tensor | None = None
    span_ids: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    reward_names: list[str] = field(default_factory=list)
    scalar_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    token_weights: torch.Tensor | None = None
    columns: dict[str, list[Any]] = field(default_factory=dict)
    step_data: dict[str, torch.Tensor] = field(default_factory=dict)
    row_data: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        R, T = self.completion_ids.shape
        if self.token_origin is None:
            self.token_origin = torch.full((R, T), SAMPLED, dtype=torch.int8)
        if self.completion_attention_mask is None:
            self.completion_attention_mask = (self.completion_mask > 0).long()
        if self.span_ids is None:
            self.span_ids = torch.zeros((R, T), dtype=torch.long)
        for name in ("prompt_ids", "prompt_mask"):
            if getattr(self, name).shape[0] != R:
                raise ValueError(f"RolloutBatch.{name} has {getattr(self, name).shape[0]} rows, expected {R}")
        for name in ("completion_mask", "completion_attention_mask", "behavior_logprobs", "token_origin",
                     "span_ids"):
            if tuple(getattr(self, name).shape) != (R, T):
                raise ValueError(f"RolloutBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {(R, T)}")
        for name in ("group_ids", "prompt_uids", "truncated"):
            if getattr(self, name).shape != (R,):
                raise ValueError(f"RolloutBatch.{name} must have shape ({R},)")
        for k, v in self.columns.items():
            if len(v) != R:
                raise ValueError(f"RolloutBatch column '{k}' has {len(v)} entries, expected {R}")
        for name, lead in (("step_data", (R, T)), ("row_data", (R,))):
            for k, v in getattr(self, name).items():
                if not isinstance(v, torch.Tensor):
                    raise ValueError(f"RolloutBatch.{name}[{k!r}] is a {type(v).__name__}, expected a tensor of "
                                     f"shape {_leading(lead)}")
                if tuple(v.shape[:len(lead)]) != lead:
                    raise ValueError(f"RolloutBatch.{name}[{k!r}] has shape {tuple(v.shape)}, expected "
                                     f"{_leading(lead)}")

    def __setstate__(self, state: dict) -> None:
        """Unpickling (a format-1 checkpoint's replay buffer, a batch pickled by an older grpolab): the fields a
        batch pickled before they existed lack take their defaults."""
        self.__dict__.update(state)
        for name in ("step_data", "row_data"):
            if name not in self.__dict__:
                self.__dict__[name] = {}

    @property
    def num_rows(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1)

    def to(self, device: torch.device | str) -> "RolloutBatch":
        """This batch with every tensor on ``device`` (itself when they already are)."""
        device = torch.device(device)
        if self.completion_ids.device == device and all(v.device == device for d in (self.step_data, self.row_data)
                                                        for v in d.values()):
            return self
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        for name in ("step_data", "row_data"):
            moved[name] = {k: v.to(device) for k, v in getattr(self, name).items()}
        return replace(self, **moved)

    def select(self, index: torch.Tensor | list[int]) -> "RolloutBatch":
        """Rows ``index`` of this batch (a new batch; tensors are indexed, lists gathered)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v[idx]
            elif f.name == "columns":
                out[f.name] = {k: [col[i] for i in idx.tolist()] for k, col in v.items()}
            elif f.name in ("step_data", "row_data"):
                out[f.name] = {k: t[idx] for k, t in v.items()}
            else:
                out[f.name] = v
        return replace(self, **out)

    @staticmethod
    def concat(batches: list["RolloutBatch"], pad_id: int = 0) -> "RolloutBatch":
        """Stack batches row-wise; prompts are left-padded and completions
        right-padded to the widest batch (``step_data`` too, with 0; ``row_data``
        is stacked, zero-padded to the widest in each trailing dimension where the batches differ: a VLM's
        per-row picture tensors, whose layouts read zeros as no picture). Every batch must have the same ``step_data`` and ``row_data``
        keys."""
        if len(batches) == 1:
            return batches[0]
        for name in ("step_data", "row_data"):
            keys = [set(getattr(b, name)) for b in batches]
            every = set().union(*keys)
            for i, ks in enumerate(keys):
                if ks != every:
                    missing = sorted(every - ks)[0]
                    has = next(j for j, other in enumerate(keys) if missing in other)
                    raise ValueError(f"RolloutBatch.concat: batch {i} of {len(batches)} has no {name}[{missing!r}] "
                                     f"(batch {has} has it); every batch must have the same {name} keys")
        P = max(b.prompt_ids.shape[1] for b in batches)
        T = max(b.completion_ids.shape[1] for b in batches)

        def pad(x: torch.Tensor, width: int, left: bool, value) -> torch.Tensor:
            extra = width - x.shape[1]
            if extra == 0:
                return x
            filler = torch.full((x.shape[0], extra, *x.shape[2:]), value, dtype=x.dtype, device=x.device)
            return torch.cat([filler, x] if left else [x, filler], dim=1)

        out: dict[str, Any] = {}
        for f in fields(RolloutBatch):
            vals = [getattr(b, f.name) for b in batches]
            if f.name == "columns":
                out[f.name] = {k: [x for v in vals for x in v[k]] for k in vals[0]}
            elif f.name == "reward_names":
                out[f.name] = vals[0]
            elif f.name == "step_data":
                out[f.name] = {k: torch.cat([pad(v[k], T, False, 0) for v in vals]) for k in vals[0]}
            elif f.name == "row_data":
                out[f.name] = {k: _cat_padded([v[k] for v in vals]) for k in vals[0]}
            elif f.name == "token_weights" and any(v is not None for v in vals):
                out[f.name] = torch.cat([pad(v if v is not None else torch.ones(b.completion_ids.shape), T, False, 0)
                                         for v, b in zip(vals, batches)])
            elif any(v is None for v in vals):
                out[f.name] = None
            elif vals[0].dim() == 2 and f.name.startswith("prompt"):
                value = pad_id if f.name == "prompt_ids" else 0
                out[f.name] = torch.cat([pad(v, P, True, value) for v in vals])
            elif vals[0].dim() == 2 and f.name != "rewards":
                value = pad_id if f.name == "completion_ids" else 0
                out[f.name] = torch.cat([pad(v, T, False, value) for v in vals])
            else:
                out[f.name] = torch.cat(vals)
        return RolloutBatch(**out)

    def trim(self) -> "RolloutBatch":
        """Drop trailing completion columns that no row uses (right padding only)."""
        used = int(self.completion_attention_mask.sum(-1).max()) if self.num_rows else 0
        T = self.completion_ids.shape[1]
        if used >= T or used == 0:
            return self
        out = {f.name: getattr(self, f.name)[:, :used] for f in fields(self)
               if isinstance(getattr(self, f.name), torch.Tensor) and getattr(self, f.name).dim() == 2
               and getattr(self, f.name).shape[1] == T and not f.name.startswith("prompt")
               and f.name != "rewards"}
        out["step_data"] = {k: v[:, :used] for k, v in self.step_data.items()}
        return replace(self, **out)

    def micro_batches(self, rows: int, trim: bool = True, max_tokens: int = 0) -> list["RolloutBatch"]:
        """Split into consecutive chunks of at most ``rows`` rows.

        With ``max_tokens`` > 0 a chunk also closes before its padded size
        (rows x (prompt width + longest completion)) would exceed ``max_tokens``,
        so memory per forward is bounded by tokens rather than rows (a single
        row larger than the budget forms its own chunk). With ``trim`` each
        chunk keeps only as many completion columns as its longest row needs,
        so padding costs no compute (masked positions never change the loss,
        so results are the same).
        """
        n = self.num_rows
        if max_tokens <= 0:
            bounds = [(i, min(i + rows, n)) for i in range(0, n, rows)]
        else:
            lengths = self.completion_attention_mask.sum(-1).tolist()
            width = self.prompt_ids.shape[1]
            bounds, start, longest = [], 0, 0
            for i in range(n):
                longest_i = max(longest, int(lengths[i]))
                size = (i - start + 1) * (width + longest_i)
                if i > start and (i - start >= rows or size > max_tokens):
                    bounds.append((start, i))
                    start, longest_i = i, int(lengths[i])
                longest = longest_i
            if n:
                bounds.append((start, n))
        chunks = [self.select(list(range(a, b))) for a, b in bounds]
        return [c.trim() for c in chunks] if trim else chunks


def _cat_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` along dim 0, each part zero-padded at the end of every trailing dimension to the widest."""
    shape = [max(p.shape[d] for p in parts) for d in range(1, parts[0].dim())]
    if all(list(p.shape[1:]) == shape for p in parts):
        return torch.cat(parts)
    out = []
    for p in parts:
        q = p.new_zeros((p.shape[0], *shape))
        q[(slice(None), *(slice(0, n) for n in p.shape[1:]))] = p
        out.append(q)
    return torch.cat(out)
