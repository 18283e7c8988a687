"""`--resume PATH` to an older checkpoint keeps the newer ones: refused (exit 2, nothing
deleted) unless --discard-newer. Old code deleted them (and their metrics) silently."""

from __future__ import annotations

from pathlib import Path

from danka.checkpoint import save_checkpoint
from danka.cli import main

CONFIG = """
model: {actor_model_name_or_path: HuggingFaceTB/SmolLM2-135M-Instruct}
data: {task: arithmetic}
"""


def _save(out: Path, step: int) -> None:
    def write(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_bytes(b"x")

    save_checkpoint(
        out, step, {"actor": write}, trainer_state={"step": step}, config_hash="h", keep_last=None
    )


def test_resume_to_an_older_checkpoint_is_refused_without_discard_newer(tmp_path, capsys):
    out = tmp_path / "out"
    for step in (1, 2, 3):
        _save(out, step)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    code = main(
        ["train", str(cfg), "--output_dir", str(out), "--resume", str(out / "state/checkpoint_1")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "2 newer checkpoint(s) exist (checkpoint_2, checkpoint_3)" in err
    assert "--discard-newer" in err
    assert sorted(p.name for p in (out / "state").iterdir()) == [
        "checkpoint_1",
        "checkpoint_2",
        "checkpoint_3",
    ]
    assert not (out / ".danka.lock").exists()  # the refused run released its lock


def test_discard_newer_is_a_known_option():
    from danka.cli import build_parser

    args, _ = build_parser().parse_known_args(
        ["train", "c.yaml", "--resume", "x/checkpoint_1", "--discard-newer"]
    )
    assert args.discard_newer is True
