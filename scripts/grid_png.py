"""Write a run's before/after image grids (summary.json ``image_grid``, PNG data URIs) as PNG files.

    python scripts/grid_png.py RUN_DIR PREFIX   ->  PREFIX_before.png, PREFIX_after.png

The pictures in docs/images.md were written this way from the runs whose commands the page gives."""
import base64
import json
import sys
from pathlib import Path


def main(run: str, prefix: str) -> None:
    summary = json.loads((Path(run) / "summary.json").read_text())
    for when in ("before", "after"):
        uri = (summary.get(when) or {}).get("image_grid")
        if not uri:
            sys.exit(f"{run}/summary.json has no {when}.image_grid (an image policy with eval_{when} on writes it)")
        Path(f"{prefix}_{when}.png").write_bytes(base64.b64decode(uri.split(",", 1)[1]))
        print(f"{prefix}_{when}.png")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
