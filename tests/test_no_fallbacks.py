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
``NEEDS_USER_DATA`` with the reason: on built-in data they must stop with the error (and run, warning, with
``allow_stand_ins``).
"""
import warnings

import pytest

from grpolab.config import Config
from grpolab.errors import (FallbackWarning, OptionalDependencyWarning, StandInError, stand_in_policy,
                            warn_fallback)
from grpolab.recipes import recipe_overrides
from grpolab.train.trainer import Trainer

NEEDS_USER_DATA = {
    "dgrpo_vital": "DGRPO's task factor needs multi-task data (a 'task' column); no built-in task mixes task "
                   "types, so every row is one task",
    "rank_grpo": "Rank-GRPO's rank-level ratio needs rank-item spans; no built-in task/rollout marks the items "
                 "of a ranked list, so the ratio is GSPO's sequence ratio",
    "dtpo": "DTPO's decoupled advantages need tool-call / answer spans from a tool rollout; no built-in "
            "rollout on the tiny model marks them",
}


MISSING = {"dgrpo_vital": "task column", "rank_grpo": "rank-item spans", "dtpo": "span ids"}


def _inputs(recipe: str, tmp_path) -> dict:
    """What a recipe's method needs beyond its task, built here (never a silent skip)."""
    if recipe == "irpo":  # IRPO scores completions with a pointwise reward model: a tiny local one
        from test_reward_models import _save_tiny_rm
        _save_tiny_rm(tmp_path / "rm")
        return {"reward": [f"rm:{tmp_path / 'rm'}"]}
    return {}


def _args(recipe, tiny_args, tmp_path, **extra) -> dict:
    rec = recipe_overrides(recipe)
    args = {**rec, **tiny_args, "steps": 1, "num_iterations": 1, **_inputs(recipe, tmp_path), **extra}
    if "task" in rec:  # a recipe built around its own task (countdown, paraphrased arithmetic, ...) keeps it
        args["task"] = rec["task"]
    return args


@pytest.mark.parametrize("recipe", sorted(NEEDS_USER_DATA))
def test_recipe_without_its_input_stops_naming_it(tiny_args, recipe, tmp_path):
    """On built-in data these methods lack their defining input: the step stops with an error naming it and the
    fix; with allow_stand_ins the stand-in runs, reported as a FallbackWarning."""
    trainer = Trainer(Config.build(_args(recipe, tiny_args, tmp_path)), log=lambda *a: None)
    with pytest.raises(StandInError, match=f"{MISSING[recipe]}.*allow_stand_ins: true"):
        trainer.train_step()
    trainer.metrics.close()
    trainer = Trainer(Config.build(_args(recipe, tiny_args, tmp_path, allow_stand_ins=True,
                                         out=str(tmp_path / "allowed"))), log=lambda *a: None)
    with pytest.warns(FallbackWarning, match=MISSING[recipe]):
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
