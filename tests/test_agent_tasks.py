"""The real agent tools (python, search, calculator), the generated knowledge base and the built-in agent tasks
(calculator, search_qa, gridworld)."""
import json
import re

import pytest

from grpolab.agents.knowledge import documents_needed, generate, knowledge_base, normalise
from grpolab.agents.tools import TOOL_OUTPUT_CHARS, calculator, cut, make_python_tool, make_search_tool, search
from grpolab.sandbox import Limits


# ---------------------------------------------------------------- calculator tool
@pytest.mark.parametrize("expr, expected", [
    ("123456 * 789012", str(123456 * 789012)),
    ("98765432 * 12345678 + 3", str(98765432 * 12345678 + 3)),
    ("2 ** 200", str(2 ** 200)),
    ("(1 + 2) * -3", "-9"),
    ("7 / 2", "7/2 (= 3.5)"),
    ("1 / 3", "1/3 (= 0.333333333333...)"),
    ("0.1 + 0.2", "3/10 (= 0.3)"),          # exact, not 0.30000000000000004
    ("17 // 5", "3"), ("17 % 5", "2"),
    ("6 × 7", "42"),
    ("99999999 * 99999999 * 99999999", str(99999999 ** 3)),
])
def test_calculator_is_exact(expr, expected):
    assert calculator(expr) == expected


@pytest.mark.parametrize("expr, says", [
    ("1 / 0", "division by zero"), ("2 ^ 3", "**"), ("__import__('os').system('true')", "functions"),
    ("x + 1", "unknown name 'x'"), ("1 +", "not a valid expression"), ("", "empty"),
    ("2 ** 100000", "digits"), ("1e999", "finite"), ("'a' * 3", "not a number"), ("[1, 2]", "not arithmetic"),
    ("1" * 600, "longer than"), ("(" * 240 + "1" + ")" * 240, "Error"), ("2 ** 0.5", "whole-number"),
])
def test_calculator_bad_input_is_error_text(expr, says):
    out = calculator(expr)
    assert out.startswith("Error: ") and says in out, out


def test_calculator_never_raises_on_odd_types():
    assert calculator(12) == "12"
    assert calculator(None).startswith("Error: ") and calculator({"a": 1}).startswith("Error: ")


# ---------------------------------------------------------------- python tool
@pytest.fixture(scope="module")
def py():
    return make_python_tool(Limits(cpu_s=2, memory_mb=256, wall_s=3, file_mb=1, max_output=4 * TOOL_OUTPUT_CHARS))


def test_python_captures_output_and_final_value(py):
    assert py("print(6 * 7)") == "42"
    assert py("x = 2 ** 70\nx") == str(2 ** 70)           # a final expression is shown, like a notebook cell
    assert py("import sys\nprint('to err', file=sys.stderr)") == "to err"
    assert py("y = 1") == "(no output)"
    out = py("def f():\n    return 1 / 0\nf()")
    assert "ZeroDivisionError: division by zero" in out and 'File "<code>", line 2' in out and "return 1 / 0" in out
    assert py("def f(:").startswith("  File \"<code>\"") and "SyntaxError" in py("def f(:")


def test_python_timeout_memory_network_files_give_error_text(py, tmp_path):
    out = py("import time\ntime.sleep(30)")
    assert out.startswith("Error: timeout"), out
    out = py("while True:\n    pass")
    assert out.startswith("Error:") and ("CPU limit" in out or "timeout" in out), out
    assert "MemoryError" in py("x = ' ' * (10 ** 10)")
    assert "MemoryError" in py("x = []\nwhile True:\n    x.append(' ' * 10 ** 6)") or "Error:" in py("1")
    out = py("import socket\nsocket.create_connection(('127.0.0.1', 9))")
    assert "Error" in out and ("PermissionError" in out or "OSError" in out or "refused" in out.lower()), out
    target = tmp_path / "escaped.txt"
    out = py(f"open({str(target)!r}, 'w').write('x')")
    assert "PermissionError" in out and not target.exists()
    assert py("open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())") == "ok"  # scratch is writable
    out = py("import os\nos.system('true')")
    assert "not allowed" in out


