"""scripts/gpu_check.sh (run unattended on a borrowed GPU machine) and the precision labels of `grpolab bench
speed`, checked here without a GPU and without downloading: the script parses, `prepare` refuses an incomplete
model folder (loudly, nothing carried), the carried wheels name what TRL needs that the GPU machine lacks, and
the speed table labels the precision each library ran."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpolab import bench

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


@pytest.mark.parametrize("files, missing", [
    ({"model.safetensors": "x", "tokenizer.json": "x", "tokenizer_config.json": "x"}, "config.json"),
    ({"model.safetensors": "", "tokenizer.json": "x", "tokenizer_config.json": "x", "config.json": "{}"},
     "model.safetensors"),
])
def test_prepare_refuses_an_incomplete_model_folder(tmp_path, files, missing):
    """A SmolLM2 folder without its config, or with empty weights (an interrupted conversion): prepare exits
    non-zero before downloading anything, names what is missing on stderr, prints nothing on stdout and
    carries nothing."""
    model = tmp_path / "cache" / "smollm2-135m-instruct"
    model.mkdir(parents=True)
    for name, text in files.items():
        (model / name).write_text(text)
    env = {**os.environ, "GRPOLAB_CACHE": str(tmp_path / "cache"), "GPU_CARRY": str(tmp_path / "carry"),
           "PY": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPT), "prepare"], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode != 0 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert re.search(rf"incomplete: missing or empty: {re.escape(missing)}$", proc.stderr, re.MULTILINE), proc.stderr
    assert "gpu_check.sh: error: SmolLM2's folder" in proc.stderr
    assert not (tmp_path / "carry").exists()


def test_the_carried_wheels_hold_what_trl_needs_that_the_gpu_machine_lacks():
    """trl 1.16.0 -> datasets -> dill, multiprocess: none of them on the GPU machine; pinned, for Python 3.12."""
    text = SCRIPT.read_text()
    wheels = dict(w.split("==") for w in re.search(r'^TRL_WHEELS="([^"]+)"', text, re.MULTILINE).group(1).split())
    assert {"trl", "datasets", "dill", "multiprocess"} <= set(wheels) and wheels["trl"] == "1.16.0"
    assert "--python-version 3.12" in text and "--only-binary=:all:" in text


def test_precision_labels():
    import torch

    assert bench.precision_label(torch.float32) == "float32"
    assert bench.precision_label(torch.bfloat16) == "bfloat16 autocast"


@pytest.mark.parametrize("precision, ran", [("float32", "float32"), ("bf16", "bfloat16 autocast")])
def test_the_speed_table_shows_the_precision_each_library_ran(precision, ran):
    """grpolab's worker runs the asked precision (not `dtype: auto`) and reports it; the table has a precision
    column per library, and no fixed 'float32' for the job."""
    a = bench._parser().parse_args(["--model", "tiny", "--prompts", "2", "--G", "2", "--max-new", "4", "--steps",
                                    "1", "--warmup", "0", "--micro-batch", "4", "--precision", precision])
    res = bench._run_grpolab(a)
    assert res["precision"] == ran
    trl = {"step_s": [1.0], "gen_tokens": [8.0], "peak_rss": 2 ** 20, "precision": "float32"}
    summ = {"grpolab": bench._summary([res]), "trl": bench._summary([trl])}
    table = bench.render(a, [], summ, 1e9, None, None, None, 1.0)
    assert f"| grpolab | {ran} |" in table and "| trl | float32 |" in table
    assert f"precision asked: {precision}" in table
