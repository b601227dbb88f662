"""Transforms of agent episodes and team runs: OTC's tool-call productivity, SEM's search efficiency and
GraphRAG-R1's phase-dependent retrieval rewards (the episode helpers are in ``rewards/agentic.py``), the CTDE
joint reward of a team episode, and the failure scores of the ``lm_program`` rollout."""
from __future__ import annotations

import math

import torch

from ...registry import REWARD_TRANSFORMS, param
from ...roles import TEAM_ANSWER_ROLE
from ..agentic import ANSWER_COLUMN, count_tool_calls, data_column, episodes_of, final_text, token_f1, tool_names
from ..answers import extract_answer
from .common import CORRECT_REWARD, CORRECT_THRESHOLD, _groups, correct_rows


# ---------------------------------------------------------------- OTC tool-integrated reward (000-68)

def otc_ppo_tool_reward(m: int, c: float = 1.0) -> float:
    """OTC-PPO tool reward ``cos(m pi / (2m + c))`` (1 for ``m = 0``, falling towards 0 as ``m`` grows)."""
    return math.cos(m * math.pi / (2 * m + c))


def otc_grpo_tool_reward(m: int, n: int, c: float = 1.0) -> float:
    """OTC-GRPO tool reward for ``m`` calls when the group's optimal count is ``n``::

        f(m, n) = 0 if m = n = 0;  m if n = 0;  2 n m / (m + n) otherwise
        r_tool  = 1 if f(m, n) = n = 0;  cos(m pi / (2m + c)) if n = 0;  sin(f(m, n) pi / (2n)) otherwise
    """
    if n == 0:
        return 1.0 if m == 0 else otc_ppo_tool_reward(m, c)
    f = 2.0 * n * m / (m + n)
    return math.sin(f * math.pi / (2 * n))


@REWARD_TRANSFORMS.register("otc_tool_reward", needs=("text",))
def otc_tool_reward(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                    reward_names: list[str], batch, *,
                    otc_variant: str = param('grpo', 'OTC: grpo (optimal count n = fewest calls among the '
                                             "group's correct episodes) or ppo (n = 0: every call costs)",
                                             ['grpo', 'ppo']),
                    otc_c: float = param(1.0, 'OTC: smoothing constant c in cos(m pi / (2m + c))'),
                    otc_alpha: float = param(1.0, 'OTC: scale alpha of the tool-integrated reward'),
                    otc_tools: str = param('', 'OTC: comma-separated tool names whose calls count (empty: every '
                                           'tool call)'),
                    shaping_correct_reward: str = CORRECT_REWARD,
                    shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """OTC tool-integrated reward (Wang et al., 2025, "Acting Less is Reasoning More! Teaching Model to Act
    Efficiently" / "OTC: Optimal Tool Calls via Reinforcement Learning", arXiv:2504.14870; seed 000-68).

    ``r' = alpha * r_tool(m, n) * r``: the task reward ``r`` (the combined reward of the row) scaled by the
    tool productivity term, with ``m`` the number of tool calls of the episode::

        OTC-PPO:   r_tool = cos(m pi / (2m + c))
        OTC-GRPO:  f(m, n) = 0 if m = n = 0;  m if n = 0;  2nm / (m + n) otherwise
                   r_tool = 1 if f(m, n) = n = 0;  cos(m pi / (2m + c)) if n = 0;  sin(f(m, n) pi / (2n)) otherwise

    OTC-GRPO's optimal count ``n`` is the fewest tool calls among the *correct* episodes of the row's group
    (the G episodes of one question); ``sin(f pi / 2n)`` is 1 at ``m = n`` and falls on both sides (too few
    and too many calls), ``cos`` punishes any call when the question needs none. Because ``r_tool``
    multiplies ``r``, a wrong answer (``r = 0``) earns nothing whatever its calls. Choices: a group with no
    correct episode has no optimal count; its rows are left unchanged (``r_tool = 1``). ``otc_tools`` limits
    the count to some tools (default every call). NaN rows stay NaN.

    Provenance: paper equations — OTC (Wang et al., 2025, arXiv:2504.14870), the OTC-PPO and OTC-GRPO tool
    rewards and r = alpha * r_tool * r_phi (equation numbers not recorded); no authors' code was found (the code
    index has only third-party reimplementations, which agree on these formulas); the unchanged group without a
    correct episode is grpolab's choice. Test: tests/test_agent_rewards.py::test_otc_tool_reward_hand_computed.
    """
    if otc_variant not in ("grpo", "ppo"):
        raise ValueError(f"otc_variant: expected grpo or ppo, got '{otc_variant}'")
    eps = episodes_of(batch.columns, "otc_tool_reward")
    names = tool_names(otc_tools)
    m = [count_tool_calls(e, names) for e in eps]
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold)
    factor = torch.ones(len(rewards), dtype=torch.float64)
    for idx in _groups(group_ids):
        idx = idx.tolist()
        if otc_variant == "ppo":
            for i in idx:
                factor[i] = otc_ppo_tool_reward(m[i], otc_c)
            continue
        good = [m[i] for i in idx if correct[i]]
        if not good:
            continue
        n = min(good)
        for i in idx:
            factor[i] = otc_grpo_tool_reward(m[i], n, otc_c)
    return rewards * (otc_alpha * factor).to(rewards.dtype)


