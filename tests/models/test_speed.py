"""speed.tf32 and speed.compile: refused without a GPU, and compile wraps the body the
training forward calls."""

from __future__ import annotations

import pytest

from danka.errors import UserError
from danka.models import speed
from danka.models.speed import compile_forward, enable_tf32


def test_tf32_and_compile_are_refused_without_a_gpu():
    assert enable_tf32(False, "cpu") is None
    with pytest.raises(UserError, match="speed.tf32 needs an NVIDIA GPU"):
        enable_tf32(True, "cpu")
    model = object()
    assert compile_forward(model, False, "cpu") is model
    with pytest.raises(UserError) as err:
        compile_forward(model, True, "cpu")
    assert err.value.where == "speed.compile"


def test_compile_wraps_the_body_the_training_forward_calls(monkeypatch):
    """The training forward calls the decoder body (danka.step.forward.decoder_of), not
    ``model.forward``: compiling ``model.forward`` would be a no-op."""
    from peft import LoraConfig, get_peft_model

    from danka.models import tiny
    from danka.step.forward import decoder_of

    monkeypatch.setattr(speed, "_cuda_device", lambda device: True)  # no GPU here
    model = get_peft_model(tiny.tiny_causal_lm(), LoraConfig(r=2, target_modules=["q_proj"]))
    assert compile_forward(model, True, "cuda") is model
    assert hasattr(decoder_of(model).forward, "_torchdynamo_orig_callable")
