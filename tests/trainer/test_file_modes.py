"""Every file a run writes has one mode: what a new file gets from the umask (0644 under
the usual 022), so others sharing the run folder can read all of it."""

from __future__ import annotations

import os

from .conftest import make_config, train_cli


def test_every_file_of_a_run_and_its_resume_is_0644_under_umask_022(tmp_path, tiny_model_dir):
    cfg = make_config(tmp_path, tiny_model_dir, data={"eval_size": 2})
    out = tmp_path / "out"
    old = os.umask(0o022)
    try:
        assert train_cli(cfg, out) == 0
        # a resume rewrites metrics.jsonl (its lines after the checkpoint removed)
        assert train_cli(cfg, out, "--resume", "auto", "trainer.total_steps=3") == 0
    finally:
        os.umask(old)
    modes = {
        p.relative_to(out).as_posix(): p.stat().st_mode & 0o777
        for p in out.rglob("*")
        if p.is_file()
    }
    assert {"result.json", "metrics.jsonl", "eval/step_0.json", "eval/step_3.json"} <= set(modes)
    assert {name: oct(mode) for name, mode in modes.items() if mode != 0o644} == {}
