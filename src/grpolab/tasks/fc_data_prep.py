"""Two-stage data preparation for function-calling GRPO (seed 000-106): model evaluation, then AST validation.

Input rows (a user's data or the built-in ``function_calls`` task): ``prompt`` (chat messages or text),
``tools`` (a list of JSON schemas, plain or in the OpenAI/TRL ``{"type": "function", "function": ...}``
wrapper), reference calls in ``gold_tool_calls`` (a list of ``{"name", "arguments"}``, its JSON text or BFCL
Python syntax ``[f(a=1)]``). Python: :func:`prepare_fc_data`; command line: ``grpolab fc-prep``.

* **Stage 1 — model evaluation.** Each row is answered ``attempts`` times by a model (``generate``) and
  scored with the single-criteria reward :func:`~grpolab.tasks.function_calls.fc_single_criteria`; the row's
  pass rate ``p = solved / attempts`` is recorded in the column ``fc_pass_rate``, and rows with
  ``p >= drop_pass_rate`` (default 1.0: solved in every attempt, so a GRPO group of them would carry no
  signal) are dropped. An optional ``judge(row) -> bool`` (Python only) drops rows it rejects — the place for
  an LLM judge of the question/answer pair.
* **Stage 2 — AST validation.** The reference calls are parsed and checked against the row's own tool
  schemas (:func:`~grpolab.tasks.function_calls.schema_errors`: the function exists, every argument is a
  declared parameter, required ones are present, types and enums hold); rows with an unreadable reference
  or any error are dropped with the reason.

Provenance: reconstructed from the abstract — "two-stage data preparation pipeline ... iterative LLM evaluation
and abstract syntax tree validation", with the authors' README figure (https://github.com/BingguangHao/RLFC,
img/pipeline.png: "1. Q&A LLM Evaluate and Correct, 2. Rule based Correct, 3. LLM Final Evaluation"),
arXiv:2508.05118, seed 000-106; the paper's text and code are not public: the pass-rate criterion, its
threshold and the schema rules are grpolab's; the authors' LLM *correction* of rows (rewriting a wrong
reference) is not built — stage 1 only evaluates and drops, and a judge is the user's to supply.
Test: tests/test_fc_entropy_grpo.py::test_prepare_fc_data_two_stages_by_hand.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from ..data import completion_text, render_prompt
from ..errors import ConfigError
from .function_calls import fc_single_criteria, reference_calls_of, schema_errors


@dataclass
class FCPrepReport:
    """What :func:`prepare_fc_data` kept and dropped. ``dropped`` rows carry ``fc_drop_stage`` (1 or 2) and
    ``fc_drop_reason``; every row evaluated in stage 1 carries ``fc_pass_rate``."""
    kept: list[dict] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    stage1_ran: bool = False

    def summary(self) -> dict:
        by = lambda s: sum(1 for r in self.dropped if r["fc_drop_stage"] == s)  # noqa: E731
        return {"rows": len(self.kept) + len(self.dropped), "kept": len(self.kept),
                "dropped_stage1_model_evaluation": by(1), "dropped_stage2_ast_validation": by(2),
                "stage1_ran": self.stage1_ran}


def pass_rate(row: dict, completions: list[str], calls_column: str = "gold_tool_calls") -> float:
    """Share of ``completions`` that the single-criteria reward scores 1 against the row's reference calls."""
    if not completions:
        raise ValueError("pass_rate: no completions")
    scores = fc_single_criteria(completions=list(completions), gold_tool_calls=[row.get(calls_column)] *
                                len(completions))
    return sum(scores) / len(scores)