# ---------------------------------------------------------------- SEM search efficiency (000-71)

@REWARD_TRANSFORMS.register("sem_search_reward", needs=("text",))
def sem_search_reward(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                      reward_names: list[str], batch, *,
                      sem_search_tools: str = param('search', 'SEM: comma-separated names of the search tools'),
                      sem_unnecessary_penalty: float = param(0.5, 'SEM: subtracted from a correct answer that '
                                                             'searched when the question needed no search'),
                      sem_missing_penalty: float = param(0.0, 'SEM: subtracted from a wrong answer that did not '
                                                         'search when the question needed it'),
                      sem_need_column: str = param('', "SEM: boolean data column 'this question needs retrieval' "
                                                   "(empty: decided from the group, see the docstring)"),
                      shaping_correct_reward: str = CORRECT_REWARD,
                      shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """SEM search-efficiency reward (Sha, Cui and Wang, 2025, "SEM: Reinforcement Learning for Search-Efficient
    Large Language Models", arXiv:2505.07903; seed 000-71).

    The reward "encourages accurate answering without unnecessary search while promoting effective retrieval
    when needed". With ``s_i`` = the episode called a search tool, ``c_i`` = correct and ``need`` = the
    question needs retrieval::

        r'_i = r_i - sem_unnecessary_penalty   if c_i and s_i and not need   (redundant search)
             = r_i - sem_missing_penalty       if not c_i and not s_i and need  (should have searched)
             = r_i                             otherwise (correct without search, or with a needed search)

    ``need`` comes from the boolean data column ``sem_need_column`` when set (the paper's data mixes MuSiQue,
    which needs retrieval, and MMLU, which does not); otherwise from the group: the question needs no search
    when at least one *correct* episode of its group used none (the model showed it can answer from its own
    knowledge), and needs it otherwise. NaN rows stay NaN.

    Provenance: reconstructed from the abstract — the penalty for a correct answer reached with an unnecessary
    search, the optional penalty for a missing needed search, and the group-based decision of "needed" (or a
    data column) are grpolab's; the paper's exact reward, template and constants are not reproduced.
    """
    eps = episodes_of(batch.columns, "sem_search_reward")
    names = tool_names(sem_search_tools)
    searched = [count_tool_calls(e, names) > 0 for e in eps]
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold).tolist()
    need = [True] * len(rewards)
    if sem_need_column:
        col = data_column(batch.columns, sem_need_column, "sem_search_reward", "sem_need_column")
        need = [bool(v) for v in col]
    else:
        for idx in _groups(group_ids):
            idx = idx.tolist()
            direct = any(correct[i] and not searched[i] for i in idx)
            for i in idx:
                need[i] = not direct
    out = rewards.clone()
    for i in range(len(rewards)):
        if correct[i] and searched[i] and not need[i]:
            out[i] = rewards[i] - sem_unnecessary_penalty
        elif not correct[i] and not searched[i] and need[i]:
            out[i] = rewards[i] - sem_missing_penalty
    return out


# ---------------------------------------------------------------- GraphRAG-R1 phases (000-63)

def pra_reward(n: int, gamma: float) -> float:
    """Progressive retrieval attenuation: the k-th retrieval earns ``(1 - gamma) gamma^(k-1)``, so ``n``
    retrievals earn ``1 - gamma^n`` (0 for none, rising with diminishing steps towards 1)."""
    return 1.0 - gamma ** n


def caf_reward(f1: float, n: int, lam: float) -> float:
    """Cost-aware F1: ``F1 * exp(-lambda n)`` for ``n`` retrievals."""
    return f1 * math.exp(-lam * n)


