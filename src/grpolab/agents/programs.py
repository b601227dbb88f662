"""Built-in LM programs for the ``lm_program`` rollout (grpolab/rollouts/lm_program.py).

An LM program is a plain Python function ``program(lm, row) -> answer text``: ``row`` is the data row (a copy),
``lm(module, messages_or_text, max_new_tokens=None) -> text`` samples one reply of the run's model for the named
module (a chat, a list of ``{"role", "content"}`` messages, or a plain text prompt). The rollout records every
call and scores the returned answer with the task's reward functions.

A program whose module reply cannot be used raises :class:`FormatFailure` (the run then gets the format failure
score, as dspy's ``AdapterParseError``); any other exception is an interrupted run (``lm_program_on_error``).

Built in (both for tasks with a ``question`` column and an integer ``answer``, such as ``arithmetic``):

* ``plan_solve`` — two modules: ``plan`` writes a one-line plan, ``solve`` answers the question given the plan;
* ``agentflow`` — AgentFlow's four modules with an evolving memory (In-the-Flow Agentic System Optimization,
  arXiv:2510.05592, seed 000-79): in each of at most :data:`AGENTFLOW_TURNS` turns the ``planner`` names the next
  sub-goal, the ``executor`` writes the calculator expression for it, the calculator tool
  (:func:`grpolab.agents.tools.calculator`) runs it and the result goes into the memory, the ``verifier`` says
  STOP or CONTINUE; then the ``generator`` writes the final answer from the memory.
"""
from __future__ import annotations

import re

from .tools import calculator

AGENTFLOW_TURNS = 3  # the authors' TOOL_STEPS (train/config.yaml): at most 3 planner turns

PLAN = "Write a one-line plan for computing {q}. Do not compute the result."
SOLVE = "Compute {q}. Plan: {plan}\nFinish your reply with 'Answer:' followed by the number."
PLANNER = ("You are the planner. Question: {q}\nMemory:\n{memory}\nName the next sub-goal in one line, with the "
           "arithmetic expression to compute.")
EXECUTOR = "You are the executor. Sub-goal: {plan}\nWrite only the calculator expression for it, e.g. 12 * 34."
VERIFIER = ("You are the verifier. Question: {q}\nMemory:\n{memory}\nDoes the memory answer the question? Reply "
            "STOP or CONTINUE.")
GENERATOR = ("You are the generator. Question: {q}\nMemory:\n{memory}\nFinish your reply with 'Answer:' followed by "
             "the number.")
TEXTS = [PLAN, SOLVE, PLANNER, EXECUTOR, VERIFIER, GENERATOR, "Step 1: x -> calculator(1 + 2) = 3 (empty) Error"]

_EXPRESSION = re.compile(r"[-(]*\d[\d\s.+\-*/()%]*")


class FormatFailure(Exception):
    """Raised by a program when a module's reply cannot be used (dspy's ``AdapterParseError``): the run keeps its
    calls and gets ``lm_program_format_failure_score``."""


def with_demos(prompt, demos) -> object:
    """A module's prompt with its few-shot demonstrations in front (the prompt optimiser's, BetterTogether's
    "p" step: grpolab/stages/update_better_together.py); ``demos`` is a list of ``{"prompt", "reply"}``: an
    earlier call's own prompt (a text or a chat) and the module's reply to it.

    A chat: after its leading system messages, each demo's non-system messages then ``{"role": "assistant",
    "content": reply}``, then the chat's own other messages (a text demo is one user message), as dspy's chat
    adapter writes demos as user / assistant turns before the input. A text: each demo as ``prompt + reply +
    "\n\n"`` (a chat demo's message contents joined by newlines), then the text. No demos: the prompt as it is.
    """
    if not demos:
        return prompt
    if isinstance(prompt, str):
        def text(p):
            return p if isinstance(p, str) else "\n".join(m["content"] for m in p)
        return "".join(f"{text(d['prompt'])}{d['reply']}\n\n" for d in demos) + prompt
    lead = 0
    while lead < len(prompt) and prompt[lead]["role"] == "system":
        lead += 1
    shown = [dict(m) for m in prompt[:lead]]
    for d in demos:
        p = d["prompt"]
        shown += ([{"role": "user", "content": p}] if isinstance(p, str)
                  else [dict(m) for m in p if m["role"] != "system"])
        shown.append({"role": "assistant", "content": d["reply"]})
    return shown + [dict(m) for m in prompt[lead:]]


def question_of(row: dict) -> str:
    """The row's ``question`` column, or else the text of its prompt's last user message (or the text prompt)."""
    if "question" in row:
        return str(row["question"])
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    return [m["content"] for m in prompt if m["role"] == "user"][-1]


def expression_in(text: str) -> str | None:
    """The longest arithmetic expression in ``text`` that has an operator, or else its longest number; None."""
    found = [m.group(0).strip() for m in _EXPRESSION.finditer(text)]
    with_op = [f for f in found if re.search(r"\d\s*[-+*/%]\s*[\d(]", f)]
    pool = with_op or found
    return max(pool, key=len) if pool else None


def plan_solve(lm, row: dict) -> str:
    """Two modules: ``plan`` (a one-line plan, only its first line is used) then ``solve`` (the answer)."""
    q = question_of(row)
    plan = lm("plan", [{"role": "user", "content": PLAN.format(q=q)}]).strip().split("\n")[0]
    return lm("solve", [{"role": "user", "content": SOLVE.format(q=q, plan=plan)}])


def agentflow(lm, row: dict) -> str:
    """AgentFlow's planner / executor / verifier / generator with an evolving memory (the module docstring).

    The memory is a text of one line per turn, ``Step k: <sub-goal> -> calculator(<expression>) = <result>``, shown
    to the planner, the verifier and the generator. The executor's expression is taken from its reply, or, when
    it has none, from the planner's sub-goal; with neither the step's result is an error line (the tool's
    answer), as a failing tool is an observation."""
    q = question_of(row)
    memory: list[str] = []
    for turn in range(1, AGENTFLOW_TURNS + 1):
        shown = "\n".join(memory) or "(empty)"
        plan = lm("planner", [{"role": "user", "content": PLANNER.format(q=q, memory=shown)}]).strip()
        plan = plan.split("\n")[0]
        command = lm("executor", [{"role": "user", "content": EXECUTOR.format(plan=plan)}])
        expr = expression_in(command) or expression_in(plan)
        result = calculator(expr) if expr else "Error: no expression"
        memory.append(f"Step {turn}: {plan} -> calculator({expr or ''}) = {result}")
        verdict = lm("verifier", [{"role": "user", "content": VERIFIER.format(q=q, memory="\n".join(memory))}])
        if "STOP" in verdict.upper():
            break
    return lm("generator", [{"role": "user", "content": GENERATOR.format(q=q, memory="\n".join(memory))}])


BUILTIN_PROGRAMS = {"plan_solve": plan_solve, "agentflow": agentflow}
