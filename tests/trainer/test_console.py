"""What ``danka train`` prints: one readable line per step (the progress line; the short
step line stays in train.log), every metric with --verbose, the CPU thread choice in one
line, and none of transformers' known noise."""

from __future__ import annotations

import re

from .conftest import make_config, train_cli


def _run(tmp_path, tiny_model_dir, capsys, *args):
    tmp_path.mkdir()
    config = make_config(tmp_path, tiny_model_dir, logging={"tensorboard": False, "progress": True})
    out = tmp_path / "out"
    assert train_cli(config, out, *args) == 0
    printed = capsys.readouterr()
    return printed.out + printed.err, (out / "logs" / "train.log").read_text()


def test_one_line_per_step_by_default_and_every_metric_with_verbose(
    tmp_path, tiny_model_dir, capsys
):
    console, log = _run(tmp_path / "a", tiny_model_dir, capsys)
    for step in (1, 2):
        assert len(re.findall(rf"^.*\bstep {step}\b.*$", console, re.M)) == 1, console
        assert f"[progress] step {step}/2" in console
        short = re.search(rf"\[INFO\] step {step} \| loss: \S+, reward: \S+.*$", log, re.M)
        assert short and "time/step" in short[0] and "actor/clipfrac" not in short[0]
        assert len(short[0]) < 250
    assert "cpu threads: " in console and "cpu threads: " in log
    assert "is_gradient_checkpointing" not in console
    assert "generation flags are not valid" not in console

    console, log = _run(tmp_path / "b", tiny_model_dir, capsys, "--verbose")
    full = re.search(r"\[INFO\] step 1 \| loss: .*$", console, re.M)
    assert full and "actor/clipfrac" in full[0] and "time/rollout" in full[0]
    assert full[0].split("] ", 1)[1] in log
