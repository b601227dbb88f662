"""report_to: the adapters (against fake wandb / mlflow / trackio modules, asserting the calls), the config-time
errors, the tensorboard key's compatibility; and, marked ``trackers`` (run by `make test-trackers`, which installs
the extras), each real package logging a tiny run offline into the run folder."""
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sqlite3
import sys
import types
from pathlib import Path

import pytest

from grpolab.config import Config, ConfigError
from grpolab.train.metrics import MetricsLog
from grpolab.train.trackers import TRACKERS, tracker_names
from grpolab.train.trainer import Trainer

STEPS = 2


def _dir(p):
    p.mkdir(parents=True, exist_ok=True)
    return p


def _module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec (config time) sees it as installed
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


class Calls(list):
    def fn(self, name, ret=None):
        def f(*a, **kw):
            self.append((name, a, kw))
            return ret
        return f


def fake_wandb(monkeypatch):
    calls = Calls()

    class Run:
        config = types.SimpleNamespace(update=calls.fn("config.update"))
        log = staticmethod(calls.fn("log"))
        finish = staticmethod(calls.fn("finish"))

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    mod = _module("wandb", init=calls.fn("init", Run()), Table=Table)
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return calls


def fake_mlflow(monkeypatch):
    calls = Calls()
    mod = _module("mlflow", **{n: calls.fn(n) for n in ("set_tracking_uri", "get_experiment_by_name",
                                                        "create_experiment", "set_experiment", "start_run",
                                                        "log_params", "log_metrics", "end_run")})
    monkeypatch.setitem(sys.modules, "mlflow", mod)
    return calls


def fake_trackio(monkeypatch):
    calls = Calls()
    run = types.SimpleNamespace(config={})
    mod = _module("trackio", init=calls.fn("init", run), log=calls.fn("log"), finish=calls.fn("finish"))
    monkeypatch.setitem(sys.modules, "trackio", mod)
    return calls, run


def _real(name):
    return pytest.mark.skipif(importlib.util.find_spec(name) is None,
                              reason=f"{name} is not installed: `make test-trackers` installs grpolab[trackers] "
                                     f"and runs these tests")


# ------------------------------------------------------------------ config
def test_report_to_parses_list_and_comma_string_and_keeps_tensorboard_key(tiny_args, monkeypatch):
    fake_wandb(monkeypatch)
    fake_mlflow(monkeypatch)
    assert Config.build({**tiny_args, "tensorboard": True}).report_to == ["tensorboard"]  # the default
    cfg = Config.build({**tiny_args, "report_to": "wandb, mlflow"})
    assert cfg.report_to == ["wandb", "mlflow"]
    assert tracker_names(["tensorboard", "wandb"], tensorboard=True) == ["tensorboard", "wandb"]
    assert tracker_names(["tensorboard", "wandb"], tensorboard=False) == ["wandb"]  # tensorboard: false still works
    assert tracker_names("none") == [] and tracker_names([]) == []
    with pytest.raises(ConfigError, match="'none' turns every tracker off"):
        Config.build({**tiny_args, "report_to": "none,wandb"})
    with pytest.raises(ConfigError, match="report_to: 'comet' is not valid; valid values: tensorboard, trackio"):
        Config.build({**tiny_args, "report_to": "comet"})


@pytest.mark.parametrize("name", ["wandb", "mlflow", "trackio"])
def test_missing_package_is_refused_at_config_time_naming_the_extra(tiny_args, monkeypatch, name):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))
    with pytest.raises(ConfigError, match=rf"report_to: '{name}' needs the {name} package.*pip install "
                                          rf"'grpolab\[{name}\]'"):
        Config.build({**tiny_args, "report_to": ["tensorboard", name]})


