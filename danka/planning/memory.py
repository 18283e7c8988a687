"""The memory plan: GPU bytes per phase of a training step, from the model config alone.
One model serves ``danka estimate`` (danka/tools/estimate.py prints it) and the trainer's
engine choice (danka/planning/engine.py).

No weights are read. The model is built on PyTorch's ``meta`` device (shapes, no storage)
to count parameters and the LoRA matrices exactly for any architecture. Every term, in
bytes (d = bytes per element of the model dtype; H hidden, I intermediate, L layers,
q = heads x head_dim, kv = kv_heads x head_dim, V vocab, T = tokens of one micro-batch):

* weights           params x d; a quantised base (``model.load_in_4bit``, QLoRA: NF4 with
                    double quantisation, 0.516 bytes per parameter; ``load_in_8bit``: 1 byte)
                    only for the decoder's linear layers, plus one dequantised weight; the
                    rest (embeddings, lm_head, norms) stays in d (danka.trainer.setup.
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
* reference         0 with LoRA (adapters off); a frozen copy (params x d) in full mode
* critic (PPO)      a second LoRA adapter + value head, or a separate model

Phases: rollout = persistent + KV cache + rollout logits + prefill; prepare (log-probs and
values, no grad) = persistent + one layer + logits; update = persistent + activations +
logits (with checkpointing: layer inputs + the larger of one layer and the logits). The
peak is PyTorch's allocated memory (what ``torch.cuda.max_memory_allocated`` reports); the
verdict adds ``OVERHEAD_BYTES`` for the CUDA context and fragmentation.
Estimates are approximate (about +-30 %).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from danka.config.schema import DankaConfig
from danka.errors import UserError

GIB = 2**30
FUSE_LIMIT_BYTES = GIB  # = danka.rollout.fast_weights.FUSE_LIMIT_BYTES
SEQ_ROUND = 32  # = FastEngine(seq_round=32): KV cache length rounded up to this
PREFILL_PROMPTS = 32  # = FastEngine(prefill_batch=32): prompts per prefill forward
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


def _known_shapes() -> dict[str, Callable[[], Any]]:
    from danka.models.tiny import qwen2_0_5b_config, qwen2_7b_config, smollm2_135m_config

    shapes: dict[str, Callable[[], Any]] = {}
    for family in ("qwen/qwen2", "qwen/qwen2.5"):
        for suffix in ("", "-instruct"):
            shapes[f"{family}-7b{suffix}"] = qwen2_7b_config
            shapes[f"{family}-0.5b{suffix}"] = qwen2_0_5b_config
    shapes["huggingfacetb/smollm2-135m-instruct"] = smollm2_135m_config
    shapes["smollm2-135m-instruct"] = smollm2_135m_config
    return shapes


def load_model_config(name: str, base_dir: Path | None = None) -> Any:
    """The transformers config of ``name`` without weights: a local folder, a ``.gguf``
    file, the HF cache, danka's table of known shapes (Qwen2/2.5 0.5B and 7B, SmolLM2-135M),
    then the Hub when it answers."""
    from transformers import AutoConfig

    from danka.safe_read import refuse_special_files

    for candidate in (Path(name).expanduser(), (base_dir or Path.cwd()) / name):
        if candidate.is_dir():  # a pipe inside would block transformers' open
            refuse_special_files(candidate, what=f"model folder {candidate}",
                                 fix="give a model folder of regular files")  # fmt: skip
        if candidate.is_dir() and (candidate / "config.json").is_file():
            return AutoConfig.from_pretrained(str(candidate))
        if candidate.is_file() and candidate.suffix == ".gguf":
            return AutoConfig.from_pretrained(str(candidate.parent), gguf_file=candidate.name)
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        pass
    known = _known_shapes().get(name.lower())
    if known is not None:
        return known()
    from danka.models.loading import hub_reachable

    if hub_reachable(timeout=3.0):
        try:
            return AutoConfig.from_pretrained(name)
        except (OSError, ValueError) as err:
            raise UserError(
                f"no model config for {name!r}: {err}",
                where="model",
                fix="check the model id or pass a local folder",
            ) from err
    raise UserError(
        f"no model config for {name!r}: not a local folder, not in the HF cache, "
        "not a known shape, and the Hub cannot be reached",
        where="model.actor_model_name_or_path",
        fix="pass a local model folder (only its config.json is read)",
    )


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def count_parameters(config: Any, target_modules: list[str] | str, rank: int) -> tuple[int, int]:
    """``(params, lora_params)`` of the model ``config`` describes, built on the meta device.

    LoRA adds ``r x (in + out)`` per adapted linear layer (Hu et al. 2021); ``all-linear``
    adapts every linear layer but the LM head, as peft does.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    if isinstance(target_modules, str) and target_modules != "all-linear":
        target_modules = [t.strip() for t in target_modules.split(",") if t.strip()]
    head = model.get_output_embeddings()
    lora = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        short = name.rsplit(".", 1)[-1]
        hit = module is not head if target_modules == "all-linear" else short in target_modules
        if hit:
            lora += rank * (module.in_features + module.out_features)
    return params, lora


