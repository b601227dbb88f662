"""``function_calls``: single-turn function calling with structured reasoning (seed 000-106's training format).

The prompt lists the available functions as JSON schemas (BFCL's ``{"name", "description", "parameters"}``)
and asks a question that needs one or two calls. The reply reasons first and then gives the calls in BFCL's
Python syntax, the format of the authors' published examples (https://github.com/BingguangHao/RLFC,
README figure ``img/think.png``)::

    <think>To convert ... I need convert_currency ... - Amount: 20000 ... all required parameters are
    provided.</think><answer>[convert_currency(base_currency='JPY', target_currency='USD', amount=20000)]</answer>

Rewards: ``accuracy`` (weight 1) — :func:`fc_single_criteria`, the authors' "single criteria reward" (1 when
the format *and* the calls are right, else 0); ``format`` (weight 0: logged, not trained on) —
:func:`fc_think_format`, the structured-reasoning format alone.

Also here, for any function-calling data (a list of tool schemas plus reference calls per row):
:func:`parse_calls` (BFCL Python call syntax -> ``[{"name", "arguments"}]``), :func:`format_calls` (the
reverse), :func:`schema_errors` (the AST validation of calls against the tool schemas: function exists,
argument names known, required ones present, JSON-schema types and enums respected). The two-stage data
preparation that uses them is :mod:`grpolab.tasks.fc_data_prep`.

Columns: ``question``, ``tools`` (list of schemas), ``gold_tool_calls`` (list of ``{"name", "arguments"}``),
``answer`` (the reference calls in Python syntax).
"""
from __future__ import annotations

import ast
import json
import random
import re

from ..data import completion_text
from ..registry import TASKS, param
from .base import Task

# --------------------------------------------------------------------------- call syntax

def _dotted(node) -> str | None:
    """``a.b.c`` of a Name/Attribute chain, None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def parse_calls(text) -> list[dict] | None:
    """BFCL's Python call syntax -> ``[{"name": ..., "arguments": {...}}]``; None when it is not that syntax.

    ``"[f(a=1, b='x'), g.h(c=[1, 2])]"`` -> two calls; a single call without brackets is accepted; ``[]`` is no
    call. Every argument must be a keyword with a literal value (numbers, strings, booleans, None, lists,
    tuples, dicts); a positional argument, a repeated keyword or a non-literal value makes the whole text
    unparsable (None), as BFCL's AST checker rejects it."""
    if isinstance(text, list):
        return text
    try:
        node = ast.parse(str(text).strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    calls = []
    for it in items:
        if not isinstance(it, ast.Call) or it.args:
            return None
        name = _dotted(it.func)
        if name is None:
            return None
        args: dict = {}
        for kw in it.keywords:
            if kw.arg is None or kw.arg in args:
                return None
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError):
                return None
        calls.append({"name": name, "arguments": args})
    return calls


def format_calls(calls: list[dict]) -> str:
    """``[{"name": "f", "arguments": {"a": 1}}]`` -> ``"[f(a=1)]"`` (Python literals, arguments in order)."""
    return "[" + ", ".join(f"{c['name']}(" + ", ".join(f"{k}={v!r}" for k, v in (c.get("arguments") or {}).items())
                           + ")" for c in calls) + "]"


def reference_calls_of(value) -> list[dict] | None:
    """Reference calls given as a list of dicts, their JSON text or Python call syntax; None if unreadable."""
    if isinstance(value, list):
        return value if all(isinstance(c, dict) and "name" in c for c in value) else None
    if isinstance(value, dict) and "name" in value:
        return [value]
    text = str(value).strip()
    if text.startswith(("[{", "{")):
        try:
            return reference_calls_of(json.loads(text))
        except json.JSONDecodeError:
            return None
    return parse_calls(text)


# --------------------------------------------------------------------------- BFCL's AST match (shared with the
# agent rewards fc_ast / tool_call_accuracy in grpolab/rewards/agentic.py, which import it from here)

