"""grpolab report: structure, escaping of untrusted text, self-contained (no network)."""
import re

from grpolab.cli import main
from grpolab.report.html import NO_COMPLETIONS, normalise_completion, write_report

from report_helpers import EVIL, write_run


def test_report_sections_curves_eval_config_completions(tmp_path, capsys):
    a, b = write_run(tmp_path, "run_a"), write_run(tmp_path, "run_b", completions=False, scale=0.5)
    out = tmp_path / "r" / "report.html"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>")
    # one plot per metric family; every run overlaid: two colours in the reward plot
    svgs = re.findall(r"<svg class=\"plot\".*?</svg>", page, re.S)
    titles = [re.search(r'aria-label="([^"]+)"', s).group(1) for s in svgs]
    for t in ("reward", "accuracy and reward columns", "completion length (tokens)", "KL to the reference",
              "entropy (nats/token)", "clip fraction"):
        assert t in titles
    reward_svg = svgs[titles.index("reward")]
    assert len(re.findall(r'<path class="series"', reward_svg)) == 2
    assert len(set(re.findall(r'stroke="(#[0-9a-f]{6})"', reward_svg))) == 2
    # 6 steps each (the truncated last line of metrics.jsonl is skipped and noted)
    assert reward_svg.count("L") >= 10 and "not valid JSON" in page
    # evaluation before / after, with the change
    assert re.search(r"<td>run_a</td><td>accuracy</td><td>0.1</td><td>0.35</td>", page)
    # config diff from defaults
    assert re.search(r"<td>learning_rate</td><td>0.0005</td><td>[^<]+</td>", page)
    assert re.search(r"<td>model</td><td>tiny</td>", page)
    # completions: steps, groups side by side, rewards and advantages; run_b says none were logged
    assert page.count('class="step"') == 2 and page.count('class="group"') == 4
    assert page.count('<details class="completion">') == 12
    assert "advantage 1.2" in page and "match 1" in page and "truncated" in page
    assert NO_COMPLETIONS in page


def test_untrusted_text_is_escaped(tmp_path):
    out = write_report([write_run(tmp_path, "run_a")], tmp_path / "report.html")
    page = out.read_text()
    assert EVIL not in page and "<img" not in page and "onerror=\"" not in page
    assert "&lt;/script&gt;&lt;img src=x onerror=" in page
    assert page.count("<script>") == 1 and page.count("</script>") == 1  # only the report's own
    assert "&lt;b&gt;bold?&lt;/b&gt;" in page


def test_self_contained_no_network(tmp_path):
    page = write_report([write_run(tmp_path, "run_a")], tmp_path / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "@import" not in page and "url(" not in page
    assert "<link" not in page and "<script src" not in page


def test_completions_field_aliases():
    rec = normalise_completion({"step": 3, "group_id": 7, "prompt": "p", "text": "t", "rewards/acc": 1.0,
                                "scalar_reward": 1.0, "advantage": 0.5, "num_tokens": 4})
    assert rec == {"step": 3, "group": 7, "prompt": "p", "completion": "t", "rewards": {"acc": 1.0},
                   "reward": 1.0, "advantage": 0.5, "tokens": 4, "truncated": None}


def test_missing_run_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "r.html")]) == 2
    assert "no such run folder" in capsys.readouterr().err


# ------------------------------------------------------------------ issue 23: what a reader can tell apart
def _svg(page: str, title: str) -> str:
    svgs = re.findall(r"<svg class=\"plot\".*?</svg>", page, re.S)
    return next(s for s in svgs if f'aria-label="{title}"' in s)


def test_unscorable_rewards_are_marked_not_blank(tmp_path):
    import json
    run = write_run(tmp_path, "run_a")
    lines = [{"step": 1, "group": 0, "prompt": "p", "completion": "c", "rewards": {"match": None, "format": 0.5},
              "reward": None, "advantage": 0.0, "tokens": 3, "truncated": False}]
    (run / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "summary.json").write_text(json.dumps({"before": {"n": 4, "reward_mean": None, "accuracy": 0.5},
                                                  "after": {"n": 4, "reward_mean": 0.25, "accuracy": 0.5}}))
    page = write_report([run], tmp_path / "report.html").read_text()
    mark = '<span class="unscorable" title="unscorable (NaN)">—</span>'
    assert f"match {mark}" in page and f"reward {mark}" in page  # a reward column and the scalar reward
    assert re.search(rf"<td>reward_mean</td><td>{re.escape(mark)}</td><td>0.25</td>", page)


