"""Greedy held-out evaluation of a run's starting model and of its checkpoints, with the run's own configuration
(task, task options, agent settings) and the evaluation code of the current grpolab (so metrics added since the
run, e.g. ``lenient_accuracy`` on ``search_qa``, are measured too).

    python scripts/eval_checkpoints.py RUN_DIR [STEP ...]      # STEP 0 = the model before training

Prints one JSON line per model. Writes nothing into RUN_DIR.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from grpolab.config import Config, load_yaml
from grpolab.train.checkpoint import load_checkpoint
from grpolab.train.trainer import Trainer


def main(argv: list[str]) -> None:
    run = Path(argv[0])
    steps = [int(s) for s in argv[1:]] or [0]
    saved = load_yaml(run / "config.yaml")
    # the run's configuration; the trainer gets a scratch folder of its own, so RUN_DIR is left as it is
    cfg = Config.build(saved, {"out": tempfile.mkdtemp(prefix="grpolab-eval-"), "tensorboard": False},
                       sources=[str(run / "config.yaml"), "eval_checkpoints"], lenient=True)
    trainer = Trainer(cfg, log=lambda *a: None)
    for step in steps:
        if step:
            load_checkpoint(run / "checkpoints" / f"step_{step:06d}", trainer.model)  # checks the weights fit
        res = trainer.evaluate()
        print(json.dumps({"step": step, **{k: round(v, 4) for k, v in res.items() if isinstance(v, float)},
                          "n": res["n"]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
