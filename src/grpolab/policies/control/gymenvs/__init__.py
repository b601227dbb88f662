"""Gymnasium environments grpolab defines for the control methods, one module each; a module registers its ids
when imported, so a row names them ``"grpolab.policies.control.gymenvs.<module>:<Id>"`` (Gymnasium imports the module).

This package's ``__init__`` imports nothing (the component catalogue imports it at start-up; gymnasium and
crafter load only when an environment is made): ``safety`` (constrained tasks with a per-step cost in
``info["cost"]``, for CAL) and ``crafter_env`` (Crafter as a Gymnasium environment, for achievement
distillation).
"""
