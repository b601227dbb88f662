"""In-prompt hint rollouts: Scaf-GRPO (000-61), Guide (004-16), GHPO (000-94).

Unit tests use a fake RolloutContext whose "policy" succeeds by a rule on the
prompt text, so which prompts get hints, in which order, is deterministic; two
tests run the real tiny model (Guide's behaviour log-probs; a Scaf-GRPO
training run end to end).
"""
import copy
import inspect
import json
from types import SimpleNamespace

import pytest
import torch

from grpolab.batch import RolloutBatch
from grpolab.config import Config, ConfigError
from grpolab.rollouts.guidance import (GHPO, SOLUTION_HEADER, ScafGRPO, guide, hint_text, solution_prefix,
                                      with_hint)
from grpolab.data import tokenize_prompts
from grpolab.rollouts.strategies import ROLLOUT_STRATEGIES
from grpolab.train import checkpoint as ckpt
from grpolab.train.trainer import Trainer

HINTS = ["H1 abstract", "H2 plan", "H3 step"]


def row(uid, hints=HINTS, solution="(7 - 3) * 5", chat=True):
    q = f"problem {uid}"
    prompt = [{"role": "system", "content": "sys"}, {"role": "user", "content": q}] if chat else q
    return {"prompt": prompt, "hints": list(hints), "solution": solution, "target": str(uid)}


def text_of(prompt):
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def encode(text):
    return [ord(c) % 97 + 1 for c in text]


class FakeCtx:
    """generate(): completion 'ok' where ``solve(uid, prompt_text, k)`` (k = sample index), else 'no';
    behaviour log-prob of every token = -len(prompt_text) / 100 (so it depends on the context)."""

    def __init__(self, solve, G=4):
        self.solve = solve
        self.cfg = SimpleNamespace(num_generations=G, temperature=1.0)
        self.tokenizer = SimpleNamespace(pad_token_id=0)
        self.calls = []  # one list of (uid, prompt text) per generate call
        self._next = 0
        self.metrics = {}  # rollout/<name> metrics of the step (ctx.metric)

    def new_step(self):
        self._next = 0
        self.metrics = {}

    def metric(self, name, value):
        self.metrics[name] = float(value)

    def allocate_groups(self, n):
        first = self._next
        self._next += n
        return first

    def generate(self, rows, uids, *, group_offset, num_generations=None, temperature=None, model=None):
        n = num_generations if num_generations is not None else self.cfg.num_generations
        ns = n if isinstance(n, list) else [n] * len(rows)
        texts = [text_of(r["prompt"]) for r in rows]
        self.calls.append(list(zip([int(u) for u in uids], texts)))
        P = max(len(encode(t)) for t in texts)
        pid, pm, comp, lp, gid, puid, cols = [], [], [], [], [], [], {k: [] for k in rows[0]}
        cols["completion"] = []
        for i, (r, u, t, g) in enumerate(zip(rows, uids, texts, ns)):
            ids = encode(t)
            for k in range(g):
                pid.append([0] * (P - len(ids)) + ids)
                pm.append([0] * (P - len(ids)) + [1] * len(ids))
                comp.append([int(u) + 1, 5, 6])
                lp.append([-len(t) / 100] * 3)
                gid.append(group_offset + i)
                puid.append(int(u))
                for key in rows[0]:
                    cols[key].append(r[key])
                cols["completion"].append("ok" if self.solve(int(u), t, k) else "no")
        R = len(comp)
        return RolloutBatch(prompt_ids=torch.tensor(pid), prompt_mask=torch.tensor(pm),
                            completion_ids=torch.tensor(comp), completion_mask=torch.ones(R, 3),
                            behavior_logprobs=torch.tensor(lp), group_ids=torch.tensor(gid),
                            prompt_uids=torch.tensor(puid), truncated=torch.zeros(R, dtype=torch.bool),
                            columns=cols)

    def score(self, batch):
        r = torch.tensor([1.0 if c == "ok" else 0.0 for c in batch.columns["completion"]])
        batch.rewards, batch.reward_names = r[:, None], ["acc"]
        return r


def hinted_calls(ctx):
    """The hinted generate calls (every call after the first of a step): [(uid, prompt text), ...]."""
    return ctx.calls[1:]


