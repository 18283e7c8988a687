"""The fast rollout engine: own static-KV decode loop, captured in CUDA graphs.

Why: on one card the rollout dominates RL time, and HF ``generate`` for a small model is
bound by Python and kernel launches. This engine runs Llama-family decoders (Llama,
SmolLM2, Qwen2) with its own forward (:mod:`danka.rollout.fast.model`):

1. read the weights LIVE from the model: q/k/v and gate/up fused as views of the model's
   own parameters, stored back to back once (:mod:`danka.rollout.fast.colocate`); LoRA
   adapters applied unmerged (:mod:`danka.rollout.fast.weights`);
2. prefill the left-padded prompts once per prompt, copy the keys/values ``n`` times into a
   static cache ``(layers, B, Hkv, T, D)``, sample the first token;
3. decode: one token per step for all sequences (embed -> layers -> sample -> bookkeeping,
   all on the device); with Triton attention the layers run fused kernels
   (:mod:`danka.rollout.fast.triton_step`) and one graph serves every step, as the kernel reads
   the live bound on the device; with SDPA attention reads only the live cache slots,
   rounded up to a multiple of ``live_chunk``, one graph per length. On CUDA the step is
   captured in a ``torch.cuda.CUDAGraph`` and replayed; on CPU it runs eagerly;
4. finished sequences (EOS) are tracked on the device; the host checks "all finished"
   every ``check_every`` steps only.

Memory, sized to the work: the engine holds no weight copy (only a live adapter's small
stacked B copies); the KV cache holds the call's rows for its longest prompt plus
``max_new_tokens``, rounded up to ``seq_round`` (32) slots, and is staged
(:mod:`danka.rollout.fast.staged`): the rows first hold the prompt + ``first_stage`` new
tokens, then the rows still going move, compacted, into the full-length cache, and move
again into a batch of half the rows or fewer whenever enough of them have finished. By
default (``keep_cache`` None or False) all of it (KV cache, buffers, graphs) is freed at the
end of each call, i.e. before the trainer's update, and the graphs are captured again at the
next call. ``keep_cache=True`` keeps one full-size cache between calls (it then only grows;
no staging). ``release()`` frees it on demand.
"""

from __future__ import annotations

import logging
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from danka.data.template import left_pad
from danka.errors import UserError
from danka.models.unwrap import unwrap_causal_lm
from danka.rollout.base import (
    RolloutEngine,
    Sampled,
    SamplingParams,
    halve_groups,
)
from danka.rollout.fast.colocate import colocate
from danka.rollout.fast.model import decode_forward, decode_layer, prefill, rope_tables
from danka.rollout.fast.options import (
    FastExperiments,
    FastOptions,
    FastPath,
    decode_prompts,
    resolve_lora_compute,
    resolve_path,
)
from danka.rollout.fast.sampling import check_eos_ids, sample_next
from danka.rollout.fast.slots import Slots, bucket_size, draw_seed
from danka.rollout.fast.staged import run_staged
from danka.rollout.fast.weights import (
    ModelSpec,
    Owned,
    Weights,
    fused_copy_bytes,
    load_weights,
    model_spec,
)

log = logging.getLogger("danka.rollout")

_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream graph warm-ups run on: one per device for the whole process. A new
    stream per capture leaked memory: cuBLAS keeps a workspace per (handle, stream) for the
    process's lifetime (32 MiB on an H200), so with ``keep_cache=False`` (graphs re-captured
    every call) each call kept 5 x 32 MiB more (H200, 2026-12-01: +0.156 GiB a step)."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


