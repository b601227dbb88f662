"""``grpolab doctor RUN``: known GRPO failure patterns in a run's metrics, with the evidence and a fix.

Each check is one function ``check_*(rows, summary) -> Finding | None`` over the rows of ``metrics.jsonl``
(and ``summary.json``); its thresholds are the module constants below (documented in docs/report_and_doctor.md).
Most checks look at the *recent* steps: the last ``RECENT_STEPS`` rows (all of them in a shorter run).
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Callable, NamedTuple

from .runfiles import check_run_folder, read_metrics, read_summary, series

RECENT_STEPS = 10              # the window most checks average over (the last N logged steps)
REWARD_CONSTANT_STD = 1e-6     # reward_std at or below this: every completion of the batch scored the same
REWARD_CONSTANT_FRAC = 0.8     # ... in at least this share of the recent steps
ZERO_STD_GROUPS_MAX = 0.5      # mean frac_zero_std_groups above this: most groups give no gradient
ENTROPY_FLOOR = 0.05           # recent mean entropy (nats/token) below this: collapsed
ENTROPY_COLLAPSE_RATIO = 0.1   # ... or below this fraction of the first logged entropy
LENGTH_GROWTH_MAX = 3.0        # recent completion_len_mean above this multiple of the first: explosion
LENGTH_SHRINK_MIN = 0.25       # recent completion_len_mean below this fraction of the first: collapse
LENGTH_MIN_TOKENS = 2.0        # ... or below this many tokens
KL_MAX = 1.0                   # recent kl above this: the policy ran away from the reference
CLIP_FRAC_MAX = 0.2            # recent mean clip_frac_low + clip_frac_high above this
TRUNCATION_MAX = 0.3           # recent mean frac_truncated above this
UNSCORABLE_STEPS_FRAC = 0.5    # a reward column unscorable (NaN) in at least this share of steps
EVAL_DROP_TOLERANCE = 0.02     # after-training accuracy (or reward_mean) this much below before: worse
GRAD_NORM_ZERO = 0.0           # grad_norm at or below this on every logged step (rewards varying): nothing trained


@dataclasses.dataclass
class Finding:
    check: str
    title: str
    evidence: str
    fix: str
    steps: list[int] = dataclasses.field(default_factory=list)


def _recent(rows: list[dict]) -> list[dict]:
    return rows[-RECENT_STEPS:]


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def _fmt(points: list[tuple[int, float]], n: int = 6) -> str:
    shown = points if len(points) <= n else points[:n // 2] + points[-(n // 2):]
    text = ", ".join(f"step {s}: {v:.4g}" for s, v in shown)
    return text + (f" ({len(points)} steps)" if len(points) > n else "")


def _mean_above(pts: list[tuple[int, float]], limit: float, check: str, title: str, label: str,
                fix: str) -> Finding | None:
    """The finding ``check`` when the mean of ``pts`` (metric ``label`` over the recent steps) is above ``limit``."""
    mean = _mean(v for _, v in pts) if pts else None
    if mean is None or mean <= limit:
        return None
    return Finding(check, title, f"{label} mean {mean:.3g} > {limit:g} over the last {len(pts)} steps ({_fmt(pts)})",
                   fix, [s for s, _ in pts])


def _first_and_recent(rows: list[dict], key: str) -> tuple[int, float, list[tuple[int, float]], float] | None:
    """``(first step, its value, the recent points, their mean)`` of metric ``key``; None below 2 logged steps."""
    pts = series(rows, key)
    if len(pts) < 2:
        return None
    recent = series(_recent(rows), key)
    return pts[0][0], pts[0][1], recent, _mean(v for _, v in recent)


def _trend(check: str, title: str, key: str, verb: str, seen: tuple, limits: str, fix: str) -> Finding:
    """The finding ``check``: metric ``key`` ``verb`` ("fell", "grew") from its first logged value to the recent
    mean (``seen``, from :func:`_first_and_recent`), past ``limits``."""
    first_step, first, recent, level = seen
    return Finding(check, title, f"{key} {verb} from {first:.4g} (step {first_step}) to a recent mean of "
                   f"{level:.4g} ({limits}) ({_fmt(recent)})", fix, [s for s, _ in recent])


class _Case(NamedTuple):
    """One way a trend check fires: ``fires(first, level)`` on the first logged value and the recent mean; the rest
    are :func:`_trend`'s arguments."""
    fires: Callable[[float, float], bool]
    check: str
    title: str
    verb: str
    limits: str
    fix: str