def tier(text):
    """Number of hints shown in a prompt text (lines after 'Hints:')."""
    return len(text.split("Hints:\n")[1].splitlines())


def run(strategy, ctx, rows, uids, step=0, **kw):
    ctx.new_step()
    ctx.calls = []
    off = ctx.allocate_groups(len(rows))
    fn = strategy.__call__ if not inspect.isfunction(strategy) else strategy
    if "step" in inspect.signature(fn).parameters:  # as the trainer's Component passes inputs by name
        kw["step"] = step
    return strategy(ctx=ctx, rows=rows, uids=uids, group_offset=off, **kw)


def groups(batch):
    return {int(g): (batch.group_ids == g).nonzero().squeeze(-1).tolist() for g in torch.unique(batch.group_ids)}


# ------------------------------------------------------------------ shared helpers
def test_with_hint_appends_to_last_user_message_and_keeps_row():
    r = row(3)
    before = copy.deepcopy(r)
    h = with_hint(r, "Hints:\n1. x")
    assert r == before  # the data row is untouched
    assert h["prompt"][0] == r["prompt"][0]
    assert h["prompt"][1]["content"] == "problem 3\n\nHints:\n1. x"
    assert h["hints"] == HINTS and h["target"] == "3"
    s = with_hint(row(3, chat=False), "tip")
    assert s["prompt"] == "problem 3\n\ntip"


def test_missing_columns_name_the_column_and_the_tasks():
    bare = [{"prompt": "p", "target": "1"}]
    ctx = FakeCtx(lambda u, t, k: False)
    with pytest.raises(ValueError, match=r"'hints' column.*countdown"):
        run(guide, ctx, bare, [0])
    with pytest.raises(ValueError, match=r"'solution' column.*countdown"):
        run(GHPO(), ctx, bare, [0])
    with pytest.raises(ValueError, match=r"'hints' column"):
        run(ScafGRPO(), ctx, bare, [0])


def test_hint_tiers_and_solution_prefix_by_hand():
    assert hint_text(HINTS, 1) == "Hints:\n1. H1 abstract"
    assert hint_text(HINTS, 2) == "Hints:\n1. H1 abstract\n2. H2 plan"
    with pytest.raises(ValueError):
        hint_text(HINTS, 4)
    # GHPO authors: solution_hint[:round(len * f)]. "(7 - 3) * 5" has 11 characters:
    # round(2.75)=3, round(5.5)=6 (half to even), round(8.25)=8
    assert solution_prefix("(7 - 3) * 5", 0.25) == "(7 "
    assert solution_prefix("(7 - 3) * 5", 0.5) == "(7 - 3"
    assert solution_prefix("(7 - 3) * 5", 0.75) == "(7 - 3) "
    # characters, not lines (newlines count): round(0.5 * 3) = 2; round(0.25 * 10) = round(2.5) = 2 (half to even)
    assert solution_prefix("a\nb", 0.5) == "a\n" and solution_prefix("abcdefghij", 0.25) == "ab"


def test_registered_and_config_checks(tiny_args):
    assert {"scaf_grpo", "guide", "ghpo"} <= set(ROLLOUT_STRATEGIES.names())
    with pytest.raises(ConfigError, match="ghpo_fractions"):
        Config.build(tiny_args, {"rollout_strategy": "ghpo", "ghpo_fractions": [0.5, 0.25]})
    with pytest.raises(ConfigError, match="scaf_patience"):
        Config.build(tiny_args, {"rollout_strategy": "scaf_grpo", "scaf_patience": 0})


