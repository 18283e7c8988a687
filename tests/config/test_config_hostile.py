"""Configs and numbers a red team writes: YAML alias bombs, recursive aliases, nesting
deeper than the parser goes, a named pipe as the config, integers of thousands of digits,
2**70 in every integer setting and every numeric flag. Each is one message naming the
file (line) or key and the fix, exit 2, in well under a second of work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from danka.cli import main
from danka.config import load_config
from danka.config.load import config_from_dict
from danka.data.tasks import task_rows
from danka.errors import UserError
from tests.config.bad_config import BASE, keys_of_type, load_error, write_config

REPO = Path(__file__).resolve().parents[2]


def _bomb(levels: int = 10, width: int = 9) -> str:
    """A value that expands to width**levels strings through its aliases (~500 bytes)."""
    value = "&a0 [" + ", ".join(["x"] * width) + "]"
    for i in range(1, levels + 1):
        value = f"&a{i} [" + ", ".join([value] + [f"*a{i - 1}"] * (width - 1)) + "]"
    return value


def _danka(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "danka", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("where", ["top", "data.system_prompt"])
def test_an_alias_bomb_is_refused_at_once(tmp_path, where):
    """Before: the duplicate-key and key-line walks followed all 9**10 alias paths (killed
    after 60 s), at the top level and under a valid key alike."""
    path = tmp_path / "c.yaml"
    if where == "top":
        path.write_text(BASE + f"bomb: {_bomb()}\n")
    else:
        path.write_text(
            BASE.replace("  train_dataset", f"  system_prompt: {_bomb()}\n  train_dataset")
        )
    done = _danka("train", str(path), "--print-config", timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{path}:" in done.stderr and "alias" in done.stderr and "fix:" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "override, word",
    [
        pytest.param(f"data.system_prompt={_bomb()}", "alias", id="alias-bomb"),
        pytest.param(f"optim.lr={10**400}", "finite number", id="float-given-a-huge-integer"),
    ],
)
def test_a_hostile_override_is_refused(tmp_path, override, word):
    with pytest.raises(UserError, match=word):
        load_config(write_config(tmp_path), [override])


@pytest.mark.parametrize(
    "text, words",
    [
        ("a: &a [*a]\n", ("recursive alias",)),
        ("a: &a {b: *a}\n", ("recursive alias",)),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", ("nests deeper",)),
        ("trainer:\n  seed: " + "9" * 5000 + "\n", (":2", "thousands of digits")),
    ],
)
def test_yaml_that_cannot_be_a_config_is_one_message(tmp_path, text, words):
    err = load_error(write_config(tmp_path, text))
    for word in words:
        assert word in str(err)


def test_aliases_that_a_config_uses_still_work(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(BASE + "eval:\n  probe_prompts: &p [a, b]\nrm:\n  chosen_key: chosen\n")
    cfg, _ = load_config(path, ["eval.probe_prompts=[x, y]"])
    assert cfg.eval.probe_prompts == ["x", "y"]


def test_a_named_pipe_as_the_config_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    done = _danka("train", str(fifo), "--print-config")
    assert done.returncode == 2, done.stderr
    assert "named pipe" in done.stderr and str(fifo) in done.stderr


@pytest.mark.parametrize("value", [2**70, -(2**70), 10**399])
@pytest.mark.parametrize("key", keys_of_type(int))
def test_every_integer_setting_has_a_range(tmp_path, key, value):
    """Before: seed 2**70 reached torch.manual_seed (traceback), task_train_size 10**12
    filled memory, a 400-digit total_steps passed --print-config."""
    err = load_error(write_config(tmp_path), [f"{key}={value}"])
    assert key in str(err), str(err)


@pytest.mark.parametrize(
    "key, value", [("trainer.seed", 2**32), ("trainer.seed", -1), ("lora.lora_r", 2**17),
                   ("data.task_train_size", 10**7), ("trainer.max_new_tokens", 2**25)],
)  # fmt: skip
def test_ranges_follow_what_a_setting_counts(tmp_path, key, value):
    path = write_config(tmp_path)
    with pytest.raises(UserError, match="out of range"):
        load_config(path, [f"{key}={value}"])
    load_config(path, ["trainer.seed=4294967295"])  # the largest seed is fine


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "CONFIG", "--seed", str(2**70), "--print-config"],
        ["train", "CONFIG", "--nproc", str(10**30)],
        ["eval", "--data", "x.jsonl", "--temperature", "nan", "--samples", "2"],
        ["eval", "--data", "x.jsonl", "--n", str(10**30)],
        ["generate", "--model", "m", "--prompt", "p", "--max-new-tokens", str(2**70)],
        ["generate", "--model", "m", "--prompt", "p", "--top-p", "inf"],
        ["generate", "--model", "m", "--prompt", "p", "--top-p", "5"],
        ["generate", "--model", "m", "--prompt", "p", "--max-new-tokens", "-5"],
        ["generate", "--model", "m", "--file", "f", "--batch-size", "0"],
        ["distill", "--data", "d", "--student", "s", "--output", "o", "--lr", "nan"],
        ["data", "gsm8k-pairs", "--input", "i", "--output", "o", "--test-fraction", "nan"],
    ],
)
def test_numbers_on_the_command_line_are_checked_before_anything_runs(tmp_path, capsys, argv):
    path = write_config(tmp_path)
    assert main([str(path) if a == "CONFIG" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert "danka: error: --" in err and "fix:" in err


@pytest.mark.parametrize(
    "task, kwargs, word",
    [
        ("arithmetic", {"low": 0, "high": 10**6}, "pairs"),
        ("arithmetic", {"low": "x"}, "data.task_kwargs.low"),
        ("arithmetic", {"high": 10**12}, "data.task_kwargs.high"),
        ("chain", {"length": 10**9}, "length <= 100"),
        ("calculator", {"a_range": [1]}, "data.task_kwargs.a_range"),
    ],
)
def test_task_options_are_bounded(task, kwargs, word):
    with pytest.raises(UserError, match=word):
        task_rows(task, 10, seed=0, split="train", kwargs=kwargs)


def test_overrides_given_as_one_string_are_one_override():
    """Before: danka.train(..., overrides="a=1") iterated the string per character."""
    data = {"model": {"actor_model_name_or_path": "m"}, "data": {"train_dataset": "r.jsonl"}}
    cfg = config_from_dict(data, "trainer.total_steps=3")
    assert cfg.trainer.total_steps == 3


def test_an_unknown_device_is_one_message(capsys):
    """Before: torch's RuntimeError traceback."""
    from danka.models.loading import pick_device

    with pytest.raises(UserError, match="unknown device 'bogus'"):
        pick_device("bogus", where="--device")


