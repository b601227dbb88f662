"""Policy kind ``control``: an actor acting in Gymnasium / PettingZoo (MPE2) environments.

``policy.py`` runs G episodes from one seeded start state per row, so a group is G episodes of the same task
instance and GRPO's group-relative advantage needs no critic; the PPO baseline's critic is the advantage
``control_gae`` (``critic.py``). ``nets.py`` holds the actor and value networks, ``tasks.py`` the ``gym_control``
task, ``gymenvs/`` the environments grpolab defines; ``cal.py``, ``achievement_distillation.py`` and
``maddpg_update.py`` the update strategies of the control seeds (docs/control.md). Heavy imports (gymnasium,
pettingzoo, crafter) happen inside functions."""
