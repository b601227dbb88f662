"""Scripted agents for the decoupled M-GRPO test (tests/test_m_grpo.py): imported by both processes (the sub-agent's
through ``grpolab --import m_grpo_decoupled_script``, which installs the script when GRPOLAB_M_GRPO_SCRIPT=1).

Each turn is a function of what the agent sees: the main agent calls the sub-agent about the asked person, then
answers the number the sub-agent replied (plus one for people whose name starts with M..Z, so rewards differ);
the sub-agent finds the person's order in its notes, calls the calculator, then replies with the tool's answer."""
import os
import re

from grpolab.generation.turns import Continuation
from grpolab.rollouts import hierarchical as hier


def reply(text: str, main: bool) -> str:
    if main:
        person = re.search(r"How much does (\w+) pay", text).group(1)
        said = re.findall(r"sub: It is (\d+)\.", text)
        if not said:
            return f"<call>what does {person} pay?</call>"
        return f"<answer>{int(said[-1]) + (person[0] >= 'M')}</answer>"
    if "<tool_response>" not in text:
        person = re.search(r"what does (\w+) pay\?", text).group(1)
        q, price, ship = re.search(rf"{person} buys (\d+) \w+ at (\d+) coins each plus (\d+) coins", text).groups()
        return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{q} * {price} + {ship}"}}}}</tool_call>'
    result = re.findall(r"<tool_response>\n(\S+)\n", text)[-1]
    return f"It is {result}."


def scripted_turns(ctx, contexts, budgets, temperatures, stop_strings=(), model=None):
    texts = [reply(ctx.tokenizer.decode(c), "</call>" in stop_strings) for c in contexts]
    ids = [ctx.tokenizer(t, add_special_tokens=False)["input_ids"][:b] for t, b in zip(texts, budgets)]
    return Continuation(ids, [[-1.0] * len(a) for a in ids], ["stop_string"] * len(ids))


if os.environ.get("GRPOLAB_M_GRPO_SCRIPT") == "1":
    hier.sample_turns = scripted_turns
