"""The numbers of every agent recipe through the real pipeline (issue 27): the recipe's config -> Trainer -> the
agent rollout (a scripted policy whose episodes act differently, in a deterministic environment) -> the rewards ->
the advantages (and, for llds_search, its regulariser's loss term).

tests/test_agent_credit.py has each estimator's hand test on hand-built batches and a smoke run per recipe (it
only checks that training runs); here each recipe's own settings (gamma, anchors, turn-reward sources, statistics,
...) meet the batch the rollout really packs (spans, observations, episode records, states, step rewards), and
every per-turn advantage is compared with a value computed by hand from the method's formula (the arithmetic is in
the comments; ``z`` below is the textbook z-score written out, no grpolab code).

The environment is test_agent_credit.CorridorGame: three rooms in a ring, a turn's text length moves the player
(room <- (room + len(text)) mod 3), entering room 2 pays 0.5, the episode is done after two steps; its state key
(read before each turn) is the room. The user reward is test_agent_credit.reached (1 if the last step paid), and
the agent rollout adds the environment's summed step rewards (column env_reward, weight 1): R = reached + env;
step_grpo and gtpo_turn, which give each step its own reward, set that weight to 0 (R = reached).
The last test does the same for the agent-rewards pipeline of tests/test_agent_rewards.py (tool-call rewards, the
OTC transform, the CoT-entropy advantage weighting) with the user tool ``add``.
"""
import json
import math
import statistics
import warnings

import pytest
import torch

from grpolab.agents import rollout as agent_rollout
from grpolab.agents.base import EPISODE_COLUMN
from grpolab.batch import ENVIRONMENT
from grpolab.config import Config
from grpolab.errors import FallbackWarning
from grpolab.generation.turns import Continuation
from grpolab.recipes import load_recipe, recipe_overrides
from grpolab.train.trainer import Trainer
from test_agent_credit import AGENT_RECIPES, turn_value

EPS = 1e-4  # advantage_epsilon (the config default; no agent recipe sets it)
TOL = 1e-5  # the advantages are float32


def z(x, pool):
    """``(x - mean(pool)) / (std(pool) + EPS)`` with the Bessel (n - 1) std: the group z-score, written out."""
    return (x - statistics.mean(pool)) / (statistics.stdev(pool) + EPS)


def per_episode(script, logprobs=None):
    """A scripted policy whose episodes act differently: at the k-th call (turn k) the j-th episode of the call
    says ``script[k][j]`` ("" = no action: the episode ends, ended_by no_action). The rollout calls sample_turns
    with the live episodes only, in their order (grpolab/agents/rollout.py play()), so ``script[k]`` lists the
    episodes still playing at turn k. Every token gets log-prob ``logprobs[k][j]`` (default -1.0), recorded as
    the behaviour log-prob."""
    calls = {"k": 0}

    def sample(ctx, contexts, max_new_tokens, temperatures, stop_strings, model=None):
        k = calls["k"]
        calls["k"] += 1
        texts = script[k]
        assert len(texts) == len(contexts), f"turn {k}: {len(contexts)} live episodes, script has {len(texts)}"
        ids = [ctx.tokenizer(t, add_special_tokens=False)["input_ids"][:m] for t, m in zip(texts, max_new_tokens)]
        lps = [[(logprobs[k][j] if logprobs else -1.0)] * len(a) for j, a in enumerate(ids)]
        return Continuation(ids, lps, ["stop_string"] * len(ids))
    return sample


NOTE = "go```\n"  # a data column holding every character of the scripted turns (the tiny tokenizer is the data's)


def recipe_step(recipe, tmp_path, tiny_args, monkeypatch, script, *, prompts=2, generations=3, max_len=8):
    """One rollout + reward + advantage of ``recipe`` (its method settings, ``recipe_overrides(user_data=True)``)
    on user rows ``go <i>:`` (column hops = 1 + i % 2), CorridorGame, the user reward ``reached``, 2 turns."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"go {i}:", "answer": str(i), "hops": 1 + i % 2, "note": NOTE})
                            + "\n" for i in range(8)))
    args = {**recipe_overrides(recipe, user_data=True), **{k: v for k, v in tiny_args.items() if k != "task"},
            "data": str(path), "eval_split": 0, "reward": ["test_agent_credit:reached"],
            "environment": "test_agent_credit:CorridorGame", "max_turns": 2, "prompts_per_step": prompts,
            "num_generations": generations, "max_completion_length": max_len, "out": str(tmp_path / recipe)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # no stand-in anywhere on the way
        tr = Trainer(Config.build(args), log=lambda *a: None)
        monkeypatch.setattr(agent_rollout, "sample_turns", per_episode(script))
        tr.ctx.new_step()
        rows = tr.rows[:prompts]
        assert [r["prompt"] for r in rows] == [f"go {i}:" for i in range(prompts)]
        b = tr.strategy(ctx=tr.ctx, rows=rows, uids=list(range(prompts)), group_offset=0, budgets=None,
                        temperatures=None)
        b.scalar_rewards = tr.scorer.scalar(b, step=tr.step)
        adv = tr.compute_advantages(b)
    assert adv.shape == b.completion_mask.shape
    assert float(adv[b.token_origin == ENVIRONMENT].abs().sum()) == 0.0  # observations carry no advantage
    assert float(adv[b.completion_mask == 0].abs().sum()) == 0.0
    return tr, b, adv


def values(adv, b, row):
    """Row ``row``'s advantage per model turn (every token of a turn carries the same value: turn_value checks)."""
    return [turn_value(adv, b, row, k) for k in range(len(b.columns[EPISODE_COLUMN][row]["turns"]))]


