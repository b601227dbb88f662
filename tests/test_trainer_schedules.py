"""Rollout schedules and in-process resume of everything a checkpoint holds."""
import pytest
import torch

from grpolab.config import Config
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

TIMING = {"rollout_s", "train_s", "tokens_per_s", "peak_rss_mb", "train_seconds_total"}  # process-wide: depends on what ran before


def _trainer(args):
    return Trainer(Config.build(args), log=lambda *a: None)


def test_off_policy_snapshot_is_stale_between_refreshes(tiny_args):
    t = _trainer({**tiny_args, "off_policy_refresh_steps": 3, "steps": 4})
    snapshots = []
    for _ in range(4):
        behavior = t.behavior_policy()
        snapshots.append({n: p.detach().clone() for n, p in behavior.named_parameters()})
        m = t.train_step()
        t.metrics.write(m)
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)
    assert same(snapshots[0], snapshots[1]) and same(snapshots[1], snapshots[2])  # steps 1-3: snapshot of step 0
    assert not same(snapshots[2], snapshots[3])  # refreshed at step 3
    current = {n: p.detach() for n, p in t.model.named_parameters()}
    assert not same(snapshots[3], current)  # the policy moved on since the refresh
    rows = read_metrics(tiny_args["out"])
    assert len(rows) == 4


def test_off_policy_ratio_departs_from_1_exactly_on_stale_steps(tiny_args):
    """The importance ratio pi_theta / pi_old of each step's first update, measured on the batch the trainer
    collected: exp(current log-prob - behaviour log-prob) is 1 on the steps whose snapshot was just refreshed
    (steps 0 and 3 with off_policy_refresh_steps 3) and departs from 1 on the stale ones (1 and 2: sampled by the
    step-0 snapshot after the policy moved). On-policy (refresh 1) it is 1 on every step."""
    def ratios(refresh):
        t = _trainer({**tiny_args, "off_policy_refresh_steps": refresh, "steps": 4,
                      "out": f"{tiny_args['out']}-{refresh}"})
        collect, gaps = t.collect, []

        def spy():
            out = collect()
            batch = out[0]
            now = t.policy.logprobs(t.model, batch, micro_batch_size=16)  # before this step's update
            m = batch.completion_attention_mask.bool()
            gaps.append(float((now - batch.behavior_logprobs)[m].abs().max()))
            return out

        t.collect = spy
        for _ in range(4):
            t.metrics.write(t.train_step())
        return gaps

    stale = ratios(3)
    assert stale[0] < 1e-4 and stale[3] < 1e-4, stale      # fresh snapshot: ratio 1 (to float error)
    assert stale[1] > 1e-2 and stale[2] > 1e-2, stale      # stale snapshot: ratio departs from 1
    assert max(ratios(1)) < 1e-4


def test_resume_in_process_with_snapshot_matches(tiny_args, tmp_path):
    base = {**tiny_args, "off_policy_refresh_steps": 3, "steps": 5, "save_steps": 2, "num_iterations": 2}
    a = _trainer({**base, "out": str(tmp_path / "a")})
    a.train(progress=False)
    b = _trainer({**base, "out": str(tmp_path / "b"), "steps": 4})
    b.train(progress=False)  # checkpoints at 2 and 4
    # pretend it died after step 4 was checkpointed and continue to 5 with the saved config
    c = Trainer(Config.build({**base, "out": str(tmp_path / "b")}), resume=True, log=lambda *a: None)
    assert c.step == 4 and c.behavior_model is not None
    c.train(progress=False)
    ra, rb = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert len(ra) == len(rb) == 5
    for x, y in zip(ra, rb):
        assert {k: v for k, v in x.items() if k not in TIMING} == {k: v for k, v in y.items() if k not in TIMING}


def test_zero_variance_filter_hand_computed():
    from grpolab.algorithms import zero_variance_groups

    r = torch.tensor([1.0, 1.0, 0.0, 1.0, float("nan"), 0.5, 0.5 + 1e-9])
    g = torch.tensor([0, 0, 1, 1, 2, 3, 3])
    keep = zero_variance_groups(r, g)
    # group 0 constant, group 1 varies, group 2 has no scored pair, group 3 differs only by float noise
    assert keep.tolist() == [False, False, True, True, False, False, False]


