"""Several processes (``torchrun --nproc-per-node N -m danka train``): FSDP2 data parallelism.

Without torchrun (no ``WORLD_SIZE`` > 1 in the environment) nothing here is active and the
trainer runs its single-process path unchanged. With N processes:

* each rank loads the model; the trained policy is sharded with FSDP2 ``fully_shard``
  (every decoder layer; in LoRA mode the frozen base is sharded too), or, for models whose
  weights take <= 4 GiB (``backend.fsdp.sharding: auto``), replicated: every rank holds the
  whole model and the gradients are all-reduced once per optimiser step;
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

Which group carries what (an NCCL group only takes CUDA tensors): the default group (NCCL on
GPUs, gloo on CPU) carries device tensors only, i.e. FSDP2's own collectives and
:func:`sync_grads`; every CPU-side value (counts, flags, metrics, statistics, object lists)
goes through :func:`cpu_group`, a gloo group made at :func:`init` (the default group itself
when that is gloo already).

Failure on one rank (see :func:`destroy` and :mod:`danka.distributed.launch`): the failing
rank writes its report (exit code and message) for the launcher, then leaves at once,
aborting its communicators instead of a graceful destroy that would wait for peers; a rank
that fails because of that abort finds the report and exits quietly; torchrun's agent stops
the others (SIGTERM), and ``danka train --nproc N`` prints the report once and exits with
its code (2 bad input, 3 training fault, 1 a crash), whichever rank exits first. A
non-finite loss is not a failure of one rank: every rank runs every micro-batch's backward,
then the ranks agree on the mini-batch's losses with :func:`all_finite` before the
optimiser step, so all skip the same step and reach
``trainer.max_bad_steps`` together.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator

import torch
import torch.distributed as td

from danka.distributed.state import (  # noqa: F401  (dist.full_state_dict, ...)
    full_critic_state,
    full_optimizer_state,
    full_state_dict,
    load_full_model,
    load_full_state_dict,
    load_optimizer_state,
    shard_optimizer_state,
)
from danka.errors import UserError

_CPU_GROUP = None  # gloo group for CPU-side data (set by init)


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


def backend_for(device: torch.device) -> str:
    """The default group's backend for a compute device: nccl on CUDA, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device) -> torch.device:
    """This rank's compute device: ``cuda:LOCAL_RANK`` when ``device`` is CUDA, else ``device``."""
    if device.type == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def init(device: torch.device) -> torch.device:
    """Join the process group torchrun set up; returns this rank's device (``cuda:LOCAL_RANK``
    on GPUs). Default group: nccl on CUDA, gloo on CPU; plus the gloo :func:`cpu_group`.
    No-op (returns ``device``) without torchrun. NCCL's own settings (e.g. NVLink multicast
    off on a shared host) are the environment's business: nothing is forced here."""
    global _CPU_GROUP
    if not requested():
        return device
    device = rank_device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not td.is_initialized():
        td.init_process_group(backend_for(device))
    _CPU_GROUP = td.new_group(backend="gloo") if td.get_backend() != "gloo" else td.group.WORLD
    return device


def cpu_group():
    """The group for CPU tensors and Python objects (gloo)."""
    return _CPU_GROUP if _CPU_GROUP is not None else td.group.WORLD


def destroy() -> None:
    """Leave the process group. Called while an exception propagates (a ``finally`` on the
    way out of a failed run), the communicators are ABORTED instead: a graceful destroy
    can wait for peers that are still blocked in a collective this rank will never join.

    Under :mod:`danka.distributed.launch`, first the failure is reported
    (:func:`~danka.distributed.launch.record_failure`, before the abort, so a peer failing
    because of the abort always finds it), then ``SystemExit`` replaces the exception: the
    launcher prints the report once, so this rank prints nothing, and a rank whose failure
    is a consequence of another's exits quietly too (code 1; the launcher uses the report's).
    Under plain torchrun the exception propagates as before and its rank reports it."""
    global _CPU_GROUP
    if not (td.is_available() and td.is_initialized()):
        return
    exc = sys.exc_info()[1]
    failing = exc is not None and is_active()
    _CPU_GROUP = None
    if not failing:
        # garbage cycles (FSDP state, finished collectives) can hold gloo's work objects;
        # freed at interpreter exit instead, after the group, they abort the process
        # ("terminate called without an active exception", SIGABRT) after a clean run
        gc.collect()
        td.destroy_process_group()
        return
    from torch.distributed.distributed_c10d import _abort_process_group

    from danka.distributed.launch import failure_report, record_failure

    cause = record_failure(exc, rank()) if isinstance(exc, Exception) else None
    _abort_process_group()
    if cause is not None:
        raise SystemExit(failure_report(exc)[0] if cause else 1)


