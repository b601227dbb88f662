"""Held-out team accuracy of a model on split_facts with the channel on and off (greedy, no training).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/team_probe.py --model smollm2

docs/multi-agent.md reports its output for the untrained SmolLM2-135M-Instruct.
"""
import argparse
import json
import time

from grpolab.config import Config
from grpolab.recipes import recipe_overrides
from grpolab.train.trainer import Trainer

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="smollm2")
ap.add_argument("--rows", type=int, default=40, help="held-out rows of split_facts")
ap.add_argument("--out", default="/tmp/team_probe")
args = ap.parse_args()
result = {}
for channel in ("on", "off"):
    t0 = time.time()
    cfg = Config.build({**recipe_overrides("magrpo"), "model": args.model, "steps": 1, "team_channel": channel,
                        "max_completion_length": 24, "split_facts_eval": args.rows, "seed": 0,
                        "out": f"{args.out}/{channel}"})
    res = Trainer(cfg, log=lambda *a: None)._eval("before")
    result[channel] = {"accuracy": res["accuracy"], "n": res["n"], "seconds": round(time.time() - t0, 1)}
    print(channel, result[channel], flush=True)
print(json.dumps(result))