def test_python_huge_output_is_cut_and_bad_arguments_are_error_text(py):
    out = py("print('a' * 10 ** 6)")
    assert len(out) <= TOOL_OUTPUT_CHARS and "output cut" in out
    assert py(None).startswith("Error: ") and py(123).startswith("Error: ")
    assert py("print('still fine')") == "still fine"   # the worker survived everything above


def test_cut():
    assert cut("abc", 10) == "abc"
    out = cut("x" * 5000, 100)
    assert len(out) == 100 and out.endswith(f"[output cut: {5000 - out.index(chr(10))} more characters]")


# ---------------------------------------------------------------- tool schemas
def test_tools_have_schemas():
    from transformers.utils import get_json_schema
    for fn, params in [(calculator, {"expression"}), (search, {"query", "k"}), (make_python_tool(), {"code"})]:
        schema = get_json_schema(fn)["function"]
        assert set(schema["parameters"]["properties"]) == params and schema["description"]
        assert all(p["description"] for p in schema["parameters"]["properties"].values())
    assert get_json_schema(search)["function"]["parameters"]["required"] == ["query"]


# ---------------------------------------------------------------- knowledge base and search
def test_knowledge_base_is_deterministic_and_consistent():
    a, b = generate(7), generate(7)
    assert a.documents == b.documents and generate(8).documents != a.documents
    kb = knowledge_base(0)
    names = kb.names()
    assert len(set(names)) == len(names) == len(kb.documents)
    for n in names:  # no name hides inside another name (exact match and document links stay unambiguous)
        assert not any(n != m and re.search(rf"(?<!\w){re.escape(n)}(?!\w)", m) for m in names)
    for name, e in kb.entities.items():
        text = kb.doc(name)
        for rel, value in e.facts.items():
            assert str(value) in text, (name, rel)
    for c in kb.names("country"):
        assert kb.entities[kb.entities[c].facts["capital"]].facts["country"] == c


def test_normalise():
    assert normalise("The  Ravenholm.") == "ravenholm" and normalise("1,234,567") == "1234567"
    assert normalise("an Architect!") == "architect" and normalise("Mifal Industries") == "mifal industries"


def test_documents_needed_on_a_hand_written_corpus():
    docs = [("Ann", "Ann was born in Oslo."), ("Oslo", "Oslo is in Norway."), ("Norway", "Norway speaks Norsk."),
            ("Bob", "Bob was born in Oslo in 1950.")]
    names = ["Ann", "Oslo", "Norway", "Bob"]
    assert documents_needed(docs, names, "Ann", "Oslo") == 1
    assert documents_needed(docs, names, "Ann", "Norway") == 2
    assert documents_needed(docs, names, "Ann", "Norsk") == 3
    assert documents_needed(docs, names, "Ann", "1950") == 2      # through Oslo, then Bob's document
    assert documents_needed(docs, names, "Ann", "Sweden") is None


def test_search_finds_the_entity_document_and_handles_bad_input():
    kb = knowledge_base(0)
    for name in kb.names()[:40]:
        first = search(name, k=1)
        assert first.startswith(f"[1] {name}: "), (name, first)
    out = search("pilot born", k=5)
    assert out.count("\n") == 4
    assert search("").startswith("Error: ") and search("the of and").startswith("No entry")
    assert search("x", k=0).startswith("Error: ") and search("x", k="many").startswith("Error: ")
    assert search(None).startswith("Error: ") and search("pilot", k=[1]).startswith("Error: ")
    assert search("pilot", k="2").count("\n") == 1
    own = make_search_tool([("Doc A", "apples and pears"), ("Doc B", "bananas")])
    assert own("bananas") == "[1] Doc B: bananas"


