"""grpolab report in a real headless browser (Debian's Chromium, driven by playwright): the page loads with no
console errors, the plots render, a completion opens on click, injected markup stays text.

Runs in `make test-browser` (installs chromium with apt-get and the `browser` extra, then sets
GRPOLAB_BROWSER_TESTS=1); skipped in `make test`. GRPOLAB_REPORT_SCREENSHOT=PATH keeps a screenshot there
(`make test-browser` writes docs/report_screenshot.png); GRPOLAB_CHROMIUM=PATH picks the browser binary."""
import os
import shutil
from pathlib import Path

import pytest

from grpolab.report.html import write_report

from report_helpers import EVIL, write_run

pytestmark = pytest.mark.skipif(os.environ.get("GRPOLAB_BROWSER_TESTS") != "1",
                                reason="browser test: run `make test-browser` (Chromium + playwright)")


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for the module (playwright's sync API allows one running instance per thread)."""
    from playwright.sync_api import sync_playwright  # the `browser` extra; a failure here is a real failure

    exe = os.environ.get("GRPOLAB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "no chromium binary: apt-get install chromium (make test-browser does it)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


def _open(browser, url):
    """A page at ``url`` and the console errors, dialogs and non-local requests it produced."""
    errors, dialogs, requests = [], [], []
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
    page.goto(url)
    page.wait_for_load_state("load")
    return page, errors, dialogs, requests


@pytest.fixture(scope="module")
def page_and_errors(chromium, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    runs = [write_run(root, "run_a"), write_run(root, "run_b", completions=False, scale=0.5)]
    out = write_report(runs, root / "report.html")
    page, errors, dialogs, requests = _open(chromium, out.as_uri())
    yield page, errors, dialogs, requests
    page.close()


def test_loads_without_console_errors_or_network(page_and_errors):
    page, errors, dialogs, requests = page_and_errors
    assert page.title().startswith("grpolab report")
    assert errors == [] and dialogs == [] and requests == []


def test_plots_render(page_and_errors):
    page = page_and_errors[0]
    svgs = page.locator("svg.plot")
    assert svgs.count() >= 6
    for i in range(svgs.count()):
        box = svgs.nth(i).bounding_box()
        assert box and box["width"] > 100 and box["height"] > 100
    paths = page.locator("svg.plot path.series")
    assert paths.count() >= 12  # two runs overlaid in each plot
    sizes = [paths.nth(i).bounding_box() for i in range(paths.count())]
    assert all(b and (b["width"] > 10) for b in sizes)


def test_completion_opens_on_click_and_untrusted_text_stays_text(page_and_errors, tmp_path):
    page, errors, dialogs, _ = page_and_errors
    step4 = page.locator('.step[data-step="4"]')
    assert step4.is_visible() and not page.locator('.step[data-step="2"]').is_visible()
    first = step4.locator("details.completion").first
    assert not first.locator("pre.text").is_visible()
    first.locator("summary").click()
    assert first.locator("pre.text").is_visible()
    assert first.locator("pre.text").inner_text() == "completion s4 g0 k0"
    evil = step4.locator("details.completion").last
    evil.locator("summary").click()
    assert evil.locator("pre.text").inner_text() == EVIL
    assert page.locator("img").count() == 0 and page.title() != "pwned" and dialogs == [] and errors == []
    page.select_option('select.stepsel[data-run="0"]', "2")  # browse to another step
    assert page.locator('.step[data-step="2"]').is_visible() and not step4.is_visible()
    page.select_option('select.stepsel[data-run="0"]', "4")
    shot = os.environ.get("GRPOLAB_REPORT_SCREENSHOT")
    if shot:
        Path(shot).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=shot, full_page=True)
        assert Path(shot).stat().st_size > 10_000


def test_an_image_run_shows_its_grids_and_thumbnails(chromium, tmp_path):
    """An image policy's run (flow_grpo_images, 1 step): the report's before/after grids and a logged sample's
    thumbnail are real images in the browser (decoded: natural size > 0, drawn at a visible size), with no console
    error and no network request."""
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    out = tmp_path / "run"
    cfg = Config.build({**recipe_overrides("flow_grpo_images"), "steps": 1, "prompts_per_step": 2,
                        "num_generations": 2, "eval_problems": 10, "out": str(out), "threads": 1})
    Trainer(cfg, log=lambda *a: None).train(progress=False)
    report = write_report([out], tmp_path / "report.html")
    page, errors, dialogs, requests = _open(chromium, report.as_uri())
    grids = page.locator("img.grid")
    assert grids.count() == 2
    for i in range(2):
        natural = grids.nth(i).evaluate("e => [e.complete, e.naturalWidth, e.naturalHeight]")
        assert natural[0] and natural[1] > 0 and natural[2] > 0, natural
        box = grids.nth(i).bounding_box()
        assert box and box["width"] >= 32 and box["height"] >= 32, box  # 10 classes x 1 noise here: one column
    thumb = page.locator("img.thumb").first
    if not thumb.is_visible():  # inside a closed <details>: open it
        thumb.locator("xpath=ancestor::details[1]/summary").first.click()
    assert thumb.is_visible() and thumb.evaluate("e => e.complete && e.naturalWidth > 0")
    shot = os.environ.get("GRPOLAB_IMAGE_REPORT_SCREENSHOT")
    if shot:
        page.screenshot(path=shot, full_page=True)
    page.close()
    assert errors == [] and dialogs == [] and requests == []


@pytest.mark.parametrize("recipe, extra", [("vlm_grpo", {"vlm_pretrain_steps": 5}), ("asr_grpo", {})])
def test_a_vision_or_speech_run_shows_each_prompts_picture(chromium, tmp_path, recipe, extra):
    """A vision-language run (vlm_grpo: the prompt's scene) and a speech run (asr_grpo: the utterance's feature
    frames as a spectrogram) show each group's picture beside its prompt: decoded in the browser, drawn at a visible
    size, with no console error and no network request. (There is no audio to play: the speech corpus is feature
    frames, docs/speech.md.)"""
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    out = tmp_path / "run"
    cfg = Config.build({**recipe_overrides(recipe), **extra, "steps": 1, "prompts_per_step": 2, "num_generations": 2,
                        "eval_problems": 4, "micro_batch_size": 8, "out": str(out), "threads": 1})
    Trainer(cfg, log=lambda *a: None).train(progress=False)
    report = write_report([out], tmp_path / "report.html")
    page, errors, dialogs, requests = _open(chromium, report.as_uri())
    pictures = page.locator("img.cond")
    assert pictures.count() >= 2
    first = pictures.first
    assert first.evaluate("e => e.complete && e.naturalWidth > 0 && e.naturalHeight > 0")
    box = first.bounding_box()
    assert box and box["width"] >= 32 and box["height"] >= 32, box
    page.close()
    assert errors == [] and dialogs == [] and requests == []


def test_a_diffusion_lm_run_shows_its_completions(chromium, tmp_path):
    """A masked-diffusion LM's run (diffu_grpo, 1 step): the report loads with its plots and a logged completion
    opens on click and shows the text the dLLM wrote, with no console error and no network request."""
    import json

    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    out = tmp_path / "run"
    cfg = Config.build({**recipe_overrides("diffu_grpo"), "steps": 1, "prompts_per_step": 2, "num_generations": 2,
                        "eval_problems": 4, "out": str(out), "threads": 1})
    Trainer(cfg, log=lambda *a: None).train(progress=False)
    first = json.loads((out / "completions.jsonl").read_text().splitlines()[0])
    report = write_report([out], tmp_path / "report.html")
    page, errors, dialogs, requests = _open(chromium, report.as_uri())
    summary = page.locator("details.completion summary").first
    summary.click()
    text = page.locator("details.completion pre.text").first
    assert text.is_visible()
    shown = [t.strip() for t in page.locator("details.completion pre.text").all_inner_texts()]
    assert first["completion"].strip() in shown
    page.close()
    assert errors == [] and dialogs == [] and requests == []
