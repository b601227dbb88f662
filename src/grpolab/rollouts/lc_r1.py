"""LC-R1 rollout: crop correct completions to their valid thinking (Cheng et al., 2025, arXiv:2506.14755; 000-100)."""
from __future__ import annotations

import re

import torch

from ..batch import INJECTED, RolloutBatch
from ..data import completion_text
from ..registry import ROLLOUT_STRATEGIES, param
from ..rewards.transforms import CORRECT_REWARD, CORRECT_THRESHOLD, LC_EPS, LC_THINK_END, lc_correct

_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")


def lc_valid_thinking_end(thinking: str, answer: str) -> int | None:
    """Characters of ``thinking`` up to and including the first sentence that states ``answer``; None if absent.

    The answer must stand alone (no digit or decimal part glued to it, so ``7``
    is not found in ``17`` or ``7.5``); the sentence ends at the first ``.``,
    ``!`` or ``?`` followed by whitespace (included) or before the first newline
    after the answer, else at the end of the thinking.
    """
    a = str(answer).strip()
    if not a:
        return None
    m = re.search(r"(?<![\d.])" + re.escape(a) + r"(?!\d|\.\d)", thinking)
    if m is None:
        return None
    end = _SENTENCE_END.search(thinking, m.end())
    if end is None:
        return len(thinking)
    return end.start() if end.group() == "\n" else end.end()


def _decoded_len(tok, ids: list[int], n: int) -> int:
    return len(tok.decode(ids[:n], skip_special_tokens=True))


def tokens_within(tok, ids: list[int], chars: int) -> int:
    """The most leading tokens of ``ids`` whose decoded text has at most ``chars`` characters."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _decoded_len(tok, ids, mid) <= chars:
            lo = mid
        else:
            hi = mid - 1
    return lo


def tokens_covering(tok, ids: list[int], chars: int) -> int:
    """The fewest leading tokens of ``ids`` whose decoded text has at least ``chars`` characters."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if _decoded_len(tok, ids, mid) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


def crop_rows(batch: RolloutBatch, cuts: dict[int, tuple[int, int]], pad_id: int) -> RolloutBatch:
    """``batch`` with row ``i``'s completion tokens ``[k, m)`` removed for every ``i: (k, m)`` in ``cuts``.

    Every per-token tensor (ids, masks, log-probs, origins, spans, weights,
    ``step_data``) is cut the same way and re-padded on the right; the kept
    tail (from ``m``) is marked ``INJECTED`` (and its engine importance weight,
    if any, set to 1): it was sampled after the removed tokens, so its
    behaviour log-probs must be recomputed in the new context.
    """
    R, T = batch.completion_ids.shape
    lengths = batch.completion_attention_mask.sum(-1).tolist()
    keep = []
    for i in range(R):
        n = int(lengths[i])
        k, m = cuts.get(i, (n, n))
        keep.append(list(range(k)) + list(range(m, n)))
    T2 = max((len(k) for k in keep), default=0)
    fill = {"completion_ids": pad_id, "token_weights": 1.0}
    out = {}
    for name, v in vars(batch).items():
        if (not (isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape == (R, T)) or name.startswith("prompt")
                or name == "rewards"):
            continue
        new = torch.full((R, T2), fill.get(name, 0), dtype=v.dtype)
        for i, idx in enumerate(keep):
            new[i, :len(idx)] = v[i, idx]
        out[name] = new
    for i, (k, m) in cuts.items():
        out["token_origin"][i, k:len(keep[i])] = INJECTED
        if "token_weights" in out:  # engine importance weights: the tail's behaviour log-probs become the trainer's
            out["token_weights"][i, k:len(keep[i])] = 1.0
    step_data = {}
    for name, v in batch.step_data.items():  # per-step tensors [R, T, ...]: the same cut, zero-padded
        new = v.new_zeros((R, T2, *v.shape[2:]))
        for i, idx in enumerate(keep):
            new[i, :len(idx)] = v[i, idx]
        step_data[name] = new
    columns = {k: list(v) for k, v in batch.columns.items()}
    return RolloutBatch(**{**vars(batch), **out, "columns": columns, "step_data": step_data,
                           "row_data": dict(batch.row_data)})


