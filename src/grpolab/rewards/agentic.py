"""Agent rewards from the seeds: tool efficiency, search efficiency, retrieval schedules, citations, costs,
tool-call accuracy, function-call validation, plan quality and DAG tool plans.

Every reward here reads the episode record that the agent rollout (``rollout_strategy: agent``) writes into
``batch.columns["episode"]`` (one :meth:`grpolab.agents.base.EpisodeRecord.as_dict` per row: ``turns`` with
their ``tool_calls`` ``[{name, arguments, output, error, timed_out}]``, ``ended_by``, ``env_reward``, ``info``;
see :mod:`grpolab.agents.base`) plus the task's data columns. They are **reward specs** (``--reward NAME`` / a
recipe's ``reward: [NAME]``): one value per row, the TRL reward contract; the episode arrives as the keyword
``episode``. ``carr``, ``hc_cost``, ``tool_call_accuracy``, ``fc_ast``, ``pta_plan``, ``dag_plan``.

The agent reward transforms that need the *group* (the G episodes of one task instance) or the training
``step`` (``otc_tool_reward``, ``sem_search_reward``, ``graphrag_r1_phases``) are in ``transforms.py`` with
every other transform and use the episode helpers here; the entropy-guided exploration of seed 000-106 is an
advantage weighting, ``fc_cot_entropy_advantage`` (``grpolab/algorithms/weightings.py``).

A reward that needs the episode and gets a batch without one (a single-turn rollout) raises an error naming
the fix (``rollout_strategy: agent``); a reward that needs a data column the task does not have raises an
error naming the column and the parameter that chooses it.
"""
from __future__ import annotations

import json
import re
import string
from string import Template
from collections import Counter, deque

from ..data import completion_text
from ..registry import REWARD_SPECS, declared_params, param
from .answers import extract_answer, math_equal
from ..tasks.function_calls import ast_match, ast_valid_call, canon_value as _canon
from .scoring import RewardFn, spec_weight

EPISODE = "episode"  # grpolab.agents.base.EPISODE_COLUMN (the agents package sits above rewards in the layers)

# parameters shared by several components: one constant each
ANSWER_COLUMN = param('answer', 'agent rewards: data column with the reference answer')
GOLD_CALLS_COLUMN = param('gold_tool_calls', 'tool-call rewards: data column with the reference tool calls, a list '
                          'of {"name": ..., "arguments": {...}} (or its JSON text)')
GOLD_CALLS_TEMPLATE = param('', 'tool-call rewards: build the reference calls of each row from this JSON template '
                            'instead of a column; $name is replaced by the row\'s column name (e.g. calculator: '
                            '[{"name": "calculator", "arguments": {"expression": "$question"}}])')


# ----------------------------------------------------------------------------- episode helpers

def episodes_of(columns: dict, who: str) -> list[dict]:
    """The ``episode`` column, or an error naming the agent rollout."""
    eps = columns.get(EPISODE)
    if eps is None:
        raise ValueError(f"{who}: needs the episode record (data column '{EPISODE}'), which only the agent rollout "
                         f"writes; set rollout_strategy: agent (with a task that has an environment, or --tools / "
                         f"--env)")
    return eps


def tool_names(spec: str) -> set[str] | None:
    """``"a, b"`` -> ``{"a", "b"}``; empty -> ``None`` (every tool)."""
    names = {s.strip() for s in str(spec or "").split(",") if s.strip()}
    return names or None


def episode_tool_calls(ep: dict, names: set[str] | None = None) -> list[dict]:
    """Every tool call of an episode, in order (only those named in ``names`` when given)."""
    calls = [c for t in ep.get("turns", []) for c in (t.get("tool_calls") or [])]
    return calls if names is None else [c for c in calls if c.get("name") in names]


def count_tool_calls(ep: dict, names: set[str] | None = None) -> int:
    return len(episode_tool_calls(ep, names))


def final_text(ep: dict | None, completion=None) -> str:
    """The text of the episode's last model turn (the final answer turn); the completion text without turns."""
    turns = (ep or {}).get("turns") or []
    if turns:
        return str(turns[-1].get("text") or "")
    return completion_text(completion) if completion is not None else ""


