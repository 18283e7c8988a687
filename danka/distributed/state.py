"""Full (one-process layout) state from sharded models and optimisers, and back. All
collective: every rank calls them; device tensors only go through the model's own group."""

from __future__ import annotations

import torch


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on rank 0 (CPU), empty elsewhere. Collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options())


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Load full tensors (every rank holds them) into a sharded model; returns unexpected keys."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    known = set(dict(model.named_parameters())) | set(dict(model.named_buffers()))
    unexpected = [k for k in state if k not in known]
    set_model_state_dict(
        model,
        {k: v for k, v in state.items() if k in known},
        options=StateDictOptions(full_state_dict=True, strict=False),
    )
    return unexpected


def full_optimizer_state(opt: torch.optim.Optimizer) -> dict:
    """``opt.state_dict()`` with every sharded (DTensor) state gathered to a full CPU tensor:
    the single-process format (states keyed by parameter index). Collective."""
    from torch.distributed.tensor import DTensor

    state = opt.state_dict()
    for per_param in state["state"].values():
        for key, value in per_param.items():
            if isinstance(value, DTensor):
                per_param[key] = value.full_tensor().cpu()
    return state


def shard_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> dict:
    """The inverse: full tensors of a single-process state dict become DTensors laid out
    like their parameters, ready for ``opt.load_state_dict``. Collective."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for group in opt.param_groups for p in group["params"]]
    for index, per_param in state["state"].items():
        p = params[int(index)]
        if not isinstance(p, DTensor):
            continue
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor) and value.shape == p.shape:
                per_param[key] = distribute_tensor(
                    value.to(p.device_mesh.device_type), p.device_mesh, p.placements
                )
    return state
