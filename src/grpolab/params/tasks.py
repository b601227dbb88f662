"""Config fields for tasks, thinking-mode control, SFT, MOTIF, PM4GRPO and judge rewards."""
from __future__ import annotations

from dataclasses import dataclass

from . import param


@dataclass
class TaskParams:
    # task arithmetic_multistep (tasks/arithmetic.py)
    arithmetic_levels: list = param([2, 3, 4], "arithmetic_multistep: operation counts to draw problems from "
                                               "(1 = the default task's a +/- b)")
    arithmetic_max_operand: int = param(30, "arithmetic_multistep: operands are 0..this (factors 2..5)")
    arithmetic_n_train: int = param(2000, "arithmetic_multistep: training problems")
    arithmetic_n_eval: int = param(200, "arithmetic_multistep: held-out problems")
    arithmetic_seed: int = param(1234, "arithmetic_multistep: seed that fixes the problems and the split")
    # tasks rg:NAME (tasks/gym.py)
    rg_train_size: int = param(1000, "rg:NAME: training rows (reasoning-gym dataset of this size, seed rg_seed)")
    rg_eval_size: int = param(200, "rg:NAME: held-out rows (seed rg_seed + rg_train_size; shared questions dropped)")
    rg_seed: int = param(1234, "rg:NAME: dataset seed of the training split")
    rg_config: dict | None = param(None, "rg:NAME: extra reasoning-gym dataset options (mapping or JSON object)")
    # grpolab sft (sft.py)
    sft_steps: int = param(50, "grpolab sft: optimiser steps")
    sft_batch_size: int = param(8, "grpolab sft: examples per step")
    sft_learning_rate: float = param(1e-4, "grpolab sft: AdamW learning rate")
    sft_max_length: int = param(512, "grpolab sft: prompt + target tokens longer than this are cut from the right")
    sft_mode: str = param("plain", "grpolab sft: target format: plain, ton (thought dropout) or thinkless "
                                   "(control tokens)", ["plain", "ton", "thinkless"])
    # TON thought dropout (000-37 = 004-09)
    ton_dropout_prob: float = param(0.5, "TON: probability that an SFT target's reasoning is replaced by the "
                                         "empty thought")
    ton_empty_thought: str = param("<think>\n\n</think>", "TON: the empty thought that replaces a dropped trace")
    # Thinkless control tokens (004-12)
    thinkless_short_token: str = param("<short>", "Thinkless: control token of the short mode")
    thinkless_think_token: str = param("<think>", "Thinkless: control token of the thinking mode")
    thinkless_gamma: float = param(0.1, "Thinkless reward: a correct <think> answer earns 1 - gamma, a correct "
                                        "<short> one 1, a wrong one -1")
    # MOTIF multi-round thinking (004-04), rollout strategy `motif`
    motif_rounds: int = param(3, "MOTIF: thinking rounds per answer (the last one gives the final answer)")
    motif_rollouts: int = param(4, "MOTIF: continuations of rounds 2..R sampled per first-round completion; "
                                   "its reward is their mean final-round reward")
    motif_progress_chars: int = param(200, "MOTIF: a round's progress handed to the next round is cut to its "
                                           "last this many characters")
    # PM4GRPO process-conformance reward (000-87), reward spec `pm4grpo`
    pm4grpo_teacher_column: str = param("solution", "PM4GRPO: data column holding the teacher's reasoning trace")
    pm4grpo_measure: str = param("f1", "PM4GRPO: conformance score: f1 (paper: harmonic mean of fitness and "
                                       "precision), fitness or precision", ["f1", "fitness", "precision"])
    pm4grpo_abstract_numbers: bool = param(False, "PM4GRPO: compare steps with every number replaced by '#' "
                                                  "(procedure, not values)")
    # judge-LM rewards, reward spec judge:PATH|self|tiny (rewards/judge.py)
    judge_question: str = param("Is the answer above correct? Answer yes or no.",
                                "judge: the yes/no question asked after the prompt and completion")
    judge_yes: str = param("yes", "judge: the word whose first token means yes")
    judge_no: str = param("no", "judge: the word whose first token means no")
    judge_batch_size: int = param(8, "judge: texts per forward pass")
    judge_max_length: int = param(1024, "judge: texts are cut to their last this many tokens")
