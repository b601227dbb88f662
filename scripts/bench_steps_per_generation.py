"""Generation time per optimiser step with steps_per_generation K = 1, 2, 4 on the benchmark job (issue 29).

The same 4 steps' prompts (4 x prompts_per_step, the sampler and token-draw streams reset to the same state for
every variant) are decoded as 4 calls of P prompts (K = 1), 2 calls of 2P (K = 2) or 1 call of 4P (K = 4), each
call exactly what the steps_per_generation collector makes (Trainer.generate of K x P prompts: sampling +
scoring). Variants run interleaved, ``--rounds`` times, in one process (the model loaded once, one untimed
warm-up call first); the load average is printed with each figure, since the machine is shared.

    .venv/bin/python scripts/bench_steps_per_generation.py --rounds 2

No training happens (the generation time does not depend on the weights' values); the job's settings are
grpolab bench speed's (SmolLM2-135M-Instruct, 4 prompts x G=8, 64 new tokens, temperature 1, inverse_cdf
sampling, float32).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--ks", type=int, nargs="*", default=[1, 2, 4])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    steps = max(a.ks)
    assert all(steps % k == 0 for k in a.ks), "every K must divide the largest"

    import torch

    from grpolab.bench import bench_prompts
    from grpolab.config import Config
    from grpolab.train.trainer import Trainer

    tmp = Path(tempfile.mkdtemp(prefix="grpolab-spg-"))
    data = tmp / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in bench_prompts(64, 0)))
    cfg = Config.build({"model": a.model, "data": str(data), "reward": ["grpolab.bench:bench_reward"],
                        "steps": steps, "prompts_per_step": a.prompts, "num_generations": a.G,
                        "max_completion_length": a.max_new, "temperature": 1.0, "beta": 0.0,
                        "max_prompt_length": 1024, "eval_before": False, "eval_after": False,
                        "tensorboard": False, "out": str(tmp / "run"), "seed": 0, "threads": a.threads,
                        "sampling_method": "inverse_cdf", "dtype": "float32"})
    t = Trainer(cfg, log=lambda *x: None)
    t.model.eval()
    t.ctx.new_step(0)
    with t.precision():
        t.generate(a.prompts)  # warm-up, untimed
    sampler0 = copy.deepcopy(t.sampler.state_dict())
    gen0 = t.generator.get_state()
    print(f"threads {torch.get_num_threads()}, {steps} optimiser steps' prompts per variant "
          f"({steps * a.prompts} prompts x G={a.G})")
    results: dict[int, list[float]] = {k: [] for k in a.ks}
    for r in range(a.rounds):
        for k in a.ks:
            t.sampler.load_state_dict(copy.deepcopy(sampler0))
            t.generator.set_state(gen0)
            load0 = os.getloadavg()[0]
            total, rows, tokens = 0.0, 0, 0
            for call in range(steps // k):
                t.ctx.new_step(call)
                t0 = time.perf_counter()
                with torch.no_grad(), t.precision():
                    batch, _ = t.generate(k * a.prompts)
                total += time.perf_counter() - t0
                rows = max(rows, batch.num_rows)
                tokens += int(batch.completion_attention_mask.sum())
            per_step = total / steps
            results[k].append(per_step)
            print(f"round {r + 1} K={k}: {steps // k} call(s) of {rows} rows, {tokens} tokens, "
                  f"generation {total:.1f} s = {per_step:.2f} s per optimiser step "
                  f"(load average {load0:.2f} -> {os.getloadavg()[0]:.2f})", flush=True)
    print("summary (generation s per optimiser step, per round):")
    for k in a.ks:
        print(f"  K={k}: " + ", ".join(f"{v:.2f}" for v in results[k])
              + "  (vs K=1: " + ", ".join(f"{v / b:.2f}" for v, b in zip(results[k], results[a.ks[0]])) + ")")


if __name__ == "__main__":
    main()
