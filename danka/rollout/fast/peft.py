"""What the fast engine reads of a (peft-wrapped) HF causal LM: the model inside the
wrappers, the module a layer forwards to, its base layer and its active LoRA adapters.
Shared by the weight loader (:mod:`danka.rollout.fast.weights`) and the parameter
co-location (:mod:`danka.rollout.fast.colocate`)."""

from __future__ import annotations

from torch import nn

from danka.errors import UserError

FALLBACK = "set rollout.engine: hf (HF generate runs every architecture transformers supports)"


def unsupported(what: str, model_type: str) -> UserError:
    return UserError(
        f"the fast rollout engine cannot run this {model_type!r} model: {what}",
        where="rollout.engine",
        fix=FALLBACK,
    )


def active_module(mod: nn.Module) -> nn.Module:
    """The module a peft ``ModulesToSaveWrapper`` currently forwards to (else ``mod``)."""
    if hasattr(mod, "modules_to_save") and hasattr(mod, "original_module"):
        active = list(getattr(mod, "active_adapters", []) or [])
        if getattr(mod, "disable_adapters", False) or not active:
            return mod.original_module
        return mod.modules_to_save[active[0]]
    return mod


def lora_adapters(mod: nn.Module) -> list[str]:
    """Active, unmerged LoRA adapters of a peft LoRA layer ([] for a plain module)."""
    if not hasattr(mod, "lora_A") or not hasattr(mod, "base_layer"):
        return []
    if getattr(mod, "disable_adapters", False) or getattr(mod, "merged", False):
        return []  # disabled: base only; merged: the base weight already holds the delta
    emb = getattr(mod, "lora_embedding_A", {})
    names = [a for a in mod.active_adapters if a in mod.lora_A or a in emb]
    for a in names:
        if a in getattr(mod, "lora_variant", {}) or getattr(mod, "use_dora", {}).get(a, False):
            raise unsupported(f"adapter {a!r} is a LoRA variant (DoRA...)", "peft")
    return names


def base_layer(mod: nn.Module) -> nn.Module:
    mod = active_module(mod)
    return mod.get_base_layer() if hasattr(mod, "base_layer") else mod
