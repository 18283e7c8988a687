"""The memory plan: GPU bytes per phase of a training step, from the model config alone.
:func:`price` turns a :class:`~danka.planning.inputs.PlanInput` and a
:class:`~danka.planning.shape.ModelShape` into a frozen :class:`MemoryPlan`; the same
pricing serves ``danka estimate`` (danka/tools/estimate.py prints it), the sizes ``auto``
stands for (danka/planning/micro.py) and the engine choice (danka/planning/engine.py).

No weights are read. The model is built on PyTorch's ``meta`` device (shapes, no storage)
to count parameters and the LoRA matrices exactly for any architecture. Every term, in
bytes (d = bytes per element of the model dtype; H hidden, I intermediate, L layers,
q = heads x head_dim, kv = kv_heads x head_dim, V vocab, T = tokens of one micro-batch):

* weights           params x d; a quantised base (``model.load_in_4bit``, QLoRA: NF4 with
                    double quantisation, 0.516 bytes per parameter; ``load_in_8bit``: 1 byte)
                    only for the decoder's linear layers, plus one dequantised weight; the
                    rest (embeddings, lm_head, norms) stays in d (danka.trainer.components.
                    freeze_quantized_base does not make peft's fp32 cast)
* LoRA              lora_params x 16 (fp32 value 4 + grad 4 + Adam m, v 8); full
                    fine-tuning: params x (d grad + 8 Adam)
* KV cache          L x 2 x kv x (prompt + new tokens) x sequences x d; the fast engine
                    allocates its CUDA-graph batch bucket of rows (8, 16, 32, ...) and the
                    length rounded up to 32
* rollout logits    sequences (fast engine: bucket rows) x V x 4 x 3 (fp32 logits, probs,
                    sampling work)
* prefill           sequences x prompt tokens x d x (4H + 2I): one layer's transient tensors;
                    the fast engine prefills each prompt once, at most 32 at a time
* activations       per layer and token, what autograd keeps for a Llama/Qwen block whose
                    base weights are frozen (the gradient only flows through them):
                    2 x H x 4 (fp32 RMSNorm inputs) + d x (2q + 2kv) (SDPA q, k, v, out)
                    + d x 3I (SwiGLU gate, up, act); plus each adapted linear's input for
                    its LoRA grads: 4 x in_features per module when the adapters are fp32
                    (peft's default on a bf16 base casts the input per module), or the
                    shared inputs in d bytes; full fine-tuning keeps every linear's input,
                    d x (2H + q + I). Times L x T. With gradient checkpointing only each
                    layer's input is kept, L x T x H x d, plus one layer recomputed in the
                    backward and fp32 gradient buffers T x (2H + I) x 4.
                    Checked on an H200 (Qwen2-0.5B shapes, bf16, SDPA, 4 x 1024 tokens):
                    predicted 39.5 / 79.5 KB per token per layer without / with fp32 LoRA
                    on all 7 projections, measured 40.2 / 80.1; with checkpointing
                    predicted 0.58 GiB, measured 0.60 GiB peak.
* logits            danka's chunked log-probs keep chunk x V x (4 + d) bytes in the update
                    (fp32 logits and their grad in d; ``speed.fused_logprob_head``, the
                    default: compiled elementwise work) or chunk x V x 4 x 4 eagerly (fp32
                    logits, log-softmax, softmax for the entropy, their grad) instead of
                    T x V x 4; chunk x V x 4 (eagerly x 2) in the no-grad log-probs;
                    chunk = min(speed.logprob_chunk_size, micro-batch x max_new_tokens):
                    the head runs over response positions only. With checkpointing the
                    head's backward ends before the first layer is recomputed, so the
                    update holds the layer inputs plus the larger of the two transients
                    (checked on an H200, Qwen2-7B shape, PPO LoRA r8, 4 x 704 tokens,
                    bench/results/small_card_24gib.json: update 1.53 GiB above the
                    weights and adapters measured, 1.64 GiB predicted)
* fast engine       the fast rollout engine (``rollout.engine: fast``, auto on a GPU) reads
                    its fused q|k|v and gate|up matrices as views of the model's own
                    (co-located) parameters: no weight copy; it holds fp32 copies of the
                    LoRA matrices and its KV cache during the rollout and frees them before
                    the update (kept in every phase only with ``rollout.keep_cache: true``)
* vLLM              ``rollout.engine: vllm`` (or ``backend.vllm.enable_vllm: true``): its
                    own weight copy, work and KV cache (danka.rollout.vllm.memory) in the
                    rollout; by default it sleeps between rollouts, so only its graphs,
                    workspaces and buffers (``VllmShare.asleep``) stay through the update
                    (with ``rollout.keep_cache: true`` the whole share, in every phase);
                    it replaces the KV cache, logits and prefill terms of the rollout
* reference         0 with LoRA (adapters off); a frozen copy (params x d) in full mode
* critic (PPO)      a second LoRA adapter + value head, or a separate model

Sequences: a micro-batch is padded to its longest sequence, so the plan prices sequences of
the longest training prompt as encoded (``danka train`` and ``danka estimate`` read the data
first: :func:`prompt_tokens`) plus ``max_new_tokens``, at most ``max_length``; without the
data, or for a tool rollout whose sequences grow turn by turn, the config's bound
(``data.max_prompt_length``, or ``max_length - max_new_tokens``).

Phases: rollout = persistent + KV cache + rollout logits + prefill; prepare (log-probs and
values, no grad) = persistent + one layer + logits; update = persistent + activations +
logits (with checkpointing: layer inputs + the larger of one layer and the logits). The
peak is PyTorch's allocated memory (what ``torch.cuda.max_memory_allocated`` reports); the
verdict adds ``OVERHEAD_BYTES`` for the CUDA context and fragmentation.
Estimates are approximate (about +-30 %).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from danka.errors import UserError
from danka.planning.inputs import PlanInput, label
from danka.planning.shape import ModelShape, load_model_config, vocab_of
from danka.rollout.base import keeps_cache
from danka.rollout.fast.options import FUSE_LIMIT_BYTES, SEQ_ROUND, decode_prompts
from danka.rollout.fast.options import PREFILL_BATCH as PREFILL_PROMPTS
from danka.rollout.fast.slots import bucket_size
from danka.rollout.vllm.memory import VllmShare, vllm_share
from danka.schema.sections import DankaConfig

GIB = 2**30
OVERHEAD_BYTES = 1 * GIB  # CUDA context (~0.5 GiB) + allocator fragmentation
MARGIN = 0.10  # a plan within 10% of the GPU's memory is "tight": the estimate is approximate
LORA_BYTES_PER_PARAM = 16  # fp32 value + fp32 grad + Adam m and v
ADAM_BYTES_PER_PARAM = 8  # fp32 m and v
LOGIT_FACTOR_UPDATE = 4  # eager head: fp32 z, log-softmax, p, grad per (row, vocab)
LOGIT_FACTOR_ROLLOUT = 3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# bytes per quantised parameter: NF4 with double quantisation (QLoRA; 4 bits + an 8-bit
# absmax per 64 + an fp32 constant per 256 blocks) and LLM.int8 (1 byte + fp32 row scales)
QUANT_BYTES = {"4bit": 0.5 + 1 / 64 + 4 / (64 * 256), "8bit": 1.0}


@dataclass(frozen=True)
class Verdict:
    """The plan against a budget of GPU memory."""

    gpu_memory: int  # bytes
    fits: bool  # peak + OVERHEAD_BYTES within the budget
    headroom: int  # bytes to spare (negative: missing)
    tight: bool  # fits, with less than MARGIN to spare
    suggestions: tuple[str, ...] = ()  # when it does not fit: settings that would


@dataclass(frozen=True)
class Assumptions:
    """What a plan assumed of the run: the engine, the sizes and the settings."""

    rollout_engine: str  # hf | fast | vllm
    rollout_cache_kept_for_update: bool  # the rollout's KV cache (and vLLM) held through it
    quantised_base: str | None  # 4bit | 8bit | None
    rollout_sequences: int  # sequences per generate call
    prompt_tokens: int
    prompt_tokens_from: str  # "data" (the longest training prompt) | the config key bounding it
    sequence_tokens: int  # prompt + response, at most max_length
    update_tokens_per_micro_batch: int
    gradient_checkpointing: bool
    lora: bool


@dataclass(frozen=True)
class MemoryPlan:
    """GPU bytes of one step's every term and phase (module docstring)."""

    dtype: str
    params: int
    lora_params: int
    components: dict[str, int]  # term -> bytes
    persistent: int  # what every phase holds
    phases: dict[str, int]  # rollout, prepare, update -> bytes
    peak_phase: str
    peak: int
    full_logits_would_be: int  # unchunked fp32 head buffers over every response row
    chunk_rows: int
    response_rows: int
    assumptions: Assumptions
    model: str = ""
    shape: dict[str, int] = field(default_factory=dict)
    overhead: int = OVERHEAD_BYTES
    verdict: Verdict | None = None  # with a budget
    vllm_share: VllmShare | None = None  # the share a vllm engine holds all run

    @property
    def need(self) -> int:
        """Bytes a card must have: the peak plus the CUDA context and fragmentation."""
        return self.peak + OVERHEAD_BYTES

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``danka estimate --json`` prints it."""
        out = {
            "dtype": self.dtype,
            "params": self.params,
            "lora_params": self.lora_params,
            "components": self.components,
            "persistent": self.persistent,
            "phases": self.phases,
            "peak_phase": self.peak_phase,
            "peak": self.peak,
            "overhead": self.overhead,
            "full_logits_would_be": self.full_logits_would_be,
            "chunk_rows": self.chunk_rows,
            "response_rows": self.response_rows,
            "assumptions": asdict(self.assumptions),
            "model": self.model,
            "shape": self.shape,
        }
        if self.vllm_share is not None:
            out["vllm_share"] = asdict(self.vllm_share)
        v = self.verdict
        if v is not None:
            out.update(
                gpu_memory=v.gpu_memory,
                fits=v.fits,
                headroom=v.headroom,
                tight=v.tight,
                suggestions=list(v.suggestions),
            )
        return out


def _layer_bytes_per_token(
    shape: ModelShape, d: int, targets: list[str] | str | None, lora_in_d: bool = False
) -> int:
    """Activation bytes one decoder layer keeps per token for the backward (module
    docstring); ``targets`` None means full fine-tuning; ``lora_in_d``: the adapters
    compute in the model's dtype (``speed.packed_update``), sharing the layer inputs."""
    h, i, q, kv = shape.H, shape.I, shape.q, shape.kv
    frozen = 2 * h * 4 + d * (2 * q + 2 * kv) + d * 3 * i
    if targets is None:
        return frozen + d * (2 * h + q + i)
    inputs = {
        "q_proj": h,
        "k_proj": h,
        "v_proj": h,
        "o_proj": q,
        "gate_proj": h,
        "up_proj": h,
        "down_proj": i,
    }
    adapted = [name for name in inputs if _targets(targets, name)]
    if d < 4 and not lora_in_d:  # fp32 adapters on a 16-bit base: an fp32 input per module
        return frozen + 4 * sum(inputs[n] for n in adapted)
    shared = {
        "q_proj": "attn_in",
        "k_proj": "attn_in",
        "v_proj": "attn_in",
        "o_proj": "o",
        "gate_proj": "mlp_in",
        "up_proj": "mlp_in",
        "down_proj": "down",
    }
    unique = {shared[n]: inputs[n] for n in adapted}
    return frozen + d * sum(unique.values())