def _first_trend(rows: list[dict], key: str, *cases: _Case) -> Finding | None:
    """The :func:`_trend` finding of the first of ``cases`` that fires on metric ``key``; None below 2 logged
    steps (:func:`_first_and_recent`) or when none fires."""
    seen = _first_and_recent(rows, key)
    if seen is None:
        return None
    _, first, _, level = seen
    for case in cases:
        if case.fires(first, level):
            return _trend(case.check, case.title, key, case.verb, seen, case.limits, case.fix)
    return None


def check_reward_constant(rows, summary) -> Finding | None:
    """Every completion of a batch got the same reward (constant, all-zero or saturated)."""
    pts = series(_recent(rows), "reward_std")
    if not pts:
        return None
    flat = [(s, v) for s, v in pts if v <= REWARD_CONSTANT_STD]
    if len(flat) < REWARD_CONSTANT_FRAC * len(pts):
        return None
    means = series(_recent(rows), "reward_mean")
    level = _mean(v for _, v in means)
    return Finding("reward_constant", "reward constant or saturated",
                   f"reward_std <= {REWARD_CONSTANT_STD:g} in {len(flat)} of the last {len(pts)} steps "
                   f"({_fmt(flat)}); reward_mean {level:.4g}",
                   "no completion differs from its group, so every advantage is 0 and nothing is learned. If the "
                   "reward is always the same low value the task is too hard or the reward never fires (check the "
                   "reward function on a few completions, the answer format, a supervised cold start with `grpolab "
                   "sft`); if it is always the maximum the task is too easy (harder data); if it never changes at all, "
                   "the reward function ignores its input.", [s for s, _ in flat])


def check_zero_variance_groups(rows, summary) -> Finding | None:
    """Most groups have all completions scored alike (zero advantage: no gradient from them)."""
    return _mean_above(series(_recent(rows), "frac_zero_std_groups"), ZERO_STD_GROUPS_MAX, "zero_variance_groups",
                       "most groups are zero-variance", "frac_zero_std_groups",
                       "groups whose completions all score alike contribute nothing. Use dynamic sampling "
                       "(`--dynamic_sampling true`, DAPO) to refill the batch with informative groups, a prompt "
                       "sampler that prefers prompts of intermediate difficulty (`--prompt_sampler`, see `grpolab "
                       "components prompt_sampler`), harder (or easier) data, or more generations per prompt "
                       "(`--num_generations`).")


def check_entropy_collapse(rows, summary) -> Finding | None:
    """The policy's token entropy fell to near zero (it stopped exploring)."""
    return _first_trend(rows, "entropy", _Case(
        fires=lambda first, level: level < ENTROPY_FLOOR or (first > 0 and level < ENTROPY_COLLAPSE_RATIO * first),
        check="entropy_collapse", title="entropy collapse", verb="fell",
        limits=f"floor {ENTROPY_FLOOR}, or {ENTROPY_COLLAPSE_RATIO:g} x the first",
        fix="the policy samples nearly deterministically, so groups stop differing. Raise the upper clip "
            "range (clip-higher, `--recipe dapo` / `--epsilon_high 0.28`), add an entropy bonus, lower the "
            "learning rate, or raise `--temperature`."))


def check_length(rows, summary) -> Finding | None:
    """Mean completion length exploded or collapsed relative to the first steps."""
    return _first_trend(rows, "completion_len_mean", _Case(
        fires=lambda first, level: first > 0 and level > LENGTH_GROWTH_MAX * first,
        check="length_explosion", title="length explosion", verb="grew", limits=f"> {LENGTH_GROWTH_MAX:g} x",
        fix="long completions are being rewarded or their loss is under-weighted. Use a length-unbiased "
            "loss (`--recipe dr_grpo`), an overlong penalty (`--recipe dapo`), "
            "`--mask_truncated_completions true`, "
            "or lower `--max_completion_length`."), _Case(
        fires=lambda first, level: level < LENGTH_MIN_TOKENS or (first > 0 and level < LENGTH_SHRINK_MIN * first),
        check="length_collapse", title="length collapse", verb="fell",
        limits=f"< {LENGTH_SHRINK_MIN:g} x or < {LENGTH_MIN_TOKENS:g} tokens",
        fix="the policy learned that short answers score (or that ending early avoids a penalty). Check "
            "that the reward requires the answer, use a length-unbiased loss (`--recipe dr_grpo`), and "
            "look at the completions (`grpolab report`)."))


