"""``flow_frames``: the rectified-flow image policy on the built-in 3-frame digits model (task ``digit_frames``)."""
from __future__ import annotations

import torch

from ...registry import POLICIES, declared_params
from .._image.flow import BUILT_IN, FlowMatchingPolicy, check_class_rows, check_image_policy

_P = declared_params(FlowMatchingPolicy)  # the same config keys as flow_matching (declared once, there)
FRAMES_BUILT_IN = (*BUILT_IN, "digit_frames")  #: names of the built-in 3-frame model


@POLICIES.register("flow_frames", check=check_image_policy)
class FlowFramesPolicy(FlowMatchingPolicy):
    """``flow_matching`` (Flow-GRPO's SDE, every parameter the same) whose built-in model is the 3-frame digits
    UNet: an 8×8 image with 3 channels, channel t = frame t of a digit moving right by one pixel a frame
    (``policies/_image/digits.py::frames_model_path``: the ``flow`` architecture with 3 input/output channels,
    pre-trained once by the same rectified-flow loop on the 1,797 digits as shifted 3-frame stacks, cached).
    ``model``: ``digit_frames`` (default), ``tiny`` or ``digits`` all name that model here; a folder holding a
    diffusers ``UNet2DModel`` loads as in ``flow_matching``. The channel count is read from the model's config
    (``in_channels``), so sampling, the per-step log-probs and the rewards' ``[8, 8, 3]`` images need nothing
    else. The completions log and the report show the three frames side by side (8×24 grey) instead of one RGB
    thumbnail.

    Provenance: grpolab's own — the flow_matching policy (Flow-GRPO's SDE, see there) with a built-in 3-frame
    toy model for Self-Paced GRPO's video setting (seed 000-36, arXiv:2511.19356).
    """

    description = "flow_matching on the built-in 3-frame digits model (8x8, frames as 3 channels)"
    default_model = "digit_frames"
    default_task = "digit_frames"  # the task a run with this policy and no --task / --data trains on

    def __init__(self, *, model: str, flow_sde: str = _P["flow_sde"], flow_noise_level: float = _P["flow_noise_level"],
                 flow_steps: int = _P["flow_steps"], flow_eval_steps: int = _P["flow_eval_steps"],
                 flow_shift: float = _P["flow_shift"], flow_same_noise_in_group: bool = _P["flow_same_noise_in_group"],
                 guidance_scale: float = _P["guidance_scale"], cfg_detach_uncond: bool = _P["cfg_detach_uncond"],
                 use_lora: bool, lora_r: int, lora_alpha: int, lora_target_modules: list):
        super().__init__(model=model, flow_sde=flow_sde, flow_noise_level=flow_noise_level, flow_steps=flow_steps,
                         flow_eval_steps=flow_eval_steps, flow_shift=flow_shift,
                         flow_same_noise_in_group=flow_same_noise_in_group, guidance_scale=guidance_scale,
                         cfg_detach_uncond=cfg_detach_uncond, use_lora=use_lora, lora_r=lora_r, lora_alpha=lora_alpha,
                         lora_target_modules=lora_target_modules)
        self.shape = (3, 8, 8)

    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``digit_frames`` / ``tiny`` / ``digits`` (the built-in 3-frame model, pre-trained on first
        use and cached) or a diffusers ``UNet2DModel`` folder (as ``flow_matching``)."""
        if self.model_name not in FRAMES_BUILT_IN:
            return super().load(cfg, rows, eval_rows, extra_texts=extra_texts, log=log)
        from .._image.digits import load_frames_model

        module = load_frames_model(log=log)
        c = module.config
        self.shape = (c.in_channels, c.sample_size, c.sample_size)
        check_class_rows(module, rows, eval_rows)
        return module.float()

    def describe(self, batch, i: int) -> dict:
        """The asked class and the frames side by side (a 1-pixel gap) as a PNG data URI."""
        from ...media import grid_png, png_data_uri
        img = batch.row_data["images"][i]
        frames = img[:, None] if img.shape[0] == 3 else img[None]  # [3, 1, H, W]: one grey image per frame
        return {"prompt": str(batch.columns["prompt"][i]), "completion": "",
                "image": png_data_uri(grid_png(torch.as_tensor(frames), rows=1, cols=len(frames), scale=4))}
