"""Rollout strategies that inject tokens into completions.

Every strategy here builds completions out of *segments*: tokens the policy
sampled (``SAMPLED``, with the log-prob recorded when they were drawn) and
tokens put there from outside (``INJECTED``: a reference answer, a ground-truth
prefix, a corrected sentence, teacher feedback), optionally followed by a
continuation the behaviour policy samples *conditioned on everything before
it*. One helper, :func:`compose_rows`, does that for all of them:

* the loss context ``prompt_ids`` is always the original prompt; the
  injected tokens sit in ``completion_ids`` exactly as they were tokenized
  (the continuation is sampled from ``prompt ids + head ids``, never from
  re-tokenized text, so what the policy saw is what the loss sees);
* injected tokens are marked ``INJECTED`` in ``token_origin`` and get the
  behaviour log-prob they really have, teacher-forced under the behaviour
  policy with :meth:`RolloutContext.logprobs`; sampled tokens keep the
  log-prob recorded at sampling time;
* whether injected tokens enter the loss (``completion_mask``) is a
  per-strategy config key (``*_train_*``), documented per paper; they are
  always attended to (``completion_attention_mask``);
* every row has at most ``max_completion_length`` tokens (longer heads are
  cut and the row is flagged ``truncated``), so the rows concatenate with
  plain rollouts through :meth:`RolloutBatch.concat`.

The reference answer of a data row is ``injection_reference_template``
formatted with the row's columns (:func:`reference_text`); the default
``"Answer: {solution}"`` is what the ``countdown`` reward accepts
(``arithmetic``: ``"Answer: {answer}"``).

Strategies that need to know which rollouts failed score the batch
themselves (``ctx.score``), so the trainer does not score again; rows they
add or change are scored too. "Failed" always means: combined scalar reward
(``ctx.scalar``: weights, then reward transforms) below the core key
``success_threshold`` (shared by every component that counts successes; no
paper here sets its own); unscorable (NaN) rows never count as failed.
"""
from __future__ import annotations

import copy
import difflib
import math
import re
import string
from pathlib import Path

import torch

from ..batch import INJECTED, SAMPLED, RolloutBatch
from ..errors import ConfigError
from ..data import render_prompt, tokenize_prompts
from ..generation.plain import eos_token_ids
from ..generation.turns import Episode, Segment, continue_sequences, pack_episodes
from ..registry import ROLLOUT_STRATEGIES
from ..registry import param

REFERENCE_TEMPLATE = param("Answer: {solution}", "reference completion for injection strategies, formatted with "
                           "the row's columns (countdown: 'Answer: {solution}'; arithmetic: 'Answer: {answer}')")


# --------------------------------------------------------------------------- helpers
def reference_text(row: dict, template: str) -> str:
    """The row's reference completion: ``template`` formatted with the row's columns."""
    try:
        return template.format(**row)
    except (KeyError, IndexError) as e:
        raise ConfigError(f"injection_reference_template '{template}' needs column {e} which the data row does "
                          f"not have (columns: {', '.join(sorted(row))}); set injection_reference_template "
                          f"to a template over the data's columns") from None


def template_columns(cfg) -> list[str]:
    """The data columns ``injection_reference_template`` reads (checked on every row before training)."""
    names = [f for _, f, _, _ in string.Formatter().parse(cfg.injection_reference_template) if f]
    return sorted({re.split(r"[.\[]", f)[0] for f in names})


def _thinktuning_columns(cfg) -> list[str]:
    return template_columns(cfg) if cfg.thinktuning_use_reference else []


def text_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sampled_head(batch: RolloutBatch, i: int, eos_ids: list[int], max_tokens: int | None = None) -> Segment:
    """Row ``i``'s own tokens as a SAMPLED segment (trailing EOS dropped, at most ``max_tokens``)."""
    n = int(batch.completion_attention_mask[i].sum())
    ids = batch.completion_ids[i, :n].tolist()
    lps = batch.behavior_logprobs[i, :n].tolist()
    if ids and ids[-1] in eos_ids:
        ids, lps = ids[:-1], lps[:-1]
    if max_tokens is not None:
        ids, lps = ids[:max_tokens], lps[:max_tokens]
    return Segment(ids, SAMPLED, True, lps)