def test_a_zero_advantage_is_neutral(tmp_path):
    import json
    run = write_run(tmp_path, "run_a")
    lines = [{"step": 1, "group": 0, "prompt": "p", "completion": f"c{a}", "rewards": {"match": 1.0},
              "reward": 1.0, "advantage": a, "tokens": 3, "truncated": False} for a in (0.0, 0.5, -0.5)]
    (run / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    page = write_report([run], tmp_path / "report.html").read_text()
    classes = dict((v, c) for c, v in re.findall(r'<span class="(\w*)">advantage ([^<]+)</span>', page))
    assert classes == {"0": "zero", "0.5": "pos", "-0.5": "neg"}, classes


def test_ten_reward_columns_have_ten_colours(tmp_path):
    import json
    run = write_run(tmp_path, "run_a")
    names = [f"r{k}" for k in range(10)]
    rows = [{"step": s, "reward_mean": 0.1 * s, **{f"rewards/{n}/mean": 0.05 * k + 0.01 * s for k, n in
                                                    enumerate(names)}} for s in range(1, 7)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_report([run], tmp_path / "report.html").read_text()
    svg = _svg(page, "accuracy and reward columns")
    strokes = re.findall(r'<path class="series"[^>]*stroke="(#[0-9a-f]{6})"', svg)
    assert len(strokes) == 10 and len(set(strokes)) == 10, strokes
    caption = page[page.index(svg):].split("</figcaption>")[0]
    assert all(f"rewards/{n}/mean" in caption for n in names) and len(set(re.findall(r"#[0-9a-f]{6}", caption))) == 10


def test_two_runs_differ_by_marker_as_well_as_colour(tmp_path):
    a, b = write_run(tmp_path, "run_a"), write_run(tmp_path, "run_b", scale=0.5)
    page = write_report([a, b], tmp_path / "report.html").read_text()
    svg = _svg(page, "reward")
    shapes = re.findall(r'class="marker (\w+)"', svg)
    assert len(set(shapes)) == 2, shapes


def _ticks(svg: str, anchor: str) -> list[str]:
    return re.findall(rf'<text[^>]*text-anchor="{anchor}"[^>]*font-size="10"[^>]*>([^<]+)</text>', svg)


def test_axis_ticks_are_round_numbers(tmp_path):
    import json
    from decimal import Decimal
    run = write_run(tmp_path, "run_a", steps=17)
    rows = [{"step": s, "reward_mean": 0.1123 + (2.312 - 0.1123) * (s - 1) / 16} for s in range(1, 18)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    svg = _svg(write_report([run], tmp_path / "report.html").read_text(), "reward")
    for labels, lo, hi in ((_ticks(svg, "end"), 0.1123, 2.312), ([t for t in _ticks(svg, "middle") if t != "step"],
                                                                   1, 17)):
        values = [Decimal(t) for t in labels]
        if hi == 17:  # steps: round ticks inside the steps logged (5, 10, 15)
            assert Decimal(lo) <= values[0] and values[-1] <= Decimal(hi) and values[-1] - values[0] >= 8, labels
            lo, hi = values[0], values[-1]
        assert len(values) >= 3, labels
        steps = {values[i + 1] - values[i] for i in range(len(values) - 1)}
        assert len(steps) == 1, labels  # evenly spaced
        step = steps.pop()
        mantissa = step.scaleb(-step.adjusted()).normalize()
        assert mantissa in {Decimal(1), Decimal(2), Decimal("2.5"), Decimal(5)}, labels
        assert all(v % step == 0 for v in values), labels  # multiples of the step: 0.5, 1, 1.5, not 0.612
        assert values[0] <= Decimal(str(lo)) and values[-1] >= Decimal(str(hi)), labels  # they frame the data