# ------------------------------------------------------------------ adapters against fake modules
def test_wandb_adapter_calls(tmp_path, monkeypatch):
    calls = fake_wandb(monkeypatch)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    said = []
    m = MetricsLog(_dir(tmp_path / "r"), ["wandb"], config={"steps": 3, "regularizers": ["a"]}, log=said.append)
    m.write({"step": 1, "loss": 0.5, "reward_mean": None, "skipped": 0, "flag": True, "rewards/a/mean": 1.0})
    m.log_table("completions", ["step", "completion"], [[1, "hi"]], step=1)
    m.close()
    init = calls[0]
    assert init[0] == "init" and init[2]["mode"] == "offline" and init[2]["dir"] == str(tmp_path / "r")
    assert init[2]["project"] == "grpolab" and init[2]["name"] == "r"
    assert "offline" in said[0]
    assert calls[1] == ("config.update", ({"steps": 3, "regularizers": "['a']"},), {"allow_val_change": True})
    assert calls[2] == ("log", ({"loss": 0.5, "skipped": 0, "rewards/a/mean": 1.0},), {"step": 1})
    name, (payload,), kw = calls[3]
    assert name == "log" and kw == {"step": 1} and payload["completions"].data == [[1, "hi"]]
    assert calls[4][0] == "finish" and len(calls) == 5
    # an account's key (or WANDB_MODE) leaves the mode to wandb
    monkeypatch.setenv("WANDB_API_KEY", "x")
    calls.clear()
    MetricsLog(_dir(tmp_path / "r2"), ["wandb"]).close()
    assert calls[0][2]["mode"] is None


def test_mlflow_adapter_calls(tmp_path, monkeypatch):
    calls = fake_mlflow(monkeypatch)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    m = MetricsLog(_dir(tmp_path / "r"), "mlflow", config={"steps": 3})
    m.write({"step": 2, "loss": 1, "kl": float("nan")})
    m.log_table("completions", ["a"], [[1]], step=2)  # no tables: nothing
    m.close()
    assert [c[0] for c in calls] == ["set_tracking_uri", "get_experiment_by_name", "create_experiment",
                                     "set_experiment", "start_run", "log_params", "log_metrics", "end_run"]
    out = (tmp_path / "r").resolve()
    assert calls[0][1] == (f"sqlite:///{out}/mlflow.db",)
    assert calls[2] == ("create_experiment", ("grpolab",), {"artifact_location": (out / "mlartifacts").as_uri()})
    assert calls[3][1] == ("grpolab",) and calls[4][2] == {"run_name": "r"}
    assert calls[5][1] == ({"steps": "3"},)
    assert calls[6] == ("log_metrics", ({"loss": 1.0},), {"step": 2})  # NaN (None in the record) left out


def test_trackio_adapter_calls(tmp_path, monkeypatch):
    calls, run = fake_trackio(monkeypatch)
    monkeypatch.setenv("TRACKIO_DIR", "")  # restored after the test (the adapter sets it)
    monkeypatch.delenv("TRACKIO_DIR")
    m = MetricsLog(_dir(tmp_path / "r"), ["trackio"], config={"seed": 0})
    m.write({"step": 3, "loss": 0.25})
    m.close()
    assert os.environ["TRACKIO_DIR"] == str((tmp_path / "r" / "trackio").resolve())
    assert calls[0] == ("init", (), {"project": "grpolab", "name": "r", "config": {"seed": 0}})
    assert calls[1] == ("log", ({"loss": 0.25},), {"step": 3}) and calls[2][0] == "finish"


def test_tensorboard_adapter_writes_events_and_none_writes_nothing(tmp_path):
    m = MetricsLog(_dir(tmp_path / "tb"), ["tensorboard"])
    m.write({"step": 1, "loss": 0.5})
    m.close()
    assert list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))
    m = MetricsLog(_dir(tmp_path / "none"), [])
    m.write({"step": 1, "loss": 0.5})
    m.close()
    assert sorted(p.name for p in (tmp_path / "none").iterdir()) == ["metrics.jsonl"]
    assert set(TRACKERS) == {"tensorboard", "wandb", "mlflow", "trackio"}


def test_tiny_run_reports_every_step_and_the_completions_table(tiny_args, monkeypatch):
    calls = fake_wandb(monkeypatch)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = Config.build({**tiny_args, "steps": 4, "report_to": "wandb", "log_completions_steps": 3})
    Trainer(cfg, log=lambda *a: None).train(progress=False)
    logs = [c for c in calls if c[0] == "log"]
    steps = [c[2]["step"] for c in logs if "loss" in c[1][0]]
    assert steps == [1, 2, 3, 4]
    tables = [c for c in logs if "completions" in c[1][0]]
    assert [t[2]["step"] for t in tables] == [1, 3, 4]  # every 3rd step, and the first and the last
    t = tables[1][1][0]["completions"]
    assert t.columns[:4] == ["step", "group", "prompt", "completion"] and "advantage" in t.columns
    assert len(t.data) == 2 * tiny_args["num_generations"]
    cfg_logged = [c for c in calls if c[0] == "config.update"][0][1][0]
    assert cfg_logged["steps"] == 4 and cfg_logged["report_to"] == "['wandb']"
    assert calls[-1][0] == "finish"


