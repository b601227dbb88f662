#!/bin/bash
# docs/science.md "Showcase": SmolLM2-135M-Instruct on `arithmetic`, the default job against the same 30 steps
# trained on the lenient reward (the last number of the reply is right) at lr 1e-5; 3 seeds per arm.
# Resumable (rerun: finished runs are kept). Output: science_runs/showcase/compare.md.
# Run from the repository root: bash scripts/science_showcase.sh  (about 25 minutes on 2 idle cores)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${SCIENCE_OUT:-$ROOT/science_runs}
mkdir -p "$OUT" && cd "$OUT"
export HF_HUB_OFFLINE=1 PYTHONPATH=${GRPOLAB_SRC:-$ROOT/src}
PY=${PY:-$ROOT/.venv/bin/python}
$PY -m grpolab compare --variant "default=--dynamic_sampling false --learning_rate 2e-5" \
  --variant "lenient=--reward grpolab.tasks.arithmetic:lenient_accuracy --reward_weights 0,0,1 --learning_rate 1e-5 --dynamic_sampling false" \
  --seeds 0,1,2 --steps 30 --eval_steps 10 --metric lenient_accuracy,accuracy --out showcase
