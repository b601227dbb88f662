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


def test_the_step_breakdown_adds_up_and_is_rendered():
    """The worker's parts (generation, training forward, backward, optimiser, other) sum to its mean step time;
    the report shows each against its floor."""
    a = bench._parser().parse_args(["--model", "tiny", "--prompts", "2", "--G", "2", "--max-new", "4", "--steps",
                                    "2", "--warmup", "0", "--micro-batch", "2"])
    res = bench._run_grpolab(a)
    parts = res["parts"]
    # the chat-templated prompt's length (a BatchEncoding from transformers 5 is not a dict: once counted as 2 keys)
    assert res["prompt_tokens"] > 5, res["prompt_tokens"]
    assert set(parts) == {"generation", "forward", "backward", "optimizer", "other"}
    assert all(v >= 0 for k, v in parts.items() if k != "other"), parts
    assert parts["forward"] > 0 and parts["optimizer"] > 0 and parts["generation"] > 0
    assert abs(sum(parts.values()) - sum(res["step_s"]) / 2) < 1e-6 * max(1.0, sum(res["step_s"]))
    # floors: 2 / 2 / 4 forward FLOPs of 10 MACs at 10 FLOP/s; AdamW 28 bytes x 5 params at 14 bytes/s
    rows = bench.step_breakdown({"generation": 4.0, "forward": 2.0, "backward": 8.0, "optimizer": 1.0,
                                 "other": 0.5}, macs=10.0, n_params=5, rate=10.0, bandwidth=14.0)
    assert rows == [("generation", 4.0, 2.0), ("training forward", 2.0, 2.0), ("training backward", 8.0, 4.0),
                    ("optimiser", 1.0, 10.0), ("other", 0.5, 0.0)]
    summ = {"grpolab": bench._summary([res])}
    table = bench.render(a, [], summ, 1e9, None, None, None, 1.0, breakdown=rows)
    assert "| training backward | 8.00 | 52% | 4.00 | 2.0x |" in table and "| other | 0.50 | 3% | 0.00 | n/a |" in table
    assert bench.step_flops(3, 2, 5, 2, 4) == 8 * bench.pass_macs(3, 2, 5, 2, 4) == 8 * (3 * (5 * 2 + 4) + 2 * 4)


def test_gpu_memory_column_only_when_both_report_it(monkeypatch):
    a = bench._parser().parse_args(["--device", "cuda", "--precision", "bf16", "--grpolab-set",
                                    "generation_engine=vllm"])
    run = {"step_s": [2.0], "gen_tokens": [10.0], "peak_rss": 2 ** 30, "precision": "bfloat16 autocast"}
    summ = {"grpolab": bench._summary([{**run, "peak_gpu": 2 ** 30}]),
            "trl": bench._summary([{**run, "peak_gpu": 2 ** 31}])}
    monkeypatch.setattr(bench, "_cuda_name", lambda: "fake GPU")  # no CUDA here: the machine line's name only
    table = bench.render(a, [], summ, 1e12, None, None, None, 1.0)
    assert "peak GPU memory (MB) |" in table and "| 1024 | 1024 |" in table and "| 1024 | 2048 |" in table
    assert "peak GPU memory grpolab / TRL: **0.50**" in table
    assert "measured bfloat16 matmul rate 1000.0 GFLOP/s" in table and "`generation_engine=vllm`" in table
    cpu = {"grpolab": bench._summary([{**run, "peak_gpu": None}])}
    assert "GPU memory" not in bench.render(bench._parser().parse_args([]), [], cpu, 1e9, None, None, None, 1.0)


def test_steps_per_generation_is_timed_over_whole_windows(capsys):
    """With steps_per_generation K only a window's first step generates: the step time is the mean over whole
    windows (not the median, a training-only step), and steps / warm-up not a multiple of K are refused."""
    a = bench._parser().parse_args(["--grpolab-set", "steps_per_generation=4", "--steps", "4", "--warmup", "4"])
    assert bench.generation_window(a) == 4 and bench.generation_window(bench._parser().parse_args([])) == 1
    run = {"step_s": [70.0, 20.0, 22.0, 24.0], "gen_tokens": [2000.0] * 4, "peak_rss": 2 ** 30}
    assert bench._summary([run], 4)["median_step_s"] == 34.0 and bench._summary([run])["median_step_s"] == 23.0
    assert "grpolab mean over windows of 4" in bench.render(a, [], {"grpolab": bench._summary([run], 4)}, 1e9,
                                                            None, None, None, 1.0)
    assert bench.speed(["--lib", "grpolab", "--grpolab-set", "steps_per_generation=4", "--steps", "2"]) == 2
    assert "must be multiples of it" in capsys.readouterr().err
    assert bench.memory_bandwidth(mb=8, seconds=0.05) > 1e8


