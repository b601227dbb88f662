"""Record or compare every recipe's per-step metrics on the tiny model (a refactor's safety net).

    python scripts/golden_recipes.py record OUT.json      # before a change
    python scripts/golden_recipes.py compare OUT.json     # after it: same metrics, step for step

Each recipe runs as in tests/test_training.py::test_every_recipe_trains (2 steps, 2 optimiser passes, the
tiny model on the `repeat` task or the recipe's own task). Timing and memory metrics are left out. Stand-ins
are allowed (allow_stand_ins: the recipes that need user data run on the built-in task, as the golden was
recorded), and `irpo` gets the tests' tiny local reward model.
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

SKIP = {"rollout_s", "train_s", "tokens_per_s", "peak_rss_mb", "train_seconds_total"}
RENAMED = {"frac_hinted": "rollout/frac_hinted"}  # metric names that moved (old -> new)


def run_all(only=None) -> dict:
    import grpolab.devices
    from grpolab.config import Config
    from grpolab.recipes import recipe_names, recipe_overrides
    from grpolab.train.metrics import read_metrics
    from grpolab.train.trainer import Trainer

    grpolab.devices.cpu_autocast_dtype = lambda: torch.float32
    out = {}
    for name in recipe_names():
        if only and name not in only:
            continue
        torch.set_num_threads(2)
        with tempfile.TemporaryDirectory() as tmp:
            tiny = {"model": "tiny", "task": "repeat", "steps": 2, "prompts_per_step": 4, "num_generations": 4,
                    "max_completion_length": 6, "learning_rate": 3e-3, "eval_before": False, "eval_after": False,
                    "tensorboard": False, "save_steps": 2, "micro_batch_size": 16, "out": tmp + "/run",
                    "num_iterations": 2, "allow_stand_ins": True}
            rec = recipe_overrides(name)
            args = {**rec, **tiny}
            if name == "irpo":  # IRPO needs a pointwise reward model ('rm' column): the tests' tiny local one
                sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                "tests"))
                from test_reward_models import _save_tiny_rm
                _save_tiny_rm(tmp + "/rm")
                args["reward"] = [f"rm:{tmp}/rm"]
            if "task" in rec:
                args["task"] = rec["task"]
            if "model" in rec:  # a recipe's own built-in model (asr_grpo_audio), as tests/test_training.py
                args["model"] = rec["model"]
            try:
                Trainer(Config.build(args), log=lambda *a: None).train(progress=False)
                out[name] = [{k: v for k, v in r.items() if k not in SKIP} for r in read_metrics(tmp + "/run")]
            except Exception as e:  # noqa: BLE001
                out[name] = f"error: {type(e).__name__}: {e}"
        print(name, "ok" if isinstance(out[name], list) else out[name], file=sys.stderr, flush=True)
    return out


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)
    return a == b


def main() -> int:
    mode, path = sys.argv[1], sys.argv[2]
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    got = run_all(only)
    if mode == "record":
        with open(path, "w") as f:
            json.dump(got, f, indent=1)
        return 0
    want = json.load(open(path))
    bad = 0
    for name, rows in got.items():
        before = bad
        ref = want.get(name)
        if ref is None:
            print(f"{name}: new recipe (no golden)")
            continue
        if isinstance(ref, str) or isinstance(rows, str):
            if ref != rows:
                print(f"{name}: {ref!r} -> {rows!r}")
                bad += 1
            continue
        for step, (r0, r1) in enumerate(zip(ref, rows)):
            r0 = {(RENAMED[k] if RENAMED.get(k) in r1 else k): v for k, v in r0.items()}
            diff = {k: (r0.get(k), r1.get(k)) for k in set(r0) | set(r1) if not same(r0.get(k), r1.get(k))}
            if diff:
                print(f"{name} step {step}: {diff}")
                bad = before + 1
    print(f"{len(got) - bad}/{len(got)} recipes identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
