"""A run whose output dir is deleted under it and taken by a new run stops before it writes
anything more there (metrics, checkpoint: exit 2) instead of mixing two runs in one folder:
the calculator CPU run's ``FileNotFoundError`` on ``state/.tmp-checkpoint_6-*/parts.json``
came from two runs in one folder (the first one's lock file was deleted with the folder)."""

from __future__ import annotations

import shutil

import pytest

from danka.lifecycle import LOCK_NAME, RunLock
from danka.trainer import fit as fit_module
from danka.trainer.clocks import RunClocks

from .conftest import make_config, train_cli


@pytest.mark.parametrize(
    "hook, refused",
    [
        ("train_step", "step 2's metrics not written"),  # lost during the step
        ("after_step", "checkpoint 2 not written"),  # lost after the log, before the save
    ],
)
def test_run_that_lost_its_output_dir_stops_before_writing_there(
    tmp_path, tiny_model_dir, monkeypatch, capsys, hook, refused
):
    cfg = make_config(tmp_path, tiny_model_dir, trainer={"total_steps": 3, "save_steps": 1})
    out = tmp_path / "out"
    owner = fit_module if hook == "train_step" else RunClocks
    real, other = getattr(owner, hook), []

    def then_lose_the_dir(*args, **kwargs):
        got = real(*args, **kwargs)
        step = args[1]  # train_step(stages, step, micro) / after_step(clocks, step, total)
        if step == 2 and not other:
            shutil.rmtree(out)  # the user deletes the folder and starts a new run in it
            out.mkdir()
            other.append(RunLock(out).acquire())
        return got

    monkeypatch.setattr(owner, hook, then_lose_the_dir)
    try:
        assert train_cli(cfg, out) == 2
        err = capsys.readouterr().err
        assert "lock file" in err and refused in err, err
        # nothing of the old run in the new run's folder, and the new run's lock is intact
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
        assert other[0].still_held()
    finally:
        for lock in other:
            lock.release()
    assert not (out / LOCK_NAME).exists()
