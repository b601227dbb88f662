#!/usr/bin/env bash
# GRPO against PPO on the control policies (docs/control.md): two Gymnasium tasks and one PettingZoo task,
# 3 seeds each, with `grpolab compare` (held-out return of the deterministic policy every 5 steps).
# Usage: scripts/control_compare.sh [OUT]   (default runs/control_compare; about 15 minutes on 2 CPU cores)
set -euo pipefail
OUT=${1:-runs/control_compare}
G=${GRPOLAB:-.venv/bin/grpolab}
common=(--recipes grpo_control,ppo_control --seeds 0,1,2 --metric reward_mean --eval_steps 5 --threads 1)
$G compare "${common[@]}" --out "$OUT/cartpole" --control_env CartPole-v1 --steps 30
$G compare "${common[@]}" --out "$OUT/acrobot" --control_env Acrobot-v1 --steps 20
$G compare "${common[@]}" --out "$OUT/simple_spread" --control_env pettingzoo:mpe2.simple_spread_v3 \
  --control_env_kwargs '{"N": 3, "max_cycles": 25}' --max_completion_length 25 --steps 40
