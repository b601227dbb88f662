"""Agent rewards (src/grpolab/rewards/agentic.py): hand-computed values on hand-built episode records, relations,
errors, the recipes and end-to-end smoke runs.

Expected values are written here from the papers' / authors' formulas (OTC's cos / sin tool reward, CaRR's
authors' BFS from E0 and the (1 - rho) outcome + rho rubric mix) or from the documented reconstructions, never by
calling grpolab's own helpers.
"""
import math
from types import SimpleNamespace

import pytest
import torch

from _helpers import close, tr
from grpolab.config import Config
from grpolab.registry import REWARD_SPECS
from grpolab.rewards.scoring import RewardScorer, parse_reward_spec


# ----------------------------------------------------------------------------- hand-built episodes

def call(name, output="", **arguments):
    return {"name": name, "arguments": arguments, "output": output, "error": None, "timed_out": False}


def bad_call(name):
    return {"name": name, "arguments": None, "output": "", "error": "not JSON", "timed_out": False}


def turn(text="", calls=(), info=None, span=1, **extra):
    t = {"span": span, "text": text, "tool_calls": list(calls), "observation": None, "obs_span": None,
         "reward": None, "state": None, "done": False, **extra}
    if info is not None:
        t["info"] = info
    return t


def episode(*turns, ended_by="done"):
    return {"turns": list(turns), "ended_by": ended_by, "env_reward": 0.0, "tool_errors": 0, "tool_timeouts": 0,
            "info": {}, "num_turns": len(turns)}


def with_calls(n, name="search", final="Answer: x"):
    """An episode of ``n`` calls to ``name`` (one per turn) and a final answer turn."""
    return episode(*[turn("", [call(name, "out", query=f"q{k}")]) for k in range(n)], turn(final))


def batch(eps, **columns):
    return SimpleNamespace(columns={"episode": eps, "completion": [""] * len(eps), **columns})


def spec(name, **opts):
    cfg = Config.build({"model": "tiny", "reward": [name], **opts})
    return parse_reward_spec(name, cfg)


# ----------------------------------------------------------------------------- OTC (000-68)

def test_otc_tool_reward_hand_computed():
    """OTC-GRPO: n = fewest calls among the group's correct episodes; r' = alpha * r_tool * r with
    f(m, n) = 2nm / (m + n), r_tool = sin(f pi / 2n) (n > 0), cos(m pi / (2m + c)) (n = 0)."""
    m = [0, 1, 2, 3, 0, 2, 1, 3]
    acc = [0, 1, 1, 0, 1, 1, 0, 0]
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    rewards = torch.tensor([a + 0.5 for a in acc], dtype=torch.float64)  # accuracy + a 0.5 format reward
    b = batch([with_calls(k) for k in m])
    out = tr("otc_tool_reward", rewards=rewards, group_ids=gid, reward_matrix=torch.tensor(acc)[:, None].double(),
             reward_names=["accuracy"], batch=b)
    # group 0: correct rows use 1 and 2 calls -> n = 1
    #   m=0: f=0 -> sin 0 = 0; m=1: f=1 -> sin(pi/2)=1; m=2: f=4/3 -> sin(2pi/3); m=3: f=3/2 -> sin(3pi/4)
    # group 1: a correct row used 0 calls -> n = 0: m=0 -> 1, m=2 -> cos(2pi/5)
    # group 2: no correct row -> unchanged
    want = [0.5 * 0.0, 1.5 * 1.0, 1.5 * math.sin(2 * math.pi / 3), 0.5 * math.sin(3 * math.pi / 4),
            1.5 * 1.0, 1.5 * math.cos(2 * math.pi / 5), 0.5, 0.5]
    assert close(out, want)
    # OTC-PPO: cos(m pi / (2m + c)) for every row, here c = 2 and alpha = 2
    out = tr("otc_tool_reward", rewards=rewards, group_ids=gid, reward_matrix=torch.tensor(acc)[:, None].double(),
             reward_names=["accuracy"], batch=b, otc_variant="ppo", otc_c=2.0, otc_alpha=2.0)
    assert close(out, [2 * r * math.cos(k * math.pi / (2 * k + 2)) for r, k in zip(rewards.tolist(), m)])


