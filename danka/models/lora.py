"""LoRA adapters through peft (Hu et al. 2021, https://arxiv.org/abs/2106.09685).

One frozen base carries every role: the policy is the base + adapter ``"default"``, the PPO
critic the base + a second adapter (plus a value head), and the reference policy is the base
with adapters switched off (:func:`reference_mode`) -- no second copy of the weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

from danka.errors import UserError
from danka.models import lora_linear


def linear_module_names(model: nn.Module) -> list[str]:
    """Sorted short names (``q_proj``, ``down_proj``, ``lm_head``...) of the model's linear layers."""
    return sorted({n.rsplit(".", 1)[-1] for n in _linear_paths(model)})


def _linear_paths(model: nn.Module) -> list[str]:
    """Dotted paths of linear layers; a LoRA-wrapped layer counts under its own path."""
    paths = []
    for full_name, module in model.named_modules():
        if not (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"):
            continue
        if ".lora_" in full_name:  # the adapters' own A/B matrices
            continue
        paths.append(full_name.removesuffix(".base_layer"))
    return paths


def _targets(model: nn.Module, target_modules: list[str] | str) -> list[str] | str:
    """Validate LoRA targets: ``"all-linear"``, a comma-separated string, or a list of names."""
    if isinstance(target_modules, str):
        if target_modules == "all-linear":
            return target_modules
        target_modules = [t.strip() for t in target_modules.split(",") if t.strip()]
    targets = list(target_modules)
    available = linear_module_names(model)
    full_names = _linear_paths(model)
    missing = [
        t
        for t in targets
        if t not in available and not any(n == t or n.endswith("." + t) for n in full_names)
    ]
    if not targets or missing:
        raise UserError(
            f"LoRA target modules {missing or targets} are not linear layers of this model",
            where="lora.target_modules",
            fix=f"use names from {available}, or 'all-linear'",
        )
    return targets


def _config(
    r: int, alpha: float, dropout: float, targets: list[str] | str, task_type: str = "CAUSAL_LM"
) -> LoraConfig:
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        task_type=task_type,
    )


def apply_lora(
    model: nn.Module,
    *,
    r: int,
    alpha: float,
    dropout: float,
    target_modules: list[str] | str,
    adapter_name: str = "default",
    task_type: str = "CAUSAL_LM",
    compute_dtype: torch.dtype | None = None,
) -> PeftModel:
    """Wrap ``model`` in a PeftModel with one LoRA adapter; only adapter weights train.

    Update rule of each targeted linear: ``y = W x + (alpha / r) * B A x``, ``B`` starts at 0.
    ``task_type="SEQ_CLS"`` (a sequence classifier) also trains its score head in full.
    ``compute_dtype`` (e.g. ``torch.bfloat16``): see :func:`compute_adapters_in`.
    """
    targets = _targets(model, target_modules)
    config = _config(r, alpha, dropout, targets, task_type)
    peft_model = get_peft_model(model, config, adapter_name=adapter_name)
    if compute_dtype is not None:
        compute_adapters_in(peft_model, compute_dtype)
    return peft_model


def add_adapter(
    peft_model: PeftModel,
    name: str,
    *,
    r: int,
    alpha: float,
    dropout: float,
    target_modules: list[str] | str,
    compute_dtype: torch.dtype | None = None,
) -> None:
    """Add a second LoRA adapter (the PPO critic) on the same base; the active one is unchanged."""
    if name in peft_model.peft_config:
        raise ValueError(f"adapter {name!r} already exists: {list(peft_model.peft_config)}")
    targets = _targets(peft_model.get_base_model(), target_modules)
    active = peft_model.active_adapter
    peft_model.add_adapter(name, _config(r, alpha, dropout, targets))
    set_active(peft_model, active)
    # peft freezes inactive adapters; every adapter's own optimiser needs its weights trainable.
    for param in adapter_parameters(peft_model, name):
        param.requires_grad_(True)
    if compute_dtype is not None:
        compute_adapters_in(peft_model, compute_dtype)


class CastLinear(nn.Linear):
    """An adapter's A or B computed in ``compute_dtype``: the fp32 master weight is cast per
    call (the cast is differentiable, so its gradient lands in fp32 ``weight.grad``). A class
    (swapped in by :func:`compute_adapters_in`), not a per-module ``forward``: compiled
    decoder layers then share one guard (``speed.compile``)."""

    compute_dtype: torch.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.compute_dtype
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(x.to(dtype), self.weight.to(dtype), bias)


def compute_adapters_in(model: nn.Module, dtype: torch.dtype | None) -> int:
    """Run every LoRA A/B matmul of ``model`` in ``dtype`` (e.g. the bf16 of the base) while
    the adapter weights stay fp32 masters; ``None`` restores peft's default (the adapter's
    own dtype: fp32 matmuls, the layer input cast up per module). Returns the layers changed.

    peft's forward per adapted linear is ``y = base(x) + B(A(x)) * s``, then one cast to the
    base dtype; here ``A`` and ``B`` compute in ``dtype`` and peft's input up-cast is off,
    so ``x`` stays in the base dtype (half the saved activation) and ``B(A(x)) * s`` and the
    sum round to ``dtype``. Gradients reach the fp32 masters through the weight casts.
    Where the base is a plain frozen linear, the whole layer runs as one autograd function
    (:mod:`danka.models.lora_linear`: no elementwise pass over the layer's output).
    The fast engine's ``lora_compute="base"`` computes the same low-rank path in bf16.
    """
    changed = 0
    for module in model.modules():
        if not hasattr(module, "lora_A") or not hasattr(module, "base_layer"):
            continue
        lins = [*module.lora_A.values(), *module.lora_B.values()]
        if not all(type(lin) in (nn.Linear, CastLinear) for lin in lins):
            continue  # not a plain linear adapter: peft's own forward
        module.cast_input_dtype_enabled = dtype is None
        for lin in lins:
            if dtype is None:
                lin.__class__ = nn.Linear
                lin.__dict__.pop("compute_dtype", None)
            else:
                lin.__class__, lin.compute_dtype = CastLinear, dtype
        lora_linear.uninstall(module)
        if dtype is not None and lora_linear.fusable(module):
            lora_linear.install(module)
        changed += 1
    return changed


def set_active(model: PeftModel, name: str) -> None:
    """Route forwards through adapter ``name`` (others stay in memory, bypassed)."""
    if name not in model.peft_config:
        raise ValueError(f"no adapter {name!r}; adapters: {list(model.peft_config)}")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad and "lora_" in n}
    model.set_adapter(name)
    # set_adapter also freezes the other adapters; keep what was trainable trainable.
    for n, p in model.named_parameters():
        if n in trainable:
            p.requires_grad_(True)


@contextmanager
def reference_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block ``model`` computes the base model (all adapters off): pi_ref."""
    if not isinstance(model, PeftModel):
        raise ValueError(
            "reference_mode needs a PeftModel (LoRA); a fully fine-tuned policy needs "
            "a separate reference model"
        )
    with model.disable_adapter():
        yield model


def adapter_parameters(model: nn.Module, name: str) -> list[nn.Parameter]:
    """The LoRA weights of adapter ``name`` (for a per-adapter optimiser)."""
    return [
        p
        for n, p in model.named_parameters()
        if "lora_" in n and (f".{name}." in n or n.endswith(f".{name}"))
    ]


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (shared/tied tensors counted once)."""
    seen: set[int] = set()
    trainable = total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total
