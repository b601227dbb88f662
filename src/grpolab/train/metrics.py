"""Metrics: one JSON line per step in OUT/metrics.jsonl, the trackers (report_to), sampled completions in
OUT/completions.jsonl, reward-curve PNG."""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from ..data import json_safe, to_json


class MetricsLog:
    """OUT/metrics.jsonl plus the run's trackers (``report_to``; train/trackers.py). ``trackers`` is a list of
    names (``True``/``False`` still mean tensorboard / none, as the ``tensorboard`` key did)."""

    def __init__(self, out: Path, trackers=True, resume_step: int = 0, log=print, config: dict | None = None):
        from .trackers import open_trackers, tracker_names
        self.path = Path(out) / "metrics.jsonl"
        self.log = log
        self.truncate(resume_step)
        if isinstance(trackers, bool):
            trackers = ["tensorboard"] if trackers else []
        self.trackers = open_trackers(tracker_names(trackers), out, config, resume_step=resume_step, log=log)

    def truncate(self, step: int) -> None:
        """Drop lines after ``step`` (left by a run that died after its last checkpoint), and a final line
        cut short by a kill (with a warning); the file is replaced in one step (never half-written)."""
        truncate_jsonl(self.path, step, log=self.log)

    def write(self, metrics: dict) -> None:
        metrics = json_safe(metrics)
        append_records(self.path, [metrics], self.log)
        for t in self.trackers:
            t.log(metrics, metrics["step"])

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        for t in self.trackers:
            t.log_table(name, columns, rows, step)

    def log_images(self, name: str, images, step: int) -> None:
        for t in self.trackers:
            t.log_images(name, images, step)

    def close(self) -> None:
        for t in self.trackers:
            t.close()
        self.trackers = []


def progress_fields(m: dict) -> dict[str, str]:
    """The progress bar's fields for the step metrics ``m``. A step that trained on nothing says so in plain
    words (``reward=0 groups kept``: dynamic sampling kept no group; ``reward=skipped``: the rollout had nothing
    to train on), and a step whose every reward was unscorable ``reward=unscorable``, never ``nan``."""
    reward = m.get("reward_mean")
    if reward is not None:
        shown = f"{reward:.3f}"
    elif m.get("dynamic_sampling/kept_groups") == 0:
        shown = "0 groups kept"
    elif m.get("skipped") and "loss" not in m:
        shown = "skipped"
    else:
        shown = "unscorable"
    return {"reward": shown, "step_s": f"{m.get('rollout_s', 0.0) + m.get('train_s', 0.0):.1f}",
            "len": f"{m.get('completion_len_mean') or 0:.0f}"}


def append_line(path: Path, record: dict) -> None:
    """Append one JSON line in a single write, flushed: a kill leaves at most a cut final line, which
    ``parse_lines`` drops."""
    with Path(path).open("a") as fh:
        fh.write(to_json(record) + "\n")
        fh.flush()


def append_records(path: Path, records: list[dict], log=print) -> bool:
    """Append ``records`` (:func:`append_line`); if they cannot be written (a full disk), take back what part of
    them was written, warn naming the file and the cause, and return False: the run goes on without them."""
    from .rundir import write_failure

    path = Path(path)
    size = path.stat().st_size if path.exists() else 0
    try:
        for r in records:
            append_line(path, r)
    except OSError as e:
        why = write_failure(e, path)
        if why is None:
            raise
        with contextlib.suppress(OSError):
            os.truncate(path, size)  # never a cut line between two good ones
        log(f"[grpolab] warning: {path} could not be written: {why}; step {records[0].get('step')}'s lines "
            f"are skipped and the run goes on")
        return False
    return True


