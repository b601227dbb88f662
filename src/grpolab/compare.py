"""``grpolab compare``: a grid of recipes (or config variants) x seeds on one task, at one budget, with CIs.

Every run is a fresh ``grpolab train`` process (``OUT/runs/ARM/seedS``, its
output in ``OUT/logs/``), so runs cannot leak state into each other. The grid is
resumable: a run with a ``summary.json`` is finished and never redone, a run
with a checkpoint continues with ``grpolab train --resume``, anything else
starts again. ``OUT/compare_spec.json`` records the grid; rerunning with
another grid into the same ``--out`` is refused.

Budget (``--budget``): ``steps`` (the ``--steps`` every run gets), or
``tokens=N`` / ``completions=N`` / ``seconds=N`` (every run stops once it has
sampled N tokens / N completions / spent N seconds in training steps:
``max_generated_tokens`` etc., with ``steps`` as the upper bound). Methods that
generate extra rollouts (refills, hints, replay, trees) are charged for them:
the trainer counts every sampled token (:mod:`grpolab.generation.counting`).
The table reports accuracy at the end of each run (equal steps when the budget
is steps) *and* at equal generated tokens: the held-out metric of each run at
the last evaluation (``--eval_steps``) whose generated-token total is within
the smallest total any run reached.

Statistics (:func:`mean_ci`, :func:`paired`): mean and 95% confidence interval
``mean +- t(0.975, n-1) * sd / sqrt(n)`` (sd with n-1) over seeds; the paired
comparison against ``--baseline`` uses the per-seed differences (same seed =
same data order and initial weights), and calls a difference significant when
its CI excludes 0.

Outputs: ``compare.md`` (table, notes, plots, the command), ``compare.json``
(every run's figures and the aggregates), ``reward.png``, ``heldout.png``,
``heldout_vs_tokens.png`` and ``report.html`` (every run overlaid, ``grpolab
report``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .report.runfiles import read_metrics, read_summary

BUDGETS = {"steps": None, "tokens": "max_generated_tokens", "completions": "max_completions",
           "seconds": "max_train_seconds"}


# --------------------------------------------------------------------------- statistics
def t_quantile(n: int) -> float:
    """The 0.975 quantile of Student's t with n-1 degrees of freedom (scipy)."""
    from scipy.stats import t
    return float(t.ppf(0.975, n - 1))


def mean_ci(values: list[float]) -> dict:
    """``{"n", "mean", "sd", "ci"}``: ``ci`` = half-width of the 95% t interval (None for n < 2)."""
    xs = [float(v) for v in values if v is not None]
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "ci": None}
    mean = sum(xs) / n
    if n < 2:
        return {"n": 1, "mean": mean, "sd": None, "ci": None}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return {"n": n, "mean": mean, "sd": sd, "ci": t_quantile(n) * sd / math.sqrt(n)}


def paired(arm: dict[int, float], base: dict[int, float]) -> dict:
    """Paired difference arm - baseline over the seeds both have: mean_ci of the differences + ``significant``."""
    seeds = sorted(set(arm) & set(base))
    out = mean_ci([arm[s] - base[s] for s in seeds])
    out["seeds"] = seeds
    out["significant"] = (out["ci"] is not None and out["mean"] is not None
                          and abs(out["mean"]) > out["ci"])
    return out


# --------------------------------------------------------------------------- the grid
@dataclass
class Arm:
    name: str
    args: list[str]  # train options of this arm (e.g. --recipe grpo, or a variant's overrides)


@dataclass
class Spec:
    arms: list[Arm]
    seeds: list[int]
    baseline: str
    budget: str
    common: list[str] = field(default_factory=list)  # train options every run gets
    metric: str = "accuracy"  # the primary held-out metric (plots, equal tokens)
    also: list[str] = field(default_factory=list)  # more held-out metrics for the table

    def as_dict(self) -> dict:
        """What identifies the grid (the metrics only change the tables: not part of it)."""
        return {"arms": [{"name": a.name, "args": a.args} for a in self.arms], "seeds": self.seeds,
                "baseline": self.baseline, "budget": self.budget, "common": self.common}


