"""Synthetic run folders for the report tests (tests/test_report.py, tests/test_report_browser.py)."""
import json
from pathlib import Path

EVIL = '</script><img src=x onerror="document.title=\'pwned\'"><script>alert(1)</script>'


def write_run(root: Path, name: str, steps: int = 6, completions: bool = True, scale: float = 1.0) -> Path:
    run = root / name
    run.mkdir(parents=True)
    rows = [{"step": s, "reward_mean": scale * s / steps, "reward_std": 0.3, "rewards/match/mean": scale * s / steps,
             "rewards/format/mean": 0.5, "kl": 0.01 * s, "entropy": 2.0 - 0.1 * s, "clip_frac_low": 0.01,
             "clip_frac_high": 0.02 * s, "completion_len_mean": 10.0 + s, "frac_truncated": 0.1,
             "frac_zero_std_groups": 0.25} for s in range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 99, "rew')
    (run / "summary.json").write_text(json.dumps({"before": {"n": 40, "accuracy": 0.1, "samples": ["a"]},
                                                  "after": {"n": 40, "accuracy": 0.35}, "skipped_steps": 0}))
    (run / "config.yaml").write_text(f"model: tiny\ntask: repeat\nsteps: {steps}\nlearning_rate: 0.0005\n")
    if completions:
        lines = []
        for s in (2, 4):
            for g in (0, 1):
                for k in range(3):
                    text = EVIL if (s, g, k) == (4, 1, 2) else f"completion s{s} g{g} k{k}"
                    lines.append({"step": s, "group": g, "prompt": f"prompt of group {g} <b>bold?</b>",
                                  "completion": text, "rewards": {"match": float(k == 0), "format": 0.5},
                                  "reward": float(k == 0) + 0.5, "advantage": 1.2 if k == 0 else -0.6,
                                  "tokens": 5 + k, "truncated": k == 2})
        (run / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run