# -------------------------------------------------------------------------- Guide
def test_guide_hints_only_failed_prompts_and_trains_on_the_plain_prompt():
    # uid 0 is solved without a hint; uid 1 only with one (and then by every sample)
    ctx = FakeCtx(lambda u, t, k: u == 0 or "Hints:" in t)
    rows = [row(0), row(1)]
    b = run(guide, ctx, rows, [0, 1], success_threshold=1.0, guide_hint_level=0)
    assert [[u for u, _ in c] for c in hinted_calls(ctx)] == [[1]]  # one hinted call, uid 1 only
    g = groups(b)
    assert sorted(g) == [0, 1] and len(g[0]) == len(g[1]) == 4  # hinted group replaced the failed one
    assert all(b.columns["hint_level"][r] == 0 and b.columns["hint"][r] is None for r in g[0])
    assert all(b.columns["hint_level"][r] == 3 for r in g[1])  # guide_hint_level 0 = all 3 hints
    assert b.columns["hint"][g[1][0]] == hint_text(HINTS, 3)
    plain_ids = encode("problem 1")
    hinted_text = "problem 1\n\n" + hint_text(HINTS, 3)
    for r in g[1]:
        ids = b.prompt_ids[r][b.prompt_mask[r].bool()].tolist()
        assert ids == plain_ids  # the loss conditions on the hint-free prompt ...
        assert b.columns["prompt"][r] == rows[1]["prompt"]
        # ... while the behaviour log-probs are the hinted context's (fake: -len(text)/100)
        assert torch.allclose(b.behavior_logprobs[r], torch.full((3,), -len(hinted_text) / 100))
        assert float(b.rewards[r, 0]) == 1.0
    assert (b.prompt_uids[g[1]] == 1).all()
    assert ctx.metrics == {"frac_hinted": 0.5}  # 4 of the 8 rows were sampled with a hint


def test_guide_keep_failed_and_hint_level():
    ctx = FakeCtx(lambda u, t, k: "H1" in t and k == 0)
    b = run(guide, ctx, [row(5)], [5], guide_hint_level=1, guide_keep_failed=True)
    g = groups(b)
    assert list(g) == [0] and len(g[0]) == 8  # 4 failed unguided + 4 hinted, one group
    assert sorted(b.columns["hint_level"]) == [0] * 4 + [1] * 4
    assert b.columns["hint"][g[0][-1]] == "Hints:\n1. H1 abstract"
    assert float(b.rewards[:, 0].sum()) == 1.0  # sample k=0 of the hinted group
    assert ctx.metrics["frac_hinted"] == 0.5


# ---------------------------------------------------------------------- Scaf-GRPO
def test_scaf_patience_then_tier_escalation_then_reset():
    """escalate: tier 1, 2, 3 on successive failed visits; success at 3 keeps 3; solved -> reset."""
    solved_plain = {"on": False}
    ctx = FakeCtx(lambda u, t, k: solved_plain["on"] or ("H3" in t and k == 0))
    scaf = ScafGRPO(scaf_patience=2, scaf_schedule="escalate", scaf_hint_samples=2)
    tiers = []
    for step in range(5):
        b = run(scaf, ctx, [row(7)], [7], step=step)
        tiers.append([tier(t) for call in hinted_calls(ctx) for _, t in call])
        assert len(b.group_ids) == 4 and set(b.group_ids.tolist()) == {0}
    # visit 1: not yet stagnating (patience 2); visits 2-4 escalate 1 -> 2 -> 3; visit 5 keeps tier 3
    assert tiers == [[], [1], [2], [3], [3]]
    assert scaf.state_dict() == {"streak": {7: 5}, "level": {7: 3}}
    assert b.columns["hint_level"] == [0, 0, 0, 3]  # the last failed row made way for one success
    assert b.rewards[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0]
    solved_plain["on"] = True
    b = run(scaf, ctx, [row(7)], [7], step=5)
    assert hinted_calls(ctx) == [] and b.columns["hint_level"] == [0] * 4
    assert scaf.state_dict() == {"streak": {}, "level": {}}


