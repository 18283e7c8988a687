"""Every file ``eval``, ``export``, ``plot``, ``generate`` and ``--resume`` read, replaced by
a named pipe, a device, a symlink loop or JSON nested 100k deep: one message and exit 2 (a
damaged evaluation file in ``plot`` is skipped), never a hang or a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from danka.cli import main

REPO = Path(__file__).resolve().parents[2]
DEEP = "[" * 100_000 + "]" * 100_000


def _danka(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "danka", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _refused(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "fix:" in done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def test_a_pipe_as_the_eval_data_or_reward_file(tiny_dir, tmp_path):
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    _refused(_danka("eval", "--model", str(tiny_dir), "--data", str(fifo), "--reward", "gsm8k"),
             "named pipe", str(fifo))  # fmt: skip
    data = tmp_path / "ok.jsonl"
    data.write_text('{"prompt": "1 + 1?", "answer": "2"}\n')
    reward = tmp_path / "r.py"
    os.mkfifo(reward)
    done = _danka("eval", "--model", str(tiny_dir), "--data", str(data), "--reward",
                  f"{reward}:compute_score")  # fmt: skip
    _refused(done, "named pipe", str(reward))


def test_a_pipe_in_the_adapter_folder_is_refused_before_peft_opens_it(adapter_dir, tmp_path):
    adapter = tmp_path / "adapter"
    shutil.copytree(adapter_dir, adapter)
    (adapter / "adapter_model.safetensors").unlink()
    os.mkfifo(adapter / "adapter_model.safetensors")
    _refused(_danka("export", "--adapter", str(adapter), "--output", str(tmp_path / "out")),
             "named pipe", "adapter_model.safetensors")  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_plot_skips_a_damaged_evaluation_and_refuses_a_pipe_for_metrics(make_run, tmp_path):
    run = make_run(tmp_path / "run")
    eval_file = run / "eval" / "step_0.json"
    eval_file.unlink()
    os.mkfifo(eval_file)
    (run / "completions" / "step_1.jsonl").write_text(DEEP + "\n")
    done = _danka("plot", str(run))
    assert done.returncode == 0, done.stderr[-2000:]
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    _refused(_danka("plot", str(run)), "named pipe", "metrics.jsonl")


@pytest.mark.parametrize("how", ["loop", "deep", "device"])
def test_a_damaged_adapter_config_is_one_message(adapter_dir, tmp_path, capsys, how):
    adapter = tmp_path / "adapter"
    shutil.copytree(adapter_dir, adapter)
    config = adapter / "adapter_config.json"
    config.unlink()
    if how == "loop":
        config.symlink_to(config.name)
    elif how == "device":
        config.symlink_to("/dev/zero")
    else:
        config.write_text(DEEP)
    assert main(["generate", "--adapter", str(adapter), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "adapter_config.json" in err and "fix:" in err


def test_data_rows_nested_too_deep_name_their_line(tiny_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1 + 1?", "answer": "2"}\n' + DEEP + "\n")
    argv = ["eval", "--model", str(tiny_dir), "--data", str(data), "--reward", "gsm8k"]
    assert main(argv) == 2
    assert f"{data}:2" in capsys.readouterr().err
    data.write_text(DEEP)
    data.rename(tmp_path / "d.json")
    assert main([*argv[:4], str(tmp_path / "d.json"), *argv[5:]]) == 2


def test_resume_with_damaged_files_is_one_message(tmp_path):
    """A manifest nested 100k deep is a damaged checkpoint (set aside by --resume auto, named
    by --resume PATH); a pipe for metrics.jsonl is refused, not waited on."""
    from danka.checkpoint.store import latest_verified, verify_checkpoint
    from danka.errors import UserError
    from danka.logging.metrics import truncate_metrics_after

    state = tmp_path / "state" / "checkpoint_1"
    state.mkdir(parents=True)
    (state / "manifest.json").write_text(DEEP)
    found, skipped = latest_verified(tmp_path)
    assert found is None and "nested deeper" in skipped["checkpoint_1"]
    with pytest.raises(UserError, match="malformed"):
        verify_checkpoint(state)
    os.mkfifo(tmp_path / "metrics.jsonl")
    with pytest.raises(UserError, match="named pipe"):
        truncate_metrics_after(tmp_path, 1)
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n" + DEEP + "\n")
    assert truncate_metrics_after(tmp_path, 1) == 1


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_an_output_that_cannot_be_a_file_fails_before_the_model_loads(tmp_path, capsys, command):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1 + 1?", "answer": "2"}\n')
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    extra = ["--file", str(data)] if command == "generate" else ["--data", str(data), "--reward",
                                                                  "gsm8k"]  # fmt: skip
    for output in (tmp_path, blocker / "out.json"):  # a folder; a path through a file
        argv = [command, "--model", "no/such-model-here", *extra, "--output", str(output)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--output" in err and "no/such-model-here" not in err, err


def test_a_pipe_in_the_model_folder_stops_estimate_and_train_without_blocking(tiny_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    config = tmp_path / "c.yaml"
    config.write_text(f"model:\n  actor_model_name_or_path: {model}\n  device: cpu\n"
                      "data:\n  train_dataset: rows.jsonl\n")  # fmt: skip
    (tmp_path / "rows.jsonl").write_text('{"prompt": "1 + 1?", "answer": "2"}\n' * 2)
    _refused(_danka("estimate", str(config)), "named pipe", "config.json")
    _refused(_danka("train", str(config), "--output-dir", str(tmp_path / "out")), "named pipe")