def check_config(cfg, engine_name: str) -> None:
    """What the N-process path needs, checked before the models load: batch sizes that
    split over the ranks. Every rollout engine runs (the fast engine on weights gathered by
    :func:`rollout_weights`) and PPO with a critic too (see :func:`shard_models`)."""
    n, t = world_size(), cfg.trainer
    rollout = getattr(cfg, "rollout", None)
    for key, on in (
        ("speed.compile", cfg.speed.compile),
        ("rollout.compile", rollout and rollout.compile),
    ):
        if on:  # compiled forwards under FSDP2 / a replicated policy have never run here
            raise UserError(
                f"{key} is not supported with {n} processes (never run under torchrun)",
                where=key,
                fix=f"set {key}: false for torchrun runs",
            )
    for key, value in (("batch_size", t.batch_size), ("mini_batch_size", t.mini_batch_size)):
        if value % n:
            raise UserError(
                f"trainer.{key} ({value}) does not split over {n} processes",
                where=f"trainer.{key}",
                fix=f"make trainer.{key} a multiple of --nproc-per-node ({n})",
            )


def shard(prompt_idx: list[int]) -> list[int]:
    """This rank's contiguous slice of the step's prompts (len divisible by world_size)."""
    k = len(prompt_idx) // world_size()
    return prompt_idx[rank() * k : (rank() + 1) * k]


def all_sum_many(values: list[float]) -> list[float]:
    """Element-wise sums over ranks (float64, one CPU collective); identity on one process."""
    if not is_active():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    td.all_reduce(t, group=cpu_group())
    return t.tolist()


def all_sum(x: float) -> float:
    return all_sum_many([x])[0]


def all_mean(x: float) -> float:
    return all_sum(x) / world_size()


def all_finite(ok: bool | torch.Tensor) -> bool:
    """True when ``ok`` holds on EVERY rank (``ok`` a bool, or a tensor checked with
    ``torch.isfinite(...).all()``). Call it where a rank would otherwise skip work alone
    (e.g. the optimiser step after a non-finite loss: FSDP2's collectives would leave the
    others blocked), so every rank skips the same step."""
    if isinstance(ok, torch.Tensor):
        ok = bool(torch.isfinite(ok.detach()).all())
    return all_sum(0.0 if ok else 1.0) == 0.0


def global_masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """``masked_whiten`` with the mean and unbiased variance over the valid entries of ALL
    ranks: values (B_r, R) and mask (B_r, R) are this rank's rows; returns (B_r, R).

    One float64 all-reduce of (sum x, sum x^2, n), so the result equals whitening the
    concatenated batch on one process (up to float rounding):
      mean = S1 / n,  var = (S2 - n mean^2) / (n - 1)  (Bessel; 0 when n <= 1).
    On one process it is ``danka.algorithms._masked.masked_whiten``."""
    m = mask.to(values.dtype)
    s1 = float((values * m).sum(dtype=torch.float64))
    s2 = float((values * values * m).sum(dtype=torch.float64))
    s1, s2, n = all_sum_many([s1, s2, float(m.sum(dtype=torch.float64))])
    mean = s1 / max(n, 1e-8)
    var = max(s2 - n * mean * mean, 0.0) / max(n, 1e-8)
    if n > 1:
        var = var * n / (n - 1)
    whitened = (values - mean) * (var + eps) ** -0.5
    return whitened + mean if not shift_mean else whitened