def _targets(targets: list[str] | str, name: str) -> bool:
    if targets == "all-linear":
        return True
    if isinstance(targets, str):
        targets = [t.strip() for t in targets.split(",")]
    return name in targets


def _dtype_bytes(inp: PlanInput) -> tuple[str, int]:
    name = inp.torch_dtype
    name = "bfloat16" if name == "auto" else name  # auto = bf16 on a GPU that has it
    if name not in DTYPE_BYTES:
        raise UserError(
            f"unknown dtype {name!r}",
            where="model.torch_dtype",
            fix=f"use one of: auto, {', '.join(DTYPE_BYTES)}",
        )
    return name, DTYPE_BYTES[name]


def uses_fast_engine(inp: PlanInput) -> bool:
    """auto picks the fast engine on a GPU unless the base is quantised (danka.planning.
    engine also checks that the step fits; this plan is what it checks with)."""
    return inp.engine == "fast" or (inp.engine == "auto" and not inp.quantized)


def _persistent(inp: PlanInput, shape: ModelShape, d: int) -> dict[str, int]:
    """What every phase holds: weights, trainable state, reference and critic."""
    params, lora = shape.params, shape.lora_params
    c: dict[str, int] = {"weights": params * d}
    quant = QUANT_BYTES.get(inp.quantized or "")
    if quant:
        # bitsandbytes quantises the decoder's linear layers; embeddings, lm_head and
        # norms stay in the compute dtype (trainer.setup.freeze_quantized_base); each
        # matmul dequantises one weight transiently
        h, i, q, kv = shape.H, shape.I, shape.q, shape.kv
        lin = shape.L * ((q + 2 * kv) * h + q * h + 3 * i * h)
        c["weights"] = int(lin * quant) + (params - lin) * d + i * h * d
    if inp.enable_lora:
        c["lora + Adam (fp32)"] = lora * LORA_BYTES_PER_PARAM
    else:
        c["grads + Adam (full)"] = params * (d + ADAM_BYTES_PER_PARAM)
    if inp.reference and not inp.enable_lora:
        c["reference copy"] = params * d
    if inp.needs_critic:  # e.g. grpo with advantage_estimator gae too
        head = (shape.H + 1) * LORA_BYTES_PER_PARAM
        if inp.enable_lora and not inp.separate_critic:
            c["critic LoRA + value head"] = lora * LORA_BYTES_PER_PARAM + head
        else:  # own model, same shape assumed (its config is not read)
            trainable = (
                lora * LORA_BYTES_PER_PARAM
                if inp.enable_lora
                else params * (d + ADAM_BYTES_PER_PARAM)
            )
            c["critic model"] = params * d + trainable + head
    return c