# ---------------------------------------------------------------- the built-in agent tasks
from grpolab.agents.base import AgentEnv, StepResult  # noqa: E402
from grpolab.registry import TASKS  # noqa: E402
from grpolab.tasks import get_task  # noqa: E402
from grpolab.config import Config  # noqa: E402
from grpolab.tasks.agent_tasks import COST_PENALTY, GOAL_REWARD, parse_action  # noqa: E402

AGENT_TASKS = ["calculator", "search_qa", "gridworld"]


@pytest.fixture(scope="module")
def tasks():
    return {name: get_task(name) for name in AGENT_TASKS}


@pytest.mark.parametrize("name", AGENT_TASKS)
def test_agent_task_is_registered_deterministic_and_disjoint(name, tasks):
    assert name in TASKS.names()
    a, b = tasks[name], get_task(name)
    assert a.train_rows == b.train_rows and a.eval_rows == b.eval_rows     # same seed, same rows
    assert a.train_rows and a.eval_rows and a.accuracy_reward in [r[0] for r in a.rewards]
    assert set(a.extra) <= {"environment", "lenient_accuracy"}   # any other extra would be taken for an eval reward
    train_q = {r["question"] for r in a.train_rows}
    assert len(train_q) == len(a.train_rows) and not train_q & {r["question"] for r in a.eval_rows}
    for row in a.train_rows[:5] + a.eval_rows[:5]:
        env = a.extra["environment"](row)
        assert isinstance(env, AgentEnv) and isinstance(env.reset(row, seed=0), str)
        assert env is not a.extra["environment"](row)                       # a fresh environment per episode
        assert all(isinstance(m["content"], str) for m in row["prompt"]) and row["prompt"][-1]["role"] == "user"


def test_other_seeds_give_other_rows():
    assert get_task("calculator", seed=1).eval_rows != get_task("calculator").eval_rows
    assert get_task("gridworld", seed=1).eval_rows != get_task("gridworld").eval_rows
    assert get_task("search_qa", seed=1).eval_rows != get_task("search_qa").eval_rows


def _scores(task, completions, rows, **kw):
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    return {name: fn(prompts=[r["prompt"] for r in rows], completions=completions, **{**cols, **kw})
            for name, fn, _ in task.rewards}


def test_calculator_rows_rewards_and_environment(tasks):
    task = tasks["calculator"]
    for row in task.train_rows[:50]:                       # the answer is the expression's value
        a, b = (int(x) for x in row["question"].split()[0:3:2])
        rest = row["question"].split()[3:]
        value = a * b + (int(rest[1]) if rest and rest[0] == "+" else -int(rest[1]) if rest else 0)
        assert row["answer"] == str(value) and 5 <= len(str(a)) <= 8 and 5 <= len(str(b)) <= 8
    rows = task.eval_rows[:3]
    right = [f"The tool says {r['answer']}.\nAnswer: {r['answer']}" for r in rows]
    wrong = [f"Answer: {int(rows[0]['answer']) + 1}", "Answer: about a billion", f"{rows[2]['answer']}"]
    assert _scores(task, right, rows)["accuracy"] == [1.0, 1.0, 1.0]
    assert _scores(task, wrong, rows)["accuracy"] == [0.0, 0.0, 0.0]
    row = rows[0]
    env = task.extra["environment"](row)
    env.reset(row, seed=0)
    assert [f.__name__ for f in env.tools] == ["calculator"]
    expr = row["question"]
    res = env.step(f'I will use the tool. <tool_call>{{"name": "calculator", "arguments": {{"expression": '
                   f'"{expr}"}}}}</tool_call>')
    assert isinstance(res, StepResult) and not res.done and res.observation == row["answer"]
    assert res.info["tool_calls"][0].name == "calculator"
    # the rollout stops at the stop string and may leave it out: an unterminated final call still runs
    assert env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}').observation == "42"
    assert env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
                    ).observation == "Error: division by zero"
    bad = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "1"</tool_call>')
    assert bad.observation.startswith("Error: ") and "JSON" in bad.observation and not bad.done
    assert env.step('<tool_call>{"name": "python", "arguments": {}}</tool_call>').observation.startswith(
        "Error: unknown tool 'python'")
    assert "bad arguments" in env.step('<tool_call>{"name": "calculator", "arguments": {"x": 1}}</tool_call>'
                                       ).observation
    final = env.step(f"Answer: {row['answer']}")
    assert final.done and final.reward is None


