"""Print the measured tables of the theory experiments (grpolab/experiments/theory.py; docs/control.md).

    python scripts/theory_experiments.py <name|all> [seed]

names: grouping, grouping_corrected, grouping_decomposed, lpo, lpo_kernel, agnostic, spanning

Same as ``python -m grpolab.experiments.theory ...`` without runpy's warning about a module that ``import grpolab``
(its component catalogue) has already loaded.
"""
import sys

from grpolab.experiments.theory import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