@dataclass(frozen=True)
class _Rollout:
    """The rollout's terms (bytes by name), the sequences of one generate call, the engine
    and what the engine holds through the update."""

    terms: dict[str, int]
    sequences: int
    engine: str  # hf | fast | vllm
    held: int  # bytes kept through prepare and update
    share: VllmShare | None = None


def _rollout(
    inp: PlanInput, shape: ModelShape, d: int, seq_len: int, prompt_len: int, weights: int
) -> _Rollout:
    """The rollout's terms: KV cache, the fast engine's buffers, logits, prefill; or vLLM's
    share (``weights``: the policy's bytes, which vLLM copies)."""
    n, seqs, fast = inp.samples_per_prompt, inp.sequences_per_call(), uses_fast_engine(inp)
    h, i, q, kv, n_layers = shape.H, shape.I, shape.q, shape.kv, shape.L
    if inp.engine == "vllm":  # its own weights, work and KV cache, held all run unless it
        # sleeps between rollouts (rollout.keep_cache null or false): then only its graphs,
        # workspaces and buffers (share.asleep) stay through the update
        slot = inp.enable_lora and (inp.quantized or inp.lora_compute == "adapter")  # a LoRA
        share = vllm_share(
            shape.dims(),
            dtype_bytes=d,
            weight_bytes=weights,
            sequences=seqs,
            max_model_len=seq_len,
            adapter_bytes=shape.lora_params * d if slot else 0,
        )
        # the rollout's logits and prefill are inside vLLM's work
        c = {
            "KV cache (rollout)": share.kv_cache,
            "vLLM weights + work (held)": share.weights + share.work,
            "logits (rollout)": 0,
            "prefill (rollout)": 0,
        }
        held = share.total if keeps_cache(inp.keep_cache) else share.asleep
        return _Rollout(c, seqs, "vllm", held, share)
    # the fast engine decodes at most its max batch at once (rollout.generation_batch_size, 0:
    # MAX_BATCH rows, in whole groups; the rest of the call waits for the next decode batch)
    # in a CUDA-graph batch bucket of rows and a length rounded up to SEQ_ROUND; it prefills
    # each prompt once (at most PREFILL_PROMPTS at a time), HF generate every sequence
    prompts = seqs // n
    if fast:
        batch = min(seqs, decode_prompts(inp.generation_batch_size, n) * n)
        rows, cache_len = bucket_size(batch, True), _round_up(seq_len)
    else:
        rows, cache_len = seqs, seq_len
    prefill_rows = min(prompts, PREFILL_PROMPTS) if fast else seqs
    c = {"KV cache (rollout)": n_layers * 2 * kv * cache_len * rows * d}
    if fast:
        # fused q|k|v and gate|up are views of the co-located parameters (no copy); LoRA
        # runs unmerged from stacked fp32 adapter copies; lora_compute: merge keeps merged
        # copies of the adapted weights (<= FUSE_LIMIT_BYTES)
        merged = n_layers * ((q + 2 * kv) * h + 2 * i * h) * d
        lora = inp.enable_lora
        merge = lora and inp.lora_compute == "merge" and merged <= FUSE_LIMIT_BYTES
        c["fast engine weight buffers"] = (shape.lora_params * 4 if lora else 0) + (
            merged if merge else 0
        )
    c["logits (rollout)"] = rows * shape.V * 4 * LOGIT_FACTOR_ROLLOUT
    c["prefill (rollout)"] = prefill_rows * prompt_len * d * (4 * h + 2 * i)
    # the fast engine frees its buffers and KV cache before the update unless
    # rollout.keep_cache is true (rollout.base.keeps_cache)
    keep = fast and keeps_cache(inp.keep_cache)
    held = c["KV cache (rollout)"] + c["fast engine weight buffers"] if keep else 0
    return _Rollout(c, seqs, "fast" if fast else "hf", held)