def parse_budget(text: str) -> tuple[str, float | None]:
    kind, _, value = text.partition("=")
    if kind not in BUDGETS or (kind == "steps") != (value == ""):
        raise ConfigError(f"--budget {text!r}: use 'steps' (the --steps of every run) or one of "
                          f"tokens=N, completions=N, seconds=N")
    try:
        number = float(value) if value else None
    except ValueError:
        raise ConfigError(f"--budget {text!r}: {value!r} is not a number") from None
    if number is not None and number <= 0:
        raise ConfigError(f"--budget {text!r}: the budget must be > 0")
    return kind, number


def budget_args(budget: str) -> list[str]:
    kind, value = parse_budget(budget)
    if kind == "steps":
        return []
    key = BUDGETS[kind]
    return [f"--{key}", str(int(value)) if kind != "seconds" else str(value)]


def parse_arms(recipes: str | None, variants: list[str]) -> list[Arm]:
    arms = [Arm(r.strip(), ["--recipe", r.strip()]) for r in (recipes or "").split(",") if r.strip()]
    for v in variants:
        name, sep, opts = v.partition("=")
        if not sep or not name.strip() or "/" in name:
            raise ConfigError(f"--variant {v!r}: write NAME='--key value ...' (e.g. --variant "
                              f"\"g2=--recipe grpo --num_generations 2\")")
        arms.append(Arm(name.strip(), shlex.split(opts)))
    names = [a.name for a in arms]
    if not arms:
        raise ConfigError("compare: name at least one arm with --recipes a,b,... or --variant NAME='--key value'")
    if len(set(names)) != len(names):
        raise ConfigError(f"compare: arm names must be unique, got {names}")
    return arms


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / "runs" / arm / f"seed{seed}"


def run_state(folder: Path) -> str:
    """``done`` (summary.json), ``partial`` (a checkpoint to resume) or ``new``."""
    from .train.checkpoint import latest_checkpoint
    if (folder / "summary.json").exists():
        return "done"
    if folder.exists() and latest_checkpoint(folder) is not None:
        return "partial"
    return "new"


def train_command(spec: Spec, arm: Arm, seed: int, folder: Path, state: str, imports: list[str]) -> list[str]:
    head = [sys.executable, "-m", "grpolab", *[x for m in imports for x in ("--import", m)], "train"]
    if state == "partial":
        return head + ["--resume", str(folder), "--quiet"]
    return head + [*spec.common, *arm.args, *budget_args(spec.budget), "--seed", str(seed), "--out", str(folder),
                   "--quiet", *(["--overwrite"] if folder.exists() else [])]


def run_grid(spec: Spec, out: Path, imports: list[str], log=print) -> list[dict]:
    """Run every (arm, seed) not finished yet, one fresh process each; returns the failures."""
    todo = [(a, s) for a in spec.arms for s in spec.seeds]
    failures, t_start, ran = [], time.time(), 0
    for i, (arm, seed) in enumerate(todo, 1):
        folder = run_dir(out, arm.name, seed)
        state = run_state(folder)
        tag = f"[compare] {i}/{len(todo)} {arm.name} seed {seed}"
        if state == "done":
            log(f"{tag}: finished earlier, kept")
            continue
        cmd = train_command(spec, arm, seed, folder, state, imports)
        logfile = out / "logs" / f"{arm.name}-seed{seed}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        eta = ""
        if ran:
            left = sum(1 for a, s in todo[i - 1:] if run_state(run_dir(out, a.name, s)) != "done")
            eta = f", about {(time.time() - t_start) / ran * left / 60:.1f} min left"
        log(f"{tag}: {'resuming' if state == 'partial' else 'running'}{eta} (log: {logfile})")
        t0, cpu0 = time.time(), _children_cpu()
        with open(logfile, "a") as fh:
            fh.write("$ " + shlex.join(cmd) + "\n")
            fh.flush()
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ran += 1
        wall, cpu = time.time() - t0, _children_cpu() - cpu0
        prev = _load_json(folder / "compare_run.json")
        folder.mkdir(parents=True, exist_ok=True)  # a run that failed before making its folder (a bad option)
        (folder / "compare_run.json").write_text(json.dumps({"wall_s": prev.get("wall_s", 0.0) + wall,
                                                             "cpu_s": prev.get("cpu_s", 0.0) + cpu, "rc": rc}))
        if rc != 0:
            failures.append({"arm": arm.name, "seed": seed, "rc": rc, "log": str(logfile)})
            log(f"{tag}: FAILED (exit {rc}); see {logfile}")
            continue
        after = read_summary(folder).get("after", {})
        shown = after.get(spec.metric)
        log(f"{tag}: done in {wall:.0f} s" + (f", held-out {spec.metric} {shown:.3f}" if shown is not None else ""))
    return failures


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes. Other jobs on the machine inflate them
    too (measured: 4-5x at load average 20 on 2 cores), so compare runs made under the same load."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