def graphrag_phase(step: int, pra_start: int, caf_start: int) -> int:
    """Training phase at ``step``: 1 cold start (``step < pra_start``), 2 PRA, 3 CAF (``step >= caf_start``)."""
    if caf_start < pra_start:
        raise ValueError(f"graphrag_caf_start ({caf_start}) must be >= graphrag_pra_start ({pra_start})")
    return 1 if step < pra_start else (2 if step < caf_start else 3)


@REWARD_TRANSFORMS.register("graphrag_r1_phases", needs=("text",))
def graphrag_r1_phases(rewards: torch.Tensor, batch, step: int, *,
                       graphrag_pra_start: int = param(20, 'GraphRAG-R1: first step of phase 2 (PRA reward); '
                                                       'steps before it are the cold start'),
                       graphrag_caf_start: int = param(40, 'GraphRAG-R1: first step of phase 3 (CAF reward '
                                                       'instead of PRA)'),
                       graphrag_pra_gamma: float = param(0.5, 'GraphRAG-R1: attenuation gamma of each further '
                                                         'retrieval in PRA'),
                       graphrag_pra_weight: float = param(0.5, 'GraphRAG-R1: weight of the PRA reward in phase 2'),
                       graphrag_caf_lambda: float = param(0.1, 'GraphRAG-R1: cost rate lambda of CAF, '
                                                          'F1 * exp(-lambda n)'),
                       graphrag_caf_weight: float = param(1.0, 'GraphRAG-R1: weight of the CAF reward in phase 3'),
                       graphrag_retrieval_tools: str = param('search', 'GraphRAG-R1: comma-separated names of '
                                                             'the retrieval tools (empty: every tool call)'),
                       agent_answer_column: str = ANSWER_COLUMN) -> torch.Tensor:
    """GraphRAG-R1 PRA and CAF rewards with the phase-dependent schedule (Yu et al., 2025, "GraphRAG-R1:
    Graph Retrieval-Augmented Generation with Process-Constrained Reinforcement Learning", arXiv:2507.23581;
    seed 000-63).

    Three training phases by the training ``step`` (the scorer passes it; the schedule is a pure function of
    it, so a resumed run continues in the right phase), with ``n`` = retrieval calls of the episode and
    ``F1`` = token F1 of the final answer (``Answer:`` line or ``\\boxed{}``) against ``agent_answer_column``::

        phase 1, step < pra_start:              r' = r                                (cold start: task rewards)
        phase 2, pra_start <= step < caf_start: r' = r + w_pra * PRA(n),  PRA(n) = 1 - gamma^n
        phase 3, step >= caf_start:             r' = r + w_caf * CAF,     CAF = F1 * exp(-lambda n)

    PRA ("encourage essential retrievals", against shallow retrieval): each further retrieval is worth
    ``gamma`` times the previous one, so the first calls pay and extra calls pay less and less. CAF ("balance
    performance with computational cost", against over-thinking): the answer's F1 discounted by the number of
    retrievals. ``r`` is the task's own reward (accuracy, format). NaN rows stay NaN.

    Provenance: reconstructed from the abstract — the three phases and the two reward names are the paper's;
    the functional forms 1 - gamma^n and F1 * exp(-lambda n), adding them to the task reward, the phase
    boundaries and constants are grpolab's (the authors' repository, https://github.com/ycygit/GraphRAG-R1,
    holds evaluation and retrieval-server code but no training reward).
    """
    phase = graphrag_phase(int(step), graphrag_pra_start, graphrag_caf_start)
    if phase == 1:
        return rewards
    eps = episodes_of(batch.columns, "graphrag_r1_phases")
    names = tool_names(graphrag_retrieval_tools)
    n = [count_tool_calls(e, names) for e in eps]
    if phase == 2:
        bonus = [graphrag_pra_weight * pra_reward(k, graphrag_pra_gamma) for k in n]
    else:
        gold = data_column(batch.columns, agent_answer_column, "graphrag_r1_phases", "agent_answer_column")
        comps = batch.columns.get("completion", [None] * len(eps))
        bonus = []
        for e, k, g, c in zip(eps, n, gold, comps):
            pred = extract_answer(final_text(e, c))
            bonus.append(graphrag_caf_weight * caf_reward(token_f1(pred, g) if pred is not None else 0.0, k,
                                                          graphrag_caf_lambda))
    return rewards + torch.tensor(bonus, dtype=rewards.dtype)


