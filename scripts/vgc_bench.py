"""VGC-Bench baselines on a local Pokémon Showdown server (grpolab.experiments.vgc; docs/control.md, VGC-Bench section).

    python scripts/vgc_bench.py matrix --battles 20      # heuristic win-rate matrix and its Nash distribution
    python scripts/vgc_bench.py train --seed 0           # the learned policy against the random player
"""
from grpolab.experiments.vgc import main

if __name__ == "__main__":
    main()