def test_otc_relations_and_tool_filter():
    # at the optimum the tool term is 1 and it falls on both sides of it (n = 2: the 1-call row is wrong)
    acc = torch.tensor([[1.0], [0.0], [1.0], [1.0], [1.0]])
    b = batch([with_calls(k) for k in (2, 1, 3, 4, 2)])
    out = tr("otc_tool_reward", rewards=torch.ones(5, dtype=torch.float64), group_ids=torch.zeros(5),
             reward_matrix=acc, reward_names=["accuracy"], batch=b)
    assert out[0] == pytest.approx(1.0) and out[4] == pytest.approx(1.0)
    assert out[1] < 1 and out[2] < 1 and out[3] < out[2]
    # otc_tools counts only the named tools: calculator calls are free
    b = batch([episode(turn("", [call("calculator", expression="1+1")]), turn("Answer: 2")), with_calls(1)])
    out = tr("otc_tool_reward", rewards=torch.ones(2, dtype=torch.float64), group_ids=torch.zeros(2),
             reward_matrix=torch.ones(2, 1), reward_names=["accuracy"], batch=b, otc_tools="search")
    assert close(out, [1.0, math.cos(math.pi / 3)])  # n = 0 (the calculator row), m = 1 search -> cos(pi/3)
    # NaN stays NaN; a single-turn batch is refused with the fix
    out = tr("otc_tool_reward", rewards=torch.tensor([float("nan")], dtype=torch.float64),
             group_ids=torch.zeros(1), reward_matrix=torch.ones(1, 1), reward_names=["accuracy"],
             batch=batch([with_calls(1)]))
    assert torch.isnan(out).all()
    # a single correct row sets n alone (n = 5): the wrong 2-call row gets sin(f(2, 5) pi / 10), f = 20/7
    out = tr("otc_tool_reward", rewards=torch.ones(2, dtype=torch.float64), group_ids=torch.zeros(2),
             reward_matrix=torch.tensor([[0.0], [1.0]]), reward_names=["accuracy"],
             batch=batch([with_calls(2), with_calls(5)]))
    assert close(out, [math.sin((20 / 7) * math.pi / 10), 1.0])
    with pytest.raises(ValueError, match="rollout_strategy: agent"):
        tr("otc_tool_reward", rewards=torch.ones(1), group_ids=torch.zeros(1), reward_matrix=torch.ones(1, 1),
           reward_names=["accuracy"], batch=SimpleNamespace(columns={"completion": ["x"]}))


# ----------------------------------------------------------------------------- SEM (000-71)

def test_sem_search_reward_hand_computed():
    # group 0: (correct, searched) = (1,0) (1,1) (0,0) (0,1): a correct answer without search exists -> not needed
    # group 1: (1,1) (0,0): no direct correct answer -> needed
    eps = [with_calls(0), with_calls(1), with_calls(0), with_calls(2), with_calls(1), with_calls(0)]
    acc = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])[:, None]
    gid = torch.tensor([0, 0, 0, 0, 1, 1])
    r = acc[:, 0].double()
    out = tr("sem_search_reward", rewards=r, group_ids=gid, reward_matrix=acc, reward_names=["accuracy"],
             batch=batch(eps), sem_missing_penalty=0.25)
    assert close(out, [1.0, 1.0 - 0.5, 0.0, 0.0, 1.0, 0.0 - 0.25])
    # from a data column instead: row 0 and 1 need search, the others do not
    out = tr("sem_search_reward", rewards=r, group_ids=gid, reward_matrix=acc, reward_names=["accuracy"],
             batch=batch(eps, needs=[True, True, False, False, False, True]), sem_need_column="needs",
             sem_unnecessary_penalty=0.3, sem_missing_penalty=0.25)
    assert close(out, [1.0, 1.0, 0.0, 0.0, 1.0 - 0.3, 0.0 - 0.25])
    with pytest.raises(ValueError, match="sem_need_column"):
        tr("sem_search_reward", rewards=r, group_ids=gid, reward_matrix=acc, reward_names=["accuracy"],
           batch=batch(eps), sem_need_column="nope")


