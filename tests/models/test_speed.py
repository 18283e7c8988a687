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


def test_compile_wraps_each_layer_for_training_forwards_only(monkeypatch):
    """The training forwards (padding-free, or padded without a KV cache) run each decoder
    layer through its compiled code; generation with a cache runs it eagerly."""
    import torch

    from danka.models import tiny
    from danka.models.lora import apply_lora

    calls = []

    def fake_compile(fn, dynamic):  # records which forwards took the compiled code
        assert dynamic is True
        return lambda *a, **k: calls.append("compiled") or fn(*a, **k)

    monkeypatch.setattr(speed, "_cuda_device", lambda device: True)  # no GPU here
    monkeypatch.setattr(torch, "compile", fake_compile)
    model = apply_lora(tiny.tiny_causal_lm(), r=2, alpha=4, dropout=0.0, target_modules="q_proj")
    assert compile_forward(model, True, "cuda") is model
    layers = model.config.num_hidden_layers
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
        assert calls == ["compiled"] * layers
        model.generate(input_ids=ids, max_new_tokens=2, do_sample=False)
    assert calls == ["compiled"] * layers  # generation: eager