def test_search_qa_rewards_normalise_the_answer(tasks):
    task = tasks["search_qa"]
    rows = task.eval_rows[:4]
    right = [f"I searched.\nAnswer: the {r['answer'].upper()}." for r in rows]
    assert _scores(task, right, rows)["accuracy"] == [1.0] * 4
    wrong = [f"Answer: {rows[1]['answer']}", "no answer here", f"Answer: {rows[2]['answer']} and more", ""]
    assert _scores(task, wrong, rows)["accuracy"] == [0.0] * 4
    assert _scores(task, right + ["x"], rows + rows[:1])["format"] == [1.0] * 4 + [0.0]


def test_search_qa_lenient_accuracy_ignores_the_format_but_not_the_answer(tasks):
    lenient = tasks["search_qa"].extra["lenient_accuracy"]
    a = "Lunquinvia"
    cases = {f"Answer: {a}": 1.0, f"Answer: {a}, a city in Oster.": 1.0, f"{a}": 1.0, f"the {a.lower()}!": 1.0,
             f"Answer: {a}\nMore text after the answer line.": 1.0,
             f"Answer: Mardri Ethsilbel is a surgeon born in the city of {a}.": 0.0,   # a copied entry
             f"Answer: {a}x": 0.0, "Answer: Oster": 0.0, "": 0.0}
    got = lenient(completions=list(cases), answer=[a] * len(cases))
    assert got == list(cases.values())


def test_search_qa_splits_by_entity_and_mixes_hops(tasks):
    task = tasks["search_qa"]
    assert not {r["entity"] for r in task.train_rows} & {r["entity"] for r in task.eval_rows}
    for split in (task.train_rows, task.eval_rows):
        kinds = {(r["hops"], r["searches_needed"]) for r in split}
        assert kinds == {(1, 0), (1, 1), (2, 2), (3, 3)}, kinds
    for r in task.train_rows:
        user = r["prompt"][-1]["content"]
        if r["searches_needed"] == 0:      # the entry in the prompt holds the answer: no search needed
            assert r["answer"] in user and r["entity"] in user
        else:
            assert r["answer"] not in user


def test_search_qa_hops_keeps_only_those_chains_in_the_full_tasks_order(tasks):
    full = tasks["search_qa"]
    one = get_task("search_qa", search_qa_hops=[1])
    assert {r["hops"] for r in one.train_rows + one.eval_rows} == {1}
    # the same rows as the full task's one-hop rows, in the same order, with the same prompts
    assert one.train_rows == [r for r in full.train_rows if r["hops"] == 1]
    assert one.eval_rows[:10] == [r for r in full.eval_rows if r["hops"] == 1][:10]
    assert {r["hops"] for r in get_task("search_qa", search_qa_hops=[2, 3]).eval_rows} == {2, 3}
    assert get_task("search_qa", cfg=Config.build({"task": "search_qa", "search_qa_hops": "1"})).eval_rows == \
        one.eval_rows                                        # the command line's "--search_qa_hops 1"
    for bad in ([], [4], ["x"]):
        with pytest.raises(ValueError, match="search_qa_hops"):
            get_task("search_qa", search_qa_hops=bad)


