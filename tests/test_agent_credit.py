"""Credit assignment over agent episodes (issue 13): GiGPO, SALT, GTPO (turns), Flow-GRPO, Step-GRPO, HRPO, and
the span-based components (DTPO, rank_ratio, the LLDS action gate) on real multi-turn spans.

Batches are built by hand the way the agent rollout writes them (grpolab.agents.base): one row per episode,
model turns SAMPLED with loss mask 1, observations ENVIRONMENT with loss mask 0, span ids 1, 2, 3, ... (turn 1,
its observation, turn 2, ...), and the episode record in ``batch.columns["episode"]``. Expected values are
written out from the papers' / authors' formulas (numbers by hand, in comments), never by calling grpolab.
"""
import math

import pytest
import torch

import grpolab  # noqa: F401  (registers every component)
from grpolab.agents.base import EPISODE_COLUMN, EpisodeRecord, ToolCall, TurnRecord
from grpolab.algorithms import agentic
from grpolab.algorithms.advantages import group_zscore
from grpolab.batch import ENVIRONMENT, SAMPLED, RolloutBatch
from grpolab.registry import ADVANTAGES, POLICY_LOSSES, REGULARIZERS

EPS = 1e-4


def turn(n_tokens, *, text="t", obs="o", obs_tokens=1, state=None, reward=None, code=None):
    """One model turn spec: n_tokens model tokens, then obs_tokens observation tokens (none when obs is None)."""
    calls = [ToolCall("python", {"code": code}, output="ok")] if code is not None else []
    return dict(n=n_tokens, text=text, obs=obs, obs_n=obs_tokens if obs is not None else 0, state=state,
                reward=reward, calls=calls)


def agent_batch(episodes, group_ids=None, extra_columns=None):
    """A RolloutBatch with one row per episode (list of turn specs), as the agent rollout packs it."""
    R = len(episodes)
    T = max(sum(t["n"] + t["obs_n"] for t in ep) for ep in episodes)
    mask = torch.zeros(R, T)
    origin = torch.full((R, T), SAMPLED, dtype=torch.int8)
    spans = torch.zeros(R, T, dtype=torch.long)
    present = torch.zeros(R, T, dtype=torch.long)
    records = []
    for i, ep in enumerate(episodes):
        pos, span, turns = 0, 0, []
        for t in ep:
            span += 1
            mask[i, pos:pos + t["n"]] = 1
            spans[i, pos:pos + t["n"]] = span
            present[i, pos:pos + t["n"]] = 1
            rec = TurnRecord(span=span, text=t["text"], tool_calls=t["calls"], observation=t["obs"],
                             reward=t["reward"], state=t["state"])
            pos += t["n"]
            if t["obs"] is not None:
                span += 1
                origin[i, pos:pos + t["obs_n"]] = ENVIRONMENT
                spans[i, pos:pos + t["obs_n"]] = span
                present[i, pos:pos + t["obs_n"]] = 1
                rec.obs_span = span
                pos += t["obs_n"]
            turns.append(rec)
        records.append(EpisodeRecord(turns=turns).as_dict())
    gids = torch.zeros(R, dtype=torch.long) if group_ids is None else torch.as_tensor(group_ids)
    cols = {EPISODE_COLUMN: records, **(extra_columns or {})}
    return RolloutBatch(prompt_ids=torch.zeros(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1, dtype=torch.long),
                        completion_ids=torch.ones(R, T, dtype=torch.long), completion_mask=mask,
                        behavior_logprobs=torch.zeros(R, T), group_ids=gids, prompt_uids=gids.clone(),
                        truncated=torch.zeros(R, dtype=torch.bool), completion_attention_mask=present,
                        token_origin=origin, span_ids=spans, columns=cols)


def adv(name, batch, rewards, **params):
    r = torch.tensor(rewards, dtype=torch.float32)
    return ADVANTAGES.get(name)(r, batch.group_ids, batch.completion_mask, batch, advantage_epsilon=EPS, **params)


def turn_value(out, batch, row, k):
    """The advantage on turn k of row (every token of the turn must carry the same value)."""
    span = batch.columns[EPISODE_COLUMN][row]["turns"][k]["span"]
    vals = out[row][batch.span_ids[row] == span]
    assert torch.allclose(vals, vals[0].expand_as(vals))
    return float(vals[0])


