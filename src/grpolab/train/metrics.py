"""Metrics: one JSON line per step in OUT/metrics.jsonl, TensorBoard, reward-curve PNG."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..data import json_safe, to_json


class MetricsLog:
    def __init__(self, out: Path, tensorboard: bool, resume_step: int = 0, log=print):
        self.path = Path(out) / "metrics.jsonl"
        self.log = log
        self.truncate(resume_step)
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.writer = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=resume_step + 1)
            except ImportError:  # tensorboard is a core dependency; stay usable without it
                self.writer = None

    def truncate(self, step: int) -> None:
        """Drop lines after ``step`` (left by a run that died after its last checkpoint), and a final line
        cut short by a kill (with a warning); the file is replaced in one step (never half-written)."""
        if not self.path.exists():
            return
        keep = [l for l, m in parse_lines(self.path, log=self.log) if m["step"] <= step]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w") as fh:
            fh.write("".join(l + "\n" for l in keep))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

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


def parse_lines(path: Path, log=None) -> list[tuple[str, dict]]:
    """``(line, record)`` of every line of a metrics file. A final line that is not JSON (cut short by a kill)
    is left out with a warning; a bad line elsewhere raises ``ValueError`` naming file and line."""
    lines = [l for l in Path(path).read_text().splitlines() if l.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "step" not in rec:
                raise ValueError("not a metrics record")
        except ValueError as e:
            if i == len(lines) - 1:
                if log is not None:
                    log(f"[grpolab] warning: {path}:{i + 1}: last line is incomplete ({e}); ignored (a run "
                        f"killed while writing it)")
                break
            raise ValueError(f"{path}:{i + 1}: not a metrics line ({e}); repair or delete it") from None
        out.append((line, rec))
    return out


def read_metrics(out: Path) -> list[dict]:
    p = Path(out) / "metrics.jsonl"
    return [rec for _, rec in parse_lines(p)] if p.exists() else []


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
