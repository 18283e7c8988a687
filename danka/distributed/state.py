"""Full (one-process layout) state from sharded models and optimisers, and back. All
collective: every rank calls them; device tensors only go through the model's own group."""

from __future__ import annotations

import torch
import torch.distributed as td


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
    # new dicts: state_dict()'s per-parameter dicts ARE the optimizer's live state, so
    # writing the gathered tensors into them would leave plain tensors next to DTensor
    # parameters (the next step fails with "mixed torch.Tensor and DTensor")
    state["state"] = {
        index: {
            key: value.full_tensor().cpu() if isinstance(value, DTensor) else value
            for key, value in per_param.items()
        }
        for index, per_param in state["state"].items()
    }
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


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> None:
    """``opt.load_state_dict`` of a single-process (full) state, sharded first when the
    optimiser holds sharded parameters (several processes). Collective then."""

    if _active():
        state = shard_optimizer_state(opt, state)
    opt.load_state_dict(state)


def full_critic_state(models, critic_opt, policy_full: dict | None) -> tuple[dict, dict] | None:
    """What a checkpoint writes for the PPO critic, in the single-process layout: (the critic
    model's full state dict, the critic optimiser's full state); None without a critic.

    Collective under torchrun: EVERY rank calls it (before rank 0 alone writes), as for the
    policy. The LoRA critic adapter on the actor's base is already in ``policy_full`` (the
    policy's gathered state dict); a separate critic model is gathered here. The value head
    is replicated (never sharded): its live tensors are the full ones."""
    if models.value_head is None:
        return None
    if models.critic_model is models.policy and policy_full is not None:
        model_state = policy_full
    else:
        model_state = full_state_dict(models.critic_model)
    return model_state, full_optimizer_state(critic_opt)


def load_full_model(model: torch.nn.Module, folder, dtype: torch.dtype) -> None:
    """Full-parameter weights saved by ``save_pretrained`` in ``folder`` into ``model``,
    sharded or not (the policy, or a separate critic model; the critic folder's
    value_head.safetensors is not a model file and is left alone). Collective under
    torchrun (every rank reads the folder)."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).state_dict()
    if _active():
        load_full_state_dict(model, loaded)
    else:
        model.load_state_dict(loaded)


def _active() -> bool:
    """Several processes (the package's ``is_active``; repeated here so this module does not
    import its own package)."""
    return td.is_available() and td.is_initialized() and td.get_world_size() > 1
