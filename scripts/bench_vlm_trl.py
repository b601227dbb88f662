"""Step time of grpolab beside TRL 1.16's ``GRPOTrainer`` on the same tiny random-weight Qwen2-VL (issue 42).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_vlm_trl.py            # needs the bench extra (trl)

A ``Qwen2VLForConditionalGeneration`` with random weights (vision: 4 blocks, width 128, patch 8, merge 2; text: 4
layers, width 256; a character-level tokenizer) is built once and saved with ``save_pretrained``, with 32 rows of
TRL's VLM convention: a conversational prompt with an ``{"type": "image"}`` block and a 64 x 64 picture (64 patches,
16 image tokens each). Each measurement runs in a fresh subprocess; the libraries alternate (grpolab, TRL, grpolab,
TRL, ...) for ``--rounds`` rounds; each runs ``--warmup`` untimed steps, then ``--steps`` timed optimiser steps.

The same job on both sides: the same weights and rows (grpolab reads them from ``--data rows.jsonl`` with the
pictures as PNG paths, TRL from a ``datasets.Dataset`` of PIL images), ``--prompts`` prompts x G completions per
step in one micro-batch, the same maximum completion length, temperature, learning rate, float32, one thread
(``--threads``), beta 0, TRL's default loss (``dapo``; grpolab ``clipped_ratio`` + ``token_mean``), group z-score
advantages, no vLLM, no gradient checkpointing. grpolab samples with its VLM policy's KV-cached loop; TRL with
``model.generate``, the image placeholder suppressed (``generation_kwargs={"suppress_tokens": [...]}``: the same
support as grpolab's sampler, which never writes one). TRL gets the native ``Qwen2VLProcessor`` (built without its
video part, which needs torchvision); grpolab its own ``layouts.PatchProcessor`` from the folder (the same ids:
tests/test_vlm_models.py). Printed: a Markdown table (median and fastest step, every timed step, generated tokens per step, peak
RSS) and the load average at the start and the end (other jobs on the machine show there).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
CHARS = list(string.printable[:95]) + ["\n"]
TEMPLATE = ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in "
            "m['content'] %}{% if c['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% elif "
            "c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{% if not loop.last %}"
            "{{ '\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '\\n' }}{% endif %}")
QUESTIONS = ["What colour is the top left?", "Describe the picture.", "Is it bright or dark?", "Count the blobs."]


def reward(completions, **kwargs) -> list[float]:
    """A cheap reward that varies between completions (the character codes mod 7, scaled)."""
    return [float(sum(map(ord, c if isinstance(c, str) else c[0]["content"])) % 7) / 6 for c in completions]


def build(folder: Path, data: Path, n_rows: int = 32) -> None:
    """The tiny Qwen2-VL folder and the rows (rows.jsonl with PNG paths) of the module docstring."""
    import numpy as np
    import torch
    from PIL import Image
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from grpolab.model.loading import char_tokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    specials = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok = char_tokenizer(["<pad>", "<eos>", "<unk>", "<bos>"] + CHARS, pad_token="<pad>", eos_token="<eos>",
                         unk_token="<unk>", bos_token="<bos>", padding_side="left")
    tok.add_special_tokens({"additional_special_tokens": specials})
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    text = dict(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                rope_parameters={"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 10000.0})
    vision = dict(depth=4, embed_dim=128, hidden_size=256, num_heads=4, mlp_ratio=2, patch_size=8,
                  spatial_merge_size=2, temporal_patch_size=2)
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                        vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(cfg).float().save_pretrained(folder)
    tok.save_pretrained(folder)
    Qwen2VLImageProcessorPil(min_pixels=64 * 64, max_pixels=64 * 64, patch_size=8, merge_size=2,
                             temporal_patch_size=2).save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n_rows):
        path = data.parent / f"pic{i}.png"
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
        prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTIONS[i % 4]}]}]
        lines.append(json.dumps({"prompt": prompt, "image": str(path)}))
    data.write_text("\n".join(lines) + "\n")


def _peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (grpolab.bench.PeakRSS's high-water mark, as both benches)."""
    from grpolab.bench import PeakRSS
    return PeakRSS.high_water_mark() / 2 ** 20


def run_grpolab(a) -> dict:
    import torch

    sys.path.insert(0, str(HERE))  # the reward: bench_vlm_trl:reward
    from grpolab.config import Config
    from grpolab.train.trainer import Trainer
    cfg = Config.build({"policy": "vision_language", "model": a.folder, "data": a.data,
                        "reward": ["bench_vlm_trl:reward"], "steps": a.warmup + a.steps, "prompts_per_step": a.prompts,
                        "num_generations": a.G, "max_completion_length": a.max_new, "temperature": a.temperature,
                        "learning_rate": a.lr, "micro_batch_size": a.prompts * a.G, "beta": 0.0,
                        "policy_loss": "clipped_ratio", "loss_aggregation": "token_mean",
                        "advantage": "group_zscore", "eval_split": 0, "eval_before": False, "eval_after": False,
                        "tensorboard": False, "out": str(Path(tempfile.mkdtemp()) / "run"), "seed": a.seed,
                        "threads": a.threads, "dtype": "float32", "save_steps": 10 ** 6})
    tr = Trainer(cfg, log=lambda *x: None)
    times, tokens = [], []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        m = tr.train_step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(m["completion_len_mean"] * a.prompts * a.G)
    return {"lib": "grpolab", "step_s": times, "gen_tokens": tokens, "peak_rss_mb": _peak_rss_mb(),
            "threads": torch.get_num_threads()}


