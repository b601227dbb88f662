"""Policy kind ``ar_image``: autoregressive image generation over a VQ codebook (AR-GRPO); ``policy.py``
the policy, ``codebook.py`` the codebook and its fitting."""
