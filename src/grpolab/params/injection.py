"""Config fields for rollout strategies that inject tokens (``rollout/injection.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from . import param


@dataclass
class InjectionParams:
    # shared: how a row's reference answer is written as a completion
    injection_reference_template: str = param(
        "Answer: {solution}", "reference completion for injection strategies, formatted with the row's columns "
        "(countdown: 'Answer: {solution}'; arithmetic: 'Answer: {answer}')")
    # GCPO (000-15)
    gcpo_success_threshold: float = param(1.0, "gcpo_reference: a rollout succeeds when its scalar reward >= this; "
                                               "a group with no success gets the reference answer")
    gcpo_train_reference: bool = param(True, "gcpo_reference: the injected reference tokens enter the loss")
    # DaGRPO off-policy anchors (000-17)
    dagrpo_success_threshold: float = param(1.0, "dagrpo_anchors: a rollout is a positive when its scalar reward "
                                                 ">= this; groups with no positive get anchors")
    dagrpo_num_anchors: int = param(1, "dagrpo_anchors: reference (anchor) completions added to each group "
                                       "without a positive")
    dagrpo_train_anchors: bool = param(True, "dagrpo_anchors: the anchor tokens enter the loss")
    # G2RPO-A (004-07)
    g2rpo_a_guided_rows: int = param(1, "g2rpo_a: rows of each group whose completion starts with the first "
                                        "l reference tokens (the rest are plain rollouts)")
    g2rpo_a_initial_length: int = param(8, "g2rpo_a: initial guidance length l (reference tokens revealed)")
    g2rpo_a_max_length: int = param(64, "g2rpo_a: upper bound on the guidance length l")
    g2rpo_a_window: int = param(2, "g2rpo_a: steps of reward history the current step is compared with")
    g2rpo_a_reward: str = param("", "g2rpo_a: reward function whose batch mean drives the adaptation "
                                    "('' = the combined scalar reward)")
    g2rpo_a_train_guidance: bool = param(True, "g2rpo_a: the injected guidance tokens enter the loss")
    # EditGRPO (004-11)
    editgrpo_success_threshold: float = param(1.0, "editgrpo: rollouts with scalar reward below this are failed "
                                                   "and may be edited")
    editgrpo_edit_fraction: float = param(0.5, "editgrpo: fraction of each group's failed rollouts that are edited "
                                               "(rounded up)")
    editgrpo_train_edits: bool = param(True, "editgrpo: the injected corrected sentences enter the loss")
    # ThinkTuning (004-13)
    thinktuning_teacher: str = param("self", "thinktuning: 'self' (the current behaviour policy), 'frozen' (a "
                                             "copy of the policy taken at first use) or a local model folder")
    thinktuning_success_threshold: float = param(1.0, "thinktuning: rollouts with scalar reward below this get "
                                                      "teacher feedback")
    thinktuning_fraction: float = param(0.5, "thinktuning: fraction of each group's failed rollouts that are "
                                             "guided (rounded up)")
    thinktuning_feedback_tokens: int = param(16, "thinktuning: maximum tokens of teacher feedback")
    thinktuning_use_reference: bool = param(True, "thinktuning: show the reference answer to the teacher")
    # EDGE-GRPO guided error correction (000-25)
    edge_gec_success_threshold: float = param(1.0, "edge_correction: rollouts with scalar reward below this are "
                                                   "corrected")
    edge_gec_only_all_failed: bool = param(False, "edge_correction: correct failed rollouts only in groups where "
                                                  "every rollout failed (the authors' code corrects every failed one)")
    edge_gec_train_injected: bool = param(True, "edge_correction: the injected reflection/answer tokens enter "
                                                "the loss")