def run_trl(a) -> dict:
    import torch
    from datasets import Dataset
    from PIL import Image
    from transformers import (AutoTokenizer, ProcessorMixin, Qwen2VLForConditionalGeneration, Qwen2VLProcessor,
                              TrainerCallback)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads)
    check = ProcessorMixin.check_argument_for_proper_class  # the processor without its (torchvision) video part
    ProcessorMixin.check_argument_for_proper_class = lambda self, n, arg: None if arg is None else check(self, n, arg)
    tok = AutoTokenizer.from_pretrained(a.folder, padding_side="left")
    proc = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessorPil.from_pretrained(a.folder), tokenizer=tok,
                            video_processor=None, chat_template=TEMPLATE)
    model = Qwen2VLForConditionalGeneration.from_pretrained(a.folder, dtype=torch.float32)
    rows = [json.loads(x) for x in Path(a.data).read_text().splitlines()]
    ds = Dataset.from_list([{"prompt": r["prompt"], "image": Image.open(r["image"]).convert("RGB")} for r in rows])
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=a.prompts * a.G,
                      gradient_accumulation_steps=1, num_generations=a.G, max_completion_length=a.max_new,
                      temperature=a.temperature, learning_rate=a.lr, beta=0.0, max_steps=a.warmup + a.steps,
                      use_cpu=True, bf16=False, gradient_checkpointing=False, use_vllm=False, report_to="none",
                      save_strategy="no", logging_steps=1, seed=a.seed, disable_tqdm=True,
                      dataloader_num_workers=0, generation_kwargs={"suppress_tokens": [model.config.image_token_id]})
    marks, tokens, start = [], [], [0.0]

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            start[0] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                tokens.append(logs["completions/mean_length"] * a.prompts * a.G)

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=proc,
                          callbacks=[Clock()])
    trainer.train()
    edges = [start[0]] + marks
    steps = [edges[i + 1] - edges[i] for i in range(len(marks))]
    return {"lib": "trl", "step_s": steps[a.warmup:], "gen_tokens": tokens[a.warmup:],
            "peak_rss_mb": _peak_rss_mb(), "threads": torch.get_num_threads()}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--G", type=int, default=4)
    p.add_argument("--max-new", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", choices=["grpolab", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = _parser().parse_args(argv)
    if a.worker:
        out = (run_grpolab if a.worker == "grpolab" else run_trl)(a)
        print("BENCH_RESULT " + json.dumps(out))
        return 0
    import trl
    tmp = Path(tempfile.mkdtemp(prefix="grpolab-vlm-bench-"))
    (tmp / "m").mkdir()
    build(tmp / "m", tmp / "rows.jsonl")
    runs: dict[str, list] = {"grpolab": [], "trl": []}
    t0, load0 = time.time(), os.getloadavg()
    for r in range(a.rounds):
        for lib in ("grpolab", "trl"):
            cmd = [sys.executable, __file__, *argv, "--worker", lib, "--folder", str(tmp / "m"),
                   "--data", str(tmp / "rows.jsonl")]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            res = [json.loads(x[len("BENCH_RESULT "):]) for x in proc.stdout.splitlines()
                   if x.startswith("BENCH_RESULT ")]
            if not res:
                raise SystemExit(f"{lib} worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            runs[lib].append(res[0])
            print(f"round {r + 1} {lib}: steps {[round(s, 2) for s in res[0]['step_s']]}", file=sys.stderr)
    summ = {}
    for lib, rs in runs.items():
        steps = [s for x in rs for s in x["step_s"]]
        toks = [t for x in rs for t in x["gen_tokens"]]
        summ[lib] = {"median": statistics.median(steps), "min": min(steps), "all": steps,
                     "tokens": statistics.mean(toks),
                     "rss": max(x["peak_rss_mb"] for x in rs)}
    g, t = summ["grpolab"], summ["trl"]
    print(f"Tiny random-weight Qwen2-VL ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{a.threads} thread(s), float32, trl {trl.__version__}); {a.prompts} prompts x G {a.G}, up to "
          f"{a.max_new} tokens, {a.rounds} rounds x {a.steps} timed steps each ({time.time() - t0:.0f} s; "
          f"load average {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end):\n")
    print("| library | median step (s) | fastest step (s) | steps timed (s) | generated tokens / step | peak RSS (MB) |")
    print("|---|---|---|---|---|---|")
    for name, s in (("TRL 1.16 `GRPOTrainer`", t), ("grpolab", g)):
        print(f"| {name} | {s['median']:.2f} | {s['min']:.2f} | {', '.join(f'{x:.2f}' for x in s['all'])} | "
              f"{s['tokens']:.0f} | {s['rss']:.0f} |")
    print(f"\nstep time grpolab / TRL: median **{g['median'] / t['median']:.2f}**, fastest "
          f"**{g['min'] / t['min']:.2f}**")
    return 0


if __name__ == "__main__":
    sys.exit(main())