def prepare_fc_data(rows: list[dict], *, generate: Callable | None = None, attempts: int = 4,
                    drop_pass_rate: float = 1.0, judge: Callable | None = None,
                    tools_column: str = "tools", calls_column: str = "gold_tool_calls") -> FCPrepReport:
    """Run stage 1 (model evaluation; skipped only with ``attempts=0``) then stage 2 (AST validation).

    ``generate(prompts, n) -> list[list[str]]``: ``n`` completions per prompt (:func:`hf_generate` makes one
    from a Hugging Face model). A row keeps its columns; kept rows gain ``fc_pass_rate`` when stage 1 ran.
    """
    if attempts < 0:
        raise ConfigError(f"fc-prep attempts: expected >= 0, got {attempts}")
    if attempts > 0 and generate is None:
        raise ConfigError("fc-prep: stage 1 (model evaluation) needs a model: give generate= (Python) or --model "
                          "(command line), or attempts=0 / --attempts 0 to skip stage 1")
    if not 0.0 < drop_pass_rate <= 1.0:
        raise ConfigError(f"fc-prep drop_pass_rate: expected a rate in (0, 1], got {drop_pass_rate}")
    report = FCPrepReport(stage1_ran=attempts > 0)
    for j, r in enumerate(rows):
        for col in (tools_column, calls_column, "prompt"):
            if col not in r:
                raise ConfigError(f"fc-prep: row {j} has no column '{col}' (columns: {', '.join(sorted(r))}); "
                                  f"function-calling rows need prompt, {tools_column} (tool schemas) and "
                                  f"{calls_column} (reference calls)")
    survivors = [dict(r) for r in rows]
    if attempts > 0:
        outs = generate([r["prompt"] for r in survivors], attempts)
        if len(outs) != len(survivors):
            raise ValueError(f"fc-prep: generate returned {len(outs)} lists for {len(survivors)} prompts")
        nxt = []
        for r, comps in zip(survivors, outs):
            r["fc_pass_rate"] = pass_rate(r, [completion_text(c) for c in comps], calls_column)
            if r["fc_pass_rate"] >= drop_pass_rate:
                report.dropped.append({**r, "fc_drop_stage": 1, "fc_drop_reason":
                                       f"solved in {r['fc_pass_rate']:.0%} of {attempts} attempts "
                                       f"(>= {drop_pass_rate:g})"})
            elif judge is not None and not judge(r):
                report.dropped.append({**r, "fc_drop_stage": 1, "fc_drop_reason": "rejected by the judge"})
            else:
                nxt.append(r)
        survivors = nxt
    elif judge is not None:
        nxt = []
        for r in survivors:
            (nxt.append(r) if judge(r) else
             report.dropped.append({**r, "fc_drop_stage": 1, "fc_drop_reason": "rejected by the judge"}))
        survivors = nxt
    for r in survivors:
        calls = reference_calls_of(r[calls_column])
        tools = r[tools_column]
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError:
                tools = None
        if calls is None:
            errs = [f"reference calls are not readable: {str(r[calls_column])[:80]!r}"]
        elif not isinstance(tools, list):
            errs = [f"column '{tools_column}' is not a list of tool schemas"]
        else:
            try:
                errs = schema_errors(calls, tools)
            except ValueError as e:
                errs = [str(e)]
        if errs:
            report.dropped.append({**r, "fc_drop_stage": 2, "fc_drop_reason": "; ".join(errs)})
        else:
            report.kept.append(r)
    return report


def hf_generate(model, tokenizer, *, max_new_tokens: int = 256, temperature: float = 0.7, seed: int = 0):
    """A ``generate(prompts, n)`` for :func:`prepare_fc_data` from a Hugging Face causal LM: each prompt
    rendered with the chat template (:func:`grpolab.data.render_prompt`), ``n`` samples at ``temperature``."""
    import torch

    def generate(prompts: list, n: int) -> list[list[str]]:
        torch.manual_seed(seed)
        out = []
        for p in prompts:
            enc = tokenizer(render_prompt(tokenizer, p), return_tensors="pt", add_special_tokens=False)
            with torch.no_grad():
                ids = model.generate(**enc, do_sample=True, temperature=temperature, max_new_tokens=max_new_tokens,
                                     num_return_sequences=n, pad_token_id=tokenizer.pad_token_id)
            P = enc["input_ids"].shape[1]
            out.append([tokenizer.decode(s[P:], skip_special_tokens=True) for s in ids])
        return out
    return generate


def main(argv: list[str] | None = None) -> int:
    """``grpolab fc-prep``: the two-stage preparation of function-calling rows, written as JSONL."""
    import argparse
    from pathlib import Path

    from ..data import model_texts, to_json
    from .base import add_rows_source, source_rows

    p = argparse.ArgumentParser(prog="grpolab fc-prep", description="Two-stage data preparation for "
                                "function-calling GRPO (seed 000-106): stage 1 answers each row with a model and "
                                "drops the rows it already solves in every attempt; stage 2 AST-validates the "
                                "reference calls against the row's tool schemas and drops invalid rows.")
    add_rows_source(p, "rows with prompt, tools, gold_tool_calls (JSONL, JSON, CSV, Parquet)",
                    "a built-in task's training rows (e.g. function_calls)")
    p.add_argument("--out", required=True, help="JSONL file for the kept rows")
    p.add_argument("--dropped", help="JSONL file for the dropped rows, with fc_drop_stage and fc_drop_reason")
    p.add_argument("--model", help="stage 1 model: 'smollm2', 'tiny' or a model folder")
    p.add_argument("--attempts", type=int, default=4, help="stage 1 answers per row (0: skip stage 1)")
    p.add_argument("--drop-pass-rate", type=float, default=1.0, help="stage 1 drops rows whose pass rate is at "
                                                                     "least this (default 1.0: solved every time)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--tools-column", default="tools")
    p.add_argument("--calls-column", default="gold_tool_calls")
    a = p.parse_args(argv)
    rows = source_rows(a)
    generate = None
    if a.attempts > 0:
        if not a.model:
            raise ConfigError("fc-prep: stage 1 needs --model (or --attempts 0 to skip it)")
        from ..model.loading import load_policy
        model, tok = load_policy(a.model, task_texts=model_texts(rows))
        model.eval()
        generate = hf_generate(model, tok, max_new_tokens=a.max_new_tokens, temperature=a.temperature)
    report = prepare_fc_data(rows, generate=generate, attempts=a.attempts, drop_pass_rate=a.drop_pass_rate,
                             tools_column=a.tools_column, calls_column=a.calls_column)
    Path(a.out).write_text("".join(to_json(r) + "\n" for r in report.kept))
    if a.dropped:
        Path(a.dropped).write_text("".join(to_json(r) + "\n" for r in report.dropped))
    print(json.dumps(report.summary()))
    return 0