# --------------------------------------------------------------------------- results
def collect(spec: Spec, out: Path) -> dict:
    """Every finished run's figures: final eval, before, spend, wall, curves."""
    runs = []
    for arm in spec.arms:
        for seed in spec.seeds:
            folder = run_dir(out, arm.name, seed)
            summary = read_summary(folder)
            if not summary:
                continue
            metrics, _ = read_metrics(folder)
            key = f"eval/{spec.metric}"
            before = summary.get("before", {}).get(spec.metric)
            evals = ([(0, 0, before)] if before is not None else []) + [
                (int(m["step"]), int(m.get("generated_tokens_total", 0)), float(m[key])) for m in metrics
                if m.get(key) is not None]
            spent = summary.get("spent", {})
            after = summary.get("after", {}).get(spec.metric)
            if after is not None:
                evals.append((int(spent.get("steps", metrics[-1]["step"] if metrics else 0)),
                              int(spent.get("tokens", 0)), float(after)))
            runs.append({"arm": arm.name, "seed": seed, "folder": str(folder), "before": before, "after": after,
                         "eval_after": {k: v for k, v in summary.get("after", {}).items()
                                        if isinstance(v, (int, float))},
                         "tokens": spent.get("tokens"), "completions": spent.get("completions"),
                         "train_seconds": spent.get("seconds"), "steps": spent.get("steps"),
                         "wall_s": _load_json(folder / "compare_run.json").get("wall_s"),
                         "cpu_s": _load_json(folder / "compare_run.json").get("cpu_s"),
                         "stopped_by": summary.get("stopped_by"),
                         "rewards": [(int(m["step"]), m.get("reward_mean")) for m in metrics],
                         "evals": evals})
    return {"runs": runs}


def at_tokens(evals: list[tuple[int, int, float]], budget: int) -> float | None:
    """The held-out metric at the last evaluation whose generated-token total is <= ``budget``."""
    found = eval_within(evals, budget)
    return None if found is None else found[2]


def eval_within(evals: list[tuple[int, int, float]], budget: int) -> tuple[int, int, float] | None:
    """The last evaluation ``(step, tokens, value)`` whose generated-token total is <= ``budget``."""
    best = None
    for e in sorted(evals, key=lambda e: (e[1], e[0])):
        if e[1] <= budget:
            best = e
    return best


