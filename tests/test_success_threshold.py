"""One shared success threshold (issue 23): the core key ``success_threshold``.

Every component that counts a completion as a success (correct) when its scalar reward is ``>=`` a threshold reads
the core key ``success_threshold``; only components whose paper sets its own value or comparison keep a key of
their own (``KEPT`` below, each with the paper's reason). Each moved component is built the way the trainer builds
it (``Component`` from a ``Config``), with ``success_threshold`` set to a value that changes what it does, and the
change is checked against an expectation computed here.
"""
import inspect
import math
import re

import pytest
import torch
import yaml

from grpolab import cli
from grpolab.algorithms.adv_shaping import sgrpo_weight
from grpolab.algorithms.advantages import group_zscore
from grpolab.batch import INJECTED
from grpolab.components import Component
from grpolab.config import CORE_KEYS, Config, ConfigError
from grpolab.registry import (ADVANTAGES, ALL_REGISTRIES, BATCH_STAGES, REPLACED_KEYS, REWARD_TRANSFORMS,
                              ROLLOUT_STRATEGIES, SAMPLERS, WEIGHTINGS, declared_params)

from _helpers import countdown_trainer
from test_rollout_hints import FakeCtx, row as hint_row

# The "correct" thresholds that stay a component's own key, and why (the paper's value or comparison).
KEPT = {
    "dcpo_success_threshold": "DCPO (arXiv:2601.12730): the authors' _compute_bool_reward_by_score counts reward "
                              "> 0.05 as correct (strict >, 0.05)",
    "sgrpo_success_threshold": "S-GRPO (github.com/shenpeijun0212/S-GRPO): the authors count reward > 0 as a "
                               "success (strict >, 0)",
    "lead_correct_threshold": "GRPO-LEAD (arXiv:2504.09696): the authors' code counts reward > 0 as correct "
                              "(strict >, 0; wrong answers score -1 or 0)",
    "shaping_correct_threshold": "reward transforms test one reward column (accuracy), before the scalar reward "
                                 "exists, at 0.5 (not a success threshold on the scalar reward)",
}

SAMPLERS_MOVED = ["knapsack", "ar3po", "gain_rl", "auto_group", "erpo", "rollout_gdro", "vade", "vas",
                  "srpo_history", "prompt_gdro"]
HINT_STRATEGIES = ["scaf_grpo", "guide", "ghpo"]
INJECTION_STRATEGIES = ["gcpo_reference", "dagrpo_anchors", "thinktuning", "edge_correction"]


def core_default(key):
    return getattr(Config(), key)


# ------------------------------------------------------------------ (c) no component keeps a threshold of its own

def test_only_the_paper_specific_thresholds_are_component_keys():
    own = {}
    for reg in ALL_REGISTRIES.values():
        for name, obj in reg.items():
            for key in declared_params(obj):
                if re.fullmatch(r".*_(success|correct)_threshold", key):
                    own.setdefault(key, []).append(f"{reg.kind}/{name}")
    assert set(own) == set(KEPT), own
    assert not set(own) & set(REPLACED_KEYS)
    assert "success_threshold" in CORE_KEYS and core_default("success_threshold") == 1.0


def test_every_replaced_key_names_components_that_take_the_shared_key():
    """REPLACED_KEYS' owners exist and take ``success_threshold`` (keyword-only, no default but the core one)."""
    by_label = {f"{reg.kind}/{name}": obj for reg in ALL_REGISTRIES.values() for name, obj in reg.items()}
    owners = set()
    for old, (new, labels) in REPLACED_KEYS.items():
        assert new == "success_threshold" and old.endswith("_success_threshold")
        for label in labels:
            obj = by_label[label]
            p = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj).parameters.get("success_threshold")
            assert p is not None and p.kind == p.KEYWORD_ONLY, label
            assert p.default in (inspect.Parameter.empty, core_default("success_threshold")), label
            owners.add(label.split("/")[1])
    assert owners == set(SAMPLERS_MOVED) | set(HINT_STRATEGIES) | set(INJECTION_STRATEGIES)
    assert len(REPLACED_KEYS) == 17


