"""Metrics: one JSON line per step in OUT/metrics.jsonl, TensorBoard, reward-curve PNG."""
from __future__ import annotations

import json
from pathlib import Path

from ..data import json_safe, to_json


class MetricsLog:
    def __init__(self, out: Path, tensorboard: bool, resume_step: int = 0):
        self.path = Path(out) / "metrics.jsonl"
        self.truncate(resume_step)
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.writer = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=resume_step + 1)
            except ImportError:  # tensorboard is a core dependency; stay usable without it
                self.writer = None

    def truncate(self, step: int) -> None:
        """Drop lines after ``step`` (left by a run that died after its last checkpoint)."""
        if not self.path.exists():
            return
        keep = [l for l in self.path.read_text().splitlines() if l.strip() and json.loads(l)["step"] <= step]
        self.path.write_text("".join(l + "\n" for l in keep))

    def write(self, metrics: dict) -> None:
        metrics = json_safe(metrics)
        with self.path.open("a") as fh:
            fh.write(to_json(metrics) + "\n")
        if self.writer is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None and k != "step":
                    self.writer.add_scalar(k, v, metrics["step"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(out: Path) -> list[dict]:
    p = Path(out) / "metrics.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []


def plot_rewards(out: Path) -> Path | None:
    rows = read_metrics(out)
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r.get("reward_mean") for r in rows], label="reward_mean")
    for k in rows[0]:
        if k.startswith("rewards/") and k.endswith("/mean"):
            ax.plot(steps, [r.get(k) for r in rows], label=k, alpha=0.6)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(out) / "reward_curve.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