# ----------------------------------------------------------------------------- GraphRAG-R1 (000-63)

def test_graphrag_r1_phases_hand_computed():
    eps = [episode(turn("Answer: the Paris")),
           episode(turn("", [call("search", "o", query="a"), call("calculator", "2", expression="1+1")]),
                   turn("Answer: Paris France")),
           episode(turn("", [call("search", "o", query="a")]), turn("", [call("search", "o", query="b")]),
                   turn("", [call("search", "o", query="c")]), turn("I do not know"))]
    b = batch(eps, answer=["Paris", "Paris", "Paris"])
    r = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    kw = dict(graphrag_pra_start=10, graphrag_caf_start=20, graphrag_pra_gamma=0.5, graphrag_pra_weight=0.5,
              graphrag_caf_lambda=0.1, graphrag_caf_weight=1.0)
    # phase 1 (cold start): the task reward unchanged
    assert close(tr("graphrag_r1_phases", rewards=r, batch=b, step=9, **kw), r)
    # phase 2: + 0.5 * (1 - 0.5^n), n = search calls (the calculator call does not count): n = 0, 1, 3
    assert close(tr("graphrag_r1_phases", rewards=r, batch=b, step=10, **kw),
                 [1.0, 0.5 + 0.5 * 0.5, 0.0 + 0.5 * 0.875])
    # phase 3: + F1 * exp(-0.1 n); F1("the Paris", "Paris") = 1, F1("Paris France", "Paris") = 2/3, no answer -> 0
    assert close(tr("graphrag_r1_phases", rewards=r, batch=b, step=25, **kw),
                 [1.0 + 1.0, 0.5 + (2 / 3) * math.exp(-0.1), 0.0 + 0.0])
    with pytest.raises(ValueError, match="graphrag_caf_start"):
        tr("graphrag_r1_phases", rewards=r, batch=b, step=1, graphrag_pra_start=5, graphrag_caf_start=2)


# ----------------------------------------------------------------------------- CaRR (000-96)

RUBRICS = ["<E1> was born in <E2>", "<E2> is a city of <E0>", "<E3> wrote <E4>"]
ENTITIES = {"E1": "Alice Smith", "E2": "Lyon", "E3": "Bob", "E4": "Dune"}


def carr_episode(final, ended_by="done"):
    return episode(turn("", [call("search", "Alice Smith was born in Lyon.", query="alice")]),
                   turn("", [call("search", "Lyon is a city in France.", query="lyon")]),
                   turn("", [call("search", "Bob wrote Dune in 1965.", query="bob")]),
                   turn(final), ended_by=ended_by)