# ---------------------------------------------------------------- (a) samplers read the shared key

N, G = 4, 4
# rewards per prompt uid: at threshold 0.5, 8 of the 15 scored rows succeed (uid 0 all of its rows), at the default
# 1.0 one does (uid 2's 1.0); NaN is neither
REWARDS = {0: [0.5, 0.75, 0.6, 0.9], 1: [0.0, 0.5, 0.0, 0.0], 2: [1.0, 0.0, math.nan, 0.25],
           3: [0.5, 0.5, 0.25, 0.0]}


def build_sampler(name, **settings):
    extra = {"vas_tds_weight": 0.0} if name == "vas" else {}
    cfg = Config.build({"prompt_sampler": name, **extra, **settings})
    return Component(SAMPLERS.get(name), cfg, name, num_rows=N, seed=0).fn


def drive(sampler, transform=lambda r: r, steps=3):
    """Three steps of next / feedback; the choices (and budgets, temperatures) the sampler made."""
    seen = []
    for _ in range(steps):
        idx = sampler.next(N)
        seen.append(list(idx))
        for extra in ("budgets", "temperatures"):
            if hasattr(sampler, extra):
                seen.append(list(getattr(sampler, extra)(idx)))
        uids = torch.tensor([u for u in idx for _ in range(G)])
        r = transform(torch.tensor([x for u in idx for x in REWARDS[u]], dtype=torch.float32))
        sampler.feedback(prompt_uids=uids, rewards=r, group_ids=uids, reward_matrix=r[:, None],
                         lengths=torch.ones(len(uids)), step=0)
    return seen


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(torch.nan_to_num(a.double(), nan=-7.0),
                                                       torch.nan_to_num(b.double(), nan=-7.0)))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def binarized(r, t):
    """0/1 rewards with 1 exactly where ``r >= t`` (NaN stays NaN): what a success at threshold t means."""
    return torch.where(torch.isnan(r), r, (r >= t).to(r.dtype))


@pytest.mark.filterwarnings("ignore:gain_rl. the model's angle-concentration scores")  # no model here: scores 0
@pytest.mark.parametrize("name", SAMPLERS_MOVED)
def test_sampler_reads_the_shared_success_threshold(name):
    """At success_threshold 0.5 a sampler given rewards r does exactly what it does at the default (1.0) given
    1[r >= 0.5]; given r at the default it does something else (only one success is counted)."""
    shared = build_sampler(name, success_threshold=0.5)
    assert threshold_of(shared) == 0.5
    choices = drive(shared)
    expected = build_sampler(name)
    expected_choices = drive(expected, lambda r: binarized(r, 0.5))
    assert same(choices, expected_choices) and same(shared.state_dict(), expected.state_dict()), name
    default = build_sampler(name)
    default_choices = drive(default)
    assert not (same(choices, default_choices) and same(shared.state_dict(), default.state_dict())), name


def threshold_of(sampler):
    return sampler.classifier.threshold if hasattr(sampler, "classifier") else sampler.threshold


def test_sampler_default_is_the_core_default():
    for name in SAMPLERS_MOVED:
        assert threshold_of(build_sampler(name)) == core_default("success_threshold") == 1.0


# ----------------------------------------------------------- (a) hint strategies and AR3PO read the shared key

class PartialCtx(FakeCtx):
    """FakeCtx whose wrong completions ('no') score 0.5 instead of 0: successes at threshold 0.5, not at 1.0."""

    def score(self, batch):
        r = torch.tensor([1.0 if c == "ok" else 0.5 for c in batch.columns["completion"]])
        batch.rewards, batch.reward_names = r[:, None], ["acc"]
        return r