def prompt_tokens(inp: PlanInput) -> tuple[int, str]:
    """The prompt length the plan prices, and where it comes from: the longest training
    prompt as encoded when the data has been read (a micro-batch is padded to its longest
    sequence, so no micro-batch is longer than that prompt + ``max_new_tokens``), else the
    config's bound (``data.max_prompt_length``, or ``max_length - max_new_tokens``). A
    tool or environment rollout grows its sequences turn by turn: the bound is priced."""
    bound = inp.max_prompt_length or max(1, inp.max_length - inp.max_new_tokens)
    key = "data.max_prompt_length" if inp.max_prompt_length else "trainer.max_length"
    if inp.data_prompt_tokens and not inp.tools:
        return min(inp.data_prompt_tokens, bound), "data"
    return bound, key


def sequence_tokens(inp: PlanInput) -> int:
    """The tokens of the longest sequence the plan prices (prompt + response, at most
    ``max_length``): a padding-free micro-batch holds ``micro_batch_size`` times this."""
    return min(inp.max_length, prompt_tokens(inp)[0] + inp.max_new_tokens)


def price(inp: PlanInput, shape: ModelShape) -> MemoryPlan:
    """The byte counts of every term and phase (see the module docstring) of ``inp``, whose
    sizes are numbers (danka.planning.micro resolves the ``auto`` ones first)."""
    for name in ("micro_batch_size", "generation_batch_size", "logprob_chunk_size"):
        if not isinstance(getattr(inp, name), int):
            raise TypeError(f"the plan prices a numeric {name} (danka.planning.micro)")
    dtype, d = _dtype_bytes(inp)
    h, i, v = shape.H, shape.I, shape.V
    prompt_len, prompt_from = prompt_tokens(inp)
    seq_len = sequence_tokens(inp)
    micro = min(inp.micro_batch_size, inp.batch_size * inp.samples_per_prompt)
    tokens = micro * seq_len
    # the LM head runs only over the response positions (trainer.forward.policy_logprobs)
    chunk = min(inp.logprob_chunk_size, micro * inp.max_new_tokens)
    c = _persistent(inp, shape, d)
    persistent = sum(c.values())
    rollout = _rollout(inp, shape, d, seq_len, prompt_len, c["weights"])
    c.update(rollout.terms)
    held = rollout.held
    targets = inp.target_modules if inp.enable_lora else None
    per_layer = _layer_bytes_per_token(shape, d, targets, inp.packed_update is not False)
    full_acts = shape.L * tokens * per_layer
    ckpt_acts = shape.L * tokens * h * d + tokens * per_layer + tokens * (2 * h + i) * 4
    c["activations (no checkpointing)"] = full_acts
    c["activations (checkpointing)"] = ckpt_acts
    # the head's bytes per (row, vocab): compiled on CUDA (speed.fused_logprob_head) the
    # forward keeps only fp32 z and the backward z plus dz in the head's dtype; eagerly
    # every elementwise pass keeps an fp32 buffer (z, log-softmax, p, grad)
    fused = inp.fused_logprob_head
    head_update, head_prepare = (4 + d, 4) if fused else (4 * LOGIT_FACTOR_UPDATE, 4 * 2)
    c["logits (chunked, update)"] = chunk * v * head_update
    if inp.use_gradient_checkpointing:
        # the head's backward finishes (its chunk freed) before the first layer is
        # recomputed: the layer inputs stay, the two transients take turns
        inputs = shape.L * tokens * h * d
        update_acts = inputs + max(ckpt_acts - inputs, c["logits (chunked, update)"])
    else:
        update_acts = full_acts + c["logits (chunked, update)"]
    graph_sums = _graph_sums(inp, shape, d)
    if graph_sums:
        c["CUDA-graph gradient sums (update)"] = graph_sums
    phases = {
        "rollout": persistent + sum(rollout.terms.values()),
        "prepare": persistent + held + tokens * per_layer + chunk * v * head_prepare,
        "update": persistent + held + update_acts + graph_sums,
    }
    peak_phase = max(phases, key=phases.get)
    return MemoryPlan(
        dtype=dtype,
        params=shape.params,
        lora_params=shape.lora_params if inp.enable_lora else 0,
        components=c,
        persistent=persistent,
        phases=phases,
        peak_phase=peak_phase,
        peak=phases[peak_phase],
        # the same fp32 buffers (z, log-softmax, p, grad) over every response row at once
        full_logits_would_be=micro * inp.max_new_tokens * v * 4 * LOGIT_FACTOR_UPDATE,
        chunk_rows=chunk,
        response_rows=micro * inp.max_new_tokens,
        assumptions=Assumptions(
            rollout_engine=rollout.engine,
            rollout_cache_kept_for_update=held > 0,
            quantised_base=inp.quantized,
            rollout_sequences=rollout.sequences,
            prompt_tokens=prompt_len,
            prompt_tokens_from=prompt_from,
            sequence_tokens=seq_len,
            update_tokens_per_micro_batch=tokens,
            gradient_checkpointing=inp.use_gradient_checkpointing,
            lora=inp.enable_lora,
        ),
        model=inp.model,
        shape=shape.dims(),
        vllm_share=rollout.share,
    )


