"""Capture and restore every RNG a training step draws from, for bit-exact resume."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

log = logging.getLogger("danka.checkpoint")


def capture_rng_state() -> dict:
    """RNG state of python ``random``, numpy, torch CPU and every CUDA device, as tensors,
    ints and lists only, so :func:`load_trainer_state` can read it with weights_only."""
    py_version, py_state, py_gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": py_version, "state": list(py_state), "gauss_next": py_gauss},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Inverse of :func:`capture_rng_state`; CUDA states are restored when CUDA is present."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npd = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npd["bit_generator"],
            "state": {"key": npd["key"].numpy().astype(np.uint32), "pos": npd["pos"]},
            "has_gauss": npd["has_gauss"],
            "gauss": npd["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) != torch.cuda.device_count():
            log.warning(
                "Checkpoint has RNG states for %d CUDA devices, this machine has %d; "
                "restoring the first ones only",
                len(cuda_states),
                torch.cuda.device_count(),
            )
        for i, s in enumerate(cuda_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, device=i)
