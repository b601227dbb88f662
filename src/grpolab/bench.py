"""``grpolab bench speed``: grpolab against TRL's GRPOTrainer on the same job.

Each measurement runs in a fresh subprocess (so peak memory is that library's
alone): the model is loaded, ``warmup`` steps run untimed, then ``steps``
optimiser steps are timed. The two libraries alternate (grpolab, TRL, grpolab,
TRL, ...) for ``rounds`` rounds, and the report gives per library the median
step time, generated tokens per second and peak resident memory, the ratios
grpolab / TRL, and grpolab's step time over the compute floor (the step's
FLOPs over this machine's measured matrix-multiply rate).

grpolab samples with its faster exact sampler (``sampling_method:
inverse_cdf``; the same distribution as TRL's ``torch.multinomial``).
Identical settings on both sides: the same model weights (SmolLM2-135M-Instruct
as float32 safetensors), the same prompts and reward, G completions per
prompt, the same maximum completion length, temperature, learning rate,
micro-batch size and gradient accumulation (one optimiser step per
``prompts x G`` completions), the same precision (``--precision``: float32, or
bf16 = bfloat16 autocast over float32 weights, grpolab's ``dtype: bfloat16`` and
TRL's ``bf16=True``), no KL term (beta = 0), no vLLM, no
gradient checkpointing (TRL's default turns it on; it is switched off so both
do the same work), the "grpo" loss (sequence mean of token means) on both.
Each worker reports the precision it actually ran, and the table shows it per
library (a ``--grpolab-set dtype=...`` override shows there too).

Timings never enter the test suite; ``make bench`` writes docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOPICS = ["how a rainbow forms", "why the sky is blue", "how bread rises", "how a bicycle stays upright",
          "how vaccines work", "why leaves change colour", "how a refrigerator cools", "how tides happen",
          "how a compass works", "why ice floats", "how plants make food", "how sound travels"]


def bench_prompts(n: int = 64, prompt_words: int = 0) -> list[dict]:
    """Chat prompts that make an instruct model write long answers (so completions reach the length cap).

    ``prompt_words`` > 0 pads each prompt with that many words of context (long-prompt runs).
    """
    rows = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        context = ""
        if prompt_words:
            context = " ".join(f"note{(i * 7 + j) % 97}" for j in range(prompt_words)) + "\n\n"
        rows.append({"prompt": [{"role": "user", "content": f"{context}Explain in detail {topic}, step by step."}],
                     "topic": topic})
    return rows


def bench_reward(completions, topic=None, **kwargs) -> list[float]:
    """A cheap reward that varies: the fraction of the topic's words the answer mentions."""
    out = []
    for c, t in zip(completions, topic or [""] * len(completions)):
        text = (c[0]["content"] if isinstance(c, list) else c).lower()
        words = [w for w in (t or "").split() if len(w) > 3]
        out.append(sum(w in text for w in words) / max(len(words), 1))
    return out


# ------------------------------------------------------------------ measuring
class PeakRSS:
    """Peak resident memory of this process: the kernel's high-water mark (``VmHWM``), read when the block ends.

    Each measurement runs in a fresh process, so this is that library's peak
    for the whole job (model load included). No sampling thread: nothing
    competes with the measured work.
    """

    def __init__(self):
        self.peak = 0

    @staticmethod
    def high_water_mark() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.peak = self.high_water_mark()


def matmul_flops_per_s(seconds: float = 1.0, dtype=None) -> float:
    """This machine's matrix-multiply rate (FLOP/s) in ``dtype`` (float32 by default; bfloat16 for a bf16
    run's floor: on a CPU with AMX / AVX512-BF16 its products run several times faster) with torch's current
    thread count.

    The best of the shapes a SmolLM2-sized training step runs (2048 tokens x 576 -> 1536, its transpose,
    and 1024^3), so the compute floor is a floor: no step can run its FLOPs faster than this.
    """
    import torch

    from .devices import matmul_rate
    return max(matmul_rate(m, k, n, dtype or torch.float32, seconds=seconds)
               for m, k, n in ((2048, 576, 1536), (2048, 1536, 576), (1024, 1024, 1024)))