def test_scaf_search_uses_minimal_successful_tier_in_one_step():
    # uid 1: solved without hints; uid 2: needs tier >= 2 and only sample k=1 succeeds
    ctx = FakeCtx(lambda u, t, k: u == 1 or ("H2" in t and k == 1))
    scaf = ScafGRPO(scaf_patience=1, scaf_warmup_steps=1, scaf_schedule="search", scaf_hint_samples=2,
                    scaf_replace_num=2)
    b = run(scaf, ctx, [row(1), row(2)], [1, 2], step=0)
    assert hinted_calls(ctx) == [] and set(b.columns["hint_level"]) == {0}  # exploration phase
    b = run(scaf, ctx, [row(1), row(2)], [1, 2], step=1)
    assert [[(u, tier(t)) for u, t in c] for c in hinted_calls(ctx)] == [[(2, 1)], [(2, 2)]]
    g = groups(b)
    assert sorted(g) == [0, 1] and len(g[0]) == len(g[1]) == 4  # ids unique, groups keep their size
    assert [b.columns["hint_level"][r] for r in g[0]] == [0] * 4
    # one success at tier 2 (replace_num 2 but only one hinted sample succeeded)
    assert [b.columns["hint_level"][r] for r in g[1]] == [0, 0, 0, 2]
    assert [float(b.rewards[r, 0]) for r in g[1]] == [0.0, 0.0, 0.0, 1.0]
    hinted = g[1][-1]
    # Scaf trains on the hinted prompt
    assert b.prompt_ids[hinted][b.prompt_mask[hinted].bool()].tolist() == encode("problem 2\n\n" + hint_text(HINTS, 2))
    assert int(b.prompt_uids[hinted]) == 2


def test_scaf_restored_state_makes_the_same_choices():
    def solve(u, t, k):
        return ("H3" in t and k == 0) if u == 3 else ("H2" in t and k == 1)
    rows, uids = [row(3), row(4)], [3, 4]
    a = ScafGRPO(scaf_schedule="escalate")
    ctx_a = FakeCtx(solve)
    run(a, ctx_a, rows, uids, step=0)  # tier 1 for both, both fail -> next tier 2
    b = ScafGRPO(scaf_schedule="escalate")
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert b.state_dict() == a.state_dict() == {"streak": {3: 1, 4: 1}, "level": {3: 2, 4: 2}}
    ctx_b = FakeCtx(solve)
    for step in (1, 2):
        ba, bb = run(a, ctx_a, rows, uids, step=step), run(b, ctx_b, rows, uids, step=step)
        assert ctx_a.calls == ctx_b.calls
        assert ba.columns["hint_level"] == bb.columns["hint_level"]
        assert torch.equal(ba.prompt_ids, bb.prompt_ids)
    assert a.state_dict() == b.state_dict() == {"streak": {3: 3, 4: 3}, "level": {3: 3, 4: 2}}


# --------------------------------------------------------------------------- GHPO
def test_ghpo_reveals_growing_fractions_within_a_step():
    # uid 9 succeeds once at least "(7 - " is revealed (stage 2: round(5.5) = 6 characters)
    ctx = FakeCtx(lambda u, t, k: u == 8 or "(7 - " in t)
    b = run(GHPO(), ctx, [row(8), row(9)], [8, 9])
    revealed = [t.split(SOLUTION_HEADER + "\n")[1] for c in hinted_calls(ctx) for _, t in c]
    assert revealed == ["(7 ", "(7 - 3"]  # stage 1 (1/4) failed, stage 2 (1/2) succeeded; no stage 3
    g = groups(b)
    assert [b.columns["hint_level"][r] for r in g[0]] == [0] * 4  # solvable prompt stays on-policy
    assert [b.columns["hint_level"][r] for r in g[1]] == [2] * 4  # the refined group replaces the plain one
    r = g[1][0]
    assert b.prompt_ids[r][b.prompt_mask[r].bool()].tolist() == encode(
        f"problem 9\n\n{SOLUTION_HEADER}\n(7 - 3")  # GHPO trains on the refined prompt


