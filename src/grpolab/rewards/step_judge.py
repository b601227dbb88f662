"""SGPO step-wise judge reward (Chen, Li, Li, Chen and Lin, 2025, *Spectral Policy Optimization: Coloring your
Incorrect Reasoning in GRPO*, later *Stepwise Guided Policy Optimization* (SGPO), arXiv:2505.11595; seed 000-49).

GRPO learns nothing from an *all-negative* group (every completion wrong: equal rewards, zero advantages). SGPO
asks a step-wise judge to grade the reasoning steps of the wrong completions, so the group's rewards spread out
("a spectrum" of partial credit) and its advantages become non-zero. Two components do this:

* this reward spec, ``--reward sgpo_judge:JUDGE[=weight]``, writes the reward column ``sgpo_judge``: the
  *step credit* of each completion,

      c_i = 1                  the final answer is right,
      c_i = k_i / (K_i + 1)    wrong: K_i reasoning steps and the (wrong) final answer; the judge says the first
                               wrong step is step k_i + 1 (k_i steps before it are right; "none" means k_i = K_i:
                               every reasoning step right, only the answer wrong),
      c_i = None (unscorable)  wrong, and the judge's reply does not parse (logged as
                               ``rewards/sgpo_judge/unscorable``, the metric of unparseable replies);

  a wrong completion with no reasoning step (``K_i = 0``) gets 0 without a judge call;
  so ``c_i = 1`` exactly when the answer is right and ``c_i < 1`` for every wrong completion;
* the reward transform ``sgpo_negative_credit`` (``rewards/transforms.py``) adds ``lambda * c_i`` to the rewards
  of the rows of every group with no correct row (no ``c_i = 1``), and leaves every other group unchanged. The
  recipe gives the column weight 0 so that it enters the scalar reward only through the transform.

The judge text (one per wrong completion)::

    Problem: <the prompt's text>
    Steps:
    1. <step 1>
    ...
    K. <step K>
    Find the first incorrect step. Reply with one line: "First error: step N" (N from 1 to K) or
    "First error: none".

and the reply must be exactly that line (its first non-empty line, case and surrounding spaces ignored): ``step N``
with 1 <= N <= K gives k = N - 1; ``none`` gives k = K; anything else is unparseable. Steps are the completion's
reasoning steps as :func:`grpolab.rewards.process.reasoning_steps` splits them (lines and sentences, ``Answer:``
lines dropped). The final answer is checked like ``math_accuracy``: the last ``Answer:`` line against the
``answer`` column (:func:`grpolab.rewards.answers.math_equal`).

JUDGE is ``self`` (a frozen copy of the run's initial policy, as ``judge:self``; the paper adapts existing LLMs as
judges), ``tiny`` (a small random-init model, for tests), a local Hugging Face causal-LM folder, or
``module:function``: a Python function ``f(list_of_judge_texts) -> list_of_replies`` (a stub in tests, an API
client elsewhere). A model judge reads the text as a ``user`` message through its chat template (when its
tokenizer has one), its reply starts with ``sgpo_judge_prefill`` (default ``First error:``, written for it, so
the model only completes the verdict) and it continues greedily, at most ``sgpo_judge_max_new_tokens`` tokens.

With ``sgpo_judge_only_unsolved`` (default) a wrong completion is sent to the judge only when no completion of
the same prompt text in the call is right (its group is then all-negative; the transform ignores the column of
every other group): it saves the judge calls the transform would discard, and those rows read 0.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..data import completion_text
from ..registry import REWARD_SPECS, declared_params, param
from .answers import extract_answer, math_equal
from .models import _prompt_text
from .process import reasoning_steps
from .scoring import import_reward_module, scorer_spec

JUDGE_INSTRUCTION = ('Find the first incorrect step. Reply with one line: "First error: step N" (N from 1 to {K}) '
                     'or "First error: none".')
_VERDICT = re.compile(r"^first error:\s*(?:step\s+(\d+)|(none))\.?$")


def sgpo_judge_text(problem: str, steps: list[str]) -> str:
    """The judge text for one wrong completion (see the module docstring)."""
    lines = [f"Problem: {problem}", "Steps:"] + [f"{i}. {s}" for i, s in enumerate(steps, 1)]
    return "\n".join(lines + [JUDGE_INSTRUCTION.format(K=len(steps))]) + "\n"


def parse_step_verdict(reply: str, n_steps: int) -> int | None:
    """The number of steps before the first wrong one (0..n_steps) from the judge's reply, or None when the
    reply's first non-empty line is not ``First error: step N`` (1 <= N <= n_steps) or ``First error: none``."""
    line = next((ln.strip() for ln in str(reply).splitlines() if ln.strip()), "")
    m = _VERDICT.match(" ".join(line.lower().split()))
    if m is None:
        return None
    if m.group(2):
        return n_steps
    n = int(m.group(1))
    return n - 1 if 1 <= n <= n_steps else None


