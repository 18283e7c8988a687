"""Write a Hugging Face causal LM (a merged danka export) as one ``.gguf`` file.

What llama.cpp, Ollama and LM Studio run. The layout follows llama.cpp's own
``convert_hf_to_gguf.py`` for the architectures danka trains most (Llama/SmolLM2,
Mistral, Qwen2/2.5, Qwen3), written through the ``gguf`` package (llama.cpp's Python
library):

- metadata ``general.*``, ``<arch>.*`` (context length, sizes, heads, RoPE base, RMS-norm
  epsilon) and ``tokenizer.ggml.*`` (byte-level BPE vocabulary, merges, special ids, the
  chat template);
- tensors under llama.cpp's names (``gguf.get_tensor_name_map``); Llama-family query/key
  projections permuted into llama.cpp's RoPE layout (``LlamaModel.permute`` there); a tied
  ``lm_head`` is left out (llama.cpp reuses ``token_embd``);
- 2-D weights in ``f32``, ``f16``, ``bf16`` or ``q8_0``; norms and biases in f32.

Only byte-level BPE tokenizers (``tokenizer.json`` with a ByteLevel pre-tokenizer: SmolLM2,
Qwen2/2.5/3, Llama 3) are written; a SentencePiece vocabulary is refused with a UserError.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from danka.errors import UserError

# HF model_type -> (gguf arch, q/k permuted for llama.cpp's RoPE)
ARCHES = {
    "llama": ("LLAMA", True),
    "mistral": ("LLAMA", True),  # llama.cpp writes Mistral as llama
    "qwen2": ("QWEN2", False),
    "qwen3": ("QWEN3", False),
}
OUT_TYPES = ("f32", "f16", "bf16", "q8_0")
# llama.cpp's pre-tokenizer names, from the tokenizer's own path when it names the family
_PRE = (("smollm", "smollm"), ("qwen", "qwen2"), ("llama-3", "llama-bpe"), ("llama3", "llama-bpe"))


def _permute(w: torch.Tensor, n_head: int, n_head_kv: int | None = None) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute``: HF's rotate-half rows -> interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _tensor_type(out_type: str, gguf: Any, ndim: int):
    q = gguf.GGMLQuantizationType
    if ndim < 2 or out_type == "f32":
        return q.F32
    return {"f16": q.F16, "bf16": q.BF16, "q8_0": q.Q8_0}[out_type]


def _file_type(out_type: str, gguf: Any):
    f = gguf.LlamaFileType
    return {
        "f32": f.ALL_F32,
        "f16": f.MOSTLY_F16,
        "bf16": f.MOSTLY_BF16,
        "q8_0": f.MOSTLY_Q8_0,
    }[out_type]


def _encode(array: np.ndarray, qtype: Any, gguf: Any) -> np.ndarray:
    q = gguf.GGMLQuantizationType
    if qtype == q.F32:
        return array.astype(np.float32)
    if qtype == q.F16:
        return array.astype(np.float16)
    if qtype == q.Q8_0 and array.shape[-1] % 32:
        return array.astype(np.float16)  # Q8_0 needs rows in blocks of 32 (llama.cpp does too)
    return gguf.quants.quantize(array.astype(np.float32), qtype)


def _vocab(tokenizer: Any) -> tuple[list[str], list[int], list[str]]:
    """Tokens by id, their llama.cpp types (1 normal, 3 control, 4 user-defined) and merges."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise UserError(
            "GGUF export needs a fast tokenizer (tokenizer.json)",
            where="danka export --gguf",
            fix="export a model whose folder has tokenizer.json",
        )
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    pre = json.dumps(spec.get("pre_tokenizer") or {})
    if model.get("type") != "BPE" or "ByteLevel" not in pre:
        raise UserError(
            "GGUF export writes byte-level BPE tokenizers (SmolLM2, Qwen2/2.5/3, Llama 3); "
            f"this one is {model.get('type')} with pre-tokenizer "
            f"{(spec.get('pre_tokenizer') or {}).get('type')}",
            where="danka export --gguf",
            fix="convert the merged folder with llama.cpp's convert_hf_to_gguf.py instead",
        )
    vocab = tokenizer.get_vocab()
    size = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [5] * size  # UNUSED until a token fills the slot
    for token, idx in vocab.items():
        tokens[idx], types[idx] = token, 1
    for added in spec.get("added_tokens") or []:
        idx = added["id"]
        if idx < size:
            types[idx] = 3 if added.get("special") else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return tokens, types, merges


def _pre_name(tokenizer: Any) -> str:
    name = str(getattr(tokenizer, "name_or_path", "")).lower()
    for needle, pre in _PRE:
        if needle in name:
            return pre
    return "default"


