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