# ---------------------------------------------------------------------------------------- CTDE joint reward
def ctde_costs(transcript: list[dict], answer_role: str | None) -> tuple[int, int]:
    """``(turns, coordination characters)`` of one team episode's transcript (``team_transcript``): every turn
    of every role, and the characters of every message but the answer role's last (its answer)."""
    turns = sum(len(seat["turns"]) for seat in transcript)
    answer = answer_role if answer_role is not None else transcript[-1]["role"]
    chars = 0
    for seat in transcript:
        msgs = seat["turns"][:-1] if seat["role"] == answer else seat["turns"]
        chars += sum(len(m) for m in msgs)
    return turns, chars


@REWARD_TRANSFORMS.register("ctde_joint_reward", needs=("text",))
def ctde_joint_reward(rewards: torch.Tensor, batch, *,
                      ctde_quality_weight: float = param(1.0, "CTDE joint reward: weight of the task quality (the "
                                                         "combined task reward)"),
                      ctde_speed_weight: float = param(0.05, "CTDE joint reward: cost per turn the team took"),
                      ctde_cost_weight: float = param(0.05, "CTDE joint reward: cost per 100 characters of "
                                                      "coordination messages"),
                      team_answer_role: str | None = TEAM_ANSWER_ROLE) -> torch.Tensor:
    """The simplified joint reward of CTDE multi-agent GRPO (LLM cooperation as a Dec-POMDP, centralised
    training with decentralised execution; seed 000-09), for the ``team`` rollout::

        R_joint = w_q R  -  w_s (turns of the team episode)  -  w_c (coordination characters / 100)

    ``R`` is the team's task reward (shared by every role with ``team_reward: cooperative``), turns count every
    role's turns, coordination characters every message but the answer role's final one
    (:func:`ctde_costs`, read from the column ``team_transcript``). Every role of a team episode gets the same
    ``R_joint`` (the global signal of centralised training); each role still acts on its own observation
    (decentralised execution: the team rollout). NaN rows stay NaN.

    Provenance: reconstructed from the abstract — the abstract names a "simplified joint reward that balances task
    quality, speed, and coordination cost" and GRPO with global signals under CTDE; the paper and its code were
    not located (searched: the code corpus for CTDE multi-agent GRPO); the linear form, the two counts and the
    weights are grpolab's choices.
    """
    transcripts = data_column(batch.columns, "team_transcript", "ctde_joint_reward", "rollout_strategy team")
    cost = torch.tensor([ctde_speed_weight * t + ctde_cost_weight * c / 100.0
                         for t, c in (ctde_costs(tr, team_answer_role) for tr in transcripts)],
                        dtype=rewards.dtype)
    return ctde_quality_weight * rewards - cost


# ------------------------------------------------------------------------------------ LM programs (mmGRPO)

LM_PROGRAM_FAILURE_KEY = "lm_program_failure"  # row_data key the lm_program rollout (rollouts/lm_program.py) writes


@REWARD_TRANSFORMS.register("lm_program_failures")
def lm_program_failures(rewards: torch.Tensor, batch) -> torch.Tensor:
    """The failure scores of the ``lm_program`` rollout: a call of a run whose program raised gets its fixed
    score, every other call keeps its reward::

        r_i' = f_i  if the run of call i failed (f_i = lm_program_format_failure_score after a FormatFailure,
                    lm_program_failure_score after another exception with lm_program_on_error: score)
        r_i' = r_i  otherwise

    ``f_i`` is ``batch.row_data['lm_program_failure']`` (NaN: the run did not fail), written by the rollout;
    the transform must come last, so no other transform changes a failure score.

    Provenance: authors' code — https://github.com/stanfordnlp/dspy dspy/teleprompt/bootstrap_trace.py
    (bootstrap_trace_data: a FailedPrediction scores its format_reward or format_failure_score) and
    dspy/teleprompt/grpo.py (GRPO: failure_score 0, format_failure_score -1, failure_score > format_failure_score);
    notes: the scores are set on the combined reward of every call of the failed run. Test:
    tests/test_lm_program.py::test_interrupted_and_format_failed_runs.
    """
    fixed = batch.row_data.get(LM_PROGRAM_FAILURE_KEY) if batch is not None else None
    if fixed is None:
        raise ValueError("lm_program_failures: the batch has no row_data['lm_program_failure']; this transform "
                         "goes with rollout_strategy: lm_program")
    fixed = fixed.to(rewards.dtype)
    return torch.where(torch.isnan(fixed), rewards, fixed)