def _independent_docs_needed(documents, names, start, answer):
    """Fewest documents linking start to answer through shared names (written here, apart from grpolab's)."""
    frontier, known, used = {start}, {start}, 0
    while frontier and used < 6:
        used += 1
        reachable = [text for _, text in documents if any(re.search(rf"\b{re.escape(n)}\b", text) for n in frontier)]
        if any(re.search(rf"\b{re.escape(answer)}\b", t) for t in reachable):
            return used
        new = {n for t in reachable for n in names if re.search(rf"\b{re.escape(n)}\b", t)} - known
        known |= new
        frontier = known
    return None


def test_search_qa_multi_hop_questions_need_several_searches(tasks):
    task = tasks["search_qa"]
    kb = generate(0)
    names = kb.names()
    env = task.extra["environment"](task.eval_rows[0])
    (tool,) = env.tools
    checked = {1: 0, 2: 0, 3: 0}
    for r in task.eval_rows:
        if checked[r["hops"]] >= 8:
            continue
        checked[r["hops"]] += 1
        # no set of fewer documents than relations links the question's entity to the answer
        assert _independent_docs_needed(kb.documents, names, r["entity"], r["answer"]) == r["hops"], r
        # a scripted agent that searches each entity of the chain gets there in exactly `hops` searches
        query, seen = r["entity"], []
        for step, nxt in enumerate(r["path"]):
            env.reset(r, seed=0)
            out = env.step(f'<tool_call>{{"name": "search", "arguments": {{"query": "{query}", "k": 1}}}}'
                           f'</tool_call>').observation
            assert out.startswith(f"[1] {query}: ") and nxt in out
            seen.append(out)
            query = nxt
        assert r["answer"] in seen[-1] and (r["hops"] == 1 or r["answer"] not in seen[0])
    assert min(checked.values()) == 8
    assert tool.__name__ == "search"


def test_gridworld_environment_answers_scripted_actions(tasks):
    task = tasks["gridworld"]
    row = {**task.train_rows[0], "start": [0, 0], "key": [1, 2], "size": 3, "max_steps": 10}
    env = task.extra["environment"](row)
    assert env.tools == [] and env.reset(row, seed=3) == ""
    s0 = env.state_key()
    res = env.step("I should ask first.\nAction: ask")
    assert "1 room south and 2 rooms east" in res.observation and not res.done
    assert res.info["costs"] == {"attention": 2.0} and res.info["cost"] == 2.0
    assert res.reward == pytest.approx(-COST_PENALTY * 2.0) and env.state_key() == s0   # asking does not move
    res = env.step("Action: move north")
    assert "wall to the north" in res.observation and env.state_key() == s0 and res.info["costs"] == {"time": 1.0}
    res = env.step("dance!")
    assert res.info["invalid"] and res.info["action"] is None and res.info["cost"] == 1.0 and env.state_key() == s0
    rewards = [env.step(f"Action: move {m}").reward for m in ("east", "south")]
    assert rewards == [pytest.approx(-COST_PENALTY)] * 2 and env.state_key() != s0
    res = env.step("Action: move east")
    assert res.done and res.info["success"] and "found the key" in res.observation
    assert res.reward == pytest.approx(GOAL_REWARD - COST_PENALTY) and res.info["total_cost"] == 7.0
    assert res.info["total_costs"] == {"time": 5.0, "attention": 2.0}
    assert res.info["position"] == [1, 2]
    # reward from the episode records the rollout writes
    eps = [{"info": res.info}, {"info": {"success": False}}, {"info": {}}]
    assert _scores(task, ["", "", ""], [row] * 3, episode=eps)["success"] == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="agent rollout"):
        _scores(task, [""], [row])


def test_gridworld_states_recur_across_episodes_and_time_runs_out(tasks):
    task = tasks["gridworld"]
    row = {**task.eval_rows[0], "start": [1, 1], "key": [0, 0], "size": 3, "max_steps": 4}
    a, b = task.extra["environment"](row), task.extra["environment"](row)
    a.reset(row, seed=0)
    b.reset(row, seed=1)
    keys_a = [a.state_key()] + [(a.step(f"Action: move {m}"), a.state_key())[1] for m in ("east", "west")]
    keys_b = [b.state_key()] + [(b.step("Action: move south"), b.state_key())[1]]
    assert keys_a[0] == keys_a[2] == keys_b[0] and keys_a[1] != keys_b[1]   # the start room recurs
    res = [a.step("Action: move south") for _ in range(2)]
    assert res[-1].done and not res[-1].info["success"] and "out of time" in res[-1].observation


