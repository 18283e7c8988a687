"""The Python API: ``danka.train`` from a path, a dict or a typed ``danka.Config``, the
result it returns, and the callbacks at step, evaluation and checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import danka
from danka.errors import UserError
from danka.logging.runlog import close_run_logger
from tests.trainer.conftest import make_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from danka.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


class Recorder(danka.Callback):
    def __init__(self):
        self.events = []

    def on_step(self, step, metrics):
        self.events.append(("step", step, round(metrics["reward"], 6)))

    def on_eval(self, step, result):
        self.events.append(("eval", step, result["eval/n"]))

    def on_checkpoint(self, step, path):
        self.events.append(("checkpoint", step, path))


def _dict_config(tmp_path, model_dir):
    cfg = yaml.safe_load(make_config(tmp_path, model_dir).read_text())
    cfg["data"]["train_dataset"] = str(tmp_path / "rows.jsonl")
    cfg["data"]["eval_size"] = 4
    cfg["reward"]["functions"][0]["name"] = f"{tmp_path / 'reward.py'}:reward"
    cfg["trainer"]["save_steps"] = 1
    return cfg


def test_import_danka_stays_light():
    code = "import sys, danka; print('torch' in sys.modules, danka.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, check=True)  # fmt: skip
    assert out.stdout.split()[0] == "False"


def test_train_from_a_dict_returns_the_result_and_calls_back(tmp_path, model_dir):
    rec = Recorder()
    try:
        result = danka.train(_dict_config(tmp_path, model_dir), callbacks=[rec], plot=False)
    finally:
        close_run_logger()
    out = tmp_path / "out"
    assert isinstance(result, danka.TrainResult)
    assert result.output_dir == out and result.steps == 2 and result.n == 4
    assert 0.0 <= result.before <= 1.0 and 0.0 <= result.after <= 1.0
    assert result.checkpoint == out / "actor" / "checkpoint_2"
    kinds = [(e[0], e[1]) for e in rec.events]
    assert kinds == [
        ("eval", 0), ("step", 1), ("checkpoint", 1), ("step", 2), ("eval", 2), ("checkpoint", 2),
    ]  # fmt: skip
    assert rec.events[2][2] == out / "actor" / "checkpoint_1"
    assert (rec.events[2][2] / "adapter_config.json").is_file()  # complete when called
    # the rewards the callback saw are the ones metrics.jsonl has
    import json

    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e[2] for e in rec.events if e[0] == "step"] == [round(x["reward"], 6) for x in logged]


def test_train_from_a_typed_config_and_a_path_with_overrides(tmp_path, model_dir):
    cfg = danka.Config.from_dict(_dict_config(tmp_path, model_dir), ["trainer.total_steps=1"])
    assert isinstance(cfg, danka.Config) and cfg.trainer.total_steps == 1
    with pytest.raises(AttributeError, match="read-only"):
        cfg.optim.lr = 1.0
    try:
        first = danka.train(cfg, ["output_dir=" + str(tmp_path / "a")], plot=False)
        path = make_config(tmp_path, model_dir)  # relative rows.jsonl / reward.py: its folder
        second = danka.train(path, ["trainer.total_steps=1", f"output_dir={tmp_path / 'b'}"],
                             plot=False)  # fmt: skip
    finally:
        close_run_logger()
    assert first.steps == 1 and first.output_dir == tmp_path / "a"
    assert second.steps == 1 and second.before is None  # no held-out data in that config
    assert danka.Config.from_yaml(str(path)).data.train_dataset == "rows.jsonl"


def test_bad_config_and_bad_callback_fail_before_any_work(tmp_path, model_dir):
    with pytest.raises(UserError, match="unknown key 'trainer.lrr'"):
        danka.train({"trainer": {"lrr": 1}})
    with pytest.raises(TypeError, match="not a callback"):
        danka.train(_dict_config(tmp_path, model_dir), callbacks=[object()])
    assert not (tmp_path / "out").exists()


def test_help_text_lists_every_algorithm():
    from danka.algorithms.presets import ALGORITHMS
    from danka.config.help import config_help

    line = next(x for x in config_help().splitlines() if "trainer.algorithm" in x)
    text = config_help()[config_help().index(line) :][:400]
    assert all(name in text for name in ALGORITHMS.names())