def test_carr_hand_computed():
    """Authors' algorithm: a rubric counts when its entities are identified, it is supported by the cited
    content, and it is reachable from E0 over supported rubrics sharing an entity; R = 0.7 outcome + 0.3 rubric."""
    final = "Alice Smith was born in Lyon [1], a city of France [2]. Bob wrote Dune [3].\nAnswer: France"
    fn = spec("carr").fn
    cols = dict(answer=["France"] * 6, rubrics=[RUBRICS] * 6, rubric_entities=[ENTITIES] * 6)
    eps = [carr_episode(final),                                   # rubrics 0, 1 connected; 2 supported, disconnected
           carr_episode(final.replace(" [2]", "")),               # Lyon-France not cited: rubric 1 unsupported
           carr_episode(final.replace("Answer: France", "Answer: Spain")),
           carr_episode(final, ended_by="max_turns"),             # unfinished: 0
           carr_episode("Lyon, France.\nAnswer: France"),          # no citation: no cited content
           carr_episode(final.replace("Alice Smith", "Alice"))]   # E1 not identified: rubric 0 out
    out = fn(prompts=[""] * 6, completions=[""] * 6, episode=eps, **cols)
    # row 1: rubric 1 unsupported -> E0 reaches nothing -> rubric 0; row 2: outcome 0, the chain still counts
    # row 5: only rubric 1 connected -> 1/3
    want = [0.7 + 0.3 * 2 / 3, 0.7 + 0.0, 0.0 + 0.3 * 2 / 3, 0.0, 0.7 + 0.0, 0.7 + 0.3 * 1 / 3]
    assert close(out, want)
    # every tool output counts as cited: row 4 now has support for rubric 1 only (its text names Lyon and France)
    fn = spec("carr", carr_require_citation=False, carr_rubric_ratio=0.5).fn
    out = fn(prompts=[""], completions=[""], episode=[eps[4]], **{k: v[:1] for k, v in cols.items()})
    assert close(out, [0.5 * 1 + 0.5 * 1 / 3])
    with pytest.raises(ValueError, match="carr_rubrics_column"):
        spec("carr").fn(prompts=[""], completions=[""], episode=eps[:1], answer=["France"])
    with pytest.raises(ValueError, match="carr_entities_column"):  # rubrics with hidden entities need their values
        spec("carr").fn(prompts=[""], completions=[""], episode=eps[:1], answer=["France"], rubrics=[RUBRICS])


def test_carr_chain_rubrics_from_search_qa_columns():
    """search_qa's chain Mira -works_for-> Acme -headquarters-> Lyon: rubrics "Mira works for <E1>" and
    "<E1> headquarters <E0>", E1 = Acme, E0 = Lyon (the answer)."""
    cols = dict(answer=["Lyon"] * 3, entity=["Mira"] * 3, relations=[["works_for", "headquarters"]] * 3,
                path=[["Acme", "Lyon"]] * 3)

    def ep(final, outputs):
        return episode(*[turn("", [call("search", o, query="q")]) for o in outputs], turn(final))

    eps = [ep("Mira works for Acme, based in Lyon.\nAnswer: Lyon", ["Mira works for Acme.", "Acme is in Lyon."]),
           ep("Answer: Lyon", ["Mira works for Acme.", "Acme is in Lyon."]),             # Acme not named: 1/2
           ep("Mira works for Acme.\nAnswer: Paris", ["Mira works for Acme."])]          # no Lyon support: 0
    out = spec("carr", carr_rubric_source="chain", carr_require_citation=False).fn(
        prompts=[""] * 3, completions=[""] * 3, episode=eps, **cols)
    # row 1: rubric 0 needs E1 (Acme) identified; rubric 1 too -> neither counts -> 0
    assert close(out, [0.7 + 0.3 * 1.0, 0.7 + 0.0, 0.0 + 0.0])


# ----------------------------------------------------------------------------- HC-GRPO (000-58)

def test_hc_cost_hand_computed():
    ep = episode(turn("go", info={"cost": {"navigate": 2.0}}),
                 turn("", [call("ask", "a yes")], info={"cost": 1.0}),
                 turn("done", cost=0.5))
    fn = spec("hc_cost", hc_cost_weights="navigate=0.5,ask=2", hc_tool_costs="ask=3", hc_cost_scale=2.0).fn
    # 0.5 * 2 (navigate) + 1 * 1 (step) + 2 * 3 (ask call) + 1 * 0.5 (step) = 8.5, / 2
    assert close(fn(prompts=[""], completions=[""], episode=[ep]), [-8.5 / 2])
    assert fn(prompts=[""], completions=[""], episode=[episode()]) == [-0.0]  # no step, no cost
    # gridworld-style: the rollout keeps the last step's info, with the cumulative total_cost
    ep = episode(turn("move east"), turn("ask"))
    ep["info"] = {"cost": 2.0, "costs": {"attention": 2.0}, "total_cost": 3.0}
    assert spec("hc_cost", hc_cost_weights="total=0.5").fn(prompts=[""], completions=[""], episode=[ep]) == [-1.5]
    ep["info"]["total_costs"] = {"time": 1.0, "attention": 2.0}
    assert spec("hc_cost", hc_cost_weights="attention=2").fn(prompts=[""], completions=[""], episode=[ep]) == [-5.0]
    with pytest.raises(ValueError, match="'cost'"):
        spec("hc_cost").fn(prompts=[""], completions=[""], episode=[episode(turn("x"))])
    with pytest.raises(ValueError, match="hc_cost_weights"):
        spec("hc_cost", hc_cost_weights="navigate")


