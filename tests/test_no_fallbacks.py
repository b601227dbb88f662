"""No silent stand-ins. ``tests/test_training.py::test_every_recipe_trains`` trains every recipe on the tiny
model with FallbackWarning as an error; this file checks the mechanism and the recipes that need user data.

A component whose defining input is missing at run time (a column, span ids, a reference sample, ...) either
builds it, raises an error naming what is missing, or reports the stand-in through
``grpolab.errors.warn_fallback`` (category :class:`~grpolab.errors.FallbackWarning`). The trainer runs every
step under ``stand_in_policy``: a reported stand-in stops the run with a ``StandInError`` naming what is
missing, unless the user set ``allow_stand_ins: true`` (then it is a warning).
:class:`~grpolab.errors.OptionalDependencyWarning` (an optional package absent, a documented equivalent used,
e.g. math-verify) stays a visible warning.

Recipes whose method cannot get its defining input on the tiny model's built-in tasks are listed in
``NEEDS_USER_DATA`` with the reason (none today: ``dtpo``, ``dgrpo_vital`` and ``rank_grpo`` train on their own
built-in tasks). ``WITHOUT_INPUT`` runs recipes on a task that lacks their input: they must stop with the error
(and run, warning, with ``allow_stand_ins``).
"""
import warnings

import pytest

from grpolab.config import Config
from grpolab.errors import (FallbackWarning, OptionalDependencyWarning, StandInError, stand_in_policy,
                            warn_fallback)
from grpolab.recipes import recipe_overrides
from grpolab.train.trainer import Trainer

NEEDS_USER_DATA: dict[str, str] = {}  # recipe -> why no built-in task gives its input (none today)

# Recipes whose own task gives their defining input, run here on a task without it (``repeat``, plain rollout,
# the recipe's task-specific settings dropped): (what the error names, the overrides).
WITHOUT_INPUT = {
    "dgrpo_vital": ("task column", {"task": "repeat"}),
    "rank_grpo": ("span ids", {"task": "repeat", "rollout_strategy": "plain", "span_reward_columns": [""]}),
    "dtpo": ("span ids", {"task": "repeat", "rollout_strategy": "plain", "reward": [], "reward_weights": None,
                          "gold_tool_calls_template": None, "max_turns": None, "max_prompt_length": None,
                          "env_reward_weight": None, "tca_match": None, "span_reward_columns": [""]}),
}


def _without_input(recipe, tiny_args, tmp_path, **extra) -> dict:
    overrides = WITHOUT_INPUT[recipe][1]
    args = {**recipe_overrides(recipe), **tiny_args, "steps": 1, "num_iterations": 1, **overrides, **extra}
    return {k: v for k, v in args.items() if v is not None}


@pytest.mark.parametrize("recipe", sorted(WITHOUT_INPUT))
def test_recipe_without_its_input_stops_naming_it(tiny_args, recipe, tmp_path):
    """On a task that lacks their defining input (``repeat``: one task type, no ranked list, no tool episode)
    these methods stop with an error naming it and the fix; with allow_stand_ins the stand-in runs, reported as
    a FallbackWarning. Their own recipes train without stand-ins (tests/test_training.py)."""
    missing = WITHOUT_INPUT[recipe][0]
    trainer = Trainer(Config.build(_without_input(recipe, tiny_args, tmp_path)), log=lambda *a: None)
    with pytest.raises(StandInError, match=f"{missing}.*allow_stand_ins: true"):
        trainer.train_step()
    trainer.metrics.close()
    trainer = Trainer(Config.build(_without_input(recipe, tiny_args, tmp_path, allow_stand_ins=True,
                                                  out=str(tmp_path / "allowed"))), log=lambda *a: None)
    with pytest.warns(FallbackWarning, match=missing):
        m = trainer.train_step()
    trainer.metrics.close()
    assert m["loss"] is not None


def test_paraphrase_sets_sampler_and_lone_wording_is_reported():
    """The paraphrase_sets sampler draws whole sets; a set seen with one wording is a reported stand-in."""
    import torch

    from grpolab.prompts.paraphrase import ParaphraseSetSampler
    from grpolab.registry import REWARD_TRANSFORMS

    rows = [{"paraphrase_group": g} for g in "aabbcc"]
    s = ParaphraseSetSampler(6, seed=0, rows=rows)
    idx = s.next(4)
    assert len(idx) == 4 and sorted(rows[i]["paraphrase_group"] for i in idx)[::2] == \
        sorted({rows[i]["paraphrase_group"] for i in idx})  # two whole sets
    with pytest.raises(ValueError, match="paraphrase_group"):
        ParaphraseSetSampler(2, rows=[{"x": 1}, {"x": 2}])

    class B:
        columns = {"completion": ["Answer: 3", "Answer: 3"], "paraphrase_group": ["q", "q"]}
    fn = REWARD_TRANSFORMS.get("paraphrase_consistency")
    with pytest.warns(FallbackWarning, match="other paraphrases"):  # both rows are one wording (one prompt uid)
        fn(torch.zeros(2), prompt_uids=torch.tensor([7, 7]), batch=B())


def test_stand_in_policy():
    """A reported stand-in is an error naming what is missing and the fix; allowed, it is a warning; an absent
    optional package is always a warning."""
    with pytest.raises(StandInError, match="my_method: the column 'x' is missing; using 0 instead.*allow_stand_ins"):
        with stand_in_policy(False):
            warn_fallback("my_method", "the column 'x'", "0")
    with pytest.warns(FallbackWarning, match="column 'x'"):
        with stand_in_policy(True):
            warn_fallback("my_method", "the column 'x'", "0")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with stand_in_policy(False):
            warn_fallback("answers", "math-verify", "the documented comparison", category=OptionalDependencyWarning)
    assert [w.category for w in seen] == [OptionalDependencyWarning]
