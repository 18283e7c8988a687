"""CUDA graphs of the padding-free training forward (``speed.cuda_graphs``): a micro-batch's
decoder body (decoder layers and final norm; the embedding stays eager), forward and
backward, replayed as two graphs instead of launched kernel by kernel.

Why: at the GSM8K step's shape the LoRA update is bound by the host, not the GPU. Its
kernels take as long as full-parameter's (1.21 vs 1.20 s), but the GPU is busy 52% of the
update against 88% (H100, ``update_fused_05b.json``). 168 adapted linears launch their
kernels one by one, forward and backward, for every micro-batch. A replay launches a whole
micro-batch at once.

How (one :class:`Session` per update or log-prob phase; its graphs and their memory are
dropped at its end, before the rollout needs the memory):

- A micro-batch laid end to end (:class:`~danka.models.varlen.Flat`, T real tokens) is
  padded to the session's fixed ``tokens`` (:func:`static_layout`). ``tokens`` is the
  micro-batch budget: micro_batch_size x the planned sequence length. The cumulative
  lengths are padded to a fixed count: the real sequences, then the padding as sequences of
  at most ``max_len`` tokens (attention stays inside each), then empty ones. The real
  tokens' hidden states are the unpadded forward's.
- The body is captured once per adapter state and grad mode (the actor's adapter, the
  critic's, adapters off). Forward runs on a side stream. With grad on, a backward graph
  (``torch.autograd.grad`` of the captured output into the trainable parameters) adds the
  gradients into the session's accumulators.
- A micro-batch copies its position ids, cumulative lengths and (eager) embeddings into the
  static inputs and replays the forward graph. Its backward replays the second graph and
  hands the embeddings' gradient back to autograd.
- :func:`flush` runs before every optimiser step: it adds the accumulators into ``.grad``
  and zeroes them.

A micro-batch that does not fit runs eagerly, with the same numbers up to rounding
(``tests/models/test_body_graphs_gpu.py``). That covers more tokens than the budget, a
longer sequence, or too many sequences. So does one that fills less than half the budget,
where replaying the padding would cost more than it saves.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext

import torch

from danka.models import varlen

log = logging.getLogger(__name__)
MIN_MEAN_SEQ = 32  # the static cumulative lengths hold tokens / 32 sequences (+ padding)
_session: list[Session] = []  # the open session, if any (one owner: :func:`session`)
_streams: dict[torch.device, torch.cuda.Stream] = {}  # the capture stream, per device
_warmed: set[tuple[torch.device, bool]] = set()  # (device, grad): lazy init done there
failures: list[str] = []  # a capture that failed: the run's forwards stay eager from then on


def static_layout(
    flat: varlen.Flat, tokens: int, max_len: int, n_cu: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``flat`` padded to ``tokens`` tokens and ``n_cu`` cumulative lengths, as
    ``(input_ids (1, tokens), position_ids (1, tokens), cu_seqlens (n_cu,) int32)``; the
    padding is sequences of at most ``max_len`` tokens after the real ones, then empty
    sequences. None when ``flat`` does not fit."""
    real, b = flat.tokens, flat.cu_seqlens.numel() - 1
    pad = tokens - real
    pieces = -(-pad // max_len) if pad > 0 else 0
    if pad < 0 or flat.max_len > max_len or b + pieces + 1 > n_cu:
        return None
    ids = flat.input_ids.new_zeros((1, tokens))
    ids[:, :real] = flat.input_ids
    pos = flat.position_ids.new_zeros((1, tokens))
    pos[:, :real] = flat.position_ids
    device = flat.cu_seqlens.device
    if pad:
        pos[0, real:] = torch.arange(pad, device=device) % max_len
    cu = flat.cu_seqlens.new_full((n_cu,), tokens)
    cu[: b + 1] = flat.cu_seqlens
    ends = real + max_len * torch.arange(1, pieces + 1, device=device)
    cu[b + 1 : b + 1 + pieces] = ends.clamp(max=tokens).to(cu.dtype)
    return ids, pos, cu


class _Graph:
    """One captured body (decoder layers and final norm; the embedding stays eager):
    static inputs, the forward graph, and with grad on the backward graph that adds the
    trainable parameters' gradients into the session's sums."""

    def __init__(self, decoder, s: Session, grad: bool):
        device = s.device
        embed = decoder.get_input_embeddings()  # runs eagerly: its backward syncs the host
        with torch.no_grad():
            probe = embed(torch.zeros((1, 1), dtype=torch.long, device=device))
        self.emb = torch.zeros((1, s.tokens, probe.shape[-1]), dtype=probe.dtype, device=device)
        self.pos = torch.arange(s.tokens, device=device)[None] % s.max_len
        self.cu = torch.full((s.n_cu,), s.tokens, dtype=torch.int32, device=device)
        starts = torch.arange(0, s.tokens, s.max_len, device=device)
        self.cu[: len(starts)] = starts.to(torch.int32)
        inner = {id(p) for p in embed.parameters()}
        params = [
            p for p in decoder.parameters() if grad and p.requires_grad and id(p) not in inner
        ]
        self.emb_grad = grad and any(p.requires_grad for p in embed.parameters())
        self.emb.requires_grad_(self.emb_grad)

        def body() -> torch.Tensor:
            return varlen.eager_forward(decoder, None, self.pos, self.cu, s.max_len, self.emb)

        for p in params:  # outside the graphs' pool: they outlive every replay
            s.acc.setdefault(p, torch.zeros_like(p))
        if device not in _streams:
            _streams[device] = torch.cuda.Stream(device)
        stream = _streams[device]
        stream.wait_stream(torch.cuda.current_stream(device))
        inputs = params + ([self.emb] if self.emb_grad else [])
        if (device, grad) not in _warmed:  # cuBLAS, FlashAttention: lazy init outside a capture
            with torch.cuda.stream(stream):
                out = body()
                if inputs:
                    torch.autograd.grad(out, inputs, torch.zeros_like(out), allow_unused=True)
            _warmed.add((device, grad))
        self.fwd = torch.cuda.CUDAGraph()
        out = _captured(self.fwd, s.pool, stream, body)
        self.bwd, self.trained, self.gemb = None, [], None
        if inputs:
            self.gout = torch.empty_like(out)

            def backward() -> None:
                grads = list(torch.autograd.grad(out, inputs, self.gout, allow_unused=True))
                self.gemb = grads.pop() if self.emb_grad else None
                used = [(p, g) for p, g in zip(params, grads) if g is not None]
                self.trained = [p for p, _ in used]
                if used:
                    torch._foreach_add_([s.acc[p] for p in self.trained], [g for _, g in used])

            self.bwd = torch.cuda.CUDAGraph()
            _captured(self.bwd, s.pool, stream, backward)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.out = out.detach()

    def embed(self, decoder, layout) -> torch.Tensor:
        """The static inputs loaded with ``layout``; its embeddings (1, tokens, H), computed
        eagerly (differentiable when the embedding trains)."""
        ids, pos, cu = (t.to(self.pos.device, non_blocking=True) for t in layout)
        self.pos.copy_(pos)
        self.cu.copy_(cu)
        return decoder.get_input_embeddings()(ids)


def _captured(graph: torch.cuda.CUDAGraph, pool, stream, fn):
    """``fn()`` captured into ``graph`` on ``stream`` (``torch.cuda.graph`` without its
    ``gc.collect()``: seconds in a large process). The allocator's cache is emptied first:
    a capture cannot free cached blocks for the graphs' pool, so under ``speed.gpu_memory``
    the blocks the last phase left would otherwise make it run out."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool)
        try:
            return fn()
        finally:
            graph.capture_end()


class _Replay(torch.autograd.Function):
    """The forward graph's output as a differentiable tensor of the embeddings ``emb``:
    its backward replays the backward graph. The body's gradients land in the session's
    sums, not through autograd; the embeddings' (a trained embedding) go on through
    autograd; ``anchor`` makes autograd call it when the embedding is frozen."""

    @staticmethod
    def forward(ctx, graph: _Graph, emb: torch.Tensor, anchor: torch.Tensor):
        graph.emb.detach().copy_(emb)
        graph.fwd.replay()
        ctx.graph = graph
        return graph.out.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        graph = ctx.graph
        graph.gout.copy_(grad)
        graph.bwd.replay()
        return None, (graph.gemb.clone() if graph.gemb is not None else None), None


class Session:
    """The graphs of one phase at one micro-batch budget (module docstring)."""

    def __init__(self, tokens: int, max_len: int, device: torch.device):
        self.tokens, self.max_len, self.device = tokens, max_len, device
        self.n_cu = tokens // MIN_MEAN_SEQ + -(-tokens // max_len) + 1
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple, _Graph] = {}
        self.acc: dict[torch.nn.Parameter, torch.Tensor] = {}
        self.anchor = torch.zeros((), device=device, requires_grad=True)
        self.pending: dict[torch.nn.Parameter, None] = {}  # accumulated since the flush
        self.counts = {"replayed": 0, "eager": 0, "captured": 0}

    def hidden(self, decoder, flat: varlen.Flat) -> torch.Tensor | None:
        """Hidden states (T, H) of ``flat`` through a replay, or None: run it eagerly."""
        layout = None
        if 2 * flat.tokens >= self.tokens and not _checkpointed(decoder) and not failures:
            layout = static_layout(flat, self.tokens, self.max_len, self.n_cu)
        if layout is None:
            self.counts["eager"] += 1
            return None
        grad = torch.is_grad_enabled()
        key = (id(decoder), _adapters(decoder), grad, decoder.training)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key, decoder, grad)
            if graph is None:
                return None
        emb = graph.embed(decoder, layout)
        self.counts["replayed"] += 1
        if graph.bwd is None:
            graph.emb.copy_(emb)
            graph.fwd.replay()
            return graph.out[: flat.tokens]
        self.pending.update(dict.fromkeys(graph.trained))
        return _Replay.apply(graph, emb, self.anchor)[: flat.tokens]

    def _capture(self, key: tuple, decoder, grad: bool) -> _Graph | None:
        try:
            graph = self.graphs[key] = _Graph(decoder, self, grad)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - an op that cannot be captured: stay correct
            failures.append(f"{type(err).__name__}: {err}"[:300])
            log.warning("speed.cuda_graphs: capture failed (%s); forwards run eagerly", err)
            torch.cuda.synchronize(self.device)
            self.counts["eager"] += 1
            return None
        self.counts["captured"] += 1
        return graph

    def flush(self) -> None:
        """Accumulated gradients into ``.grad`` (before an optimiser step), then zeroed."""
        if not self.pending:
            return
        acc = [self.acc[p] for p in self.pending]
        for p, a in zip(self.pending, acc):
            if p.grad is None:
                p.grad = a.clone()
            else:
                p.grad.add_(a)
        torch._foreach_zero_(acc)
        self.pending.clear()


def _adapters(decoder) -> tuple | None:
    """What a LoRA-adapted body computes with: its active adapters and whether they are
    off (peft's state, the same on every adapted layer); None without adapters."""
    for module in decoder.modules():
        if hasattr(module, "lora_A") and hasattr(module, "active_adapters"):
            return tuple(module.active_adapters), bool(module.disable_adapters)
    return None


def _checkpointed(decoder) -> bool:
    return bool(getattr(decoder, "gradient_checkpointing", False)) and decoder.training


def current() -> Session | None:
    return _session[-1] if _session else None


def flush() -> None:
    """:meth:`Session.flush` of the open session (nothing without one)."""
    if _session:
        _session[-1].flush()


@contextmanager
def _open(tokens: int, max_len: int, device: torch.device):
    s = Session(tokens, max_len, device)
    _session.append(s)
    try:
        yield s
    finally:
        _session.remove(s)
        s.graphs.clear()


def session(tokens: int, max_len: int, device):
    """The context a phase runs its micro-batches in: graphs at a budget of ``tokens``
    tokens (sequences of at most ``max_len``) on a CUDA ``device`` in one process, else
    nothing changes."""
    device = torch.device(device)
    ranks = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not (device.type == "cuda" and tokens > 0 and max_len > 0) or ranks:
        return nullcontext(None)  # several ranks: FSDP's collectives stay eager
    return _open(tokens, -(-max_len // 64) * 64, device)