def step_credit(reply: str, n_steps: int) -> float | None:
    """``k / (K + 1)`` for a parseable reply on a wrong completion (``k`` steps right before the first error,
    ``K`` reasoning steps, the wrong final answer the last step), else None."""
    k = parse_step_verdict(reply, n_steps)
    return None if k is None else k / (n_steps + 1)


class ModelJudge:
    """A causal LM that answers judge texts greedily (``self``, ``tiny`` or a local folder)."""

    def __init__(self, path: str, cfg=None, max_new_tokens: int = 16, batch_size: int = 8, prefill: str = ""):
        from .judge import JudgeReward
        self.loader = JudgeReward(path, cfg=cfg)  # the same loading as judge:PATH (self, tiny, folder)
        self.max_new_tokens, self.batch_size, self.prefill = int(max_new_tokens), int(batch_size), str(prefill)

    def encode(self, tok, text: str) -> list[int]:
        """Token ids of one judge text: a ``user`` message through the tokenizer's chat template (generation
        prompt added) when it has one, else the plain text with the tokenizer's special tokens; then the
        prefill (the start of the reply, written for the judge)."""
        if getattr(tok, "chat_template", None):
            chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
            return tok(chat + self.prefill, add_special_tokens=False)["input_ids"]
        return tok(text + self.prefill)["input_ids"]

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> list[str]:
        self.loader.load()
        model, tok = self.loader.model, self.loader.tok
        out: list[str] = []
        for i in range(0, len(texts), self.batch_size):
            rows = [self.encode(tok, t)[-self.loader.max_length:] for t in texts[i:i + self.batch_size]]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, r in enumerate(rows):  # left padding: every row's continuation starts at the same column
                ids[j, width - len(r):] = torch.tensor(r, dtype=torch.long)
                mask[j, width - len(r):] = 1
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=self.max_new_tokens,
                                 do_sample=False, pad_token_id=tok.pad_token_id)
            out.extend(self.prefill + r for r in tok.batch_decode(gen[:, width:], skip_special_tokens=True))
        return out


def load_step_judge(judge: str, cfg=None, max_new_tokens: int = 16, prefill: str = ""):
    """The judge callable for JUDGE = ``self`` | ``tiny`` | a model folder | ``module:function``."""
    if judge in ("self", "tiny") or (Path(judge) / "config.json").exists():
        return ModelJudge(judge, cfg=cfg, max_new_tokens=max_new_tokens, prefill=prefill)
    module_name, sep, func = judge.rpartition(":")
    if not sep or not module_name or not func:
        raise ValueError(f"sgpo_judge: judge '{judge}' is not 'self', 'tiny', a local causal-LM folder with "
                         f"config.json, or module:function")
    fn = getattr(import_reward_module(module_name, f"sgpo_judge:{judge}"), func, None)
    if not callable(fn):
        raise ValueError(f"sgpo_judge: module '{module_name}' has no function '{func}'")
    return fn


