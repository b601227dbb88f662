"""Small helpers shared by the reward test files."""
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