def assert_turns(adv, b, expected):
    for i, want in enumerate(expected):
        assert values(adv, b, i) == pytest.approx(want, abs=TOL), f"episode {i}"


# ----------------------------------------------------------------------------------- the common scenario
#
# 2 prompts x 3 episodes; group 0 = e0, e1, e2 (prompt "go 0:"), group 1 = e3, e4, e5 ("go 1:").
#   turn 1 text (room after, step reward)     turn 2                       reached  env   R
#   e0 "gg"  (0 -> 2, 0.5)                    "ggg" (2 -> 2, 0.5)           1        1.0   2.0
#   e1 "gg"  (0 -> 2, 0.5)                    "g"   (2 -> 0, 0)             0        0.5   0.5
#   e2 "g"   (0 -> 1, 0)                      "g"   (1 -> 2, 0.5)           1        0.5   1.5
#   e3 "g"   (0 -> 1, 0)                      "ggg" (1 -> 1, 0)             0        0     0.0
#   e4 "o"   (0 -> 1, 0)                      "g"   (1 -> 2, 0.5)           1        0.5   1.5
#   e5 "gg"  (0 -> 2, 0.5)                    ""    (no action: 1 turn)     1        0.5   1.5
# States (the room before the turn): turn 1 "room 0" for all; turn 2: e0, e1 "room 2"; e2, e3, e4 "room 1".
# Histories: e0 and e1 share turn 1 ("gg", the same observation "room 2"); e3 and e4 reach the same room by
# different texts ("g" / "o"): same state, different history.
SCRIPT = [["gg", "gg", "g", "g", "o", "gg"],
          ["ggg", "g", "g", "ggg", "g", ""]]
R = [2.0, 0.5, 1.5, 0.0, 1.5, 1.5]
REACHED = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]  # R of a recipe with env_reward_weight 0 (step_grpo, gtpo_turn)
K = [2, 2, 2, 2, 2, 1]  # turns per episode

# the statistics several methods share
#   per episode, group 0: R = (2, .5, 1.5): mean 4/3, deviations 2/3, -5/6, 1/6, ss = 16/36 + 25/36 + 1/36 = 7/6,
#     Bessel var 7/12; group 1: R = (0, 1.5, 1.5): mean 1, deviations -1, .5, .5, ss 3/2, var 3/4
#   per turn sample (episode i counted K_i times), group 0: (2, 2, .5, .5, 1.5, 1.5): mean 4/3, ss 2 * 7/6 = 7/3,
#     var 7/15; group 1: (0, 0, 1.5, 1.5, 1.5): mean .9, ss 2 * .81 + 3 * .36 = 2.7, var 2.7 / 4 = 27/40
S_EP0, S_EP1 = math.sqrt(7 / 12), math.sqrt(3 / 4)
S_TURN0, S_TURN1 = math.sqrt(7 / 15), math.sqrt(27 / 40)
GRPO = [(2 / 3) / (S_EP0 + EPS), (-5 / 6) / (S_EP0 + EPS), (1 / 6) / (S_EP0 + EPS),
        -1 / (S_EP1 + EPS), 0.5 / (S_EP1 + EPS), 0.5 / (S_EP1 + EPS)]
TURN_POOLED = [(2 / 3) / (S_TURN0 + EPS), (-5 / 6) / (S_TURN0 + EPS), (1 / 6) / (S_TURN0 + EPS),
               -0.9 / (S_TURN1 + EPS), 0.6 / (S_TURN1 + EPS), 0.6 / (S_TURN1 + EPS)]


