"""Policy kind ``ddpm_planner``: the multi-head diffusion planner of 2-D waypoints (seed 000-55);
``policy.py`` the policy, ``tasks.py`` the ``toy_planner`` scenes and rewards."""
