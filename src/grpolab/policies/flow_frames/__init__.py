"""Policy kind ``flow_frames``: short clips of digit frames from a rectified-flow model; ``policy.py``
the policy, ``tasks.py`` the ``digit_frames`` task."""
