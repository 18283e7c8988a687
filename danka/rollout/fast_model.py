"""The fast engine's own forward pass for Llama-family decoders (Llama, SmolLM2, Qwen2).

Weights are read LIVE from the HF model at every ``generate()``: :func:`load_weights` fuses
q/k/v and gate/up into engine-owned buffers and folds active LoRA adapters in as the
effective weight ``W + scaling * B @ A`` (Hu et al. 2021, https://arxiv.org/abs/2106.09685);
modules that need no change (norms, embeddings, an un-adapted o/down projection) are used
in place, so an optimizer step is seen by the next call. Nothing is merged into the model.

Shapes: b = sequences, P = prompt length (left-padded), T = KV-cache capacity, H = hidden,
Hq/Hkv = query/key-value heads (GQA group G = Hq // Hkv), D = head dim, V = vocab.
The KV cache is ``(layers, B, Hkv, T, D)``; every sequence writes slot ``t`` at the same time
and masks its own left padding with ``start`` (first real slot).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from danka.errors import UserError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
_FALLBACK = "set rollout.engine: hf (HF generate runs every architecture transformers supports)"
# RoPE variants whose frequencies do not depend on the sequence length.
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")

Weights = dict[str, torch.Tensor | None]


@dataclass(frozen=True)
class ModelSpec:
    """Dimensions of a supported decoder, read from its config."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tied: bool
    dtype: torch.dtype
    device: torch.device

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The HF ``*ForCausalLM`` inside a peft ``PeftModel`` and/or ``torch.compile`` wrapper."""
    for _ in range(4):
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif hasattr(model, "get_base_model") and not isinstance(model, PreTrainedModel):
            model = model.get_base_model()
        else:
            break
    return model


def _unsupported(what: str, model_type: str) -> UserError:
    return UserError(
        f"the fast rollout engine cannot run this {model_type!r} model: {what}",
        where="rollout.engine",
        fix=_FALLBACK,
    )


def _active_module(mod: nn.Module) -> nn.Module:
    """The module a peft ``ModulesToSaveWrapper`` currently forwards to (else ``mod``)."""
    if hasattr(mod, "modules_to_save") and hasattr(mod, "original_module"):
        active = list(getattr(mod, "active_adapters", []) or [])
        if getattr(mod, "disable_adapters", False) or not active:
            return mod.original_module
        return mod.modules_to_save[active[0]]
    return mod


def _lora_adapters(mod: nn.Module) -> list[str]:
    """Active, unmerged LoRA adapters of a peft LoRA layer ([] for a plain module)."""
    if not hasattr(mod, "lora_A") or not hasattr(mod, "base_layer"):
        return []
    if getattr(mod, "disable_adapters", False) or getattr(mod, "merged", False):
        return []  # disabled: base only; merged: the base weight already holds the delta
    emb = getattr(mod, "lora_embedding_A", {})
    names = [a for a in mod.active_adapters if a in mod.lora_A or a in emb]
    for a in names:
        if a in getattr(mod, "lora_variant", {}) or getattr(mod, "use_dora", {}).get(a, False):
            raise _unsupported(f"adapter {a!r} is a LoRA variant (DoRA...)", "peft")
    return names


def _base(mod: nn.Module) -> nn.Module:
    mod = _active_module(mod)
    return mod.get_base_layer() if hasattr(mod, "base_layer") else mod


def _parts(mod: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, list, list]:
    """(base weight, base bias, LoRA weight deltas, LoRA bias deltas) of a linear/embedding."""
    mod = _active_module(mod)
    base = _base(mod)
    if not isinstance(base, (nn.Linear, nn.Embedding)) or not base.weight.is_floating_point():
        raise _unsupported(f"{type(base).__name__} layers (quantised?) are not handled", "model")
    dws, dbs = [], []
    for a in _lora_adapters(mod):
        dws.append(mod.get_delta_weight(a))
        if getattr(mod, "lora_bias", {}).get(a, False):
            dbs.append(mod.lora_B[a].bias * mod.scaling[a])
    return base.weight, getattr(base, "bias", None), dws, dbs


def _has_bias(mod: nn.Module) -> bool:
    """Base bias or a LoRA bias (``lora_bias=True``) on an active adapter."""
    active = _active_module(mod)
    lora_bias = getattr(active, "lora_bias", {})
    return getattr(_base(mod), "bias", None) is not None or any(
        lora_bias.get(a, False) for a in _lora_adapters(active)
    )


def model_spec(root: nn.Module) -> ModelSpec:
    """Check that ``root`` (a HF causal LM) is supported and read its dimensions."""
    cfg = getattr(root, "config", None)
    model_type = getattr(cfg, "model_type", type(root).__name__)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(
            f"the fast rollout engine does not support model type {model_type!r} "
            f"(it runs: {', '.join(SUPPORTED_MODEL_TYPES)})",
            where="rollout.engine",
            fix=_FALLBACK,
        )
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):
        raise _unsupported(f"activation {cfg.hidden_act!r} (only silu)", model_type)
    if getattr(cfg, "use_sliding_window", False):
        raise _unsupported("sliding-window attention", model_type)
    rope_type = getattr(root.model.rotary_emb, "rope_type", "default")
    if rope_type not in _STATIC_ROPE:
        raise _unsupported(f"rope type {rope_type!r}", model_type)
    layer = root.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    heads = cfg.num_attention_heads
    emb = _base(root.model.embed_tokens).weight
    head = _base(root.lm_head).weight
    return ModelSpec(
        model_type=model_type,
        layers=len(root.model.layers),
        hidden=cfg.hidden_size,
        heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        vocab=head.shape[0],
        eps=cfg.rms_norm_eps,
        qkv_bias=any(_has_bias(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj)),
        o_bias=_has_bias(attn.o_proj),
        mlp_bias=any(_has_bias(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)),
        tied=head is emb
        and not _lora_adapters(_active_module(root.lm_head))
        and not _lora_adapters(_active_module(root.model.embed_tokens)),
        dtype=emb.dtype,
        device=emb.device,
    )


@torch.no_grad()
def _fill(
    owned: Weights, key: str, mods: list[nn.Module], spec: ModelSpec, bias: bool, out: Weights
) -> None:
    """Set ``out[key]`` (and ``out[key + '.b']``) to the row-stacked effective weights.

    A single module without LoRA in the compute dtype is used in place (live, zero copy);
    anything else is written into an engine-owned buffer ``owned[key]``, reused when it fits.
    """
    parts = [_parts(m) for m in mods]
    rows = sum(p[0].shape[0] for p in parts)
    cols = parts[0][0].shape[1]
    w0, b0, dws0, dbs0 = parts[0]
    if len(parts) == 1 and not dws0 and w0.dtype == spec.dtype:
        out[key] = w0
    else:
        buf = owned.get(key)
        if buf is None or buf.shape != (rows, cols):
            buf = owned[key] = torch.empty(rows, cols, dtype=spec.dtype, device=spec.device)
        r = 0
        for w, _, dws, _ in parts:
            n = w.shape[0]
            if dws:  # add the deltas in fp32, round once (copy=True: never touch the param)
                acc = w.to(torch.float32, copy=True)
                for dw in dws:
                    acc.add_(dw.to(torch.float32))
                buf[r : r + n].copy_(acc)
            else:
                buf[r : r + n].copy_(w)
            r += n
        out[key] = buf
    if not bias:
        out[key + ".b"] = None
        return
    if len(parts) == 1 and not dbs0 and b0 is not None and b0.dtype == spec.dtype:
        out[key + ".b"] = b0
        return
    bbuf = owned.get(key + ".b")
    if bbuf is None or bbuf.shape != (rows,):
        bbuf = owned[key + ".b"] = torch.empty(rows, dtype=spec.dtype, device=spec.device)
    r = 0
    for w, b, _, dbs in parts:
        n = w.shape[0]
        acc = b.float() if b is not None else torch.zeros(n, device=spec.device)
        for db in dbs:
            acc = acc + db.float()
        bbuf[r : r + n].copy_(acc)
        r += n
    out[key + ".b"] = bbuf


def load_weights(root: nn.Module, spec: ModelSpec, owned: Weights) -> Weights:
    """Effective weights of ``root`` now: fused ``{i}.qkv`` (q|k|v rows), ``{i}.gu`` (gate|up).

    ``owned`` holds the engine's buffers (filled in place, created when missing): reusing
    them keeps their addresses, which captured CUDA graphs rely on.
    """
    out: Weights = {}
    m = root.model
    _fill(owned, "embed", [m.embed_tokens], spec, False, out)
    out["norm"] = _vector(owned, "norm", m.norm.weight, spec)
    if spec.tied:
        out["lm_head"] = out["embed"]
    else:
        _fill(owned, "lm_head", [root.lm_head], spec, False, out)
    for i, layer in enumerate(m.layers):
        a, f = layer.self_attn, layer.mlp
        out[f"{i}.ln1"] = _vector(owned, f"{i}.ln1", layer.input_layernorm.weight, spec)
        out[f"{i}.ln2"] = _vector(owned, f"{i}.ln2", layer.post_attention_layernorm.weight, spec)
        _fill(owned, f"{i}.qkv", [a.q_proj, a.k_proj, a.v_proj], spec, spec.qkv_bias, out)
        _fill(owned, f"{i}.o", [a.o_proj], spec, spec.o_bias, out)
        _fill(owned, f"{i}.gu", [f.gate_proj, f.up_proj], spec, spec.mlp_bias, out)
        _fill(owned, f"{i}.down", [f.down_proj], spec, spec.mlp_bias, out)
    return out


def _vector(owned: Weights, key: str, w: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """A norm weight: the live parameter, or a cast copy in an owned buffer."""
    if w.dtype == spec.dtype:
        return w
    buf = owned.get(key)
    if buf is None or buf.shape != w.shape:
        buf = owned[key] = torch.empty(w.shape, dtype=spec.dtype, device=spec.device)
    buf.copy_(w)
    return buf


def rope_tables(root: nn.Module, spec: ModelSpec, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin ``(length, D)`` for positions 0..length-1 (Su et al. 2021,
    https://arxiv.org/abs/2104.09864), the values of HF's rotary embedding.

    ``inv_freq`` and ``attention_scaling`` come from the model's own rotary module, so
    ``rope_theta`` and static scalings (linear, llama3, yarn) follow the config. The sin
    table's first half is negated so that ``rotate_half(x) * sin == roll(x, D/2) * sin_s``
    exactly (same products, one kernel fewer).
    """
    rot = root.model.rotary_emb
    inv_freq = rot.inv_freq.to(device=spec.device, dtype=torch.float32)
    pos = torch.arange(length, device=spec.device, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = getattr(rot, "attention_scaling", 1.0)
    cos, sin = (emb.cos() * scale).to(spec.dtype), (emb.sin() * scale).to(spec.dtype)
    half = spec.head_dim // 2
    sin[:, :half] = -sin[:, :half]
    return cos, sin


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm ``w * x / sqrt(mean(x^2) + eps)`` (Zhang & Sennrich 2019), statistics in fp32.

    On CUDA the fused kernel (one launch instead of ~7; it rounds once where HF rounds
    twice in bf16); elsewhere HF LlamaRMSNorm's exact op sequence.
    """
    if x.is_cuda and x.dtype == w.dtype and hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    dt = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(dt)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_s: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) * sin = roll(x) * sin_s``."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin_s


def _mlp(w: Weights, i: int, x: torch.Tensor) -> torch.Tensor:
    g, u = F.linear(x, w[f"{i}.gu"], w[f"{i}.gu.b"]).chunk(2, dim=-1)
    return F.linear(F.silu(g) * u, w[f"{i}.down"], w[f"{i}.down.b"])


def _logits(w: Weights, spec: ModelSpec, h: torch.Tensor) -> torch.Tensor:
    return F.linear(rms_norm(h, w["norm"], spec.eps), w["lm_head"]).float()


def prefill(
    w: Weights,
    spec: ModelSpec,
    ids: torch.Tensor,
    mask: torch.Tensor,
    cos_t: torch.Tensor,
    sin_t: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: slice,
    n: int,
) -> torch.Tensor:
    """Run left-padded prompts ``ids``/``mask`` (p, P) and return last-position logits (p, V).

    Keys/values go to cache slots ``[0, P)`` of rows ``rows``, each prompt repeated ``n``
    times (sample ``i * n + j`` answers prompt ``i``). RoPE positions count real tokens only.
    """
    p, plen = ids.shape
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    cos, sin = cos_t[pos][:, :, None], sin_t[pos][:, :, None]  # (p, P, 1, D)
    nqk = spec.heads + spec.kv_heads
    qk_dim = nqk * spec.head_dim
    causal = torch.ones(plen, plen, dtype=torch.bool, device=ids.device).tril()
    allowed = causal[None] & mask.bool()[:, None, :]
    # Padding query rows see only themselves: keeps them finite; nothing reads them.
    allowed |= torch.eye(plen, dtype=torch.bool, device=ids.device)[None]
    allowed = allowed[:, None]  # (p, 1, P, P)
    group = spec.heads // spec.kv_heads
    x = F.embedding(ids, w["embed"])
    for i in range(spec.layers):
        r = rms_norm(x, w[f"{i}.ln1"], spec.eps)
        qkv = F.linear(r, w[f"{i}.qkv"], w[f"{i}.qkv.b"])
        qk = _rope(qkv[..., :qk_dim].view(p, plen, nqk, spec.head_dim), cos, sin).transpose(1, 2)
        q, k = qk[:, : spec.heads], qk[:, spec.heads :]
        v = qkv[..., qk_dim:].view(p, plen, spec.kv_heads, spec.head_dim).transpose(1, 2)
        k_cache[i, rows, :, :plen] = k.repeat_interleave(n, dim=0)
        v_cache[i, rows, :, :plen] = v.repeat_interleave(n, dim=0)
        att = F.scaled_dot_product_attention(
            q,
            k.repeat_interleave(group, dim=1),
            v.repeat_interleave(group, dim=1),
            attn_mask=allowed,
        )
        att = att.transpose(1, 2).reshape(p, plen, spec.q_dim)
        x = x + F.linear(att, w[f"{i}.o"], w[f"{i}.o.b"])
        x = x + _mlp(w, i, rms_norm(x, w[f"{i}.ln2"], spec.eps))
    return _logits(w, spec, x[:, -1])


def decode_forward(
    w: Weights,
    spec: ModelSpec,
    tok: torch.Tensor,
    pos: torch.Tensor,
    slot: torch.Tensor,
    start: torch.Tensor,
    cos_t: torch.Tensor,
    sin_t: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> torch.Tensor:
    """One token for each of b sequences -> next-token logits (b, V) fp32.

    ``tok``/``pos``/``start`` are (b,), ``slot`` is (1,): the token's KV goes to ``slot``
    and it attends to slots ``[start, slot]``. No host sync and no shape that depends on
    data, so the whole call can be captured in a CUDA graph.
    """
    b, t = tok.shape[0], k_cache.shape[3]
    slots = torch.arange(t, device=tok.device)
    valid = (slots[None, :] >= start[:, None]) & (slots[None, :] <= slot)
    zero = torch.zeros((), dtype=spec.dtype, device=tok.device)
    mask = torch.where(valid, zero, float("-inf"))[:, None, None, :]  # (b, 1, 1, T)
    cos, sin = cos_t[pos][:, None], sin_t[pos][:, None]  # (b, 1, D)
    nqk = spec.heads + spec.kv_heads
    qk_dim = nqk * spec.head_dim
    group = spec.heads // spec.kv_heads
    x = F.embedding(tok, w["embed"])
    for i in range(spec.layers):
        r = rms_norm(x, w[f"{i}.ln1"], spec.eps)
        qkv = F.linear(r, w[f"{i}.qkv"], w[f"{i}.qkv.b"])
        # RoPE on q and k together: one set of kernels for both.
        qk = _rope(qkv[:, :qk_dim].view(b, nqk, spec.head_dim), cos, sin)
        q, k = qk[:, : spec.heads], qk[:, spec.heads :]
        k_cache[i].index_copy_(2, slot, k.unsqueeze(2))
        v_cache[i].index_copy_(2, slot, qkv[:, qk_dim:].view(b, spec.kv_heads, 1, spec.head_dim))
        # GQA without copying K/V: the G query heads of a group act as G query positions.
        qg = q.view(b, spec.kv_heads, group, spec.head_dim)
        att = F.scaled_dot_product_attention(qg, k_cache[i], v_cache[i], attn_mask=mask)
        x = x + F.linear(att.reshape(b, spec.q_dim), w[f"{i}.o"], w[f"{i}.o.b"])
        x = x + _mlp(w, i, rms_norm(x, w[f"{i}.ln2"], spec.eps))
    return _logits(w, spec, x)
