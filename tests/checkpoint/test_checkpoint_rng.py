"""RNG capture / restore reproduces the same draws, also through a saved checkpoint."""

from __future__ import annotations

import random

import numpy as np
import torch

from danka.checkpoint import (
    capture_rng_state,
    load_trainer_state,
    restore_rng_state,
    save_checkpoint,
)


def _draws() -> tuple:
    return (
        [random.random() for _ in range(3)],
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        float(np.random.randn()),
        torch.rand(3).tolist(),
        torch.randint(0, 1000, (4,)).tolist(),
    )


def test_restore_reproduces_draws():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draws()  # advance, and leave a cached gaussian in python and numpy
    state = capture_rng_state()
    first = _draws()
    _draws()
    restore_rng_state(state)
    assert _draws() == first


def test_rng_state_survives_weights_only_load(tmp_path):
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    state_dir = save_checkpoint(
        tmp_path,
        1,
        {},
        trainer_state={"rng": capture_rng_state()},
        config_hash="h",
        keep_last=None,
    )
    expected = _draws()
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng_state(load_trainer_state(state_dir)["rng"])
    assert _draws() == expected
