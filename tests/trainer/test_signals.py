"""A scheduler's SIGTERM or a Ctrl-C (SIGINT) during ``danka train``: the run saves a
checkpoint after the current step and exits 143 / 130 (real subprocesses, real signals);
``--resume auto`` then finishes the run. Also the default checkpoint cadence
(``save_steps: null`` = every 10% of the run) and the loop's other wiring: resume applies a
changed lr, config.json masks secrets, ``speed.tf32`` / ``compile`` are refused on CPU."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danka.checkpoint import find_latest_checkpoint, verify_checkpoint

from .conftest import make_config, train_cli

REPO = Path(__file__).resolve().parents[2]
STEPS = 40  # far more than run before the signal: the stop, not the end, saves


def _metric_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.endswith("}")]


@pytest.mark.parametrize(
    "sig, code",
    [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)],
)
def test_signal_saves_a_checkpoint_and_exits_with_its_code_then_resume_finishes(
    tmp_path, tiny_model_dir, sig, code
):
    config = make_config(
        tmp_path,
        tiny_model_dir,
        trainer={"total_steps": STEPS, "save_steps": 0, "samples_per_prompt": 2},
    )
    out = tmp_path / "out"
    console = open(tmp_path / "console.txt", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "danka", "train", str(config), "--output-dir", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=console,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 120
        while not _metric_steps(out):  # the first step is done
            assert proc.poll() is None and time.monotonic() < end, "no first step"
            time.sleep(0.02)
        os.kill(proc.pid, sig)  # the trainer only, as `kill -TERM PID` does
        rc = proc.wait(timeout=120)
    finally:
        console.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = (tmp_path / "console.txt").read_text()
    assert rc == code, text[-3000:]
    assert "Traceback" not in text
    latest = find_latest_checkpoint(out)
    assert latest is not None, "no checkpoint saved on the signal"
    stopped_at = int(latest.name.split("_")[1])
    verify_checkpoint(latest)
    assert 1 <= stopped_at < STEPS and _metric_steps(out) == list(range(1, stopped_at + 1))
    assert (out / "actor" / f"checkpoint_{stopped_at}" / "adapter_model.safetensors").is_file()
    result = json.loads((out / "result.json").read_text())
    assert result["stopped"] == sig.name and result["steps"] == stopped_at
    log = (out / "logs" / "train.log").read_text()
    assert f"{sig.name}: stopped after step {stopped_at} (checkpoint saved)" in log
    # --resume auto continues from there and finishes
    assert train_cli(config, out, "--resume", "auto") == 0
    assert f"at step {stopped_at}" in (out / "logs" / "train.log").read_text()
    assert _metric_steps(out) == list(range(1, STEPS + 1))
    assert "stopped" not in json.loads((out / "result.json").read_text())


def test_default_cadence_saves_every_tenth_of_the_run_and_config_json_masks_secrets(
    tmp_path, tiny_model_dir
):
    """save_steps null, 3 steps: every ceil(0.3) = 1 step (the old loop saved only the last);
    a reward kwarg named like a secret is masked in OUTPUT/config.json."""
    config = make_config(
        tmp_path,
        tiny_model_dir,
        trainer={"total_steps": 3, "samples_per_prompt": 2},
        reward={"functions": [{"name": "reward.py:reward", "kwargs": {"api_key": "sk-live-9"}}]},
    )
    out = tmp_path / "out"
    assert train_cli(config, out) == 0
    saved = sorted(p.name for p in (out / "state").glob("checkpoint_*"))
    assert saved == ["checkpoint_1", "checkpoint_2", "checkpoint_3"]
    text = (out / "config.json").read_text()
    assert "sk-live-9" not in text
    assert json.loads(text)["reward"]["functions"][0]["kwargs"]["api_key"] == "***"
    # a resumed run with a changed lr trains with the new one (not the checkpoint's)
    shutil.rmtree(out / "state" / "checkpoint_3")  # resume at step 2
    shutil.rmtree(out / "actor" / "checkpoint_3")
    assert train_cli(config, out, "trainer.lr=0.005", "--resume", "auto") == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["lr"] for x in lines] == [0.01, 0.01, 0.005]  # constant schedule
    log = (out / "logs" / "train.log").read_text()
    assert "optim.lr: 0.01 -> 0.005 (applied to the restored state)" in log


@pytest.mark.parametrize("key", ["speed.tf32", "speed.compile"])
def test_tf32_and_compile_are_refused_on_cpu(tmp_path, tiny_model_dir, key, capsys):
    config = make_config(tmp_path, tiny_model_dir, trainer={"total_steps": 1})
    assert train_cli(config, tmp_path / "out", f"{key}=true") == 2
    err = capsys.readouterr().err
    assert key in err and "false" in err and "Traceback" not in err
