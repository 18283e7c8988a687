"""Weights of the fast engine, read LIVE from the HF model at every ``generate()``.

:func:`load_weights` returns, per layer, fused ``qkv`` (q|k|v rows) and ``gu`` (gate|up)
matrices and every other weight in the compute dtype. A single module already in that dtype
is used in place (zero copy, so an optimizer step is seen by the next call); fused or cast
weights live in engine-owned buffers: a trained source (``requires_grad``) is re-copied at
every call, a frozen one only when its ``data_ptr`` or in-place ``_version`` changed, so a
frozen LoRA base is copied once. (``_version`` alone cannot see an optimizer step: fused
AdamW updates parameters in place without bumping it.)

Active LoRA adapters (Hu et al. 2021, https://arxiv.org/abs/2106.09685) are applied
UNMERGED, as peft's training forward applies them: ``y = x @ W.T + (x @ A.T) @ (s * B).T``
with the low-rank path in the adapter's dtype (fp32 when peft keeps adapters in fp32).
Merging ``W + s * B @ A`` into bf16 weights would round away deltas smaller than W's bf16
step, i.e. most of an adapter's first updates. For a fused matrix the
adapters' A matrices are stacked (``.la``: R x in, R = sum of ranks) and their scaled B
matrices placed block-diagonally (``.lb``: out x R), one low-rank pair per fused linear.
Embedding adapters use ``.la`` = stacked A.T (V x R), looked up like the embedding.
Zero copy: :func:`danka.rollout.fast.colocate.colocate` stores each layer's projection
groups back to back in one buffer each, in place (values unchanged, the same
``nn.Parameter`` objects), with rows reserved for live adapters' A matrices; the fused
matrix is then a view of the model's own weights (``adjacent``) and A is folded into those
reserved rows (``folded_view``): no engine copy, and every optimizer step is seen without
re-copying. Otherwise, with ``Owned.fuse`` False (the engine's default when fused copies
would exceed ``options.FUSE_LIMIT_BYTES``) q/k/v and gate/up are not fused: ``out[key]`` is None and
``out[key + '.0'/'.1'/'.2']`` are the live weights.
Nothing is merged into the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from danka.errors import UserError
from danka.rollout.fast.colocate import adjacent, folded_view
from danka.rollout.fast.peft import (
    FALLBACK,
    active_module,
    base_layer,
    lora_adapters,
    unsupported,
)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
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

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def _has_bias(mod: nn.Module) -> bool:
    """Base bias or a LoRA bias (``lora_bias=True``) on an active adapter."""
    active = active_module(mod)
    lora_bias = getattr(active, "lora_bias", {})
    return getattr(base_layer(mod), "bias", None) is not None or any(
        lora_bias.get(a, False) for a in lora_adapters(active)
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
            fix=FALLBACK,
        )
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):
        raise unsupported(f"activation {cfg.hidden_act!r} (only silu)", model_type)
    if getattr(cfg, "use_sliding_window", False):
        raise unsupported("sliding-window attention", model_type)
    rope_type = getattr(root.model.rotary_emb, "rope_type", "default")
    if rope_type not in _STATIC_ROPE:
        raise unsupported(f"rope type {rope_type!r}", model_type)
    layer = root.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    heads = cfg.num_attention_heads
    emb = base_layer(root.model.embed_tokens).weight
    head = base_layer(root.lm_head).weight
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
        and not lora_adapters(active_module(root.lm_head))
        and not lora_adapters(active_module(root.model.embed_tokens)),
        dtype=emb.dtype,
        device=emb.device,
    )


@dataclass
class Owned:
    """Engine-owned buffers (stable addresses for captured CUDA graphs) and, per fused or
    cast buffer, the (data_ptr, _version) of the sources it was last copied from."""

    buf: dict[str, torch.Tensor] = field(default_factory=dict)
    seen: dict[str, tuple] = field(default_factory=dict)
    fuse: bool = True  # False: q/k/v and gate/up stay separate live weights (no copies)
    # LoRA low-rank path: "adapter" = in the adapter's own dtype (fp32 under peft's default,
    # peft's op order exactly); "base" (what "auto" means) = in the model's compute dtype
    # (bf16 copies of A and s*B); "merge" = merged into engine-owned copies of the adapted
    # weights (W + s*B@A in fp32, rounded once to the model dtype: no low-rank kernels).
    lora_compute: str = "adapter"

    def get(self, key: str, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
        b = self.buf.get(key)
        if b is None or b.shape != shape or b.dtype != dtype:
            self.seen.pop(key, None)
            b = self.buf[key] = torch.empty(shape, dtype=dtype, device=device)
        return b

    def stale(self, key: str, sources: list[torch.Tensor | None], extra: tuple = ()) -> bool:
        """True (and remember the sources) when ``key`` must be re-copied from them
        (``extra``: plain values the copy also depends on, e.g. LoRA scalings)."""
        if any(t is not None and t.requires_grad for t in sources):
            # a trained tensor is re-copied at every call: fused optimizers (AdamW(fused=True),
            # danka's default on CUDA) update parameters in place WITHOUT bumping _version, so
            # a (data_ptr, _version) signature would keep serving the weights of step 0
            self.seen.pop(key, None)
            return True
        sig = tuple((t.data_ptr(), t._version) if t is not None else None for t in sources)
        sig += tuple(extra)
        if self.seen.get(key) == sig:
            return False
        self.seen[key] = sig
        return True


@dataclass
class _Lora:
    """One active adapter of one module: ``delta(x) = (x @ a.T) @ (scale * b).T``."""

    a: torch.Tensor  # (r, in); for an embedding (r, V)
    b: torch.Tensor  # (out, r)
    scale: float
    bias: torch.Tensor | None  # lora_B bias (lora_bias=True), unscaled


def _parts(mod: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, list[_Lora]]:
    """(base weight, base bias, active LoRA adapters) of a linear/embedding module."""
    mod = active_module(mod)
    base = base_layer(mod)
    if not isinstance(base, (nn.Linear, nn.Embedding)) or not base.weight.is_floating_point():
        raise unsupported(f"{type(base).__name__} layers (quantised?) are not handled", "model")
    loras = []
    for a in lora_adapters(mod):
        if a in getattr(mod, "lora_embedding_A", {}):
            la, lb = mod.lora_embedding_A[a], mod.lora_embedding_B[a]
            loras.append(_Lora(la, lb, float(mod.scaling[a]), None))
            continue
        bias = mod.lora_B[a].bias if getattr(mod, "lora_bias", {}).get(a, False) else None
        loras.append(_Lora(mod.lora_A[a].weight, mod.lora_B[a].weight, float(mod.scaling[a]), bias))
    return base.weight, getattr(base, "bias", None), loras


def _lora_dtype(spec: ModelSpec, parts, owned: Owned) -> torch.dtype | None:
    """dtype of the low-rank path (None: no active adapter)."""
    loras = [lo for p in parts for lo in p[2]]
    if not loras:
        return None
    if owned.lora_compute == "base":
        return spec.dtype
    return torch.promote_types(spec.dtype, loras[0].a.dtype)


@torch.no_grad()
def _fill(
    owned: Owned, key: str, mods: list[nn.Module], spec: ModelSpec, bias: bool, out: Weights
) -> None:
    """Set ``out[key]`` (row-stacked base weights), ``out[key + '.b']`` (bias or None) and
    ``out[key + '.la'/'.lb']`` (the stacked low-rank adapter pair, or None).

    Folded LoRA (low-rank path in the base dtype and an engine-owned buffer allowed): the
    stacked A rows are appended to the base rows, ``out[key]`` is ``[W; A]`` (rows + R, in)
    and ``out[key + '.la']`` is None, so one GEMM gives ``[x @ W.T + b | x @ A.T]``.
    """
    parts = [_parts(m) for m in mods]
    rows = sum(p[0].shape[0] for p in parts)
    cols = parts[0][0].shape[1]
    w0 = parts[0][0]
    if (
        owned.lora_compute == "merge"
        and key not in ("embed", "lm_head")
        and any(p[2] for p in parts)
    ):
        _fill_merged(owned, key, parts, spec, rows, cols, out)
        _fill_bias(owned, key, parts, spec, bias, rows, 0, out)
        out[key + ".la"] = out[key + ".lb"] = None
        return
    live = all(p[0].dtype == spec.dtype for p in parts)
    lora_dtype = _lora_dtype(spec, parts, owned)
    foldable = lora_dtype == spec.dtype and key not in ("embed", "lm_head")
    stacked = sum(lo.a.shape[0] for p in parts for lo in p[2])  # rows of A to fold
    room = folded_view(parts, stacked) if foldable and live else None
    fold = room is not None or (foldable and owned.fuse)
    rank = stacked if fold else 0
    view = adjacent([p[0] for p in parts]) if live and not fold and len(parts) > 1 else None
    if room is not None:
        out[key] = room  # co-located with reserved rows: [W; A] folded, zero copy
    elif len(parts) == 1 and live and not fold:
        out[key] = w0  # live parameter, zero copy
    elif view is not None:
        out[key] = view  # co-located parameters (colocate): the fused matrix, zero copy
    elif live and not owned.fuse:
        out[key] = None  # _lin runs the parts one by one: live parameters, zero copy
        for j, p in enumerate(parts):
            out[f"{key}.{j}"] = p[0]
    else:
        buf = owned.get(key, (rows + rank, cols), spec.dtype, spec.device)
        if owned.stale(key, [p[0] for p in parts]):
            r = 0
            for w, _, _ in parts:
                buf[r : r + w.shape[0]].copy_(w)
                r += w.shape[0]
        out[key] = buf
    _fill_bias(owned, key, parts, spec, bias, rows, rank, out)
    _fill_lora(owned, key, parts, spec, rows, lora_dtype, out[key] if fold else None, out)


def _fill_merged(owned: Owned, key, parts, spec: ModelSpec, rows, cols, out) -> None:
    """``lora_compute="merge"``: ``out[key]`` = the stacked ``W + s * B @ A`` of the parts,
    summed in fp32 and rounded once to the model dtype, in an engine-owned buffer (one
    plain GEMM per projection at decode time, as an unadapted model). Re-merged whenever
    a source changed (at every call while the adapters train)."""
    buf = owned.get(key, (rows, cols), spec.dtype, spec.device)
    sources = [t for w, _, loras in parts for t in (w, *(x for lo in loras for x in (lo.a, lo.b)))]
    scales = tuple(lo.scale for p in parts for lo in p[2])
    if owned.stale(key + ".merge", sources, scales):
        r = 0
        for w, _, loras in parts:
            acc = w.float()
            for lo in loras:
                acc = torch.addmm(acc, lo.b.float(), lo.a.float(), alpha=lo.scale)
            buf[r : r + w.shape[0]].copy_(acc)
            r += w.shape[0]
    out[key] = buf


def _fill_bias(owned: Owned, key, parts, spec: ModelSpec, bias: bool, rows, rank, out) -> None:
    """Bias of the fused rows (LoRA biases folded in); ``rank`` > 0: zeros for folded A rows.
    Re-copied only when a source bias or a LoRA scaling changed (or a bias is trained)."""
    out[key + ".b"] = None
    if not bias:
        return
    b0, has_lora_bias = parts[0][1], any(lo.bias is not None for p in parts for lo in p[2])
    plain = len(parts) == 1 and not has_lora_bias and rank == 0
    if plain and b0 is not None and b0.dtype == spec.dtype:
        out[key + ".b"] = b0
        return
    biases = [p[1] for p in parts]
    if not has_lora_bias and rank == 0 and all(b is not None for b in biases):
        view = adjacent(biases) if b0.dtype == spec.dtype else None
        if view is not None:  # co-located biases (colocate): zero copy
            out[key + ".b"] = view
            return
    bbuf = out[key + ".b"] = owned.get(key + ".b", (rows + rank,), spec.dtype, spec.device)
    sources = [b for _, b, _ in parts] + [lo.bias for p in parts for lo in p[2]]
    if not owned.stale(key + ".b", sources, tuple(lo.scale for p in parts for lo in p[2])):
        return  # frozen biases and LoRA biases unchanged since the last copy
    bbuf[rows:].zero_()
    r = 0
    for w, b, loras in parts:
        n = w.shape[0]
        acc = b.float() if b is not None else torch.zeros(n, device=spec.device)
        for lo in loras:
            if lo.bias is not None:
                acc = acc + lo.bias.float() * lo.scale
        bbuf[r : r + n].copy_(acc)
        r += n


def _fill_lora(owned: Owned, key, parts, spec: ModelSpec, rows, dtype, folded, out) -> None:
    """Stack the adapters' A rows (into ``folded[rows:]`` when given) and place their scaled
    B blocks block-diagonally; re-copied only when an adapter tensor or scaling changed."""
    loras = [(i, lo) for i, p in enumerate(parts) for lo in p[2]]
    out[key + ".la"] = out[key + ".lb"] = None
    if not loras:
        return
    rank = sum(lo.a.shape[0] for _, lo in loras)
    embedding = key == "embed"
    a_shape = (loras[0][1].a.shape[1], rank) if embedding else (rank, loras[0][1].a.shape[1])
    la = (
        folded[rows:] if folded is not None else owned.get(key + ".la", a_shape, dtype, spec.device)
    )
    lb = owned.get(key + ".lb", (rows, rank), dtype, spec.device)
    sources = [t for _, lo in loras for t in (lo.a, lo.b)]
    scales = tuple(lo.scale for _, lo in loras)
    # the folded A rows live in the base buffer, which a base re-copy does not touch
    if owned.stale(key + ".lora", sources + [la, lb], scales):
        lb.zero_()
        starts = [0]
        for w, _, _ in parts:
            starts.append(starts[-1] + w.shape[0])
        c = 0
        for i, lo in loras:
            r = lo.a.shape[0]
            if embedding:
                la[:, c : c + r].copy_(lo.a.T)
            else:
                la[c : c + r].copy_(lo.a)
            blk = lb[starts[i] : starts[i + 1], c : c + r]
            if dtype == lo.b.dtype:
                blk.copy_(lo.b).mul_(lo.scale)  # H3's op order (exact with fp32 adapters)
            else:
                blk.copy_(lo.b.float() * lo.scale)  # scale in fp32, round once
            c += r
        owned.seen.pop(key + ".lora", None)
        owned.stale(key + ".lora", sources + [la, lb], scales)  # record the copies' versions
    out[key + ".la"] = None if folded is not None else la
    out[key + ".lb"] = lb


def fused_copy_bytes(root: nn.Module, spec: ModelSpec) -> int:
    """Bytes of the fused q|k|v and gate|up copies (what ``fuse=False`` saves)."""
    inter = base_layer(root.model.layers[0].mlp.gate_proj).weight.shape[0]
    per_layer = (spec.q_dim + 2 * spec.kv_dim) * spec.hidden + 2 * inter * spec.hidden
    return spec.layers * per_layer * torch.empty((), dtype=spec.dtype).element_size()


def load_weights(root: nn.Module, spec: ModelSpec, owned: Owned) -> Weights:
    """Effective weights of ``root`` now (see the module docstring for the keys).

    ``owned`` holds the engine's buffers (filled in place, created when missing): reusing
    them keeps their addresses, which captured CUDA graphs rely on.
    """
    out: Weights = {}
    m = root.model
    _fill(owned, "embed", [m.embed_tokens], spec, False, out)
    out["norm"] = _vector(owned, "norm", m.norm.weight, spec)
    if spec.tied:
        out["lm_head"] = out["embed"]
        out["lm_head.b"] = out["lm_head.la"] = out["lm_head.lb"] = None
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


def _vector(owned: Owned, key: str, w: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """A norm weight: the live parameter, or a cast copy in an owned buffer."""
    if w.dtype == spec.dtype:
        return w
    buf = owned.get(key, tuple(w.shape), spec.dtype, spec.device)
    if owned.stale(key, [w]):
        buf.copy_(w)
    return buf
