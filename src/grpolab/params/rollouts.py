"""Config fields for rollout strategies (``rollout/strategies.py``): hints, injected references.

In-prompt hints (``rollout/guidance.py``): Scaf-GRPO (``scaf_``), Guide (``guide_``), GHPO (``ghpo_``).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import param


@dataclass
class RolloutParams:
    # Scaf-GRPO (000-61 = 004-02)
    scaf_patience: int = param(1, "Scaf-GRPO: a prompt stagnates after this many consecutive visits whose group "
                                  "had no success (1 = the authors' code: an all-wrong group after the "
                                  "exploration phase)")
    scaf_warmup_steps: int = param(0, "Scaf-GRPO: exploration phase; no hints before this step (the authors "
                                      "use 50 of their training steps)")
    scaf_schedule: str = param("search", "Scaf-GRPO: 'search' tries tiers 1, 2, ... in the same step until one "
                                         "yields a success (the authors' code); 'escalate' tries one tier per "
                                         "visit, one tier higher after each failed visit",
                               choices=["search", "escalate"])
    scaf_hint_samples: int = param(2, "Scaf-GRPO: hinted completions sampled per stagnating prompt and tier")
    scaf_replace_num: int = param(1, "Scaf-GRPO: failed on-policy completions of a stagnating group replaced by "
                                     "successful hinted ones at the minimal tier (the authors use 1)")
    scaf_max_level: int = param(0, "Scaf-GRPO: highest hint tier used (0 = all of a row's hints)")
    scaf_success_threshold: float = param(1.0, "Scaf-GRPO: a completion succeeds when its reward >= this")
    # Guide (004-16)
    guide_success_threshold: float = param(1.0, "Guide: a completion succeeds when its reward >= this; groups "
                                                "with no success are resampled with a hint")
    guide_hint_level: int = param(0, "Guide: number of the row's hints (abstract to concrete) put in the hinted "
                                     "context (0 = all)")
    guide_keep_failed: bool = param(False, "Guide: keep the failed unguided completions next to the hinted ones "
                                           "in the group (false = the hinted group replaces them)")
    # GHPO (000-94)
    ghpo_fractions: list = param([0.25, 0.5, 0.75], "GHPO: ascending fractions of the reference solution revealed "
                                                    "at stage 1, 2, ... (lines if it has several, else characters)")
    ghpo_schedule: str = param("within_step", "GHPO: 'within_step' refines a failed prompt stage by stage in the "
                                              "same step until a completion succeeds; 'across_visits' moves one "
                                              "stage per failed visit and resets when the prompt is solved",
                               choices=["within_step", "across_visits"])
    ghpo_success_threshold: float = param(1.0, "GHPO: a completion succeeds when its reward >= this")