def solve(uid, text, k):
    """uid 0 solves its plain prompt; uid 1 only with guidance in the prompt."""
    return uid == 0 or "Hints:" in text or "beginning part of the answer" in text


def run_strategy(name, ctx, rows, uids, **settings):
    comp = Component(ROLLOUT_STRATEGIES.get(name), Config.build({"rollout_strategy": name, **settings}), name)
    ctx.new_step()
    ctx.calls = []
    off = ctx.allocate_groups(len(rows))
    return comp(ctx=ctx, rows=rows, uids=uids, group_offset=off, budgets=None, temperatures=None, step=0)


@pytest.mark.parametrize("name", HINT_STRATEGIES)
@pytest.mark.parametrize("threshold", [None, 0.5, 0.75])
def test_hint_strategy_reads_the_shared_success_threshold(name, threshold):
    rows, uids = [hint_row(0), hint_row(1)], [0, 1]
    ctx = PartialCtx(solve)
    settings = {} if threshold is None else {"success_threshold": threshold}
    b = run_strategy(name, ctx, rows, uids, **settings)
    t = 1.0 if threshold is None else threshold
    plain_score = {0: 1.0, 1: 0.5}  # every plain completion of a uid scores the same
    expect_hinted = {u for u in uids if not plain_score[u] >= t}
    hinted = {u for u, lv in zip(b.prompt_uids.tolist(), b.columns["hint_level"]) if lv > 0}
    assert hinted == expect_hinted
    assert len(ctx.calls) == (1 if not expect_hinted else 2)  # hinted prompts are sampled again (tier 1 solves)


@pytest.mark.parametrize("threshold", [None, 0.5])
def test_ar3po_rollout_reads_the_shared_success_threshold(threshold):
    rows, uids = [hint_row(0), hint_row(1)], [0, 1]
    ctx = PartialCtx(solve)
    settings = {"ar3po_stage_size": 2, "ar3po_max_stages": 2, "ar3po_reuse": False}
    if threshold is not None:
        settings["success_threshold"] = threshold
    b = run_strategy("ar3po", ctx, rows, uids, **settings)
    t = 1.0 if threshold is None else threshold
    stage_score = {0: 1.0, 1: 0.5}
    expect = {g: 2 if stage_score[u] >= t else 4 for g, u in enumerate(uids)}  # solved in stage 1, or two stages
    assert {g: int((b.group_ids == g).sum()) for g in expect} == expect


# ------------------------------------------------------- (a) injection strategies read the shared key

L = 24


@pytest.fixture(scope="module")
def tr(tmp_path_factory):
    """A tiny-model trainer on countdown; its RolloutContext is what the strategies receive."""
    return countdown_trainer(tmp_path_factory.mktemp("thr") / "run", "gcpo_reference", L)


def expected_injected(name, threshold, G=4, groups=3):
    """Rows with injected tokens, and rows per group: none below every reward (-1), all above it (100)."""
    if threshold < 0:
        return [], [G] * groups
    if name == "gcpo_reference":  # the last rollout of each group is replaced by the reference
        return [g * G + G - 1 for g in range(groups)], [G] * groups
    if name == "dagrpo_anchors":  # one anchor added to each group
        return [g * (G + 1) + G for g in range(groups)], [G + 1] * groups
    if name == "thinktuning":  # ceil(0.5 * failed) rollouts of each group get feedback
        return None, [G] * groups
    return list(range(G * groups)), [G] * groups  # edge_correction: every failed rollout is corrected


