"""Zero-copy weights for the fast engine: each layer's projections stored back to back.

:func:`colocate` moves the base weights of every projection group ([q, k, v], [o],
[gate, up], [down]) into one new buffer per group, in place (same ``nn.Parameter``
objects, same values, only the storage moves), with rows reserved right after the group
for its live LoRA adapters' stacked A matrices. The engine then reads a fused matrix as a
view of the model's own weights (:func:`adjacent`) and folds A into the projection's GEMM
in the reserved rows (:func:`folded_view`): no weight copy, and every optimizer step is
seen without re-copying. Used by :mod:`danka.rollout.fast.weights`.
"""

from __future__ import annotations

import torch
from torch import nn

from danka.rollout.fast.peft import active_module, base_layer, lora_adapters


def adjacent(ts: list[torch.Tensor]) -> torch.Tensor | None:
    """One view over tensors stored back to back (same storage, contiguous, each starting
    where the one before ends: what :func:`colocate` leaves), stacked along dim 0; else
    None. The view is made without autograd history (callers run under no_grad)."""
    first = ts[0]
    if first.device.type == "meta" or type(first.data) is not torch.Tensor:
        return None  # DTensor (FSDP2) or meta: never a plain storage
    ptr = first.untyped_storage().data_ptr()
    offset = first.storage_offset()
    for t in ts:
        same = (
            t.dtype == first.dtype and t.device == first.device and t.shape[1:] == first.shape[1:]
        )
        if not (same and t.is_contiguous() and t.untyped_storage().data_ptr() == ptr):
            return None
        if t.storage_offset() != offset:
            return None
        offset += t.numel()
    shape = (sum(t.shape[0] for t in ts), *first.shape[1:])
    return first.detach().as_strided(shape, first.stride(), first.storage_offset())


def _fused_groups(root: nn.Module) -> list[list[nn.Module]]:
    """The modules of each layer's projections, as the engine stacks them: [q, k, v], [o],
    [gate, up], [down]."""
    out = []
    for layer in root.model.layers:
        a, f = layer.self_attn, layer.mlp
        out += [[a.q_proj, a.k_proj, a.v_proj], [a.o_proj], [f.gate_proj, f.up_proj], [f.down_proj]]
    return out


def _adapter_rank(mods: list[nn.Module]) -> int:
    """Summed rank of the active LoRA adapters of ``mods`` (what the engine stacks)."""
    rank = 0
    for m in mods:
        active = active_module(m)
        rank += sum(
            active.lora_A[a].weight.shape[0] for a in lora_adapters(active) if a in active.lora_A
        )
    return rank


# the ``nn.Parameter`` attribute colocate() leaves on a group's first weight: (rows of A it
# reserved after the group, the data_ptr it had then)
RESERVED = "_danka_reserved_rows"


@torch.no_grad()
def colocate(root: nn.Module) -> int:
    """Store each projection group's base weights (and biases) back to back in one new
    buffer, in place: every ``nn.Parameter`` keeps its identity and values, only its
    storage moves (``param.data = buffer[rows]``), so optimizers, peft and the trainer see
    no change and the engine reads the fused matrix as a view (:func:`adjacent`). When the
    group has live LoRA adapters, rows for their stacked A matrices are reserved right
    after the weights (recorded in ``RESERVED``): the engine folds A into the projection's
    GEMM there (``lora_compute: base``) without copying W. Skipped for groups already in
    place, of mixed dtypes/devices, quantised, or sharded (DTensor) weights, and under
    ``torch.distributed`` (each rank's parameters are the wrappers' to place). Peak cost:
    one group's size while it moves. Returns the number of tensor groups moved."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return 0
    moved = 0
    for mods in _fused_groups(root):
        bases = [base_layer(m) for m in mods]
        rank = _adapter_rank(mods)
        for attr in ("weight", "bias"):
            ps = [getattr(b, attr, None) for b in bases]
            extra = rank if attr == "weight" else 0
            if not _movable(ps) or _in_place(ps, extra):
                continue
            if len(ps) == 1 and not extra:
                continue  # one module, nothing to reserve: already "fused"
            rows = sum(p.shape[0] for p in ps)
            buf = torch.zeros(
                (rows + extra, *ps[0].shape[1:]), dtype=ps[0].dtype, device=ps[0].device
            )
            r = 0
            for p in ps:
                n = p.shape[0]
                buf[r : r + n].copy_(p)
                p.data = buf[r : r + n]
                r += n
            if extra:
                setattr(ps[0], RESERVED, (extra, ps[0].data_ptr()))
            moved += 1
    return moved


def _movable(ps: list) -> bool:
    if any(not isinstance(p, nn.Parameter) for p in ps):
        return False
    if not all(p.is_floating_point() and type(p.data) is torch.Tensor for p in ps):
        return False
    same = all(p.dtype == ps[0].dtype and p.device == ps[0].device for p in ps)
    return same and ps[0].device.type != "meta"


def _in_place(ps: list, extra: int) -> bool:
    """Already back to back (with ``extra`` reserved rows when asked)."""
    if adjacent(ps) is None:
        return False
    return not extra or reserved_rows(ps[0]) == extra


def reserved_rows(w: torch.Tensor) -> int:
    """Rows colocate() reserved after the group starting with weight ``w`` (0: none, or
    the weight moved since)."""
    rows, ptr = getattr(w, RESERVED, (0, None))
    return rows if ptr == w.data_ptr() else 0


def folded_view(parts: list, rank: int) -> torch.Tensor | None:
    """``[W; A-rows]`` of a co-located group with ``rank`` reserved rows, as one view of the
    parameters' own storage (None when the group was not co-located for this rank)."""
    ws = [p[0] for p in parts]
    if rank == 0:
        return None
    base = adjacent(ws) if len(ws) > 1 else ws[0]
    if base is None or not base.is_contiguous() or reserved_rows(ws[0]) != rank:
        return None
    shape = (base.shape[0] + rank, base.shape[1])
    return ws[0].detach().as_strided(shape, (base.shape[1], 1), ws[0].storage_offset())
