"""grpolab doctor: each check fires on a synthetic metrics file showing its pattern and not on a healthy one."""
import json

import pytest

from grpolab.cli import main
from grpolab.report import doctor


def healthy_row(step: int) -> dict:
    return {"step": step, "reward_mean": 0.3 + 0.01 * step, "reward_std": 0.4, "rewards/acc/mean": 0.3,
            "rewards/acc/unscorable": 0, "reward_errors": 0, "loss": 0.01, "kl": 0.02, "entropy": 1.5,
            "clip_frac_low": 0.01, "clip_frac_high": 0.02, "grad_norm": 0.5, "skipped": 0,
            "completion_len_mean": 100.0 + step, "completion_len_max": 180, "frac_truncated": 0.05,
            "frac_zero_std_groups": 0.2}


HEALTHY_SUMMARY = {"before": {"accuracy": 0.30, "reward_mean": 0.3}, "after": {"accuracy": 0.40, "reward_mean": 0.4},
                   "skipped_steps": 0}


def write_run(tmp_path, rows, summary=HEALTHY_SUMMARY, truncated_tail: str = ""):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + truncated_tail)
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.yaml").write_text("model: tiny\ntask: repeat\n")
    return run


def with_pattern(change):
    rows = [healthy_row(s) for s in range(1, 21)]
    for r in rows:
        change(r)
    return rows


# check name -> a change to every step's metrics (step known) that shows the pattern
PATTERNS = {
    "reward_constant": lambda r: r.update(reward_std=0.0, reward_mean=0.0),
    "zero_variance_groups": lambda r: r.update(frac_zero_std_groups=0.8),
    "entropy_collapse": lambda r: r.update(entropy=1.5 if r["step"] == 1 else 0.01),
    "length_explosion": lambda r: r.update(completion_len_mean=100.0 if r["step"] == 1 else 500.0),
    "length_collapse": lambda r: r.update(completion_len_mean=100.0 if r["step"] == 1 else 10.0),
    "kl_runaway": lambda r: r.update(kl=0.02 if r["step"] < 15 else 3.0),
    "clip_fraction": lambda r: r.update(clip_frac_low=0.15, clip_frac_high=0.15),
    "truncation": lambda r: r.update(frac_truncated=0.6),
    "reward_errors": lambda r: r.update(reward_errors=2 if r["step"] == 7 else 0),
    "skipped_steps": lambda r: r.update(skipped=1 if r["step"] == 4 else 0),
    "nothing_trained": lambda r: r.update(grad_norm=0.0),  # rewards vary (reward_std 0.4): nothing trained
}


def test_healthy_run_has_no_findings(tmp_path, capsys):
    run = write_run(tmp_path, [healthy_row(s) for s in range(1, 21)])
    assert doctor.diagnose(run)["findings"] == []
    assert main(["doctor", str(run)]) == 0
    assert "healthy" in capsys.readouterr().out


@pytest.mark.parametrize("check", sorted(PATTERNS))
def test_each_pattern_is_caught_with_evidence_and_fix(tmp_path, check, capsys):
    run = write_run(tmp_path, with_pattern(PATTERNS[check]))
    result = doctor.diagnose(run)
    assert [f["check"] for f in result["findings"]] == [check]
    f = result["findings"][0]
    assert "step" in f["evidence"] and f["fix"] and f["steps"]
    assert main(["doctor", str(run), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["findings"][0]["check"] == check


def test_pattern_thresholds_are_the_named_constants(tmp_path):
    # just under / just over ZERO_STD_GROUPS_MAX and TRUNCATION_MAX
    for key, const, check in [("frac_zero_std_groups", doctor.ZERO_STD_GROUPS_MAX, "zero_variance_groups"),
                              ("frac_truncated", doctor.TRUNCATION_MAX, "truncation")]:
        for delta, fires in [(-0.01, False), (0.01, True)]:
            rows = with_pattern(lambda r: r.update({key: const + delta}))
            got = [c(rows, HEALTHY_SUMMARY) for c in doctor.CHECKS]
            assert any(g is not None and g.check == check for g in got) is fires, (key, delta)


def test_unscorable_column_is_reported(tmp_path):
    run = write_run(tmp_path, with_pattern(lambda r: r.update({"rewards/acc/unscorable": 3})))
    (f,) = doctor.diagnose(run)["findings"]
    assert f["check"] == "reward_errors" and "rewards/acc/unscorable" in f["evidence"]


def test_eval_worse(tmp_path):
    summary = {"before": {"accuracy": 0.5}, "after": {"accuracy": 0.3}, "skipped_steps": 0}
    run = write_run(tmp_path, [healthy_row(s) for s in range(1, 21)], summary)
    (f,) = doctor.diagnose(run)["findings"]
    assert f["check"] == "eval_worse" and "0.5" in f["evidence"] and "0.3" in f["evidence"]
    slight = {"before": {"accuracy": 0.5}, "after": {"accuracy": 0.49}}
    assert doctor.check_eval_worse([], slight) is None


def test_skipped_steps_from_summary_only():
    assert doctor.check_skipped_steps([healthy_row(1)], {"skipped_steps": 2}).check == "skipped_steps"


def test_run_in_progress_truncated_last_line_and_no_summary(tmp_path):
    run = write_run(tmp_path, [healthy_row(s) for s in range(1, 6)], summary=None,
                    truncated_tail='{"step": 6, "reward_mea')
    result = doctor.diagnose(run)
    assert result["steps"] == 5 and result["findings"] == []
    assert any("last line" in n for n in result["notes"]) and any("summary.json" in n for n in result["notes"])


def test_kl_null_is_ignored(tmp_path):
    run = write_run(tmp_path, with_pattern(lambda r: r.update(kl=None)))
    assert doctor.diagnose(run)["findings"] == []


def test_not_a_run_folder(tmp_path, capsys):
    assert main(["doctor", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err
