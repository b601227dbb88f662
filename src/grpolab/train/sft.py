"""``grpolab sft``: a short supervised cold start before GRPO, with thinking-mode formats.

Data: a JSONL file of ``prompt`` / ``completion`` rows, or a built-in task's
training rows with their ``solution`` column (worked solution whose last line
is ``Answer: N``; a solution without an ``Answer:`` line, e.g. countdown's
expression, becomes ``Answer: <solution>``; rows without a solution use
``Answer: <answer>``). Held-out rows are never used.

A target is split into its *reasoning* (the lines before the last ``Answer:``
line, or the inside of ``<think>...</think>`` when the completion has one) and
its *answer* (from that ``Answer:`` line on). ``sft_mode`` chooses the format:

* ``plain``: the completion as it is.
* ``ton`` — TON thought dropout (Wang et al., 2025, "Think or Not? Selective
  Reasoning via Reinforcement Learning for Vision-Language Models",
  arXiv:2505.16854; seeds 000-37 = 004-09): the target is
  ``<think>\\n{reasoning}\\n</think>\\n{answer}``, and with probability
  ``ton_dropout_prob`` the thought is replaced by the empty thought
  ``ton_empty_thought`` (default ``<think>\\n\\n</think>``), so the model learns
  that skipping the thought is a valid format; GRPO then decides when to think
  (recipe ``ton``). Drops are drawn with ``random.Random(seed)`` in row order:
  the same seed drops the same rows.
* ``thinkless`` — Thinkless warm-up (Fang, Ma and Wang, 2025, arXiv:2505.13379;
  seed 004-12): every row gives two targets, as in the paper's paired
  distillation data: ``<think>`` + ``\\n{reasoning}\\n</think>\\n{answer}`` (long
  mode) and ``<short>`` + ``{answer}`` (short mode). The two control tokens
  (``thinkless_think_token``, ``thinkless_short_token``) are added to the
  tokenizer as atomic added tokens (never split; *not* flagged special, so
  decoded completions keep them and the ``thinkless_mode_reward`` can read the
  chosen mode from the text) and the embedding matrix is resized (new rows =
  mean of the old ones, transformers' default).
* ``pta`` — PTA-GRPO stage 1 (Plan-Then-Action, seed 000-108): the target is
  ``<plan>\n{plan}\n</plan>\n{reasoning}\n{answer}``, a compact numbered
  high-level plan before the worked reasoning. The plan is the row's ``plan``
  column when it has one (e.g. plans distilled from a stronger model, as in
  the paper), else :func:`grpolab.rewards.agentic.compact_plan` of the
  reasoning (one step per operation line, then "state the answer"); the tag
  is ``pta_plan_tag``. Stage 2 is the recipe ``pta_grpo``.
* ``convrec`` — ConvRec-R1 Stage 1 (Zhu et al., 2025, arXiv:2510.20150; seed
  000-91), on the ``ranked_list`` task: the target is the row's behaviour-cloning
  demonstration built by the Remap-Reflect-Adjust pipeline
  (:func:`grpolab.tasks.ranked_list_bc.remap_reflect_adjust`: a rule-based
  teacher's noisy lists mapped onto the catalogue, judged, and re-biased toward
  the training rows' ground-truth items), one item per line. Stage 2 is the
  recipe ``rank_grpo``.

Training: next-token cross-entropy on the target tokens only (prompt tokens
are labelled -100), mean over the batch's target tokens; the prompt goes
through the tokenizer's chat template like in GRPO; ``sft_steps`` AdamW steps
of ``sft_batch_size`` examples drawn in a seeded shuffled order (epochs
cycle); sequences longer than ``sft_max_length`` are cut from the right. The
result is saved with the tokenizer to ``--out`` and loads with ``--model OUT``.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from ..data import to_json
from ..registry import declared_params, param
from ..rewards.agentic import PLAN_TAG, compact_plan
from ..rewards.transforms import THINKLESS_SHORT_TOKEN, THINKLESS_THINK_TOKEN
from ..tasks.ranked_list_bc import remap_reflect_adjust

_THINK = re.compile(r"<think>(.*?)</think>\s*(.*)", re.S)


@dataclass
class SFTExample:
    prompt: object
    target: str
    dropped: bool = False  # TON: the thought was replaced by the empty thought
    mode: str = "plain"    # plain / think / short


def base_completion(row: dict) -> str:
    """The supervised target of a row before any thinking-mode formatting."""
    if row.get("completion") is not None:
        c = row["completion"]
        return c if isinstance(c, str) else "".join(m.get("content", "") for m in c)
    if row.get("solution") is not None:
        sol = str(row["solution"])
        return sol if re.search(r"^Answer:", sol, re.M) else f"Answer: {sol}"
    if row.get("answer") is not None:
        return f"Answer: {row['answer']}"
    raise ValueError(f"sft: a row needs 'completion', 'solution' or 'answer' (keys: {', '.join(row)})")


def split_reasoning(completion: str) -> tuple[str, str]:
    """``(reasoning, answer)``: inside/after ``<think>...</think>``, else before/from the last ``Answer:`` line."""
    m = _THINK.search(completion)
    if m:
        return m.group(1).strip(), m.group(2).strip()
    lines = completion.rstrip().split("\n")
    idx = [i for i, line in enumerate(lines) if line.lstrip().startswith("Answer:")]
    if not idx:
        return completion.strip(), ""
    i = idx[-1]
    return "\n".join(lines[:i]).strip(), "\n".join(lines[i:]).strip()


def build_examples(rows: list[dict], *,
                   sft_mode: str = param('plain', 'grpolab sft: target format: plain, ton (thought dropout), '
                                         'thinkless (control tokens), pta (plan then reasoning) or convrec '
                                         "(ConvRec-R1's Remap-Reflect-Adjust demonstrations, task ranked_list)",
                                         ['plain', 'ton', 'thinkless', 'pta', 'convrec']),
                   seed: int = 0,
                   ton_dropout_prob: float = param(0.5, "TON: probability that an SFT target's reasoning is replaced "
                                                   'by the empty thought'),
                   ton_empty_thought: str = param('<think>\n\n</think>', 'TON: the empty thought that replaces a '
                                                  'dropped trace'),
                   thinkless_short_token: str = THINKLESS_SHORT_TOKEN,
                   thinkless_think_token: str = THINKLESS_THINK_TOKEN,
                   pta_plan_tag: str = PLAN_TAG) -> list[SFTExample]:
    """SFT examples for ``rows`` in the format of ``sft_mode`` (see the module docstring)."""
    if sft_mode not in ("plain", "ton", "thinkless", "pta", "convrec"):
        raise ValueError(f"sft_mode: expected plain, ton, thinkless, pta or convrec, got '{sft_mode}'")
    if sft_mode == "convrec" and any(row.get("completion") is None for row in rows):
        raise ValueError("sft_mode convrec: every row needs its Remap-Reflect-Adjust demonstration in 'completion' "
                         "(run_sft builds them with grpolab.tasks.ranked_list_bc.remap_reflect_adjust)")
    if not 0.0 <= ton_dropout_prob <= 1.0:
        raise ValueError(f"ton_dropout_prob: must be in [0, 1], got {ton_dropout_prob}")
    rng = random.Random(seed)
    out = []
    for row in rows:
        comp = base_completion(row)
        if sft_mode in ("plain", "convrec"):
            out.append(SFTExample(row["prompt"], comp))
            continue
        reasoning, answer = split_reasoning(comp)
        if sft_mode == "pta":
            plan = row.get("plan") or compact_plan(reasoning)
            out.append(SFTExample(row["prompt"], f"<{pta_plan_tag}>\n{plan}\n</{pta_plan_tag}>\n{reasoning}\n{answer}"))
            continue
        if sft_mode == "ton":
            drop = rng.random() < ton_dropout_prob
            thought = ton_empty_thought if drop else f"<think>\n{reasoning}\n</think>"
            out.append(SFTExample(row["prompt"], f"{thought}\n{answer}", dropped=drop, mode="think"))
        else:
            out.append(SFTExample(row["prompt"], f"{thinkless_think_token}\n{reasoning}\n</think>\n{answer}",
                                  mode="think"))
            out.append(SFTExample(row["prompt"], f"{thinkless_short_token}{answer}", mode="short"))
    return out


def add_control_tokens(model, tok, tokens: list[str]) -> int:
    """Add ``tokens`` as atomic (non-special) tokens and resize the embeddings; returns how many were new."""
    n = tok.add_tokens([t for t in tokens if t not in tok.get_vocab()])
    if n:
        model.resize_token_embeddings(len(tok))
    return n


def encode(tok, example: SFTExample, max_length: int) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)``: the rendered prompt (labels -100), the target and EOS."""
    from ..data import render_prompt
    p = tok(render_prompt(tok, example.prompt), add_special_tokens=False)["input_ids"]
    t = tok(example.target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids, labels = (p + t)[:max_length], ([-100] * len(p) + t)[:max_length]
    return ids, labels


def sft_train(model, tok, examples: list[SFTExample], *,
              sft_steps: int = param(50, 'grpolab sft: optimiser steps'),
              sft_batch_size: int = param(8, 'grpolab sft: examples per step'),
              sft_learning_rate: float = param(0.0001, 'grpolab sft: AdamW learning rate'),
              sft_max_length: int = param(512, 'grpolab sft: prompt + target tokens longer than this are cut from '
                                          'the right'),
              seed: int = 0, log=None) -> list[float]:
    """Supervised training on ``examples``; returns the loss of every step."""
    if not examples:
        raise ValueError("sft: no examples")
    encoded = [encode(tok, e, sft_max_length) for e in examples]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=sft_learning_rate, weight_decay=0.0)
    rng = random.Random(seed)
    order: list[int] = []
    losses = []
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model.train()
    for step in range(sft_steps):
        batch = []
        while len(batch) < min(sft_batch_size, len(encoded)):
            if not order:
                order = list(range(len(encoded)))
                rng.shuffle(order)
            batch.append(encoded[order.pop()])
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (x, y) in enumerate(batch):  # right padding: positions 0..n-1 as in generation
            ids[i, :len(x)] = torch.tensor(x)
            labels[i, :len(y)] = torch.tensor(y)
            mask[i, :len(x)] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                 ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if log and (step + 1) % max(1, sft_steps // 10) == 0:
            log(f"[grpolab sft] step {step + 1}/{sft_steps} loss {losses[-1]:.4f}")
    model.eval()
    return losses


# `grpolab sft` is a command, not a registered component: its parameters are those of these two functions
# (Config.build(..., extra=SFT_COMPONENTS)); declared_params turns their param() defaults into values.
SFT_COMPONENTS = (build_examples, sft_train, remap_reflect_adjust)
for _fn in SFT_COMPONENTS:
    declared_params(_fn)


def run_sft(cfg, out: str | Path, data: str | None = None, log=print) -> dict:
    """Build examples (``data`` in any --data format, docs/data.md, or ``cfg.task``), train ``cfg.model`` and
    save it to ``out``."""
    from ..data import load_data, model_texts, parse_column_map
    from ..model.loading import load_policy, save_policy
    from ..tasks import get_task

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rows = (load_data(data, cfg.data_split, parse_column_map(cfg.column_map, cfg.prompt_column)) if data
            else get_task(cfg.task, cfg=cfg).train_rows)
    stage1 = {}
    if cfg.sft_mode == "convrec":  # ConvRec-R1 stage 1: the demonstrations are the targets
        demos, stage1 = remap_reflect_adjust(rows, seed=cfg.seed, **{k: getattr(cfg, k)
                                                                      for k in declared_params(remap_reflect_adjust)})
        rows = [{**r, "completion": d} for r, d in zip(rows, demos)]
        log(f"[grpolab sft] convrec: Remap-Reflect-Adjust demonstrations for {len(rows)} rows, hit rate "
            f"{stage1['demo_hit_rate']:.3f} (the rule-based teacher's raw lists: {stage1['teacher_hit_rate']:.3f})")
    examples = build_examples(rows, sft_mode=cfg.sft_mode, seed=cfg.seed, ton_dropout_prob=cfg.ton_dropout_prob,
                              ton_empty_thought=cfg.ton_empty_thought,
                              thinkless_short_token=cfg.thinkless_short_token,
                              thinkless_think_token=cfg.thinkless_think_token, pta_plan_tag=cfg.pta_plan_tag)
    texts = model_texts(rows) + [e.target for e in examples] if cfg.model == "tiny" else None
    model, tok = load_policy(cfg.model, task_texts=texts, tiny_arch=cfg.tiny_arch, seed=cfg.seed, log=log)
    added = 0
    if cfg.sft_mode == "thinkless":
        added = add_control_tokens(model, tok, [cfg.thinkless_short_token, cfg.thinkless_think_token])
    losses = sft_train(model, tok, examples, sft_steps=cfg.sft_steps, sft_batch_size=cfg.sft_batch_size,
                       sft_learning_rate=cfg.sft_learning_rate, sft_max_length=cfg.sft_max_length, seed=cfg.seed,
                       log=log)
    out = Path(out)
    save_policy(model, tok, out)
    summary = {"examples": len(examples), "mode": cfg.sft_mode, "steps": cfg.sft_steps,
               "first_loss": losses[0], "last_loss": losses[-1], "added_tokens": added,
               "dropped_thoughts": sum(e.dropped for e in examples), "out": str(out), **stage1}
    (out / "sft_summary.json").write_text(to_json({**summary, "losses": losses}, indent=1))
    return summary