def check_scenario(b, texts=None, outcome=None):
    """The rollout played the scenario: texts, states, step rewards, turns, the reward columns and R (``outcome``:
    R of a recipe that weighs the columns differently, e.g. env_reward_weight 0)."""
    eps = b.columns[EPISODE_COLUMN]
    texts = texts or SCRIPT
    assert b.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert [e["num_turns"] for e in eps] == K
    assert [e["ended_by"] for e in eps] == ["done"] * 5 + ["no_action"]
    assert [[t["text"] for t in e["turns"]] for e in eps] == [[texts[k][i] for k in range(K[i])] for i in range(6)]
    assert [[t["state"] for t in e["turns"]] for e in eps] == [
        ["room 0", "room 2"], ["room 0", "room 2"], ["room 0", "room 1"], ["room 0", "room 1"],
        ["room 0", "room 1"], ["room 0"]]
    assert [[t["reward"] for t in e["turns"]] for e in eps] == [
        [0.5, 0.5], [0.5, 0.0], [0.0, 0.5], [0.0, 0.0], [0.0, 0.5], [0.5]]
    if outcome is None:
        assert b.reward_names == ["reached", "env_reward"]
        assert b.rewards.tolist() == [[1, 1.0], [0, 0.5], [1, 0.5], [0, 0.0], [1, 0.5], [1, 0.5]]
    else:  # env_reward_weight 0: no env_reward column
        assert b.reward_names == ["reached"] and b.rewards[:, 0].tolist() == outcome
    assert b.scalar_rewards.tolist() == pytest.approx(R if outcome is None else outcome)


# ------------------------------------------------------------------------------------------------- GiGPO


def gigpo_episode_level():
    """A^E with the recipes' gigpo_episode_stats steps (per turn sample): the turn-pooled z-scores."""
    return TURN_POOLED


def test_gigpo_recipe_numbers(tmp_path, tiny_args, monkeypatch):
    """gigpo: gamma .95, omega 1, mean_std_norm, anchor = the interaction history, step rewards = the outcome on
    the last turn. A_ik = A^E_i + A^S_ik (GiGPO Eqs. 3, 5-8)."""
    rec = load_recipe("gigpo")["parameters"]
    assert (rec["gigpo_gamma"], rec["gigpo_step_weight"], rec["gigpo_anchor"]) == (0.95, 1.0, "history")
    _, b, adv = recipe_step("gigpo", tmp_path, tiny_args, monkeypatch, SCRIPT)
    check_scenario(b)
    AE = gigpo_episode_level()
    # step returns, outcome on the last turn, gamma .95: G_i = (.95 R_i, R_i); e5 (one turn): (R_5) = (1.5)
    #   group 0: e0 (1.9, 2), e1 (.475, .5), e2 (1.425, 1.5); group 1: e3 (0, 0), e4 (1.425, 1.5), e5 (1.5)
    # anchor groups (same history = same earlier turns and observations):
    #   group 0, turn 1 (empty history): {1.9, .475, 1.425} = .95 * (2, .5, 1.5): mean 19/15, std .95 sqrt(7/12)
    #   group 0, turn 2: e0 and e1 share ("gg", "room 2"): {2, .5}: mean 1.25, std .75 sqrt(2) -> +-.75 / ...;
    #     e2 alone -> 0
    #   group 1, turn 1 (empty history): {0, 1.425, 1.5}: mean .975, deviations -.975, .45, .525,
    #     ss = .950625 + .2025 + .275625 = 1.42875, var .714375
    #   group 1, turn 2: e3 ("g", "room 1") and e4 ("o", "room 1") differ -> 0 each
    s01 = 0.95 * S_EP0
    s02 = 0.75 * math.sqrt(2)
    s11 = math.sqrt(0.714375)
    expected = [
        [AE[0] + 0.95 * (2 / 3) / (s01 + EPS), AE[0] + 0.75 / (s02 + EPS)],
        [AE[1] + 0.95 * (-5 / 6) / (s01 + EPS), AE[1] - 0.75 / (s02 + EPS)],
        [AE[2] + 0.95 * (1 / 6) / (s01 + EPS), AE[2] + 0.0],
        [AE[3] - 0.975 / (s11 + EPS), AE[3] + 0.0],
        [AE[4] + 0.45 / (s11 + EPS), AE[4] + 0.0],
        [AE[5] + 0.525 / (s11 + EPS)],
    ]
    assert expected[3][0] == pytest.approx(TURN_POOLED[3] + z(0.0, [0.0, 1.425, 1.5]))
    assert_turns(adv, b, expected)