def reduce_metrics(means: dict[str, float], shares: dict[str, float]) -> dict[str, float]:
    """One dict over all ranks: ``means`` averaged (equal shards), ``shares`` (values
    normalised by GLOBAL counts, so each rank holds its part of the sum) summed; a key a
    rank lacks counts 0. Each ``time/...`` key also gets ``time/..._max``, the slowest
    rank (mean vs max shows the imbalance between ranks). CPU collectives only."""
    if set(means) & set(shares):
        raise ValueError(f"keys both averaged and summed: {sorted(set(means) & set(shares))}")
    if not is_active():
        return {**means, **shares}
    local = {**means, **shares}
    keys: list = [None] * world_size()
    td.all_gather_object(keys, (sorted(means), sorted(shares)), group=cpu_group())
    names = sorted(set().union(*(set(m) | set(s) for m, s in keys)))
    summed = set().union(*(set(s) for _, s in keys))
    sums = all_sum_many([float(local.get(k, 0.0)) for k in names])
    n = world_size()
    out = {k: v if k in summed else v / n for k, v in zip(names, sums)}
    timed = [k for k in names if k.startswith("time/")]
    if timed:
        t = torch.tensor([float(local.get(k, 0.0)) for k in timed], dtype=torch.float64)
        td.all_reduce(t, op=td.ReduceOp.MAX, group=cpu_group())
        out.update({f"{k}_max": v for k, v in zip(timed, t.tolist())})
    return out


def measured_kl(in_reward: float | None, loss_share: float | None) -> float | None:
    """The step's mean KL per trained token for the adaptive controller, the same on
    every rank (collective under torchrun; every rank must call it): the reward penalty's
    mean on this rank (``in_reward``, averaged over ranks: exact for equal token counts),
    or else the loss term's (``loss_share``: this rank's share of the global per-token
    mean, summed over ranks). None when the step measured no KL."""
    if in_reward is None and loss_share is None:
        return None
    if not is_active():
        return in_reward if in_reward is not None else loss_share
    return all_mean(in_reward) if in_reward is not None else all_sum(loss_share)


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


REPLICATE_LIMIT_BYTES = 4 * 1024**3  # backend.fsdp.sharding: auto replicates up to this


def _replicate(model: torch.nn.Module) -> None:
    """Every rank keeps the whole model; its parameters and buffers are rank 0's (one
    broadcast each: the ranks start from the same weights whatever their RNG did). The
    gradients are all-reduced once per optimiser step by :func:`sync_grads` (plain
    tensors), like DDP without its per-micro-batch hooks."""
    for t in [*model.parameters(), *model.buffers()]:
        td.broadcast(t.data, src=0)
    model._danka_replicated = True


def wants_sharding(model: torch.nn.Module, sharding: str) -> bool:
    """``backend.fsdp.sharding``: shard / replicate, or auto = shard only models whose
    weights take more than REPLICATE_LIMIT_BYTES. Measured on 2 H200s (Qwen2.5-0.5B shape,
    GRPO + LoRA, 64 x 8 x 128 tokens, micro-batch 16): FSDP2's per-layer hooks and
    collectives made each rank's micro-batch ~1.5x slower than one GPU's, so a 2-GPU update
    took 4.0 s instead of 2.6 s; a small model fits whole on every GPU anyway."""
    if sharding in ("shard", "replicate"):
        return sharding == "shard"
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return size > REPLICATE_LIMIT_BYTES


def sync_grads(params: list[torch.nn.Parameter]) -> None:
    """Make every gradient the SUM over ranks (each rank's loss is its share of the globally
    normalised loss). FSDP2's reduce-scatter averages (a divide factor of 1 needs PREMUL_SUM,
    which gloo lacks), so sharded gradients are multiplied by N; the parameters FSDP does
    not shard (plain tensors) are all-reduced here."""
    from torch.distributed.tensor import DTensor

    plain: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            continue
        if isinstance(p.grad, DTensor):
            p.grad.mul_(world_size())
        else:
            plain.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    # replicated gradients: one all-reduce per bucket of <= BUCKET_ELEMENTS, not per tensor
    for grads in plain.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            bucket.append(g)
            size += g.numel()
            if size >= BUCKET_ELEMENTS:
                _all_reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            _all_reduce_bucket(bucket)


BUCKET_ELEMENTS = 64 * 1024**2  # 128 MiB of bf16 gradients per all-reduce