def test_batch_concat_pads_and_keeps_ids():
    from grpolab.batch import RolloutBatch

    def mk(P, T, gid):
        R = 2
        return RolloutBatch(prompt_ids=torch.ones(R, P, dtype=torch.long), prompt_mask=torch.ones(R, P, dtype=torch.long),
                            completion_ids=torch.full((R, T), 5), completion_mask=torch.ones(R, T),
                            behavior_logprobs=torch.full((R, T), -1.0), group_ids=torch.full((R,), gid),
                            prompt_uids=torch.full((R,), gid), truncated=torch.zeros(R, dtype=torch.bool),
                            rewards=torch.ones(R, 1), columns={"x": [gid] * R})
    b = RolloutBatch.concat([mk(3, 2, 0), mk(5, 4, 1)], pad_id=9)
    assert b.prompt_ids.shape == (4, 5) and b.completion_ids.shape == (4, 4)
    assert b.prompt_ids[0].tolist() == [9, 9, 1, 1, 1] and b.prompt_mask[0].tolist() == [0, 0, 1, 1, 1]
    assert b.completion_ids[0].tolist() == [5, 5, 9, 9] and b.completion_mask[0].tolist() == [1, 1, 0, 0]
    assert b.group_ids.tolist() == [0, 0, 1, 1] and b.columns["x"] == [0, 0, 1, 1] and b.rewards.shape == (4, 1)