def _targets(targets: list[str] | str, name: str) -> bool:
    if targets == "all-linear":
        return True
    if isinstance(targets, str):
        targets = [t.strip() for t in targets.split(",")]
    return name in targets


def _layer_bytes_per_token(shape: dict[str, int], d: int, targets: list[str] | str | None) -> int:
    """Activation bytes one decoder layer keeps per token for the backward (module
    docstring); ``targets`` None means full fine-tuning."""
    h, i, q, kv = shape["H"], shape["I"], shape["q"], shape["kv"]
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
    if d < 4:  # fp32 adapters on a 16-bit base: one fp32 copy of the input per module
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


def _estimator_meta(cfg: DankaConfig):
    """The advantage estimator's registry entry (a critic? grouped?): the config's own
    choice, or the one its algorithm implies (validation fills the same default)."""
    from danka.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from danka.algorithms.presets import ALGORITHMS

    t = cfg.trainer
    name = (
        t.advantage_estimator
        or ALGORITHMS.get(t.algorithm, "trainer.algorithm").advantage_estimator
    )
    return ADVANTAGE_ESTIMATORS.meta(name)


def samples_per_prompt_of(cfg: DankaConfig) -> int:
    n = cfg.trainer.samples_per_prompt
    return n if n is not None else (8 if _estimator_meta(cfg).grouped else 1)