# ----------------------------------------------------------------------------- tool calls (000-103, 000-106)

GOLD = [{"name": "calculator", "arguments": {"expression": "12*7"}}, {"name": "search", "arguments": {"query": "X"}}]


def test_tool_call_accuracy_hand_computed():
    fn = spec("tool_call_accuracy").fn
    eps = [episode(turn("", [call("calculator", expression=" 12*7 ")])),                      # 1 of 2: F1 2/3
           episode(turn("", [call("search", query="x"), call("calculator", expression="12*7")])),  # all: 1
           episode(turn("", [call("calculator", expression="12*8"), call("search", query="x"),
                             call("search", query="x")])),                                    # 1 hit of 3/2
           episode(turn("Answer: 84")),                                                       # no call: 0
           episode(turn("", [bad_call("calculator")]))]                                        # unparsed: 0
    gold = [GOLD] * 5
    out = fn(prompts=[""] * 5, completions=[""] * 5, episode=eps, gold_tool_calls=gold)
    assert close(out, [2 / 3, 1.0, 2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2), 0.0, 0.0])
    # name only: row 2 has calculator + search (+ an extra search): P = 2/3, R = 1 -> 0.8
    out = spec("tool_call_accuracy", tca_match="name").fn(prompts=[""] * 5, completions=[""] * 5, episode=eps,
                                                          gold_tool_calls=gold)
    assert close(out, [2 / 3, 1.0, 0.8, 0.0, 2 / 3])
    # no call needed and none made: 1; JSON text column accepted
    assert fn(prompts=[""], completions=[""], episode=[episode(turn("hi"))], gold_tool_calls=["[]"]) == [1.0]


def test_fc_ast_hand_computed():
    fn = spec("fc_ast").fn
    eps = [episode(turn("", [call("search", query="x"), call("calculator", expression="12*7")])),  # any order: 1
           episode(turn("", [call("calculator", expression="12*7"), call("search", query="X", k=3)])),  # extra arg
           episode(turn("", [call("calculator", expression="12*7")])),                          # missing call
           episode(turn("", [bad_call("calculator"), call("search", query="x")]))]               # unparsed
    out = fn(prompts=[""] * 4, completions=[""] * 4, episode=eps, gold_tool_calls=[GOLD] * 4)
    assert out == [1.0, 0.0, 0.0, 0.0]
    assert spec("fc_ast", fc_ast_ordered=True).fn(prompts=[""], completions=[""], episode=eps[:1],
                                                  gold_tool_calls=[GOLD]) == [0.0]
    out = spec("fc_ast", fc_ast_partial=True).fn(prompts=[""] * 4, completions=[""] * 4, episode=eps,
                                                 gold_tool_calls=[GOLD] * 4)
    assert close(out, [1.0, 0.5, 0.5, 0.5])
    # numbers compare as numbers
    g = [{"name": "f", "arguments": {"n": 3}}]
    assert fn(prompts=[""], completions=[""], episode=[episode(turn("", [call("f", n="3")]))],
              gold_tool_calls=[g]) == [1.0]
    with pytest.raises(ValueError, match="gold_tool_calls_column"):
        fn(prompts=[""], completions=[""], episode=eps[:1])
    # reference calls built from a row column (calculator's question); strings compare without whitespace
    tmpl = '[{"name": "calculator", "arguments": {"expression": "$question"}}]'
    fn = spec("fc_ast", gold_tool_calls_template=tmpl).fn
    eps = [episode(turn("", [call("calculator", expression="12*7+1")])), episode(turn("Answer: 85"))]
    assert fn(prompts=[""] * 2, completions=[""] * 2, episode=eps, question=['12 * 7 + 1', '12 * 7 + 1']) == [1.0, 0.0]
    with pytest.raises(ValueError, match="question"):
        fn(prompts=[""], completions=[""], episode=eps[:1])