def compose_rows(ctx, rows: list[dict], uids: list[int], group_ids: list[int], heads: list[list[Segment]], *,
                 continue_: bool | list[bool] = True) -> RolloutBatch:
    """One completion per row: ``heads[i]`` (its segments, in order), then a sampled continuation.

    The continuation (SAMPLED, in the loss) is drawn by the behaviour policy
    from ``prompt + head`` with at most ``max_completion_length - len(head)``
    new tokens, at the config temperature, through :meth:`RolloutContext.continue_`
    (so through the vLLM engine when one is configured; its tokens are then
    teacher-forced by the trainer and weighted like the engine's plain rows).
    All rows to continue go in one call whose budget is the largest room; each
    row is cut to its own. The continuation is skipped where ``continue_`` is
    False, where the head already ends with EOS or fills the budget. Heads
    longer than ``max_completion_length`` are cut. Unknown behaviour log-probs
    (injected tokens) are teacher-forced with ``ctx.logprobs``. Rows are built
    as :class:`~grpolab.generation.turns.Episode` s (no span ids: 0) and packed
    with :func:`~grpolab.generation.turns.pack_episodes`.
    """
    cfg, tok = ctx.cfg, ctx.tokenizer
    L = cfg.max_completion_length
    eos = eos_token_ids(tok, ctx.policy)
    n = len(rows)
    conts = continue_ if isinstance(continue_, list) else [continue_] * n
    prompt_ids, prompt_mask = tokenize_prompts(tok, [r["prompt"] for r in rows], cfg.max_prompt_length)

    episodes = []
    for i, segs in enumerate(heads):
        ep = Episode(prompt_ids[i][prompt_mask[i].bool()].tolist())
        room = L
        for s in segs:  # the head, cut to the budget
            if room <= 0:
                break
            k = min(len(s.ids), room)
            ep.add(Segment(s.ids[:k], s.origin, s.train, None if s.logprobs is None else s.logprobs[:k],
                           s.span, s.engine))
            room -= k
        ids = ep.completion_ids()
        ep.truncated = not (bool(ids) and ids[-1] in eos)
        episodes.append(ep)

    todo = [i for i in range(n) if conts[i] and episodes[i].truncated and len(episodes[i]) < L]
    if todo:
        out = ctx.continue_([episodes[i].context() for i in todo],
                            max_new_tokens=[L - len(episodes[i]) for i in todo])
        for j, i in enumerate(todo):  # a cut sample is still a sample of its first tokens
            episodes[i].add(Segment(out.ids[j], SAMPLED, True, out.logprobs[j], 0, out.from_engine))
            episodes[i].truncated = out.finish_reasons[j] != "eos"
    return pack_episodes(tok, episodes, rows, uids, group_ids, max_length=L, logprobs_fn=ctx.logprobs,
                         is_cap=cfg.vllm_is_cap)


def reference_rows(ctx, rows: list[dict], uids: list[int], group_ids: list[int], *, train: bool,
                   template: str) -> RolloutBatch:
    """Whole injected completions: each row's reference answer (``template`` formatted with the row) + EOS,
    teacher-forced, nothing sampled.

    Longer than ``max_completion_length``: cut (and flagged truncated), like any completion.
    """
    tok = ctx.tokenizer
    eos = tok.eos_token_id
    heads = [[Segment(text_ids(tok, reference_text(r, template)) + [eos], INJECTED, train)] for r in rows]
    return compose_rows(ctx, rows, uids, group_ids, heads, continue_=False)


def _column_rows(batch: RolloutBatch, idx: list[int]) -> list[dict]:
    """The data rows behind batch rows ``idx`` (prompt + data columns, without the completion)."""
    return [{k: v[i] for k, v in batch.columns.items() if k != "completion"} for i in idx]


def replace_rows(batch: RolloutBatch, idx: list[int], new: RolloutBatch, pad_id: int) -> RolloutBatch:
    """``batch`` with row ``idx[k]`` replaced by row ``k`` of ``new`` (order kept)."""
    if not idx:
        return batch
    R = batch.num_rows
    order = list(range(R))
    for k, j in enumerate(idx):
        order[j] = R + k
    return RolloutBatch.concat([batch, new], pad_id=pad_id).select(order)


def by_group(batch: RolloutBatch) -> RolloutBatch:
    """Rows reordered so each group is contiguous (stable; groups in id order)."""
    order = torch.argsort(batch.group_ids, stable=True)
    return batch.select(order)


def failed_rows(scalar: torch.Tensor, threshold: float) -> torch.Tensor:
    """Rows whose scalar reward is below ``threshold`` (NaN = unscorable = not failed)."""
    return scalar < threshold


def all_failed_groups(scalar: torch.Tensor, group_ids: torch.Tensor, threshold: float) -> list[int]:
    """Group ids in which every row failed."""
    fail = failed_rows(scalar, threshold)
    return [int(g) for g in torch.unique(group_ids) if bool(fail[group_ids == g].all())]


def _pick(rows: list[int], fraction: float, generator: torch.Generator) -> list[int]:
    """``ceil(fraction * len(rows))`` of ``rows``, drawn at random (sorted)."""
    k = min(len(rows), math.ceil(fraction * len(rows) - 1e-9))
    if k <= 0:
        return []
    perm = torch.randperm(len(rows), generator=generator)[:k]
    return sorted(rows[int(p)] for p in perm)


def _sample_and_score(ctx, rows, uids, group_offset, budgets, temperatures):
    batch = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
    return batch, ctx.score(batch)


def _check_fraction(cfg, fraction_key: str) -> None:
    if not 0 <= getattr(cfg, fraction_key) <= 1:
        raise ConfigError(f"{fraction_key}: must be in [0, 1], got {getattr(cfg, fraction_key)}")


