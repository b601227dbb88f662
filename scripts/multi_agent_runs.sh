#!/usr/bin/env bash
# The documented SmolLM2-135M-Instruct runs of docs/multi-agent.md (issue 26), 3 seeds each, through
# `grpolab compare` (one fresh process per run, resumable: run the script again to finish an interrupted one):
#   cooperative  magrpo on split_facts (scout + solver, shared reward): held-out team accuracy and each role's
#   self_play    team_self_play on propose_solve (proposer vs solver, per-role rewards)
#   training_free  GRPO vs Training-Free GRPO at the same rollouts (2 steps x 2 prompts x G 4 = 16)
# The untrained model is each run's evaluation "before" (step 0). Usage: scripts/multi_agent_runs.sh [OUT] [PART...]
set -euo pipefail
cd "$(dirname "$0")/.."
G=".venv/bin/grpolab"
OUT="${1:-runs/multi-agent}"
shift || true
PARTS="${*:-cooperative self_play training_free}"
export HF_HUB_OFFLINE=1
COMMON=(--model smollm2 --seeds 0,1,2 --prompts_per_step 2 --num_generations 4 --save_steps 1 --tensorboard false --threads 1
        --no-report)
for part in $PARTS; do
  case "$part" in
    cooperative)
      "$G" compare --variant "magrpo=--recipe magrpo" "${COMMON[@]}" --task split_facts --steps 4 \
        --max_completion_length 24 --split_facts_eval 20 --learning_rate 2e-5 \
        --metric accuracy,roles/scout/accuracy,roles/solver/accuracy --out "$OUT/cooperative" ;;
    self_play)
      "$G" compare --variant "team_self_play=--recipe team_self_play" "${COMMON[@]}" --task propose_solve --steps 4 \
        --max_completion_length 16 --propose_solve_eval 12 --learning_rate 2e-5 \
        --metric accuracy,roles/proposer/reward_mean,roles/solver/reward_mean --out "$OUT/self_play" ;;
    training_free)
      "$G" compare --variant "grpo=--recipe grpo" \
        --variant "training_free_grpo=--recipe training_free_grpo --training_free_max_new_tokens 48" \
        "${COMMON[@]}" --task arithmetic --steps 2 --max_completion_length 32 --eval_problems 10 \
        --metric accuracy --out "$OUT/training_free" ;;
    *) echo "unknown part $part (cooperative, self_play, training_free)" >&2; exit 2 ;;
  esac
done