def assert_obs_zero(out, batch):
    assert float(out[batch.token_origin == ENVIRONMENT].abs().sum()) == 0.0


def test_episode_column_name_matches_the_contract():
    assert agentic.EPISODE_COLUMN == EPISODE_COLUMN


# ------------------------------------------------------------------------------------------------- GiGPO


def gigpo_batch():
    """E0: states A, B (R=1); E1: A, C, B (R=0); E2: A (R=0). Unequal lengths, a recurring state B."""
    return agent_batch([
        [turn(2, state="A"), turn(3, state="B", obs=None)],
        [turn(1, state="A"), turn(2, state="C"), turn(1, state="B", obs=None)],
        [turn(2, state="A", obs=None)],
    ])


def test_gigpo_matches_authors_formula_by_hand():
    """verl-agent gigpo/core_gigpo.py, mode mean_std_norm, compute_mean_std_cross_steps=True, gamma 0.5, w 1."""
    b = gigpo_batch()
    out = adv("gigpo", b, [1.0, 0.0, 0.0], gigpo_gamma=0.5, gigpo_step_weight=1.0)
    # episode level over step rows: [1, 1, 0, 0, 0, 0]: mean 1/3, ss = 2 (2/3)^2 + 4 (1/3)^2 = 4/3,
    # std = sqrt(4/3 / 5) = 0.5163978
    s_e = math.sqrt((4 / 3) / 5)
    ae = [(1 - 1 / 3) / (s_e + EPS), (0 - 1 / 3) / (s_e + EPS), (0 - 1 / 3) / (s_e + EPS)]
    # step returns, outcome on the last turn, gamma 0.5: E0 [0.5, 1], E1 [0, 0, 0], E2 [0]
    # state A: {0.5, 0, 0}: mean 1/6, std = sqrt((1/9 + 1/36 + 1/36) / 2) = sqrt(1/12) = 0.2886751
    s_a = math.sqrt(1 / 12)
    a_e0t0, a_zero_a = (0.5 - 1 / 6) / (s_a + EPS), (0 - 1 / 6) / (s_a + EPS)
    # state B: {1 (E0 t1), 0 (E1 t2)}: mean 0.5, std sqrt(0.5)
    a_e0t1, a_e1t2 = 0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS)
    # state C: E1 t1 alone -> 0
    expect = {(0, 0): ae[0] + a_e0t0, (0, 1): ae[0] + a_e0t1,
              (1, 0): ae[1] + a_zero_a, (1, 1): ae[1] + 0.0, (1, 2): ae[1] + a_e1t2,
              (2, 0): ae[2] + a_zero_a}
    for (i, k), v in expect.items():
        assert turn_value(out, b, i, k) == pytest.approx(v, abs=1e-5), (i, k)
    assert_obs_zero(out, b)
    assert out.shape == b.completion_mask.shape


def test_gigpo_mean_norm_episode_stats_and_env_rewards():
    """mean_norm (no std), episode statistics over episodes, the environment's step rewards, w = 0.5."""
    b = agent_batch([
        [turn(1, state="A", reward=0.0), turn(1, state="B", reward=1.0, obs=None)],
        [turn(1, state="A", reward=0.5), turn(1, state="B", reward=0.0, obs=None)],
    ])
    out = adv("gigpo", b, [2.0, 0.0], gigpo_gamma=0.5, gigpo_step_weight=0.5, gigpo_norm="mean_norm",
              gigpo_episode_stats="episodes", gigpo_step_rewards="env")
    # episode: mean(2, 0) = 1 -> +1, -1
    # returns gamma 0.5: E0 [0 + .5 * 1, 1] = [.5, 1]; E1 [.5 + 0, 0] = [.5, 0]
    # state A {.5, .5}: 0, 0; state B {1, 0}: mean .5 -> +.5, -.5
    assert [turn_value(out, b, 0, k) for k in range(2)] == pytest.approx([1 + 0.0, 1 + 0.5 * 0.5])
    assert [turn_value(out, b, 1, k) for k in range(2)] == pytest.approx([-1 + 0.0, -1 - 0.5 * 0.5])