def aggregate(spec: Spec, data: dict) -> dict:
    runs = data["runs"]
    common_tokens = min((r["tokens"] for r in runs if r["tokens"]), default=None)
    by_arm = {a.name: [r for r in runs if r["arm"] == a.name] for a in spec.arms}
    has_mid_evals = any(len(r["evals"]) > 2 for r in runs)
    rows = {}
    for name, rs in by_arm.items():
        used = {r["seed"]: eval_within(r["evals"], common_tokens) for r in rs} if common_tokens else {}
        eq = {s: (None if e is None else e[2]) for s, e in used.items()}
        rows[name] = {
            "after": mean_ci([r["after"] for r in rs]),
            "before": mean_ci([r["before"] for r in rs]),
            "at_equal_tokens": mean_ci([v for v in eq.values() if v is not None]) if has_mid_evals else None,
            "equal_tokens_eval": mean_ci([e[1] for e in used.values() if e is not None]),  # tokens at that eval
            "tokens": mean_ci([r["tokens"] for r in rs]),
            "wall_s": mean_ci([r["wall_s"] for r in rs]),
            "cpu_s": mean_ci([r["cpu_s"] for r in rs]),
            "steps": mean_ci([r["steps"] for r in rs]),
            "also": {m: mean_ci([r["eval_after"].get(m) for r in rs]) for m in spec.also},
            "_also_by_seed": {m: {r["seed"]: r["eval_after"][m] for r in rs if r["eval_after"].get(m) is not None}
                              for m in spec.also},
            "_after_by_seed": {r["seed"]: r["after"] for r in rs if r["after"] is not None},
            "_eq_by_seed": {s: v for s, v in eq.items() if v is not None},
        }
    base = rows.get(spec.baseline)
    for name, row in rows.items():
        if base is None or name == spec.baseline:
            row["vs_baseline"] = row["vs_baseline_equal_tokens"] = None
            row["also_vs_baseline"] = {}
            continue
        row["also_vs_baseline"] = {m: paired(row["_also_by_seed"][m], base["_also_by_seed"][m]) for m in spec.also}
        row["vs_baseline"] = paired(row["_after_by_seed"], base["_after_by_seed"])
        row["vs_baseline_equal_tokens"] = (paired(row["_eq_by_seed"], base["_eq_by_seed"])
                                           if has_mid_evals else None)
    for row in rows.values():
        row.pop("_also_by_seed")
        row.pop("_after_by_seed")
        row.pop("_eq_by_seed")
    return {"arms": rows, "common_tokens": common_tokens, "has_mid_evals": has_mid_evals}


def fmt_ci(s: dict | None, scale: float = 1.0, digits: int = 1) -> str:
    if not s or s.get("mean") is None:
        return "—"
    m = s["mean"] * scale
    if s.get("ci") is None:
        return f"{m:.{digits}f} (n=1)"
    return f"{m:.{digits}f} ± {s['ci'] * scale:.{digits}f}"


def fmt_paired(p: dict | None, scale: float = 100.0) -> str:
    if not p or p.get("mean") is None:
        return "—"
    if p.get("ci") is None:
        return f"{p['mean'] * scale:+.1f} (n=1, no CI)"
    verdict = "significant" if p["significant"] else "not significant"
    return f"{p['mean'] * scale:+.1f} ± {p['ci'] * scale:.1f} ({verdict})"