# ----------------------------------------------------------------------------- PTA-GRPO (000-108)

def test_pta_plan_hand_computed():
    fn = spec("pta_plan").fn
    good = "<plan>\n1. add 4\n2. state the answer\n</plan>\n28 + 4 = 32\nAnswer: 32"
    texts = [good,                                                       # plan P1, right
             "<plan>\n- Add  4\n- State the answer\n</plan>\n28+4=32\nAnswer: 32",  # P1 written otherwise, right
             good.replace("Answer: 32", "Answer: 31"),                   # P1, wrong
             good.replace("2. state", "2. check\n3. state"),             # plan P2, right
             "28 + 4 = 32\nAnswer: 32",                                   # no plan
             "<plan>\n" + "\n".join(f"{k}. s" for k in range(9)) + "\n</plan>\nAnswer: 32",  # 9 > 8 steps
             good.replace("Answer: 32", "Answer: 30")]                   # P1, wrong, another question
    prompts = ["q1"] * 6 + ["q2"]
    out = fn(prompts=prompts, completions=texts, answer=["32"] * 7)
    # q1/P1: rows 0, 1, 2, of which 2 right -> 2/3 for each (the wrong row 2 too: the plan's rate, not the reply's);
    # q1/P2: row 3 alone, right -> 1; no plan, too long a plan -> 0; q2/P1: row 6 alone, wrong -> 0 (not pooled
    # with q1's P1)
    assert close(out, [2 / 3, 2 / 3, 2 / 3, 1.0, 0.0, 0.0, 0.0])
    # the plan reward is the plan's, whatever the reply's outcome: the two wrong P1 replies of one question get
    # what the right ones get
    out = fn(prompts=["q"] * 4, completions=[good, texts[2], texts[2], good], answer=["32"] * 4)
    assert close(out, [0.5] * 4)
    # one reply per question: its own accuracy when it has a plan
    assert close(fn(prompts=["a", "b"], completions=[good, texts[2]], answer=["32", "32"]), [1.0, 0.0])
    assert close(spec("pta_plan", pta_max_plan_steps=1).fn(prompts=["q"], completions=[good], answer=["32"]), [0.0])


def test_sft_pta_mode_targets():
    from grpolab.train.sft import build_examples
    rows = [{"prompt": "p", "solution": "28 + 4 = 32\n32 - 11 = 21\nAnswer: 21"},
            {"prompt": "q", "solution": "5 * 2 = 10\nAnswer: 10", "plan": "1. double it"}]
    ex = build_examples(rows, sft_mode="pta")
    assert ex[0].target == ("<plan>\n1. add 4\n2. subtract 11\n3. state the answer\n</plan>\n"
                            "28 + 4 = 32\n32 - 11 = 21\nAnswer: 21")
    assert ex[1].target == "<plan>\n1. double it\n</plan>\n5 * 2 = 10\nAnswer: 10"
    # the SFT target earns the full plan reward when its answer is right
    assert spec("pta_plan").fn(prompts=["p"], completions=[ex[0].target], answer=["21"]) == [1.0]


# ----------------------------------------------------------------------------- DAG tool plan (000-119)

