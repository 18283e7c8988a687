"""Several processes (``torchrun --nproc-per-node N -m danka train``): FSDP2 data parallelism.

Without torchrun (no ``WORLD_SIZE`` > 1 in the environment) nothing here is active and the
trainer runs its single-process path unchanged. With N processes:

* each rank loads the model; the trained policy is sharded with FSDP2 ``fully_shard``
  (every decoder layer, then the root; in LoRA mode the frozen base is sharded too);
* the step's prompt indices are split into N contiguous slices, one per rank, so the
  ``samples_per_prompt`` answers of a prompt (its GRPO group) stay on one rank;
* the loss of a mini-batch is normalised by GLOBAL counts (valid tokens and sequences
  summed over ranks), each rank's loss is its part of the global sum, and
  ``sync_grads`` makes every gradient the SUM over ranks (FSDP2's reduce-scatter
  averages; sharded gradients are multiplied by N), so the N-rank gradient is the
  one-process gradient:  g = sum_r d/dθ [sum_{i in r} l_i / T_global] = d/dθ L;
* metrics are reduced over ranks (mean, or sum for the losses that are partial sums);
* checkpoints are gathered to rank 0 as full (unsharded) tensors and written in the
  single-process format, so they resume on any number of processes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
import torch.distributed as td

from danka.errors import UserError

# update() metrics normalised by the global counts: each rank holds a part of the sum
SUMMED_METRICS = (
    "actor/loss",
    "actor/pg_loss",
    "actor/entropy",
    "actor/kl_loss",
    "actor/kl_token_mean",
    "rollout/logprob_gap",
)
_NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def requested() -> bool:
    """True when launched by torchrun with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def is_active() -> bool:
    return td.is_available() and td.is_initialized() and td.get_world_size() > 1


def world_size() -> int:
    return td.get_world_size() if is_active() else 1


def rank() -> int:
    return td.get_rank() if is_active() else 0


def is_main() -> bool:
    return rank() == 0


def init(device: torch.device) -> torch.device:
    """Join the process group torchrun set up; returns this rank's device (``cuda:LOCAL_RANK``
    on GPUs). Backend nccl on CUDA, gloo on CPU. No-op (returns ``device``) without torchrun."""
    if not requested():
        return device
    if device.type == "cuda":
        for key, value in _NCCL_ENV.items():  # before NCCL initialises (NVLink multicast off)
            os.environ.setdefault(key, value)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not td.is_initialized():
        td.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def destroy() -> None:
    if td.is_available() and td.is_initialized():
        td.destroy_process_group()


def check_config(cfg, engine_name: str) -> None:
    """What the N-process path supports, checked before the models load."""
    n, t = world_size(), cfg.trainer
    for key, value in (("batch_size", t.batch_size), ("mini_batch_size", t.mini_batch_size)):
        if value % n:
            raise UserError(
                f"trainer.{key} ({value}) does not split over {n} processes",
                where=f"trainer.{key}",
                fix=f"make trainer.{key} a multiple of --nproc-per-node ({n})",
            )
    from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from danka.rollout.base import ROLLOUT_ENGINES

    if not ROLLOUT_ENGINES.meta(engine_name).distributed:
        raise UserError(
            f"rollout.engine {engine_name!r} does not run on FSDP-sharded weights",
            where="rollout.engine",
            fix="set rollout.engine: hf for several processes",
        )
    if ADVANTAGE_ESTIMATORS.meta(t.advantage_estimator).needs_critic:
        raise UserError(
            "PPO with a critic (advantage_estimator gae) runs on one process only for now",
            where="trainer.advantage_estimator",
            fix="use a critic-free estimator (grpo, rloo, ...) or run without torchrun",
        )


def shard(prompt_idx: list[int]) -> list[int]:
    """This rank's contiguous slice of the step's prompts (len divisible by world_size)."""
    k = len(prompt_idx) // world_size()
    return prompt_idx[rank() * k : (rank() + 1) * k]


def all_sum(x: float) -> float:
    t = torch.tensor([float(x)], dtype=torch.float64)
    td.all_reduce(t)
    return float(t[0])


def all_mean(x: float) -> float:
    return all_sum(x) / world_size()


def reduce_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Mean over ranks (equal shards), sum for ``SUMMED_METRICS``; a key a rank lacks counts 0."""
    keys: list = [None] * world_size()
    td.all_gather_object(keys, sorted(metrics))
    names = sorted(set().union(*keys))
    t = torch.tensor([float(metrics.get(k, 0.0)) for k in names], dtype=torch.float64)
    td.all_reduce(t)
    n = world_size()
    return {k: float(v) if k in SUMMED_METRICS else float(v) / n for k, v in zip(names, t)}


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(base, "model", base)
    layers = getattr(body, "layers", None)
    if layers is None:
        raise UserError(
            f"cannot find the decoder layers of {type(base).__name__} to shard",
            where="model.actor_model_name_or_path",
            fix="use a decoder-only HF model with model.layers (Llama, Qwen, Mistral...)",
        )
    return list(layers)


def _fully_shard(model: torch.nn.Module) -> None:
    """FSDP2 per decoder layer. The embeddings, final norm and lm_head stay whole on every
    rank (danka's forward calls the decoder body and the lm_head weight directly, around
    the root module's FSDP hooks); their gradients are summed by :func:`sync_grads`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (world_size(),))
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    # HF generate then keeps stepping until every rank is done (synced_gpus): ranks whose
    # answers end early still join the other ranks' all-gathers
    for m in (model, getattr(model, "get_base_model", lambda: model)()):
        m._is_fsdp_managed_module = True


def sync_grads(params: list[torch.nn.Parameter]) -> None:
    """Make every gradient the SUM over ranks (each rank's loss is its share of the globally
    normalised loss). FSDP2's reduce-scatter averages (a divide factor of 1 needs PREMUL_SUM,
    which gloo lacks), so sharded gradients are multiplied by N; the parameters FSDP does
    not shard (plain tensors) are all-reduced here."""
    from torch.distributed.tensor import DTensor

    for p in params:
        if p.grad is None:
            continue
        if isinstance(p.grad, DTensor):
            p.grad.mul_(world_size())
        else:
            td.all_reduce(p.grad)


def shard_models(models) -> None:
    """FSDP2-shard the policy (and the full-parameter reference copy) in place and point
    ``models.actor_params`` at the sharded (DTensor) parameters, by name."""
    names = {id(p): n for n, p in models.policy.named_parameters()}
    actor_names = [names[id(p)] for p in models.actor_params]
    _fully_shard(models.policy)
    if models.reference_copy is not None:
        _fully_shard(models.reference_copy)
    params = dict(models.policy.named_parameters())
    models.actor_params = [params[n] for n in actor_names]


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


class Null:
    """Stands in for a writer on ranks that do not write: every method does nothing."""

    def __getattr__(self, name: str) -> Callable:
        return lambda *args, **kwargs: None


def quiet_logger() -> logging.Logger:
    """Non-zero ranks: warnings and errors to stderr, tagged with the rank; no file."""
    log = logging.getLogger(f"danka.rank{rank()}")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"[rank {rank()}] [%(levelname)s] %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.WARNING)
    return log


def torchrun_argv(nproc: int, argv: list[str]) -> list[str]:
    """``danka train --nproc N ...`` re-executed as ``torchrun --nproc-per-node N -m danka ...``
    (``argv`` without ``--nproc``), through ``python -m torch.distributed.run``."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--standalone"] + [
        f"--nproc-per-node={nproc}",
        "-m",
        "danka",
        *argv,
    ]
