"""The multi-head diffusion planner with an LLM choosing the strategy head vs fixed heads (seed 000-55).

    python scripts/planner_strategy_eval.py [--model planner|OUT/final] [--selector smollm2|tiny|PATH]
                                            [--scenes 8] [--seed 0]

For each held-out toy_planner scene (drawn as the task's held-out scenes with --seed) and each built-in
instruction (policies/ddpm_planner/selector.py: INSTRUCTIONS, three asking for the fast head, three for the safe
one), the planner's deterministic evaluation trajectory (eta = 0, the scene's noise seed) under the head the LLM
chose, under each fixed head and under the instruction's own head (oracle), scored with the instruction's strategy
reward. Prints one JSON object (selection accuracy, mean rewards, the LLM's choices).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="planner", help="'planner' (built in) or a folder a ddpm_planner run saved")
    ap.add_argument("--selector", default="smollm2", help="'smollm2', 'tiny' or a local causal-LM folder")
    ap.add_argument("--scenes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from grpolab.config import Config
    from grpolab.policies import POLICIES
    from grpolab.policies.ddpm_planner.selector import StrategySelector, evaluate_selection
    from grpolab.policies.ddpm_planner.tasks import toy_planner

    task = toy_planner(n_scenes=1, seed=a.seed, n_eval_scenes=a.scenes)
    cfg = Config.build({"policy": "ddpm_planner", "model": a.model, "task": "toy_planner"})
    policy = POLICIES.get("ddpm_planner")(model=a.model)
    module = policy.load(cfg, task.train_rows, task.eval_rows, log=lambda *x: print(*x, file=sys.stderr))
    rows = [r for r in task.eval_rows if r["head"] == 0]
    selector = StrategySelector.load(a.selector)
    t0 = time.perf_counter()
    out = evaluate_selection(policy, module, rows, lambda q: selector.choose(q)[0])
    out.update(model=a.model, selector=a.selector, scenes=len(rows), seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
