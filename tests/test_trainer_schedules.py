"""Rollout schedules and in-process resume of everything a checkpoint holds."""
import torch

from grpolab.config import Config
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

TIMING = {"rollout_s", "train_s", "tokens_per_s"}


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
    # stale rollouts: behaviour log-probs differ from the current policy's, so the ratio is not 1
    rows = read_metrics(tiny_args["out"])
    assert len(rows) == 4


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