def test_gigpo_gridworld_recipe_numbers(tmp_path, tiny_args, monkeypatch):
    """gigpo_gridworld: anchor = the environment's state (the room), step rewards = the environment's, gamma .95."""
    rec = load_recipe("gigpo_gridworld")["parameters"]
    assert (rec["gigpo_anchor"], rec["gigpo_step_rewards"], rec["gigpo_gamma"]) == ("state", "env", 0.95)
    _, b, adv = recipe_step("gigpo_gridworld", tmp_path, tiny_args, monkeypatch, SCRIPT)
    check_scenario(b)
    AE = gigpo_episode_level()
    # step rewards (the environment's): e0 (.5, .5), e1 (.5, 0), e2 (0, .5), e3 (0, 0), e4 (0, .5), e5 (.5)
    # returns, gamma .95: e0 (.5 + .95 * .5 = .975, .5), e1 (.5, 0), e2 (.475, .5), e3 (0, 0), e4 (.475, .5), e5 (.5)
    # anchor states inside each group:
    #   group 0 "room 0" (turn 1 of e0, e1, e2): {.975, .5, .475}: mean .65, deviations .325, -.15, -.175,
    #     ss = .105625 + .0225 + .030625 = .15875, var .079375
    #   group 0 "room 2" (turn 2 of e0, e1): {.5, 0}: mean .25, std sqrt(.125) -> +-.25 / ...
    #   group 0 "room 1" (turn 2 of e2 alone) -> 0
    #   group 1 "room 0" (turn 1 of e3, e4, e5): {0, .475, .5}: mean .325, deviations -.325, .15, .175, var .079375
    #   group 1 "room 1" (turn 2 of e3, e4: the same room by different texts): {0, .5}: -+.25 / ...
    s_r0, s_pair = math.sqrt(0.079375), math.sqrt(0.125)
    expected = [
        [AE[0] + 0.325 / (s_r0 + EPS), AE[0] + 0.25 / (s_pair + EPS)],
        [AE[1] - 0.15 / (s_r0 + EPS), AE[1] - 0.25 / (s_pair + EPS)],
        [AE[2] - 0.175 / (s_r0 + EPS), AE[2] + 0.0],
        [AE[3] - 0.325 / (s_r0 + EPS), AE[3] - 0.25 / (s_pair + EPS)],
        [AE[4] + 0.15 / (s_r0 + EPS), AE[4] + 0.25 / (s_pair + EPS)],
        [AE[5] + 0.175 / (s_r0 + EPS)],
    ]
    assert_turns(adv, b, expected)


# -------------------------------------------------------------------------------------------------- SALT


def test_salt_recipe_numbers(tmp_path, tiny_args, monkeypatch):
    """salt (salt_node: history): a turn gets the mean GRPO advantage of the group's trajectories through its
    node (same interaction so far and same action)."""
    assert load_recipe("salt")["parameters"]["salt_node"] == "history"
    _, b, adv = recipe_step("salt", tmp_path, tiny_args, monkeypatch, SCRIPT)
    check_scenario(b)
    A = GRPO  # trajectory advantages: per-episode z-scores (S_EP0, S_EP1)
    # group 0 nodes: turn 1 "gg" from the empty history holds e0 and e1 -> (A0 + A1) / 2 = (2/3 - 5/6) / 2 / ... =
    #   (-1/12) / (sqrt(7/12) + eps); turn 1 "g" (e2) and every turn 2 are their own trajectory's nodes.
    # group 1: no two trajectories share a step ("g", "o", "gg" first) -> GRPO on every turn.
    shared = (-1 / 12) / (S_EP0 + EPS)
    assert shared == pytest.approx((A[0] + A[1]) / 2)
    assert_turns(adv, b, [[shared, A[0]], [shared, A[1]], [A[2], A[2]], [A[3], A[3]], [A[4], A[4]], [A[5]]])


# ------------------------------------------------------------------------------------------- GTPO (turns)

# as SCRIPT, but e3, e4, e5 write fenced code of the length that keeps their moves (len mod 3):
#   e5 turn 1 "```\ng```" (8 chars: 0 -> 2), e3 turn 2 "```\ngo```" (9: 1 -> 1), e4 turn 2 "```\nggo```" (10: 1 -> 2)
GTPO_SCRIPT = [["gg", "gg", "g", "g", "o", "```\ng```"],
               ["ggg", "g", "g", "```\ngo```", "```\nggo```", ""]]


