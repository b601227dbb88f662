#!/bin/bash
# docs/science.md: the seeds' headline claims at small scale (tiny model, `repeat` task), one `grpolab compare`
# each, 3 seeds per arm. Resumable: rerun and finished runs are kept. Outputs: science_runs/c*/compare.md.
# Run from the repository root: bash scripts/science_claims.sh  (about 2 CPU-hours on 2 idle cores)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${SCIENCE_OUT:-$ROOT/science_runs}
mkdir -p "$OUT" && cd "$OUT"
export HF_HUB_OFFLINE=1 PYTHONPATH=${GRPOLAB_SRC:-$ROOT/src}:$ROOT/scripts
PY=${PY:-$ROOT/.venv/bin/python}
G="$PY -m grpolab compare"
T="--model tiny --task repeat --steps 30 --max_completion_length 4 --learning_rate 3e-3 --eval_problems 40 --eval_steps 10 --tensorboard false --save_steps 10 --prompts_per_step 4"
B="$T --repeat_chars 1"   # a 0/1 reward
S="--seeds 0,1,2"
$G --variant "g16=--recipe grpo --num_generations 16" --variant "g2=--recipe two_grpo" $S $T --out c1_two_grpo > c1.log 2>&1
$G --recipes grpo,dapo $S --num_generations 8 $T --out c3_dapo > c3.log 2>&1
$G --recipes grpo,redit $S --num_generations 8 $B --out c5_redit > c5.log 2>&1
$G --variant "grpo_clean=--recipe grpo" --variant "grpo_flip20=--recipe grpo --reward_transforms reward_flip" --variant "sgrpo_flip20=--recipe s_grpo_stable --reward_transforms reward_flip" --baseline grpo_flip20 $S --num_generations 8 $B --out c4_sgrpo_noise > c4.log 2>&1
$G --recipes grpo,cppo $S --num_generations 8 $T --out c6_cppo > c6.log 2>&1
$G --recipes grpo,scaf_grpo,guide_grpo $S --num_generations 8 $T --repeat_reward all --stall_steps 0 --out c9_hints > c9.log 2>&1
$G --recipes grpo,dr_grpo $S --num_generations 8 $T --max_completion_length 12 --repeat_chars 1 --metric accuracy,len_incorrect,len_correct --out c2_dr_grpo > c2.log 2>&1
$G --recipes grpo,rewarding_unlikely $S --num_generations 8 $B --eval_pass_k 8 --metric pass@8,accuracy --out c8_unlikely > c8.log 2>&1
$G --recipes grpo,vade,prompt_gdro,srpo_history $S --num_generations 8 $T --out c10_samplers > c10.log 2>&1
$G --recipes grpo,gdpo_reward_decoupled $S --num_generations 8 $B --reward science_rewards:early_stop=1 --metric accuracy,rewards/early_stop/mean --out c7_gdpo > c7.log 2>&1
$G --variant "grpo=--recipe grpo" --variant "dapo_no_overlong=--recipe dapo --overlong_penalty_factor 0" --variant "grpo_dynamic=--recipe grpo --dynamic_sampling true --dynamic_sampling_metric accuracy --dynamic_sampling_oversample 3 --dynamic_sampling_max_rounds 10" $S --num_generations 8 $T --out c3b_dynamic > c3b.log 2>&1
$G --recipes ar_grpo,ar_dpo $S --task digits --digits_eval_noises 20 --steps 20 --threads 1 --tensorboard false --metric rewards/digit_confidence/mean,rewards/digit_correct/mean --out c11_ar_dpo > c11.log 2>&1