def test_dag_plan_hand_computed():
    fn = spec("dag_plan").fn
    dag = ('Plan: {"nodes": [{"id": 1, "tool": "search"}, {"id": 2, "tool": "search"}, '
           '{"id": 3, "tool": "calculator"}], "edges": [[1, 3], [2, 3]]}')
    texts = [dag,
             dag.replace("[[1, 3], [2, 3]]", "[[1, 3], [3, 1]]"),   # cycle
             dag.replace("[[1, 3], [2, 3]]", "[[1, 4]]"),           # unknown node
             "no plan at all {not json}",
             '{"nodes": [{"id": "a", "tool": "search"}, {"id": "b", "tool": "search", "deps": ["a"]}]}']
    gold = [["search", "search"]] * 5
    out = fn(prompts=[""] * 5, completions=texts, gold_tools=gold)
    # row 0: tools {search: 2, calculator: 1} vs {search: 2}: P = 2/3, R = 1, F1 = 0.8 -> 0.5 + 0.5 * 0.8
    assert close(out, [0.9, 0.0, 0.0, 0.0, 1.0])
    # the plan is read from the episode's first turn (the planner's); structure only without a gold column
    eps = [episode(turn(dag), turn("Answer: 3"))]
    assert spec("dag_plan", dag_gold_tools_column="").fn(prompts=[""], completions=["Answer: 3"],
                                                          episode=eps) == [1.0]
    # a count column (search_qa's searches_needed): that many search nodes
    two = '{"nodes": [{"id": 1, "tool": "search"}, {"id": 2, "tool": "search", "deps": [1]}]}'
    assert close(spec("dag_plan", dag_gold_tools_column="searches_needed").fn(
        prompts=[""] * 2, completions=[two, two], searches_needed=[2, 1]), [1.0, 0.5 + 0.5 * (2 * 0.5 * 1 / 1.5)])
    with pytest.raises(ValueError, match="dag_gold_tools_column"):
        fn(prompts=[""], completions=[dag])


# ----------------------------------------------------------------------------- plumbing

def test_specs_registered_and_scored_through_the_reward_scorer():
    for name in ("carr", "hc_cost", "tool_call_accuracy", "fc_ast", "pta_plan", "dag_plan"):
        assert name in REWARD_SPECS
    r = spec("tool_call_accuracy=0.5")
    assert r.name == "tool_call_accuracy" and r.weight == 0.5
    scorer = RewardScorer([r], log=lambda *a: None)
    eps = [episode(turn("", [call("calculator", expression="12*7")]))]
    m, errors = scorer.score([""], ["x"], [[1]], {"episode": eps, "gold_tool_calls": [GOLD[:1]]})
    assert errors == 0 and m.tolist() == [[1.0]]
    # without the episode record (a single-turn rollout) the call fails with the fix, and the run goes on
    logs = []
    m, errors = RewardScorer([r], log=logs.append).score([""], ["x"], [[1]], {"gold_tool_calls": [GOLD]})
    assert errors == 1 and torch.isnan(m).all() and "rollout_strategy: agent" in logs[0]


# ----------------------------------------------------------------------------- recipes and smoke runs

# (each agent-reward recipe trains on its own built-in task in tests/test_training.py::test_every_recipe_trains)


def _train(args):
    from grpolab.train.metrics import read_metrics
    from grpolab.train.trainer import Trainer
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    return read_metrics(args["out"])


def test_pta_grpo_recipe_sft_then_grpo_smoke(tiny_args, tmp_path):
    """PTA-GRPO end to end on the tiny model: `grpolab sft --sft_mode pta`, then the recipe from that model."""
    from grpolab.cli import main
    from grpolab.recipes import recipe_overrides
    sft_out = tmp_path / "pta-sft"
    assert main(["sft", "--model", "tiny", "--task", "arithmetic_multistep", "--out", str(sft_out),
                 "--sft_mode", "pta", "--sft_steps", "2", "--sft_batch_size", "2"]) == 0
    rec = recipe_overrides("pta_grpo")
    assert rec["reward"] == ["pta_plan"] and rec["task"] == "arithmetic_multistep"
    rows = _train({**tiny_args, **rec, "model": str(sft_out), "steps": 2, "max_completion_length": 12})
    assert len(rows) == 2 and all(r["skipped"] == 0 for r in rows)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def accuracy(completions, answer, **kw):
    """The data's accuracy reward: the final turn says 'Answer: <answer>'."""
    return [float(f"Answer: {a}" in str(c)) for c, a in zip(completions, answer)]