def cuda_matmul_flops_per_s(seconds: float = 1.0, dtype=None) -> float:
    """The CUDA device's matrix-multiply rate (FLOP/s) in ``dtype`` (float32 by default; bfloat16 for a bf16
    run's floor, the rate its products can reach), same shapes as :func:`matmul_flops_per_s`."""
    import torch

    dtype = dtype or torch.float32
    best = 0.0
    for m, k, n in ((2048, 576, 1536), (2048, 1536, 576), (1024, 1024, 1024)):
        a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        reps, t0 = 0, time.perf_counter()
        while reps == 0 or time.perf_counter() - t0 < seconds:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
            reps += 20
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - t0))
    return best


def pass_macs(body_params: int, head_params: int, prompt_tokens: int, prompts: int, gen_tokens: float) -> float:
    """Multiply-accumulates of one pass over a step's tokens: the transformer body sees each prompt once (shared
    prefix) and every completion token; the LM head (``head_params`` = vocab x hidden) is needed only where a
    completion token is predicted. Attention's quadratic term is small at these lengths and left out."""
    return body_params * (prompt_tokens * prompts + gen_tokens) + head_params * gen_tokens


def step_flops(body_params: int, head_params: int, prompt_tokens: int, prompts: int, gen_tokens: float) -> float:
    """Minimal FLOPs of one GRPO step (the compute floor's numerator).

    Forward = 2 FLOPs per multiply-accumulate of :func:`pass_macs`, backward = 4 more. Generation is one
    forward, training one forward + backward, so the floor is a lower bound.
    """
    return 8 * pass_macs(body_params, head_params, prompt_tokens, prompts, gen_tokens)


# AdamW's memory traffic per parameter (float32): reads weight, gradient, two moments; writes weight, two moments
ADAMW_BYTES_PER_PARAM = 7 * 4