def test_gigpo_reduces_to_grpo_on_single_turn_episodes():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5]
    g = [0, 0, 0, 1, 1, 1]
    grpo = group_zscore(torch.tensor(rewards), torch.tensor(g), advantage_epsilon=EPS)
    # all states distinct: every step group is a singleton (A^S = 0)
    b = agent_batch([[turn(2, state=f"s{i}", obs=None)] for i in range(6)], group_ids=g)
    out = adv("gigpo", b, rewards)
    assert out[:, 0].tolist() == pytest.approx(grpo.tolist(), abs=1e-6)
    # omega = 0 with shared states
    b = agent_batch([[turn(2, state="same", obs=None)] for _ in range(6)], group_ids=g)
    assert adv("gigpo", b, rewards, gigpo_step_weight=0.0)[:, 0].tolist() == pytest.approx(grpo.tolist(), abs=1e-6)
    # one shared initial state: the step level equals the episode level (returns = R with one turn)
    assert adv("gigpo", b, rewards)[:, 0].tolist() == pytest.approx((2 * grpo).tolist(), abs=1e-5)


def test_gigpo_anchor_state_missing_is_an_error_and_history_builds_it():
    b = agent_batch([[turn(1), turn(1, obs=None)], [turn(1), turn(1, text="u", obs=None)]])
    with pytest.raises(ValueError, match="no anchor state.*gigpo_anchor: history"):
        adv("gigpo", b, [1.0, 0.0])
    out = adv("gigpo", b, [1.0, 0.0], gigpo_anchor="history", gigpo_gamma=0.5)
    # turn 0: same (empty) history for both: returns .5, 0 -> +-.25/(std .353553)
    z0 = 0.25 / (math.sqrt(0.125) + EPS)
    # turn 1: history [("t", "o")] for both: returns 1, 0 -> +-.5/.707107
    z1 = 0.5 / (math.sqrt(0.5) + EPS)
    ze = 0.5 / (math.sqrt(0.5) + EPS)  # episode level over steps [1, 1, 0, 0]: mean .5, std sqrt(1/3)
    ze = 0.5 / (math.sqrt(1 / 3) + EPS)
    assert [turn_value(out, b, 0, k) for k in range(2)] == pytest.approx([ze + z0, ze + z1], abs=1e-5)
    assert [turn_value(out, b, 1, k) for k in range(2)] == pytest.approx([-ze - z0, -ze - z1], abs=1e-5)


def test_agent_estimators_need_the_episode_record():
    b = agent_batch([[turn(1, obs=None)], [turn(1, obs=None)]])
    b.columns.pop(EPISODE_COLUMN)
    for name in ("gigpo", "salt", "gtpo_turn", "flow_grpo", "step_grpo"):
        with pytest.raises(ValueError, match=r"episode record.*rollout_strategy: agent"):
            adv(name, b, [1.0, 0.0])


def test_loss_tokens_outside_every_turn_are_an_error():
    b = agent_batch([[turn(2, obs=None)], [turn(2, obs=None)]])
    b.span_ids[0, 1] = 7  # a trained token that no turn of the record owns
    with pytest.raises(ValueError, match=r"span ids \[7\]"):
        adv("flow_grpo", b, [1.0, 0.0])


def test_nan_rows_get_zero_and_leave_the_statistics():
    b = agent_batch([[turn(1, state="A", obs=None)]] * 3)
    out = adv("gigpo", b, [1.0, 0.0, float("nan")], gigpo_step_weight=0.0)
    z = 0.5 / (math.sqrt(0.5) + EPS)
    assert out[:, 0].tolist() == pytest.approx([z, -z, 0.0], abs=1e-6)


# -------------------------------------------------------------------------------------------------- SALT


