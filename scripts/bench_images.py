"""Step cost of each policy family's recipe on this machine against its compute floor (docs/benchmarks.md, "Image
policies" and "Other policy families"); any recipe works, the default is the image policies'.

    .venv/bin/python scripts/bench_images.py [--recipes flow_grpo_images,ddpo,ar_grpo] [--steps 6] [--threads 2]
        [--set model=PATH --set data=prompts.jsonl --set reward=./r.py:score ...]

``--set KEY=VALUE`` overrides a config key for every recipe (a YAML value: ``--set flow_steps=4``; ``reward`` takes
one spec), e.g. a user's diffusers pipeline folder instead of the built-in model.

For each recipe: a Trainer on its built-in tiny model and task (evaluation off), 2 untimed warm-up steps, then
``--steps`` timed steps; the median step time. The floor is the step's FLOPs (counted by
``torch.utils.flop_counter.FlopCounterMode`` over one whole step: sampling the group, the update's forward and
backward) over the measured float32 matrix-multiply rate (``grpolab.bench.matmul_flops_per_s``). Timings never
enter the test suite.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def measure(recipe: str, steps: int, threads: int, overrides: dict | None = None, without: tuple = ()) -> dict:
    """One recipe's median step time and step FLOPs (``without``: recipe keys left out, e.g. its ``task`` when
    ``overrides`` give ``data``)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    torch.set_num_threads(threads)
    out = tempfile.mkdtemp(prefix=f"bench_{recipe}_")
    cfg = Config.build({**{k: v for k, v in recipe_overrides(recipe).items() if k not in without}, "steps": steps + 3, "eval_before": False, "eval_after": False,
                        "save_steps": 10_000, "log_completions_steps": 0, "stall_steps": 0, "out": out,
                        **(overrides or {})})
    t = Trainer(cfg, log=lambda *a: None)
    for _ in range(2):  # warm-up (first calls allocate, pick kernels)
        t.step += 1
        t.train_step()
    times = []
    for _ in range(steps):
        t.step += 1
        t0 = time.perf_counter()
        t.train_step()
        times.append(time.perf_counter() - t0)
    t.step += 1
    with FlopCounterMode(display=False) as fc:
        t.train_step()
    params = sum(p.numel() for p in t.model.parameters())
    return {"recipe": recipe, "policy": cfg.policy, "params": params, "rows": cfg.prompts_per_step * cfg.num_generations,
            "median_step_s": statistics.median(times), "flops": fc.get_total_flops()}


def against_floor(m: dict, rate: float) -> dict:
    """``m`` (a :func:`measure`) with ``floor_s`` (its FLOPs at the matmul ``rate``) and ``over_floor`` (the median
    step over it), also written to stderr as a JSON line."""
    m["floor_s"] = m["flops"] / rate
    m["over_floor"] = m["median_step_s"] / m["floor_s"]
    print(json.dumps(m), file=sys.stderr, flush=True)
    return m


def cost_cells(m: dict) -> str:
    """The table's cells from parameters to step / floor of a measurement with its floor (:func:`against_floor`)."""
    return (f"{m['params'] / 1e6:.2f} M | {m['rows']} | {m['median_step_s']:.2f} s | {m['flops'] / 1e9:.1f} GFLOP | "
            f"{m['floor_s']:.2f} s | {m['over_floor']:.1f}x |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", default="flow_grpo_images,ddpo,ar_grpo")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every recipe (repeatable)")
    a = ap.parse_args(argv)
    import torch
    import yaml

    overrides = {}
    for item in a.set:
        key, eq, value = item.partition("=")
        if not eq:
            ap.error(f"--set {item!r}: write KEY=VALUE")
        overrides[key] = [value] if key == "reward" else yaml.safe_load(value)

    from grpolab.bench import matmul_flops_per_s
    torch.set_num_threads(a.threads)
    rate = matmul_flops_per_s()
    rows = [against_floor(measure(r, a.steps, a.threads, overrides), rate) for r in a.recipes.split(",")]
    print(f"float32 matmul rate {rate / 1e9:.1f} GFLOP/s, {a.threads} threads, {a.steps} timed steps after 2 warm-up\n")
    print("| recipe | policy | parameters | samples per step | step (median) | step FLOPs | floor | step / floor |")
    print("|---|---|---|---|---|---|---|---|")
    for m in rows:
        print(f"| `{m['recipe']}` | `{m['policy']}` | {cost_cells(m)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
