"""Reward transforms (``REWARD_TRANSFORMS``): the combined scalar reward per row -> a shaped reward.

Signature: ``fn(rewards [R], **inputs, *, params) -> [R]`` with inputs
``lengths`` (completion tokens), ``truncated``, ``group_ids``, ``prompt_uids``,
``reward_matrix``, ``reward_names``, ``batch`` (completion texts and data
columns in ``batch.columns``), ``step`` resolved by name; keyword-only parameters come from
config keys of the same name (declared in each transform's signature with ``param()``).
Listed as ``reward_transforms: [name, ...]`` and applied in order, before advantages
(and before dynamic sampling's filter). Unscorable rows (NaN) stay NaN.

Every built-in transform is in this package (tests/test_architecture.py keeps it so), one module per family:

* ``length.py``: length and brevity (DAPO's overlong shaping, GRPO-LEAD, LC-R1, GCPO's length reward, Open-RS's
  cosine reward, the Thinkless mode reward);
* ``noise.py``: reward noise (ReDit, reward flips);
* ``partial_credit.py``: credit beyond right / wrong (FGRPR, unlikeliness, GCPO's auxiliary mask, BAPO's IDK,
  E-GRPO);
* ``judges.py``: transforms of a reward model's or judge's column (IRPO's Bradley-Terry scoring, GRPO-S, SGPO);
* ``consistency.py``: paraphrase-set consistency (PS-GRPO, information consistency);
* ``agents.py``: agent episodes and team runs (OTC, SEM, GraphRAG-R1, the CTDE joint reward, LM programs; the
  episode helpers are in ``rewards/agentic.py``);
* ``curriculum.py``: Self-Paced GRPO;
* ``common.py``: what they share (which rows are correct, the rows of each group, per-row seeds).

Importing the package imports every module, so every transform is registered; every name is importable from
``grpolab.rewards.transforms``.

"Correct" means: the reward column named ``shaping_correct_reward`` (default
``accuracy``, the built-in tasks' accuracy reward) is ``>= shaping_correct_threshold``.
This is not the shared core key ``success_threshold`` (a completion's combined
*scalar* reward ``>=`` it, which samplers and rollout strategies count): a
transform runs before the scalar reward exists (it makes it), so it tests one
reward column, 0 / 1 on the built-in tasks, at its own threshold 0.5.
Transforms that read the answer use the data column ``answer`` through
``batch.columns`` (tasks ``arithmetic`` and ``countdown`` have one).
"""
from ...registry import REWARD_TRANSFORMS
from .common import CORRECT_REWARD, CORRECT_THRESHOLD, correct_rows
from .length import (LC_EPS, LC_THINK_END, THINKLESS_SHORT_TOKEN, THINKLESS_THINK_TOKEN, control_mode,
                     cosine_length_reward, cosine_scaled_value, gcpo_length, lc_correct, lc_length,
                     lead_length_reward, overlong_penalty, thinkless_mode_reward)
from .noise import redit, reward_flip
from .partial_credit import (GCPO_AUX_PATTERN, bapo_idk, egrpo_entity, entity_match_rate, fuzzy_numeric, fuzzy_score,
                             gcpo_aux_mask, gcpo_contrastive_mask, unlikeliness)
from .judges import grpo_s_scaling, irpo_bradley_terry, sgpo_negative_credit
from .consistency import (PARAPHRASE_GROUP_COLUMN, PARAPHRASE_MODES, PARAPHRASE_SIMILARITIES, group_similarity,
                          information_consistency, paraphrase_consistency, paraphrase_sets)
from .agents import (LM_PROGRAM_FAILURE_KEY, caf_reward, ctde_costs, ctde_joint_reward, graphrag_phase,
                     graphrag_r1_phases, lm_program_failures, otc_grpo_tool_reward, otc_ppo_tool_reward,
                     otc_tool_reward, pra_reward, sem_search_reward)
from .curriculum import SelfPaced, self_paced_weights

__all__ = [
    "REWARD_TRANSFORMS", "CORRECT_REWARD", "CORRECT_THRESHOLD", "correct_rows",
    "LC_EPS", "LC_THINK_END", "THINKLESS_SHORT_TOKEN", "THINKLESS_THINK_TOKEN", "control_mode",
    "cosine_length_reward", "cosine_scaled_value", "gcpo_length", "lc_correct", "lc_length", "lead_length_reward",
    "overlong_penalty", "thinkless_mode_reward",
    "redit", "reward_flip",
    "GCPO_AUX_PATTERN", "bapo_idk", "egrpo_entity", "entity_match_rate", "fuzzy_numeric", "fuzzy_score",
    "gcpo_aux_mask", "gcpo_contrastive_mask", "unlikeliness",
    "grpo_s_scaling", "irpo_bradley_terry", "sgpo_negative_credit",
    "PARAPHRASE_GROUP_COLUMN", "PARAPHRASE_MODES", "PARAPHRASE_SIMILARITIES", "group_similarity",
    "information_consistency", "paraphrase_consistency", "paraphrase_sets",
    "LM_PROGRAM_FAILURE_KEY", "caf_reward", "ctde_costs", "ctde_joint_reward", "graphrag_phase",
    "graphrag_r1_phases", "lm_program_failures", "otc_grpo_tool_reward", "otc_ppo_tool_reward", "otc_tool_reward",
    "pra_reward", "sem_search_reward",
    "SelfPaced", "self_paced_weights",
]