def sequences_per_call(cfg: DankaConfig) -> int:
    """Sequences in one generate call: ``rollout.generation_batch_size`` counts sequences,
    and the engines fill a call with whole groups of ``samples_per_prompt`` (at least one,
    danka.rollout.hf / fast); 0 = the whole step's ``batch_size x samples``."""
    n = samples_per_prompt_of(cfg)
    every = cfg.trainer.batch_size * n
    per_call = cfg.rollout.generation_batch_size
    return min(every, max(1, per_call // n) * n) if per_call else every


def _dtype_bytes(cfg: DankaConfig) -> tuple[str, int]:
    name = cfg.model.torch_dtype
    name = "bfloat16" if name == "auto" else name  # auto = bf16 on a GPU that has it
    if name not in DTYPE_BYTES:
        raise UserError(
            f"unknown dtype {name!r}",
            where="model.torch_dtype",
            fix=f"use one of: auto, {', '.join(DTYPE_BYTES)}",
        )
    return name, DTYPE_BYTES[name]


def _plan(cfg: DankaConfig, shape: dict[str, int], params: int, lora: int) -> dict[str, Any]:
    """The byte counts of every term and phase (see the module docstring)."""
    from danka.rollout.fast import bucket_size

    t, m = cfg.trainer, cfg.model
    dtype, d = _dtype_bytes(cfg)
    h, i, n_layers, v = shape["H"], shape["I"], shape["L"], shape["V"]
    q, kv = shape["q"], shape["kv"]
    n = samples_per_prompt_of(cfg)
    seqs = sequences_per_call(cfg)
    prompt_len = cfg.data.max_prompt_length or max(1, t.max_length - t.max_new_tokens)
    seq_len = min(t.max_length, prompt_len + t.max_new_tokens)
    micro = min(t.micro_batch_size, t.batch_size * n)
    tokens = micro * seq_len
    # the LM head runs only over the response positions (trainer.forward.policy_logprobs)
    chunk = min(cfg.speed.logprob_chunk_size, micro * t.max_new_tokens)
    use_lora = cfg.lora.enable_lora
    ppo = _estimator_meta(cfg).needs_critic  # e.g. grpo with advantage_estimator gae too
    need_ref = cfg.loss.kl.coef > 0

    c: dict[str, int] = {"weights": params * d}
    quant = QUANT_BYTES.get("4bit" if m.load_in_4bit else "8bit" if m.load_in_8bit else "")
    if quant:
        # bitsandbytes quantises the decoder's linear layers; embeddings, lm_head and
        # norms stay in the compute dtype (trainer.setup.freeze_quantized_base); each
        # matmul dequantises one weight transiently
        lin = n_layers * ((q + 2 * kv) * h + q * h + 3 * i * h)
        c["weights"] = int(lin * quant) + (params - lin) * d + i * h * d
    if use_lora:
        c["lora + Adam (fp32)"] = lora * LORA_BYTES_PER_PARAM
    else:
        c["grads + Adam (full)"] = params * (d + ADAM_BYTES_PER_PARAM)
    if need_ref and not use_lora:
        c["reference copy"] = params * d
    if ppo:
        separate = m.critic_model_name_or_path not in (None, "", m.actor_model_name_or_path)
        head = (h + 1) * LORA_BYTES_PER_PARAM
        if use_lora and not separate:
            c["critic LoRA + value head"] = lora * LORA_BYTES_PER_PARAM + head
        else:  # own model, same shape assumed (its config is not read)
            c["critic model"] = (
                params * d
                + (lora * LORA_BYTES_PER_PARAM if use_lora else params * (d + ADAM_BYTES_PER_PARAM))
                + head
            )
    persistent = sum(c.values())

    engine = cfg.rollout.engine
    # auto picks the fast engine on a GPU unless the base is quantised (rollout.base.
    # choose_engine also checks that the step fits; the estimate is what it checks with)
    vllm = engine == "vllm" or (engine == "auto" and cfg.backend.vllm.enable_vllm)
    fast = not vllm and (engine == "fast" or (engine == "auto" and not quant))
    # the fast engine runs a CUDA-graph batch bucket of rows and a length rounded up to
    # SEQ_ROUND; it prefills each prompt once (at most PREFILL_PROMPTS at a time), HF
    # generate every sequence
    prompts = seqs // n
    rows, cache_len = (bucket_size(seqs, True), _round_up(seq_len)) if fast else (seqs, seq_len)
    prefill_rows = min(prompts, PREFILL_PROMPTS) if fast else seqs
    c["KV cache (rollout)"] = n_layers * 2 * kv * cache_len * rows * d
    if fast:
        # fused q|k|v and gate|up are views of the co-located parameters (no copy); LoRA
        # runs unmerged from stacked fp32 adapter copies; lora_compute: merge keeps merged
        # copies of the adapted weights (<= 1 GiB)
        merged = n_layers * ((q + 2 * kv) * h + 2 * i * h) * d
        merge = use_lora and cfg.rollout.lora_compute == "merge" and merged <= FUSE_LIMIT_BYTES
        c["fast engine weight buffers"] = (lora * 4 if use_lora else 0) + (merged if merge else 0)
    # the fast engine frees its buffers and KV cache before the update unless
    # rollout.keep_cache is true (its keeps_cache)
    keep = fast and bool(cfg.rollout.keep_cache)
    held = c["KV cache (rollout)"] + c["fast engine weight buffers"] if keep else 0
    c["logits (rollout)"] = rows * v * 4 * LOGIT_FACTOR_ROLLOUT
    c["prefill (rollout)"] = prefill_rows * prompt_len * d * (4 * h + 2 * i)
    share = None
    if vllm:  # its own weights, work and KV cache, held all run (danka.rollout.vllm_memory)
        from danka.rollout.vllm_memory import vllm_share

        slot = use_lora and (quant or cfg.rollout.lora_compute == "adapter")  # a vLLM LoRA
        share = vllm_share(shape, dtype_bytes=d, weight_bytes=c["weights"], sequences=seqs,
                           max_model_len=seq_len, adapter_bytes=lora * d if slot else 0)  # fmt: skip
        c["KV cache (rollout)"] = held = share.kv_cache
        c["vLLM weights + work (held)"] = share.weights + share.work
        c["logits (rollout)"] = c["prefill (rollout)"] = 0  # inside vLLM's work
        held += share.weights + share.work
    per_layer = _layer_bytes_per_token(shape, d, cfg.lora.target_modules if use_lora else None)
    full_acts = n_layers * tokens * per_layer
    ckpt_acts = n_layers * tokens * h * d + tokens * per_layer + tokens * (2 * h + i) * 4
    c["activations (no checkpointing)"] = full_acts
    c["activations (checkpointing)"] = ckpt_acts
    # the head's bytes per (row, vocab): compiled on CUDA (speed.fused_logprob_head) the
    # forward keeps only fp32 z and the backward z plus dz in the head's dtype; eagerly
    # every elementwise pass keeps an fp32 buffer (z, log-softmax, p, grad)
    fused = cfg.speed.fused_logprob_head
    head_update, head_prepare = (4 + d, 4) if fused else (4 * LOGIT_FACTOR_UPDATE, 4 * 2)
    c["logits (chunked, update)"] = chunk * v * head_update
    if m.use_gradient_checkpointing:
        # the head's backward finishes (its chunk freed) before the first layer is
        # recomputed: the layer inputs stay, the two transients take turns
        inputs = n_layers * tokens * h * d
        update_acts = inputs + max(ckpt_acts - inputs, c["logits (chunked, update)"])
    else:
        update_acts = full_acts + c["logits (chunked, update)"]
    phases = {
        "rollout": persistent
        + c["KV cache (rollout)"]
        + c.get("fast engine weight buffers", 0)
        + c.get("vLLM weights + work (held)", 0)
        + c["logits (rollout)"]
        + c["prefill (rollout)"],
        "prepare": persistent + held + tokens * per_layer + chunk * v * head_prepare,
        "update": persistent + held + update_acts,
    }
    peak_phase = max(phases, key=phases.get)
    return {
        "dtype": dtype,
        "params": params,
        "lora_params": lora if use_lora else 0,
        "components": c,
        "persistent": persistent,
        "phases": phases,
        "peak_phase": peak_phase,
        "peak": phases[peak_phase],
        "overhead": OVERHEAD_BYTES,
        "vllm_share": share,  # VllmShare with the vllm engine, else None
        # the same fp32 buffers (z, log-softmax, p, grad) over every response row at once
        "full_logits_would_be": micro * t.max_new_tokens * v * 4 * LOGIT_FACTOR_UPDATE,
        "chunk_rows": chunk,
        "response_rows": micro * t.max_new_tokens,
        "assumptions": {
            "rollout_engine": "vllm" if vllm else "fast" if fast else "hf",
            "rollout_cache_kept_for_update": keep or vllm,
            "quantised_base": m.load_in_4bit and "4bit" or m.load_in_8bit and "8bit" or None,
            "rollout_sequences": seqs,
            "prompt_tokens": prompt_len,
            "sequence_tokens": seq_len,
            "update_tokens_per_micro_batch": tokens,
            "gradient_checkpointing": m.use_gradient_checkpointing,
            "lora": use_lora,
        },
    }


def _round_up(tokens: int) -> int:
    return -(-tokens // SEQ_ROUND) * SEQ_ROUND


def vocab_of(config: Any) -> int | None:
    """The vocabulary size of a transformers config (None for no config)."""
    return None if config is None else _text_config(config).vocab_size


def _shape(config: Any) -> dict[str, int]:
    tc = _text_config(config)
    heads = tc.num_attention_heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    kv_heads = getattr(tc, "num_key_value_heads", None) or heads
    return {
        "H": tc.hidden_size,
        "I": getattr(tc, "intermediate_size", 4 * tc.hidden_size),
        "L": tc.num_hidden_layers,
        "V": tc.vocab_size,
        "q": heads * head_dim,
        "kv": kv_heads * head_dim,
    }


def with_settings(cfg: DankaConfig, changes: dict[str, Any]) -> DankaConfig:
    """A copy of ``cfg`` with ``{dotted key: value}`` applied (the candidates a plan prices)."""
    out = copy.deepcopy(cfg)
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        setattr(getattr(out, section), key, value)
    return out


def _candidates(c: DankaConfig) -> list[dict[str, Any]]:
    """Single setting changes that lower memory, as ``{dotted key: new value}``."""
    t, out = c.trainer, []
    if not c.model.use_gradient_checkpointing:
        out.append({"model.use_gradient_checkpointing": True})
    if t.micro_batch_size > 1:
        out.append({"trainer.micro_batch_size": max(1, t.micro_batch_size // 2)})
    if not c.lora.enable_lora:
        out.append({"lora.enable_lora": True})
    elif not (c.model.load_in_4bit or c.model.load_in_8bit):
        # QLoRA: an NF4 base (bitsandbytes); the fast engine does not sample from one
        qlora: dict[str, Any] = {"model.load_in_4bit": True}
        if c.rollout.engine == "fast":
            qlora["rollout.engine"] = "hf"
        out.append(qlora)
    from danka.rollout.base import halve_groups  # the engines' own halving (whole groups)

    fewer = halve_groups(sequences_per_call(c), samples_per_prompt_of(c))
    if fewer is not None:
        out.append({"rollout.generation_batch_size": fewer})
    if c.rollout.engine in ("fast", "auto"):
        out.append({"rollout.engine": "hf"})
    if t.max_new_tokens > 64:
        new = t.max_new_tokens // 2
        out.append({"trainer.max_new_tokens": new, "trainer.max_length": t.max_length - new})
    return out


def _label(changes: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items()
    )


def _fixes(cfg: DankaConfig, budget: int, estimate: Callable[[DankaConfig], dict]) -> list[str]:
    """Settings that bring the peak + overhead under ``budget``: every single change that
    suffices; else changes applied greedily (the one that saves most first) until it fits."""
    single = []
    for change in _candidates(cfg):
        peak = estimate(with_settings(cfg, change))["peak"]
        if peak + OVERHEAD_BYTES <= budget:
            single.append(f"{_label(change)}  (peak {peak / GIB:.1f} GiB)")
    if single:
        return single
    applied: dict[str, Any] = {}
    trial = cfg
    for _ in range(16):
        options = [
            (estimate(with_settings(trial, ch))["peak"], i, ch)
            for i, ch in enumerate(_candidates(trial))
        ]
        if not options:
            break
        peak, _, change = min(options)
        trial = with_settings(trial, change)
        applied.update(change)
        if peak + OVERHEAD_BYTES <= budget:
            return [f"{_label(applied)}  (peak {peak / GIB:.1f} GiB)"]
    return ["no combination of these settings fits: use a smaller model or a larger GPU"]


CHUNKS = (1024, 512, 256, 128)  # log-prob chunks auto tries, largest first
CHUNK_TARGET_BYTES = 64 * 2**20  # auto's chunks keep at most this much fp32 logits


def chunk_candidates(vocab: int | None) -> list[int]:
    """The log-prob chunks auto tries for a ``vocab``-sized head, largest first: those whose
    fp32 logits (chunk x vocab x 4 bytes) take at most ``CHUNK_TARGET_BYTES``, at least the
    smallest. Per-row log-probs do not depend on the chunk: only memory and speed do."""
    if vocab is None:
        return list(CHUNKS)
    fit = [c for c in CHUNKS if c * vocab * 4 <= CHUNK_TARGET_BYTES]
    return fit or [CHUNKS[-1]]


# the sizes ``auto`` may stand for; danka.planning.micro.with_planned resolves them
AUTO_SIZES = (
    "trainer.micro_batch_size",
    "rollout.generation_batch_size",
    "speed.logprob_chunk_size",
)


def pricer(cfg: DankaConfig, model_config: Any) -> Callable[[DankaConfig], dict[str, Any]]:
    """The phase plan of any variant of ``cfg`` (same model and LoRA shape), with the
    parameter counts made once (building the model on the meta device is the slow part)."""
    params, lora = count_parameters(model_config, cfg.lora.target_modules, cfg.lora.lora_r)
    shape = _shape(model_config)

    def estimate(c: DankaConfig) -> dict[str, Any]:
        for dotted in AUTO_SIZES:
            section, key = dotted.split(".")
            if not isinstance(getattr(getattr(c, section), key), int):
                raise TypeError(f"the plan prices a numeric {dotted} (planning.micro.with_planned)")
        return _plan(c, shape, params, lora)

    return estimate


def estimate_memory(
    cfg: DankaConfig,
    *,
    base_dir: Path | None = None,
    gpu_memory: int | None = None,
    model_config: Any = None,
) -> dict[str, Any]:
    """Memory plan of ``cfg`` in bytes: ``components``, ``phases`` (rollout, prepare,
    update), ``peak`` and ``peak_phase``; with ``gpu_memory`` (bytes) also ``fits`` and
    ``suggestions``. ``model_config`` skips loading the config of the actor model. A
    log-prob chunk left ``auto`` is priced as a GPU with room picks it (the other sizes
    that may be ``auto`` are planned first: danka.planning.micro.with_planned)."""
    config = model_config or load_model_config(cfg.model.actor_model_name_or_path, base_dir)
    if cfg.speed.logprob_chunk_size == "auto":  # the default: what a GPU with room picks
        chunk = chunk_candidates(vocab_of(config))[0]
        cfg = with_settings(cfg, {"speed.logprob_chunk_size": chunk})
    estimate = pricer(cfg, config)
    result = estimate(cfg)
    result["model"] = cfg.model.actor_model_name_or_path
    result["shape"] = _shape(config)
    if gpu_memory is not None:
        result["gpu_memory"] = gpu_memory
        result["fits"] = result["peak"] + OVERHEAD_BYTES <= gpu_memory
        result["headroom"] = gpu_memory - result["peak"] - OVERHEAD_BYTES
        result["tight"] = result["fits"] and result["headroom"] < MARGIN * gpu_memory
        result["suggestions"] = [] if result["fits"] else _fixes(cfg, gpu_memory, estimate)
    return result
