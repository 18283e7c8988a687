"""Where the Triton tests run: compiled on a CUDA GPU, else under Triton's CPU interpreter.

The interpreter (numpy) is chosen by ``triton.jit`` when it decorates, so TRITON_INTERPRET
must be set before triton is first imported: a CPU test module calls :func:`triton_device`
before importing danka's kernel. Skips the module where triton is not importable (CI) or was
imported too early (run the file alone then).
"""

import os
import sys

import pytest
import torch


def triton_device() -> str:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip(
                "triton was imported before TRITON_INTERPRET=1 could be set; run this file alone",
                allow_module_level=True,
            )
        os.environ["TRITON_INTERPRET"] = "1"
    pytest.importorskip("triton")
    return device