def test_logprob_consistency_in_each_precision():
    """Sampling's behaviour log-probs against the training forward, tiny model: float32 agrees to float rounding;
    under bf16 autocast (both sides, float32 weights) the two paths round differently, so the gap is larger but
    still far from a wrong log-prob (a token's log-prob is O(1) nats)."""
    f32 = bench.logprob_consistency("tiny", prompts=2, G=2, max_new=6)
    bf16 = bench.logprob_consistency("tiny", prompts=2, G=2, max_new=6, precision="bf16")
    assert f32["tokens"] == bf16["tokens"] > 0
    assert f32["max_abs"] < 1e-4 and bf16["mean_abs"] > f32["mean_abs"] and bf16["max_abs"] < 0.5, (f32, bf16)


def test_cpu_floor_is_taken_at_the_rate_of_the_run_precision(monkeypatch):
    """A bf16 run's floor on the CPU is its FLOPs over the bfloat16 matmul rate (AMX / AVX512-BF16 run bf16
    products several times faster than float32): the rate helper gets the run's dtype, the table names it."""
    import torch
    seen = []
    monkeypatch.setattr("grpolab.devices.matmul_rate",
                        lambda m, k, n, dtype=torch.float32, seconds=1.0: seen.append(dtype) or 1e9)
    assert bench.matmul_flops_per_s(0.01, dtype=torch.bfloat16) == 1e9 and set(seen) == {torch.bfloat16}
    seen.clear()
    assert bench.matmul_flops_per_s(0.01) == 1e9 and set(seen) == {torch.float32}
    run = {"step_s": [2.0], "gen_tokens": [10.0], "peak_rss": 2 ** 30, "precision": "bfloat16 autocast"}
    summ = {"grpolab": bench._summary([run])}
    bf16 = bench._parser().parse_args(["--precision", "bf16"])
    assert "device cpu; measured bfloat16 matmul rate 1.0 GFLOP/s" in bench.render(
        bf16, [], summ, 1e9, None, None, None, 1.0)
    assert "measured float32 matmul rate" in bench.render(bench._parser().parse_args([]), [], summ, 1e9, None,
                                                          None, None, 1.0)


def test_trl_heap_reuse_gives_trl_grpolabs_glibc_settings(monkeypatch):
    """--trl-heap-reuse: the TRL worker process gets glibc's environment form of cpu_heap_reuse (the values
    devices.reuse_freed_memory sets with mallopt), grpolab's does not, and the report says so."""
    a = bench._parser().parse_args(["--trl-heap-reuse"])
    assert bench.trl_heap_env() == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
    assert bench.worker_env(a, "trl") == bench.trl_heap_env() and bench.worker_env(a, "grpolab") is None
    assert bench.worker_env(bench._parser().parse_args([]), "trl") is None
    seen = []
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, **kw: seen.append(kw["env"]) or type(
        "P", (), {"stdout": 'BENCH_RESULT {"lib": "trl"}', "returncode": 0, "stderr": ""})())
    assert bench._spawn("trl", [], env=bench.worker_env(a, "trl")) == {"lib": "trl"}
    assert seen[0]["MALLOC_MMAP_MAX_"] == "0" and seen[0]["HF_HUB_OFFLINE"] == "1"
    run = {"step_s": [2.0], "gen_tokens": [10.0], "peak_rss": 2 ** 30}
    table = bench.render(a, [], {"trl": bench._summary([run])}, 1e9, None, None, None, 1.0)
    assert "TRL without vLLM and with MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_=1073741824" in table
    assert "MALLOC" not in bench.render(bench._parser().parse_args([]), [], {"trl": bench._summary([run])}, 1e9,
                                        None, None, None, 1.0)