def test_salt_trajectory_graph_by_hand():
    # E0: a, b (R=1); E1: a, c (R=0); E2: d (R=1); E3: a, b, e (R=0); every observation "o"
    b = agent_batch([
        [turn(1, text="a"), turn(1, text="b", obs=None)],
        [turn(1, text="a"), turn(1, text="c", obs=None)],
        [turn(1, text="d", obs=None)],
        [turn(1, text="a"), turn(1, text="b"), turn(1, text="e", obs=None)],
    ])
    out = adv("salt", b, [1.0, 0.0, 1.0, 0.0])
    z = 0.5 / (math.sqrt(1 / 3) + EPS)  # GRPO: mean .5, std sqrt(1/3) -> +-z
    # node "a" (E0, E1, E3): (z - z - z)/3; node "a,b" (E0, E3): 0; "a,c": -z; "d": z; "a,b,e": -z
    assert [turn_value(out, b, 0, k) for k in range(2)] == pytest.approx([-z / 3, 0.0], abs=1e-5)
    assert [turn_value(out, b, 1, k) for k in range(2)] == pytest.approx([-z / 3, -z], abs=1e-5)
    assert turn_value(out, b, 2, 0) == pytest.approx(z, abs=1e-5)
    assert [turn_value(out, b, 3, k) for k in range(3)] == pytest.approx([-z / 3, 0.0, -z], abs=1e-5)
    assert_obs_zero(out, b)


def test_salt_distinct_steps_is_grpo_and_state_action_nodes():
    rewards, g = [1.0, 0.0, 0.5, 0.0], [0, 0, 1, 1]
    grpo = group_zscore(torch.tensor(rewards), torch.tensor(g), advantage_epsilon=EPS)
    b = agent_batch([[turn(1, text=f"x{i}"), turn(2, text="same", obs=None)] for i in range(4)], group_ids=g)
    out = adv("salt", b, rewards)  # histories differ from the first turn on: no shared node
    for i in range(4):
        assert [turn_value(out, b, i, k) for k in range(2)] == pytest.approx([float(grpo[i])] * 2, abs=1e-6)
    # state_action merges "same" action from the same state across different histories
    b = agent_batch([[turn(1, text=f"x{i}", state="s0"), turn(2, text="same", state="s1", obs=None)]
                     for i in range(2)])
    out = adv("salt", b, [1.0, 0.0], salt_node="state_action")
    z = 0.5 / (math.sqrt(0.5) + EPS)
    assert [turn_value(out, b, 0, k) for k in range(2)] == pytest.approx([z, 0.0], abs=1e-5)
    with pytest.raises(ValueError, match="salt_node: history"):
        adv("salt", agent_batch([[turn(1, obs=None)]] * 2), [1.0, 0.0], salt_node="state_action")


# ------------------------------------------------------------------------------------------- GTPO (turns)


def test_gtpo_turn_returns_and_code_shaping_by_hand():
    b = agent_batch([
        [turn(1, reward=0.2, code="print(1+1)"), turn(2, obs=None)],   # R = 1
        [turn(2, code="print(1+2)"), turn(1, obs=None)],               # R = 0, code close to E0's
        [turn(1, obs=None)],                                           # R = 0, no code
    ])
    out = adv("gtpo_turn", b, [1.0, 0.0, 0.0], gtpo_gamma=0.5, gtpo_shaping_coef=0.5)
    # difflib ratio("print(1+2)", "print(1+1)") = 2 * 9 / 20 = 0.9 -> R'_1 = 0 + 0.5 * 0.9 = 0.45; R'_2 = 0
    # turn rewards: E0 [0.2, 1], E1 [0, .45], E2 [0]; returns gamma .5: E0 [.7, 1], E1 [.225, .45], E2 [0]
    G = [0.7, 1.0, 0.225, 0.45, 0.0]
    mean = sum(G) / 5                                        # .475
    std = math.sqrt(sum((x - mean) ** 2 for x in G) / 4)     # sqrt(.615 / 4) = .392110
    A = [(x - mean) / (std + EPS) for x in G]
    got = [turn_value(out, b, 0, 0), turn_value(out, b, 0, 1), turn_value(out, b, 1, 0), turn_value(out, b, 1, 1),
           turn_value(out, b, 2, 0)]
    assert got == pytest.approx(A, abs=1e-5)
    assert_obs_zero(out, b)