# ------------------------------------------------------------------- GCPO (000-15)
def gcpo_reference(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                   injection_reference_template: str = REFERENCE_TEMPLATE,
                   success_threshold: float = 1.0,
                   gcpo_train_reference: bool = param(True, 'gcpo_reference: the injected reference tokens enter the '
                                                      'loss')):
    """GCPO reference-answer injection (Wu et al., 2025, "GCPO: Group Contrastive Policy
    Optimization", github.com/AchoWu/GCPO; seed 000-15).

    G completions are sampled and scored. For every group in which *all*
    rollouts fail (scalar reward < ``success_threshold``) the last
    rollout is replaced by the reference answer (``injection_reference_template``
    + EOS), marked INJECTED, teacher-forced under the behaviour policy and
    scored like any completion. The group then has a correct member, so its
    rewards vary and every row gets a non-zero advantage: the failed rows are
    pushed down, the reference up.

    Provenance: reconstructed from the abstract — GCPO: When Contrast Fails,
    Go Gold (Wu and Liu, 2025, arXiv:2510.07790). The reference *replaces*
    one rollout (the group size stays G: "the reference answer supplies the
    correct response"); it is trained on (``gcpo_train_reference``: the
    paper's point is to emulate the reference's solution) with ratio
    pi_theta / pi_behaviour like sampled tokens, its behaviour log-probs
    being the teacher-forced ones. A summary page (sciencestack TL;DR) adds
    that the paper uses a sequence-level importance ratio and no KL; the
    recipe keeps the token-level clipped ratio because the clip ranges are not
    known (``policy_loss: sequence_ratio`` gives the sequence form). The
    authors' code (github.com/AchoWu/GCPO, named in the abstract) is not in
    the searched store (index, snapshot fetch); the paper's method section
    was not stored either.
    """
    batch, scalar = _sample_and_score(ctx, rows, uids, group_offset, budgets, temperatures)
    groups = all_failed_groups(scalar, batch.group_ids, success_threshold)
    if not groups:
        return batch
    idx = [int((batch.group_ids == g).nonzero()[-1]) for g in groups]
    new = reference_rows(ctx, _column_rows(batch, idx), batch.prompt_uids[idx].tolist(), groups,
                         train=gcpo_train_reference, template=injection_reference_template)
    ctx.score(new)
    return replace_rows(batch, idx, new, ctx.tokenizer.pad_token_id)


ROLLOUT_STRATEGIES.register("gcpo_reference", columns=template_columns, needs=("text",))(gcpo_reference)


# ------------------------------------------------------- DaGRPO anchors (000-17)
def dagrpo_anchors(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                   injection_reference_template: str = REFERENCE_TEMPLATE,
                   success_threshold: float = 1.0,
                   dagrpo_num_anchors: int = param(1, 'dagrpo_anchors: reference (anchor) completions added to each '
                                                   'group without a positive'),
                   dagrpo_train_anchors: bool = param(True, 'dagrpo_anchors: the anchor tokens enter the loss')):
    """DaGRPO Off-policy Data Augmentation (Xie et al., 2025, arXiv:2512.06337; seed 000-17).

    "For hard queries, the scarcity of valid positive samples results in
    ineffective optimization": groups with *no* positive rollout (every
    scalar reward < ``success_threshold``) are augmented with
    ``dagrpo_num_anchors`` high-quality off-policy anchors -- here the
    data row's reference answer (``injection_reference_template`` + EOS),
    the only expert response available offline. Anchors are INJECTED rows,
    teacher-forced under the behaviour policy, scored, and *added* to the
    group (it grows from G to G + anchors: a ragged group), unlike GCPO
    which replaces a rollout. Groups that already have a positive are left
    alone. Anchors enter the loss (``dagrpo_train_anchors``; the paper mixes
    SFT-like anchor learning into the RL objective).

    Combine with the ``dagrpo_distinct_pairs`` advantage for the full method
    (recipe ``dagrpo_anchors``).

    Provenance: reconstructed from the abstract — the anchor is the data
    row's reference answer, added (not substituted) to groups with no
    positive rollout, trained with the plain group advantage and the exact
    behaviour ratio (no extra weighting); how the paper weights anchors is
    not known. Searched: arXiv:2512.06337 (stored html v1: abstract and
    introduction), paper summaries, the code index (no authors' repository).
    """
    batch, scalar = _sample_and_score(ctx, rows, uids, group_offset, budgets, temperatures)
    groups = all_failed_groups(scalar, batch.group_ids, success_threshold)
    if not groups or dagrpo_num_anchors < 1:
        return batch
    first = [int((batch.group_ids == g).nonzero()[0]) for g in groups]
    src = [i for i in first for _ in range(dagrpo_num_anchors)]
    gids = [g for g in groups for _ in range(dagrpo_num_anchors)]
    new = reference_rows(ctx, _column_rows(batch, src), batch.prompt_uids[src].tolist(), gids,
                         train=dagrpo_train_anchors, template=injection_reference_template)
    ctx.score(new)
    return by_group(RolloutBatch.concat([batch, new], pad_id=ctx.tokenizer.pad_token_id))


def _dagrpo_check(cfg) -> None:
    if cfg.dagrpo_num_anchors < 0:
        raise ConfigError(f"dagrpo_num_anchors: must be >= 0, got {cfg.dagrpo_num_anchors}")


ROLLOUT_STRATEGIES.register("dagrpo_anchors", check=_dagrpo_check, columns=template_columns,
                            needs=("text",))(dagrpo_anchors)


# -------------------------------------------------------------- G2RPO-A (004-07)
def _check_g2rpo_a(cfg) -> None:
    if not 0 <= cfg.g2rpo_a_guided_rows < cfg.num_generations:
        raise ConfigError(f"g2rpo_a_guided_rows: must be in [0, num_generations), got "
                          f"{cfg.g2rpo_a_guided_rows} with num_generations={cfg.num_generations}")
    for k in ("g2rpo_a_initial_length", "g2rpo_a_max_length", "g2rpo_a_window"):
        if getattr(cfg, k) < 1:
            raise ConfigError(f"{k}: must be >= 1, got {getattr(cfg, k)}")