@pytest.mark.parametrize("text, action", [
    ("Action: move north", "north"), ("go West", "west"), ("I think east or south. Action: south", "south"),
    ("ask", "ask"), ("Action: ask", "ask"), ("northern lights", None), ("", None),
])
def test_parse_action(text, action):
    assert parse_action(text) == action


def test_worked_examples_in_the_prompts(tasks):
    from grpolab.tasks.agent_tasks import CALC_DEMO, SEARCH_DEMO
    row = tasks["calculator"].eval_rows[0]
    assert row["prompt"][1:-1] == CALC_DEMO and [m["role"] for m in CALC_DEMO] == ["user", "assistant", "tool",
                                                                                     "assistant"]
    assert CALC_DEMO[2]["content"] == f"<tool_response>\n{calculator('123456 * 654321 + 999')}\n</tool_response>"
    assert calculator("123456 * 654321 + 999") == "80779854375"
    assert CALC_DEMO[3]["content"] == "Answer: 80779854375"
    assert [m["role"] for m in get_task("calculator", demo=False).eval_rows[0]["prompt"]] == ["system", "user"]
    row = tasks["search_qa"].eval_rows[0]
    assert row["prompt"][1:-1] == SEARCH_DEMO
    assert [m["role"] for m in get_task("search_qa", demo=False).eval_rows[0]["prompt"]] == ["system", "user"]
    names = set(generate(0).names())
    assert not names & {"Anna Pold", "Brenn", "Oster", "Quill Works"}   # the example's world is not the task's


# ---------------------------------------------------------------- end to end: the agent rollout on these tasks
from grpolab.agents import rollout as agent_rollout  # noqa: E402
from _helpers import teacher_forced_turns  # noqa: E402


def _train_cli(task, out, *extra):
    from grpolab.cli import main
    return main(["train", "--model", "tiny", "--task", task, "--steps", "2", "--prompts_per_step", "1",
                 "--num_generations", "2", "--max_completion_length", "8", "--max_prompt_length", "4096",
                 "--max_turns", "2", "--max_episode_tokens", "160", "--eval_before", "false", "--tensorboard",
                 "false", "--out", str(out), "--quiet", *extra])


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("task", AGENT_TASKS)
def test_grpolab_train_on_each_agent_task(task, tmp_path):
    """`grpolab train --task X` alone selects the agent rollout (the task brings its environment) and runs; the
    tiny model gets a long context for these tasks' long texts (grpolab.model.loading.build_tiny)."""
    extra = ("--eval_after", "true", "--eval_problems", "2") if task == "gridworld" else ("--eval_after", "false")
    assert _train_cli(task, tmp_path / task, *extra) == 0
    m = _metrics(tmp_path / task)
    assert len(m) == 2 and all(x["loss"] is not None for x in m)
    assert m[-1]["rollout/agent/turns_per_episode"] >= 1
    if task != "gridworld":
        assert f"rollout/agent/tool_calls/{'calculator' if task == 'calculator' else 'search'}" in m[-1]
    else:
        assert "rewards/env_reward/mean" in m[-1] and m[-1]["rollout/agent/env_reward_mean"] < 0  # actions cost
    cfg = (tmp_path / task / "config.yaml").read_text()
    assert "rollout_strategy: agent" in cfg


def test_an_agent_task_with_a_strategy_that_runs_no_environment_is_an_error(tmp_path, capsys):
    from grpolab.cli import main
    assert main(["config", "rollout_strategy", "--task", "gridworld"]) == 0
    assert capsys.readouterr().out.startswith("rollout_strategy: 'agent'")
    assert main(["config", "rollout_strategy", "--task", "gridworld", "--rollout_strategy", "plain"]) == 2
    assert "rollout_strategy: agent" in capsys.readouterr().err