def _all_reduce_bucket(grads: list[torch.Tensor]) -> None:
    if len(grads) == 1:
        td.all_reduce(grads[0])
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    td.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """The global L2 norm of the gradients of ``params`` and, when ``max_norm`` > 0, the
    gradients scaled by min(1, max_norm / (norm + 1e-6)) (``clip_grad_norm_``'s rule).

    Call after :func:`sync_grads`. ``params`` may mix FSDP-sharded (DTensor) and replicated
    (plain) parameters, e.g. a sharded critic adapter and its value head, or the sharded
    layers and the whole embeddings of a full-parameter policy, which torch's
    ``clip_grad_norm_`` refuses. The sharded part's squared norm is summed over ranks (one
    collective on the gradients' device); the replicated part is the same on every rank, so
    every rank gets the same norm and the same scale."""
    if not is_active():
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        return float(norm)
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    sharded = [g.to_local() for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    device = (sharded or plain)[0].device
    sq_sharded = torch.zeros((), dtype=torch.float32, device=device)
    for g in sharded:
        sq_sharded += torch.linalg.vector_norm(g, dtype=torch.float32) ** 2
    td.all_reduce(sq_sharded)  # device tensor on the default group
    sq = sq_sharded + sum(
        (torch.linalg.vector_norm(g, dtype=torch.float32).to(device) ** 2 for g in plain),
        torch.zeros((), dtype=torch.float32, device=device),
    )
    norm = float(sq.sqrt())
    if max_norm > 0 and math.isfinite(norm):
        scale = min(1.0, max_norm / (norm + 1e-6))
        for g in grads:
            g.mul_(scale)
    return norm


def _renamed(
    params: list, before: dict[int, tuple], after: dict[tuple, torch.nn.Parameter]
) -> list:
    """``params`` re-pointed, by name, at a sharded model's parameters; parameters outside
    that model (the value head) stay as they are."""
    return [after[before[id(p)]] if id(p) in before else p for p in params]


def shard_models(models, sharding: str = "shard") -> str:
    """FSDP2-shard the models of a run in place (or, per :func:`wants_sharding`, replicate
    them: see :func:`_replicate`), then point ``models.actor_params`` and
    ``models.critic_params`` at the sharded (DTensor) parameters, by name. Returns
    ``"sharded"`` or ``"replicated"`` (decided on the policy, applied to every model).

    * policy (and its LoRA adapters, the PPO ``critic`` adapter included): sharded;
    * full-parameter reference copy and a separate critic model: sharded the same way;
    * value head: NOT sharded (a few KB): replicated on every rank, its gradient summed by
      :func:`sync_grads` (plain tensors are all-reduced), so every rank keeps the same copy.
    """
    models_to_shard = [models.policy]
    for extra in (models.reference_copy, models.critic_model):
        if extra is not None and all(extra is not m for m in models_to_shard):
            models_to_shard.append(extra)
    if not wants_sharding(models.policy, sharding):
        for m in models_to_shard:
            _replicate(m)
        if models.value_head is not None:
            _replicate(models.value_head)
        return "replicated"
    before = {id(p): (i, n) for i, m in enumerate(models_to_shard) for n, p in m.named_parameters()}
    for m in models_to_shard:
        _fully_shard(m)
    after = {(i, n): p for i, m in enumerate(models_to_shard) for n, p in m.named_parameters()}
    models.actor_params = _renamed(models.actor_params, before, after)
    models.critic_params = _renamed(models.critic_params, before, after)
    return "sharded"


@contextlib.contextmanager
def rollout_weights(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Full (unsharded) weights for generation with an engine that reads the parameters
    directly (the fast engine), then sharded again. Inside, every FSDP2 module's
    parameters are plain full tensors (``FSDPModule.unshard()``: one all-gather of the
    model per rollout, all modules issued before waiting). Each rank then generates for its
    own prompts with the whole model, as on one GPU; memory for the rollout is that of the
    unsharded model (the one-GPU figure), the sharded savings return for the update.
    No-op on one process. Collective: every rank must enter it."""
    if not is_active():
        yield model
        return
    from torch.distributed.fsdp import FSDPModule

    fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]
    handles = [m.unshard(async_op=True) for m in fsdp]
    for h in handles:
        if h is not None:
            h.wait()
    try:
        yield model
    finally:
        for m in fsdp:
            m.reshard()


def barrier() -> None:
    if is_active():
        td.barrier(group=cpu_group())


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
    (``argv`` without ``--nproc``), through :mod:`danka.distributed.launch`, which exits
    with the failing rank's own code (2, 3, ...) and no launcher traceback."""
    from danka.distributed.launch import launcher_argv

    return launcher_argv(["--standalone", f"--nproc-per-node={nproc}", "-m", "danka", *argv])