def test_gtpo_turn_recipe_numbers(tmp_path, tiny_args, monkeypatch):
    """gtpo_turn: turn rewards = step rewards + the (shaped) outcome on the last turn, returns with gamma .9,
    z-scored over every turn of the group; a failed episode's outcome gains .5 x the code similarity to its
    group's closest successful episode."""
    rec = load_recipe("gtpo_turn")["parameters"]
    assert (rec["gtpo_gamma"], rec["gtpo_turn_rewards"], rec["gtpo_norm"], rec["gtpo_shaping_coef"]) == (
        0.9, "env+outcome", "group", 0.5)
    # the recipe's outcome is the task reward alone (env_reward_weight 0): R = reached = (1, 0, 1 | 0, 1, 1)
    assert load_recipe("gtpo_turn")["parameters"]["env_reward_weight"] == 0.0
    _, b, adv = recipe_step("gtpo_turn", tmp_path, tiny_args, monkeypatch, GTPO_SCRIPT, max_len=12)
    check_scenario(b, GTPO_SCRIPT, outcome=REACHED)
    # shaping: failed episodes (R <= 0) are e1 (no code: keeps R = 0) and e3, code "go"; e3's group's successes:
    #   e4 "ggo", e5 "g". difflib ratio = 2 M / (|a| + |b|): ("go", "ggo"): the block "go", M = 2 -> 4/5;
    #   ("go", "g"): M = 1 -> 2/3. R'_3 = 0 + .5 * max(.8, 2/3) = .4
    # turn rewards (step reward, + R' on the last turn; each step reward counted once) and returns
    # G_k = r_k + .9 G_{k+1}:
    #   e0 (.5, .5 + 1) -> (.5 + .9 * 1.5 = 1.85, 1.5); e1 (.5, 0 + 0) -> (.5, 0); e2 (0, .5 + 1) -> (1.35, 1.5)
    #   e3 (0, 0 + .4) -> (.36, .4); e4 (0, .5 + 1) -> (1.35, 1.5); e5 (.5 + 1) -> (1.5)
    # group 0 pool (1.85, 1.5, .5, 0, 1.35, 1.5): mean 6.7/6 = 1.116667, deviations .733333, .383333, -.616667,
    #   -1.116667, .233333, .383333, ss = .537778 + .146944 + .380278 + 1.246944 + .054444 + .146944 = 2.513333,
    #   Bessel var .502667
    # group 1 pool (.36, .4, 1.35, 1.5, 1.5): mean 5.11/5 = 1.022, deviations -.662, -.622, .328, .478, .478,
    #   ss = .438244 + .386884 + .107584 + 2 * .228484 = 1.38968, var .34742
    s0, s1 = math.sqrt(2.513333333333 / 5), math.sqrt(0.34742)
    m0 = 6.7 / 6  # group 1's deviations above are already taken from its mean 1.022
    expected = [[(1.85 - m0) / (s0 + EPS), (1.5 - m0) / (s0 + EPS)], [(0.5 - m0) / (s0 + EPS), -m0 / (s0 + EPS)],
                [(1.35 - m0) / (s0 + EPS), (1.5 - m0) / (s0 + EPS)],
                [-0.662 / (s1 + EPS), -0.622 / (s1 + EPS)], [0.328 / (s1 + EPS), 0.478 / (s1 + EPS)],
                [0.478 / (s1 + EPS)]]
    assert expected[0][0] == pytest.approx(z(1.85, [1.85, 1.5, 0.5, 0.0, 1.35, 1.5]))
    assert expected[3][1] == pytest.approx(z(0.4, [0.36, 0.4, 1.35, 1.5, 1.5]))
    assert_turns(adv, b, expected)


# ---------------------------------------------------------------------------------------------- Flow-GRPO


def test_flow_grpo_recipe_numbers(tmp_path, tiny_args, monkeypatch):
    """flow_grpo (flow_grpo_stats: turns): every turn of episode i gets (R_i - mean) / (std + eps) over the
    group's turn samples (each episode counted once per turn)."""
    assert load_recipe("flow_grpo")["parameters"]["flow_grpo_stats"] == "turns"
    _, b, adv = recipe_step("flow_grpo", tmp_path, tiny_args, monkeypatch, SCRIPT)
    check_scenario(b)
    A = TURN_POOLED  # group 0 std sqrt(7/15), group 1 (e5 counted once: one turn) mean .9, std sqrt(27/40)
    assert_turns(adv, b, [[A[0]] * 2, [A[1]] * 2, [A[2]] * 2, [A[3]] * 2, [A[4]] * 2, [A[5]]])
    assert A[4] != pytest.approx(GRPO[4], abs=1e-2)  # the per-turn statistics are not GRPO's here


# ---------------------------------------------------------------------------------------------- Step-GRPO


