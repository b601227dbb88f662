"""GUI rewards: the rewards of the ``gui_actions`` (CRAFT-GUI, seed 000-19) and ``gui_critic`` (GUI-Critic-R1,
seed 000-121) tasks, for any policy whose completions are actions in their grammar (``click(x,y)`` / ``type(text)``).

They are defined, with their formulas and sources, in ``grpolab/policies/vision_language/tasks_gui.py`` beside the tasks (``tasks``
may not import ``rewards``: tests/test_architecture.py). Importing this module also gives the tasks' ``gui_judge``
its LM judge (:class:`grpolab.rewards.judge.JudgeReward`).
"""
from __future__ import annotations

from . import tasks_gui as vision_gui
from .tasks_gui import (GuiJudge, critic_format, critic_label, critic_suggestion, gui_action_args,
                                gui_action_type, gui_format)
from ...rewards.judge import JudgeReward

vision_gui.LM_JUDGE = JudgeReward

__all__ = ["GuiJudge", "critic_format", "critic_label", "critic_suggestion", "gui_action_args", "gui_action_type",
           "gui_format"]
