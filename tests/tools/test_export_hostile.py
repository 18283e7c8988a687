"""``danka export`` / ``generate`` / ``eval`` given an output or an adapter that cannot work:
the checkpoint itself as the output, a file as the output, an adapter whose
``target_modules`` the base lacks, an adapter trained on a base of another shape. Each is
one message naming the folder (and both bases), exit 2, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from danka.cli import main
from danka.models.tiny import save_tiny_model

REPO = Path(__file__).resolve().parents[2]


def _edited(adapter_dir: Path, tmp_path: Path, **config) -> Path:
    out = tmp_path / "adapter"
    shutil.copytree(adapter_dir, out)
    path = out / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_exporting_a_checkpoint_into_itself_is_refused(adapter_dir, tmp_path):
    """Before: exit 0, the merged model written into the checkpoint (its manifest then
    failed, and --resume auto set the checkpoint aside)."""
    ck = tmp_path / "run" / "actor" / "checkpoint_2"
    shutil.copytree(adapter_dir, ck)
    before = _files(ck)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = ["export", "--adapter", str(ck), "--output", str(ck), "--overwrite"]
    done = subprocess.run(
        [sys.executable, "-m", "danka", *argv], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "the checkpoint being exported" in done.stderr and "Traceback" not in done.stderr
    assert _files(ck) == before


@pytest.mark.parametrize("where", ["inside", "parent", "other checkpoint", "run folder"])
def test_no_export_writes_into_a_run(adapter_dir, tmp_path, capsys, where):
    run = tmp_path / "run"
    ck = run / "actor" / "checkpoint_2"
    shutil.copytree(adapter_dir, ck)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    output = {
        "inside": ck / "merged",
        "parent": run / "actor",
        "other checkpoint": run / "actor" / "checkpoint_1",
        "run folder": run,
    }[where]
    output.mkdir(parents=True, exist_ok=True)
    before = _files(run)
    argv = ["export", "--adapter", str(ck), "--output", str(output), "--overwrite"]
    assert main(argv) == 2
    assert "--output" in capsys.readouterr().err
    assert _files(run) == before


def test_output_that_is_a_file_is_one_message(adapter_dir, tmp_path, capsys):
    """Before: a NotADirectoryError traceback."""
    target = tmp_path / "model.bin"
    target.write_text("keep me")
    assert main(["export", "--adapter", str(adapter_dir), "--output", str(target)]) == 2
    assert main(["export", "--adapter", str(adapter_dir), "--output", str(target / "x")]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "Traceback" not in err
    assert target.read_text() == "keep me"


def test_overwrite_replaces_the_folder_whole(adapter_dir, tmp_path):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    argv = ["export", "--adapter", str(adapter_dir), "--output", str(out), "--overwrite"]
    assert main([*argv, "--dtype", "fp32"]) == 0
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_an_adapter_whose_targets_the_base_lacks_is_one_message(adapter_dir, tmp_path, capsys):
    """Before: peft's NoMatchingPeftModuleError traceback (export --gguf q8_0)."""
    adapter = _edited(adapter_dir, tmp_path, target_modules=["nope_proj"])
    out = tmp_path / "merged"
    assert main(["export", "--adapter", str(adapter), "--output", str(out), "--gguf", "q8_0"]) == 2
    err = capsys.readouterr().err
    assert "target_modules" in err and "adapter_config.json" in err and "fix:" in err
    assert not out.exists()


def test_an_adapter_for_another_base_names_both_bases(adapter_dir, tiny_dir, tmp_path, capsys):
    """Before: peft's size-mismatch RuntimeError traceback (generate / eval --adapter)."""
    other = save_tiny_model(tmp_path / "narrow", hidden=32)
    adapter = _edited(adapter_dir, tmp_path)
    argv = ["--adapter", str(adapter), "--model", str(other)]
    assert main(["generate", *argv, "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "another shape" in err and str(other) in err and str(tiny_dir) in err, err
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1 + 1?", "answer": "2"}\n')
    assert main(["eval", *argv, "--data", str(data), "--reward", "last_number"]) == 2
    assert "another shape" in capsys.readouterr().err