def write_markdown(spec: Spec, agg: dict, failures: list[dict], out: Path, command: str, plots: list[str]) -> Path:
    m = spec.metric
    sc = 100 if _is_share(m) else 1  # a share (accuracy, pass@K) in points; any other metric as it is
    lines = [f"# grpolab compare: {', '.join(a.name for a in spec.arms)}", "",
             f"Command: `{command}`", "",
             f"Seeds: {', '.join(map(str, spec.seeds))}; budget: {spec.budget}; baseline: `{spec.baseline}`; "
             f"held-out metric: {m} (greedy{', in points = %' if sc == 100 else ''}). Mean ± 95% CI over seeds (Student t); the paired "
             f"difference uses the per-seed differences against the baseline; *not significant* = its CI "
             f"contains 0. Wall and CPU seconds are per run, start-up and evaluations included; both grow with "
             f"the machine's load, so compare only runs made under the same load.", ""]
    eq_head = (f"{m} at equal tokens (≤ {agg['common_tokens']:,})" if agg["has_mid_evals"] and agg["common_tokens"]
               else f"{m} at equal tokens")
    lines += [f"| arm | seeds | {m} before | {m} after | vs `{spec.baseline}` | {eq_head} | vs `{spec.baseline}` "
              f"at equal tokens | generated tokens | steps | wall s | CPU s |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in spec.arms:
        r = agg["arms"][a.name]
        lines.append(f"| `{a.name}` | {r['after']['n']} | {fmt_ci(r['before'], sc)} | {fmt_ci(r['after'], sc)} | "
                     f"{fmt_paired(r['vs_baseline'], sc) if a.name != spec.baseline else 'baseline'} | "
                     f"{fmt_ci(r['at_equal_tokens'], sc)} | "
                     f"{fmt_paired(r['vs_baseline_equal_tokens'], sc) if a.name != spec.baseline else 'baseline'} | "
                     f"{fmt_ci(r['tokens'], 1, 0)} | {fmt_ci(r['steps'], 1, 0)} | {fmt_ci(r['wall_s'], 1, 0)} | "
                     f"{fmt_ci(r['cpu_s'], 1, 0)} |")
    lines.append("")
    if spec.also:
        lines += [f"| arm | {' | '.join(f'{m} after | vs `{spec.baseline}`' for m in spec.also)} |",
                  "|---|" + "---|---|" * len(spec.also)]
        for a in spec.arms:
            r = agg["arms"][a.name]
            cells = []
            for m in spec.also:
                scale = 100 if _is_share(m) else 1
                cells += [fmt_ci(r["also"][m], scale),
                          "baseline" if a.name == spec.baseline else fmt_paired(r["also_vs_baseline"].get(m), scale)]
            lines.append(f"| `{a.name}` | {' | '.join(cells)} |")
        lines += ["", "Shares (accuracy, pass@K) are in points (%); lengths in tokens.", ""]
    if not agg["has_mid_evals"]:
        lines += ["Accuracy at equal tokens needs evaluations during training: pass `--eval_steps N`.", ""]
    else:
        used = ", ".join(f"`{a.name}` {fmt_ci(agg['arms'][a.name]['equal_tokens_eval'], 1, 0)}" for a in spec.arms)
        lines += [f"At equal tokens, each run's value is its last evaluation within {agg['common_tokens']:,} "
                  f"generated tokens (0 = the evaluation before training); the token totals at those evaluations "
                  f"were: {used}. Evaluate more often (`--eval_steps`) for a closer match.", ""]
    for a in spec.arms:
        lines.append(f"- `{a.name}`: `grpolab train {shlex.join(spec.common + a.args)}`")
    lines.append("")
    if failures:
        lines += ["**Failed runs** (not in the table):", ""] + [
            f"- `{f['arm']}` seed {f['seed']}: exit {f['rc']}, log `{f['log']}`" for f in failures] + [""]
    for p in plots:
        lines += [f"![{p}]({p})", ""]
    path = out / "compare.md"
    path.write_text("\n".join(lines))
    return path


def _is_share(metric: str) -> bool:
    """Metrics shown in points (%): accuracies and pass@K (0..1 shares), a role's too (``roles/<role>/accuracy``);
    the rest as they are."""
    return metric.rsplit("/", 1)[-1].startswith(("accuracy", "lenient_accuracy", "pass@", "sampled_accuracy"))


def plot(spec: Spec, data: dict, out: Path) -> list[str]:
    """Reward and held-out metric over steps, held-out metric against generated tokens (one line per arm, a
    95% CI band over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def band(ax, series: dict[float, list[float]], label: str):
        xs = sorted(series)
        stats = [mean_ci(series[x]) for x in xs]
        ys = [s["mean"] for s in stats]
        line, = ax.plot(xs, ys, label=label)
        lo = [s["mean"] - (s["ci"] or 0) for s in stats]
        hi = [s["mean"] + (s["ci"] or 0) for s in stats]
        ax.fill_between(xs, lo, hi, alpha=0.2, color=line.get_color())

    made = []
    for fname, title, xlabel, pick in (
            ("reward.png", "training reward (mean over the step's completions)", "step",
             lambda r: [(s, v) for s, v in r["rewards"] if v is not None]),
            ("heldout.png", f"held-out {spec.metric}", "step", lambda r: [(s, v) for s, _, v in r["evals"]]),
            ("heldout_vs_tokens.png", f"held-out {spec.metric} vs generated tokens", "generated tokens",
             lambda r: [(t, v) for _, t, v in r["evals"]])):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        drawn = False
        for a in spec.arms:
            series: dict[float, list[float]] = {}
            rs = [r for r in data["runs"] if r["arm"] == a.name]
            if fname == "heldout_vs_tokens.png":  # x differs per seed: mean tokens at the k-th evaluation
                pts = [pick(r) for r in rs]
                for k in range(min((len(p) for p in pts), default=0)):
                    x = sum(p[k][0] for p in pts) / len(pts)
                    series[x] = [p[k][1] for p in pts]
            else:
                for r in rs:
                    for x, v in pick(r):
                        series.setdefault(x, []).append(v)
            if series:
                band(ax, series, a.name)
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        made.append(fname)
    return made


# --------------------------------------------------------------------------- command
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpolab compare", description=(
        "Run recipes (or config variants) x seeds on one task at one budget, one fresh process per run, "
        "resumable; write compare.md / compare.json / plots with mean ± 95% CI and paired differences "
        "against a baseline. Any other option is a train option given to every run (e.g. --task, --steps, "
        "--eval_steps)."))
    p.add_argument("--recipes", help="comma-separated recipes, one arm each (e.g. grpo,dr_grpo)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME='--key value ...'",
                   help="an arm given by train options (repeatable), e.g. \"g2=--recipe grpo --num_generations 2\"")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--baseline", help="arm the others are compared with (default: the first)")
    p.add_argument("--budget", default="steps",
                   help="steps (default: every run does --steps) | tokens=N | completions=N | seconds=N "
                        "(every run stops once it has spent N; --steps stays the upper bound)")
    p.add_argument("--metric", default="accuracy",
                   help="held-out metric(s) of the table, comma-separated; the first is plotted and compared at "
                        "equal tokens (default accuracy; any key of a run's evaluation, e.g. lenient_accuracy, "
                        "len_incorrect, pass@8 with --eval_pass_k 8)")
    p.add_argument("--out", required=True, help="folder of the comparison (runs, logs, compare.md, ...)")
    p.add_argument("--report", action=argparse.BooleanOptionalAction, default=True,
                   help="also write report.html with every run overlaid (default on)")
    return p


def main(argv: list[str], imports: list[str] | None = None, log=None) -> int:
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    args, rest = parser().parse_known_args(argv)
    bad = [r for r in rest if r.startswith("--") and r.split("=")[0] in ("--out", "--seed", "--resume")]
    if bad:
        raise ConfigError(f"compare: {bad[0]} is set by compare for each run; remove it")
    arms = parse_arms(args.recipes, args.variant)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds {args.seeds!r}: write comma-separated integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {args.seeds!r}: give at least one seed, each once")
    baseline = args.baseline or arms[0].name
    if baseline not in [a.name for a in arms]:
        raise ConfigError(f"--baseline {baseline!r} is not an arm; arms: {', '.join(a.name for a in arms)}")
    parse_budget(args.budget)
    metrics = [m.strip() for m in args.metric.split(",") if m.strip()] or ["accuracy"]
    spec = Spec(arms, seeds, baseline, args.budget, list(rest), metrics[0], metrics[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "compare_spec.json"
    if saved.exists():
        old = _load_json(saved)
        if old != spec.as_dict():
            diff = [k for k in spec.as_dict() if old.get(k) != spec.as_dict()[k]]
            raise ConfigError(f"--out {out} holds a comparison with other settings ({', '.join(diff)} differ; "
                              f"see {saved}); rerun with the same options to continue it, or choose a new --out")
        log(f"[compare] continuing the comparison in {out} (finished runs are kept)")
    else:
        saved.write_text(json.dumps(spec.as_dict(), indent=2))
    failures = run_grid(spec, out, imports or [], log=log)
    data = collect(spec, out)
    agg = aggregate(spec, data)
    plots = plot(spec, data, out) if data["runs"] else []
    command = "grpolab compare " + shlex.join(argv)
    md = write_markdown(spec, agg, failures, out, command, plots)
    (out / "compare.json").write_text(json.dumps({"spec": spec.as_dict(), "command": command, "runs": data["runs"],
                                                  "aggregate": agg, "failures": failures}, indent=2))
    if args.report and data["runs"]:
        from .report.html import write_report
        write_report([r["folder"] for r in data["runs"]], str(out / "report.html"))
    log(f"[compare] wrote {md}, {out / 'compare.json'}" + (f", {', '.join(plots)}" if plots else ""))
    print(md.read_text())
    return 1 if failures else 0
