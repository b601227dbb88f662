"""BetterTogether for LM programs: policy-gradient updates composed with prompt optimisation (update strategy).

mmGRPO (Multi-module GRPO: Composing Policy Gradients and Prompt Optimization for Language Model Programs, Ziems
et al., 2025, arXiv:2508.04660, seed 000-23) composes its multi-module GRPO step with automatic prompt
optimisation, as dspy's ``BetterTogether`` does: a strategy string such as ``"p -> w -> p"`` alternates prompt
optimisation (``p``) and weight optimisation (``w``). Here a ``w`` is a segment of the run's training steps (the
``lm_program`` rollout and the trainer's update, mmGRPO's step) and a ``p`` is dspy's
``BootstrapFewShotWithRandomSearch``, BetterTogether's default prompt optimiser, run on the current weights: it
chooses each module's few-shot demonstrations, which the ``lm_program`` rollout then puts in front of that module's
prompts (:func:`grpolab.agents.programs.with_demos`).
"""
from __future__ import annotations

import math
import random

from ..algorithms.advantages import combine_rewards
from ..errors import ConfigError
from ..registry import ROLLOUT_STRATEGIES, UPDATE_STRATEGIES, param

STRAT_SEP = " -> "


def parse_strategy(strategy: str) -> list[str]:
    """``"p -> w -> p"`` as ``["p", "w", "p"]`` (case-insensitive, separated by ``" -> "`` as dspy's
    ``BetterTogether.STRAT_SEP``); at least one ``w`` (a training run updates the weights)."""
    steps = str(strategy).lower().split(STRAT_SEP)
    if not all(s in ("p", "w") for s in steps):
        raise ConfigError(f"better_together_strategy: a sequence of 'p' and 'w' separated by '{STRAT_SEP}', e.g. "
                          f"'p -> w -> p'; got '{strategy}'")
    if "w" not in steps:
        raise ConfigError(f"better_together_strategy: '{strategy}' has no 'w' (weight optimisation), which the "
                          f"training run is; for prompt optimisation alone add ' -> w' and set steps to the least")
    return steps


