"""Experiments and own training loops, apart from the components: the tabular theory experiments
(``theory.py``, ``scripts/theory_experiments.py``) and the Pokemon VGC baselines with their own battle loop
(``vgc.py``, ``showdown.py``, ``scripts/vgc_bench.py``). Nothing here is registered or imported by the trainer."""
