"""Config input a new user (or a red team) gets wrong: every case one message (exit 2) that
names the file, the line or key, and the fix; numbers that cannot be right are refused.

Loading only: no model is built, so each case takes milliseconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from danka.cli import main
from tests.config.bad_config import BASE, keys_of_type, load_error, write_config

REPO = Path(__file__).resolve().parents[2]


def test_the_red_teams_float_settings_are_among_the_checked_keys():
    keys = set(keys_of_type(float))
    for key in ("optim.lr", "sampling.temperature", "optim.max_grad_norm", "loss.kl.coef",
                "reward.timeout_s", "agent.tool_timeout_s"):  # fmt: skip
        assert key in keys


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "nan", "inf"])
@pytest.mark.parametrize("key", keys_of_type(float))
def test_nan_and_infinity_are_refused_for_every_float_setting(tmp_path, key, value):
    err = load_error(write_config(tmp_path, BASE), [f"{key}={value}"])
    assert "finite number" in str(err) and key in str(err), str(err)


def test_nan_in_the_file_names_the_line(tmp_path):
    path = write_config(tmp_path, BASE + "reward:\n  timeout_s: .nan\n")
    err = load_error(path)
    assert f"{path}:8: key reward.timeout_s" in str(err) and "finite number" in str(err)


def test_duplicate_keys_are_refused_with_both_lines(tmp_path):
    text = BASE + "  batch_size: 2\n  lr: 1.0e-5\n  mini_batch_size: 2\n  total_steps: 500\n"
    path = write_config(tmp_path, text)  # total_steps on line 6 and line 10
    err = load_error(path)
    assert str(err).startswith(f"{path}:10: duplicate key 'trainer.total_steps'"), str(err)
    assert "line 6" in str(err) and "line 10" in str(err)


def test_duplicate_top_level_sections_are_refused(tmp_path):
    path = write_config(tmp_path, BASE + "model:\n  device: cpu\n")
    err = load_error(path)
    assert "duplicate key 'model'" in str(err) and "line 1" in str(err) and "line 7" in str(err)


def test_a_config_that_is_not_utf8_exits_2_naming_the_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(BASE.encode() + b"# caf\xe9\n")
    proc = subprocess.run(
        [sys.executable, "-m", "danka", "train", str(path), "--print-config"],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{path}:7" in proc.stderr and "not UTF-8" in proc.stderr and "fix:" in proc.stderr


def test_a_folder_given_as_the_config(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text(BASE)
    assert main(["train", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "a folder, not a config file" in err and str(tmp_path / "config.yaml") in err
    assert "not found" not in err


def test_top_p_zero_names_top_p(tmp_path):
    err = load_error(write_config(tmp_path, BASE), ["trainer.top_p=0"])
    assert "trainer.top_p" in str(err) and "temperature" not in str(err)


def test_grpo_with_one_sample_per_prompt_says_so(tmp_path):
    """Before: 2 prompts x 1 sample in micro-batches of 4 was reported as a micro-batch
    divisibility problem."""
    overrides = [
        "trainer.samples_per_prompt=1",
        "trainer.batch_size=2",
        "trainer.micro_batch_size=4",
    ]
    err = load_error(write_config(tmp_path, BASE), overrides)
    assert "trainer.samples_per_prompt" in str(err)
    assert "GRPO needs >= 2 samples per prompt" in str(err)
    assert "micro_batch" not in str(err)


def test_an_unknown_section_on_the_command_line_is_reported_there(tmp_path):
    path = write_config(tmp_path, BASE)
    err = load_error(path, ["trainr.lr=1e-5"])
    assert str(err).startswith("command-line override #1: trainr.lr=1e-5: unknown key 'trainr'")
    assert str(path) not in str(err)
    err = load_error(path, ["trainer.kll.coef=1"])
    assert "command-line override #1: trainer.kll.coef=1" in str(err), str(err)
    assert "trainer.kl" in str(err)
