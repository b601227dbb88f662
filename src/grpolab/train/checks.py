"""Fail early and loud: what the config and the data already tell before the first step, and a run that stalls.

Before the first step (and before the "before" evaluation; ``--resume`` runs the same checks):

* the run folder can be written (``--out`` is not a file, its folder is writable);
* every reward weight is a finite number;
* every training row has the data columns the selected components declared
  (``register(..., columns=...)``, e.g. ``hints`` for Scaf-GRPO and Guide,
  ``solution`` for GHPO), naming the first row that lacks one;
* every prompt fits ``max_prompt_length`` (naming the row; an agent run's as the episode shows it, with the
  tool schemas), and the longest
  prompt plus ``max_completion_length`` fits the model's context.

During the run, :class:`StallGuard` stops a run in which nothing can be learned
(``stall_steps``).
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

from ..config import Config, ConfigError
from ..data import render_prompt, where
from ..errors import RunStalled
from ..registry import ROLLOUT_STRATEGIES


def check_out(out: str | Path) -> None:
    """``--out`` must be a folder (or not exist yet) whose nearest existing folder is writable."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"--out {p} is a file, not a folder; give a folder path for the run (a new one, or a "
                          f"run folder to --resume)")
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"--out {p}: {probe} is a file, so the run folder cannot be created; choose another --out")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(f"--out {p}: cannot write in {probe} ({e.strerror or e}); choose a folder you can write "
                          f"to (--out DIR)") from None


def check_reward_weights(rewards) -> None:
    for r in rewards:
        try:
            ok = math.isfinite(float(r.weight))
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise ConfigError(f"reward '{r.name}': weight {r.weight!r} is not a finite number; give a real number "
                              f"(--reward module:function=0.5, or reward_weights)")


def _source(cfg: Config) -> str:
    return f"--data {cfg.data}" if cfg.data else f"task {cfg.task}"


def _missing(value) -> bool:
    return value is None or (isinstance(value, (list, str)) and len(value) == 0)


def check_columns(cfg: Config, rows: list[dict]) -> None:
    """Every training row has the columns the selected components declared, non-empty."""
    for component, columns in cfg.required_columns().items():
        for col in columns:
            for i, row in enumerate(rows):
                if _missing(row.get(col)):
                    what = "has an empty" if col in row and row[col] is not None else "has no"
                    raise ConfigError(
                        f"{_source(cfg)}: {where(rows, i)} {what} '{col}' column, which {component} reads from "
                        f"every training row (this row has: {', '.join(k for k in row if k != 'prompt') or 'none'})"
                        f"; add '{col}' to every row, or choose a component that does not need it")


def prompt_lengths(tokenizer, rows: list[dict]) -> list[int]:
    """Token count of every row's prompt, as the rollout tokenizes it (chat template, no special tokens)."""
    prompts = [r["prompt"] for r in rows]
    chats = [i for i, pr in enumerate(prompts) if not isinstance(pr, str)]
    texts = list(prompts)
    if len(chats) > 1:  # one call renders them all (the same template as render_prompt, about 2x faster)
        rendered = tokenizer.apply_chat_template([prompts[i] for i in chats], tokenize=False,
                                                 add_generation_prompt=True)
        for i, text in zip(chats, rendered):
            texts[i] = text
    else:
        texts = [render_prompt(tokenizer, pr) for pr in prompts]
    out = []
    for i in range(0, len(texts), 512):
        out += [len(ids) for ids in tokenizer(texts[i:i + 512], add_special_tokens=False)["input_ids"]]
    return out