@ROLLOUT_STRATEGIES.register("lc_r1", columns=lambda cfg: [cfg.lc_answer_column], needs=("text",))
def lc_r1(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
          lc_answer_column: str = param('answer', 'LC-R1: data column with the reference answer the valid '
                                        'thinking must state'),
          lc_think_end: str = LC_THINK_END,
          shaping_correct_reward: str = CORRECT_REWARD,
          shaping_correct_threshold: float = CORRECT_THRESHOLD) -> RolloutBatch:
    """LC-R1 valid-thinking crop and compress reward (Cheng et al., 2025, arXiv:2506.14755; seed 000-100).

    1. ``G`` completions per prompt are sampled and scored (the rewards of the
       *uncropped* completion are the rows' rewards, as in the authors' code).
    2. For each correct row (:func:`~grpolab.rewards.transforms.lc_correct`) the
       reasoning ``R`` is the tokens before the first end-of-thinking marker
       ``lc_think_end`` and the valid thinking ``R'`` its prefix up to and
       including the first sentence that states the reference answer
       (:func:`lc_valid_thinking_end`). When found, the row is cropped to
       ``R' + marker + the rest`` (everything between ``R'`` and the marker is
       removed) and trained on in that form; the kept tail is ``INJECTED``
       with teacher-forced behaviour log-probs (``ctx.logprobs``) in its new
       context.
    3. The compress reward of the row is ``1 - |R'| / (|R| + 1e-4)`` (tokens),
       ``-1`` when the answer is not in the reasoning (nothing cropped), and 0
       for wrong rows; it is written to the column ``lc_compress``, and the
       marker's first token position in the trained sequence to
       ``lc_think_end`` (-1: no marker), for the ``lc_compress_bonus``
       weighting, which adds it to the advantage at that one token.

    Metrics: ``rollout/lc_correct`` (rows), ``rollout/lc_cropped`` (rows),
    ``rollout/lc_answer_not_in_thinking`` (correct rows), ``rollout/lc_compress_mean``
    (over correct rows).

    Provenance: authors' code — https://github.com/zxiangx/LC-R1, trl/trainer/grpo_trainer.py
    (get_prefix, _generate_and_score_completions); matches the ``if self.crop``
    block: rows with ``rewards == 2`` are cut to ``ids[:lengths] + ids[max_lengths:]``,
    ``length_compress_ratio = 1 - lengths / (max_lengths + 1e-4)``, -1 when
    ``lengths == 0``, times the correct flag, and the cropped rows are the ones
    trained on. Known difference: the authors find ``R'`` with their
    LC-Extractor model (a fine-tuned Qwen that copies the thinking "up to and
    including the first sentence that reveals the ground-truth answer");
    grpolab cannot download it and uses the rule of :func:`lc_valid_thinking_end`
    (first stand-alone occurrence of the answer, to the end of its sentence).
    Their old log-probs are the current policy's on the cropped sequence
    (``num_iterations = 1``); here the cropped tail's are teacher-forced under
    the behaviour policy, the same values on-policy.
    Test: tests/test_lc_r1.py::test_lc_r1_rollout_crops_correct_rows.
    """
    batch = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
    ctx.score(batch)
    tok = ctx.tokenizer
    texts = [completion_text(c) for c in batch.columns["completion"]]
    if lc_answer_column not in batch.columns:
        raise ValueError(f"lc_answer_column: no data column '{lc_answer_column}' (columns: "
                         f"{', '.join(sorted(batch.columns))}); LC-R1 needs the reference answer")
    correct = lc_correct(batch.rewards, batch.reward_names, texts, shaping_correct_reward,
                         shaping_correct_threshold, lc_think_end)
    cuts, compress, marker_pos, not_found = _crops(tok, batch, texts, correct, batch.columns[lc_answer_column],
                                                   lc_think_end)
    out = crop_rows(batch, cuts, tok.pad_token_id)
    if cuts:
        _refresh_cropped(ctx, out, cuts)
    out.columns["lc_compress"] = compress
    out.columns["lc_think_end"] = marker_pos
    n_correct = int(correct.sum())
    ctx.metric("lc_correct", n_correct)
    ctx.metric("lc_cropped", len(cuts))
    ctx.metric("lc_answer_not_in_thinking", not_found)
    if n_correct:
        ctx.metric("lc_compress_mean", sum(compress[i] for i in range(len(texts)) if correct[i]) / n_correct)
    return out


def _crops(tok, batch: RolloutBatch, texts: list[str], correct, answers: list, think_end: str):
    """Per row, from its completion ``texts[i]``: ``(cuts, compress, marker_pos, not_found)``, the LC-R1 crop
    ``{row: (|R'|, |R|)}`` of the correct rows whose valid thinking is shorter than their reasoning, each row's
    compress reward and marker position (tokens; the lc_r1 docstring) and the correct rows whose reasoning does
    not state the answer."""
    lengths = batch.completion_attention_mask.sum(-1).tolist()
    cuts, compress, marker_pos = {}, [0.0] * batch.num_rows, [-1] * batch.num_rows
    not_found = 0
    for i, text in enumerate(texts):
        ids = batch.completion_ids[i, :int(lengths[i])].tolist()
        e = text.find(think_end)
        if e < 0:
            continue
        m = tokens_within(tok, ids, e)  # |R|: the reasoning tokens before the marker's first token
        marker_pos[i] = m
        if not correct[i]:
            continue
        v = lc_valid_thinking_end(text[:e], answers[i])
        k = 0 if v is None else min(tokens_covering(tok, ids, v), m)
        if k == 0:  # the answer is not derived in the reasoning: -1, nothing cropped
            compress[i] = -1.0
            not_found += 1
            continue
        compress[i] = 1.0 - k / (m + LC_EPS)
        marker_pos[i] = k
        if k < m:
            cuts[i] = (k, m)
    return cuts, compress, marker_pos, not_found


def _refresh_cropped(ctx, out: RolloutBatch, cuts: dict) -> None:
    """The cropped rows' INJECTED tails get teacher-forced behaviour log-probs (``ctx.logprobs``) in their new
    context, and their ``completion`` column the cropped text."""
    tok = ctx.tokenizer
    idx = sorted(cuts)
    part = out.select(idx)
    lp = ctx.logprobs(part)
    tail = part.token_origin == INJECTED
    out.behavior_logprobs[idx] = torch.where(tail, lp.to(part.behavior_logprobs.dtype), part.behavior_logprobs)
    new_texts = tok.batch_decode(part.completion_ids, skip_special_tokens=True)
    for j, i in enumerate(idx):
        c = out.columns["completion"][i]
        out.columns["completion"][i] = [{**c[0], "content": new_texts[j]}] if isinstance(c, list) else new_texts[j]