def canon_value(v):
    """A value in a canonical comparable form: numbers as floats, strings case-folded without whitespace (as
    BFCL's checker standardises strings)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        try:
            return float(s)
        except ValueError:
            return re.sub(r"\s+", "", s).casefold()
    if isinstance(v, dict):
        return tuple(sorted((str(k), canon_value(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(canon_value(x) for x in v)
    return v


def ast_valid_call(pred: dict, gold: dict) -> bool:
    """BFCL-style AST check of one call against a reference: same function name, arguments parsed, every
    reference argument present with an equal (canonical) value, no argument the reference lacks."""
    if pred.get("name") != gold.get("name") or not isinstance(pred.get("arguments"), dict) or pred.get("error"):
        return False
    pa, ga = pred["arguments"], gold.get("arguments") or {}
    if set(pa) != set(ga):
        return False
    return all(canon_value(pa[k]) == canon_value(ga[k]) for k in ga)


def ast_match(pred: list[dict], gold: list[dict], ordered: bool) -> bool:
    """All calls AST-valid against the references, one to one (in order, or any order)."""
    if len(pred) != len(gold):
        return False
    if ordered:
        return all(ast_valid_call(p, g) for p, g in zip(pred, gold))
    left = list(gold)
    for p in pred:
        hit = next((j for j, g in enumerate(left) if ast_valid_call(p, g)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True



# --------------------------------------------------------------------------- AST validation against schemas

_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
               "array": (list, tuple), "object": (dict,), "null": (type(None),)}


def tool_table(tools: list[dict]) -> dict[str, dict]:
    """``{name: schema}`` of tool schemas given plain (``{"name", "parameters"}``) or in the OpenAI / TRL wrapper
    (``{"type": "function", "function": {...}}``). A schema without a name is an error."""
    table = {}
    for t in tools or []:
        f = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(f, dict) or not f.get("name"):
            raise ValueError(f"tool schema without a name: {t!r}")
        table[f["name"]] = f
    return table


def value_errors(value, spec: dict, where: str) -> list[str]:
    """What is wrong with ``value`` under the JSON-schema ``spec`` (type, enum; array items recursively)."""
    if not isinstance(spec, dict):
        return []
    if "enum" in spec and value not in spec["enum"]:
        return [f"{where}: {value!r} is not one of {spec['enum']}"]
    t = spec.get("type")
    if t is None:
        return []
    kinds = t if isinstance(t, list) else [t]
    ok = False
    for k in kinds:
        py = _JSON_TYPES.get(k)
        if py is None:  # an unknown type name is not checked
            return []
        if isinstance(value, py) and not (k in ("integer", "number") and isinstance(value, bool)):
            ok = True
            break
    if not ok:
        return [f"{where}: {value!r} is not of type {t}"]
    if "array" in kinds and isinstance(value, (list, tuple)) and isinstance(spec.get("items"), dict):
        return [e for j, v in enumerate(value) for e in value_errors(v, spec["items"], f"{where}[{j}]")]
    return []


def schema_errors(calls: list[dict], tools: list[dict]) -> list[str]:
    """The AST validation of reference calls against the tool schemas: every call names a function of
    ``tools``; every argument is a declared parameter; every ``required`` parameter is given; every value
    has the declared JSON-schema type (``integer`` excludes booleans and floats; ``number`` accepts integers)
    and is in the ``enum`` when there is one. Returns the errors (empty: valid)."""
    table = tool_table(tools)
    errors = []
    if not calls:
        return ["no call"]
    for j, c in enumerate(calls):
        name = c.get("name")
        if name not in table:
            errors.append(f"call {j}: function '{name}' is not among the tools ({', '.join(sorted(table))})")
            continue
        params = table[name].get("parameters") or {}
        props = params.get("properties") or {}
        args = c.get("arguments")
        if not isinstance(args, dict):
            errors.append(f"call {j}: {name}: arguments are not a mapping")
            continue
        errors += [f"call {j}: {name}: unknown argument '{a}'" for a in args if a not in props]
        errors += [f"call {j}: {name}: missing required argument '{r}'" for r in params.get("required", [])
                   if r not in args]
        for a, v in args.items():
            if a in props:
                errors += value_errors(v, props[a], f"call {j}: {name}.{a}")
    return errors


# --------------------------------------------------------------------------- structured reasoning + rewards

THINK_ANSWER_FC = re.compile(r"^<think>(.*?)</think>\s*<answer>(.*?)</answer>$", re.S)


def split_think_answer(text: str) -> tuple[str, str] | None:
    """``(thought, answer)`` of a reply that is exactly ``<think>T</think><answer>A</answer>`` (whitespace
    around and between the blocks allowed, each tag once, ``T`` not blank); None otherwise."""
    t = str(text).strip()
    if any(t.count(tag) != 1 for tag in ("<think>", "</think>", "<answer>", "</answer>")):
        return None
    m = THINK_ANSWER_FC.match(t)
    if m is None or not m.group(1).strip():
        return None
    return m.group(1).strip(), m.group(2).strip()


def fc_think_format(prompts=None, completions=None, **kwargs) -> list[float]:
    """Structured-reasoning format reward: 1 when the reply is ``<think>T</think><answer>A</answer>``
    (:func:`split_think_answer`) and ``A`` parses as BFCL calls (:func:`parse_calls`), else 0.

    Provenance: reconstructed from the abstract — with the authors' README figures
    (https://github.com/BingguangHao/RLFC, img/think.png: the ``<think>…</think><answer>[f(k=v)]</answer>``
    replies; img/pipeline.png: the format is part of the single-criteria reward), arXiv:2508.05118, seed
    000-106; the paper's exact format rule is not public, the rule here is grpolab's.
    Test: tests/test_fc_entropy_grpo.py::test_format_and_single_criteria_rewards."""
    out = []
    for c in completions:
        parts = split_think_answer(completion_text(c))
        out.append(float(parts is not None and parse_calls(parts[1]) is not None))
    return out


def fc_single_criteria(prompts=None, completions=None, gold_tool_calls=None, **kwargs) -> list[float]:
    """The single-criteria reward of seed 000-106: ``R = 1`` if the format is right (:func:`fc_think_format`)
    **and** the answer's calls match the reference calls under BFCL's AST check
    (:func:`grpolab.rewards.agentic.ast_match`, any order: same function names, same argument sets, equal
    canonical values, one to one), else ``R = 0``.

    Provenance: reconstructed from the abstract — with the authors' README figure
    (https://github.com/BingguangHao/RLFC, img/pipeline.png: "Single Criteria Reward: format & answer 1.0,
    others 0.0"), arXiv:2508.05118, seed 000-106; the AST comparison is grpolab's BFCL-style check (the
    authors' checker is not public).
    Test: tests/test_fc_entropy_grpo.py::test_format_and_single_criteria_rewards."""
    if gold_tool_calls is None:
        raise ValueError("fc_single_criteria: needs the data column 'gold_tool_calls' (the reference calls); use "
                         "task function_calls or data with that column")
    out = []
    for c, gold in zip(completions, gold_tool_calls):
        parts = split_think_answer(completion_text(c))
        pred = parse_calls(parts[1]) if parts is not None else None
        ref = reference_calls_of(gold)
        out.append(float(pred is not None and ref is not None and ast_match(pred, ref, ordered=False)))
    return out


# --------------------------------------------------------------------------- the built-in task

def _tool(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props, "required": required}}


TOOLS = [
    _tool("get_weather", "Current weather of a city.",
          {"city": {"type": "string", "description": "city name"},
           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "temperature unit"}},
          ["city"]),
    _tool("convert_currency", "Convert an amount of money between currencies.",
          {"base_currency": {"type": "string", "description": "ISO code of the currency held"},
           "target_currency": {"type": "string", "description": "ISO code of the currency wanted"},
           "amount": {"type": "number", "description": "amount in the base currency"}},
          ["base_currency", "target_currency", "amount"]),
    _tool("book_hotel", "Book a hotel room.",
          {"hotel": {"type": "string", "description": "hotel name"},
           "nights": {"type": "integer", "description": "number of nights"},
           "breakfast": {"type": "boolean", "description": "breakfast included"}},
          ["hotel", "nights"]),
    _tool("get_location", "Address of a place.",
          {"place": {"type": "string", "description": "name of the place"}}, ["place"]),
]

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Dakar", "Riga"]
CURRENCIES = {"JPY": "Japanese Yen", "USD": "US Dollar", "EUR": "Euro", "GBP": "British Pound", "INR": "Indian Rupee"}
HOTELS = ["S hotel", "Blue Inn", "Grand Plaza", "Sea View", "Old Mill"]

FC_SYSTEM = ("You are an expert in composing functions. You are given a question and a set of possible functions. "
             "Based on the question, make one or more function calls to achieve the purpose.")
FC_INSTRUCTION = ("First reason inside <think> </think>: which function fits, and the value of every required "
                  "parameter taken from the question; then give the calls inside <answer> </answer> as "
                  "[func_name(param=value, ...)].")


def fc_prompt(question: str, tools: list[dict]) -> list[dict]:
    """The chat prompt: the functions as JSON, the question, the format instruction."""
    body = (f"Here is a list of functions in JSON format that you can invoke:\n{json.dumps(tools)}\n\n"
            f"Question: {question}\n{FC_INSTRUCTION}")
    return [{"role": "system", "content": FC_SYSTEM}, {"role": "user", "content": body}]


def fc_row(question: str, calls: list[dict], tools: list[dict] = TOOLS) -> dict:
    """A data row: prompt, question, tools, reference calls (dicts and Python syntax)."""
    return {"prompt": fc_prompt(question, tools), "question": question, "tools": tools,
            "gold_tool_calls": calls, "answer": format_calls(calls)}


def _example(rng: random.Random) -> tuple[str, list[dict]]:
    kind = rng.randrange(5)
    if kind == 0:
        city, unit = rng.choice(CITIES), rng.choice(["celsius", "fahrenheit"])
        return (f"What is the weather in {city} in {unit}?",
                [{"name": "get_weather", "arguments": {"city": city, "unit": unit}}])
    if kind == 1:
        a, b = rng.sample(CITIES, 2)
        return (f"What is the weather in {a} and in {b}?",
                [{"name": "get_weather", "arguments": {"city": a}}, {"name": "get_weather", "arguments": {"city": b}}])
    if kind == 2:
        base, target = rng.sample(sorted(CURRENCIES), 2)
        amount = rng.choice([5, 20, 150, 2000, 20000])
        return (f"How much will {amount} {CURRENCIES[base]} be in {CURRENCIES[target]}?",
                [{"name": "convert_currency", "arguments": {"base_currency": base, "target_currency": target,
                                                            "amount": amount}}])
    if kind == 3:
        hotel, nights = rng.choice(HOTELS), rng.randint(1, 9)
        if rng.random() < 0.5:
            return (f"Book {nights} nights at the {hotel} with breakfast.",
                    [{"name": "book_hotel", "arguments": {"hotel": hotel, "nights": nights, "breakfast": True}}])
        return (f"Book {nights} nights at the {hotel}.",
                [{"name": "book_hotel", "arguments": {"hotel": hotel, "nights": nights}}])
    place = rng.choice(HOTELS)
    if rng.random() < 0.5:
        return (f"Please help me get the location of the {place}.",
                [{"name": "get_location", "arguments": {"place": place}}])
    hotel, nights = rng.choice(HOTELS), rng.randint(1, 9)
    return (f"Where is the {place}? Also book {nights} nights at the {hotel}.",
            [{"name": "get_location", "arguments": {"place": place}},
             {"name": "book_hotel", "arguments": {"hotel": hotel, "nights": nights}}])


@TASKS.register("function_calls", needs=("text",))
def function_calls(*,
                   function_calls_n_train: int = param(300, 'function_calls: training questions'),
                   function_calls_n_eval: int = param(100, 'function_calls: held-out questions (distinct '
                                                      'from the training ones)'),
                   function_calls_seed: int = param(1234, 'function_calls: seed of the questions and the split')
                   ) -> Task:
    """Single-turn BFCL-style function calling over four tools (weather, currency conversion, hotel booking,
    location): simple, multiple-choice-of-function and parallel (two calls) questions, drawn with
    ``function_calls_seed``; duplicates are dropped so the splits share no question.

    Provenance: grpolab's own — a built-in toy task in the format of seed 000-106 (arXiv:2508.05118; the
    authors' examples in https://github.com/BingguangHao/RLFC README) for its recipe ``fc_entropy_grpo``;
    implements no published method itself.
    """
    n_train, n_eval = int(function_calls_n_train), int(function_calls_n_eval)
    if n_train < 1 or n_eval < 1:
        raise ValueError(f"function_calls_n_train / function_calls_n_eval: expected >= 1, got {n_train} / {n_eval}")
    rng = random.Random(function_calls_seed)
    seen, rows = set(), []
    for _ in range(50 * (n_train + n_eval)):
        q, calls = _example(rng)
        if q not in seen:
            seen.add(q)
            rows.append(fc_row(q, calls))
        if len(rows) == n_train + n_eval:
            break
    if len(rows) < n_train + n_eval:
        raise ValueError(f"function_calls: only {len(rows)} distinct questions exist; lower function_calls_n_train "
                         f"({n_train}) or function_calls_n_eval ({n_eval})")
    return Task("function_calls", rows[n_eval:], rows[:n_eval],
                rewards=[("accuracy", fc_single_criteria, 1.0), ("format", fc_think_format, 0.0)],
                accuracy_reward="accuracy",
                description="BFCL-style function calls (4 tools; simple, multiple, parallel): "
                            "<think>..</think><answer>[f(k=v)]</answer>, single-criteria reward",
                extra={})
