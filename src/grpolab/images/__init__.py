"""Image math and models for the image policies (layer 3, beside ``model/``): per-step Gaussian log-probs of SDE
and DDIM samplers (``sde.py``), the tiny class-conditional digits models, their pre-training and cache
(``digits.py``), the digit classifier used by the image rewards (``classifier.py``) and PNG rendering
(``render.py``). No sampling loop lives here: that is the policies' (``grpolab/policies``)."""