@pytest.mark.parametrize("name", INJECTION_STRATEGIES)
@pytest.mark.parametrize("threshold", [-1.0, 100.0])
def test_injection_strategy_reads_the_shared_success_threshold(tr, name, threshold):
    """success_threshold -1: every rollout succeeds (countdown rewards are >= 0), nothing is injected;
    100: every rollout fails, every group gets the strategy's injection."""
    idx = [i for i, r in enumerate(tr.rows) if len("Answer: " + r["solution"]) <= L - 2][:3]
    rows = [tr.rows[i] for i in idx]
    comp = Component(ROLLOUT_STRATEGIES.get(name),
                     Config.build({"rollout_strategy": name, "success_threshold": threshold}), name)
    b = comp(ctx=tr.ctx, rows=rows, uids=idx, group_offset=0, budgets=None, temperatures=None, step=0)
    injected = (b.token_origin == INJECTED).any(-1).nonzero().squeeze(-1).tolist()
    rows_expected, sizes = expected_injected(name, threshold)
    assert [int((b.group_ids == g).sum()) for g in range(3)] == sizes
    if rows_expected is None:  # thinktuning: 2 of the 4 rollouts of each group
        assert [sum(1 for i in injected if int(b.group_ids[i]) == g) for g in range(3)] == [2, 2, 2]
    else:
        assert injected == rows_expected
    if threshold < 0:
        s = tr.ctx.scalar(b)
        assert (torch.isnan(s) | (s >= threshold)).all()


# --------------------------------------------------------------------- (b) the kept keys still override

