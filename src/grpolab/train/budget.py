"""A run's generation and time totals, and the budgets that stop it early.

The totals count what the run really spent: every sampled token and completion
(:data:`grpolab.generation.counting.GENERATED`, read around each training step)
and the wall time of the steps. They go into metrics.jsonl each step
(``generated_tokens``, ``generated_tokens_total``, ``generated_completions_total``,
``train_seconds_total``) and into checkpoints, so a resumed run continues its
totals. ``max_generated_tokens`` / ``max_completions`` / ``max_train_seconds``
(0 = no limit) end the run after the step that spends them; ``grpolab compare
--budget`` uses them to compare methods at equal cost.

Each completion is counted once, by the process that receives it: Ray rollout
workers send their counts back with the completions
(:mod:`grpolab.distributed.ray_workers`), the ``vllm_server`` client counts the
completions it receives, and on several torch.distributed ranks each rank's
step spend is summed over the ranks (``reduce``), so every rank holds the
run's totals and stops at the same step.
"""
from __future__ import annotations

import time

from ..generation.counting import GENERATED

LIMITS = (("tokens", "max_generated_tokens", "sampled tokens"),
          ("completions", "max_completions", "sampled completions"),
          ("seconds", "max_train_seconds", "seconds of training steps"))


class Budget:
    """``reduce``: ``{name: value}`` -> ``{name: sum over the ranks}`` (a distributed run's all-reduce; one
    process: the identity)."""

    def __init__(self, cfg, reduce=None):
        self.limits = {key: float(getattr(cfg, name) or 0) for key, name, _ in LIMITS}
        self.totals = {"tokens": 0, "completions": 0, "seconds": 0.0}
        self.reduce = reduce or (lambda sums: sums)
        self._start = None

    def begin_step(self) -> None:
        self._start = (GENERATED.snapshot(), time.perf_counter())

    def end_step(self) -> dict:
        """This step's spend added to the totals; the metrics to log."""
        (c0, t0), s0 = self._start
        c1, t1 = GENERATED.snapshot()
        spent = self.reduce({"generated_tokens": t1 - t0, "generated_completions": c1 - c0})  # over the ranks
        tokens, comps = int(spent["generated_tokens"]), int(spent["generated_completions"])
        secs = time.perf_counter() - s0  # wall time: the ranks run the step side by side
        self.totals["tokens"] += tokens
        self.totals["completions"] += comps
        self.totals["seconds"] += secs
        return {"generated_tokens": tokens, "generated_tokens_total": self.totals["tokens"],
                "generated_completions_total": self.totals["completions"],
                "train_seconds_total": round(self.totals["seconds"], 3)}

    def spent(self) -> str | None:
        """Why the run stops now (the first spent budget), or None."""
        for key, name, what in LIMITS:
            limit = self.limits[key]
            if limit > 0 and self.totals[key] >= limit:
                return f"{name} reached: {self.totals[key]:g} {what} (limit {limit:g})"
        return None

    def state_dict(self) -> dict:
        return dict(self.totals)

    def load_state_dict(self, state: dict | None) -> None:
        if state:
            self.totals.update(state)
