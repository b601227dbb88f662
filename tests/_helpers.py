"""Small helpers shared by the reward test files."""
import pytest
import torch

from grpolab.rewards.transforms import REWARD_TRANSFORMS


def tr(name, **kw):
    """Call the registered reward transform ``name``."""
    return REWARD_TRANSFORMS.get(name)(**kw)


def close(a, b, tol=1e-6):
    """Same shape and values (NaN equals NaN), compared in float64."""
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=tol, rtol=0, equal_nan=True))


#: The seeds of a learning test: ``make test`` runs seed 0, ``make test-learning`` (marker ``more_seeds``) seeds 1
#: and 2 too. Each test's margin was measured to hold on all three (its docstring has the figures).
LEARNING_SEEDS = [0, pytest.param(1, marks=pytest.mark.more_seeds), pytest.param(2, marks=pytest.mark.more_seeds)]