def _add_tokenizer(w: Any, tokenizer: Any) -> None:
    """The tokenizer's vocabulary, merges, special ids and chat template, as llama.cpp's
    "gpt2" (byte-level BPE) tokenizer reads them."""
    tokens, types, merges = _vocab(tokenizer)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(_pre_name(tokenizer))
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges:
        w.add_token_merges(merges)
    else:  # a vocabulary without merges (bytes only): readers rebuild them from scores
        w.add_token_scores([-float(i) for i in range(len(tokens))])
    for attr, add in (
        ("bos_token_id", w.add_bos_token_id),
        ("eos_token_id", w.add_eos_token_id),
        ("pad_token_id", w.add_pad_token_id),
        ("unk_token_id", w.add_unk_token_id),
    ):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            add(int(value))
    w.add_add_bos_token(False)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        w.add_chat_template(template)


def write_gguf(
    model: torch.nn.Module,
    tokenizer: Any,
    path: str | Path,
    *,
    out_type: str = "f16",
    name: str | None = None,
    log: Callable[[str], Any] = print,
) -> Path:
    """Write ``model`` (a plain HF causal LM, no adapters) and ``tokenizer`` to ``path``."""
    import gguf

    arch_key, permute_qk = _arch(model, out_type)
    cfg = model.config
    arch = getattr(gguf.MODEL_ARCH, arch_key)
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    heads = _heads(cfg)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch_name)
    _add_metadata(w, gguf, cfg, out_type, name, heads)
    _add_tokenizer(w, tokenizer)
    count = _add_tensors(w, gguf, model, arch, out_type, heads[:2] if permute_qk else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    log(f"wrote {path} ({out_type}, {count} tensors, {path.stat().st_size / 2**20:.1f} MiB)")
    return path


def _arch(model: torch.nn.Module, out_type: str) -> tuple[str, bool]:
    """(gguf arch, q/k permuted) of ``model``; UserError for an unknown type or arch."""
    if out_type not in OUT_TYPES:
        raise UserError(
            f"unknown GGUF type {out_type!r}",
            where="--gguf-type",
            fix=f"use one of: {', '.join(OUT_TYPES)}",
        )
    cfg = model.config
    if cfg.model_type not in ARCHES:
        raise UserError(
            f"GGUF export does not know the architecture {cfg.model_type!r}",
            where="danka export --gguf",
            fix=f"supported: {', '.join(ARCHES)}; otherwise convert the merged folder "
            "with llama.cpp's convert_hf_to_gguf.py",
        )
    return ARCHES[cfg.model_type]


def _heads(cfg: Any) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim)."""
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
    return n_head, n_kv, getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head


def _add_metadata(w: Any, gguf: Any, cfg: Any, out_type: str, name: str | None, heads) -> None:
    """``general.*`` and ``<arch>.*``: name, file type, sizes, heads, RoPE, RMS-norm eps."""
    n_head, n_kv, head_dim = heads
    w.add_name(name or Path(str(cfg.name_or_path or "model")).name)
    w.add_file_type(_file_type(out_type, gguf))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    if head_dim != cfg.hidden_size // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is not None:
        w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_vocab_size(cfg.vocab_size)


def _add_tensors(w: Any, gguf: Any, model: Any, arch: Any, out_type: str, qk_heads) -> int:
    """Every weight under its llama.cpp name, encoded in ``out_type``; ``qk_heads``: (query
    heads, key/value heads) to permute q/k into llama.cpp's RoPE layout, None to leave them.
    Returns the number written."""
    cfg = model.config
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    count = 0
    for key, tensor in model.state_dict().items():
        if tied and key == "lm_head.weight":
            continue  # llama.cpp reuses token_embd.weight
        new = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if new is None:
            if key.endswith("rotary_emb.inv_freq"):
                continue
            raise UserError(
                f"GGUF export: no llama.cpp name for weight {key!r}",
                where="danka export --gguf",
                fix="export without --gguf and convert with llama.cpp's convert_hf_to_gguf.py",
            )
        t = tensor.detach().to(torch.float32).cpu()
        if qk_heads and key.endswith("q_proj.weight"):
            t = _permute(t, qk_heads[0], qk_heads[0])
        elif qk_heads and key.endswith("k_proj.weight"):
            t = _permute(t, *qk_heads)
        qtype = _tensor_type(out_type, gguf, t.ndim)
        data = _encode(t.numpy(), qtype, gguf)
        raw = qtype if data.dtype == np.uint8 else None
        w.add_tensor(new, data, raw_dtype=raw)
        count += 1
    return count
