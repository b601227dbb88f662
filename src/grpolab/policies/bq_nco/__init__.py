"""Policy kind ``bq_nco``: BQ-NCO, a transformer that builds TSP / CVRP tours step by step. ``policy.py``
the policy, ``model.py`` the network and tour maths, ``tasks.py`` the ``tsp`` / ``cvrp`` tasks (OR-Tools
references), ``imitation.py`` the imitation update."""