def truncate_jsonl(path: Path, step: int, log=None) -> None:
    """Keep the records of a ``step``-keyed JSONL file up to ``step`` (a resume goes on from its checkpoint's
    step, so lines written after it are written again), replacing the file in one step."""
    path = Path(path)
    if not path.exists():
        return
    keep = [l for l, m in parse_lines(path, log=log) if m["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write("".join(l + "\n" for l in keep))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


COMPLETION_COLUMNS = ["step", "group", "prompt", "completion", "reward", "advantage", "tokens", "truncated"]


class CompletionsLog:
    """OUT/completions.jsonl: every ``every`` steps (and at the first and the last), one line per completion of
    ``groups`` seeded-chosen groups (all groups when 0): step, group id, prompt, completion, each reward column
    (``rewards``), the scalar reward, the advantage and the token count. ``advantage`` is sequence-level: the
    mean of the row's per-token advantages over its completion tokens (the row's scalar advantage for estimators
    that give every token the same value). A resume drops the lines after its checkpoint's step, as
    metrics.jsonl does."""

    def __init__(self, out: Path, every: int, groups: int, seed: int = 0, resume_step: int = 0, log=print):
        self.path = Path(out) / "completions.jsonl"
        self.every, self.groups, self.seed, self.log = every, groups, seed, log
        truncate_jsonl(self.path, resume_step, log=log)

    def due(self, step: int, last: bool = False) -> bool:
        """Whether ``step`` is logged: every ``every`` steps, and the first and the ``last`` step of a run, so that
        a run shorter than ``every`` shows its text too (``every`` 0: never)."""
        return self.every > 0 and (step % self.every == 0 or step == 1 or last)

    def records(self, batch, describe, step: int) -> list[dict]:
        """The lines for ``step`` from a scored batch with advantages (the groups as generated).
        ``describe(batch, i) -> {"prompt": ..., "completion": ..., ...}``: the policy's view of row ``i``
        (``PolicyBase.describe``: decoded text for a causal LM)."""
        import random

        gids = batch.group_ids.tolist()
        uniq = list(dict.fromkeys(gids))
        chosen = uniq if self.groups <= 0 or self.groups >= len(uniq) else \
            random.Random(self.seed * 1_000_003 + step).sample(uniq, self.groups)
        chosen = set(chosen)
        mask = batch.completion_attention_mask.float()
        tokens = mask.sum(-1)
        adv = batch.advantages.float()
        seq_adv = (adv * mask).sum(-1) / tokens.clamp(min=1) if adv.dim() == 2 else adv
        scalar = batch.scalar_rewards
        out = []
        for i, g in enumerate(gids):
            if g not in chosen:
                continue
            rec = {"step": step, "group": int(g), **describe(batch, i),
                   "rewards": {n: float(batch.rewards[i, k]) for k, n in enumerate(batch.reward_names)},
                   "reward": float(scalar[i]) if scalar is not None else None,
                   "advantage": float(seq_adv[i]), "tokens": int(tokens[i]), "truncated": bool(batch.truncated[i])}
            out.append(json_safe(rec))
        return out

    def write(self, records: list[dict]) -> None:
        if records:
            append_records(self.path, records, self.log)


def completions_table(records: list[dict]) -> tuple[list[str], list[list]]:
    """``(columns, rows)`` of completion records for a tracker's table (each reward column its own column)."""
    names = list(dict.fromkeys(n for r in records for n in r["rewards"]))
    columns = COMPLETION_COLUMNS[:4] + [f"rewards/{n}" for n in names] + COMPLETION_COLUMNS[4:]
    rows = [[r[c] for c in COMPLETION_COLUMNS[:4]] + [r["rewards"].get(n) for n in names]
            + [r[c] for c in COMPLETION_COLUMNS[4:]] for r in records]
    return columns, rows


def read_completions(out: Path) -> list[dict]:
    p = Path(out) / "completions.jsonl"
    return [rec for _, rec in parse_lines(p)] if p.exists() else []


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


class DiscardLog:
    """Stands for :class:`MetricsLog` and :class:`CompletionsLog` on processes that write no files (the ranks
    other than 0 of a distributed run: rank 0 logs the metrics, which every rank computes from the same
    gathered batch and reduced sums)."""

    def write(self, *args, **kwargs) -> None:
        pass

    def log_table(self, *args, **kwargs) -> None:
        pass

    def log_images(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass

    def due(self, step: int, last: bool = False) -> bool:
        return False