CALL_TEXT = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'


def _agent_data_trainer(tmp_path, tiny_args, extra):
    """A tiny-model trainer on user rows with short prompts (the tiny model has 512 positions), the user tool
    ``add`` and reference calls; every character of the scripted turns is in the data (the tiny tokenizer)."""
    import json
    from grpolab.train.trainer import Trainer
    gold = [[{"name": "add", "arguments": {"a": 1, "b": 2}}], [{"name": "add", "arguments": {"a": 1, "b": 3}}]]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"add 1 and {i}", "answer": "3", "note": CALL_TEXT + " Answer: 3",
                                        "gold_tool_calls": json.dumps(gold[i % 2])}) + "\n" for i in range(8)))
    args = {**tiny_args, "data": str(path), "reward": ["test_agent_rewards:accuracy", "tool_call_accuracy",
                                                       "fc_ast"],
            "rollout_strategy": "agent", "tools": ["test_agent_rewards:add"], "max_turns": 3,
            "max_episode_tokens": 400, "max_turn_tokens": 80, "env_reward_weight": 0.0, "steps": 2,
            "prompts_per_step": 2, "num_generations": 2, "reward_transforms": ["otc_tool_reward"], **extra}
    args.pop("task", None)
    return Trainer(Config.build(args), log=lambda *a: None)


def test_agent_rewards_score_rollout_episodes_end_to_end(tmp_path, tiny_args, monkeypatch):
    """Through the real agent rollout with a scripted policy (call add(1, 2), then 'Answer: 3'): the episode
    records reach the reward specs and the transform; row 0's reference call is add(1, 2), row 1's add(1, 3)."""
    from test_agent_core import scripted
    from grpolab.agents import rollout as agent_rollout
    tr = _agent_data_trainer(tmp_path, tiny_args, {})
    monkeypatch.setattr(agent_rollout, "sample_turns", scripted([CALL_TEXT, "Answer: 3"]))
    tr.ctx.new_step()
    b = tr.strategy(ctx=tr.ctx, rows=tr.rows[:2], uids=[0, 1], group_offset=0, budgets=None, temperatures=None)
    names = b.reward_names
    assert [e["num_turns"] for e in b.columns["episode"]] == [2, 2, 2, 2]
    col = {n: b.rewards[:, names.index(n)].tolist() for n in ("accuracy", "tool_call_accuracy", "fc_ast")}
    assert col["accuracy"] == [1.0] * 4
    assert col["tool_call_accuracy"] == [1.0, 1.0, 0.0, 0.0] and col["fc_ast"] == [1.0, 1.0, 0.0, 0.0]
    # OTC-GRPO: every episode is correct with one call, so n = m = 1 and r_tool = 1: the scalar is unchanged
    scalar = tr.scorer.scalar(b, step=1)
    assert close(scalar, [3.0, 3.0, 1.0, 1.0])


def test_agent_rewards_train_two_steps_on_the_tiny_model(tmp_path, tiny_args):
    """Two real training steps with the agent rollout, the agent reward specs, the OTC transform and the
    CoT-entropy advantage weighting (seed 000-106; its numbers: tests/test_fc_entropy_grpo.py) on the tiny model
    (random tokens: no valid call, episodes end by the turn limit or without an action; the run proves the
    pipeline). A smoke test: one scripted step of this pipeline, its scalar rewards and weighted advantages by
    hand, is tests/test_agent_recipe_numbers.py::test_agent_rewards_pipeline_numbers."""
    from grpolab.train.metrics import read_metrics
    tr = _agent_data_trainer(tmp_path, tiny_args, {"advantage_weightings": ["fc_cot_entropy_advantage"],
                                                        "max_turn_tokens": 16})
    tr.train(progress=False)
    rows = read_metrics(tr.cfg.out)
    assert len(rows) == 2 and all(r["skipped"] == 0 for r in rows)


