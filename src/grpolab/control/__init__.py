"""Control policies: environments (Gymnasium, PettingZoo / MPE2) and small networks acting in them.

The policy kind ``control`` (policies/control.py) runs G episodes from one seeded start state per row, so a group
is G episodes of the same task instance and GRPO's group-relative advantage needs no critic; the PPO baseline's
critic is the advantage ``control_gae`` (control/critic.py). ``envs.py`` builds and steps environments,
``nets.py`` holds the actor and value networks. The classical methods of the control seeds live beside them
(docs/control.md). Heavy imports (gymnasium, pettingzoo, crafter, ortools, poke-env) happen inside functions.
"""