def test_gtpo_turn_index_norm_and_grpo_relation():
    b = agent_batch([[turn(1), turn(1, obs=None)], [turn(1, obs=None)], [turn(1), turn(1, obs=None)]])
    out = adv("gtpo_turn", b, [1.0, 0.0, 0.0], gtpo_gamma=0.5, gtpo_norm="turn_index", gtpo_shaping_coef=0.0)
    # returns: E0 [.5, 1], E1 [0], E2 [0, 0]; index 0 {.5, 0, 0}: mean 1/6, std sqrt(1/12); index 1 {1, 0}
    s0 = math.sqrt(1 / 12)
    assert turn_value(out, b, 0, 0) == pytest.approx((0.5 - 1 / 6) / (s0 + EPS), abs=1e-5)
    assert turn_value(out, b, 1, 0) == pytest.approx((0 - 1 / 6) / (s0 + EPS), abs=1e-5)
    assert turn_value(out, b, 0, 1) == pytest.approx(0.5 / (math.sqrt(0.5) + EPS), abs=1e-5)
    # one turn per episode, no shaping: GRPO
    rewards, g = [1.0, 0.0, 0.25, 0.5, 0.5, 1.0], [0, 0, 0, 1, 1, 1]
    grpo = group_zscore(torch.tensor(rewards), torch.tensor(g), advantage_epsilon=EPS)
    b = agent_batch([[turn(2, obs=None)] for _ in range(6)], group_ids=g)
    assert adv("gtpo_turn", b, rewards)[:, 0].tolist() == pytest.approx(grpo.tolist(), abs=1e-6)


def test_gtpo_env_rewards_needed_when_asked_for():
    b = agent_batch([[turn(1, obs=None)]] * 2)
    with pytest.raises(ValueError, match="gtpo_turn_rewards: env"):
        adv("gtpo_turn", b, [1.0, 0.0], gtpo_turn_rewards="env")


# ---------------------------------------------------------------------------------------------- Flow-GRPO


def test_flow_grpo_broadcasts_the_outcome_to_every_turn():
    b = agent_batch([[turn(1), turn(2, obs=None)], [turn(3, obs=None)], [turn(1), turn(1), turn(1, obs=None)]])
    out = adv("flow_grpo", b, [1.0, 0.0, 0.5])
    # turn samples [1, 1, 0, .5, .5, .5]: mean 3.5/6, ss = 2 (5/12)^2 + (7/12)^2 + 3 (1/12)^2 = 0.708333
    mean = 3.5 / 6
    std = math.sqrt((2 * (5 / 12) ** 2 + (7 / 12) ** 2 + 3 * (1 / 12) ** 2) / 5)
    for i, (r, K) in enumerate([(1.0, 2), (0.0, 1), (0.5, 3)]):
        assert [turn_value(out, b, i, k) for k in range(K)] == pytest.approx([(r - mean) / (std + EPS)] * K, abs=1e-5)
    assert_obs_zero(out, b)
    out = adv("flow_grpo", b, [1.0, 0.0, 0.5], flow_grpo_stats="episodes")  # mean .5, std .5
    assert turn_value(out, b, 2, 1) == pytest.approx(0.0, abs=1e-7)
    assert turn_value(out, b, 0, 1) == pytest.approx(0.5 / (0.5 + EPS), abs=1e-6)
    # one turn per episode: GRPO
    b1 = agent_batch([[turn(2, obs=None)]] * 3)
    grpo = group_zscore(torch.tensor([1.0, 0.0, 0.5]), torch.zeros(3, dtype=torch.long), advantage_epsilon=EPS)
    assert adv("flow_grpo", b1, [1.0, 0.0, 0.5])[:, 0].tolist() == pytest.approx(grpo.tolist(), abs=1e-6)


# ---------------------------------------------------------------------------------------------- Step-GRPO


def test_step_grpo_per_step_rewards_by_hand():
    b = agent_batch([
        [turn(1, reward=0.5), turn(1, obs=None)],                      # step rewards .5, final R = 1
        [turn(1, reward=0.0), turn(1, reward=1.0), turn(1, obs=None)],  # 0, 1, final R = 0
        [turn(1, obs=None)],                                          # final R = 1
    ])
    out = adv("step_grpo", b, [1.0, 0.0, 1.0])
    # step 0: {.5, 0, 1}: mean .5, std .5 -> 0, -1, +1 (times .5/(.5+eps)); step 1: {1 (E0 final), 1}: 0, 0
    # step 2: E1 alone -> 0
    z = 0.5 / (0.5 + EPS)
    assert [turn_value(out, b, 0, k) for k in range(2)] == pytest.approx([0.0, 0.0], abs=1e-6)
    assert [turn_value(out, b, 1, k) for k in range(3)] == pytest.approx([-z, 0.0, 0.0], abs=1e-6)
    assert turn_value(out, b, 2, 0) == pytest.approx(z, abs=1e-6)
    with pytest.raises(ValueError, match=r"step 0 of row 0 has no step reward"):
        adv("step_grpo", agent_batch([[turn(1), turn(1, obs=None)]] * 2), [1.0, 0.0])
    rewards = [1.0, 0.0, 0.0]
    b1 = agent_batch([[turn(2, obs=None)]] * 3)
    grpo = group_zscore(torch.tensor(rewards), torch.zeros(3, dtype=torch.long), advantage_epsilon=EPS)
    assert adv("step_grpo", b1, rewards)[:, 0].tolist() == pytest.approx(grpo.tolist(), abs=1e-6)