def test_ghpo_across_visits_and_restore():
    ctx = FakeCtx(lambda u, t, k: "(7 - 3) " in t and k == 0)  # needs stage 3 (3/4)
    a = GHPO(ghpo_schedule="across_visits")
    stages = []
    for step in range(2):
        b = run(a, ctx, [row(1)], [1], step=step)
        stages.append(b.columns["hint_level"])
    assert stages == [[1] * 4, [2] * 4] and a.state_dict() == {"stage": {1: 3}}
    b_ = GHPO(ghpo_schedule="across_visits")
    b_.load_state_dict(copy.deepcopy(a.state_dict()))
    ctx_b = FakeCtx(ctx.solve)
    ra, rb = run(a, ctx, [row(1)], [1], step=2), run(b_, ctx_b, [row(1)], [1], step=2)
    assert ra.columns["hint_level"] == rb.columns["hint_level"] == [3] * 4
    assert ra.rewards[:, 0].tolist() == rb.rewards[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert a.state_dict() == b_.state_dict() == {"stage": {1: 3}}  # success keeps the stage


# ---------------------------------------------------------------- tiny model runs
REWARDS = ("def hinted(prompts, completions, **kw):\n"
           "    text = lambda p: p if isinstance(p, str) else p[-1]['content']\n"
           "    return [1.0 if 'Hints:' in text(p) else 0.0 for p in prompts]\n")


@pytest.fixture
def hint_data(tiny_args, tmp_path, monkeypatch):
    """Chat rows with hints and a reward that is 1 exactly when the prompt shows a hint."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(row(i)) + "\n" for i in range(8)))
    (tmp_path / "hint_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return {**tiny_args, "data": str(data), "reward": ["hint_rewards:hinted"], "prompts_per_step": 2,
            "num_generations": 2, "max_completion_length": 4, "max_prompt_length": 128}


def test_guide_behaviour_logprobs_are_the_hinted_contexts_on_tiny_model(hint_data):
    t = Trainer(Config.build(hint_data, {"rollout_strategy": "guide", "steps": 1}), log=lambda *a: None)
    t.model.eval()
    t.ctx.new_step()
    b = t.rollout()
    assert all(lv == 3 for lv in b.columns["hint_level"])  # plain rewards are 0: every group was hinted
    assert float(b.rewards[:, 0].min()) == 1.0  # scored with the hint the model saw
    uids = b.prompt_uids.tolist()
    plain_ids, plain_mask = tokenize_prompts(t.tok, [t.rows[u]["prompt"] for u in uids], 128)
    assert torch.equal(b.prompt_ids, plain_ids) and torch.equal(b.prompt_mask, plain_mask)
    hinted = [with_hint(t.rows[u], h)["prompt"] for u, h in zip(uids, b.columns["hint"])]
    h_ids, h_mask = tokenize_prompts(t.tok, hinted, 128)
    under_hint = t.ctx.logprobs(RolloutBatch(**{**b.__dict__, "prompt_ids": h_ids, "prompt_mask": h_mask}))
    under_plain = t.ctx.logprobs(b)
    m = b.completion_attention_mask.bool()
    assert torch.allclose(under_hint[m], b.behavior_logprobs[m], atol=1e-4)
    assert (under_plain[m] - b.behavior_logprobs[m]).abs().max() > 1e-3  # ratio pi(o|q)/pi_old(o|q,h) != 1


def test_scaf_grpo_trains_end_to_end_with_one_hinted_success_per_group(hint_data):
    args = {**hint_data, "rollout_strategy": "scaf_grpo", "steps": 2, "save_steps": 2, "scaf_hint_samples": 2,
            "scaf_warmup_steps": 0}
    t = Trainer(Config.build(args), log=lambda *a: None)
    seen = []
    orig = t.compute_advantages
    t.compute_advantages = lambda batch: (seen.append(batch), orig(batch))[1]
    t.train(progress=False)
    assert len(seen) == 2
    for b in seen:
        for g, rows in groups(b).items():
            levels = [b.columns["hint_level"][r] for r in rows]
            assert levels == [0, 1]  # G=2: the last failed row replaced by the tier-1 success
            plain, hinted = rows
            assert float(b.scalar_rewards[plain]) == 0.0 and float(b.scalar_rewards[hinted]) == 1.0
            assert float(b.advantages[hinted].sum()) > 0 > float(b.advantages[plain].sum())
            ids, _ = tokenize_prompts(t.tok, [with_hint(t.rows[int(b.prompt_uids[hinted])],
                                                        hint_text(HINTS, 1))["prompt"]], 128)
            assert b.prompt_ids[hinted][b.prompt_mask[hinted].bool()].tolist() == ids[0].tolist()
    state = ckpt.read_state(ckpt.latest_checkpoint(t.out))
    streak = state["components"]["rollout/scaf_grpo"]["streak"]
    assert sum(streak.values()) == 4  # 2 steps x 2 prompts, every plain group failed