def _graph_sums(inp: PlanInput, shape: ModelShape, d: int) -> int:
    """``speed.cuda_graphs``: the update's replays add each micro-batch's gradients into
    sums of their own (danka.models.body_graphs), one more gradient of every trainable
    parameter (the critic's too) for the length of the update; none with checkpointing or
    padded forwards (no graphs there)."""
    if not inp.cuda_graphs or inp.use_gradient_checkpointing or inp.packed_update is False:
        return 0
    one = shape.lora_params * 4 if inp.enable_lora else shape.params * d
    return one * (2 if inp.needs_critic else 1)


def _round_up(tokens: int) -> int:
    return -(-tokens // SEQ_ROUND) * SEQ_ROUND


def _candidates(inp: PlanInput) -> list[dict[str, Any]]:
    """Single setting changes that lower memory, as ``{field: new value}``."""
    from danka.rollout.base import halve_groups  # the engines' own halving (whole groups)

    out: list[dict[str, Any]] = []
    if not inp.use_gradient_checkpointing:
        out.append({"use_gradient_checkpointing": True})
    if inp.micro_batch_size > 1:
        out.append({"micro_batch_size": max(1, inp.micro_batch_size // 2)})
    if not inp.enable_lora:
        out.append({"enable_lora": True})
    elif not inp.quantized:
        # QLoRA: an NF4 base (bitsandbytes); the fast engine does not sample from one
        qlora: dict[str, Any] = {"load_in_4bit": True}
        if inp.engine == "fast":
            qlora["engine"] = "hf"
        out.append(qlora)
    fewer = halve_groups(inp.sequences_per_call(), inp.samples_per_prompt)
    if fewer is not None:
        out.append({"generation_batch_size": fewer})
    if inp.engine in ("fast", "auto"):
        out.append({"engine": "hf"})
    if inp.max_new_tokens > 64:
        new = inp.max_new_tokens // 2
        out.append({"max_new_tokens": new, "max_length": inp.max_length - new})
    return out


def fixes(inp: PlanInput, shape: ModelShape, budget: int) -> list[str]:
    """Settings that bring the peak + overhead under ``budget``: every single change that
    suffices; else changes applied greedily (the one that saves most first) until it fits."""
    single = []
    for change in _candidates(inp):
        peak = price(inp.with_(**change), shape).peak
        if peak + OVERHEAD_BYTES <= budget:
            single.append(f"{label(change)}  (peak {peak / GIB:.1f} GiB)")
    if single:
        return single
    applied: dict[str, Any] = {}
    trial = inp
    for _ in range(16):
        options = [
            (price(trial.with_(**ch), shape).peak, i, ch) for i, ch in enumerate(_candidates(trial))
        ]
        if not options:
            break
        peak, _, change = min(options)
        trial = trial.with_(**change)
        applied.update(change)
        if peak + OVERHEAD_BYTES <= budget:
            return [f"{label(applied)}  (peak {peak / GIB:.1f} GiB)"]
    return ["no combination of these settings fits: use a smaller model or a larger GPU"]


def judged(plan: MemoryPlan, inp: PlanInput, shape: ModelShape, budget: int) -> MemoryPlan:
    """``plan`` with its verdict against ``budget`` bytes (and the fixes when it does not
    fit)."""
    from dataclasses import replace

    fits = plan.need <= budget
    headroom = budget - plan.need
    suggestions = () if fits else tuple(fixes(inp, shape, budget))
    verdict = Verdict(budget, fits, headroom, fits and headroom < MARGIN * budget, suggestions)
    return replace(plan, verdict=verdict)


CHUNKS = (1024, 512, 256, 128)  # log-prob chunks auto tries, largest first
CHUNK_TARGET_BYTES = 640 * 2**20  # auto's chunks: at most this much fp32 logits (1024 rows of a
# 152k vocabulary: 11% faster than 128 rows in the padding-free LoRA update at the GSM8K step's
# shape, +1.5 GiB; H100, bench/results/update_shape_05b.json)


def chunk_candidates(vocab: int | None) -> list[int]:
    """The log-prob chunks auto tries for a ``vocab``-sized head, largest first: those whose
    fp32 logits (chunk x vocab x 4 bytes) take at most ``CHUNK_TARGET_BYTES``, at least the
    smallest. Per-row log-probs do not depend on the chunk: only memory and speed do."""
    if vocab is None:
        return list(CHUNKS)
    fit = [c for c in CHUNKS if c * vocab * 4 <= CHUNK_TARGET_BYTES]
    return fit or [CHUNKS[-1]]


def estimate_memory(
    cfg: DankaConfig,
    *,
    base_dir: Path | None = None,
    gpu_memory: int | None = None,
    model_config: Any = None,
) -> MemoryPlan:
    """The memory plan of ``cfg`` as written, with its verdict against ``gpu_memory``
    bytes when given. ``model_config`` skips loading the config of the actor model. A
    log-prob chunk left ``auto`` is priced as a GPU with room picks it; the other sizes
    must be numbers (``danka estimate`` plans them first: danka.planning.micro)."""
    config = model_config or load_model_config(cfg.model.actor_model_name_or_path, base_dir)
    inp = PlanInput.of(cfg)
    if inp.logprob_chunk_size == "auto":  # the default: what a GPU with room picks
        inp = inp.with_(logprob_chunk_size=chunk_candidates(vocab_of(config))[0])
    shape = ModelShape.of(config, inp.target_modules, inp.lora_r)
    plan = price(inp, shape)
    return plan if gpu_memory is None else judged(plan, inp, shape, gpu_memory)
