"""The HF model inside the wrappers danka puts around it (peft, ``torch.compile``): what
both rollout engines and the training forward read the architecture and the decoder from."""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The HF ``*ForCausalLM`` inside a peft ``PeftModel`` and/or ``torch.compile`` wrapper."""
    for _ in range(4):
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif hasattr(model, "get_base_model") and not isinstance(model, PreTrainedModel):
            model = model.get_base_model()
        else:
            break
    return model
