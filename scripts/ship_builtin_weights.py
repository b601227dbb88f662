"""Build the default recipe of every built-in tiny model and ship its folder with grpolab.

    GRPOLAB_CACHE=/tmp/some_cache python scripts/ship_builtin_weights.py          # build (or reuse the cache), copy

Each built-in's path function (the one a run calls) is called with ``GRPOLAB_BUILD_BUILTINS=1``, so it finds or
builds the folder in ``$GRPOLAB_CACHE`` as a user's first run would; the folder is then copied into
``src/grpolab/model/builtin/`` (``grpolab.model.cache.SHIPPED``), and shipped folders no default names any more are
removed. Run it after changing a built-in's pre-training recipe (``tests/test_shipped_weights.py`` fails until
then: a changed recipe has a new hash, and a run would build it on first use). About 5 minutes on one core.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path


def default_builders() -> dict[str, object]:
    """``label -> path function``: the built-ins whose default recipe ships (every ``cached_build`` caller)."""
    from grpolab.policies._image import digits as D
    from grpolab.policies._image.classifier import digit_classifier_path
    from grpolab.policies.ar_image.codebook import codebook_path
    from grpolab.policies.ar_image.policy import ar_model_path
    from grpolab.policies.ddpm_planner.policy import planner_model_path
    from grpolab.policies.masked_diffusion_lm.tiny import dlm_model_path
    from grpolab.policies.speech_to_text.tiny import speech_model_path
    from grpolab.policies.speech_to_text.tiny_audio import speech_audio_model_path
    from grpolab.policies.var_image.model import var_model_path
    from grpolab.policies.vision_language.tiny import BACKBONE_TASK, vlm_model_path
    import grpolab.policies.vision_language.tasks  # noqa: F401  (registers the tasks' pre-training examples)
    from grpolab.rewards.multi_label_rm import builtin_rm_path

    out = {f"digits-{kind}": (lambda log, kind=kind: D.digits_model_path(kind, log=log)) for kind in D.KINDS}
    out.update({"digits-frames": D.frames_model_path, "digits-classifier": digit_classifier_path,
                "digits-codebook": codebook_path, "digits-ar": ar_model_path, "digits-var": var_model_path,
                "planner": planner_model_path, "speech-s2t": speech_model_path,
                "speech-s2t-audio": speech_audio_model_path, "repeat-dlm": dlm_model_path,
                "mlrm-builtin": builtin_rm_path,
                f"vlm-{BACKBONE_TASK}": lambda log: vlm_model_path(BACKBONE_TASK, log=log)})
    return out


def current_folders(log=print) -> dict[str, Path]:
    """``label -> cache folder`` of every default recipe (built where missing), shipped folders ignored."""
    os.environ["GRPOLAB_BUILD_BUILTINS"] = "1"
    try:
        return {label: Path(fn(log=log)) for label, fn in default_builders().items()}
    finally:
        os.environ.pop("GRPOLAB_BUILD_BUILTINS")


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    from grpolab.model.cache import SHIPPED, read_meta, shipped_path

    folders = current_folders()
    SHIPPED.mkdir(exist_ok=True)
    keep = {p.name for p in folders.values()}
    for old in SHIPPED.iterdir():
        if old.is_dir() and old.name not in keep:
            shutil.rmtree(old)
            print(f"removed {old.name} (no default recipe names it)")
    for label, src in folders.items():
        dst = SHIPPED / src.name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        meta = read_meta(dst)
        size = sum(f.stat().st_size for f in dst.iterdir())
        print(f"{label}: {dst.name} ({size / 1e6:.2f} MB, built in {meta['seconds']} s on {meta['cpu_kind']})")
        assert shipped_path(meta["name"], meta["recipe"]) == dst
    return 0


if __name__ == "__main__":
    sys.exit(main())