# ------------------------------------------------------------------ the real packages (make test-trackers)
def _tiny_run(tiny_args, report_to):
    cfg = Config.build({**tiny_args, "steps": STEPS, "report_to": report_to, "log_completions_steps": 1})
    Trainer(cfg, log=lambda *a: None).train(progress=False)
    return Path(cfg.out)


@pytest.mark.trackers
@_real("wandb")
def test_real_wandb_offline(tiny_args, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = _tiny_run(tiny_args, "wandb")
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    (records,) = runs[0].glob("run-*.wandb")  # the run's history (a binary record log `wandb sync` uploads)
    data = records.read_bytes()
    from grpolab.train.metrics import read_metrics
    keys = [k for k, v in read_metrics(out)[-1].items() if isinstance(v, float)]
    assert "reward_mean" in keys and any(k.startswith("rewards/") for k in keys)
    assert [k for k in keys if k.encode() not in data] == []
    tables = sorted((runs[0] / "files" / "media" / "table").glob("completions_*.table.json"))
    assert len(tables) == STEPS  # the completions table, once per step (log_completions_steps: 1)
    t = json.loads(tables[0].read_text())
    assert t["columns"][:4] == ["step", "group", "prompt", "completion"] and "advantage" in t["columns"]
    assert len(t["data"]) == 2 * tiny_args["num_generations"]


@pytest.mark.trackers
@_real("mlflow")
def test_real_mlflow_local_store(tiny_args, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = _tiny_run(tiny_args, "mlflow")
    import mlflow
    assert (out / "mlflow.db").is_file()
    client = mlflow.tracking.MlflowClient(f"sqlite:///{out.resolve()}/mlflow.db")
    exp = client.get_experiment_by_name("grpolab")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == out.name and run.info.status == "FINISHED"
    hist = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in hist) == [1, 2]
    assert run.data.params["steps"] == str(STEPS)
    assert client.get_metric_history(run.info.run_id, "rewards/repeat/mean") or \
        any(k.startswith("rewards/") for k in run.data.metrics)


@pytest.mark.trackers
@_real("trackio")
def test_real_trackio_local_db(tiny_args, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", "")  # restored after the test (the adapter sets it)
    monkeypatch.delenv("TRACKIO_DIR")
    _tiny_run(tiny_args, "trackio")
    dbs = list(Path(os.environ["TRACKIO_DIR"]).rglob("*.db"))
    assert dbs, f"no trackio database under {os.environ['TRACKIO_DIR']}"
    found = []
    for db in dbs:
        con = sqlite3.connect(db)
        tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        if "metrics" in tables:
            found += con.execute("select step, metrics from metrics").fetchall()
        con.close()
    steps = sorted({s for s, m in found if "loss" in json.loads(m)})
    assert steps == [1, 2]


def test_an_image_policy_sends_its_images_to_tensorboard(tmp_path):
    """An image policy's logged groups go to the trackers as images (TensorBoard: add_images, NHWC uint8)."""
    pytest.importorskip("diffusers")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from grpolab.recipes import recipe_overrides
    out = tmp_path / "img"
    cfg = Config.build({**recipe_overrides("flow_grpo_images"), "steps": 1, "prompts_per_step": 2,
                        "num_generations": 2, "eval_before": False, "eval_after": False, "out": str(out),
                        "report_to": ["tensorboard"]})
    Trainer(cfg, log=lambda *a: None).train(progress=False)
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"images": 0}).Reload()
    assert "samples" in acc.Tags()["images"]
    shots = acc.Images("samples")
    assert shots[0].step == 1 and shots[0].height == 8 and shots[0].width >= 8  # the batch tiled in one image