def oracle(task):
    """A tokenizer-free scripted policy that solves ``task`` by reading its context: calculator (one call, then
    the answer), search_qa (one search per entity of the question's chain, then the answer). Its tokens get
    the policy's teacher-forced log-probs, so the batch is what a sampler drawing them would produce."""
    by_question = {r["question"]: r for r in task.train_rows + task.eval_rows}

    def answer_text(context: str) -> str:
        row = next(r for q, r in by_question.items() if q in context.rsplit("Anna Pold", 1)[-1]
                   or q in context.rsplit("123456 * 654321", 1)[-1])
        done = context.count("<tool_response>") - row["prompt_responses"]
        if task.name == "calculator":
            return (f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{row["question"]}"}}}}'
                    f'</tool_call>' if done == 0 else f"Answer: {row['answer']}")
        chain = [row["entity"]] + row["path"][:-1]
        if row["searches_needed"] == 0 or done >= len(chain):
            return f"Answer: {row['answer']}"
        return f'<tool_call>{{"name": "search", "arguments": {{"query": "{chain[done]}", "k": 1}}}}</tool_call>'

    def sample(ctx, contexts, max_new_tokens, temperatures, stop_strings, model=None):
        turns = [ctx.tokenizer(answer_text(ctx.tokenizer.decode(c)), add_special_tokens=False)["input_ids"]
                 for c in contexts]
        return teacher_forced_turns(ctx, contexts, turns, temperatures)
    return sample


@pytest.mark.parametrize("name", ["calculator", "search_qa"])
def test_a_scripted_agent_solves_the_tool_tasks_through_the_rollout(name, tmp_path, monkeypatch,
                                                                   tiny_args):
    from grpolab.config import Config
    from grpolab.train.trainer import Trainer
    task = get_task(name)
    for r in task.train_rows + task.eval_rows:   # <tool_response> tags already in the prompt (the worked example)
        r["prompt_responses"] = sum(m["content"].count("<tool_response>") for m in r["prompt"])
    monkeypatch.setattr(agent_rollout, "sample_turns", oracle(task))
    args = {**tiny_args, "task": name, "rollout_strategy": "agent", "out": str(tmp_path / name), "steps": 1, "prompts_per_step": 4,
            "num_generations": 2, "max_prompt_length": 4096, "max_completion_length": 200, "max_turns": 5,
            "max_episode_tokens": 2000}
    tr = Trainer(Config.build(args), log=lambda *a: None)
    rows = [r for r in task.train_rows if name == "calculator" or r["hops"] == 3][:1] + \
        [r for r in task.train_rows if name == "calculator" or r["searches_needed"] == 0][:1]
    tr.ctx.new_step()
    batch = tr.strategy(ctx=tr.ctx, rows=rows, uids=[0, 1], group_offset=0, budgets=None, temperatures=None)
    eps = batch.columns["episode"]
    assert [e["ended_by"] for e in eps] == ["done"] * 4 and all(e["tool_errors"] == 0 for e in eps)
    calls = [sum(len(t["tool_calls"]) for t in e["turns"]) for e in eps]
    if name == "calculator":
        assert calls == [1, 1, 1, 1]
    else:
        assert calls == [3, 3, 0, 0]       # a 3-hop question takes three searches, one with its entry in the prompt none
    finals = batch.columns["completion"]
    texts = [f if isinstance(f, str) else f[-1]["content"] for f in finals]
    assert texts == [f"Answer: {rows[0]['answer']}"] * 2 + [f"Answer: {rows[1]['answer']}"] * 2
    assert batch.rewards[:, batch.reward_names.index("accuracy")].tolist() == [1.0] * 4
    assert tr.ctx.metrics["agent/tool_errors"] == 0
