"""VGC-Bench's BC and LLM baselines (grpolab/experiments/vgc_baselines.py): the parts that need no server."""
import math

import numpy as np
import pytest
import torch

from grpolab.errors import ConfigError
from grpolab.experiments import vgc
from grpolab.experiments import vgc_baselines as vb


def test_parse_choice_strict_and_leading():
    assert vb.parse_choice(" 3\n", 5, "strict") == 2 and vb.parse_choice("3. move", 5, "strict") == -1
    assert vb.parse_choice("3. move dazzlinggleam", 5) == 2 and vb.parse_choice("7", 5) == -1
    assert vb.parse_choice("move 2", 5) == -1 and vb.parse_choice("0", 5) == -1
    with pytest.raises(ConfigError, match="strict"):
        vb.parse_choice("1", 3, "loose")


def _demo(a2):
    m = np.zeros(vgc.ACT_LEN, dtype=np.float32)
    m[[7, 8, 9, 10]] = 1
    return vb.Demo(np.ones(vgc.OBS_LEN, dtype=np.float32), m, m.copy(), 7, a2)


def test_bc_loss_hand_and_fit():
    # zero-initialised heads: uniform over the 4 legal actions of each slot, so -log p(a1) - log p(a2) = 2 log 4
    # and each head's entropy is log 4; a2 = -1 (server default for slot 2) supervises slot 1 only: log 4
    torch.manual_seed(0)
    pol = vgc.VGCPolicy(hidden=8)
    loss, st = vb.bc_loss(pol, [_demo(8)], ent_weight=0.0)
    assert math.isclose(st["neglogp"], 2 * math.log(4), rel_tol=1e-6) and math.isclose(float(loss), st["neglogp"])
    assert math.isclose(st["entropy"], 2 * math.log(4), rel_tol=1e-5)
    _, st1 = vb.bc_loss(pol, [_demo(-1)], ent_weight=0.0)
    assert math.isclose(st1["neglogp"], math.log(4), rel_tol=1e-6)
    loss_e, _ = vb.bc_loss(pol, [_demo(8)], ent_weight=0.5)
    assert math.isclose(float(loss_e), 2 * math.log(4) - 0.5 * 2 * math.log(4), rel_tol=1e-5)
    hist = vb.bc_train(pol, [_demo(8)] * 8, epochs=20, batch_size=4, lr=1e-2)
    assert hist[-1]["neglogp"] < 0.2 < hist[0]["neglogp"]
    with pytest.raises(ConfigError, match="no demonstrations"):
        vb.bc_train(pol, [])