def normalize_answer(s) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and the articles a/an/the, collapse whitespace."""
    s = str(s).lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def token_f1(pred, gold) -> float:
    """SQuAD token F1 of two answers after :func:`normalize_answer` (0 when either is empty)."""
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g and bool(p))
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(g)
    return 2 * prec * rec / (prec + rec)


def data_column(columns: dict, name: str, who: str, param_name: str) -> list:
    """The data column ``name`` of a batch's ``columns``, or an error naming component ``who``, the columns there
    are and the parameter ``param_name`` that chooses the column."""
    if name not in columns:
        raise ValueError(f"{who}: no data column '{name}' (columns: {', '.join(sorted(columns)) or 'none'}); set "
                         f"{param_name} or use a task that has it")
    return columns[name]


def _spec(name: str, cls):
    """Register reward class ``cls`` as the ``--reward`` spec ``name[=weight]`` (its options are its params)."""
    def parse(spec: str, cfg=None, **opts) -> RewardFn:
        w = spec_weight(spec, spec.partition("=")[2])
        return RewardFn(name, cls(**opts), w)

    parse.__name__ = parse.__qualname__ = f"parse_{name}_spec"
    parse.__doc__ = cls.__doc__
    parse.__module__ = cls.__module__
    parse.__wrapped__ = cls  # so the catalog points at the class's source
    parse.__grpolab_params__ = declared_params(cls)
    REWARD_SPECS.register(name, needs=("text",))(parse)
    return parse


# ----------------------------------------------------------------------------- CaRR / C-GRPO (000-96)

_ENTITY = re.compile(r"<(E\d+)>")
UNFINISHED = ("max_turns", "token_budget", "error")


def _as_list(v) -> list:
    if v is None:
        return []
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            return [v]
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _as_dict(v) -> dict:
    if v is None:
        return {}
    if isinstance(v, str):
        v = json.loads(v)
    if not isinstance(v, dict):
        raise ValueError(f"carr: rubric entities must be a dict {{'E1': value, ...}}, got {type(v).__name__}")
    return v


def _mentions(text_norm: str, value) -> bool:
    v = normalize_answer(value)
    return bool(v) and f" {v} " in f" {text_norm} "


def chain_rubrics(entity, relations: list, path: list) -> tuple[list[str], dict]:
    """Rubrics of a relation chain ``entity -r1-> path[0] -r2-> ... -> path[-1]`` (the answer): one single-hop
    rubric per relation, the answer as ``E0`` and the hidden intermediate entities as ``E1, E2, ...``::

        entity=Mira, relations=[works_for, headquarters], path=[Acme, Lyon]
        -> ["Mira works for <E1>", "<E1> headquarters <E0>"], {"E1": "Acme", "E0": "Lyon"}
    """
    if len(relations) != len(path) or not path:
        raise ValueError(f"carr: a chain needs one path entity per relation, got relations={relations} path={path}")
    ids = [f"E{j + 1}" for j in range(len(path) - 1)] + ["E0"]
    rubrics = [f"{entity if j == 0 else '<' + ids[j - 1] + '>'} {str(r).replace('_', ' ')} <{ids[j]}>"
               for j, r in enumerate(relations)]
    return rubrics, {i: v for i, v in zip(ids, path)}


def rubric_reward(rubrics: list[str], entities: dict, response: str, cited: str) -> float:
    """CaRR rubric reward of one response (see :class:`CaRRReward`): share of rubrics that are fully
    identified, supported by the cited content and connected to the answer entity ``E0``."""
    if not rubrics:
        return 0.0
    resp, ctx = normalize_answer(response), normalize_answer(cited)
    supported: dict[int, list[str]] = {}
    for k, rub in enumerate(rubrics):
        ids = list(dict.fromkeys(_ENTITY.findall(rub)))
        if not all(i in entities and _mentions(resp, entities[i]) for i in ids):
            continue  # an entity of the rubric is not identified in the response
        if ctx and all(_mentions(ctx, entities[i]) for i in ids):
            supported[k] = ids
    entity2rubrics: dict[str, set[int]] = {}
    for k, ids in supported.items():
        for i in ids:
            entity2rubrics.setdefault(i, set()).add(k)
    reach_e, reach_r, queue = {"E0"}, set(), deque(["E0"])
    while queue:
        e = queue.popleft()
        for k in entity2rubrics.get(e, ()):
            reach_r.add(k)
            for other in supported[k]:
                if other not in reach_e:
                    reach_e.add(other)
                    queue.append(other)
    return len(reach_r) / len(rubrics)


class CaRRReward:
    """CaRR citation-aware rubric reward, C-GRPO's mix with the outcome (Zhang et al., 2025, "CaRR:
    Citation-aware Rubric Rewards for deep search agents"; seed 000-96).

    ``R = (1 - rho) * R_outcome + rho * R_rubric`` (``rho = carr_rubric_ratio``, the authors' training runs use
    0.3). Rubrics (data column ``carr_rubrics_column``) are single-hop statements about hidden entities
    written with placeholders ``<E0>`` (the answer), ``<E1>``, ...; their values are in
    ``carr_entities_column`` (a dict; ``E0`` defaults to the answer). For each rubric:

    1. *identified*: the final response names the value of every entity of the rubric;
    2. *supported*: the cited content contains every one of those values;
    3. *connected*: the rubric is reachable from ``E0`` by a breadth-first search over supported rubrics
       that share an entity (the evidence chain reaches the answer).

    ``R_rubric`` = connected rubrics / all rubrics (0 without rubrics or without cited content).
    ``R_outcome`` = 1 when the final answer (``Answer:`` line or ``\\boxed{}``, else the whole final turn)
    matches ``agent_answer_column`` after SQuAD normalisation. Cited content = the outputs of the tool calls
    the final response cites as ``[k]`` (k-th tool call of the episode, from 1; ``carr_citation_pattern``);
    with ``carr_require_citation: false`` every tool output counts as cited. ``carr_rubric_source: chain``
    builds the rubrics of a relation chain from the columns ``entity``, ``relations``, ``path`` of
    ``search_qa`` (:func:`chain_rubrics`: one rubric per hop, intermediate entities hidden). An episode that
    did not finish
    (ended by ``max_turns``, ``token_budget`` or ``error``) gets 0, as the authors' ``task_unfinished``.

    Provenance: authors' code — https://github.com/THUDM/CaRR, deepsearch_rm_with_rubrics/launch_server.py
    (get_rubric_reward, get_reward); the mix (1 - rho) outcome + rho rubric, the BFS from E0 over supported
    rubrics sharing entities, the share of connected rubrics, zero for unfinished tasks and for responses
    without citations are as there; the LLM judge's three calls (entity identification, support of a filled
    rubric by the cited pages, outcome correctness) are replaced by normalised string matching, and citations
    are tool-call indices instead of URLs. Test: tests/test_agent_rewards.py::test_carr_hand_computed.
    """

    def __init__(self, *,
                 carr_rubric_ratio: float = param(0.3, 'CaRR: weight rho of the rubric reward in '
                                                  '(1 - rho) outcome + rho rubric (authors: 0.3)'),
                 carr_rubric_source: str = param('column', "CaRR: 'column' (rubrics and entities from data "
                                                 "columns) or 'chain' (built from search_qa's entity, relations and "
                                                 "path columns)", ['column', 'chain']),
                 carr_rubrics_column: str = param('rubrics', 'CaRR: data column with the rubrics (list of '
                                                  'statements with <E0>, <E1>, ... placeholders)'),
                 carr_entities_column: str = param('rubric_entities', 'CaRR: data column with the entity values '
                                                   "{'E1': ..., ...} (E0 defaults to the answer)"),
                 agent_answer_column: str = ANSWER_COLUMN,
                 carr_citation_pattern: str = param('\\[(\\d+)\\]', 'CaRR: regex whose group is the cited tool '
                                                    'call number (from 1)'),
                 carr_require_citation: bool = param(True, 'CaRR: only cited tool outputs support rubrics '
                                                     '(false: every tool output)')):
        if not 0.0 <= carr_rubric_ratio <= 1.0:
            raise ValueError(f"carr_rubric_ratio: must be in [0, 1], got {carr_rubric_ratio}")
        if carr_rubric_source not in ("column", "chain"):
            raise ValueError(f"carr_rubric_source: expected column or chain, got '{carr_rubric_source}'")
        self.source = carr_rubric_source
        self.ratio, self.rubrics_col, self.entities_col = carr_rubric_ratio, carr_rubrics_column, carr_entities_column
        self.answer_col, self.require = agent_answer_column, carr_require_citation
        self.cite = re.compile(carr_citation_pattern)
        self.__name__ = "carr"

    def cited_content(self, ep: dict, response: str) -> str:
        outputs = [str(c.get("output") or "") for c in episode_tool_calls(ep)]
        if not self.require:
            return "\n".join(outputs)
        nums = dict.fromkeys(int(k) for k in self.cite.findall(response) if str(k).isdigit())
        return "\n".join(outputs[k - 1] for k in nums if 1 <= k <= len(outputs))

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        eps = episodes_of(columns, "carr")
        answers = data_column(columns, self.answer_col, "carr", "agent_answer_column")
        if self.ratio == 0:
            rubrics, ents = [[]] * len(eps), [{}] * len(eps)
        elif self.source == "chain":
            chains = [chain_rubrics(x, r, p) for x, r, p in zip(
                *(data_column(columns, c, "carr", "carr_rubric_source") for c in ("entity", "relations", "path")))]
            rubrics, ents = [c[0] for c in chains], [c[1] for c in chains]
        else:
            rubrics = data_column(columns, self.rubrics_col, "carr", "carr_rubrics_column")
            hidden = any(e != "E0" for r in rubrics for x in _as_list(r) for e in _ENTITY.findall(str(x)))
            ents = (data_column(columns, self.entities_col, "carr", "carr_entities_column") if hidden
                    else [None] * len(eps))
        out = []
        for ep, ans, rub, ent, comp in zip(eps, answers, rubrics, ents, completions or [None] * len(eps)):
            if ep.get("ended_by") in UNFINISHED:
                out.append(0.0)
                continue
            response = final_text(ep, comp)
            pred = extract_answer(response)
            outcome = float(normalize_answer(pred if pred is not None else response) == normalize_answer(ans))
            rubric = 0.0
            if self.ratio > 0:
                entities = {"E0": ans, **_as_dict(ent)}
                rubric = rubric_reward([str(r) for r in _as_list(rub)], entities, response,
                                       self.cited_content(ep, response))
            out.append((1 - self.ratio) * outcome + self.ratio * rubric)
        return out


_spec("carr", CaRRReward)


# ----------------------------------------------------------------------------- HC-GRPO (000-58)

COST_FIELD = "cost"


def _parse_weights(spec: str, what: str) -> dict[str, float]:
    out = {}
    for part in str(spec or "").split(","):
        if not part.strip():
            continue
        k, sep, v = part.partition("=")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise ValueError(f"{what}: expected 'name=number, ...', got '{spec}'") from None
        if not sep:
            raise ValueError(f"{what}: expected 'name=number, ...', got '{spec}'")
    return out


def step_costs(turn: dict) -> dict[str, float] | None:
    """The costs an environment recorded for one step, when the rollout keeps each step's ``info`` in the turn
    (``turn["info"]``) or the turn has a ``cost`` field: ``costs`` (a dict ``{cost type: amount}``) if present,
    else ``cost`` (a number, type ``"step"``, or a dict); ``None`` when the step recorded none."""
    info = turn.get("info") or {}
    raw = info.get("costs", info.get(COST_FIELD, turn.get(COST_FIELD)))
    if raw is None:
        return None
    if isinstance(raw, dict):
        return {str(k): float(v) for k, v in raw.items()}
    return {"step": float(raw)}


def episode_costs(ep: dict) -> dict[str, float] | None:
    """The episode's recorded costs by type: the sum of :func:`step_costs` over its turns when any turn has
    them, else the episode ``info``'s cumulative ``total_costs`` (dict by type) or ``total_cost`` (a number,
    type ``"total"``; the rollout keeps the last step's info); ``None`` when nothing was recorded."""
    per_step = [step_costs(t) for t in ep.get("turns", [])]
    if any(c is not None for c in per_step):
        out: dict[str, float] = {}
        for c in per_step:
            for k, v in (c or {}).items():
                out[k] = out.get(k, 0.0) + v
        return out
    info = ep.get("info") or {}
    if isinstance(info.get("total_costs"), dict):
        return {str(k): float(v) for k, v in info["total_costs"].items()}
    if info.get("total_cost") is not None:
        return {"total": float(info["total_cost"])}
    return None