def test_step_grpo_recipe_numbers(tmp_path, tiny_args, monkeypatch):
    """step_grpo: step k's reward (the environment's, the outcome R_i on the last step) z-scored against the
    same step of the group's other episodes."""
    # the recipe's outcome is the task reward alone (env_reward_weight 0): R = reached = (1, 0, 1 | 0, 1, 1)
    assert load_recipe("step_grpo")["parameters"]["env_reward_weight"] == 0.0
    _, b, adv = recipe_step("step_grpo", tmp_path, tiny_args, monkeypatch, SCRIPT)
    check_scenario(b, outcome=REACHED)
    # step rewards s_ik: e0 (.5, R=1), e1 (.5, R=0), e2 (0, R=1); e3 (0, R=0), e4 (0, R=1), e5 (R=1: its only
    # step is its last). Each step reward counts once: the last step's R is the task reward, not the env sum.
    # group 0 step 1 {.5, .5, 0}: mean 1/3, deviations 1/6, 1/6, -1/3, ss 1/6, var 1/12
    # group 0 step 2 {1, 0, 1}: mean 2/3, deviations 1/3, -2/3, 1/3, ss 2/3, var 1/3
    # group 1 step 1 {0, 0, 1 (e5's last step)}: mean 1/3, deviations -1/3, -1/3, 2/3, ss 2/3, var 1/3
    # group 1 step 2 {0 (e3), 1 (e4)}: mean .5, std sqrt(.5) -> -+.5 / ...
    s01, s02, s11, s12 = math.sqrt(1 / 12), math.sqrt(1 / 3), math.sqrt(1 / 3), math.sqrt(0.5)
    expected = [[(1 / 6) / (s01 + EPS), (1 / 3) / (s02 + EPS)], [(1 / 6) / (s01 + EPS), (-2 / 3) / (s02 + EPS)],
                [(-1 / 3) / (s01 + EPS), (1 / 3) / (s02 + EPS)],
                [(-1 / 3) / (s11 + EPS), -0.5 / (s12 + EPS)], [(-1 / 3) / (s11 + EPS), 0.5 / (s12 + EPS)],
                [(2 / 3) / (s11 + EPS)]]
    assert expected[5][0] == pytest.approx(z(1.0, [0.0, 0.0, 1.0]))
    assert_turns(adv, b, expected)


# --------------------------------------------------------------------------------------------------- HRPO

# 4 prompts x 2 episodes; patterns A ("gg", "ggg": R 2), B ("gg", "g": .5), C ("g", "g": 1.5), D ("g", "ggg": 0),
# F ("gg", then no action: 1.5). Prompt rows 0..3 have hops 1, 2, 1, 2.
#   row 0 (hops 1): e0 A, e1 B; row 1 (hops 2): e2 C, e3 D; row 2 (hops 1): e4 D, e5 F; row 3 (hops 2): e6 B, e7 A
HRPO_SCRIPT = [["gg", "gg", "g", "g", "g", "gg", "gg", "gg"],
               ["ggg", "g", "g", "ggg", "ggg", "", "g", "ggg"]]


def test_hrpo_recipe_numbers(tmp_path, tiny_args, monkeypatch):
    """hrpo: the baseline is the hop cluster's (every episode of the step whose question has the same hops),
    not the prompt group's; one advantage per episode on all its model tokens."""
    _, b, adv = recipe_step("hrpo", tmp_path, tiny_args, monkeypatch, HRPO_SCRIPT, prompts=4, generations=2)
    assert b.columns["hops"] == [1, 1, 2, 2, 1, 1, 2, 2]
    assert b.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert b.scalar_rewards.tolist() == pytest.approx([2.0, 0.5, 1.5, 0.0, 0.0, 1.5, 0.5, 2.0])
    # hops 1: e0, e1, e4, e5 = (2, .5, 0, 1.5): mean 1, deviations 1, -.5, -1, .5, ss 2.5, var 5/6
    # hops 2: e2, e3, e6, e7 = (1.5, 0, .5, 2): mean 1, deviations .5, -1, -.5, 1, var 5/6
    s = math.sqrt(5 / 6)
    want = [1, -0.5, 0.5, -1, -1, 0.5, -0.5, 1]
    for i, d in enumerate(want):
        assert values(adv, b, i) == pytest.approx([d / (s + EPS)] * len(b.columns[EPISODE_COLUMN][i]["turns"]),
                                                  abs=TOL), i
    # the prompt groups' own baseline would give row 0 (2, .5): +-.75 / (.75 sqrt 2): not what HRPO gives
    assert values(adv, b, 0)[0] != pytest.approx(0.75 / (0.75 * math.sqrt(2) + EPS), abs=1e-2)


# -------------------------------------------------------------------------------- LLDS (search agent)


