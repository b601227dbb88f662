"""Training-Free GRPO: an experience library in place of the optimiser step (update strategy ``training_free``).

Cai et al., 2025, "Training-Free Group Relative Policy Optimization", arXiv:2510.08191, seed 000-44.

The pieces, each usable on its own (tests drive them with a scripted LM):

* :class:`ExperienceLibrary` — the numbered experiences, their operations and their prompt block;
* :func:`parse_operations` — the strict parser of the model's ``ADD`` / ``DELETE`` / ``MODIFY`` / ``KEEP`` lines;
* :func:`summary_messages`, :func:`advantage_messages`, :func:`update_messages` — the three LM requests;
* :class:`PolicyLM` — the LM the requests go to by default: the policy model itself, through the rollout context;
* :class:`TrainingFree` — the update strategy that runs them on every step's scored groups.

The rollout strategy ``experience_prompt`` (grpolab/rollouts/experience_prompt.py) puts the library into the
prompts of training rollouts and of evaluation.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data import completion_text, json_safe, render_prompt
from ..errors import ConfigError
from ..registry import UPDATE_STRATEGIES, param
from ._checks import require_at_least

OPERATIONS = ("ADD", "DELETE", "MODIFY", "KEEP")
# one operation per line; an optional list marker ("-", "*", "1." or "1)") may precede it
_MARKER = r"^\s*(?:[-*]\s+|\d+[.)]\s+)?"
_OP_LINE = re.compile(_MARKER + r"(ADD|DELETE|MODIFY|KEEP)\b(.*)$")
_ADD = re.compile(r"^\s*:\s*(?P<text>.*\S)\s*$")
_MODIFY = re.compile(r"^\s*\[?(?P<n>\d+)\]?\s*:\s*(?P<text>.*\S)\s*$")
_DELETE = re.compile(r"^\s*\[?(?P<n>\d+)\]?\s*\.?\s*$")
_KEEP = re.compile(r"^\s*\.?\s*$")

EXPERIENCE_HEADER = "Helpful experiences from earlier attempts (read them before you answer):"


class OperationError(ValueError):
    """A library-update reply that cannot be applied (the message names the line and what is wrong)."""


@dataclass(frozen=True)
class Operation:
    """One library operation: ``kind`` in :data:`OPERATIONS`, ``index`` the 1-based experience number (MODIFY,
    DELETE), ``text`` the experience (ADD, MODIFY)."""
    kind: str
    index: int | None = None
    text: str | None = None


def parse_operations(reply: str, size: int, max_words: int) -> list[Operation]:
    """The operations of a library-update reply on a library of ``size`` experiences numbered 1..size.

    Every line that starts with ``ADD``, ``DELETE``, ``MODIFY`` or ``KEEP`` (upper case, after an optional list
    marker) is an operation and must be one of::

        ADD: <experience>
        MODIFY <n>: <experience>        (also "MODIFY [n]: ...")
        DELETE <n>
        KEEP

    Other lines (the model's reasoning) are ignored, as the authors take only the reply's JSON block. Strict:
    a malformed operation line, a number outside 1..size, two operations on one experience, an experience of
    more than ``max_words`` words, ``KEEP`` together with other operations, or a reply with no operation line
    raises :class:`OperationError` naming the line.
    """
    ops: list[Operation] = []
    touched: dict[int, int] = {}
    for lineno, line in enumerate(reply.splitlines(), 1):
        m = _OP_LINE.match(line)
        if m is None:
            continue
        kind, rest = m.group(1), m.group(2)
        where = f"line {lineno} ({line.strip()[:80]!r})"
        pattern = {"ADD": _ADD, "MODIFY": _MODIFY, "DELETE": _DELETE, "KEEP": _KEEP}[kind]
        form = {"ADD": "ADD: <experience>", "MODIFY": "MODIFY <n>: <experience>", "DELETE": "DELETE <n>",
                "KEEP": "KEEP"}[kind]
        p = pattern.match(rest)
        if p is None:
            raise OperationError(f"{where}: write a {kind} operation as '{form}'")
        index = int(p.group("n")) if "n" in p.groupdict() else None
        text = p.group("text").strip() if "text" in p.groupdict() else None
        if index is not None:
            if not 1 <= index <= size:
                have = f"numbers 1..{size}" if size else "the library is empty"
                raise OperationError(f"{where}: experience {index} does not exist ({have})")
            if index in touched:
                raise OperationError(f"{where}: experience {index} already has an operation on line "
                                     f"{touched[index]}; one operation per experience")
            touched[index] = lineno
        if text is not None and len(text.split()) > max_words:
            raise OperationError(f"{where}: the experience has {len(text.split())} words, more than "
                                 f"training_free_max_words={max_words}")
        ops.append(Operation(kind, index, text))
    if not ops:
        raise OperationError(f"no operation line (lines starting with {', '.join(OPERATIONS)})")
    if any(o.kind == "KEEP" for o in ops) and len(ops) > 1:
        raise OperationError("KEEP leaves the library unchanged: it must be the only operation")
    return ops


class ExperienceLibrary:
    """The experiential knowledge E: a list of short texts, numbered 1..n in the prompt.

    :meth:`apply` applies a parsed update at once: every ``MODIFY n`` / ``DELETE n`` refers to the numbering the
    model was shown; modifications are made, then deletions, then ``ADD`` texts are appended in their order;
    the result is numbered 1..n again (the authors reassign the ids ``G0, G1, ...`` after every update).
    ``KEEP`` changes nothing. A result with more than ``max_size`` experiences raises :class:`OperationError`
    and leaves the library as it was.
    """

    def __init__(self, experiences: list[str] | None = None):
        self.experiences: list[str] = list(experiences or [])

    def __len__(self) -> int:
        return len(self.experiences)

    def numbered(self) -> str:
        """``[1] first\\n[2] second`` (``None`` when empty, as the authors show an empty library)."""
        return "\n".join(f"[{i}] {e}" for i, e in enumerate(self.experiences, 1)) or "None"

    def apply(self, ops: list[Operation], max_size: int) -> None:
        new = list(self.experiences)
        for op in ops:
            if op.kind == "MODIFY":
                new[op.index - 1] = op.text
        deleted = {op.index for op in ops if op.kind == "DELETE"}
        new = [e for i, e in enumerate(new, 1) if i not in deleted]
        new += [op.text for op in ops if op.kind == "ADD"]
        if len(new) > max_size:
            raise OperationError(f"the update leaves {len(new)} experiences, more than training_free_max_"
                                 f"experiences={max_size}; DELETE or MODIFY instead of ADD")
        self.experiences = new

    def prompt_block(self) -> str:
        """What is appended to a question: the header and the numbered experiences ('' when empty)."""
        if not self.experiences:
            return ""
        return f"\n\n{EXPERIENCE_HEADER}\n{self.numbered()}"

    def with_experiences(self, row: dict) -> dict:
        """``row`` with the library appended to its prompt (to the last user message of a chat prompt); an empty
        library leaves the row as it is (the authors' plain problem before the first update)."""
        block = self.prompt_block()
        if not block:
            return row
        out = dict(row)
        prompt = row["prompt"]
        if isinstance(prompt, str):
            out["prompt"] = prompt + block
            return out
        msgs = [dict(m) for m in prompt]
        users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
        i = users[-1] if users else len(msgs) - 1
        msgs[i]["content"] = msgs[i]["content"] + block
        out["prompt"] = msgs
        return out

    def markdown(self, step: int) -> str:
        lines = [f"# Experience library after step {step}", "",
                 f"{len(self)} experiences (Training-Free GRPO, arXiv:2510.08191); the rollouts and evaluation of "
                 f"later steps see them in their prompts.", ""]
        lines += [f"{i}. {e}" for i, e in enumerate(self.experiences, 1)] or ["(empty)"]
        return "\n".join(lines) + "\n"

    def state_dict(self) -> dict:
        return {"experiences": list(self.experiences)}

    def load_state_dict(self, state: dict) -> None:
        self.experiences = list(state["experiences"])


# ------------------------------------------------------------------------------------------------ the requests
def _cut(text: str, chars: int) -> str:
    text = text.strip()
    return text if len(text) <= chars else text[:chars].rstrip() + " [...]"


def question_text(prompt) -> str:
    """The question as the model was asked it (a chat prompt's user messages), without the library."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
    return "\n".join(users or [m.get("content", "") for m in prompt])


def summary_messages(question: str, attempt: str, reward: float, answer: str | None, chars: int) -> list[dict]:
    """Stage 1 (per rollout): summarise the attempt step by step, naming detours and errors given its reward
    and the reference answer."""
    ref = f"\nReference answer: {answer}" if answer is not None else ""
    return [{"role": "user", "content":
             f"Problem: {question}\n\nAttempt:\n{_cut(attempt, chars)}\n\nReward of this attempt: {reward:.2f} "
             f"(1 is best).{ref}\n\nSummarise the attempt step by step: what it did at each step and the outcome, "
             f"and which steps were detours or errors and why. Reply with the numbered steps only."}]


def advantage_messages(question: str, summaries: list[str], rewards: list[float], answer: str | None,
                       library: ExperienceLibrary, chars: int) -> list[dict]:
    """Stage 2 (per group): the semantic group advantage — why the better attempts were better, as lessons."""
    ref = f"\nReference answer: {answer}" if answer is not None else ""
    attempts = "\n\n".join(f"Attempt {i} (reward {r:.2f}):\n{_cut(s, chars)}"
                           for i, (s, r) in enumerate(zip(summaries, rewards), 1))
    return [{"role": "user", "content":
             f"Several attempts at one problem got different rewards (1 is best).\n\nProblem: {question}{ref}\n\n"
             f"{attempts}\n\nCurrent experiences:\n{library.numbered()}\n\nCompare the better attempts with the "
             f"worse ones: what did the better ones do right, where did the worse ones go wrong, and was an "
             f"experience missing or unhelpful? End with at most two general lessons for similar problems, one "
             f"per line, each a short sentence about strategy, not about this problem's numbers."}]


def update_messages(library: ExperienceLibrary, advantages: list[str], max_words: int, max_size: int,
                    chars: int) -> list[dict]:
    """Stage 3 (per batch): turn the groups' lessons into operations on the numbered library."""
    lessons = "\n\n".join(f"Lessons from problem {i}:\n{_cut(a, chars)}" for i, a in enumerate(advantages, 1))
    return [{"role": "user", "content":
             f"You keep a library of experiences that helps solve problems.\n\nCurrent experiences:\n"
             f"{library.numbered()}\n\n{lessons}\n\nUpdate the library with these lessons. Write one operation per "
             f"line:\nADD: <new experience>\nMODIFY <n>: <better wording of experience n>\nDELETE <n>\nKEEP (only "
             f"this line, when nothing should change)\nEach experience is one general sentence of at most "
             f"{max_words} words; the library holds at most {max_size}. Merge similar experiences with MODIFY and "
             f"DELETE instead of adding duplicates."}]


# ------------------------------------------------------------------------------------------------------ the LM
class PolicyLM:
    """The policy model as the LM of the three stages: each request (a chat) is rendered with the tokenizer's
    chat template and continued by ``ctx.continue_`` (the run's sampler, token-draw generator and, when one is
    configured, generation engine) with ``max_new_tokens`` and ``temperature`` (0: greedy). Returns the decoded
    replies. A request that does not fit the model's context with ``max_new_tokens`` is a ConfigError."""

    def __init__(self, ctx, max_new_tokens: int, temperature: float):
        self.ctx, self.max_new_tokens, self.temperature = ctx, int(max_new_tokens), float(temperature)

    def __call__(self, requests: list[list[dict]]) -> list[str]:
        tok = self.ctx.tokenizer
        contexts = [tok(render_prompt(tok, r), add_special_tokens=False)["input_ids"] for r in requests]
        limit = getattr(getattr(self.ctx.policy, "config", None), "max_position_embeddings", None)
        longest = max(map(len, contexts))
        if limit is not None and longest + self.max_new_tokens > limit:
            raise ConfigError(f"training_free_max_new_tokens: a Training-Free GRPO request has {longest} tokens; "
                              f"with {self.max_new_tokens} new tokens it exceeds the model's context of {limit}; "
                              f"lower training_free_text_chars or training_free_max_new_tokens")
        with torch.no_grad():
            out = self.ctx.continue_(contexts, max_new_tokens=self.max_new_tokens, temperature=self.temperature)
        return [tok.decode(ids, skip_special_tokens=True) for ids in out.ids]


def _import_lm(spec: str):
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"training_free_lm: '{spec}' is neither 'policy' nor an importable MODULE:FUNCTION "
                          f"({e})") from None


def _check(cfg) -> None:
    if cfg.rollout_strategy != "experience_prompt":
        raise ConfigError(f"update_strategy training_free: the experience library must reach the prompts; set "
                          f"rollout_strategy: experience_prompt (got {cfg.rollout_strategy})")
    if cfg.beta != 0:
        raise ConfigError(f"beta: training_free changes no weight, so a KL to the reference is 0 and loading it "
                          f"is waste; set beta: 0 (got {cfg.beta})")
    require_at_least(cfg, 1, "training_free_max_experiences", "training_free_max_words",
                     "training_free_max_new_tokens", "training_free_text_chars", "training_free_attempts")
    require_at_least(cfg, 0, "training_free_lm_temperature")
    if cfg.training_free_lm != "policy" and ":" not in cfg.training_free_lm:
        raise ConfigError(f"training_free_lm: 'policy' or MODULE:FUNCTION, got '{cfg.training_free_lm}'")


LIBRARY_FILE, UPDATES_FILE = "experiences.md", "experience_updates.jsonl"


def _answer_column(cfg) -> list[str]:
    """The reference-answer column every training row needs (none when ``training_free_answer_column`` is '')."""
    return [cfg.training_free_answer_column] if cfg.training_free_answer_column else []


@UPDATE_STRATEGIES.register("training_free", check=_check, needs=("text",), columns=_answer_column)
class TrainingFree:
    """Training-Free GRPO's update: no weight changes; the step's groups update an experience library.

    For every group of the step's scored batch (the prompt's G rollouts o_1..o_G with scalar rewards r_i):

    0. a group whose rewards are all equal (max r = min r) is skipped: it has no relative signal (the authors
       keep a group only when 0 < mean(r) < 1, which for their 0/1 rewards is the same rule);
    1. summary s_i = LM(summarise o_i | question, r_i, reference answer) for each rollout (stage 1);
    2. semantic advantage A_g = LM(why the better rollouts were better | question, {(s_i, r_i)}, answer, E) (2);
    3. once per step, the operations LM(E, {A_g}) -> ADD / DELETE / MODIFY / KEEP lines, parsed strictly
       (:func:`parse_operations`) and applied to E at once (:meth:`ExperienceLibrary.apply`).

    A reply that does not parse is asked again, up to ``training_free_attempts`` requests in all (the
    authors' ``max_retries=3``); each failed reply counts in ``training_free/malformed_replies`` and its error
    is logged and written to ``experience_updates.jsonl``; if none parses the library stays as it was. The
    LM is the policy model itself (``training_free_lm: policy``, :class:`PolicyLM`) or a user function
    ``MODULE:FUNCTION`` taking a list of chats (lists of ``{"role", "content"}`` messages) and returning one
    reply string per chat. The library is this component's checkpointed state and is written, every step, to
    ``OUT/experiences.md`` (readable) and one line per step to ``OUT/experience_updates.jsonl`` (the lessons,
    the replies, the operations, the errors). The optimiser never steps: the weights never change.

    Paper: Cai et al., 2025, "Training-Free Group Relative Policy Optimization", arXiv:2510.08191, seed 000-44.

    Provenance: authors' code — https://github.com/TencentCloudADP/youtu-agent, training_free_grpo/math/experience.py
    (branch training_free_GRPO: per-rollout summaries, per-problem critique over the summaries with the current
    experiences, one batch update; only partially correct groups; experiences renumbered after each update;
    3 retries of the batch update) and utu/practice/experience_updater.py (main branch: the semantic group
    advantage as lessons, operations ADD / UPDATE / DELETE / NONE); the prompts are grpolab's own wording, and
    the operations are lines (ADD / MODIFY / DELETE / KEEP, the paper's names) instead of the authors' JSON array
    so a small model can write them and an error names its line; the authors' per-group operation step
    (group update) is folded into the batch update; groups with equal rewards are skipped also for non-binary
    rewards. Test: tests/test_training_free.py::test_update_on_scripted_replies_hand_checked.
    """

    run_paths = (LIBRARY_FILE, UPDATES_FILE)  # what it writes in the run folder (the trainer's manifest)

    def __init__(self, *, out: str = "runs/default",
                 training_free_max_experiences: int = param(
                     16, "training_free: most experiences the library holds (an update that leaves more is "
                         "malformed)"),
                 training_free_max_words: int = param(
                     32, "training_free: most words of one experience (the authors' prompt asks for at most 32)"),
                 training_free_max_new_tokens: int = param(
                     192, "training_free: new tokens of each summary / advantage / update reply of the LM"),
                 training_free_lm_temperature: float = param(
                     0.7, "training_free: sampling temperature of the LM's replies (0: greedy, and then a "
                          "repeated library-update request gets the same reply)"),
                 training_free_text_chars: int = param(
                     1200, "training_free: a rollout, summary or lesson shown to the LM is cut to this many "
                           "characters (marked ' [...]')"),
                 training_free_attempts: int = param(
                     3, "training_free: library-update requests per step until one parses (the authors' "
                        "max_retries)"),
                 training_free_answer_column: str = param(
                     "answer", "training_free: data column with the reference answer shown to the LM ('' for "
                               "none)"),
                 training_free_lm: str = param(
                     "policy", "training_free: the LM that summarises, compares and updates: 'policy' (the "
                               "model itself, as the authors) or MODULE:FUNCTION (chats -> replies)")):
        self.out = Path(out) if out else None
        self.max_size, self.max_words = int(training_free_max_experiences), int(training_free_max_words)
        self.max_new_tokens, self.temperature = int(training_free_max_new_tokens), float(training_free_lm_temperature)
        self.chars, self.attempts = int(training_free_text_chars), int(training_free_attempts)
        self.answer_column = training_free_answer_column or None
        self.lm_spec = training_free_lm
        self.lm = None if training_free_lm == "policy" else _import_lm(training_free_lm)
        self.library = ExperienceLibrary()
        self.last_step = 0  # the step the library was last updated at (checkpointed: the updates file's cut)

    # the rollout strategy experience_prompt finds the library through this
    def with_experiences(self, row: dict) -> dict:
        return self.library.with_experiences(row)

    def __call__(self, batch, ctx, step: int):
        lm = self.lm if self.lm is not None else PolicyLM(ctx, self.max_new_tokens, self.temperature)
        t0 = time.perf_counter()
        record = self.update(batch, ctx.rows, lm, log=ctx.log)
        self.last_step = step + 1
        record["step"] = self.last_step
        self._write(record)
        m = {"training_free/" + k: v for k, v in record["metrics"].items()}
        m["training_free/lm_s"] = time.perf_counter() - t0
        return {"loss": None, "kl": None, "entropy": None, "clip_frac_low": 0.0, "clip_frac_high": 0.0,
                "grad_norm": None, "skipped": 0, **m}

    def groups(self, batch, rows: list[dict]):
        """``(kept, skipped)``: kept is a list of (question, answer, [(attempt text, reward)]) per group with
        unequal rewards, in group-id order."""
        rewards = batch.scalar_rewards.tolist()
        gids = batch.group_ids.tolist()
        kept, skipped = [], 0
        for g in sorted(set(gids)):
            idx = [i for i, x in enumerate(gids) if x == g]
            rs = [rewards[i] for i in idx]
            if any(r != r for r in rs):  # NaN: an unscorable rollout cannot be ranked
                rs = [r for r in rs if r == r]
                idx = [i for i in idx if rewards[i] == rewards[i]]
            if len(rs) < 2 or max(rs) == min(rs):
                skipped += 1
                continue
            row = rows[batch.prompt_uids[idx[0]]]
            answer = None
            if self.answer_column is not None:
                if self.answer_column not in row:
                    raise ConfigError(f"training_free_answer_column: a training row has no column "
                                      f"'{self.answer_column}' (columns: {', '.join(sorted(row))}); set it to the "
                                      f"reference answer's column, or '' to show none")
                answer = str(row[self.answer_column])
            attempts = [(completion_text(batch.columns["completion"][i]), rewards[i]) for i in idx]
            kept.append((question_text(row["prompt"]), answer, attempts))
        return kept, skipped

    def update(self, batch, rows: list[dict], lm, log=print) -> dict:
        """The three stages on a scored batch; returns the step's record (metrics, lessons, replies, errors)."""
        kept, skipped = self.groups(batch, rows)
        metrics = {"groups_used": len(kept), "groups_skipped": skipped, "malformed_replies": 0, "lm_calls": 0,
                   "ops_add": 0, "ops_modify": 0, "ops_delete": 0, "ops_keep": 0}
        record = {"library_before": list(self.library.experiences), "lessons": [], "replies": [], "errors": [],
                  "operations": []}
        if kept:
            requests = [summary_messages(q, a, r, ans, self.chars) for q, ans, atts in kept for a, r in atts]
            summaries = lm(requests)
            metrics["lm_calls"] += len(requests)
            it = iter(summaries)
            requests = [advantage_messages(q, [next(it) for _ in atts], [r for _, r in atts], ans, self.library,
                                           self.chars) for q, ans, atts in kept]
            lessons = [s.strip() for s in lm(requests)]
            metrics["lm_calls"] += len(requests)
            record["lessons"] = lessons
            request = update_messages(self.library, lessons, self.max_words, self.max_size, self.chars)
            for _ in range(self.attempts):
                reply = lm([request])[0]
                metrics["lm_calls"] += 1
                record["replies"].append(reply)
                try:
                    ops = parse_operations(reply, len(self.library), self.max_words)
                    self.library.apply(ops, self.max_size)
                except OperationError as e:
                    metrics["malformed_replies"] += 1
                    record["errors"].append(str(e))
                    log(f"[grpolab] training_free: library-update reply not applied: {e}")
                    continue
                record["operations"] = [{"op": o.kind, "n": o.index, "text": o.text} for o in ops]
                for o in ops:
                    metrics[f"ops_{o.kind.lower()}"] += 1
                break
        metrics["experiences"] = len(self.library)
        record["metrics"] = metrics
        record["library"] = list(self.library.experiences)
        return record

    def _write(self, record: dict) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / LIBRARY_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.library.markdown(record["step"]))
        os.replace(tmp, path)
        with open(self.out / UPDATES_FILE, "a") as fh:
            fh.write(json.dumps(json_safe(record), ensure_ascii=False) + "\n")

    def state_dict(self) -> dict:
        return {**self.library.state_dict(), "last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        """Restore the library; the run folder's files are cut back to the restored step (a resume after a
        kill redoes the steps after the checkpoint)."""
        self.library.load_state_dict(state)
        self.last_step = int(state["last_step"])
        if self.out is None:
            return
        updates = self.out / UPDATES_FILE
        if updates.exists():
            keep = [ln for ln in updates.read_text().splitlines() if ln.strip()
                    and json.loads(ln)["step"] <= self.last_step]
            updates.write_text("".join(ln + "\n" for ln in keep))
        if (self.out / LIBRARY_FILE).exists() or self.last_step:
            (self.out / LIBRARY_FILE).write_text(self.library.markdown(self.last_step))