def model_context(cfg: Config, model) -> int | None:
    """Positions the model (and the vLLM engine, when its length is set) can attend over; None if unknown."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if cfg.generation_engine == "vllm" and cfg.vllm_max_model_len:
        n = min(n, cfg.vllm_max_model_len) if n else cfg.vllm_max_model_len
    return int(n) if n else None


def strategy_hook(cfg: Config, name: str):
    """The run's rollout strategy's attribute ``name`` (e.g. the agent rollout's ``first_prompts``), or None."""
    if cfg.rollout_strategy not in ROLLOUT_STRATEGIES:
        return None
    return getattr(ROLLOUT_STRATEGIES.get(cfg.rollout_strategy), name, None)


# prompts the strategy renders itself (the agent rollout: with the tool schemas) are measured as rendered for the
# rows that are longest without: the addition is the same for every row
RENDERED_ROWS = 8


def first_prompt_lengths(cfg: Config, tokenizer, part: list[dict], environment=None) -> tuple[list[int], str]:
    """``(token counts, what they include)`` of the prompts of ``part`` as the run's rollout strategy shows them
    (the agent rollout: with the tool schemas; its hook ``first_prompts``), else as :func:`prompt_lengths`."""
    lengths = prompt_lengths(tokenizer, part)
    render = strategy_hook(cfg, "first_prompts")
    if render is None or not part:
        return lengths, ""
    longest = sorted(range(len(part)), key=lambda i: -lengths[i])[:RENDERED_ROWS]
    texts = render(cfg, environment, tokenizer, [part[i] for i in longest])
    if texts is None:
        return lengths, ""
    for i, ids in zip(longest, tokenizer(texts, add_special_tokens=False)["input_ids"]):
        lengths[i] = len(ids)
    return lengths, " with its tool schemas"


def check_lengths(cfg: Config, tokenizer, model, rows: list[dict], eval_rows: list[dict],
                  environment=None) -> None:
    """Every prompt within ``max_prompt_length`` (as the rollout shows it: an agent run's with its tool schemas;
    ``environment``: the run's objects, see :func:`first_prompt_lengths`); the longest prompt +
    ``max_completion_length`` within the model's context."""
    context = model_context(cfg, model)
    longest, longest_at = 0, ""
    for label, part in (("", rows), ("held-out ", eval_rows)):
        if not part:
            continue
        lengths, shown = first_prompt_lengths(cfg, tokenizer, part, environment)
        for i, n in enumerate(lengths):
            at = f"{_source(cfg)}: {label}{where(part, i)}"
            if n > cfg.max_prompt_length:
                room = f" (at most {context - cfg.max_completion_length} with this model and max_completion_length)" \
                    if context and context > cfg.max_completion_length else ""
                raise ConfigError(f"{at}: the prompt{shown} has {n} tokens, more than max_prompt_length="
                                  f"{cfg.max_prompt_length}; shorten or drop that prompt, or raise "
                                  f"--max_prompt_length{room}")
            if n > longest:
                longest, longest_at = n, at
    if context is None:
        return
    if cfg.max_completion_length >= context:
        raise ConfigError(f"max_completion_length: {cfg.max_completion_length} tokens do not fit the model's "
                          f"context of {context} positions (max_position_embeddings); set --max_completion_length "
                          f"to at most {context - max(longest, 1)}")
    if longest + cfg.max_completion_length > context:
        raise ConfigError(f"max_completion_length: the longest prompt ({longest_at}, {longest} tokens) plus "
                          f"max_completion_length={cfg.max_completion_length} is more than the model's context of "
                          f"{context} positions; set --max_completion_length to at most {context - longest} or "
                          f"shorten the prompts")


class StallGuard:
    """Stops a run that cannot learn (``stall_steps`` = N; 0 disables).

    A step is *flat* when every group had zero reward spread (``frac_zero_std_groups`` = 1 and every
    advantage 0), or when every reward call failed (``reward_errors`` > 0 and no row could be scored).
    After N/2 consecutive flat steps it warns; after N it raises :class:`~grpolab.errors.RunStalled`
    saying which and what to change.
    """

    def __init__(self, steps: int, log=print):
        self.steps = int(steps)
        self.log = log
        self.flat = 0
        self.failed = 0

    def update(self, m: dict) -> str | None:
        """Count step metrics ``m``; return the message that stops the run (None while it may go on)."""
        if self.steps <= 0:
            return None
        errors = m.get("reward_errors") or 0
        failed = errors > 0 and m.get("reward_mean") is None
        flat = failed or (m.get("frac_zero_std_groups") == 1.0 and not m.get("advantage_abs_mean"))
        self.failed = self.failed + 1 if failed else 0
        self.flat = self.flat + 1 if flat else 0
        warn_at = max(1, self.steps // 2)
        if self.flat >= self.steps:
            return self.message(m, self.flat)
        if self.flat == warn_at:
            self.log(f"[grpolab] warning: {self.reason(m, self.flat)}; the run stops after {self.steps} such steps "
                     f"(stall_steps)")
        return None

    def reason(self, m: dict, n: int) -> str:
        if self.failed >= n:
            return (f"every reward call failed in the last {n} steps (reward_errors; the errors are logged above), "
                    f"so no completion could be scored")
        if m.get("reward_mean") is None:
            return (f"no completion could be scored in the last {n} steps (every reward returned None or a "
                    f"non-number)")
        return (f"every group had zero reward spread in the last {n} steps: all completions of each prompt got the "
                f"same reward (reward_mean {m.get('reward_mean'):.4g}), so every advantage was 0")

    def message(self, m: dict, n: int) -> str:
        if self.failed >= n:
            fix = "fix the reward function (call it on a few completions first), then continue with --resume"
        else:
            fix = ("check that the reward tells completions apart (for chat prompts a completion is a list of "
                   "messages, not a string), raise temperature or num_generations, or use easier prompts")
        return (f"{self.reason(m, n)}; nothing was being learned, so the run stopped (checkpoint and metrics kept). "
                f"To go on: {fix}; --stall_steps 0 disables this check")


__all__ = ["RunStalled", "StallGuard", "check_columns", "check_lengths", "check_out", "check_reward_weights",
           "first_prompt_lengths", "prompt_lengths", "model_context", "strategy_hook"]
