"""``grpolab report RUN [RUN ...] --out report.html``: one self-contained HTML file (inline CSS, SVG and a few
lines of JS; nothing is loaded from the network).

Sections: each run's config diff from grpolab's defaults, curves of every run overlaid (one colour per run),
evaluation before/after (``summary.json``), and the completions of ``completions.jsonl`` per step (groups side by
side, each completion's rewards, advantage and token count; click one to open its text).

``completions.jsonl`` fields read (one JSON object a line; aliases in brackets): ``step``; ``group`` [``group_id``,
``group_idx``]; ``prompt``; ``completion`` [``text``]; ``rewards`` (a dict of reward columns) or keys
``rewards/NAME``; ``reward`` [``scalar_reward``]; ``advantage``; ``tokens`` [``num_tokens``, ``token_count``,
``completion_tokens``]; ``truncated``. Every text is HTML-escaped (model output is untrusted).
"""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from .runfiles import check_run_folder, read_config, read_jsonl, read_metrics, read_summary, series

# ten colours told apart at a glance (Tableau 10, red and green apart), then line styles and marker shapes: a plot
# of one metric gives each run a colour and a marker; a plot of several gives each metric a colour and each run
# a marker and a line style
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22"]
DASHES = ["", "6 3", "2 2", "8 3 2 3"]
MARKERS = ["circle", "square", "triangle", "diamond", "down", "cross"]
UNSCORABLE = '<span class="unscorable" title="unscorable (NaN)">—</span>'
# (title, metric keys; a key with a * expands to every metric of the runs it matches: "rewards/*/mean" every reward
# column, "rollout/team/*/reward" every role of a team run)
CURVES = [("reward", ["reward_mean"]), ("accuracy and reward columns", ["rewards/*/mean"]),
          ("team reward per role", ["rollout/team/reward", "rollout/team/*/reward"]),
          ("team turn length per role (tokens)", ["rollout/team/*/turn_tokens"]),
          ("held-out accuracy: team and each role", ["eval/accuracy", "eval/roles/*/accuracy"]),
          ("completion length (tokens)", ["completion_len_mean"]), ("KL to the reference", ["kl"]),
          ("entropy (nats/token)", ["entropy"]), ("clip fraction", ["clip_frac_low", "clip_frac_high"]),
          ("zero-variance groups", ["frac_zero_std_groups"]), ("truncated completions", ["frac_truncated"])]
