"""Policy kind ``mardpg``: recurrent deterministic actors for multi-agent recommendation (MARDPG).
``policy.py`` the policy, ``model.py`` the actors and critics, ``rec_env.py`` the two-scenario recommendation
environment, ``update.py`` the update strategy."""