@pytest.mark.parametrize("key", ["reward.timeout_s", "rollout.tool_timeout_s",
                                 "trainer.max_train_minutes", "eval.every_minutes"])  # fmt: skip
def test_a_finite_but_endless_duration_is_refused(tmp_path, key):
    """Before: reward.timeout_s 1e300 passed, then the worker's poll overflowed mid-run."""
    path = write_config(tmp_path)
    with pytest.raises(UserError, match="more than a year"):
        load_config(path, [f"{key}=1e300"])


@pytest.mark.parametrize("text", ["1.2.3", "99999999999999999999999TB", "0GB"])
def test_a_memory_size_that_cannot_be_is_one_message(text):
    from danka.schema.units import parse_memory

    with pytest.raises(UserError, match="cannot read memory size"):
        parse_memory(text)


# The red team of the newest surfaces (template specs, gpu_memory, override locations,
# old and new names on the command line, keep_cache, the drift probe's prompts).

HUGE = "9" * 400


@pytest.mark.parametrize(
    "text", [HUGE, HUGE + "GB", HUGE + ".5GiB", "0." + HUGE + "TB"], ids=["bare", "GB", "GiB", "TB"]
)
def test_a_400_digit_memory_size_is_one_message(text):
    """Before: OverflowError (float inf into int) from parse_memory, a traceback in
    --print-config, train and estimate --gpu-memory."""
    from danka.schema.units import parse_memory

    with pytest.raises(UserError, match="cannot read memory size") as err:
        parse_memory(text)
    assert len(str(err.value)) < 400  # the number itself is cut in the message


@pytest.mark.parametrize("unit", ["", "GB"])
def test_a_400_digit_gpu_memory_is_exit_2_in_print_config_and_estimate(tmp_path, unit):
    path = write_config(tmp_path, BASE + f'speed:\n  gpu_memory: "{HUGE}{unit}"\n')
    done = _danka("train", str(path), "--print-config")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "speed.gpu_memory" in done.stderr and "Traceback" not in done.stderr
    done = _danka("estimate", str(write_config(tmp_path)), "--gpu-memory", HUGE + unit)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--gpu-memory" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "override, key",
    [
        ("reward.functions=[{name: last_number, weight: .nan}]", "reward.functions[0].weight"),
        ("eval.probe_prompts=[5]", "eval.probe_prompts[0]"),
        ("lora.target_modules=[1]", "lora.target_modules"),
    ],
)
def test_an_error_inside_an_override_list_is_located_at_the_override(tmp_path, override, key):
    """Before: 'c.yaml: key reward.functions[0].weight' although the file sets no reward."""
    path = write_config(tmp_path)
    err = str(load_error(path, ["trainer.total_steps=3", override]))
    assert err.startswith(f"command-line override #2: {override}"), err
    assert key in err and str(path) not in err