def memory_bandwidth(mb: int = 256, seconds: float = 0.5) -> float:
    """This machine's memory bandwidth (bytes/s): the best of a large float32 copy (read + write counted) and a
    sum (read), the floor's rate for memory-bound parts (the optimiser step)."""
    import torch

    a = torch.ones(mb * 2 ** 20 // 4)
    b = torch.empty_like(a)
    best = 0.0
    for op, traffic in ((lambda: b.copy_(a), 2), (lambda: a.sum(), 1)):  # copy: read + write; sum: read
        op()
        reps, t_end = 0, time.perf_counter() + seconds / 2
        while reps < 3 or time.perf_counter() < t_end:
            t0 = time.perf_counter()
            op()
            best = max(best, traffic * a.numel() * 4 / (time.perf_counter() - t0))
            reps += 1
    return best


def step_breakdown(parts: dict, macs: float, n_params: int, rate: float, bandwidth: float) -> list[tuple]:
    """``[(part, seconds per step, floor seconds)]``: generation (rollout: sampling + scoring) against one
    forward's FLOPs, the training forward and backward against 1x and 2x that, the optimiser against AdamW's memory
    traffic over the measured bandwidth, and the rest (reference, advantages, bookkeeping) with no floor."""
    return [("generation", parts["generation"], 2 * macs / rate),
            ("training forward", parts["forward"], 2 * macs / rate),
            ("training backward", parts["backward"], 4 * macs / rate),
            ("optimiser", parts["optimizer"], ADAMW_BYTES_PER_PARAM * n_params / bandwidth),
            ("other", parts["other"], 0.0)]


# ------------------------------------------------------------------- workers
def _run_grpolab(a) -> dict:
    import torch

    from .config import Config
    from .train.trainer import Trainer

    tmp = Path(tempfile.mkdtemp(prefix="grpolab-bench-"))
    data = tmp / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in bench_prompts(64, a.prompt_words)))
    cfg = Config.build({"model": a.model, "data": str(data), "reward": ["grpolab.bench:bench_reward"],
                        "steps": a.warmup + a.steps, "prompts_per_step": a.prompts, "num_generations": a.G,
                        "max_completion_length": a.max_new, "temperature": a.temperature,
                        "learning_rate": a.lr, "micro_batch_size": a.micro_batch, "beta": 0.0,
                        "max_prompt_length": 1024, "eval_before": False, "eval_after": False,
                        "tensorboard": False, "out": str(tmp / "run"), "seed": a.seed, "threads": a.threads,
                        "sampling_method": "inverse_cdf", "device": a.device,
                        "dtype": "bfloat16" if a.precision == "bf16" else "float32",
                        **dict(kv.split("=", 1) for kv in a.grpolab_set)})
    tr = Trainer(cfg, log=lambda *x: None)
    n_params = sum(p.numel() for p in tr.model.parameters())
    head = tr.model.get_output_embeddings().weight.numel()
    tied = tr.model.get_output_embeddings().weight is tr.model.get_input_embeddings().weight
    body = n_params - (head if tied else head + tr.model.get_input_embeddings().weight.numel())
    times, tokens = [], []
    clock = {"forward": 0.0, "update": 0.0, "optimizer": 0.0}

    def timed(key, fn):
        def run(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                _sync(a.device)
                clock[key] += time.perf_counter() - t
        return run

    # the breakdown's clocks: the training forward (micro-batch loss), the whole update, the optimiser step
    tr.micro_batch_loss = timed("forward", tr.micro_batch_loss)
    tr.update = timed("update", tr.update)
    opt_t0 = [0.0]

    def before_step(*_):  # optimizer hooks must return None (a pre-hook's return value replaces the arguments)
        _sync(a.device)
        opt_t0[0] = time.perf_counter()

    def after_step(*_):
        _sync(a.device)
        clock["optimizer"] += time.perf_counter() - opt_t0[0]

    tr.optimizer.register_step_pre_hook(before_step)
    tr.optimizer.register_step_post_hook(after_step)
    parts = {"generation": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0, "other": 0.0}
    with PeakRSS() as mem:
        for i in range(a.warmup + a.steps):
            for k in clock:
                clock[k] = 0.0
            t0 = time.perf_counter()
            m = tr.train_step()
            dt = time.perf_counter() - t0
            if i >= a.warmup:
                times.append(dt)
                tokens.append(m["completion_len_mean"] * a.prompts * a.G)
                upd = clock["update"]
                for k, v in (("generation", m["rollout_s"]), ("forward", clock["forward"]),
                             ("backward", upd - clock["forward"] - clock["optimizer"]),
                             ("optimizer", clock["optimizer"]), ("other", dt - m["rollout_s"] - upd)):
                    parts[k] += v / a.steps
    enc = tr.tok.apply_chat_template(bench_prompts(1, a.prompt_words)[0]["prompt"], tokenize=True,
                                     add_generation_prompt=True)
    return {"lib": "grpolab", "step_s": times, "gen_tokens": tokens, "peak_rss": mem.peak,
            "peak_gpu": _peak_gpu(a.device),
            "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "n_params": n_params,
            "body_params": body, "head_params": head,
            "prompt_tokens": len(enc["input_ids"] if hasattr(enc, "keys") else enc),
            "threads": torch.get_num_threads(), "precision": precision_label(tr.dtype), "parts": parts}


def _peak_gpu(device: str):
    """Peak CUDA memory allocated by this process (bytes), or None on the CPU."""
    if device != "cuda":
        return None
    import torch
    return torch.cuda.max_memory_allocated()


def _sync(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def _run_trl(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from .model.loading import smollm2_path

    if a.threads:
        torch.set_num_threads(a.threads)
    path = smollm2_path() if a.model == "smollm2" else Path(a.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    ds = Dataset.from_list(bench_prompts(64, a.prompt_words))
    tmp = tempfile.mkdtemp(prefix="trl-bench-")
    accum = max(1, a.prompts * a.G // a.micro_batch)
    args = GRPOConfig(output_dir=tmp, per_device_train_batch_size=a.micro_batch, gradient_accumulation_steps=accum,
                      num_generations=a.G, max_completion_length=a.max_new, temperature=a.temperature,
                      learning_rate=a.lr, beta=0.0, loss_type="grpo", max_steps=a.warmup + a.steps,
                      use_cpu=a.device == "cpu", bf16=a.precision == "bf16", gradient_checkpointing=False,
                      use_vllm=False,
                      report_to="none", save_strategy="no", logging_steps=1, seed=a.seed,
                      disable_tqdm=True, dataloader_num_workers=0, shuffle_dataset=True)
    marks: list[float] = []
    tokens: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                tokens.append(logs["completions/mean_length"] * a.prompts * a.G)

    trainer = GRPOTrainer(model=model, reward_funcs=[bench_reward], args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[Clock()])
    start = [0.0]

    class Start(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            start[0] = time.perf_counter()

    trainer.add_callback(Start())
    with PeakRSS() as mem:
        trainer.train()
    edges = [start[0]] + marks
    steps = [edges[i + 1] - edges[i] for i in range(len(marks))]
    ran = torch.bfloat16 if trainer.args.bf16 else torch.float16 if trainer.args.fp16 else model.dtype
    return {"lib": "trl", "step_s": steps[a.warmup:], "gen_tokens": tokens[a.warmup:], "peak_rss": mem.peak,
            "peak_gpu": _peak_gpu(a.device),
            "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "threads": torch.get_num_threads(), "precision": precision_label(ran)}


def precision_label(dtype) -> str:
    """How the forward passes ran: ``float32``, or ``bfloat16 autocast`` / ``float16 autocast`` (float32
    weights, matrix products in half precision: grpolab's ``dtype`` and TRL's ``bf16`` / ``fp16`` both)."""
    name = str(dtype).replace("torch.", "")
    return name if name in ("float32", "float64") else f"{name} autocast"


def worker(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    res = _run_trl(a) if a.lib == "trl" else _run_grpolab(a)
    from .data import to_json
    print("BENCH_RESULT " + to_json(res), flush=True)
    return 0


# ------------------------------------------------------------------- driver
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpolab bench speed")
    p.add_argument("--lib", default="both", choices=["both", "grpolab", "trl", "none"],
                   help="which libraries to time ('none': only the in-process checks below)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=0, help="pad prompts with this many words of context")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (grpolab, TRL, grpolab, TRL, ...)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both libraries run")
    p.add_argument("--precision", default="float32", choices=["float32", "bf16"],
                   help="both libraries' forward precision: float32, or bf16 (bfloat16 autocast over float32 "
                        "weights: grpolab dtype bfloat16, TRL bf16=True)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scaling", action="store_true", help="also time grpolab for G in 2..16 and lengths 32..256")
    p.add_argument("--prefix-grouper", action="store_true", help="also time the shared-prefix training forward")
    p.add_argument("--engine-checks", action="store_true",
                   help="also measure the matmul rate per dtype and sampler-vs-training log-prob consistency")
    p.add_argument("--grpolab-set", nargs="*", default=[], help="extra grpolab config key=value")
    p.add_argument("--trl-heap-reuse", action="store_true",
                   help="run TRL with the glibc heap settings grpolab's cpu_heap_reuse applies on the CPU "
                        "(MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_=1 GiB), to compare the libraries, not the "
                        "allocators")
    p.add_argument("--out", default=None, help="write the markdown report here (e.g. docs/benchmarks.md)")
    return p


def trl_heap_env() -> dict[str, str]:
    """glibc's environment-variable form of :func:`grpolab.devices.reuse_freed_memory` (``--trl-heap-reuse``)."""
    from .devices import HEAP_KEEP_BYTES
    return {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(HEAP_KEEP_BYTES)}


def worker_env(a, lib: str) -> dict | None:
    """Extra environment of a library's timed process: TRL's with ``--trl-heap-reuse``, else none."""
    return trl_heap_env() if lib == "trl" and a.trl_heap_reuse else None


def _spawn(lib: str, argv: list[str], env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "grpolab.bench", "worker", "--lib", lib] + argv
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            return json.loads(line[len("BENCH_RESULT "):])
    raise RuntimeError(f"bench worker ({lib}) failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}")


def _pass_through(a, **over) -> list[str]:
    vals = {"model": a.model, "prompts": a.prompts, "G": a.G, "max-new": a.max_new, "prompt-words": a.prompt_words,
            "temperature": a.temperature, "lr": a.lr, "micro-batch": a.micro_batch, "steps": a.steps,
            "warmup": a.warmup, "threads": a.threads, "seed": a.seed, "device": a.device,
            "precision": a.precision, **over}
    argv = []
    for k, v in vals.items():
        argv += [f"--{k}", str(v)]
    if a.grpolab_set:
        argv += ["--grpolab-set", *a.grpolab_set]
    return argv


def generation_window(a) -> int:
    """grpolab's ``steps_per_generation`` from ``--grpolab-set`` (1 when not set)."""
    for kv in a.grpolab_set:
        key, _, value = kv.partition("=")
        if key.strip() == "steps_per_generation":
            return max(1, int(value))
    return 1


def _summary(runs: list[dict], window: int = 1) -> dict:
    """Per-library figures; ``window`` > 1 (steps_per_generation): only a window's first step generates, so the
    step time is the mean over the timed steps (whole windows), not the median (a step that trains only)."""
    steps = [s for r in runs for s in r["step_s"]]
    toks = [t for r in runs for t in r["gen_tokens"]]
    med = statistics.median(steps) if window == 1 else statistics.mean(steps)
    return {"median_step_s": med, "steps": len(steps), "tokens_per_step": statistics.mean(toks) if toks else None,
            "precision": ", ".join(sorted({r.get("precision", "not reported") for r in runs})),
            "gen_tok_per_s": (statistics.mean(toks) / med) if toks else None,
            "peak_rss_mb": max(r["peak_rss"] for r in runs) / 2 ** 20,
            "peak_gpu_mb": (max(r["peak_gpu"] for r in runs) / 2 ** 20
                            if all(r.get("peak_gpu") is not None for r in runs) else None)}


def dtype_matmul_rates(seconds: float = 0.5) -> dict:
    """Matmul rate (GFLOP/s) per dtype at a SmolLM2 shape (256 x 576 by 576 x 1536): the dtype choice's evidence."""
    import torch

    from .devices import matmul_rate
    return {str(dt).replace("torch.", ""): matmul_rate(256, 576, 1536, dt, seconds) / 1e9
            for dt in (torch.float32, torch.bfloat16, torch.float16)}


def logprob_consistency(model: str = "smollm2", prompts: int = 4, G: int = 8, max_new: int = 64,
                        precision: str = "float32") -> dict:
    """Behaviour log-probs recorded while sampling vs the training forward on the same tokens, on the CPU, in
    ``precision`` (``float32``, or ``bf16``: both under bfloat16 autocast over float32 weights, as a run with
    ``dtype: bfloat16``).

    Returns the mean and max absolute difference over all completion tokens,
    and the mean |ratio - 1| it would put into the first optimiser pass.
    """
    import torch

    from .devices import autocast
    from .model.loading import load_policy
    from .model.logprobs import completion_logprobs
    from .generation.plain import plain_rollout

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    rows = bench_prompts(prompts)
    m, tok = load_policy(model, task_texts=[m["content"] for r in rows for m in r["prompt"]], log=lambda *x: None)
    with autocast(torch.device("cpu"), dtype):
        b = plain_rollout(m, tok, rows, list(range(prompts)), num_generations=G, max_completion_length=max_new,
                          max_prompt_length=1024, temperature=1.0, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            lp = torch.cat([completion_logprobs(m, mb, 1.0)[0].float() * mb.completion_mask
                            for mb in b.micro_batches(8, trim=False)])
    mask = b.completion_mask > 0
    d = (lp - b.behavior_logprobs)[mask].abs()
    return {"tokens": int(mask.sum()), "mean_abs": float(d.mean()), "max_abs": float(d.max()),
            "ratio_dev": float((torch.exp(lp - b.behavior_logprobs)[mask] - 1).abs().mean())}


def prefix_grouper_timing(prompt_tokens: int = 256, completion_tokens: int = 32, G: int = 8, reps: int = 5,
                          model: str = "smollm2") -> dict:
    """Training forward + backward of one group: shared-prefix vs repeated-prompt (seconds, median of reps)."""
    import torch

    from .batch import RolloutBatch
    from .model.loading import load_policy
    from .model.logprobs import completion_logprobs

    m, tok = load_policy(model, log=lambda *x: None)
    g = torch.Generator().manual_seed(0)
    V = m.config.vocab_size
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, V, (1, prompt_tokens), generator=g).repeat(G, 1),
        prompt_mask=torch.ones(G, prompt_tokens, dtype=torch.long),
        completion_ids=torch.randint(0, V, (G, completion_tokens), generator=g),
        completion_mask=torch.ones(G, completion_tokens), behavior_logprobs=torch.zeros(G, completion_tokens),
        group_ids=torch.zeros(G, dtype=torch.long), prompt_uids=torch.zeros(G, dtype=torch.long),
        truncated=torch.zeros(G, dtype=torch.bool))
    out = {}
    for shared in (True, False):
        ts = []
        for _ in range(reps + 1):
            m.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            lp, _ = completion_logprobs(m, batch, 1.0, shared_prefix=shared)
            lp.sum().backward()
            ts.append(time.perf_counter() - t0)
        out["shared" if shared else "repeated"] = statistics.median(ts[1:])
    out["speedup"] = out["repeated"] / out["shared"]
    return out


def speed(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    libs = {"both": ["grpolab", "trl"], "none": []}.get(a.lib, [a.lib])
    window = generation_window(a)
    if window > 1 and (a.steps % window or a.warmup % window):
        print(f"grpolab bench speed: steps_per_generation={window}: --steps and --warmup must be multiples of it "
              f"(only a window's first step generates), got --steps {a.steps} --warmup {a.warmup}", file=sys.stderr)
        return 2
    if "trl" in libs:
        try:
            import trl  # noqa: F401
        except ImportError:
            print("grpolab bench speed: TRL is not installed; run `pip install 'grpolab[bench]'` "
                  "(or `make bench`, which installs it), or pass --lib grpolab", file=sys.stderr)
            return 2
    runs: dict[str, list[dict]] = {lib: [] for lib in libs}
    t_start = time.time()
    for r in range(a.rounds):
        for lib in libs:
            print(f"[bench] round {r + 1}/{a.rounds}: {lib} ...", file=sys.stderr, flush=True)
            res = _spawn(lib, _pass_through(a), env=worker_env(a, lib))
            runs[lib].append(res)
            print(f"[bench]   step times {[round(s, 2) for s in res['step_s']]} s, peak RSS "
                  f"{res['peak_rss'] / 2 ** 20:.0f} MB", file=sys.stderr, flush=True)
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)
    # the floor at the rate of the precision the products ran in
    rate_dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    rate = (cuda_matmul_flops_per_s(dtype=rate_dtype) if a.device == "cuda" else
            matmul_flops_per_s(dtype=rate_dtype))
    summ = {lib: _summary(rs, window if lib == "grpolab" else 1) for lib, rs in runs.items()}
    g = runs.get("grpolab", [None])[0]
    floor = breakdown = None
    if g is not None:
        toks = summ["grpolab"]["tokens_per_step"]
        floor = step_flops(g["body_params"], g["head_params"], g["prompt_tokens"], a.prompts, toks) / rate
        parts = {k: statistics.mean(r["parts"][k] for r in runs["grpolab"]) for k in g["parts"]}
        macs = pass_macs(g["body_params"], g["head_params"], g["prompt_tokens"], a.prompts, toks)
        breakdown = step_breakdown(parts, macs, g["n_params"], rate, memory_bandwidth())
    scaling = _scaling(a) if a.scaling else None
    pg = prefix_grouper_timing(model=a.model) if a.prefix_grouper else None
    checks = None
    if a.engine_checks:
        checks = {"dtypes": dtype_matmul_rates(),
                  "consistency": logprob_consistency(a.model, a.prompts, a.G, a.max_new, precision=a.precision)}
    report = render(a, argv, summ, rate, floor, scaling, pg, time.time() - t_start, checks, breakdown)
    print(report)
    if a.out:
        Path(a.out).write_text(report)
        print(f"[bench] report written to {a.out}", file=sys.stderr)
    return 0


def _scaling(a) -> dict:
    out = {"G": [], "length": []}
    for G in (2, 4, 8, 16):
        print(f"[bench] scaling: G={G} ...", file=sys.stderr, flush=True)
        res = _spawn("grpolab", _pass_through(a, G=G, steps=1))
        out["G"].append((G, a.max_new, _summary([res])))
    for L in (32, 64, 128, 256):
        print(f"[bench] scaling: length={L} ...", file=sys.stderr, flush=True)
        res = _spawn("grpolab", _pass_through(a, **{"max-new": L, "steps": 1}))
        out["length"].append((a.G, L, _summary([res])))
    return out


def _cuda_name() -> str:
    import torch
    return torch.cuda.get_device_name(0)


def render(a, argv, summ, rate, floor, scaling, pg, elapsed, checks=None, breakdown=None) -> str:
    """BENCHMARKS.md from a benchmark's results: how it was run, the libraries' table and ratios, then the
    sections of what was measured (step breakdown, Prefix Grouper, dtype / log-prob checks, scaling)."""
    lines = _header_lines(a, argv, rate, elapsed) + _summary_lines(a, summ, floor)
    if breakdown is not None:
        lines += _breakdown_lines(breakdown)
    if pg is not None:
        lines += _prefix_grouper_lines(pg)
    if checks is not None:
        lines += _checks_lines(a, checks)
    if scaling is not None:
        lines += _scaling_lines(scaling)
    return "\n".join(lines) + "\n"


def _header_lines(a, argv, rate, elapsed) -> list[str]:
    """The command that reproduces the benchmark, the machine and the job."""
    cmd = "grpolab bench speed " + " ".join(argv)
    trl_env = ""
    if getattr(a, "trl_heap_reuse", False):
        trl_env = f" and with {', '.join(f'{k}={v}' for k, v in trl_heap_env().items())} (grpolab's cpu_heap_reuse)"
    return ["# Benchmarks", "",
            "Measured with `grpolab bench speed` (source: `src/grpolab/bench.py`); reproduce with", "",
            f"    {cmd.strip()}", "",
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"torch threads {a.threads or 'all'}; device {a.device}"
            f"{' (' + _cuda_name() + ')' if a.device == 'cuda' else ''}; "
            f"measured {'bfloat16' if a.precision == 'bf16' else 'float32'} matmul rate "
            f"{rate / 1e9:.1f} GFLOP/s. Wall time of the whole benchmark "
            f"{elapsed / 60:.1f} min.", "",
            f"Job: model `{a.model}`, {a.prompts} prompts x G={a.G} completions, at most {a.max_new} new tokens, "
            f"temperature {a.temperature}, lr {a.lr}, micro-batch {a.micro_batch} rows (gradient accumulation to "
            f"one optimiser step per {a.prompts * a.G} completions), precision asked: {a.precision} (what each "
            f"library ran: the table), beta 0, no gradient checkpointing; TRL without vLLM{trl_env}; grpolab "
            f"samples with "
            f"`sampling_method: inverse_cdf`"
            f"{'; grpolab settings ' + ', '.join(f'`{kv}`' for kv in a.grpolab_set) if a.grpolab_set else ''}. "
            f"{a.warmup} warm-up step(s) then {a.steps} timed steps per run, "
            f"{a.rounds} alternating rounds per library (each run a fresh process).", ""]


def _summary_lines(a, summ, floor) -> list[str]:
    """The table of the libraries' runs, the grpolab / TRL ratios and grpolab's step over its compute floor."""
    lines: list[str] = []
    gpu = bool(summ) and all(s.get("peak_gpu_mb") is not None for s in summ.values())
    if summ:
        step_col = ("median step (s)" if generation_window(a) == 1 else
                    f"step (s): grpolab mean over windows of {generation_window(a)}, TRL median")
        lines += [f"| library | precision | {step_col} | generated tokens / step | generated tokens / s | "
                  "peak RSS (MB) |" + (" peak GPU memory (MB) |" if gpu else ""),
                  "|---|---|---|---|---|---|" + ("---|" if gpu else "")]
    for lib, s in summ.items():
        tps = f"{s['gen_tok_per_s']:.1f}" if s["gen_tok_per_s"] else "n/a"
        tks = f"{s['tokens_per_step']:.0f}" if s["tokens_per_step"] else "n/a"
        lines.append(f"| {lib} | {s['precision']} | {s['median_step_s']:.2f} | {tks} | {tps} | "
                     f"{s['peak_rss_mb']:.0f} |" + (f" {s['peak_gpu_mb']:.0f} |" if gpu else ""))
    lines.append("")
    if "grpolab" in summ and "trl" in summ:
        g, t = summ["grpolab"], summ["trl"]
        lines += [f"- step time grpolab / TRL: **{g['median_step_s'] / t['median_step_s']:.2f}**",
                  f"- peak memory grpolab / TRL: **{g['peak_rss_mb'] / t['peak_rss_mb']:.2f}**"]
        if gpu:
            lines.append(f"- peak GPU memory grpolab / TRL: **{g['peak_gpu_mb'] / t['peak_gpu_mb']:.2f}**")
        if g["gen_tok_per_s"] and t["gen_tok_per_s"]:
            lines.append(f"- generated tokens per second grpolab / TRL: "
                         f"**{g['gen_tok_per_s'] / t['gen_tok_per_s']:.2f}**")
    if floor is not None:
        lines.append(f"- grpolab step time over the compute floor ({floor:.2f} s = the step's FLOPs / the measured "
                     f"matmul rate): **{summ['grpolab']['median_step_s'] / floor:.1f}x**")
    lines.append("")
    return lines


def _breakdown_lines(breakdown) -> list[str]:
    """Where grpolab's step goes: each part's seconds, share and floor (:func:`step_breakdown`)."""
    total = sum(t for _, t, _ in breakdown)
    lines = ["### Where grpolab's step goes", "",
             "Mean seconds per timed step over grpolab's runs, each part against its own floor (generation "
             "and the training forward: one forward's FLOPs over the matmul rate; backward: two forwards'; "
             "optimiser: AdamW's 28 bytes per parameter over the measured memory bandwidth):", "",
             "| part | seconds / step | share | floor (s) | part / floor |", "|---|---|---|---|---|"]
    for name, t, fl in breakdown:
        ratio = f"{t / fl:.1f}x" if fl > 0 else "n/a"
        lines.append(f"| {name} | {t:.2f} | {t / max(total, 1e-12):.0%} | {fl:.2f} | {ratio} |")
    lines.append("")
    return lines


def _prefix_grouper_lines(pg) -> list[str]:
    """The shared-prefix training forward against the repeated prompt (:func:`prefix_grouper_timing`)."""
    return ["## Prefix Grouper (shared-prefix training forward)", "",
            "One group, 256-token prompt, G=8 completions of 32 tokens, forward + backward of the "
            "completion log-probs (median of 5 after a warm-up):", "",
            "| forward | seconds |", "|---|---|",
            f"| repeated prompt (plain) | {pg['repeated']:.3f} |",
            f"| shared prefix (grpolab default) | {pg['shared']:.3f} |",
            f"| speed-up | **{pg['speedup']:.2f}x** |", ""]


def _checks_lines(a, checks) -> list[str]:
    """The matmul rate per dtype and the behaviour / training log-prob agreement (:func:`dtype_matmul_rates`,
    :func:`logprob_consistency`)."""
    d, c = checks["dtypes"], checks["consistency"]
    return ["## Dtype and log-prob consistency", "",
            "Matrix-multiply rate at a SmolLM2 shape (256 x 576 by 576 x 1536), GFLOP/s:", "",
            "| " + " | ".join(d) + " |", "|" + "---|" * len(d),
            "| " + " | ".join(f"{v:.1f}" for v in d.values()) + " |", "",
            f"Behaviour log-probs recorded while sampling vs the training forward ({a.precision} on the "
            f"CPU) on the same "
            f"{c['tokens']} completion tokens ({a.prompts} prompts x G={a.G}, {a.max_new} new tokens): "
            f"mean |difference| {c['mean_abs']:.2e}, max {c['max_abs']:.2e}; mean |ratio - 1| at the first "
            f"optimiser pass {c['ratio_dev']:.2e}.", ""]


def _scaling_lines(scaling) -> list[str]:
    """grpolab's step time and generation rate over G and the completion length (:func:`_scaling`)."""
    lines = ["## Scaling (grpolab)", "", "| G | max new tokens | median step (s) | generated tokens / s |",
             "|---|---|---|---|"]
    for G, L, s in scaling["G"] + scaling["length"]:
        lines.append(f"| {G} | {L} | {s['median_step_s']:.2f} | {s['gen_tok_per_s'] or 0:.1f} |")
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return worker(argv[1:])
    if argv[:1] == ["speed"]:
        return speed(argv[1:])
    print("usage: grpolab bench speed [options]   (see --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