def p_times(steps: list[str], num_steps: int) -> list[tuple[int, int]]:
    """``(position in the strategy, training steps completed before it runs)`` of every ``p``: the ``k``-th ``w``
    (1-based) of ``n_w`` ends after ``floor(k * num_steps / n_w)`` steps, so a ``p`` after it runs then (a
    leading ``p``: before step 1)."""
    n_w = steps.count("w")
    out, seen_w = [], 0
    for i, s in enumerate(steps):
        if s == "w":
            seen_w += 1
        else:
            out.append((i, (seen_w * num_steps) // n_w))
    return out


def success(reward: float, failed: bool, threshold: float | None) -> bool:
    """A bootstrap run counts (dspy's BootstrapFewShot): it raised nothing, and its metric is truthy, or at least
    ``threshold`` when one is set (``metric_threshold``)."""
    if failed or math.isnan(reward):
        return False
    return reward >= threshold if threshold is not None else bool(reward)


def example_demos(calls: list[tuple[str, object, str]]) -> dict[str, dict]:
    """One demo per module from one successful run's calls ``(module, prompt, reply)``: a module called once
    gives that call; called ``n > 1`` times, with an RNG seeded by the calls' text, the last call with
    probability 1/2, else one of the first ``n - 1`` drawn uniformly (dspy's BootstrapFewShot, whose RNG is
    seeded by a hash of the demos)."""
    by_module: dict[str, list] = {}
    for module, prompt, reply in calls:
        by_module.setdefault(module, []).append({"prompt": prompt, "reply": reply})
    out = {}
    for module, demos in by_module.items():
        if len(demos) > 1:
            rng = random.Random(repr([(module, d["prompt"], d["reply"]) for d in demos]))
            out[module] = rng.choice(demos[:-1]) if rng.random() < 0.5 else demos[-1]
        else:
            out[module] = demos[0]
    return out


def candidate_demos(seed: int, traces: list[dict | None], max_demos: int) -> dict[str, list]:
    """The demos of BootstrapFewShotWithRandomSearch's candidate ``seed`` from the teacher's runs on the prompt
    training rows (``traces[i]``: row i's :func:`example_demos`, None when it did not succeed):

    * ``seed = -3``: zero-shot, no demos;
    * ``seed = -1``: the first ``max_demos`` successful rows in order;
    * ``seed >= 0``: the rows shuffled by ``random.Random(seed).shuffle``, ``size =
      random.Random(seed).randint(1, max_demos)``, the first ``size`` successful rows in that order.

    Each module's demos are those rows' demos of the module, in that order (at most one per row)."""
    if seed == -3:
        return {}
    order = list(range(len(traces)))
    size = max_demos
    if seed >= 0:
        random.Random(seed).shuffle(order)
        size = random.Random(seed).randint(1, max_demos)
    elif seed != -1:
        raise ValueError(f"candidate seed {seed}: -3, -1 or >= 0")
    chosen = [traces[i] for i in order if traces[i] is not None][:size]
    out: dict[str, list] = {}
    for t in chosen:
        for module, demo in t.items():
            out.setdefault(module, []).append(demo)
    return out


def best_candidate(scores: list[tuple[int, float]]) -> int:
    """The seed of the first candidate whose score is strictly above every earlier one (dspy keeps a later
    candidate only when it beats the best so far)."""
    best, top = scores[0]
    for seed, s in scores[1:]:
        if s > top:
            best, top = seed, s
    return best


def _check(cfg) -> None:
    p = cfg.params
    if cfg.rollout_strategy != "lm_program":
        raise ConfigError(f"update_strategy better_together: optimises the prompts of the lm_program rollout's "
                          f"modules; set rollout_strategy lm_program (got {cfg.rollout_strategy})")
    steps = parse_strategy(p.get("better_together_strategy", "p -> w -> p"))
    if cfg.steps < steps.count("w"):
        raise ConfigError(f"better_together_strategy '{p.get('better_together_strategy')}' has {steps.count('w')} "
                          f"'w' segments, more than steps={cfg.steps}; raise --steps")
    if int(p.get("better_together_max_demos", 4)) < 1:
        raise ConfigError("better_together_max_demos must be >= 1 (dspy's max_bootstrapped_demos)")
    if int(p.get("better_together_candidates", 16)) < 0:
        raise ConfigError("better_together_candidates must be >= 0 (dspy's num_candidate_programs)")
    if not 0.0 <= float(p.get("better_together_valset_ratio", 0.1)) < 1.0:
        raise ConfigError("better_together_valset_ratio must be in [0, 1) (dspy's valset_ratio)")


@UPDATE_STRATEGIES.register("better_together", check=_check, needs=("text",))
class BetterTogether:
    """BetterTogether over an LM program: ``w`` segments of mmGRPO training and ``p`` steps of few-shot prompt
    optimisation, in the order of ``better_together_strategy`` (the module docstring).

    **Schedule.** The strategy's ``n_w`` ``w`` split the run's ``steps``: the ``k``-th ends after ``floor(k *
    steps / n_w)`` steps; a ``p`` runs where it stands: a leading ``p`` before the first rollout, the others right
    after the update of the step that ends the ``w`` before them (a trailing ``p`` after the last step, so the
    final checkpoint and the held-out evaluation after training have its prompts). Every ``w`` step is the
    trainer's standard update (``num_iterations`` passes).

    **One p** (dspy's ``BetterTogether._compile_prompt_optimizer`` with ``BootstrapFewShotWithRandomSearch``):

    1. The pool, the first ``better_together_rows`` training rows (0: all), is reshuffled with the optimiser's RNG
       (``random.Random(seed)``, kept across steps and checkpoints) once per strategy position reached, ``p`` or
       ``w``, as BetterTogether shuffles its trainset before every step; then ``num_val = int(valset_ratio *
       N)``: the first ``num_val`` rows are the dev split, the others the prompt training rows (no dev row: the
       training rows are the dev split, as BootstrapFewShotWithRandomSearch's ``valset or trainset``).
    2. Bootstrap: the program, with the current demos (the teacher is the current program), runs once on every
       prompt training row; a run that raised nothing and whose reward is truthy (or ``>=
       better_together_threshold`` when set) gives one demo per module (:func:`example_demos`).
    3. Candidates ``seed = -3, -1, 0, ..., better_together_candidates - 1`` (:func:`candidate_demos`), each scored
       on the dev split: the mean reward of one run per dev row (a run that raised scores
       ``lm_program_failure_score``, as dspy's Evaluate scores its ``failure_score``); the first best is kept
       (:func:`best_candidate`), its demos replace every module's.

    Program runs of a ``p`` are greedy (temperature 0). The demos, the RNG, the pool order and every ``p``'s
    scores are checkpointed, so a resumed run shows the same prompts; metrics of a step after which a ``p`` ran:
    ``better_together/p_steps``, ``better_together/best_score``, ``better_together/zero_shot_score``,
    ``better_together/demos/<module>``, ``better_together/bootstrapped``.

    Paper: Ziems et al., 2025, "Multi-module GRPO: Composing Policy Gradients and Prompt Optimization for Language
    Model Programs", arXiv:2508.04660, seed 000-23 (BetterTogether: Soylu, Potts and Khattab, 2024,
    arXiv:2407.10930).

    Provenance: authors' code — https://github.com/stanfordnlp/dspy dspy/teleprompt/bettertogether.py
    (BetterTogether.compile / _run_strategies / _compile_prompt_optimizer: strategy " -> "-separated p / w, the
    trainset shuffled by one seeded RNG before every strategy step, valset = the first int(valset_ratio * N)),
    dspy/teleprompt/random_search.py (BootstrapFewShotWithRandomSearch.compile: seeds -3 zero-shot, -2 labeled,
    -1 unshuffled bootstrap, seed >= 0 shuffled by random.Random(seed) with random.Random(seed).randint(1,
    max_bootstrapped_demos) demos; the first strictly best on the valset kept) and dspy/teleprompt/bootstrap.py
    (BootstrapFewShot: the teacher is the student's deep copy, a trace counts when the metric is truthy or >=
    metric_threshold, one demo per predictor per example, the last of several with probability 1/2); read, not
    copied. Differences: grpolab's ``w`` is mmGRPO's GRPO training (the mmGRPO paper's composition), not
    BootstrapFinetune; the labeled-demos candidate (seed -2, LabeledFewShot) and labeled demos filling up to
    max_labeled_demos are not built (a Python program's modules have no labelled input / output fields, only the
    row's final answer); the teacher runs each row once, greedily (dspy runs it at the LM's temperature, and its
    LM cache returns the same trace for a repeated example); the one-of-several demo is drawn by an RNG seeded by
    the calls' text (dspy's by a hash of the demos); a demo is the call's own prompt and reply as a user /
    assistant pair (dspy formats the signature's fields). Test:
    tests/test_better_together.py::test_candidates_by_hand, tests/test_better_together.py::test_one_p_step_keeps_the_best_candidate.
    """

    def __init__(self, *, steps: int, seed: int, program: str, lm_program_modules: list,
                 lm_program_failure_score: float, max_completion_length: int,
                 better_together_strategy: str = param("p -> w -> p", "better_together: the schedule, p (prompt "
                                                       "optimisation) and w (a segment of the training steps) "
                                                       "separated by ' -> ', as dspy's BetterTogether"),
                 better_together_rows: int = param(0, "better_together: the first N training rows are the prompt "
                                                   "optimiser's pool (0: all), split into dev and bootstrap rows"),
                 better_together_valset_ratio: float = param(0.1, "better_together: the share of the pool used as "
                                                             "the dev split that scores the candidates (dspy's "
                                                             "valset_ratio)"),
                 better_together_max_demos: int = param(4, "better_together: bootstrapped demos per module at "
                                                        "most (dspy's max_bootstrapped_demos)"),
                 better_together_candidates: int = param(16, "better_together: random-search candidates besides "
                                                         "zero-shot and the unshuffled bootstrap (dspy's "
                                                         "num_candidate_programs)"),
                 better_together_threshold: float | None = param(None, "better_together: a bootstrap run counts "
                                                                 "when its reward is >= this; none: when it is "
                                                                 "non-zero (dspy's metric_threshold)")):
        self.steps_list = parse_strategy(better_together_strategy)
        self.times = p_times(self.steps_list, int(steps))
        self.program, self.modules = program, lm_program_modules
        self.failure_score = float(lm_program_failure_score)
        self.turn_tokens = int(max_completion_length)
        self.num_rows, self.valset_ratio = int(better_together_rows), float(better_together_valset_ratio)
        self.max_demos, self.num_candidates = int(better_together_max_demos), int(better_together_candidates)
        self.threshold = None if better_together_threshold is None else float(better_together_threshold)
        self.rng = random.Random(int(seed))
        self.demos: dict[str, list] = {}
        self.order: list[int] | None = None  # the pool's row indices, in their current shuffled order
        self.position = 0  # strategy positions reached (each shuffled the pool once)
        self.p_done = 0  # p steps run
        self.history: list[dict] = []
        self._metrics: dict = {}

    # the lm_program rollout reads the demos through this (grpolab/rollouts/lm_program.py: prompt_source)
    def lm_program_demos(self, ctx, training: bool) -> dict:
        """The modules' demos; in a training rollout, the ``p`` steps due before it run first."""
        if training:
            self._run_due(ctx, completed=ctx.step)
        return self.demos

    def __call__(self, update, batch, ctx, step: int):
        out = update(batch)
        self._run_due(ctx, completed=step + 1)
        shown, self._metrics = self._metrics, {}  # a p run by this step's rollout (a leading p) is reported too
        return {**out, **shown}

    def _run_due(self, ctx, completed: int) -> None:
        while self.p_done < len(self.times) and self.times[self.p_done][1] <= completed:
            pos = self.times[self.p_done][0]
            if self.order is None:
                n = len(ctx.rows) if self.num_rows <= 0 else min(self.num_rows, len(ctx.rows))
                self.order = list(range(n))
            while self.position <= pos:  # BetterTogether shuffles its trainset before every strategy step
                self.rng.shuffle(self.order)
                self.position += 1
            self._prompt_step(ctx, STRAT_SEP.join(self.steps_list[:pos + 1]))
            self.p_done += 1

    def run(self, ctx, rows: list[dict], demos: dict) -> list[tuple[float, bool, list]]:
        """One greedy run of the program per row with ``demos``: ``(reward, failed, [(module, prompt, reply)])``
        each (a run that raised: ``lm_program_failure_score``)."""
        if not rows:
            return []
        runs, batch = ROLLOUT_STRATEGIES.get("lm_program").greedy_runs(ctx, self.program, self.modules, rows,
                                                                      turn_tokens=self.turn_tokens, demos=demos)
        ctx.reward_errors += ctx.scorer.score(batch)
        rewards = combine_rewards(batch.rewards, ctx.scorer.weights).double().tolist()
        return [(self.failure_score if r.failure else float(x), bool(r.failure),
                 [(c.module, c.prompt, c.text) for c in r.calls]) for r, x in zip(runs, rewards)]

    def _prompt_step(self, ctx, label: str) -> None:
        pool = [ctx.rows[i] for i in self.order]
        num_val = int(self.valset_ratio * len(pool))
        val, train = pool[:num_val], pool[num_val:]
        val = val or train
        traces = [example_demos(calls) if success(r, failed, self.threshold) else None
                  for r, failed, calls in self.run(ctx, train, self.demos)]
        scores, kept = [], {}
        for seed in [-3, -1] + list(range(self.num_candidates)):
            demos = candidate_demos(seed, traces, self.max_demos)
            results = self.run(ctx, val, demos)
            score = sum(r for r, _, _ in results) / max(1, len(results))
            scores.append((seed, score))
            kept[seed] = demos
        best = best_candidate(scores)
        self.demos = kept[best]
        record = {"strategy": label, "scores": [[s, v] for s, v in scores], "best": best,
                  "bootstrapped": sum(t is not None for t in traces), "train_rows": len(train), "val_rows": len(val)}
        self.history.append(record)
        ctx.log(f"[grpolab] better_together '{label}': {record['bootstrapped']}/{len(train)} bootstrap runs "
                f"succeeded; candidates {', '.join(f'{s}: {v:.3f}' for s, v in scores)}; kept {best}")
        self._metrics = {**self._metrics, "better_together/p_steps": float(self.p_done + 1),
                         "better_together/best_score": float(dict(scores)[best]),
                         "better_together/zero_shot_score": float(dict(scores)[-3]),
                         "better_together/bootstrapped": float(record["bootstrapped"]),
                         **{f"better_together/demos/{m}": float(len(d)) for m, d in self.demos.items()}}

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"demos": self.demos, "order": self.order, "position": self.position, "p_done": self.p_done,
                "history": self.history, "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        self.demos = {m: [dict(d) for d in ds] for m, ds in state["demos"].items()}
        self.order = None if state["order"] is None else [int(i) for i in state["order"]]
        self.position, self.p_done = int(state["position"]), int(state["p_done"])
        self.history = list(state["history"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((int(version), tuple(int(x) for x in internal), gauss))