def test_an_override_of_a_key_the_file_sets_is_located_at_the_override(tmp_path):
    path = write_config(tmp_path, BASE + "eval:\n  probe_prompts: [a, b]\n")
    err = str(load_error(path, ["eval.probe_prompts=[x, 5]"]))
    assert err.startswith("command-line override #1: eval.probe_prompts=[x, 5]"), err
    assert "eval.probe_prompts[1]" in err and str(path) not in err


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.lr=1e-5", "optim.lr=2e-5"],
        ["optim.lr=2e-5", "trainer.lr=1e-5"],
        ["loss.kl={coef: 0.1}", "trainer.kl.coef=0.2"],
        ["rollout.max_turns=3", "agent.max_turns=4"],
    ],
)
def test_old_and_new_names_of_one_key_on_the_command_line_are_refused(tmp_path, overrides):
    """Before: the last of the two won silently (the same pair in a file is refused)."""
    err = str(load_error(write_config(tmp_path), overrides))
    for written in (o.split("=")[0] for o in overrides):
        assert written in err, err
    assert "older name" in err, err
    assert "command-line overrides #1 and #2" in err, err


def test_an_old_name_on_the_command_line_still_overrides_the_file(tmp_path):
    path = write_config(tmp_path, BASE + "optim:\n  lr: 1.0e-5\n")
    cfg, _ = load_config(path, ["trainer.lr=2e-5"])
    assert cfg.optim.lr == 2e-5
    cfg, _ = load_config(path, ["optim.lr=3e-5", "optim.lr=4e-5"])  # one name twice: last wins
    assert cfg.optim.lr == 4e-5


@pytest.mark.parametrize(
    "override, key",
    [
        ("eval.probe_prompts=['']", "eval.probe_prompts[0]"),
        ("eval.probe_prompts=[a, '  ']", "eval.probe_prompts[1]"),
    ],
)
def test_an_empty_probe_prompt_is_refused(tmp_path, override, key):
    """Before: accepted (the probe then asked the model nothing)."""
    err = str(load_error(write_config(tmp_path), [override]))
    assert key in err and "empty" in err, err


def test_a_probe_prompt_no_tokenizer_fits_in_max_length_is_refused_at_validation(tmp_path):
    """Before: refused only after the model loaded, as 'data: row 0 ... raise
    data.max_prompt_length'. 512 tokens of trainer.max_length hold no 40,000 characters."""
    err = str(load_error(write_config(tmp_path), ["eval.probe_prompts=[hi, " + "x" * 40_000 + "]"]))
    assert "eval.probe_prompts[1]" in err and "trainer.max_length" in err, err
    assert "data.max_prompt_length" not in err


@pytest.mark.parametrize(
    "override, key",
    [
        ("reward.functions=[{name: nosuch}]", "reward.functions[0].name"),
        ("reward.functions=[{name: last_number, kwargs: {nope: 1}}]", "reward.functions[0].kwargs"),
    ],
)
def test_a_section_check_inside_an_override_list_is_located_at_the_override(
    tmp_path, override, key
):
    """A check that names its key bare (the reward specs) said 'reward.functions[0].name:
    unknown reward', naming neither the override nor the file: located like every other."""
    err = str(load_error(write_config(tmp_path), [override]))
    assert err.startswith(f"command-line override #1: {override}: key {key}"), err


def test_a_section_check_inside_a_file_list_is_located_at_its_line(tmp_path):
    path = write_config(tmp_path, BASE + "reward:\n  functions:\n    - name: nosuch\n")
    err = str(load_error(path))
    assert err.startswith(f"{path}:9: key reward.functions[0].name: unknown reward"), err
    path = write_config(tmp_path, BASE + "eval:\n  probe_prompts: [hi, '']\n")
    err = str(load_error(path))  # an item of a list of strings: the list's line
    assert err.startswith(f"{path}:8: key eval.probe_prompts[1]"), err