# --------------------------------------------------------------------------------------------------- HRPO


def test_hrpo_hop_cluster_baseline_by_hand():
    hops = [1, 1, 2, 2, 2, 1]
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    b = agent_batch([[turn(1, obs=None)]] * 6, group_ids=list(range(6)), extra_columns={"hops": hops})
    out = ADVANTAGES.get("hrpo")(rewards, b.group_ids, b, advantage_epsilon=EPS)
    # cluster 1: rows 0, 1, 5 = [1, 0, 1]; cluster 2: rows 2, 3, 4 = [1, 1, 0]: mean 2/3, std sqrt(1/3)
    s = math.sqrt(1 / 3)
    hi, lo = (1 / 3) / (s + EPS), (-2 / 3) / (s + EPS)
    assert out.tolist() == pytest.approx([hi, lo, hi, hi, lo, hi], abs=1e-5)
    # one hop count per prompt group: GRPO
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    b = agent_batch([[turn(1, obs=None)]] * 6, group_ids=g, extra_columns={"hops": [1, 1, 2, 2, 3, 3]})
    assert ADVANTAGES.get("hrpo")(rewards, g, b, advantage_epsilon=EPS).tolist() == pytest.approx(
        group_zscore(rewards, g, advantage_epsilon=EPS).tolist(), abs=1e-6)
    b.columns.pop("hops")
    with pytest.raises(ValueError, match="'hops'"):
        ADVANTAGES.get("hrpo")(rewards, g, b)
    assert ADVANTAGES.columns("hrpo") == ["hops"]


# ------------------------------------------------------- span-based components on real multi-turn spans


def tool_answer_batch():
    """Two episodes: a tool-call turn (2 tokens), an observation, an answer turn (2 tokens)."""
    b = agent_batch([[turn(2, code="x=1"), turn(2, obs=None)], [turn(2, code="x=2"), turn(2, obs=None)]])
    b.reward_names = ["tool", "acc"]
    return b


def test_dtpo_uses_tool_call_and_answer_turns_of_agent_episodes():
    b = tool_answer_batch()
    rm = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # row 0: good tool use, wrong answer; row 1 the reverse
    combined = torch.tensor([1.0, 1.0])  # equal combined reward: GRPO gives 0 everywhere
    fn = ADVANTAGES.get("span_decoupled_advantage")
    out = fn(combined, b.group_ids, rm, b.completion_mask, b, advantage_epsilon=EPS, span_mark="episode",
             span_reward_columns=["", "tool", "acc"])
    z = 0.5 / (math.sqrt(0.5) + EPS)
    # row 0: tool turn +z (tool 1 vs 0), answer turn -z (acc 0 vs 1); row 1 the reverse; observation 0
    assert out[0].tolist() == pytest.approx([z, z, 0.0, -z, -z], abs=1e-5)
    assert out[1].tolist() == pytest.approx([-z, -z, 0.0, z, z], abs=1e-5)
    grpo = group_zscore(combined, b.group_ids, advantage_epsilon=EPS)
    assert not torch.allclose(out, grpo[:, None] * b.completion_mask)
    # the documented relation: every span on the combined reward ('' columns) is GRPO
    same = fn(torch.tensor([1.0, 0.0]), b.group_ids, rm, b.completion_mask, b, advantage_epsilon=EPS,
              span_mark="episode", span_reward_columns=[""])
    assert same.flatten().tolist() == pytest.approx((torch.tensor([[z], [-z]]) * b.completion_mask).flatten().tolist(),
                                                  abs=1e-5)


