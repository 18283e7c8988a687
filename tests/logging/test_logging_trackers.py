"""TensorBoard events readable back; failing trackers are dropped; missing extras -> UserError;
wandb falls back to offline mode."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from danka.errors import UserError
from danka.logging import SafeTrackers, TensorBoardTracker, build_trackers
from danka.schema.sections import LoggingConfig

log = logging.getLogger("danka.test")


def _build(tmp_path, **kw):
    config = kw.pop("config", {})
    settings = LoggingConfig(**{"tensorboard": False, **kw})
    return build_trackers(tmp_path, settings, run_name="r", config=config, log=log)


def test_tensorboard_events_round_trip(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = _build(tmp_path, tensorboard=True, config={"trainer": {"lr": 1e-5}})
    assert [t.name for t in trackers] == ["tensorboard"]
    tb = trackers[0]
    assert isinstance(tb, TensorBoardTracker)
    tb.log({"reward": 0.25, "loss": 1.5, "note": "skipped"}, step=1)
    tb.log({"reward": 0.75}, step=2)
    tb.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"reward", "loss"}
    assert [(e.step, e.value) for e in acc.Scalars("reward")] == [(1, 0.25), (2, 0.75)]


class _Recorder:
    def __init__(self, name):
        self.name, self.logged, self.closed = name, [], False

    def log(self, metrics, step):
        self.logged.append((step, metrics))

    def close(self):
        self.closed = True


class _Broken(_Recorder):
    def log(self, metrics, step):
        raise ConnectionError("service down")


def test_failing_tracker_is_disabled(caplog):
    good, bad = _Recorder("good"), _Broken("bad")
    trackers = SafeTrackers([bad, good], log)
    with caplog.at_level(logging.WARNING, logger="danka.test"):
        for step in range(3):
            trackers.log({"reward": 1.0}, step)  # never raises
    assert [s for s, _ in good.logged] == [0, 1, 2]
    assert trackers.trackers == [good]
    warnings = [r for r in caplog.records if "bad" in r.getMessage()]
    assert len(warnings) == 1 and "service down" in warnings[0].getMessage()
    trackers.close()
    assert good.closed


@pytest.mark.parametrize(
    "key,module,extra",
    [("wandb_project", "wandb", "danka[wandb]"), ("mlflow_experiment", "mlflow", "danka[mlflow]")],
)
def test_missing_extra_is_user_error(tmp_path, monkeypatch, key, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import <module>` raise ImportError
    with pytest.raises(UserError) as err:
        _build(tmp_path, tensorboard=True, **{key: "proj"})
    assert f"pip install {extra}" in str(err.value) and key in str(err.value)
    assert not (tmp_path / "tensorboard").exists()  # checked before anything started


def test_wandb_null_disables_wandb(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert _build(tmp_path, wandb_project=None) == []


def test_wandb_unreachable_falls_back_to_offline(tmp_path, monkeypatch, caplog):
    calls = []

    class Run:
        def __init__(self):
            self.logged = []

        def log(self, metrics, step):
            self.logged.append((step, metrics))

        def finish(self):
            pass

    def init(**kwargs):
        calls.append(kwargs)
        if kwargs.get("mode") != "offline":
            raise TimeoutError("api.wandb.ai unreachable")
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    with caplog.at_level(logging.WARNING, logger="danka.test"):
        (tracker,) = _build(tmp_path, wandb_project="p", config={"a": 1})
    assert [c.get("mode") for c in calls] == [None, "offline"]
    assert calls[1]["project"] == "p" and calls[1]["config"] == {"a": 1}
    assert "offline" in caplog.text
    tracker.log({"reward": 0.5, "text": "dropped"}, step=4)
    assert tracker.run.logged == [(4, {"reward": 0.5})]
