"""Reading a finished or running run folder: ``grpolab doctor`` (failure patterns) and ``grpolab report`` (HTML).

Top layer (next to ``cli``): it only reads the files a run writes (``metrics.jsonl``, ``summary.json``,
``config.yaml``, ``completions.jsonl``); it never imports the trainer.
"""
