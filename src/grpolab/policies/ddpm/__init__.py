"""Policy kind ``ddpm``: DDPM / DDIM image generation (DDPO, DanceGRPO-style samplers); ``policy.py``."""