def check_kl_runaway(rows, summary) -> Finding | None:
    """The KL to the reference policy grew large."""
    recent = series(_recent(rows), "kl")
    bad = [(s, v) for s, v in recent if v > KL_MAX]
    if not bad:
        return None
    return Finding("kl_runaway", "KL running away",
                   f"kl > {KL_MAX:g} at {len(bad)} of the last {len(recent)} logged steps ({_fmt(bad)})",
                   "the policy moves far from the reference in few steps. Lower the learning rate, raise the KL "
                   "coefficient (`--beta`), lower `--num_iterations`, or tighten the clip range (`--epsilon`).",
                   [s for s, _ in bad])


def check_clip_fraction(rows, summary) -> Finding | None:
    """A large share of tokens hit the clip range (updates too large or too off-policy)."""
    recent = _recent(rows)
    low, high = dict(series(recent, "clip_frac_low")), dict(series(recent, "clip_frac_high"))
    pts = [(s, low.get(s, 0.0) + high.get(s, 0.0)) for s in sorted(set(low) | set(high))]
    return _mean_above(pts, CLIP_FRAC_MAX, "clip_fraction", "clip fraction running away",
                       "clip_frac_low + clip_frac_high",
                       "the ratio to the sampling policy leaves the trust region for many tokens: lower the learning "
                       "rate or `--num_iterations`, refresh the off-policy data more often, or (engine mismatch) use "
                       "a truncated importance correction.")


def check_truncation(rows, summary) -> Finding | None:
    """Many completions hit max_completion_length."""
    return _mean_above(series(_recent(rows), "frac_truncated"), TRUNCATION_MAX, "truncation", "frequent truncation",
                       "frac_truncated",
                       "truncated completions usually cannot be scored correctly. Raise "
                       "`--max_completion_length`, leave them out of the loss (`--mask_truncated_completions true`), "
                       "or add an overlong penalty (`--recipe dapo`).")


def check_reward_errors(rows, summary) -> Finding | None:
    """Reward functions raised errors, or a reward column was unscorable (NaN) in many steps."""
    errs = [(s, v) for s, v in series(rows, "reward_errors") if v > 0]
    cols = sorted({k for r in rows for k in r if re.fullmatch(r"rewards/.+/unscorable", k)})
    unscorable = {}
    for k in cols:
        pts = series(rows, k)
        hit = [(s, v) for s, v in pts if v > 0]
        if pts and len(hit) >= UNSCORABLE_STEPS_FRAC * len(pts):
            unscorable[k] = hit
    if not errs and not unscorable:
        return None
    parts = []
    if errs:
        parts.append(f"reward_errors > 0 at {len(errs)} steps ({_fmt(errs)})")
    for k, hit in unscorable.items():
        parts.append(f"{k} > 0 at {len(hit)} of {len(series(rows, k))} steps ({_fmt(hit)})")
    return Finding("reward_errors", "reward-function errors or unscorable rows", "; ".join(parts),
                   "run the reward function on a few logged completions (`grpolab report` shows them): an exception "
                   "or a None/NaN return means the row got no score. Fix the parser (answer format, missing "
                   "`solution` column) or make the function return 0.0 for a wrong answer.",
                   sorted({s for s, _ in errs} | {s for h in unscorable.values() for s, _ in h}))


def check_skipped_steps(rows, summary) -> Finding | None:
    """Optimizer steps skipped because the loss or gradient was NaN/inf."""
    hit = [(s, v) for s, v in series(rows, "skipped") if v > 0]
    total = summary.get("skipped_steps") if isinstance(summary.get("skipped_steps"), (int, float)) else 0
    if not hit and not total:
        return None
    ev = f"skipped > 0 at {len(hit)} steps ({_fmt(hit)})" if hit else ""
    if total:
        ev += ("; " if ev else "") + f"summary.json skipped_steps = {total}"
    return Finding("skipped_steps", "NaN-skipped steps", ev,
                   "the loss or gradient was not finite. Lower the learning rate, check rewards for inf, use "
                   "float32 or bf16 instead of fp16, and check `grad_norm` before the first skipped step.",
                   [s for s, _ in hit])