class FastEngine(RolloutEngine):
    """Static-KV decode engine for Llama/Qwen2 decoders; see the module docstring."""

    name = "fast"

    def __init__(
        self, options: FastOptions | None = None, experiments: FastExperiments | None = None
    ):
        """``options``: what the config sets (``rollout.*``, help per field in
        :class:`FastOptions`); ``experiments``: geometry and A/B switches (tests, benchmarks).
        What runs is decided per model by :func:`resolve_path` and logged."""
        self.options = options or FastOptions()
        self.experiments = x = experiments or FastExperiments()
        self.max_batch = self.options.max_batch  # halved on out-of-memory (halve_batch)
        self.lora_compute = resolve_lora_compute(self.options.lora_compute)
        self.check_every = max(1, int(x.check_every))
        self.prefill_batch = max(1, int(x.prefill_batch))
        self.seq_round = max(8, int(x.seq_round))
        self.live_chunk = max(0, int(x.live_chunk))
        self.first_stage = max(0, int(x.first_stage))
        self._layer = (
            torch.compile(decode_layer, dynamic=None) if self.options.compile_step else None
        )
        self._path: FastPath | None = None  # the last path run (logged when it changes)
        self.stats: dict[str, float] = {}  # last call: graphs captured, capture_s, steps
        self.release()

    @classmethod
    def configured(cls, **settings) -> FastEngine:
        """``rollout.*`` settings (FastOptions' fields) -> the engine."""
        return cls(FastOptions(**settings))

    def halve_batch(self, n: int, total: int) -> tuple[int, int] | None:
        current = min(self.max_batch, total)
        smaller = halve_groups(current, n)
        if smaller is None:
            return None
        self.release()  # the KV cache and graphs were sized to the larger batch
        self.max_batch = smaller
        return current, smaller

    def release(self) -> None:
        """Free the KV cache, weight buffers and CUDA graphs (the next call rebuilds them)."""
        self._spec: ModelSpec | None = None
        self._owned = Owned(lora_compute=getattr(self, "lora_compute", "adapter"))
        self._k = self._v = self._cos = self._sin = None
        self._slots: dict[tuple[int, int], Slots] = {}
        self._pool = None
        self._weight_ptrs: tuple[int, ...] = ()
        self._owner = None  # the FastSession whose prefixes the cache holds, if any
        # The engine samples with its own generator, registered with its CUDA graphs: code
        # that saves/restores the default CUDA RNG (e.g. activation checkpointing) between
        # replays then cannot corrupt a captured graph's RNG state.
        self._gen: torch.Generator | None = None

    def sample(self, model, prompt_ids, params, eos_ids, pad_id, generator) -> Sampled:
        """``RolloutEngine.sample``; the log-probs are log_softmax(logits / temperature) of
        each sampled token (temperature 1 when greedy), before top-k/top-p filtering."""
        if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
            raise UserError("a prompt has no tokens", where="rollout", fix="drop empty prompts")
        if params.max_new_tokens < 1 or params.n < 1:
            raise UserError(
                f"max_new_tokens={params.max_new_tokens} and n={params.n} must be >= 1",
                where="rollout",
                fix="set rollout.max_new_tokens and rollout.n to positive values",
            )
        check_eos_ids(eos_ids)
        root, w, graphs = self._prepare(model, generator)
        per_batch = decode_prompts(self.max_batch, params.n)
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        try:
            for i in range(0, len(prompt_ids), per_batch):
                toks, lps = self._run(
                    root, w, prompt_ids[i : i + per_batch], params, eos_ids, pad_id, graphs
                )
                responses += toks
                logprobs += lps
        finally:
            if not self._path.keep_cache:
                self.release()
        return responses, logprobs

    def session(self, model, *, eos_ids, pad_id, generator=None):
        """A :class:`~danka.rollout.fast.session.FastSession`: generate turn after turn for
        the same samples, re-using each one's KV cache for the prefix it already holds."""
        from danka.rollout.fast.session import FastSession

        return FastSession(self, model, eos_ids=eos_ids, pad_id=pad_id, generator=generator)

    def _prepare(self, model, generator):
        """Per call: the model's spec and live weights (re-fused if they changed), whether
        to capture graphs, and the engine's generator seeded from ``generator``."""
        root = unwrap_causal_lm(model)
        spec = model_spec(root)  # raises UserError for unsupported models
        if spec != self._spec:
            path = resolve_path(
                self.options, self.experiments, spec.device, fused_copy_bytes(root, spec)
            )
            self.release()
            self._spec = spec
            self._owned.fuse = path.fuse_weights
            if path != self._path:
                log.info(path.line())
            self._path = path
        graphs = self._path.cuda_graphs
        if self.experiments.colocate_weights:
            colocate(root)  # a no-op once done (and after any later move of the weights)
        w = load_weights(root, spec, self._owned)
        ptrs = tuple(t.data_ptr() for t in w.values() if t is not None)
        if ptrs != self._weight_ptrs:  # a live parameter moved: graphs point at the old one
            for st in self._slots.values():
                st.graphs.clear()
            self._pool = None  # a pool whose graphs are all gone cannot take new captures
            self._weight_ptrs = ptrs
        self.stats = {"graphs_captured": 0, "capture_s": 0.0, "steps": 0, "compactions": 0}
        if self._gen is None:
            self._gen = torch.Generator(device=spec.device)
        self._gen.manual_seed(draw_seed(generator))
        return root, w, graphs

    def _ensure_cache(self, root: torch.nn.Module, b: int, t: int, keep: bool = False) -> None:
        """Grow the shared KV cache to at least (b, t); growing drops every graph and, unless
        ``keep``, the cached keys/values (``keep`` copies them over: old and new cache are
        both alive for that moment)."""
        spec = self._spec
        if self._k is not None and b <= self._k.shape[1] and t <= self._k.shape[3]:
            return
        old = (self._k, self._v) if keep and self._k is not None else None
        if self._k is not None:
            b, t = max(b, self._k.shape[1]), max(t, self._k.shape[3])
        self._slots.clear()
        self._pool = None  # a pool whose graphs are all gone cannot take new captures
        self._k = self._v = None  # free before allocating the bigger one
        shape = (spec.layers, b, spec.kv_heads, t, spec.head_dim)
        self._k = torch.zeros(shape, dtype=spec.dtype, device=spec.device)
        self._v = torch.zeros(shape, dtype=spec.dtype, device=spec.device)
        if old is not None:
            _, ob, _, ot, _ = old[0].shape
            self._k[:, :ob, :, :ot] = old[0]
            self._v[:, :ob, :, :ot] = old[1]
        self._cos, self._sin = rope_tables(root, spec, t)

    def _run(self, root, w, prompts, params: SamplingParams, eos_ids, pad_id, graphs: bool):
        """Generate for one decode batch -> (token lists, log-prob lists), one per sample."""
        n, new = params.n, params.max_new_tokens
        rows = len(prompts) * n
        plen = max(len(p) for p in prompts)
        t = -(-(plen + new) // self.seq_round) * self.seq_round
        first = -(-(plen + self.first_stage) // self.seq_round) * self.seq_round
        if not self._path.keep_cache and self.first_stage and first < t:
            return run_staged(self, root, w, prompts, params, eos_ids, pad_id, graphs, first, t)
        self._owner = None  # the cache no longer holds a session's prefixes
        st, key, k, v = self._slots_for(root, rows, t, params, eos_ids, pad_id, graphs)
        self._ensure_graph(w, st, key, k, v, graphs, plen, new)

        lens = self._prefill_prompts(w, st, key, k, v, prompts, n, pad_id)
        return self._decode(w, st, key, k, v, lens, plen, new, graphs)

    def _prefill_prompts(self, w, st: Slots, key, k, v, prompts, n: int, pad_id) -> torch.Tensor:
        """Prefill the left-padded prompts (cache slots ``[0, plen)``, each prompt's keys and
        values copied to its ``n`` rows) and sample each row's first token into output
        column 0 -> the rows' prompt lengths (rows,)."""
        spec = self._spec
        plen = max(len(p) for p in prompts)
        for j in range(0, len(prompts), self.prefill_batch):
            part = prompts[j : j + self.prefill_batch]
            ids, mask = left_pad(part, pad_id, width=plen, device=spec.device)
            r = slice(j * n, (j + len(part)) * n)
            logits = prefill(w, spec, ids, mask, self._cos, self._sin, k, v, r, n)
            self._sample_first(st, key, logits.repeat_interleave(n, dim=0), r)
        return torch.tensor([len(p) for p in prompts], device=spec.device).repeat_interleave(n)

    def _slots_for(self, root, rows, t, params, eos_ids, pad_id, graphs, keep=False):
        """The static slots of the (bucket, t) batch that runs ``rows`` sequences, filled
        with the sampling settings, its graph key and its views of the KV cache."""
        b = bucket_size(rows, graphs)
        self._ensure_cache(root, b, t, keep=keep)
        st = self._slots.get((b, t))
        if st is None:
            st = self._slots[(b, t)] = Slots.new(b, t, self._spec.device)
        key = self._fill_settings(st, params, eos_ids, pad_id)
        return st, key, self._k[:, :b, :, :t], self._v[:, :b, :, :t]

    @staticmethod
    def _fill_settings(st: Slots, params: SamplingParams, eos_ids, pad_id):
        """Write the sampling settings into ``st``; its graph key (greedy, top-k, top-p on)."""
        st.temperature.fill_(max(params.temperature, 1e-6))
        st.top_p.fill_(params.top_p)
        st.pad.fill_(pad_id)
        st.eos.fill_(-1)
        st.eos[: len(eos_ids)] = torch.tensor(eos_ids, dtype=torch.long)
        return (
            params.greedy,
            0 if params.greedy else params.top_k,
            not params.greedy and params.top_p < 1.0,
        )

    def live_length(self, slot: int, t: int) -> int:
        """Cache slots the decode step writing ``slot`` attends over: ``slot + 1`` rounded
        up to a multiple of ``live_chunk``, at most the capacity ``t`` (``t`` itself when
        ``live_chunk`` is 0, and with Triton attention, which reads the live bound from the
        device: one graph serves every step, so a call captures once)."""
        triton = self._path is not None and self._path.attention == "triton"
        c = 0 if triton else self.live_chunk
        return t if c == 0 else min(t, -(-(slot + 1) // c) * c)

    def _ensure_graph(self, w, st: Slots, key, k, v, graphs: bool, plen: int, new: int):
        """Capture the decode step for ``key`` at every live length that decoding ``new``
        tokens after slot ``plen - 1`` reaches, once each. The warm-up of length L writes
        cache slot L - 1 >= ``plen``: call it while slots >= plen hold nothing to be read."""
        if not graphs:
            return
        t = k.shape[3]
        for live in sorted({self.live_length(s, t) for s in range(plen, plen + new - 1)}):
            if (key, live) not in st.graphs:
                step = lambda live=live: self._step(w, st, k, v, key, live)  # noqa: E731
                st.graphs[(key, live)] = self._capture(st, step, live)

    def _sample_first(self, st: Slots, key, logits: torch.Tensor, r: slice) -> None:
        """The first token of rows ``r`` from their prefill logits, into output column 0."""
        tok0, lp0 = self._sample(st, key, logits)
        st.out_tok[r, 0] = tok0
        st.out_lp[r, 0] = lp0

    def _sample(self, st: Slots, key, logits: torch.Tensor):
        """Next tokens and log-probs of ``logits`` (b, V) under the batch's sampling settings
        (``key``: greedy, top-k, top-p on)."""
        top_p = st.top_p if key[2] else None
        return sample_next(
            logits,
            greedy=key[0],
            temperature=st.temperature,
            top_k=key[1],
            top_p=top_p,
            gen=self._gen,
            fused=self._path.fused_sampling,
        )

    def _start_decode(self, st: Slots, lens: torch.Tensor, plen: int) -> None:
        """The decode state after a prefill: row i holds ``lens[i]`` tokens ending at slot
        ``plen - 1``; its first sampled token is in output column 0."""
        rows = len(lens)
        st.tok.fill_(st.pad)
        st.tok[:rows] = st.out_tok[:rows, 0]
        st.pos.zero_()
        st.pos[:rows] = lens
        st.start.zero_()
        st.start[:rows] = plen - lens
        st.done.fill_(True)
        st.done[:rows] = (st.tok[:rows, None] == st.eos[None, :]).any(-1)
        st.slot.fill_(plen)
        st.gen.fill_(1)

    def _decode_steps(
        self,
        w,
        st: Slots,
        key,
        k,
        v,
        plen: int,
        ran: int,
        new: int,
        cap: int,
        graphs: bool,
        stop_alive: int = 0,
    ) -> tuple[int, bool]:
        """Decode steps from step ``ran`` until ``new - 1`` steps ran, every row finished, the
        cache of ``cap`` slots is full, or a check finds at most ``stop_alive`` rows still
        going (the staged decode then moves them to a smaller batch) -> (steps run in all,
        whether decoding is over)."""
        t = k.shape[3]
        while ran < new - 1 and plen + ran < cap:
            live = self.live_length(plen + ran, t)  # this step writes slot plen + ran
            graph = st.graphs.get((key, live)) if graphs else None
            graph.replay() if graph is not None else self._step(w, st, k, v, key, live)
            ran += 1
            if ran % self.check_every == 0:
                alive = int(st.done.logical_not().sum())  # the check's one host sync
                if alive == 0:
                    return ran, True
                if alive <= stop_alive and ran < new - 1:
                    return ran, False
        return ran, ran >= new - 1 or bool(st.done.all())

    def _decode(self, w, st: Slots, key, k, v, lens: torch.Tensor, plen: int, new: int, graphs):
        """Decode after a prefill: sequence i holds ``lens[i]`` tokens ending at slot
        ``plen - 1`` and its first token is in output column 0; run up to ``new - 1`` steps
        -> (token lists, log-prob lists) of the ``len(lens)`` sequences."""
        rows = len(lens)
        self._start_decode(st, lens, plen)
        ran, _ = self._decode_steps(w, st, key, k, v, plen, 0, new, k.shape[3], graphs)
        self.stats["steps"] += ran
        return st.out_tok[:rows, : ran + 1].tolist(), st.out_lp[:rows, : ran + 1].tolist()

    def _step(self, w: Weights, st: Slots, k, v, key, live: int) -> None:
        """One decode step over cache slots ``[0, live)``, entirely on the device (this is
        what a CUDA graph holds)."""
        if live < k.shape[3]:
            k, v = k[:, :, :, :live], v[:, :, :, :live]
        # Masked decode attention: memory-efficient kernel (graph-safe, takes the mask);
        # cuDNN attention is left out on purpose, its graph capture has had bugs.
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            logits = decode_forward(
                w,
                self._spec,
                st.tok,
                st.pos,
                st.slot,
                st.start,
                self._cos,
                self._sin,
                k,
                v,
                layer=self._layer,
                attention=self._path.attention,
                fused=self._path.fused_step,
                fp32=not self._path.fused_sampling,  # the Triton sampler reads bf16
            )
        tok, lp = self._sample(st, key, logits)
        tok = torch.where(st.done, st.pad, tok)
        lp = lp.masked_fill(st.done, 0.0)
        st.out_tok.index_copy_(1, st.gen, tok[:, None])
        st.out_lp.index_copy_(1, st.gen, lp[:, None])
        st.done.logical_or_((tok[:, None] == st.eos[None, :]).any(-1))
        st.tok.copy_(tok)
        st.pos.add_(1)
        st.slot.add_(1)
        st.gen.add_(1)

    def _capture(self, st: Slots, step, live: int) -> torch.cuda.CUDAGraph:
        """Warm the step up on a side stream, then capture it. Each warm-up step writes cache
        slot ``live - 1`` (see ``_ensure_graph``) and output column T - 2; the call resets
        every other piece of state it touches before decoding."""
        t0 = time.perf_counter()
        st.pos.zero_()
        st.start.zero_()
        st.done.zero_()
        st.tok.zero_()
        side = capture_stream(st.tok.device)
        side.wait_stream(torch.cuda.current_stream())
        # Warm up with a scratch generator, so a call that captures samples the same
        # tokens for a given seed as a call that replays.
        real_gen, self._gen = self._gen, torch.Generator(device=self._gen.device)
        with torch.cuda.stream(side):
            for _ in range(2):  # cuBLAS/SDPA workspaces and kernel choice happen here
                st.slot.fill_(live - 1)
                st.gen.fill_(st.out_tok.shape[1] - 2)
                step()
        self._gen = real_gen
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            # One pool for all graphs: they never run concurrently and keep no live
            # tensors (every result goes to a static buffer allocated outside capture).
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self._gen)
        # captured on the warm-up's stream: torch's own default capture stream would be a
        # third stream with a cuBLAS workspace of its own (32 MiB on an H200) for the process
        with torch.cuda.graph(graph, pool=self._pool, stream=side):
            step()
        torch.cuda.synchronize()
        self.stats["graphs_captured"] += 1
        self.stats["capture_s"] += time.perf_counter() - t0
        return graph
