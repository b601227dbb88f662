"""Decode step of the static-KV-cache sampler, eager vs torch.compile (issue 29), on SmolLM2-135M.

Two decoders continue from the same pre-filled cache (4 prompts x 8 rows = 32 rows); their steps are timed
interleaved (eager, compiled, eager, ...) so the load of a shared machine hits both alike. Prints the compile
time, the median and quartiles of each, and the load average before and after.

    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_decode_compile.py [--steps 48] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=8, help="completions per prompt (4 prompts)")
    ap.add_argument("--mode", default="layer", choices=["layer", "draw"],
                    help="layer: the compiled per-layer step; draw: also time the vocabulary-wide draw")
    args = ap.parse_args()
    from transformers import DynamicCache

    from grpolab.generation import fast_decode
    from grpolab.generation.sampling import small_batch_linears
    from grpolab.model.loading import load_policy

    print("threads", torch.get_num_threads(), "load", os.getloadavg())
    model, tok = load_policy("smollm2", log=lambda *a: None)
    texts = [f"Question {i}: what is {i * 17} plus {i * 5}? Think step by step and answer with a number only, "
             f"written at the end of your reply after the words 'the answer is'." for i in range(4)]
    enc = tok(texts, return_tensors="pt", padding=True)
    ids, mask = enc.input_ids, enc.attention_mask
    print("prompt tokens", ids.shape)
    rep = torch.arange(4).repeat_interleave(args.rows)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad(), small_batch_linears(model):
        for r in range(args.repeats):
            decs = {}
            for name in ("eager", "compiled"):
                cache = DynamicCache()
                model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, past_key_values=cache)
                decs[name] = fast_decode.StaticDecoder(model, cache, rep, mask[rep], ids.shape[1] + args.steps + 1,
                                                       compile_layers=(name == "compiled"))
            tokens = torch.randint(0, model.config.vocab_size, (args.steps, len(rep)), generator=g)
            times = {"eager": [], "compiled": []}
            cpu = {"eager": [], "compiled": []}
            p = pos[rep, -1] + 1
            for t in range(args.steps):
                for name in (("eager", "compiled") if t % 2 else ("compiled", "eager")):
                    t0, c0 = time.perf_counter(), time.process_time()
                    decs[name].step(tokens[t], p)
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
                p = p + 1
            first = times["compiled"][0]
            for name, ts in times.items():
                ts, cs = ts[2:], cpu[name][2:]  # the first steps compile / warm up
                q = statistics.quantiles(ts, n=4)
                print(f"repeat {r} {name:9s} wall: median {1e3 * statistics.median(ts):6.1f} ms, "
                      f"min {1e3 * min(ts):6.1f}, quartiles {1e3 * q[0]:6.1f} {1e3 * q[2]:6.1f}; "
                      f"CPU time: median {1e3 * statistics.median(cs):6.1f} ms, min {1e3 * min(cs):6.1f}")
            print(f"repeat {r} first compiled step {first:.1f} s; load {os.getloadavg()}")
    try:
        from torch._dynamo.utils import counters
        print("dynamo frames", dict(counters["frames"]), "recompiles", dict(counters.get("recompiles", {})))
    except Exception as e:  # noqa: BLE001
        print("no counters", e)


if __name__ == "__main__":
    main()
