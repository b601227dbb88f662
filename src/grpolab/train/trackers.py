"""Experiment trackers behind one interface: ``log(metrics, step)``, ``log_config(cfg)``, ``log_table(name,
columns, rows, step)``, ``close()``.

``report_to`` (a core key) chooses them: ``tensorboard`` (a core dependency, the default), ``trackio``,
``wandb`` and ``mlflow`` (optional extras: ``pip install 'grpolab[NAME]'``; config.check_report_to refuses a
missing one before any work), or ``none``. Every tracker writes under the run folder unless the user's own
environment points it elsewhere (``WANDB_DIR``/``WANDB_MODE``, ``MLFLOW_TRACKING_URI``, ``TRACKIO_DIR``);
OUT/metrics.jsonl stays the run's record whatever is chosen. Each package is imported only when chosen.
"""
from __future__ import annotations

import abc
import importlib
import os
from pathlib import Path

from ..config import TRACKER_EXTRAS, check_report_to

PROJECT = "grpolab"  # the wandb project / mlflow experiment / trackio project unless the environment names one


def numeric(metrics: dict) -> dict:
    """The plottable scalars of a metrics record (no step, no None, no booleans)."""
    return {k: v for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None}


def flat_config(cfg: dict) -> dict:
    """A config as ``{key: scalar}`` (lists and dicts as their string form), for trackers' parameter tables."""
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in cfg.items()}


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:  # config time checked it is there; a broken install still names the fix
        raise ImportError(f"report_to: '{name}' could not be imported ({e}); install it with "
                          f"`pip install 'grpolab[{TRACKER_EXTRAS[name]}]'`") from e


class Tracker(abc.ABC):
    """The interface: every tracker implements ``log``; ``log_config``, ``log_table`` (trackers without tables)
    and ``close`` default to no-ops."""
    name = ""

    @abc.abstractmethod
    def log(self, metrics: dict, step: int) -> None:
        """Record one step's metrics."""

    def log_config(self, cfg: dict) -> None:
        pass

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        pass

    def log_images(self, name: str, images, step: int) -> None:
        """Images of an image policy's step (uint8 NumPy ``[N, H, W, C]``); trackers without images skip it."""

    def close(self) -> None:
        pass