class HCCostReward:
    """HC-GRPO heterogeneous cost term (ESearch-R1, 2025, "ESearch-R1: ... Heterogeneous Cost-Aware GRPO";
    seed 000-58): the negative weighted total cost of an episode's actions.

    ``R_cost = -sum_t sum_k w_k c_{t,k}`` over the steps ``t`` of the episode and cost types ``k`` (e.g.
    navigation time, human attention), with ``w_k`` from ``hc_cost_weights`` (``"ask=2,navigate=0.5"``; a type
    not listed weighs 1). Costs come from the environment and/or from tool calls priced by name
    (``hc_tool_costs``: ``"search=1,ask_human=3"``; a call's cost type is its tool name). Environment costs
    (:func:`episode_costs`): each step's ``costs`` (by type) or ``cost`` when the turns carry their step's
    ``info``; otherwise the cumulative ``total_costs`` (by type) or ``total_cost`` (type ``total``) of the
    episode's info — the ``gridworld`` task records ``cost``, ``costs`` (``time``, ``attention``) and
    ``total_cost`` in every step's info. The result is
    divided by ``hc_cost_scale``. Combined with the task's success reward (``reward_weights``) it gives the
    paper's trade-off: groups of episodes are compared on success minus heterogeneous cost. An episode with
    steps but neither source of costs raises an error naming the field.

    Provenance: reconstructed from the abstract — success minus a weighted sum of heterogeneous action costs
    as the trajectory reward compared within GRPO groups; the linear weighting, the cost sources and the
    scale are grpolab's (the paper's AI2-THOR environment and constants are not reproduced).
    """

    def __init__(self, *,
                 hc_cost_weights: str = param('', "HC-GRPO: weights of the cost types, 'type=w,...' (unlisted "
                                              'types weigh 1)'),
                 hc_tool_costs: str = param('', "HC-GRPO: cost of a call to each tool, 'tool=c,...' (the type "
                                            'is the tool name)'),
                 hc_cost_scale: float = param(1.0, 'HC-GRPO: the weighted total cost is divided by this')):
        if not hc_cost_scale > 0:
            raise ValueError(f"hc_cost_scale: must be > 0, got {hc_cost_scale}")
        self.weights = _parse_weights(hc_cost_weights, "hc_cost_weights")
        self.tool_costs = _parse_weights(hc_tool_costs, "hc_tool_costs")
        self.scale = hc_cost_scale
        self.__name__ = "hc_cost"

    def episode_cost(self, ep: dict) -> float:
        costs = episode_costs(ep)
        found = costs is not None
        costs = dict(costs or {})
        for c in episode_tool_calls(ep):
            if c.get("name") in self.tool_costs:
                costs[c["name"]] = costs.get(c["name"], 0.0) + self.tool_costs[c["name"]]
                found = True
        if ep.get("turns") and not found:
            raise ValueError(f"hc_cost: the episode recorded no action cost: the environment must put '{COST_FIELD}' "
                             f"(or 'costs' by type, or a cumulative 'total_cost' / 'total_costs') in its step info, "
                             f"or set hc_tool_costs ('tool=cost,...')")
        return sum(self.weights.get(k, 1.0) * v for k, v in costs.items())

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        return [-self.episode_cost(ep) / self.scale for ep in episodes_of(columns, "hc_cost")]