@ROLLOUT_STRATEGIES.register("g2rpo_a", check=_check_g2rpo_a, columns=template_columns, needs=("text",))
class G2RPOAdaptiveGuidance:
    """G²RPO-A adaptive prefix guidance (Guo, Deng, Cheng and Tang, 2025, arXiv:2508.13023,
    github.com/T-Lab-CUHKSZ/G2RPO-A; seed 004-07).

    In each group, ``g2rpo_a_guided_rows`` = k rows start with the first
    ``l`` tokens of the ground-truth solution (``injection_reference_template``),
    INJECTED, and the policy continues from there (sampled conditioned on the
    prefix); the other G - k rows are plain rollouts. The guidance tokens
    enter the loss (``g2rpo_a_train_guidance``; in the authors' code the
    guidance is part of the completion and only padding is masked).

    Guidance length ``l`` adapts to training reward (authors' code,
    ``_compute_new_guidance_length``): the step's mean reward ``r_t`` (all
    rows, guided included; ``g2rpo_a_reward`` names the reward function, ''
    = combined scalar) is collected for ``T = g2rpo_a_window`` steps; at the
    next step it is compared with their mean ``r_bar``::

        r_t < r_bar:  l <- min(int(l * r_bar / r_t), g2rpo_a_max_length)   (worse: more guidance)
        r_t > r_bar:  l <- max(int(l * r_bar / r_t), 1)                    (better: less guidance)

    (no change if ``r_t`` or ``r_bar`` is 0 or they are equal), then the
    history is cleared and a new window starts -- the authors' 3-step cycle
    for T = 2. The new ``l`` applies from the next rollout. The number of
    guided rows is fixed (the authors guide 2 of 12). ``l`` and the
    history are checkpointed (``state_dict``).

    Provenance: authors' code — https://github.com/T-Lab-CUHKSZ/G2RPO-A, src/G2RPO-A/trainer/g2rpoa_trainer.py
    (_compute_new_guidance_length); a fixed number of guided rows per group, as the authors'.
    Test: tests/test_rollout_injection.py::test_g2rpo_a_adaptation_hand_computed.
    """

    def __init__(self, *, injection_reference_template: str = REFERENCE_TEMPLATE,
                 g2rpo_a_guided_rows: int = param(1, 'g2rpo_a: rows of each group whose completion starts with the '
                                                  'first l reference tokens (the rest are plain rollouts)'),
                 g2rpo_a_initial_length: int = param(8, 'g2rpo_a: initial guidance length l (reference tokens '
                                                     'revealed)'),
                 g2rpo_a_max_length: int = param(64, 'g2rpo_a: upper bound on the guidance length l'),
                 g2rpo_a_window: int = param(2, 'g2rpo_a: steps of reward history the current step is compared with'),
                 g2rpo_a_reward: str = param('', 'g2rpo_a: reward function whose batch mean drives the adaptation '
                                             "('' = the combined scalar reward)"),
                 g2rpo_a_train_guidance: bool = param(True, 'g2rpo_a: the injected guidance tokens enter the loss')):
        self.template = injection_reference_template
        self.guided_rows = g2rpo_a_guided_rows
        self.length = g2rpo_a_initial_length
        self.max_length = g2rpo_a_max_length
        self.window = g2rpo_a_window
        self.reward = g2rpo_a_reward
        self.train_guidance = g2rpo_a_train_guidance
        self.history: list[float] = []


    def observe(self, r: float) -> int:
        """Feed one step's mean reward; returns the guidance length for the next step."""
        if len(self.history) < self.window:
            self.history.append(float(r))
            return self.length
        r_bar = sum(self.history) / len(self.history)
        if r > 0 and r_bar > 0 and r != r_bar:
            scaled = int(self.length * r_bar / r)
            self.length = min(scaled, self.max_length) if r < r_bar else max(scaled, 1)
        self.history = []
        return self.length

    def __call__(self, ctx, rows, uids, group_offset, budgets=None, temperatures=None):
        sizes = budgets if budgets is not None else [ctx.cfg.num_generations] * len(rows)
        k = [min(self.guided_rows, max(g - 1, 0)) for g in sizes]
        parts = []
        if any(g - kk > 0 for g, kk in zip(sizes, k)):
            keep = [i for i in range(len(rows)) if sizes[i] - k[i] > 0]
            plain = ctx.generate([rows[i] for i in keep], [uids[i] for i in keep], group_offset=0,
                                 num_generations=[sizes[i] - k[i] for i in keep] if budgets is not None
                                 else ctx.cfg.num_generations - self.guided_rows,
                                 temperature=[temperatures[i] for i in keep] if temperatures is not None else None)
            plain.group_ids = torch.tensor([group_offset + keep[int(g)] for g in plain.group_ids])
            parts.append(plain)
        src = [i for i in range(len(rows)) for _ in range(k[i])]
        if src:
            tok = ctx.tokenizer
            template = self.template
            heads = [[Segment(text_ids(tok, reference_text(rows[i], template))[:self.length], INJECTED,
                              self.train_guidance)] for i in src]
            parts.append(compose_rows(ctx, [rows[i] for i in src], [uids[i] for i in src],
                                      [group_offset + i for i in src], heads))
        batch = by_group(RolloutBatch.concat(parts, pad_id=ctx.tokenizer.pad_token_id))
        scalar = ctx.score(batch)
        if self.reward:
            if self.reward not in batch.reward_names:
                raise ConfigError(f"g2rpo_a_reward: no reward function '{self.reward}' (have: "
                                  f"{', '.join(batch.reward_names)})")
            signal = batch.rewards[:, batch.reward_names.index(self.reward)]
        else:
            signal = scalar
        if (~signal.isnan()).any():
            self.observe(float(torch.nanmean(signal)))
        return batch

    def state_dict(self) -> dict:
        return {"length": self.length, "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.length = int(state["length"])
        self.history = [float(x) for x in state["history"]]


# ------------------------------------------------------------- EditGRPO (004-11)
_SENTENCE = re.compile(r"[^.!?\n]*(?:[.!?\n]+|$)")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` with their terminators; they concatenate back to ``text``."""
    return [s for s in _SENTENCE.findall(text) if s]


def _norm(sentence: str) -> list[str]:
    return sentence.split()


def sentence_similarity(a: str, b: str) -> float:
    """Similarity in [0, 1] of two sentences (difflib ratio on whitespace-normalised text)."""
    return difflib.SequenceMatcher(None, " ".join(_norm(a)), " ".join(_norm(b))).ratio()


def edit_sentences(attempt: str, reference: str, num_ops: int = 1, threshold: float = 0.6,
                   generator: torch.Generator | None = None) -> str:
    """EditGRPO's post-rollout edit: at most ``num_ops`` sentence operations against the reference.

    As the authors' ``process_text_with_server_analysis`` (operation priority
    replace, delete, add; one operation per cycle; an emptied text gets one
    added sentence). A sentence of the attempt is a *false positive* (FP) when
    no reference sentence equals it (whitespace-insensitive); a reference
    sentence missing from the attempt is a *false negative* (FN).

    1. replace: the first FP sentence whose most similar reference sentence
       has :func:`sentence_similarity` >= ``threshold`` is replaced by it;
    2. else delete the first FP sentence;
    3. else append a random FN sentence (``generator``).

    The authors match radiology entities (NER, embedding similarity); this
    sentence-level similarity is the stand-in for text tasks.
    """
    sents = split_sentences(attempt)
    ref = split_sentences(reference)
    ref_norm = [_norm(r) for r in ref]
    done: set[int] = set()  # attempt sentences already edited

    def fps():
        return [i for i, x in enumerate(sents) if i not in done and _norm(x) not in ref_norm and x.strip()]

    def fns():
        have = [_norm(x) for x in sents]
        return [r for r, n in zip(ref, ref_norm) if n not in have and r.strip()]

    def add_one() -> bool:
        cand = fns()
        if not cand:
            return False
        k = int(torch.randint(len(cand), (1,), generator=generator)) if len(cand) > 1 else 0
        tail = "" if not sents or sents[-1].endswith((" ", "\n")) else " "
        sents.append(tail + cand[k].strip())
        done.add(len(sents) - 1)
        return True

    for _ in range(num_ops):
        performed = False
        for i in fps():  # replace
            best = max(ref, key=lambda r: sentence_similarity(sents[i], r), default=None)
            if best is not None and sentence_similarity(sents[i], best) >= threshold:
                lead = sents[i][:len(sents[i]) - len(sents[i].lstrip())]
                trail = sents[i][len(sents[i].rstrip()):]
                sents[i] = lead + best.strip() + trail
                done.add(i)
                performed = True
                break
        if not performed and fps():  # delete
            del sents[fps()[0]]
            done.clear()  # indices moved; the deleted sentence is gone
            performed = True
        if not performed:
            performed = add_one()
        if not performed:
            break
    if not "".join(sents).strip():
        add_one()
    return "".join(sents)


def _common_head_tokens(tok, ids: list[int], original: str, edited: str) -> int:
    """Most leading tokens of ``ids`` whose decoded text is a prefix of both ``original`` and ``edited``."""
    n = 0
    while n < min(len(original), len(edited)) and original[n] == edited[n]:
        n += 1
    k = 0
    while k < len(ids):
        text = tok.decode(ids[:k + 1], skip_special_tokens=True)
        if len(text) > n or not edited.startswith(text):
            break
        k += 1
    return k


def _check_editgrpo(cfg) -> None:
    _check_fraction(cfg, "editgrpo_edit_fraction")
    if cfg.editgrpo_num_ops < 1:
        raise ConfigError(f"editgrpo_num_ops: must be >= 1, got {cfg.editgrpo_num_ops}")
    if not 0.0 <= cfg.editgrpo_similarity_threshold <= 1.0:
        raise ConfigError(f"editgrpo_similarity_threshold: must be in [0, 1], got {cfg.editgrpo_similarity_threshold}")


def editgrpo(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
             injection_reference_template: str = REFERENCE_TEMPLATE,
             editgrpo_edit_fraction: float = param(0.5, 'editgrpo: k = max(1, floor(fraction * G)) random rollouts '
                                                   'per group are edited and their edited copies replace k other '
                                                   'random rollouts (authors: G/2)'),
             editgrpo_num_ops: int = param(1, 'editgrpo: sentence operations per edit (authors: 1)'),
             editgrpo_similarity_threshold: float = param(0.6, 'editgrpo: a wrong sentence is replaced by its most '
                                                          'similar reference sentence when the similarity >= this '
                                                          '(authors: 0.6)'),
             editgrpo_train_edits: bool = param(True, 'editgrpo: the edited tokens enter the loss')):
    """EditGRPO post-rollout sentence-level edits (Zhang et al., 2025, arXiv:2509.22812; seed 004-11).

    Mixed-policy rollouts: G completions are sampled and scored. In every group
    ``k = max(1, floor(editgrpo_edit_fraction * G))`` rollouts are drawn at
    random as *sources* and k others as *targets* (authors: G/2 each, drawn
    regardless of reward). Each source is edited against the reference
    (``injection_reference_template``) by at most ``editgrpo_num_ops``
    sentence operations (:func:`edit_sentences`: replace a wrong sentence by
    its most similar reference sentence, else delete one, else add a missing
    one); when the edit changes the text, the edited copy replaces the
    target, so the group keeps the source and gains its edited version. The
    tokens the edit leaves untouched at the start stay SAMPLED with their own
    behaviour log-probs; from the first changed character on the text is
    INJECTED (teacher-forced log-probs, i.e. the authors' recomputation of the
    log-probabilities on the edited sequence) and trained on
    (``editgrpo_train_edits``), ending with EOS. Edited rows are re-scored.

    Provenance: authors' code — https://github.com/taokz/EditGRPO,
    verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py (generate_sequences,
    extractor_num_para = -1: per prompt G/2 random sources, edited copies
    placed at G/2 random targets) and verl/utils/RaTEscore_extractor.py
    (process_text_with_server_analysis: operation priority replace_fp_complex,
    delete, add; num_operations); settings from
    examples/mimic_cxr_editgrpo_ops1_para_half_tau_0_6.sbatch (1 operation per
    paragraph, half the group, similarity threshold 0.6, loss_agg_mode
    seq-mean-token-sum-norm, norm_adv_by_std_in_grpo False) and
    examples/editgrpo_mimic_cxr_2_5.yaml (KL loss low_var_kl, coefficient
    0.01). Known differences: the authors find wrong and missing sentences with
    a radiology NER server (RaTEScore entities, embedding similarity); here a
    sentence is wrong when no reference sentence equals it and similarity is
    difflib's ratio, the stand-in for text tasks.
    Test: tests/test_rollout_injection.py::test_edit_sentences_follows_the_authors_operation_priority,
    tests/test_rollout_injection.py::test_editgrpo_edited_copies_replace_other_rollouts.
    """
    batch, scalar = _sample_and_score(ctx, rows, uids, group_offset, budgets, temperatures)
    tok = ctx.tokenizer
    eos = eos_token_ids(tok, ctx.policy)
    pairs = []
    for g in torch.unique(batch.group_ids):
        members = (batch.group_ids == g).nonzero().squeeze(-1).tolist()
        k = min(max(1, math.floor(editgrpo_edit_fraction * len(members) + 1e-9)), len(members) // 2)
        if k < 1:
            continue
        perm = [members[int(p)] for p in torch.randperm(len(members), generator=ctx.generator)]
        pairs += list(zip(perm[:k], perm[k:2 * k]))
    sources, targets, heads = [], [], []
    for src, tgt in pairs:
        head = sampled_head(batch, src, eos)
        text = tok.decode(head.ids, skip_special_tokens=True)
        row = _column_rows(batch, [src])[0]
        edited = edit_sentences(text, reference_text(row, injection_reference_template), editgrpo_num_ops,
                                editgrpo_similarity_threshold, ctx.generator)
        if edited == text:
            continue  # the authors replace the target only when the edit changed something
        k = _common_head_tokens(tok, head.ids, text, edited)
        kept = tok.decode(head.ids[:k], skip_special_tokens=True)
        sources.append(src)
        targets.append(tgt)
        heads.append([Segment(head.ids[:k], SAMPLED, True, head.logprobs[:k]),
                      Segment(text_ids(tok, edited[len(kept):]) + [tok.eos_token_id], INJECTED,
                              editgrpo_train_edits)])
    if not targets:
        return batch
    new = compose_rows(ctx, _column_rows(batch, sources), batch.prompt_uids[targets].tolist(),
                       batch.group_ids[targets].tolist(), heads, continue_=False)
    ctx.score(new)
    return replace_rows(batch, targets, new, tok.pad_token_id)


ROLLOUT_STRATEGIES.register("editgrpo", check=_check_editgrpo, columns=template_columns, needs=("text",))(editgrpo)


# ----------------------------------------------------------- ThinkTuning (004-13)
CRITIQUE = ("Problem: {question}\nStudent attempt: {attempt}\n{reference}"
            "The attempt is wrong. Give short corrective feedback that points the student in the right direction.")


def _check_thinktuning(cfg) -> None:
    _check_fraction(cfg, "thinktuning_fraction")
    if cfg.thinktuning_feedback_tokens < 1:
        raise ConfigError(f"thinktuning_feedback_tokens: must be >= 1, got {cfg.thinktuning_feedback_tokens}")
    t = cfg.thinktuning_teacher
    if t not in ("self", "frozen") and not (Path(t) / "config.json").exists():
        raise ConfigError(f"thinktuning_teacher: '{t}' is not 'self', 'frozen' or a local model folder "
                          f"with config.json")


@ROLLOUT_STRATEGIES.register("thinktuning", check=_check_thinktuning, columns=_thinktuning_columns, needs=("text",))
class ThinkTuning:
    """ThinkTuning teacher-guided rollouts (RRV et al., 2025, arXiv:2508.07616,
    github.com/3rdAT/ThinkTuning; seed 004-13).

    G completions are sampled and scored. In each group
    ``ceil(thinktuning_fraction * #failed)`` failed rollouts (scalar reward
    < ``success_threshold``) get teacher feedback: the teacher
    generates up to ``thinktuning_feedback_tokens`` tokens from a critique
    prompt (:data:`CRITIQUE`: the question, the student's attempt and, with
    ``thinktuning_use_reference``, the reference answer). The guided row is

        student attempt (SAMPLED, kept, <= max_completion_length // 2 tokens)
        + "\\n" feedback "\\n" (INJECTED, not in the loss)
        + continuation sampled by the student from all of the above (SAMPLED)

    and is re-scored. Feedback tokens get teacher-forced behaviour log-probs
    (under the student) but are masked out of the loss: the student learns
    from how it continues after feedback, not to imitate the teacher.

    ``thinktuning_teacher``: ``"self"`` = the current behaviour policy (the
    paper's same-size teacher; no extra memory and a resumed run behaves
    exactly like an uninterrupted one), ``"frozen"`` = a copy of the policy
    deep-copied once at first use (after a resume, the copy is taken from
    the resumed policy), or a local model folder loaded with
    :func:`grpolab.model.loading.load_policy` (its own tokenizer; the feedback
    text is re-tokenized with the student's tokenizer). Choices: the attempt
    is cut to half the completion budget so feedback and continuation fit.

    Provenance: reconstructed from the abstract — teacher feedback injected into failed rollouts (not trained
    on) followed by a student continuation, the self / frozen teacher choice and half-budget attempts are
    grpolab's; the authors' code (github.com/3rdAT/ThinkTuning) was not compared line by line.
    """

    def __init__(self, *,
                 thinktuning_teacher: str = param('self', "thinktuning: 'self' (the current behaviour policy), "
                                                  "'frozen' (a copy of the policy taken at first use) or a local "
                                                  'model folder'),
                 success_threshold: float = 1.0,
                 thinktuning_fraction: float = param(0.5, "thinktuning: fraction of each group's failed rollouts "
                                                     'that are guided (rounded up)'),
                 thinktuning_feedback_tokens: int = param(16, 'thinktuning: maximum tokens of teacher feedback'),
                 thinktuning_use_reference: bool = param(True, 'thinktuning: show the reference answer to the teacher'),
                 injection_reference_template: str = REFERENCE_TEMPLATE):
        self.teacher_spec = thinktuning_teacher
        self.threshold = success_threshold
        self.fraction = thinktuning_fraction
        self.feedback_tokens = thinktuning_feedback_tokens
        self.use_reference = thinktuning_use_reference
        self.template = injection_reference_template
        self._teacher = None  # (model, tokenizer) once loaded, for "frozen" / a folder


    def teacher(self, ctx):
        if self.teacher_spec == "self":
            return ctx.policy, ctx.tokenizer
        if self._teacher is None:
            if self.teacher_spec == "frozen":
                self._teacher = (copy.deepcopy(ctx.policy).eval().requires_grad_(False), ctx.tokenizer)
            else:
                from ..model.loading import load_policy
                model, tok = load_policy(self.teacher_spec, log=ctx.log)
                self._teacher = (model.requires_grad_(False), tok)
        return self._teacher

    def critique(self, row: dict, attempt: str) -> str:
        question = row.get("question")
        if question is None:
            p = row["prompt"]
            question = p if isinstance(p, str) else p[-1]["content"]
        ref = f"Reference answer: {reference_text(row, self.template)}\n" if self.use_reference else ""
        return CRITIQUE.format(question=question, attempt=attempt, reference=ref)

    @torch.no_grad()
    def feedback(self, ctx, critiques: list[str]) -> list[str]:
        """The teacher's feedback text for each critique prompt (at most ``thinktuning_feedback_tokens`` tokens).

        Sampled with :func:`~grpolab.generation.turns.continue_sequences` from
        the tokenized critique prompts; the ``"self"`` teacher goes through
        :meth:`RolloutContext.continue_` (the vLLM engine when configured), other
        teachers sample natively with their own model and tokenizer.
        """
        model, tok = self.teacher(ctx)
        texts = [render_prompt(tok, [{"role": "user", "content": c}]) for c in critiques]
        contexts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        if self.teacher_spec == "self":
            out = ctx.continue_(contexts, max_new_tokens=self.feedback_tokens)
        else:
            cfg = ctx.cfg
            out = continue_sequences(model, tok, contexts, max_new_tokens=self.feedback_tokens,
                                     temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                     generator=ctx.sampling_generator, sampling_method=cfg.sampling_method,
                                     static_cache=cfg.static_kv_cache)
        return [tok.decode(ids, skip_special_tokens=True).strip() for ids in out.ids]

    def __call__(self, ctx, rows, uids, group_offset, budgets=None, temperatures=None):
        batch, scalar = _sample_and_score(ctx, rows, uids, group_offset, budgets, temperatures)
        fail = failed_rows(scalar, self.threshold)
        idx = []
        for g in torch.unique(batch.group_ids):
            members = [int(i) for i in (batch.group_ids == g).nonzero().squeeze(-1) if fail[int(i)]]
            idx += _pick(members, self.fraction, ctx.generator)
        if not idx:
            return batch
        tok = ctx.tokenizer
        eos = eos_token_ids(tok, ctx.policy)
        data = _column_rows(batch, idx)
        attempts = [sampled_head(batch, i, eos, ctx.cfg.max_completion_length // 2) for i in idx]
        notes = self.feedback(ctx, [self.critique(r, tok.decode(a.ids, skip_special_tokens=True))
                                    for r, a in zip(data, attempts)])
        heads = [[a, Segment(text_ids(tok, f"\n{note}\n"), INJECTED, False)] for a, note in zip(attempts, notes)]
        new = compose_rows(ctx, data, batch.prompt_uids[idx].tolist(), batch.group_ids[idx].tolist(), heads)
        ctx.score(new)
        return replace_rows(batch, idx, new, tok.pad_token_id)


# ------------------------------------------ EDGE-GRPO guided error correction (000-25)
EDGE_REFLECTION = " Wait! Something is wrong here."
EDGE_ANSWER = "\nWait! Something is wrong here. After verification, the correct answer is:\n{reference}"


def edge_correction(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                    injection_reference_template: str = REFERENCE_TEMPLATE,
                    success_threshold: float = 1.0,
                    edge_gec_only_all_failed: bool = param(False, 'edge_correction: correct failed rollouts only in '
                                                           "groups where every rollout failed (the authors' code "
                                                           'corrects every failed one)'),
                    edge_gec_train_injected: bool = param(True, 'edge_correction: the injected reflection/answer '
                                                          'tokens enter the loss')):
    """EDGE-GRPO Guided Error Correction (Zhang, Wen, Wu and Huang, 2025, arXiv:2507.21848,
    github.com/ZhangXJ199/EDGE-GRPO; seed 000-25).

    G completions are sampled and scored; every failed rollout (scalar reward
    < ``success_threshold``; with ``edge_gec_only_all_failed`` only
    those in groups where all failed) is corrected by one of three rules,
    drawn as in the authors' trainer (``GEC``): with probability 1/2

    * reflection: attempt + ``" Wait! Something is wrong here."`` (INJECTED),
      then the policy continues (SAMPLED);

    otherwise, with probability 1/2 each,

    * answer: attempt + ``"\\nWait! Something is wrong here. After
      verification, the correct answer is:\\n<reference>"`` + EOS (INJECTED);
    * solution: the whole completion is replaced by the reference + EOS (INJECTED).

    ``<reference>`` is ``injection_reference_template`` (the authors use
    ``\\boxed{answer}``; ours is what the task's reward accepts). Corrected
    rows are re-scored. Injected tokens enter the loss
    (``edge_gec_train_injected``; the authors train on the whole edited
    completion). The kept attempt is cut to half of ``max_completion_length``
    so the correction fits (the authors add up to 256 tokens beyond the
    original completion; our completions must stay within the budget).
    Combine with the ``edge_entropy_driven`` weighting for the full method
    (recipe ``edge_grpo_correction``).

    Provenance: authors' code — https://github.com/ZhangXJ199/EDGE-GRPO, trl_edge/trainer/grpo_aha_trainer.py
    (Guided Error Correction: the reflection / answer / solution edits and their 1/2, 1/4, 1/4 draw); the kept
    attempt is cut to half the completion budget (the authors add up to 256 tokens). Known differences: the
    authors correct rows whose summed reward is not the maximum 2 (accuracy + format), here rows below
    ``success_threshold``; their answer edit reads ``... the correct answer is \\boxed{answer}.``, here
    ``... the correct answer is:\\n<reference>`` so that the task's reward accepts it.
    Test: tests/test_rollout_injection.py::test_edge_correction_draw_and_edits_as_the_authors_gec,
    tests/test_rollout_injection.py::test_edge_correction_only_failed.
    """
    batch, scalar = _sample_and_score(ctx, rows, uids, group_offset, budgets, temperatures)
    fail = failed_rows(scalar, success_threshold)
    if edge_gec_only_all_failed:
        groups = set(all_failed_groups(scalar, batch.group_ids, success_threshold))
        fail = fail & torch.tensor([int(g) in groups for g in batch.group_ids], dtype=torch.bool)
    idx = fail.nonzero().squeeze(-1).tolist()
    if not idx:
        return batch
    tok = ctx.tokenizer
    eos = eos_token_ids(tok, ctx.policy)
    template = injection_reference_template
    train = edge_gec_train_injected
    data = _column_rows(batch, idx)
    draws = torch.rand(len(idx), 2, generator=ctx.generator)
    heads, cont = [], []
    for j, (i, row) in enumerate(zip(idx, data)):
        attempt = sampled_head(batch, i, eos, ctx.cfg.max_completion_length // 2)
        ref = reference_text(row, template)
        if draws[j, 0] < 0.5:
            heads.append([attempt, Segment(text_ids(tok, EDGE_REFLECTION), INJECTED, train)])
            cont.append(True)
        elif draws[j, 1] < 0.5:
            heads.append([attempt, Segment(text_ids(tok, EDGE_ANSWER.format(reference=ref)) + [tok.eos_token_id],
                                           INJECTED, train)])
            cont.append(False)
        else:
            heads.append([Segment(text_ids(tok, ref) + [tok.eos_token_id], INJECTED, train)])
            cont.append(False)
    new = compose_rows(ctx, data, batch.prompt_uids[idx].tolist(), batch.group_ids[idx].tolist(), heads,
                       continue_=cont)
    ctx.score(new)
    return replace_rows(batch, idx, new, tok.pad_token_id)


ROLLOUT_STRATEGIES.register("edge_correction", columns=template_columns, needs=("text",))(edge_correction)