def test_dynamic_sampling_keeps_only_groups_with_signal(tiny_args, monkeypatch):
    t = _trainer({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_max_rounds": 3, "steps": 1})
    calls = []
    real_score = t.scorer.score

    def score(batch):  # every other prompt's group gets constant rewards
        errors = real_score(batch)
        for j, g in enumerate(torch.unique(batch.group_ids)):
            rows = batch.group_ids == g
            n = int(rows.sum())
            batch.rewards[rows, 0] = 1.0 if (len(calls) + j) % 2 else torch.arange(n, dtype=torch.float32)
        calls.append(len(torch.unique(batch.group_ids)))
        return errors

    monkeypatch.setattr(t.scorer, "score", score)
    batch, errors, stats = t.collect()
    # round 1: groups 0,2 vary (kept), 1,3 constant; round 2 is a whole new batch of 4 (verl gen_batch_size):
    # groups 1,3 vary, the step has its 4
    assert calls == [4, 4]
    assert len(torch.unique(batch.group_ids)) == 4 and stats["dynamic_sampling/rounds"] == 2
    from grpolab.algorithms import zero_variance_groups
    assert bool(zero_variance_groups(batch.rewards[:, 0], batch.group_ids).all())
    assert stats["dynamic_sampling/dropped_groups"] == 4 and stats["dynamic_sampling/generated_groups"] == 8


def test_dynamic_sampling_cap_skips_step_without_signal(tiny_args, monkeypatch):
    logs = []
    t = Trainer(Config.build({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_max_rounds": 2}),
                log=logs.append)
    real_score = t.scorer.score

    def constant(batch):
        errors = real_score(batch)
        batch.rewards[:] = 1.0
        return errors

    monkeypatch.setattr(t.scorer, "score", constant)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    m = t.train_step()
    assert m["skipped"] == 1 and m["dynamic_sampling/dropped_groups"] == 8 and m["step"] == 1
    assert any("dynamic_sampling_max_rounds" in line for line in logs)
    assert all(torch.equal(before[n], p) for n, p in t.model.named_parameters())


def test_components_compose_dgpo_weights_gspo_ratio_llds(tiny_args):
    """Any estimator + weightings + objective + regularisers combine without new code."""
    args = {**tiny_args, "advantage": "group_mad", "advantage_weightings": ["dgpo_question_weight", "hadw"],
            "policy_loss": "sequence_ratio", "regularizers": ["llds", "entropy_bonus"], "steps": 2,
            "num_iterations": 2}
    t = _trainer(args)
    t.train(progress=False)
    rows = read_metrics(tiny_args["out"])
    assert len(rows) == 2 and all(r["skipped"] == 0 for r in rows)
    assert "advantage/hadw" in t.components and t.components["advantage/hadw"].stateful


def test_invalid_combination_is_a_config_error(tiny_args):
    import pytest

    from grpolab.config import ConfigError
    with pytest.raises(ConfigError, match="micro_batch_size"):
        Config.build({**tiny_args, "policy_loss": "rebel", "num_generations": 4, "micro_batch_size": 6})
    with pytest.raises(ConfigError, match="beta"):
        Config.build({**tiny_args, "regularizers": ["dynamic_kl"], "beta": 0.0})
    with pytest.raises(ConfigError, match="advantage_weightings: 'nope' is not valid"):
        Config.build({**tiny_args, "advantage_weightings": ["nope"]})


def test_kl_straight_through_in_training(tiny_args):
    import pytest

    from grpolab.config import ConfigError
    t = _trainer({**tiny_args, "beta": 0.1, "kl_estimator": "k3", "kl_gradient": "k2", "steps": 2,
                  "num_iterations": 2})
    t.train(progress=False)
    rows = read_metrics(tiny_args["out"])
    assert rows[1]["kl"] is not None and rows[1]["kl"] >= 0  # the logged value is k3's (>= 0)
    with pytest.raises(ConfigError, match="kl_gradient: 'k9' is not valid"):
        Config.build({**tiny_args, "kl_gradient": "k9"})


def test_overlong_penalty_hand_computed():
    from grpolab.rewards.transforms import overlong_penalty

    r = torch.tensor([1.0, 1.0, 1.0, 0.0, float("nan")])
    lengths = torch.tensor([10, 16, 18, 20, 20])
    out = overlong_penalty(r, lengths, max_completion_length=20, overlong_buffer=4)
    # start = 16: 10 -> 0; 16 -> 0; 18 -> (16-18)/4 = -0.5; 20 -> -1.0; NaN stays NaN
    assert out[:4].tolist() == [1.0, 1.0, 0.5, -1.0] and torch.isnan(out[4])
    out = overlong_penalty(r[:1], torch.tensor([21]), max_completion_length=20, overlong_buffer=4,
                           overlong_penalty_factor=0.5)
    assert out.tolist() == [0.5]  # beyond L_max: -1 * factor


def test_mask_truncated_and_reward_transform_in_training(tiny_args):
    t = _trainer({**tiny_args, "mask_truncated_completions": True, "reward_transforms": ["overlong_penalty"],
                  "overlong_buffer": 3, "steps": 1})
    seen = []
    orig = t.compute_advantages
    t.compute_advantages = lambda batch: (seen.append(batch), orig(batch))[1]
    t.train_step()
    batch = seen[0]
    scalar = batch.scalar_rewards
    raw = t.scorer.weights @ torch.nan_to_num(batch.rewards).T
    lengths = batch.completion_attention_mask.sum(-1).float()
    expected = raw + torch.where(lengths <= 3, torch.zeros_like(lengths), (3 - lengths) / 3)
    assert torch.allclose(scalar, expected)
    assert bool((batch.completion_mask[batch.truncated] == 0).all())
    assert bool((batch.advantages[batch.truncated] == 0).all())


def test_uniform_sampler_resumes_to_the_same_choices():
    from grpolab.prompts import SAMPLERS

    a = SAMPLERS.get("uniform")(num_rows=7, seed=3)
    first = a.next(5)
    state = a.state_dict()
    b = SAMPLERS.get("uniform")(num_rows=7, seed=3)
    b.load_state_dict(state)
    assert a.next(9) == b.next(9)
    c = SAMPLERS.get("uniform")(num_rows=7, seed=3)
    assert sorted(c.next(7)) == list(range(7)) and sorted(c.next(7)) == list(range(7))  # each epoch a permutation
    assert len(set(first)) == 5


# ---------------------------------------------------------------- DAPO dynamic sampling metric

def _all_correct_batch(lengths, T):
    """One group, every completion correct (reward column 1.0), completion lengths ``lengths``."""
    from grpolab.batch import RolloutBatch

    R = len(lengths)
    mask = torch.tensor([[1.0] * L + [0.0] * (T - L) for L in lengths])
    return RolloutBatch(prompt_ids=torch.ones(R, 3, dtype=torch.long), prompt_mask=torch.ones(R, 3, dtype=torch.long),
                        completion_ids=torch.full((R, T), 5), completion_mask=mask,
                        behavior_logprobs=torch.full((R, T), -1.0), group_ids=torch.zeros(R, dtype=torch.long),
                        prompt_uids=torch.zeros(R, dtype=torch.long), truncated=torch.zeros(R, dtype=torch.bool),
                        rewards=torch.ones(R, 1), reward_names=["match"], columns={})


def test_dynamic_sampling_filters_on_accuracy_not_shaped_reward(tiny_args):
    from grpolab.algorithms import zero_variance_groups
    from grpolab.recipes import recipe_overrides

    # the example: lengths [10, 10, 10, 18], max 20, overlong buffer 4 -> shaped [1, 1, 1, 0.5]
    args = {**tiny_args, **recipe_overrides("dapo"), "max_completion_length": 20, "overlong_buffer": 4}
    t = _trainer(args)
    assert t.cfg.dynamic_sampling_metric == "accuracy" and t.collector.fn.column == 0  # repeat's "match"
    batch = _all_correct_batch([10, 10, 10, 18], 20)
    assert torch.allclose(t.scorer.scalar(batch), torch.tensor([1.0, 1.0, 1.0, 0.5]))
    values = t.collector.fn.values  # the collector's filter quantity
    assert not zero_variance_groups(values(batch, t.scorer.scalar), batch.group_ids).any()  # DAPO drops it
    t = _trainer({**args, "dynamic_sampling_metric": "reward"})
    values = t.collector.fn.values
    assert zero_variance_groups(values(batch, t.scorer.scalar), batch.group_ids).all()  # shaped reward keeps it
    t = _trainer({**args, "dynamic_sampling_metric": "match"})  # a reward function by name
    assert not zero_variance_groups(t.collector.fn.values(batch, t.scorer.scalar), batch.group_ids).any()


def test_dynamic_sampling_metric_errors_name_the_fix(tiny_args, tmp_path, monkeypatch):
    import json

    import pytest

    from grpolab.config import ConfigError

    with pytest.raises(ConfigError, match="not a reward function"):
        _trainer({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_metric": "nope"})
    with pytest.raises(ConfigError, match="dynamic_sampling_oversample"):
        _trainer({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_oversample": 0.5})
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(8)))
    (tmp_path / "ds_rewards.py").write_text("def exact(completions, answer, **kw):\n"
                                            "    return [float(str(c).strip() == a) for c, a in zip(completions, answer)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds_rewards.py").write_text(
        (tmp_path / "ds_rewards.py").read_text() + "def short(completions, **kw):\n"
        "    return [float(len(str(c)) < 5) for c in completions]\n")
    # one user reward: 'accuracy' is that reward (recipes on user data, stated in the log)
    user = {**tiny_args, "data": str(data), "reward": ["ds_rewards:exact"], "dynamic_sampling": True}
    assert _trainer(user).collector.fn.column == 0
    # several: which one is the accuracy is not knowable, so the error names the choices
    two = {**user, "reward": ["ds_rewards:exact", "ds_rewards:short"]}
    with pytest.raises(ConfigError, match="dynamic_sampling_metric.*exact.*short"):
        _trainer(two)
    assert _trainer({**two, "dynamic_sampling_metric": "short"}).collector.fn.column == 1
    assert _trainer({**two, "dynamic_sampling_metric": "reward"}).collector.fn.column is None


def test_dynamic_sampling_oversamples_and_truncates(tiny_args, monkeypatch):
    t = _trainer({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_oversample": 2.0, "steps": 1})
    calls = []
    monkeypatch.setattr(t.scorer, "score", _every_other_group_varies(t, calls))
    batch, _, stats = t.collect()
    # 8 prompts generated for 4 needed, 4 of them vary: one round, no surplus
    assert calls == [8] and len(torch.unique(batch.group_ids)) == 4
    assert stats["dynamic_sampling/generated_groups"] == 8 and stats["dynamic_sampling/dropped_groups"] == 4
    # factor 3: 12 prompts, 6 vary, the first 4 are kept (verl truncates to the train batch)
    t = _trainer({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_oversample": 3.0, "steps": 1})
    monkeypatch.setattr(t.scorer, "score", _every_other_group_varies(t, calls))
    calls.clear()
    batch, _, stats = t.collect()
    assert calls == [12] and len(torch.unique(batch.group_ids)) == 4 and stats["dynamic_sampling/rounds"] == 1
    ids = torch.unique(batch.group_ids)
    assert (ids[1:] - ids[:-1]).tolist() == [2, 2, 2]  # the first four varying groups (0, 2, 4, 6 of the round)


def test_dynamic_sampling_every_round_is_a_whole_generation_batch(tiny_args, monkeypatch):
    """verl (DAPO's code) generates gen_batch_size prompts in every round, not oversample x the groups still
    needed: with factor 2 and 4 prompts per step, rounds generate 8 and 8 prompts."""
    t = _trainer({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_oversample": 2.0, "steps": 1})
    calls = []
    real_score = t.scorer.score

    def score(batch):  # one group in three varies
        errors = real_score(batch)
        for j, g in enumerate(torch.unique(batch.group_ids)):
            rows = batch.group_ids == g
            batch.rewards[rows, 0] = torch.arange(int(rows.sum()), dtype=torch.float32) if j % 3 == 0 else 1.0
        calls.append(len(torch.unique(batch.group_ids)))
        return errors

    monkeypatch.setattr(t.scorer, "score", score)
    batch, _, stats = t.collect()
    assert calls == [8, 8]  # round 1 keeps 3 (groups 0, 3, 6), round 2 is again a whole batch of 8
    assert len(torch.unique(batch.group_ids)) == 4 and stats["dynamic_sampling/rounds"] == 2
    assert stats["dynamic_sampling/generated_groups"] == 16


@pytest.mark.parametrize("adaptive", [False, True])
def test_dapo_recipe_trains_end_to_end(tiny_args, adaptive):
    from grpolab.recipes import recipe_overrides

    t = _trainer({**tiny_args, **recipe_overrides("dapo"), "steps": 2, "dynamic_sampling_adaptive": adaptive})
    t.train(progress=False)
    rows = read_metrics(tiny_args["out"])
    assert len(rows) == 2
    assert all("dynamic_sampling/rounds" in r or r.get("skipped") for r in rows)
    assert all(("dynamic_sampling/keep_rate" in r) == adaptive for r in rows if not r.get("skipped"))


def test_dynamic_sampling_keys_belong_to_its_collector():
    """The dynamic_sampling_* keys are the collector's parameters: refused (naming the switch) when
    dynamic sampling is off, checked before the run when it is on."""
    import pytest

    from grpolab.config import ConfigError

    with pytest.raises(ConfigError, match=r"parameter of collector/dynamic_sampling.*dynamic_sampling: true"):
        Config.build({"model": "tiny", "dynamic_sampling_metric": "reward"})
    for key in ("dynamic_sampling_max_rounds", "dynamic_sampling_oversample"):
        with pytest.raises(ConfigError, match=f"{key}: must be >= 1"):
            Config.build({"model": "tiny", "dynamic_sampling": True, key: 0})
    cfg = Config.build({"model": "tiny", "dynamic_sampling": True})
    assert cfg.dynamic_sampling_metric == "accuracy" and cfg.dynamic_sampling_max_rounds == 4
    assert "dynamic_sampling_metric" not in Config.build({"model": "tiny"}).to_dict()


def test_the_default_job_takes_the_arithmetic_tasks_own_settings(capsys):
    """`grpolab train` / `grpolab config` on a built-in task with no recipe and no --data take the task's
    run_defaults as their lowest layer (arithmetic: the default job's dynamic sampling and lr); any option wins, and
    recipe runs, --data runs, the Python API and Config.build are unaffected."""
    from grpolab.cli import main, task_run_defaults
    from grpolab.registry import TASKS

    own = TASKS.get("arithmetic").run_defaults
    assert own == {"dynamic_sampling": True, "learning_rate": 1e-5}
    assert task_run_defaults({}, {}) == own and task_run_defaults({"task": "repeat"}, {}) == {}
    assert task_run_defaults({}, {"data": "rows.jsonl"}) == {}
    for args, want in ((["config", "dynamic_sampling"], "True"), (["config", "learning_rate"], "1e-05"),
                       (["config", "--learning_rate", "3e-5", "learning_rate"], "3e-05"),
                       (["config", "--recipe", "grpo", "dynamic_sampling"], "False"),
                       (["config", "--task", "repeat", "dynamic_sampling"], "False")):
        assert main(args) == 0
        assert capsys.readouterr().out.split("   ")[0].endswith(want), args
    assert Config.build({"model": "tiny"}).dynamic_sampling is False  # the library default is TRL's


def test_a_rollout_with_nothing_to_train_skips_the_step(tiny_args):
    """A rollout strategy may return None (nothing to train on this step: dr_zero's solver step when the proposer
    wrote no valid question): the step counts as skipped, the weights stay as they were, the next step trains."""
    tr = Trainer(Config.build({**tiny_args, "steps": 2}), log=lambda *a: None)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    real = tr.strategy
    tr.strategy = lambda **kw: None
    m = tr.train_step()
    assert m["skipped"] == 1 and tr.step == 1 and tr.skipped_steps == 1
    assert all(torch.equal(p, before[n]) for n, p in tr.model.named_parameters())
    tr.strategy = real
    m = tr.train_step()
    assert m["skipped"] == 0 and tr.step == 2 and m["loss"] is not None


def _every_other_group_varies(t, calls):
    real_score = t.scorer.score

    def score(batch):  # the round's groups 0, 2, 4, ... vary; 1, 3, ... are constant
        errors = real_score(batch)
        for j, g in enumerate(torch.unique(batch.group_ids)):
            rows = batch.group_ids == g
            batch.rewards[rows, 0] = 1.0 if j % 2 else torch.arange(int(rows.sum()), dtype=torch.float32)
        calls.append(len(torch.unique(batch.group_ids)))
        return errors
    return score


def test_adaptive_dynamic_sampling_sizes_rounds_by_the_keep_rate(tiny_args, monkeypatch, tmp_path):
    """dynamic_sampling_adaptive: the first round is the fixed one (4 prompts; 2 of 4 groups vary); a round is
    ceil(oversample x need / rate) with rate = (kept + 1) / (generated + 1) over counts decayed 0.8 per step, by
    hand: round 2 of step 1: need 2, rate 3/5 -> 4 prompts (2 vary: done); step 2: counts 0.8 x (4, 8) = (3.2,
    6.4), rate 4.2 / 7.4, need 4 -> ceil(7.05) = 8 prompts in one round. The state resumes; a cap holds."""
    t = _trainer({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_adaptive": True, "steps": 2})
    calls = []
    monkeypatch.setattr(t.scorer, "score", _every_other_group_varies(t, calls))
    batch, _, stats = t.collect()
    assert calls == [4, 4] and stats["dynamic_sampling/rounds"] == 2 and len(torch.unique(batch.group_ids)) == 4
    assert t.collector.fn.seen == [4.0, 8.0] and stats["dynamic_sampling/keep_rate"] == 5 / 9
    fn = t.collector.fn
    fn.seen = [v * fn.DECAY for v in fn.seen]  # what the next call does first, to read its round size
    assert fn.round_size(4, 4) == 8
    fn.seen = [4.0, 8.0]
    calls.clear()
    batch, _, stats = t.collect()
    assert calls == [8] and stats["dynamic_sampling/rounds"] == 1 and len(torch.unique(batch.group_ids)) == 4
    assert fn.seen == pytest.approx([3.2 + 4, 6.4 + 8])
    # the decayed counts are component state: a checkpoint resumes them
    fresh = _trainer({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_adaptive": True, "steps": 2,
                      "out": str(tmp_path / "other")})
    fresh.collector.fn.load_state_dict(fn.state_dict())
    assert fresh.collector.fn.seen == fn.seen and t.collector.stateful
    # the cap: never more than max_rounds x oversample x prompts_per_step prompts in a round
    fn.seen = [0.0, 1000.0]
    assert fn.round_size(4, 4) == 4 * 4 and fn.round_size(1, 4) == 16


def test_adaptive_dynamic_sampling_first_step_is_the_fixed_path(tiny_args):
    """Before any round the keep rate is 1, so the first step's rounds (and batch) are the fixed path's."""
    batches = []
    for adaptive in (False, True):
        t = _trainer({**tiny_args, "dynamic_sampling": True, "dynamic_sampling_adaptive": adaptive, "steps": 1,
                      "out": f"{tiny_args['out']}-{adaptive}"})
        batches.append(t.collect()[0])
    a, b = batches
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.group_ids, b.group_ids)
    assert torch.equal(a.behavior_logprobs, b.behavior_logprobs)
