"""Per-step rg_score time: 32 completions (prompts_per_step 4 x num_generations 8, the defaults).

    PYTHONPATH=src python scripts/bench_rg_scoring.py [call|item]   # no argument: the default mode

Run it with /work/main-style older code on PYTHONPATH for the in-process (pre-sandbox) figure (docs/safety.md).
"""
import sys, time, statistics
from grpolab.config import Config
from grpolab.tasks import get_task
import importlib.util
mode = sys.argv[1] if len(sys.argv) > 1 else None
label = mode or ("call (default)" if importlib.util.find_spec("grpolab.sandbox") else "in-process")
for name in ["chain_sum", "polynomial_multiplication", "spiral_matrix"]:
    opts = {"task": f"rg:{name}", "rg_train_size": 64, "rg_eval_size": 8}
    if mode:
        opts["rg_sandbox"] = mode
    task = get_task(f"rg:{name}", cfg=Config.build(opts))
    fn = dict((n, f) for n, f, _ in task.rewards)["rg_score"]
    rows = [task.train_rows[i // 8] for i in range(32)]
    answers = [r["answer"] if i % 2 else "12" for i, r in enumerate(rows)]
    comps = [[{"role": "assistant", "content": f"thinking...\nAnswer: {a}"}] for a in answers]
    kw = dict(prompts=[r["prompt"] for r in rows], completions=comps, rg_entry=[r["rg_entry"] for r in rows],
              rg_split=[r["rg_split"] for r in rows])
    t = time.perf_counter(); first = fn(**kw); t_first = time.perf_counter() - t
    times = []
    for _ in range(10):
        t = time.perf_counter(); v = fn(**kw); times.append(time.perf_counter() - t)
    print(f"{name:28s} mode={label}: first call {t_first*1000:.0f} ms, then median {statistics.median(times)*1000:.1f} ms "
          f"(min {min(times)*1000:.1f}) per step of 32 answers; mean score {sum(v)/len(v):.3f}")
