"""Shared code of the image policies (not a kind: no policy is registered here). ``flow.py`` is the
rectified-flow policy class that flow_matching, ddpm, flow_dsm, flow_frames and var_image build on (packing images
as steps, noise per row, the built-in class-conditional model); ``sde.py`` the per-step Gaussian log-probs of SDE
and DDIM samplers; ``digits.py`` the tiny class-conditional digits models and their pre-training; ``classifier.py``
the digit classifier the image rewards use; ``tasks.py`` / ``rewards.py`` the ``digits*`` tasks and their rewards;
``vipo.py`` / ``vipo_maps.py`` VIPO's per-pixel weighting and its batch stage."""
from __future__ import annotations

from ...registry import declare_capability

declare_capability("gaussian_steps", "each step is a Gaussian transition with a known mean and std "
                   "(SDE / DDIM denoising steps): per-step means, the Gaussian mean KL, which "
                   "denoising steps train")
declare_capability("flow_matching", "a rectified-flow model: the sigma schedule and the predicted "
                   "velocity")
declare_capability("images", "actions decode to images (row_data['images']): image rewards and "
                   "tasks, image grids")