class TensorBoardTracker(Tracker):
    """Event files in OUT/tensorboard; a resumed run purges the events after its checkpoint's step."""
    name = "tensorboard"

    def __init__(self, out: Path, run_name: str, resume_step: int = 0, log=print):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=resume_step + 1)

    def log(self, metrics: dict, step: int) -> None:
        for k, v in numeric(metrics).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_images(self, name: str, images, step: int) -> None:
        self.writer.add_images(name, images, step, dataformats="NHWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A W&B run in OUT/wandb. With no ``WANDB_MODE`` and no ``WANDB_API_KEY`` in the environment it runs
    offline (no account; `wandb sync OUT/wandb/offline-run-*` uploads it later)."""
    name = "wandb"

    def __init__(self, out: Path, run_name: str, resume_step: int = 0, log=print):
        self.wandb = _import("wandb")
        mode = os.environ.get("WANDB_MODE")
        if mode is None and not os.environ.get("WANDB_API_KEY"):
            mode = "offline"
            log(f"[grpolab] wandb: no WANDB_API_KEY or WANDB_MODE set; logging offline to {out}/wandb "
                f"(upload later with `wandb sync`)")
        self.run = self.wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=run_name,
                                   dir=os.environ.get("WANDB_DIR", str(out)), mode=mode, reinit=True)

    def log_config(self, cfg: dict) -> None:
        self.run.config.update(flat_config(cfg), allow_val_change=True)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(numeric(metrics), step=step)

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        self.run.log({name: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def log_images(self, name: str, images, step: int) -> None:
        self.run.log({name: [self.wandb.Image(a[..., 0] if a.shape[-1] == 1 else a) for a in images]}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker(Tracker):
    """An MLflow run in a local store: the SQLite database OUT/mlflow.db, artifacts in OUT/mlartifacts
    (``MLFLOW_TRACKING_URI`` overrides it; MLflow 3 refuses its old ``file:`` store unless
    ``MLFLOW_ALLOW_FILE_STORE=true``); metric names keep their slashes."""
    name = "mlflow"

    def __init__(self, out: Path, run_name: str, resume_step: int = 0, log=print):
        self.mlflow = _import("mlflow")
        out = Path(out).resolve()
        self.mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{out / 'mlflow.db'}")
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        if self.mlflow.get_experiment_by_name(experiment) is None:  # artifacts beside the database, not in cwd
            self.mlflow.create_experiment(experiment, artifact_location=(out / "mlartifacts").as_uri())
        self.mlflow.set_experiment(experiment)
        self.run = self.mlflow.start_run(run_name=run_name)

    def log_config(self, cfg: dict) -> None:
        self.mlflow.log_params({k: str(v)[:6000] for k, v in flat_config(cfg).items()})

    def log(self, metrics: dict, step: int) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in numeric(metrics).items()}, step=step)

    def log_images(self, name: str, images, step: int) -> None:
        for i, a in enumerate(images):  # artifacts: OUT/mlartifacts/.../images/<name>/step<step>_<i>.png
            self.mlflow.log_image(a, artifact_file=f"images/{name}/step{step:06d}_{i}.png")

    def close(self) -> None:
        self.mlflow.end_run()


class TrackioTracker(Tracker):
    """A trackio run; its local database lives in OUT/trackio unless ``TRACKIO_DIR`` is set (trackio reads
    that variable when it is imported)."""
    name = "trackio"

    def __init__(self, out: Path, run_name: str, resume_step: int = 0, log=print):
        os.environ.setdefault("TRACKIO_DIR", str(Path(out).resolve() / "trackio"))
        self.trackio = _import("trackio")
        self.project, self.run_name, self.started = os.environ.get("TRACKIO_PROJECT", PROJECT), run_name, False

    def log_config(self, cfg: dict) -> None:
        self._start(flat_config(cfg))

    def _start(self, config: dict | None = None) -> None:
        if not self.started:  # trackio takes the config when the run starts
            self.trackio.init(project=self.project, name=self.run_name, config=config)
            self.started = True

    def log(self, metrics: dict, step: int) -> None:
        self._start()
        self.trackio.log(numeric(metrics), step=step)

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        table = getattr(self.trackio, "Table", None)
        if table is not None:  # trackio versions with tables
            import pandas as pd
            self.trackio.log({name: table(dataframe=pd.DataFrame(rows, columns=columns))}, step=step)

    def log_images(self, name: str, images, step: int) -> None:
        image = getattr(self.trackio, "Image", None)
        if image is not None:  # trackio versions with images
            self._start()
            self.trackio.log({name: [image(a[..., 0] if a.shape[-1] == 1 else a) for a in images]}, step=step)

    def close(self) -> None:
        if self.started:
            self.trackio.finish()


TRACKERS: dict[str, type[Tracker]] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker,
                                      "mlflow": MlflowTracker, "trackio": TrackioTracker}


def tracker_names(report_to, tensorboard: bool = True) -> list[str]:
    """The trackers a run reports to: ``report_to`` (list or comma string) less ``none``, and less
    ``tensorboard`` when the older ``tensorboard: false`` key says so."""
    names = [s.strip() for s in report_to.split(",")] if isinstance(report_to, str) else list(report_to)
    names = [n for n in dict.fromkeys(names) if n]
    check_report_to(names)
    return [n for n in names if n != "none" and (tensorboard or n != "tensorboard")]


def open_trackers(names: list[str], out: Path, cfg: dict | None = None, resume_step: int = 0,
                  log=print) -> list[Tracker]:
    """One started tracker per name (the run's config logged to each)."""
    out = Path(out)
    trackers = []
    for n in names:
        t = TRACKERS[n](out, out.resolve().name, resume_step=resume_step, log=log)
        if cfg is not None:
            t.log_config(cfg)
        trackers.append(t)
    return trackers
