"""Rollouts with the run's experience library in the prompt (Training-Free GRPO, seed 000-44)."""
from __future__ import annotations

from ..errors import ConfigError
from ..registry import ROLLOUT_STRATEGIES
from ..stages.training_free import (EXPERIENCE_HEADER, advantage_messages, update_messages, summary_messages,
                                    ExperienceLibrary)


def experience_source(ctx):
    """The run's component that holds the experience library (it has ``with_experiences(row) -> row``)."""
    found = [c.fn for c in ctx.components.values() if hasattr(c.fn, "with_experiences")]
    if len(found) != 1:
        raise ConfigError(f"rollout_strategy experience_prompt: needs exactly one component holding an experience "
                          f"library (update_strategy: training_free); this run has {len(found)}")
    return found[0]


def _check(cfg) -> None:
    if cfg.update_strategy != "training_free":
        raise ConfigError(f"rollout_strategy experience_prompt: the library it shows is kept by update_strategy "
                          f"training_free (got {cfg.update_strategy})")


@ROLLOUT_STRATEGIES.register("experience_prompt", check=_check, needs=("text",))
def experience_prompt(ctx, rows, uids, group_offset, budgets=None, temperatures=None):
    """G sampled completions per prompt (as ``plain``) of the prompt with the experience library appended::

        prompt'(q) = q + "\\n\\n" + header + "\\n[1] e_1\\n[2] e_2 ..."     (q unchanged while E is empty)

    appended to the last user message of a chat prompt (:meth:`ExperienceLibrary.with_experiences`). The
    library is the one the update strategy ``training_free`` keeps; held-out evaluation sees it too (greedy, the
    library as it is at evaluation time), so "before" is the plain model and "after" the model with the
    library.

    Paper: Cai et al., 2025, "Training-Free Group Relative Policy Optimization", arXiv:2510.08191, seed 000-44.

    Provenance: authors' code — https://github.com/TencentCloudADP/youtu-agent, training_free_grpo/train.py
    (branch training_free_GRPO: ``PROBLEM_WITH_EXPERIENCE_TEMPLATE`` puts the numbered experiences after the
    problem once the library is non-empty, for rollouts and for evaluation in main.py); the wording of the
    header is grpolab's. Test: tests/test_training_free.py::test_library_in_training_and_eval_prompts.
    """
    source = experience_source(ctx)
    return ctx.generate([source.with_experiences(r) for r in rows], uids, group_offset=group_offset,
                        num_generations=budgets, temperature=temperatures)


def _eval_rollout(ctx, model, rows, uids):
    source = experience_source(ctx)
    return ctx.actions.sample(model, [source.with_experiences(r) for r in rows], uids, num_generations=1,
                              temperature=0.0, evaluation=True)


def _model_texts(cfg, environment, rows) -> list[str]:
    """Text the tiny model's character tokenizer must cover: the header and the LM requests' wording."""
    lib = ExperienceLibrary(["x"])
    return [EXPERIENCE_HEADER, "\n".join(m["content"] for m in summary_messages("q", "a", 1.0, "1", 10)),
            "\n".join(m["content"] for m in advantage_messages("q", ["s"], [1.0], "1", lib, 10)),
            "\n".join(m["content"] for m in update_messages(lib, ["l"], 32, 16, 10)), "[...]"]


experience_prompt.eval_rollout = _eval_rollout
experience_prompt.model_texts = _model_texts