def test_llds_search_recipe_numbers(tmp_path, tiny_args, monkeypatch):
    """llds_search: GRPO advantages on every model token, and the recipe's regulariser (coef .1, gate per action
    = per model turn) on the real batch's spans with hand-chosen current log-probs."""
    rec = load_recipe("llds_search")["parameters"]
    assert (rec["llds_coef"], rec["llds_gate"]) == (0.1, "action")
    tr, b, adv = recipe_step("llds_search", tmp_path, tiny_args, monkeypatch, SCRIPT)
    check_scenario(b)
    assert_turns(adv, b, [[GRPO[0]] * 2, [GRPO[1]] * 2, [GRPO[2]] * 2, [GRPO[3]] * 2, [GRPO[4]] * 2, [GRPO[5]]])
    # current log-probs = behaviour (-1 per token) + delta: turn 1 every token -.2 (the turn's likelihood fell);
    # turn 2 first token +.5, the others -.1 (e0's "ggg": +.3 in all, rose; a one-token turn 2 rose)
    old = b.behavior_logprobs
    delta = torch.zeros_like(old)
    eps = b.columns[EPISODE_COLUMN]
    for i, ep in enumerate(eps):
        for k, t in enumerate(ep["turns"]):
            pos = (b.span_ids[i] == t["span"]).nonzero().squeeze(-1)
            delta[i, pos] = -0.2 if k == 0 else -0.1
            if k == 1:
                delta[i, pos[0]] = 0.5
    term, _ = tr.regularizers[0](logprobs=old + delta, old_logprobs=old, advantages=adv, mask=b.completion_mask,
                                 batch=b)
    # preserving set A_i >= 0: e0, e2, e4, e5 (e1, e3 have A < 0: no term)
    # turn 1 fell (sum -.2 per token < 0): every token fell by .2 -> .1 * .2 = .02 each
    # turn 2 rose (e0: .5 - .1 - .1 = .3; e2, e4: +.5) -> 0, although e0's last two tokens fell
    want = {0: [0.02, 0.0], 1: [0.0, 0.0], 2: [0.02, 0.0], 3: [0.0, 0.0], 4: [0.02, 0.0], 5: [0.02]}
    for i, per_turn in want.items():
        for k, v in enumerate(per_turn):
            span = eps[i]["turns"][k]["span"]
            vals = term[i][b.span_ids[i] == span]
            assert vals.tolist() == pytest.approx([v] * len(vals), abs=1e-6), (i, k)
    assert float(term[b.completion_mask == 0].abs().sum()) == 0.0
    # the response gate would see e0's whole reply fall (-.4 + .3 = -.1) and penalise turn 2's falling tokens
    # (.1 * .1 = .01): the recipe's action gate does not
    assert float(term[0][b.span_ids[0] == eps[0]["turns"][1]["span"]].abs().sum()) == 0.0


def test_every_agent_recipe_has_a_numbers_test():
    """Every recipe of test_agent_credit.AGENT_RECIPES (the smoke-tested ones) has its numbers test here."""
    names = {n.removeprefix("test_").removesuffix("_recipe_numbers") for n in globals()
             if n.startswith("test_") and n.endswith("_recipe_numbers")}
    assert names == set(AGENT_RECIPES)


# ------------------------------------------------------------- agent rewards: OTC + the CoT-entropy weighting

CALL12 = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'  # test_agent_rewards.CALL_TEXT
CALL13 = CALL12.replace('"b": 2', '"b": 3')
THINK = "<think>go</think>"  # its inner text "go": two tokens of the tiny character-level tokenizer

# 2 prompts x 3 episodes with the user tool add; a turn without a call is the final answer (ToolsEnv).
# Row 0's reference call is add(1, 2), row 1's add(1, 3); the answer is 3 for both.
#   e0: THINK + add(1,2) | "Answer: 3"                      1 call
#   e1: THINK + add(1,2) | add(1,2) | "Answer: 3"           2 calls
#   e2: "Answer: 4"                                         0 calls, no <think>
#   e3: THINK + "Answer: 3"                                 0 calls
#   e4: THINK + add(1,2) | "Answer: 3"                      1 call (the wrong reference for row 1)
#   e5: THINK + add(1,3) | "Answer: 4"                      1 call
REWARDS_SCRIPT = [[THINK + CALL12, THINK + CALL12, "Answer: 4", THINK + "Answer: 3", THINK + CALL12, THINK + CALL13],
                  ["Answer: 3", CALL12, "Answer: 3", "Answer: 4"],   # the live e0, e1, e4, e5
                  ["Answer: 3"]]                                     # e1