def test_dtpo_episode_spans_without_episodes_is_a_reported_stand_in():
    from grpolab.errors import FallbackWarning
    b = tool_answer_batch()
    b.columns.pop(EPISODE_COLUMN)
    with pytest.warns(FallbackWarning, match="span ids"):
        ADVANTAGES.get("span_decoupled_advantage")(torch.tensor([1.0, 0.0]), b.group_ids, torch.zeros(2, 2),
                                                   b.completion_mask, b, span_mark="episode")


def _ratios_batch():
    b = tool_answer_batch()
    mask = b.completion_mask
    old = torch.zeros_like(mask)
    # turn 1 (tokens 0-1) ratio up, turn 2 (tokens 3-4) ratio down; token 2 is the observation (mask 0)
    logp = torch.tensor([[0.3, 0.3, 0.0, -0.4, -0.2], [0.1, -0.1, 0.0, 0.25, 0.25]]) * mask
    return b, logp, old, mask


def test_rank_ratio_on_agent_turns_differs_from_grpo_and_gspo():
    b, logp, old, mask = _ratios_batch()
    adv_t = torch.tensor([[1.0], [-1.0]]).expand_as(mask) * mask
    rank, _ = POLICY_LOSSES.get("rank_ratio")(logp, old, adv_t, mask, b, epsilon=0.2)
    token, _ = POLICY_LOSSES.get("clipped_ratio")(logp, old, adv_t, mask, epsilon=0.2)
    seq, _ = POLICY_LOSSES.get("sequence_ratio")(logp, old, adv_t, mask, epsilon=0.2)
    # hand: row 0, turn 1: w = exp(0.3) = 1.349859 -> clipped at 1.2 (A > 0): -1.2 per token, weight
    # |o|/(K |k|) = 4 / (2 * 2) = 1; turn 2: w = exp(-0.3) = 0.740818 -> -0.740818 per token
    assert rank[0].tolist() == pytest.approx([-1.2, -1.2, 0.0, -math.exp(-0.3), -math.exp(-0.3)], abs=1e-5)
    assert not torch.allclose(rank, token) and not torch.allclose(rank, seq)
    # one span per row (turn structure erased): rank_ratio equals GSPO's sequence ratio
    b.span_ids = torch.where(mask > 0, torch.ones_like(b.span_ids), torch.zeros_like(b.span_ids))
    one, _ = POLICY_LOSSES.get("rank_ratio")(logp, old, adv_t, mask, b, epsilon=0.2)
    assert torch.allclose(one, seq, atol=1e-6)


def test_llds_action_gate_on_agent_turns_differs_from_the_response_gate():
    b, logp, old, mask = _ratios_batch()
    adv_t = torch.ones_like(mask) * mask  # both rows preserved (A >= 0)
    act, _ = REGULARIZERS.get("llds")(logp, old, adv_t, mask, b, llds_coef=0.1, llds_gate="action")
    resp, _ = REGULARIZERS.get("llds")(logp, old, adv_t, mask, b, llds_coef=0.1, llds_gate="response")
    # row 0: response log-ratio sum 0.6 - 0.6 = 0 -> not a fall, no penalty; the action gate sees turn 2 fall
    # (-0.6): its tokens get 0.1 * max(0, -log r) = 0.04, 0.02
    assert resp[0].tolist() == pytest.approx([0.0] * 5, abs=1e-7)
    assert act[0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.04, 0.02], abs=1e-6)
    # row 1: turn 1 sums to 0 (no fall), turn 2 rises: nothing either way
    assert act[1].abs().sum() == 0 and resp[1].abs().sum() == 0


# ------------------------------------------------------------------------ recipes and end-to-end smoke runs

AGENT_RECIPES = {"gigpo": "gigpo", "gigpo_gridworld": "gigpo", "salt": "salt", "gtpo_turn": "gtpo_turn",
                 "flow_grpo": "flow_grpo", "step_grpo": "step_grpo", "hrpo": "hrpo", "llds_search": "group_zscore"}


def test_agent_recipes_cite_their_seed_and_select_the_agent_rollout():
    from grpolab.recipes import load_recipe
    seeds = {"gigpo": "000-47", "gigpo_gridworld": "000-47", "salt": "000-45", "gtpo_turn": "000-76",
             "flow_grpo": "000-79", "step_grpo": "000-98", "hrpo": "000-110", "llds_search": "000-13"}
    for name, advantage in AGENT_RECIPES.items():
        r = load_recipe(name)
        assert r["seed"] == seeds[name] and "arXiv" in r["citation"], name
        assert r["components"]["rollout_strategy"] == "agent" and r["components"]["advantage"] == advantage
        assert r["parameters"]["task"] in ("search_qa", "gridworld", "calculator"), name


