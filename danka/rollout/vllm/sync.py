"""What the vLLM engine is sent after the policy changed: the changed tensors under their
HF names, the LoRA adapters merged into their weights, or the adapter itself.

Which tensors changed: those an optimiser stepped (a global post-step hook marks every
parameter that had a gradient; fused optimisers update in place without bumping
``_version``, so the version counter alone misses them), plus any whose storage or
``_version`` moved since the last sync (a checkpoint loaded into the model). The first sync
sends everything (the engine starts from dummy weights).

Three ways to follow the policy (``lora_mode``):

* full-parameter (no LoRA): the changed parameters;
* ``merge`` (LoRA on a 16/32-bit base): ``W + s * B @ A`` (fp32 sum, rounded once to the
  model dtype) of each adapted linear whose adapter or base changed, as TRL hands vLLM a
  LoRA policy; the other tensors as in full-parameter;
* ``adapter`` (LoRA, the only way on a 4-bit base): the active adapter saved in peft's
  format to a fresh folder, loaded by vLLM as a LoRA under a fresh id; the base is sent
  once (or, quantised, loaded by vLLM from its own files).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from danka.models.unwrap import unwrap_causal_lm
from danka.rollout.fast.peft import active_module, lora_adapters


class StepMarks:
    """Parameters an optimiser stepped since the last ``take`` (a global optimiser
    post-step hook; ``close`` removes it)."""

    def __init__(self):
        self.stepped: set[int] = set()
        self._handle = register_optimizer_step_post_hook(self._hook)

    def _hook(self, optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            self.stepped.update(id(p) for p in group["params"] if p.grad is not None)

    def take(self) -> set[int]:
        out, self.stepped = self.stepped, set()
        return out

    def close(self) -> None:
        self._handle.remove()


def peft_model(model: nn.Module) -> nn.Module | None:
    """The peft ``PeftModel`` a policy is (or wraps, under torch.compile), else None."""
    model = getattr(model, "_orig_mod", model)
    return model if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else None


def hf_name(name: str) -> str:
    """A parameter's name in the HF checkpoint: peft's ``.base_layer`` dropped."""
    return name.replace(".base_layer.", ".")


@dataclass(frozen=True)
class Update:
    """What one sync sends: tensors under their HF names, and (adapter mode) the folder of
    a freshly saved adapter (None: the adapter did not change)."""

    tensors: list[tuple[str, torch.Tensor]]
    adapter_path: str | None = None


class WeightSync:
    """Tracks a policy and says what the engine needs after it changed. ``lora_mode``:
    "full" (no LoRA), "merge" or "adapter"; ``send_base`` False: the engine loaded the
    (quantised) base itself, only the adapter is ever sent."""

    def __init__(self, lora_mode: str, send_base: bool = True):
        self.lora_mode = lora_mode
        self.send_base = send_base
        self.marks = StepMarks()
        self.seen: dict[int, tuple[int, int]] = {}  # id -> (data_ptr, _version) at last sync
        self.synced = False
        self._adapter_dir: Path | None = None
        self.adapter_id = 0

    def close(self) -> None:
        self.marks.close()
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)

    def forget(self) -> None:
        """The engine lost what it was sent (vLLM slept): the next update sends everything
        again, the adapter under a fresh id."""
        self.synced = False

    def _changed(self, params: list[nn.Parameter]) -> set[int]:
        """Ids of ``params`` changed since the last call (all of them the first time)."""
        stepped = self.marks.take()
        out = set()
        for p in params:
            sig = (p.data_ptr(), p._version)
            if not self.synced or id(p) in stepped or self.seen.get(id(p)) != sig:
                out.add(id(p))
            self.seen[id(p)] = sig
        self.synced = True
        return out

    def update(self, model: nn.Module) -> Update:
        """What changed since the last call, in the form the engine takes (module
        docstring)."""
        hf = unwrap_causal_lm(model)
        params = dict(hf.named_parameters())
        changed = self._changed(list(params.values()))
        adapted = _adapted_modules(hf) if self.lora_mode == "merge" else {}
        out: list[tuple[str, torch.Tensor]] = []
        for name, mod in adapted.items():
            sources = [_base(mod).weight] + [t for lo in _loras(mod) for t in lo[:2]]
            if any(id(t) in changed for t in sources):
                out.append((f"{name}.weight", merged_weight(mod)))
        merged = {f"{n}.weight" for n in adapted}
        for name, p in params.items():
            if "lora_" in name or id(p) not in changed or not self.send_base:
                continue  # adapters are merged above or saved below
            key = hf_name(name)
            if key not in merged:
                out.append((key, p.detach()))
        path = None
        if self.lora_mode == "adapter":
            active = peft_model(model).active_adapter
            mine = [p for n, p in params.items() if "lora_" in n and f".{active}." in n]
            if any(id(p) in changed for p in mine):
                path = self._save_adapter(model)
        return Update(out, path)

    def _save_adapter(self, model: nn.Module) -> str:
        """The active adapter saved in peft's format to a fresh folder (the previous one
        removed): the folder vLLM loads it from."""
        peft = peft_model(model)
        name = peft.active_adapter
        if self._adapter_dir is None:
            self._adapter_dir = Path(tempfile.mkdtemp(prefix="danka_vllm_lora_"))
        self.adapter_id += 1
        folder = self._adapter_dir / str(self.adapter_id)
        peft.save_pretrained(str(folder), selected_adapters=[name], save_embedding_layers=False)
        shutil.rmtree(self._adapter_dir / str(self.adapter_id - 1), ignore_errors=True)
        return str(folder if name == "default" else folder / name)


def _base(mod: nn.Module) -> nn.Module:
    mod = active_module(mod)
    return mod.get_base_layer() if hasattr(mod, "base_layer") else mod


def _loras(mod: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """(A, B, scale) of each active, unmerged adapter of a peft LoRA linear."""
    return [
        (mod.lora_A[a].weight, mod.lora_B[a].weight, float(mod.scaling[a]))
        for a in lora_adapters(mod)
        if a in mod.lora_A
    ]


def _adapted_modules(hf: nn.Module) -> dict[str, nn.Module]:
    """HF module name -> peft LoRA linear with an active adapter."""
    return {name: mod for name, mod in hf.named_modules() if _loras(mod)}


@torch.no_grad()
def merged_weight(mod: nn.Module) -> torch.Tensor:
    """``W + sum_a s_a * B_a @ A_a`` of a peft LoRA linear: fp32 sum, rounded once to the
    base weight's dtype (the training forward adds the low-rank path to ``W x`` in the
    same order of magnitude; the rounding is the only difference)."""
    w = _base(mod).weight
    acc = w.float().clone()
    for a, b, scale in _loras(mod):
        acc.addmm_(b.float(), a.float(), alpha=scale)
    return acc.to(w.dtype)