def test_agent_rewards_pipeline_numbers(tmp_path, tiny_args, monkeypatch):
    """The agent-rewards pipeline of tests/test_agent_rewards.py (reward specs accuracy + tool_call_accuracy +
    fc_ast, transform otc_tool_reward, weighting fc_cot_entropy_advantage) on one scripted step: the scalar
    rewards and the weighted advantages by hand; the entropy H_i is recomputed here from a plain forward pass."""
    gold = [[{"name": "add", "arguments": {"a": 1, "b": 2}}], [{"name": "add", "arguments": {"a": 1, "b": 3}}]]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"add 1 and {i}", "answer": "3", "note": CALL12 + " Answer: 3"
                                        + THINK, "gold_tool_calls": json.dumps(gold[i % 2])}) + "\n"
                            for i in range(8)))
    args = {**{k: v for k, v in tiny_args.items() if k != "task"}, "data": str(path), "eval_split": 0,
            "reward": ["test_agent_rewards:accuracy", "tool_call_accuracy", "fc_ast"],
            "rollout_strategy": "agent", "tools": ["test_agent_rewards:add"], "max_turns": 3,
            "max_episode_tokens": 400, "max_turn_tokens": 100, "env_reward_weight": 0.0, "prompts_per_step": 2,
            "num_generations": 3, "reward_transforms": ["otc_tool_reward"],
            "advantage_weightings": ["fc_cot_entropy_advantage"], "fc_entropy_lambda": 0.05}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        tr = Trainer(Config.build(args), log=lambda *a: None)
        monkeypatch.setattr(agent_rollout, "sample_turns", per_episode(REWARDS_SCRIPT))
        tr.ctx.new_step()
        b = tr.strategy(ctx=tr.ctx, rows=tr.rows[:2], uids=[0, 1], group_offset=0, budgets=None, temperatures=None)
        b.scalar_rewards = tr.scorer.scalar(b, step=tr.step)
        adv = tr.compute_advantages(b)
    eps = b.columns[EPISODE_COLUMN]
    assert [e["num_turns"] for e in eps] == [2, 3, 1, 1, 2, 2]
    # reward columns: accuracy ("Answer: 3" in the final turn), tool_call_accuracy (F1 of the call multisets:
    # e1 2 x add(1,2) vs 1 reference -> P 1/2, R 1, F1 2/3; no call vs a reference call -> 0), fc_ast (AST match,
    # one to one: e1's extra call -> 0)
    assert b.reward_names == ["accuracy", "tool_call_accuracy", "fc_ast"]
    assert b.rewards.flatten().tolist() == pytest.approx([1, 1, 1, 1, 2 / 3, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 1])
    # r = the weighted sum (weights 1): 3, 5/3, 0, 1, 1, 2; OTC-GRPO (c 1, alpha 1): r' = r_tool(m, n) r, n = the
    # fewest calls among the group's correct episodes
    #   group 0: correct e0 (m 1), e1 (m 2) -> n = 1. e0: f = 2*1*1/2 = 1, sin(1 pi / 2) = 1 -> 3;
    #     e1: f = 2*1*2/3 = 4/3, sin(4/3 pi / 2) = sin(2 pi / 3) = sqrt(3)/2 -> 5 sqrt(3) / 6; e2: f = 0 -> 0
    #   group 1: correct e3 (m 0), e4 (m 1) -> n = 0. e3: m = n = 0 -> 1 -> 1; e4, e5 (m 1):
    #     cos(1 pi / (2 + 1)) = 1/2 -> .5, 1
    r = [3.0, 5 * math.sqrt(3) / 6, 0.0, 1.0, 0.5, 1.0]
    assert b.scalar_rewards.tolist() == pytest.approx(r, abs=1e-6)
    # GRPO: group 0 (3, 1.443376, 0): mean 1.481125, deviations 1.518875, -.037749, -1.481125, Bessel std 1.500359
    #   group 1 (1, .5, 1): mean 5/6, deviations 1/6, -1/3, 1/6, std sqrt(1/12)
    A = [z(r[0], r[:3]), z(r[1], r[:3]), z(r[2], r[:3]), z(1.0, r[3:]), z(0.5, r[3:]), z(1.0, r[3:])]
    assert A[0] == pytest.approx(1.518875 / (1.500359 + EPS), abs=1e-5)
    assert A[3] == pytest.approx((1 / 6) / (math.sqrt(1 / 12) + EPS))
    # H_i: the mean vocabulary entropy (at the sampling temperature) of the current policy on the tokens inside
    # the episode's <think>...</think> ("go", the 8th and 9th tokens of turn 1); e2 has no <think>: H = 0
    H = []
    for i in range(6):
        if i == 2:
            H.append(0.0)
            continue
        p = b.prompt_ids[i][b.prompt_mask[i] > 0]
        c = b.completion_ids[i][b.completion_attention_mask[i] > 0]
        assert tr.ctx.tokenizer.decode(c[7:9]) == "go"
        with torch.no_grad():
            logits = tr.model(input_ids=torch.cat([p, c])[None]).logits[0, len(p) - 1:-1].double()
        logp = torch.log_softmax(logits / tr.cfg.temperature, -1)
        H.append(float(-(logp.exp() * logp).sum(-1)[7:9].mean()))
    # psi_i = min(lambda H_i, |A_i| / kappa), lambda .05, kappa 2; A'_i = A_i + psi_i on every model token
    psi = [min(0.05 * h, abs(a) / 2) for h, a in zip(H, A)]
    # the random tiny model is nearly uniform (H about 4 nats): lambda H (about .2) is the smaller term for e0, e3,
    # e4, e5; the cap |A| / 2 = .0126 for e1 (A close to 0); e2 (no <think>, H = 0) gets psi = 0
    assert [0.05 * h < abs(a) / 2 for h, a in zip(H, A)] == [True, False, True, True, True, True]
    assert 3.0 < min(H[:2] + H[3:]) and abs(A[1]) / 2 < 0.013
    for i in range(6):
        want = A[i] + psi[i]
        assert values(adv, b, i) == pytest.approx([want] * eps[i]["num_turns"], abs=1e-4), i
    assert float(adv[b.token_origin == ENVIRONMENT].abs().sum()) == 0.0