class SGPOStepJudge:
    """The step credit column (see the module docstring) as a TRL-contract reward function."""

    def __init__(self, judge, *,
                 sgpo_judge_max_new_tokens: int = param(16, 'sgpo_judge: most tokens a model judge writes per reply'),
                 sgpo_judge_only_unsolved: bool = param(True, 'sgpo_judge: send a wrong completion to the judge only '
                                                        'when no completion of the same prompt is right'),
                 sgpo_judge_prefill: str = param('First error:', 'sgpo_judge: the start of a model judge\'s reply, '
                                                 'written for it (it completes the verdict line)'),
                 cfg=None):
        self.judge = (load_step_judge(judge, cfg, sgpo_judge_max_new_tokens, sgpo_judge_prefill)
                      if isinstance(judge, str) else judge)
        self.only_unsolved = bool(sgpo_judge_only_unsolved)
        self.last_replies: list[str] = []
        self.__name__ = "sgpo_judge"

    def __call__(self, prompts=None, completions=None, answer=None, **kwargs) -> list[float | None]:
        if answer is None:
            raise ValueError("sgpo_judge: no data column 'answer' to tell right from wrong completions; use a task "
                             "with answers (arithmetic, arithmetic_multistep)")
        prompts = prompts if prompts is not None else [""] * len(completions)
        texts = [completion_text(c) for c in completions]
        right = [a is not None and math_equal(extract_answer(t), str(a), use_math_verify=False)
                 for t, a in zip(texts, answer)]
        solved = {_prompt_text(p) for p, r in zip(prompts, right) if r}
        out: list[float | None] = [1.0 if r else 0.0 for r in right]
        asks, rows, counts = [], [], []
        for i, (p, t) in enumerate(zip(prompts, texts)):
            if right[i] or (self.only_unsolved and _prompt_text(p) in solved):
                continue
            steps = reasoning_steps(t)
            if steps:
                asks.append(sgpo_judge_text(_prompt_text(p), steps))
                rows.append(i)
                counts.append(len(steps))
        replies = list(self.judge(asks)) if asks else []
        if len(replies) != len(asks):
            raise ValueError(f"sgpo_judge: the judge returned {len(replies)} replies for {len(asks)} texts")
        self.last_replies = replies
        for i, n, reply in zip(rows, counts, replies):
            out[i] = step_credit(reply, n)
        return out


def parse_sgpo_judge_spec(spec: str, cfg=None, **opts):
    """``sgpo_judge:JUDGE[=weight]`` -> the SGPO step-credit column ``sgpo_judge`` as a RewardFn.

    Provenance: reconstructed from the abstract — SGPO (arXiv:2505.11595; seed 000-49): a step-wise judge grades
    the wrong completions; our choices: the judge names the first wrong step in a fixed one-line format, the credit
    is the share of steps before it, the wrong final answer counted as the last step (k/(K+1) in [0, 1), a right
    answer 1), an unparseable reply is unscorable (None),
    the judge defaults to a frozen copy of the policy; no authors' code found (searched the code index for
    "Spectral Policy Optimization", "Stepwise Guided Policy Optimization", "SGPO" and the arXiv id: paper pages
    only), the paper's judge prompt and scoring rule were not available.
    Test: tests/test_sgpo.py::test_step_credit_column_with_stub_judge.
    """
    return scorer_spec(spec, "sgpo_judge", SGPOStepJudge,
                       "sgpo_judge:JUDGE (self, tiny, a model folder or module:function), optionally =weight", cfg,
                       opts)


parse_sgpo_judge_spec.__grpolab_params__ = declared_params(SGPOStepJudge)
REWARD_SPECS.register("sgpo_judge:", prefix="self|tiny|PATH|module:function", needs=("text",))(parse_sgpo_judge_spec)