_spec("hc_cost", HCCostReward)


# ----------------------------------------------------------------------------- tool-call accuracy (000-103)

def gold_calls(v) -> list[dict]:
    """Reference tool calls from a data cell: a list of ``{name, arguments}`` or its JSON text."""
    calls = _as_list(v)
    for c in calls:
        if not isinstance(c, dict) or "name" not in c:
            raise ValueError(f"gold tool calls: each must be {{'name': ..., 'arguments': {{...}}}}, got {c!r}")
    return calls


def reference_calls(columns: dict, column: str, template: str, who: str) -> list[list[dict]]:
    """Each row's reference calls: from ``template`` (``$col`` -> the row's value, JSON-escaped) when set, else
    from the data column ``column``."""
    if not template:
        return [gold_calls(g) for g in data_column(columns, column, who, "gold_tool_calls_column")]
    names = set(re.findall(r"\$\{?(\w+)", template))
    missing = sorted(n for n in names if n not in columns)
    if missing:
        raise ValueError(f"{who}: gold_tool_calls_template names column(s) {', '.join(missing)} the data does not "
                         f"have (columns: {', '.join(sorted(columns))})")
    rows = len(columns[EPISODE]) if EPISODE in columns else len(next(iter(columns.values())))
    out = []
    for i in range(rows):
        text = Template(template).substitute({n: json.dumps(str(columns[n][i]))[1:-1] for n in names})
        try:
            out.append(gold_calls(json.loads(text)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{who}: gold_tool_calls_template is not JSON once filled ({e}): {text[:200]}") from None
    return out


def call_key(call: dict, with_args: bool) -> tuple:
    args = call.get("arguments")
    return (call.get("name"), _canon(args if isinstance(args, dict) else {}) if with_args else None)


def calls_f1(pred: list[dict], gold: list[dict], with_args: bool = True) -> float:
    """F1 of two multisets of calls (matched on name, and canonical arguments when ``with_args``);
    1.0 when both are empty."""
    if not pred and not gold:
        return 1.0
    p = Counter(call_key(c, with_args) for c in pred)
    g = Counter(call_key(c, with_args) for c in gold)
    hit = sum((p & g).values())
    if hit == 0:
        return 0.0
    prec, rec = hit / sum(p.values()), hit / sum(g.values())
    return 2 * prec * rec / (prec + rec)


class ToolCallAccuracyReward:
    """Tool-call accuracy for conversational tool-calling agents (seed 000-103, "GRPO for conversational
    agents: reasoning before tool invocation and answering").

    ``R_tool = F1(predicted calls, reference calls)``: the episode's tool calls against the data column
    ``gold_tool_calls`` (or built from ``gold_tool_calls_template``) as multisets, a call matching when its
    name (``tca_match: name``) or its name and canonical arguments (``name_args``: numbers compared as
    numbers, strings case-folded without whitespace) are equal; 1 when neither side has a call (the right
    answer to "no tool needed"), 0 when only one side has calls. A call that did not parse (``arguments``
    null) matches nothing. The paper's second reward, answer correctness, is the task's ``accuracy`` reward
    (combine them with ``reward_weights``).

    Provenance: reconstructed from the abstract — "rewards designed around tool accuracy and answer
    correctness": the F1 of the call multisets, the argument canonicalisation and the pairing with the
    task's accuracy reward are grpolab's.
    """

    def __init__(self, *, tca_match: str = param('name_args', 'tool-call accuracy: a call matches on its name or '
                                                  'on name and arguments', ['name', 'name_args']),
                 gold_tool_calls_column: str = GOLD_CALLS_COLUMN,
                 gold_tool_calls_template: str = GOLD_CALLS_TEMPLATE):
        if tca_match not in ("name", "name_args"):
            raise ValueError(f"tca_match: expected name or name_args, got '{tca_match}'")
        self.with_args, self.column, self.template = tca_match == "name_args", gold_tool_calls_column, \
            gold_tool_calls_template
        self.__name__ = "tool_call_accuracy"

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        eps = episodes_of(columns, "tool_call_accuracy")
        gold = reference_calls(columns, self.column, self.template, "tool_call_accuracy")
        return [calls_f1([c for c in episode_tool_calls(e) if c.get("arguments") is not None or not self.with_args],
                         g, self.with_args) for e, g in zip(eps, gold)]


_spec("tool_call_accuracy", ToolCallAccuracyReward)


# ----------------------------------------------------------------------------- function calling + AST (000-106)

class FunctionCallASTReward:
    """Function-calling reward with AST validation of the extracted parameters (seed 000-106, "Entropy-guided
    GRPO for function calling": structured CoT, verification of parameter extraction, AST validation).

    ``R = 1`` when the episode's tool calls pass the abstract-syntax-tree check against the reference calls
    (data column ``gold_tool_calls``, or ``gold_tool_calls_template``), else ``0``, as the Berkeley Function
    Calling Leaderboard scores a sample: every call parsed into a JSON object, the function name equal, the
    argument set equal (no missing, no extra argument), every value equal after canonicalisation (numbers as
    numbers, strings case-folded without whitespace), and the calls paired one to one (in order with
    ``fc_ast_ordered``, else in any order, BFCL's parallel calls). ``fc_ast_partial: true`` gives instead the
    share of reference calls matched (a denser signal). The entropy-guided exploration of the same paper is
    the advantage weighting ``fc_cot_entropy_advantage`` (its single-turn reward: task ``function_calls``).

    Provenance: reconstructed from the abstract — "verification of parameter extraction" and "abstract syntax
    tree validation" as a BFCL-style AST match used as the reward; the binary score, canonicalisation and
    partial variant are grpolab's (the authors' code was announced, not found).
    """

    def __init__(self, *, fc_ast_ordered: bool = param(False, 'function-call AST reward: calls must be in the '
                                                        "reference's order"),
                 fc_ast_partial: bool = param(False, 'function-call AST reward: share of reference calls matched '
                                              'instead of all-or-nothing'),
                 gold_tool_calls_column: str = GOLD_CALLS_COLUMN,
                 gold_tool_calls_template: str = GOLD_CALLS_TEMPLATE):
        self.ordered, self.partial, self.column = fc_ast_ordered, fc_ast_partial, gold_tool_calls_column
        self.template = gold_tool_calls_template
        self.__name__ = "fc_ast"

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        eps = episodes_of(columns, "fc_ast")
        gold = reference_calls(columns, self.column, self.template, "fc_ast")
        out = []
        for e, ref in zip(eps, gold):
            pred = episode_tool_calls(e)
            if not self.partial:
                out.append(float(ast_match(pred, ref, self.ordered)))
                continue
            if not ref:
                out.append(float(not pred))
                continue
            left, hits = list(pred), 0
            for r in ref:
                j = next((j for j, p in enumerate(left) if ast_valid_call(p, r)), None)
                if j is not None:
                    hits += 1
                    left.pop(j)
            out.append(hits / max(len(ref), len(pred)))
        return out


_spec("fc_ast", FunctionCallASTReward)


# ----------------------------------------------------------------------------- PTA-GRPO (000-108)

PLAN_TAG = param('plan', 'PTA-GRPO: the plan is written between <TAG> and </TAG> before the reasoning')
_OPS = {"+": "add", "-": "subtract", "*": "multiply", "x": "multiply", "/": "divide"}
_STEP = re.compile(r"^\s*(?:\d+[.)]|[-*•]|step\s*\d+\s*[:.])\s*(.+)$", re.I)


def compact_plan(reasoning: str) -> str:
    """A compact high-level plan of a worked solution: one numbered step per operation line ("a op b = c"
    -> "<verb> <b>" with the operation's verb), other lines as they are, then "state the answer"."""
    steps = []
    for line in reasoning.splitlines():
        line = line.strip()
        if not line:
            continue
        m = re.match(r"^\s*(-?[\d.]+)\s*([+\-*/x])\s*(-?[\d.]+)\s*=", line)
        steps.append(f"{_OPS[m.group(2)]} {m.group(3)}" if m else line)
    steps.append("state the answer")
    return "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))


def split_plan(text: str, tag: str = "plan") -> tuple[list[str] | None, str]:
    """``(plan steps, text after the plan)``; steps ``None`` when the text does not open with one plan."""
    m = re.match(rf"\s*(?:<think>\s*)?<{tag}>(.*?)</{tag}>(.*)", text, re.S)
    if not m or f"<{tag}>" in m.group(2):
        return None, text
    steps = []
    for line in m.group(1).splitlines():
        line = line.strip()
        if line:
            s = _STEP.match(line)
            steps.append((s.group(1) if s else line).strip())
    return steps, m.group(2)


def plan_key(steps: list[str]) -> tuple[str, ...]:
    """What a plan says, for comparing plans: its steps lower-cased with whitespace collapsed (numbering and
    bullets are already gone, :func:`split_plan`), so ``"1. Add  4"`` and ``"- add 4"`` are the same step."""
    return tuple(" ".join(s.lower().split()) for s in steps)


def plan_success_rates(prompt_keys: list, plans: list, correct: list[bool]) -> list[float]:
    """For each row, the share of correct rows among the rows with the same prompt key and the same plan
    (``plan_key``; the row itself included): the batch's Monte-Carlo estimate of ``P(correct | prompt, plan)``.
    Rows whose plan is ``None`` get 0 and count for no plan."""
    tally: dict = {}
    for k, p, ok in zip(prompt_keys, plans, correct):
        if p is not None:
            n, c = tally.get((k, p), (0, 0))
            tally[(k, p)] = (n + 1, c + int(bool(ok)))
    out = []
    for k, p in zip(prompt_keys, plans):
        n, c = tally.get((k, p), (0, 0)) if p is not None else (0, 0)
        out.append(c / n if n else 0.0)
    return out


class PTAPlanReward:
    """PTA-GRPO plan-quality reward (Plan-Then-Action Enhanced Reasoning with GRPO, arXiv:2510.01833, 2025;
    seed 000-108).

    Stage 1 (SFT, ``grpolab sft --sft_mode pta``) teaches the format ``<plan>`` numbered high-level steps
    ``</plan>`` then the step-by-step reasoning and ``Answer:``; stage 2 (GRPO, recipe ``pta_grpo``) rewards the
    final answer (the task's ``accuracy``) *and* the quality of the plan, judged by what the plan leads to::

        R_plan(i) = [reply i opens with one <plan>..</plan> of 1..pta_max_plan_steps steps]
                    * (# correct replies j with prompt_j = prompt_i and plan_j = plan_i) / (# such replies j)

    i.e. the plan's success rate: the share of right answers among the replies of the same question that wrote
    the *same plan* (the same steps, compared lower-cased with whitespace collapsed; reply i itself included), a
    Monte-Carlo estimate of ``P(correct | question, plan)`` from the step's rollouts. A plan is credited for how
    often the reasoning it guides succeeds — the same for every reply that wrote it, right or wrong, and apart
    from the reply's own outcome reward; a plan no reply shares is judged by its one reply. With the rollout
    ``pta_plans`` (recipe ``pta_grpo``) every plan has ``num_generations / pta_plans_per_prompt`` reasonings, so
    the rate is measured over the plan's own reasonings. Correctness:
    ``Answer:`` / ``\\boxed{}`` equal to the ``answer`` column (:func:`~grpolab.rewards.answers.math_equal`).
    Replies are compared within the call, i.e. the step's batch (the scorer passes all of its rows).

    Provenance: reconstructed from the abstract — the abstract says the guidance-aware RL stage "jointly optimizes
    the final output and the quality of high-level guidance"; the paper's equations could not be read here.
    grpolab scores a plan's quality by the accuracy of the replies that follow it (its success rate within the
    group, as summaries of the paper describe the plan reward: how well a plan tends to yield correct solutions);
    the plan format, the compactness cap, the plan comparison and estimating the rate from the replies that
    share a plan (``pta_plans`` samples several per plan) are grpolab's choices. ``--sft_mode pta`` derives the
    stage-1 plans from the task's worked solutions, where the paper distils them with a stronger LLM.
    Test: tests/test_agent_rewards.py::test_pta_plan_hand_computed.
    """

    def __init__(self, *, pta_plan_tag: str = PLAN_TAG,
                 pta_max_plan_steps: int = param(8, 'PTA-GRPO: most plan steps that still count as compact'),
                 agent_answer_column: str = ANSWER_COLUMN):
        self.tag, self.max_steps, self.column = pta_plan_tag, pta_max_plan_steps, agent_answer_column
        self.__name__ = "pta_plan"

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        answers = data_column(columns, self.column, "pta_plan", "agent_answer_column")
        eps = columns.get(EPISODE) or [None] * len(completions)
        prompts = prompts if prompts is not None else [""] * len(completions)
        keys, plans, correct = [], [], []
        for p, c, a, e in zip(prompts, completions, answers, eps):
            text = completion_text(c) if e is None else "\n".join(str(t.get("text") or "") for t in e["turns"])
            steps, _ = split_plan(text, self.tag)
            plans.append(plan_key(steps) if steps and len(steps) <= self.max_steps else None)
            pred = extract_answer(text)
            correct.append(pred is not None and math_equal(pred, a))
            keys.append((repr(p), str(a)))
        return plan_success_rates(keys, plans, correct)


_spec("pta_plan", PTAPlanReward)


# ----------------------------------------------------------------------------- DAG tool plan (000-119)

def parse_dag(text: str) -> dict | None:
    """The first JSON object of ``text`` with a ``nodes`` list (inside ``<plan>``, a code block or bare)."""
    dec = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = dec.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("nodes"), list):
            return obj
    return None


def dag_edges(plan: dict) -> list[tuple] | None:
    """Edges ``(src, dst)`` from ``edges: [[a, b], ...]`` and/or each node's ``deps``; ``None`` when malformed."""
    edges = []
    for e in plan.get("edges") or []:
        if isinstance(e, dict) and "from" in e and "to" in e:
            edges.append((e["from"], e["to"]))
        elif isinstance(e, (list, tuple)) and len(e) == 2:
            edges.append((e[0], e[1]))
        else:
            return None
    for n in plan["nodes"]:
        for d in (n.get("deps") or []) if isinstance(n, dict) else []:
            edges.append((d, n.get("id")))
    return edges


def is_acyclic(ids: list, edges: list[tuple]) -> bool:
    """Kahn's algorithm: every node can be put in a topological order."""
    indeg = {i: 0 for i in ids}
    out: dict = {i: [] for i in ids}
    for a, b in edges:
        out[a].append(b)
        indeg[b] += 1
    queue = deque(i for i in ids if indeg[i] == 0)
    seen = 0
    while queue:
        i = queue.popleft()
        seen += 1
        for j in out[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                queue.append(j)
    return seen == len(ids)


def dag_structure(plan: dict | None) -> tuple[bool, list[str]]:
    """``(valid DAG, node tools)``: nodes are objects with a unique ``id`` and a ``tool`` name, every edge joins
    two known nodes, no self-loop, no cycle."""
    if plan is None or not plan["nodes"]:
        return False, []
    nodes = plan["nodes"]
    if not all(isinstance(n, dict) and "id" in n and isinstance(n.get("tool"), str) for n in nodes):
        return False, []
    ids = [n["id"] for n in nodes]
    try:
        if len(set(ids)) != len(ids):
            return False, []
    except TypeError:  # unhashable ids
        return False, []
    edges = dag_edges(plan)
    if edges is None or any(a not in ids or b not in ids or a == b for a, b in edges):
        return False, []
    return is_acyclic(ids, edges), [n["tool"] for n in nodes]


def multiset_f1(pred: list, gold: list) -> float:
    if not pred and not gold:
        return 1.0
    hit = sum((Counter(pred) & Counter(gold)).values())
    if hit == 0:
        return 0.0
    p, r = hit / len(pred), hit / len(gold)
    return 2 * p * r / (p + r)


class DAGPlanReward:
    """DAG tool-plan reward for plan-execute agents (seed 000-119, "Planner-centric Plan-Execute with global
    DAG planning").

    The planner's first turn holds a JSON plan ``{"nodes": [{"id": ..., "tool": ..., "args": {...}}, ...],
    "edges": [[from, to], ...]}`` (or each node's ``deps``)::

        R = 0                                         if no plan parses, or it is not a DAG
        R = dag_structure_weight + (1 - dag_structure_weight) * F1(plan tools, reference tools)   otherwise

    A DAG: at least one node, unique ids, every node names a tool, every edge joins two known nodes, no
    self-loop and no cycle (Kahn's topological sort). Tool selection: the multiset F1 of the nodes' tools
    against the data column ``dag_gold_tools_column`` (a list of tool names, or an integer count of
    ``dag_count_tool``: ``search_qa``'s ``searches_needed`` asks for one ``search`` node per hop;
    ``dag_gold_tools_column: ''`` scores structure only, R = 1 for any valid DAG). The plan
    is read from the first model turn of the episode (the planner acts first, the executor after), or from
    the completion in a single-turn rollout.

    Provenance: reconstructed from the abstract — a global DAG of tool nodes from the planner, rewarded in GRPO
    for "tool selection accuracy and global planning awareness": the JSON format, the validity gate (parse,
    known nodes, acyclic) and the tool-multiset F1 are grpolab's (the paper's ComplexTool-Plan reward is not
    reproduced).
    """

    def __init__(self, *, dag_structure_weight: float = param(0.5, 'DAG plan: reward of a valid DAG before tool '
                                                               'selection (the rest is the tool F1)'),
                 dag_gold_tools_column: str = param('gold_tools', "DAG plan: data column with the reference tools "
                                                    "(list of names, or a count of dag_count_tool); '' = structure "
                                                    'only'),
                 dag_count_tool: str = param('search', 'DAG plan: the tool a count in dag_gold_tools_column counts '
                                             "(search_qa's searches_needed: that many search nodes)")):
        if not 0.0 <= dag_structure_weight <= 1.0:
            raise ValueError(f"dag_structure_weight: must be in [0, 1], got {dag_structure_weight}")
        self.w, self.column, self.count_tool = dag_structure_weight, dag_gold_tools_column, dag_count_tool
        self.__name__ = "dag_plan"

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        eps = columns.get(EPISODE) or [None] * len(completions)
        gold = (data_column(columns, self.column, "dag_plan", "dag_gold_tools_column") if self.column
                else [None] * len(completions))
        out = []
        for c, e, g in zip(completions, eps, gold):
            turns = (e or {}).get("turns") or []
            text = str(turns[0].get("text") or "") if turns else completion_text(c)
            ok, tools = dag_structure(parse_dag(text))
            if not ok:
                out.append(0.0)
            elif not self.column:
                out.append(1.0)
            else:
                ref = [self.count_tool] * g if isinstance(g, int) and not isinstance(g, bool) else \
                    [str(t) for t in _as_list(g)]
                out.append(self.w + (1 - self.w) * multiset_f1(tools, ref))
        return out


_spec("dag_plan", DAGPlanReward)