class CorridorGame:
    """A gym-style text game for the smoke runs (short prompts fit the tiny model's context): three rooms in a
    ring, the turn's text length moves the player, room 2 pays 0.5 per visit; the room is the anchor state."""

    def reset(self, seed=None, **row):
        self.room, self.steps = 0, 0
        return "room 0"

    def step(self, action):
        self.room, self.steps = (self.room + len(action)) % 3, self.steps + 1
        return f"room {self.room}", 0.5 if self.room == 2 else 0.0, self.steps >= 2, {}

    def state_key(self):
        return f"room {self.room}"


def reached(completions, episode=None, **kw):
    """User reward for the smoke runs: 1 if the episode's last step reward was positive."""
    return [1.0 if ep["turns"] and (ep["turns"][-1].get("reward") or 0) > 0 else 0.0 for ep in episode]


def _user_data(tmp_path, hops=False):
    import json
    path = tmp_path / "agent.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"go {i}:", "answer": str(i), **({"hops": 1 + i % 2} if hops
                                        else {})}) + "\n" for i in range(8)))
    return str(path)


# tests/test_training.py::test_every_recipe_trains runs each recipe on its own task (search_qa, gridworld,
# calculator); here each method also trains with a user's gym-style environment (CorridorGame above: anchor
# states, step rewards) on the tiny model's 'repeat' prompts, HRPO on user data that has the 'hops' column.
SMOKE = {name: {"task": "repeat", "environment": "test_agent_credit:CorridorGame"} for name in AGENT_RECIPES}
SMOKE["hrpo"] = {"hops": True, "environment": "test_agent_credit:CorridorGame"}


@pytest.mark.parametrize("recipe", sorted(AGENT_RECIPES))
def test_agent_recipe_trains_two_steps_on_the_tiny_model(recipe, tiny_args, tmp_path):
    """End to end on the tiny model (SMOKE: which task and environment): the agent rollout (the tiny model's random tokens end episodes by
    max_turns / no_action), the estimator on real episode records, two optimiser steps, no stand-in. A smoke
    test: each recipe's numbers through the same pipeline are checked by hand in tests/test_agent_recipe_numbers.py."""
    import warnings

    from grpolab.config import Config
    from grpolab.errors import FallbackWarning
    from grpolab.recipes import recipe_overrides
    from grpolab.train.metrics import read_metrics
    from grpolab.train.trainer import Trainer

    rec = recipe_overrides(recipe)
    smoke = SMOKE[recipe]
    args = {**rec, **tiny_args, "task": smoke.get("task"), "environment": smoke["environment"], "steps": 2,
            "num_iterations": 2, "prompts_per_step": 2, "num_generations": 2 if recipe == "hrpo" else 3,
            "max_completion_length": 8, "max_turns": 3, "log_completions_steps": 1, "out": str(tmp_path / "run")}
    if smoke.get("hops"):  # user data with the 'hops' column: the method's settings, the user's reward
        args = {**recipe_overrides(recipe, user_data=True), **{k: v for k, v in args.items() if k != "task"},
                "data": _user_data(tmp_path, hops=True), "reward": ["test_agent_credit:reached"], "eval_split": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        t = Trainer(Config.build(args), log=lambda *a: None)
        seen, compute = [], t.compute_advantages
        t.compute_advantages = lambda batch: seen.append((batch, compute(batch))) or seen[-1][1]
        t.train(progress=False)
    rows = read_metrics(args["out"])
    assert len(rows) == 2 and all(r["loss"] is not None for r in rows)
    assert rows[-1]["rollout/agent/turns_per_episode"] >= 1
    batch, adv = seen[-1]
    assert EPISODE_COLUMN in batch.columns and int(batch.span_ids.max()) >= 1
    assert adv.shape == batch.completion_mask.shape and bool(torch.isfinite(adv).all())
    assert float(adv[batch.token_origin == ENVIRONMENT].abs().sum()) == 0.0