NO_COMPLETIONS = "no completions logged: set log_completions_steps"

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.grids{display:flex;gap:1.5em;flex-wrap:wrap}.grids img.grid{image-rendering:pixelated;max-width:100%}
img.thumb{image-rendering:pixelated;vertical-align:middle;width:32px;height:32px}
img.cond{image-rendering:pixelated;max-width:100%}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left;
font-size:.9em;vertical-align:top}th{background:#f4f4f4}
.plots{display:flex;flex-wrap:wrap;gap:1em}.plot{border:1px solid #eee}
.legend span{display:inline-block;margin-right:1.2em}.swatch{display:inline-block;width:1.4em;height:.4em;
margin-right:.3em;vertical-align:middle}
.groups{display:flex;gap:1em;overflow-x:auto;align-items:flex-start}
.group{min-width:18em;max-width:28em;border:1px solid #ddd;padding:.4em;background:#fafafa}
.prompt{white-space:pre-wrap;font-family:monospace;background:#eef;padding:.3em;max-height:8em;overflow:auto}
details{border-top:1px solid #ddd;padding:.2em 0}summary{cursor:pointer;font-size:.9em}
pre.text{white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid #eee;padding:.3em;margin:.2em 0}
.pos{color:#1a7f37}.neg{color:#c62828}.zero{color:#555}.note{color:#666;font-style:italic}
.unscorable{color:#888;cursor:help}
"""
JS = """
function grpolabShowStep(sel){
  var run = sel.getAttribute('data-run');
  var steps = document.querySelectorAll('.step[data-run="' + run + '"]');
  for (var i = 0; i < steps.length; i++) {
    steps[i].style.display = steps[i].getAttribute('data-step') === sel.value ? 'block' : 'none';
  }
}
document.addEventListener('DOMContentLoaded', function(){
  var sels = document.querySelectorAll('select.stepsel');
  for (var i = 0; i < sels.length; i++) {
    sels[i].addEventListener('change', function(ev){ grpolabShowStep(ev.target); });
    grpolabShowStep(sels[i]);
  }
});
"""


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def fmt(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return esc(v)
    if isinstance(v, float) and not math.isfinite(v):
        return esc(v)
    return esc(f"{v:.4g}")


def score(v: Any) -> str:
    """A reward or evaluation value; an unscorable one (NaN, written as null) is marked, never a blank cell."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return UNSCORABLE
    return fmt(v)


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> tuple[list[float], int]:
    """About ``n`` round tick values (a step of 1, 2, 2.5 or 5 times a power of ten) from the first multiple of
    the step at or below ``lo`` to the first at or above ``hi``, and the decimals their labels need."""
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step, m = next((m * mag, m) for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    if integer and step < 1:
        step, mag, m = 1.0, 1.0, 1
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) + (1 if m == 2.5 and step < 10 else 0)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, decimals) for k in range(first, last + 1)], decimals


def marker(shape: str, colour: str, x: float, y: float, r: float = 3.0) -> str:
    """One data-point marker (SVG) of ``shape`` (:data:`MARKERS`)."""
    cls = f'class="marker {shape}" fill="{colour}" stroke="{colour}"'
    if shape == "circle":
        return f'<circle {cls} cx="{x:.1f}" cy="{y:.1f}" r="{r}"/>'
    if shape == "square":
        return f'<rect {cls} x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r}" height="{2 * r}"/>'
    if shape == "cross":
        return (f'<path {cls} stroke-width="1.5" d="M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}'
                f'M{x - r:.1f},{y + r:.1f}L{x + r:.1f},{y - r:.1f}"/>')
    pts = {"triangle": [(0, -1.2), (1.1, 0.9), (-1.1, 0.9)], "down": [(0, 1.2), (1.1, -0.9), (-1.1, -0.9)],
           "diamond": [(0, -1.3), (1.3, 0), (0, 1.3), (-1.3, 0)]}[shape]
    d = "L".join(f"{x + dx * r:.1f},{y + dy * r:.1f}" for dx, dy in pts)
    return f'<path {cls} d="M{d}Z"/>'


def key_glyph(colour: str, dash: str = "", shape: str = "") -> str:
    """A legend's sample of a series: its line (colour, dash) and its marker."""
    da = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<svg width="30" height="10"><line x1="0" y1="5" x2="30" y2="5" stroke="{colour}" stroke-width="2"{da}/>'
            + (marker(shape, colour, 15, 5) if shape else "") + "</svg>")


# ---------------------------------------------------------------- config diff

def default_config(run_cfg: dict) -> tuple[dict, str]:
    """grpolab's defaults for the components this run selects (``Config.build`` of its core keys), or the plain
    defaults with a note when those cannot be built here (e.g. its data file is elsewhere)."""
    from ..config import CORE_KEYS, Config
    core = {k: v for k, v in run_cfg.items() if k in CORE_KEYS}
    defaults = Config.build({}).to_dict()
    try:
        built = Config.build({k: v for k, v in core.items() if v != defaults.get(k)}, lenient=True)
        params = {k: v for k, v in built.to_dict().items() if k not in CORE_KEYS}
        return {**defaults, **params}, ""
    except Exception as e:  # noqa: BLE001 - the report still shows the run's values; the note says why
        return defaults, f"defaults of this run's components unavailable here ({type(e).__name__}: {e})"


def config_diff_html(run_cfg: dict) -> str:
    if not run_cfg:
        return '<p class="note">no config.yaml</p>'
    defaults, note = default_config(run_cfg)
    rows = [(k, v, defaults.get(k, "(not a default key)")) for k, v in run_cfg.items()
            if k not in defaults or defaults[k] != v]
    out = f'<p class="note">{esc(note)}</p>' if note else ""
    if not rows:
        return out + "<p>all keys at their defaults</p>"
    body = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td><td>{esc(d)}</td></tr>" for k, v, d in rows)
    return out + f'<table class="configdiff"><tr><th>key</th><th>this run</th><th>default</th></tr>{body}</table>'


# ---------------------------------------------------------------- plots

def expand_keys(keys: list[str], runs: list[dict]) -> list[str]:
    """``keys`` with each ``a*b`` replaced by the runs' metric names that start with ``a`` and end with ``b``."""
    out = []
    for k in keys:
        if "*" in k:
            a, b = k.split("*", 1)
            out += sorted({m for r in runs for row in r["metrics"] for m in row
                           if len(m) > len(a) + len(b) and m.startswith(a) and m.endswith(b)})
        else:
            out.append(k)
    return out


def svg_plot(title: str, lines: list[tuple], w: int = 440, h: int = 240) -> str:
    """An SVG line plot; ``lines``: ``(colour, dash, points)`` or ``(colour, dash, points, marker shape)``. The
    y axis spans round ticks around the data; the x axis (steps) has round ticks inside the steps logged."""
    pts = [p for line in lines for p in line[2]]
    ml, mr, mt, mb = 56, 12, 24, 30
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    yticks, ydec = nice_ticks(y0, y1)
    y0, y1 = yticks[0], yticks[-1]
    xticks, xdec = nice_ticks(x0, x1, integer=True)
    xticks = [v for v in xticks if x0 <= v <= x1] or [x0, x1]

    def sx(x):
        return ml + (x - x0) / (x1 - x0) * (w - ml - mr)

    def sy(y):
        return h - mb - (y - y0) / (y1 - y0) * (h - mt - mb)

    parts = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'viewBox="0 0 {w} {h}" role="img" aria-label="{esc(title)}">',
             f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">{esc(title)}</text>',
             f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="#999"/>',
             f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="#999"/>']
    for v in yticks:
        parts.append(f'<line x1="{ml - 3}" y1="{sy(v):.1f}" x2="{ml}" y2="{sy(v):.1f}" stroke="#999"/>'
                     f'<text x="{ml - 5}" y="{sy(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.{ydec}f}</text>')
    for v in xticks:
        parts.append(f'<line x1="{sx(v):.1f}" y1="{h - mb}" x2="{sx(v):.1f}" y2="{h - mb + 3}" stroke="#999"/>'
                     f'<text x="{sx(v):.1f}" y="{h - mb + 14}" text-anchor="middle" font-size="10">'
                     f'{v:.{xdec}f}</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 3}" text-anchor="middle" font-size="10">step</text>')
    for colour, dash, ps, *shape in lines:
        if not ps:
            continue
        d = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(ps))
        da = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<path class="series" d="{d}" fill="none" stroke="{colour}" stroke-width="1.8"{da}/>')
        every = max(1, math.ceil(len(ps) / 12))  # about a dozen markers a line
        shown = ps[::every] if shape else ps[:1] if len(ps) == 1 else []
        parts += [marker(shape[0] if shape else "circle", colour, sx(x), sy(y)) for x, y in shown]
    parts.append("</svg>")
    return "".join(parts)


def series_style(i: int, j: int, n_keys: int) -> tuple[str, str, str]:
    """``(colour, dash, marker)`` of run ``i``'s metric ``j`` in a plot of ``n_keys`` metrics: one metric, the
    run's colour and marker; several, a colour per metric (ten, then line styles) and a marker per run."""
    if n_keys == 1:
        return COLOURS[i % len(COLOURS)], DASHES[i // len(COLOURS) % len(DASHES)], MARKERS[i % len(MARKERS)]
    return (COLOURS[j % len(COLOURS)], DASHES[(j // len(COLOURS) + i) % len(DASHES)], MARKERS[i % len(MARKERS)])


def plots_html(runs: list[dict]) -> str:
    legend = "".join(f'<span>{key_glyph(*series_style(i, 0, 1))}{esc(r["name"])}</span>' for i, r in enumerate(runs))
    out = [f'<div class="legend">{legend}</div><div class="plots">']
    for title, keys in CURVES:
        keys = expand_keys(keys, runs)
        lines, labels = [], []
        for i, r in enumerate(runs):
            for j, k in enumerate(keys):
                ps = series(r["metrics"], k)
                if ps:
                    lines.append((*series_style(i, j, len(keys))[:2], ps, series_style(i, j, len(keys))[2]))
        if not lines:
            continue
        if len(keys) > 1:
            labels = [f'<span>{key_glyph(*series_style(0, j, len(keys))[:2])}{esc(k)}</span>'
                      for j, k in enumerate(keys)]
            if len(runs) > 1:  # which run: marker and line style
                labels += [f'<span>{key_glyph("#333", series_style(i, 0, len(keys))[1], MARKERS[i % len(MARKERS)])}'
                           f'{esc(r["name"])}</span>' for i, r in enumerate(runs)]
        out.append(f'<figure>{svg_plot(title, lines)}<figcaption class="legend">{"".join(labels) or esc(keys[0])}'
                   f'</figcaption></figure>')
    out.append("</div>")
    return "".join(out)


# ---------------------------------------------------------------- evaluation

def eval_html(runs: list[dict]) -> str:
    rows = []
    for r in runs:
        b, a = r["summary"].get("before"), r["summary"].get("after")
        if not isinstance(b, dict) and not isinstance(a, dict):
            rows.append(f'<tr><td>{esc(r["name"])}</td><td colspan="4" class="note">no evaluation in summary.json'
                        f'</td></tr>')
            continue
        b, a = b or {}, a or {}
        for k in [k for k in dict.fromkeys([*b, *a]) if k not in ("samples", "image_grid")]:
            bv, av = b.get(k), a.get(k)
            delta = ""
            if isinstance(bv, (int, float)) and isinstance(av, (int, float)):
                cls = "pos" if av > bv else "neg" if av < bv else ""
                delta = f'<span class="{cls}">{fmt(av - bv)}</span>'
            cells = "".join(f"<td>{score(d[k]) if k in d else ''}</td>" for d in (b, a))  # null: NaN, unscorable
            rows.append(f'<tr><td>{esc(r["name"])}</td><td>{esc(k)}</td>{cells}<td>{delta}</td></tr>')
    grids = []
    for r in runs:  # an image policy's held-out images: one row per condition, the same noises before and after
        cells = [f'<figure><img class="grid" alt="{esc(r["name"])} {when}" src="{esc(d["image_grid"])}">'
                 f'<figcaption>{esc(r["name"])}: {when}</figcaption></figure>'
                 for when in ("before", "after") for d in [r["summary"].get(when)]
                 if isinstance(d, dict) and str(d.get("image_grid", "")).startswith("data:image/png;base64,")]
        if cells:
            grids.append(f'<div class="grids">{"".join(cells)}</div>')
    return ('<table class="eval"><tr><th>run</th><th>metric</th><th>before</th><th>after</th><th>change</th></tr>'
            + "".join(rows) + "</table>" + "".join(grids))


# ---------------------------------------------------------------- completions

def _first(rec: dict, *names):
    for n in names:
        if n in rec:
            return rec[n]
    return None


def normalise_completion(rec: dict) -> dict:
    rewards = rec.get("rewards") if isinstance(rec.get("rewards"), dict) else {}
    rewards = {**rewards, **{k[len("rewards/"):]: v for k, v in rec.items() if k.startswith("rewards/")}}
    return {"step": _first(rec, "step"), "group": _first(rec, "group", "group_id", "group_idx"),
            "prompt": _first(rec, "prompt"), "completion": _first(rec, "completion", "text"),
            "rewards": rewards, "reward": _first(rec, "reward", "scalar_reward"),
            "advantage": _first(rec, "advantage"),
            "tokens": _first(rec, "tokens", "num_tokens", "token_count", "completion_tokens"),
            "truncated": rec.get("truncated"), **({"image": rec["image"]} if "image" in rec else {}),
            **({"picture": rec[k] for k in ("picture", "spectrogram") if k in rec})}


def completions_html(run: dict, idx: int) -> str:
    recs = run["completions"]
    if not recs:
        return f'<p class="note">{esc(NO_COMPLETIONS)}</p>'
    by_step: dict[Any, dict[Any, list[dict]]] = {}
    for rec in recs:
        by_step.setdefault(rec["step"], {}).setdefault(rec["group"], []).append(rec)
    steps = list(by_step)
    opts = "".join(f'<option value="{esc(s)}"{" selected" if s == steps[-1] else ""}>step {esc(s)}</option>'
                   for s in steps)
    out = [f'<label>step <select class="stepsel" data-run="{idx}">{opts}</select></label> '
           f'<span class="note">{len(recs)} completions, {len(steps)} steps</span>']
    for s, groups in by_step.items():
        cols = []
        for g, members in groups.items():
            items = []
            for c in members:
                rw = ", ".join(f"{esc(k)} {score(v)}" for k, v in c["rewards"].items())
                adv = c["advantage"]
                cls = "" if not isinstance(adv, (int, float)) else "pos" if adv > 0 else "neg" if adv < 0 else "zero"
                summary = (f'reward {score(c["reward"])} · <span class="{cls}">advantage {fmt(adv)}</span>'
                           f' · {fmt(c["tokens"])} tokens{" · truncated" if c["truncated"] else ""}'
                           + (f'<br><small>{rw}</small>' if rw else ""))
                image = c.get("image")
                if isinstance(image, str) and image.startswith("data:image/png;base64,"):  # an image policy's
                    items.append(f'<div class="completion"><img class="thumb" alt="image" src="{esc(image)}"> '
                                 f'{summary}</div>')
                else:
                    items.append(f'<details class="completion"><summary>{summary}</summary>'
                                 f'<pre class="text">{esc(c["completion"])}</pre></details>')
            picture = members[0].get("picture")  # the condition's picture (a VLM's scene, an utterance's frames)
            shown = (f'<img class="cond" alt="the prompt\'s picture" src="{esc(picture)}"><br>'
                     if isinstance(picture, str) and picture.startswith("data:image/png;base64,") else "")
            cols.append(f'<div class="group"><b>group {esc(g)}</b><div class="prompt">{shown}'
                        f'{esc(members[0]["prompt"])}</div>{"".join(items)}</div>')
        out.append(f'<div class="step" data-run="{idx}" data-step="{esc(s)}"><div class="groups">{"".join(cols)}'
                   f'</div></div>')
    return "".join(out)


# ---------------------------------------------------------------- the page

def load_run(path: str | Path) -> dict:
    path = check_run_folder(Path(path))
    metrics, notes = read_metrics(path)
    comps, cnotes = read_jsonl(path / "completions.jsonl")
    return {"name": path.name or str(path), "path": str(path), "metrics": metrics, "notes": notes + cnotes,
            "summary": read_summary(path), "config": read_config(path),
            "completions": [normalise_completion(c) for c in comps]}


def render(runs: list[dict]) -> str:
    names = ", ".join(r["name"] for r in runs)
    body = [f"<h1>grpolab report: {esc(names)}</h1>"]
    for r in runs:
        body += [f'<p class="note">{esc(r["path"])}: {len(r["metrics"])} steps logged</p>']
        body += [f'<p class="note">{esc(n)}</p>' for n in r["notes"]]
    body.append('<h2 id="curves">Curves</h2>' + plots_html(runs))
    body.append('<h2 id="eval">Evaluation before / after</h2>' + eval_html(runs))
    for i, r in enumerate(runs):
        body.append(f'<h2 id="config-{i}">Config diff from defaults: {esc(r["name"])}</h2>' + config_diff_html(r["config"]))
    for i, r in enumerate(runs):
        body.append(f'<h2 id="completions-{i}">Completions: {esc(r["name"])}</h2>' + completions_html(r, i))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>grpolab report: {esc(names)}</title><style>{CSS}</style></head><body>"
            + "\n".join(body) + f"<script>{JS}</script></body></html>\n")


def write_report(runs: list[str | Path], out: str | Path) -> Path:
    page = render([load_run(r) for r in runs])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