def test_sgrpo_keeps_its_own_threshold():
    r = torch.tensor([0.3, 0.5, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    cfg = Config.build({"advantage": "sgrpo_noise_aware", "success_threshold": 0.5, "sgrpo_success_threshold": 0.25})
    out = Component(ADVANTAGES.get("sgrpo_noise_aware"), cfg, "sgrpo_noise_aware")(rewards=r, group_ids=g)
    n, k = torch.tensor([4.0, 4.0]), torch.tensor([2.0, 1.0])  # rewards > 0.25: 0.3 and 0.5; 1.0
    expected = group_zscore(r, g, advantage_epsilon=cfg.advantage_epsilon) * sgrpo_weight(n, k, 0.1)[g].float()
    assert torch.allclose(out, expected)
    k_shared = torch.tensor([1.0, 1.0])  # what >= 0.5 would count
    assert not torch.allclose(out, group_zscore(r, g, advantage_epsilon=cfg.advantage_epsilon)
                              * sgrpo_weight(n, k_shared, 0.1)[g].float())
    assert Config.build({"advantage": "sgrpo_noise_aware"}).sgrpo_success_threshold == 0.0


def test_lead_keeps_its_own_threshold():
    r = torch.tensor([0.3, 0.5, 0.0, 0.0])
    g = torch.zeros(4, dtype=torch.long)
    a = torch.tensor([1.0, 1.0, -1.0, -1.0])
    cfg = Config.build({"advantage_weightings": ["lead_difficulty_weight"], "success_threshold": 0.5,
                        "lead_correct_threshold": 0.25})
    out = Component(WEIGHTINGS.get("lead_difficulty_weight"), cfg, "lead")(advantages=a, rewards=r, group_ids=g)

    def w(x):  # the authors' logistic, A 0.4, B 1.5, x0 0.75, k 10
        return 0.4 + 1.1 / (1 + math.exp(10 * (x - 0.75)))
    rho = 0.5  # rewards > 0.25: two of four
    assert torch.allclose(out, torch.tensor([w(rho), w(rho), -w(1 - rho), -w(1 - rho)]))
    assert Config.build({"advantage_weightings": ["lead_difficulty_weight"]}).lead_correct_threshold == 0.0


def test_dcpo_keeps_its_own_threshold():
    cfg = Config.build({"batch_stages": ["dcpo"], "success_threshold": 0.5})
    assert Component(BATCH_STAGES.get("dcpo"), cfg, "dcpo").fn.threshold == 0.05  # the authors' value
    cfg = Config.build({"batch_stages": ["dcpo"], "success_threshold": 0.5, "dcpo_success_threshold": 0.25})
    assert Component(BATCH_STAGES.get("dcpo"), cfg, "dcpo").fn.threshold == 0.25


def test_reward_shaping_keeps_its_own_column_threshold():
    cfg = Config.build({"reward_transforms": ["gcpo_length"], "success_threshold": 0.1,
                        "shaping_correct_threshold": 0.75})
    comp = Component(REWARD_TRANSFORMS.get("gcpo_length"), cfg, "gcpo_length")
    acc = torch.tensor([0.5, 0.8, 1.0])
    out = comp(rewards=torch.zeros(3), lengths=torch.tensor([32, 32, 128]), reward_matrix=acc[:, None],
               reward_names=["accuracy"])
    assert torch.allclose(out, torch.tensor([0.0, 0.25, 0.5], dtype=out.dtype))  # accuracy >= 0.75 only


# ------------------------------------------------------------------- old keys: errors, and resuming old runs

@pytest.mark.parametrize("old", sorted(REPLACED_KEYS))
def test_a_replaced_key_is_an_error_that_names_success_threshold(old):
    component = {"rollout strategy": "rollout_strategy", "prompt sampler": "prompt_sampler"}
    kind, name = REPLACED_KEYS[old][1][0].split("/")
    with pytest.raises(ConfigError, match=r"unknown key '%s'.*success_threshold" % old):
        Config.build({component[kind]: name, old: 0.5}, sources=["my.yaml"])


def test_a_replaced_key_error_says_what_replaced_it():
    with pytest.raises(ConfigError, match="unknown key 'knapsack_success_threshold': it was a parameter of "
                                         "prompt sampler/knapsack, replaced by the key 'success_threshold'"):
        Config.build({"prompt_sampler": "knapsack", "knapsack_success_threshold": 0.5}, sources=["my.yaml"])


def test_grpolab_config_explains_a_replaced_key():
    cfg = Config.build({})
    with pytest.raises(ConfigError, match="unknown key 'gdro_success_threshold': it was a parameter of "
                                         "prompt sampler/prompt_gdro, replaced by the key 'success_threshold'"):
        cli._show_key(cfg, "gdro_success_threshold")


def old_run(tmp_path, **old_keys):
    out = tmp_path / "run"
    out.mkdir()
    saved = Config.build({"prompt_sampler": "knapsack", "out": str(out)}).to_dict()
    saved.pop("success_threshold")  # a config.yaml written before the key existed
    (out / "config.yaml").write_text(yaml.safe_dump({**saved, **old_keys}))
    return type("Args", (), {"resume": str(out), "recipe": None, "config": None})


def test_resuming_a_run_with_an_old_non_default_threshold_is_refused(tmp_path):
    args = old_run(tmp_path, knapsack_success_threshold=0.5)
    with pytest.raises(ConfigError, match=r"knapsack_success_threshold: 0.5, a key grpolab has replaced by "
                                              r"success_threshold; .*success_threshold: 0.5"):
        cli._resume_config(args, {})


def test_resuming_a_run_with_old_default_thresholds_goes_on(tmp_path, capsys):
    """The old keys at their default (every one, as an old config.yaml listed them) change nothing: dropped, and
    said so; an old key of a component this run does not select never applied, whatever its value."""
    args = old_run(tmp_path, knapsack_success_threshold=1.0, vade_success_threshold=0.25)
    cfg = cli._resume_config(args, {})
    assert cfg.success_threshold == 1.0 and cfg.prompt_sampler == "knapsack"
    err = capsys.readouterr().err
    assert "knapsack_success_threshold -> success_threshold" in err and "none changes what this run trains" in err


def test_resuming_with_an_old_key_on_the_command_line_names_the_replacement(tmp_path):
    args = old_run(tmp_path)
    with pytest.raises(ConfigError, match="--knapsack_success_threshold is not a key of this run: .*replaced by "
                                              "the key 'success_threshold'"):
        cli._resume_config(args, {"knapsack_success_threshold": "0.5"})