def check_nothing_trained(rows, summary) -> Finding | None:
    """``grad_norm`` 0 on every logged step while the rewards vary: no weight ever received a gradient."""
    grads = series(rows, "grad_norm")
    if not grads or any(v > GRAD_NORM_ZERO for _, v in grads):
        return None
    varied = [(s, v) for s, v in series(rows, "reward_std") if v > REWARD_CONSTANT_STD]
    if not varied:
        return None  # a constant reward explains it (reward_constant)
    adv = series(rows, "advantage_abs_mean")
    adv_note = ""
    if adv and all(v == 0 for _, v in adv):
        adv_note = f"; advantage_abs_mean 0 on all {len(adv)} steps (no row of the loss had an advantage)"
    return Finding("nothing_trained", "nothing was trained",
                   f"grad_norm <= {GRAD_NORM_ZERO:g} on all {len(grads)} logged steps ({_fmt(grads)}) while "
                   f"reward_std > {REWARD_CONSTANT_STD:g} on {len(varied)} of them ({_fmt(varied)}){adv_note}",
                   "nothing was trained: no weight received a gradient on any step, so the model at the end is "
                   "the one the run started from and any before/after difference is noise. Likely causes: a "
                   "sampler that trains no step (batch stage denoising_steps keeping int(flow_steps or "
                   "ddpm_steps x steps_fraction) = 0 steps of each sample: raise the steps or the fraction); all "
                   "advantages zero (every group's completions scored alike, or advantages clipped or masked to "
                   "0: see frac_zero_std_groups and advantage_abs_mean); frozen parameters (nothing has "
                   "requires_grad: a LoRA target list that matches no module, a component that freezes the "
                   "network). Check `grpolab config` for these settings and rerun a few steps.",
                   [s for s, _ in grads])


def check_eval_worse(rows, summary) -> Finding | None:
    """Held-out evaluation after training is worse than before."""
    before, after = summary.get("before"), summary.get("after")
    if not isinstance(before, dict) or not isinstance(after, dict):
        return None
    for key in ("accuracy", "reward_mean"):
        b, a = before.get(key), after.get(key)
        if isinstance(b, (int, float)) and isinstance(a, (int, float)):
            if a < b - EVAL_DROP_TOLERANCE:
                return Finding("eval_worse", "evaluation worse than before",
                               f"summary.json {key}: before {b:.4g}, after {a:.4g} (drop {b - a:.4g} > "
                               f"{EVAL_DROP_TOLERANCE:g})",
                               "training hurt held-out performance: look for the other patterns above (reward "
                               "hacking shows as train reward up, eval down), lower the learning rate, keep a KL "
                               "term (`--beta`), and evaluate an earlier checkpoint.")
            return None
    return None


CHECKS: list[Callable] = [check_reward_constant, check_zero_variance_groups, check_entropy_collapse, check_length,
                          check_kl_runaway, check_clip_fraction, check_truncation, check_reward_errors,
                          check_skipped_steps, check_nothing_trained, check_eval_worse]


def diagnose(run: str | Path) -> dict:
    """``{"run", "steps", "notes", "findings": [Finding as dict]}`` for a run folder."""
    run = check_run_folder(Path(run))
    rows, notes = read_metrics(run)
    summary = read_summary(run)
    if not rows:
        notes.append("metrics.jsonl has no steps yet")
    if not summary:
        notes.append("no summary.json (run in progress or stopped): the evaluation check was not run")
    findings = [f for check in CHECKS if (f := check(rows, summary)) is not None]
    return {"run": str(run), "steps": len(rows), "last_step": rows[-1]["step"] if rows else None, "notes": notes,
            "findings": [dataclasses.asdict(f) for f in findings]}


def format_text(result: dict) -> str:
    lines = [f"grpolab doctor: {result['run']} ({result['steps']} steps logged"
             + (f", last step {result['last_step']})" if result["last_step"] is not None else ")")]
    lines += [f"  note: {n}" for n in result["notes"]]
    if not result["findings"] and not result["steps"]:
        lines.append("nothing to diagnose yet: the run has logged no step")
    elif not result["findings"]:
        lines.append("healthy: no known failure pattern found")
    for f in result["findings"]:
        lines += [f"[{f['check']}] {f['title']}", f"  evidence: {f['evidence']}", f"  fix: {f['fix']}"]
    return "\n".join(lines)


def main(run: str, as_json: bool = False) -> int:
    """Print the diagnosis; exit code 0 when healthy, 1 when a pattern is found."""
    result = diagnose(run)
    print(json.dumps(result, indent=2) if as_json else format_text(result))
    return 1 if result["findings"] else 0
