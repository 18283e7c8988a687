"""A ``.gguf`` model file as a plain Hugging Face folder, converted once and cached.

transformers can load a GGUF directly (``gguf_file=``: it dequantises every tensor to
float), but the model it returns stays tagged "GGUF-quantised" and refuses
``save_pretrained`` (a full-parameter checkpoint, ``danka export``). So every ``.gguf``
path is converted once: dequantised through transformers, special tokens fixed, saved as
safetensors + tokenizer under ``$DANKA_CACHE/models/gguf-<name>-<key>`` (``<key>``: the
file's resolved path, size and modification time), and later loads read that folder as
any local model. The folder is written under a temporary name and renamed, so a killed
conversion never leaves a half cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from danka.errors import UserError, library_errors
from danka.io import OPEN_MODE, apply_file_mode, temp_folder
from danka.safe_read import check_regular

MARKER = "danka_source.json"  # written last into a complete conversion
REGULAR_FIX = (
    "give the path of a .gguf model file (a regular file: not a pipe, a device or a folder)"
)

Log = Callable[[str], Any]


def danka_cache_root() -> Path:
    """``$DANKA_CACHE`` or ``~/.cache/danka``."""
    return Path(os.environ.get("DANKA_CACHE") or Path.home() / ".cache" / "danka").expanduser()


def is_complete(folder: Path) -> bool:
    return (folder / MARKER).is_file() and (folder / "config.json").is_file()


def cache_dir_for(gguf_path: Path) -> Path:
    """``<danka cache>/models/gguf-<stem>-<12 hex>`` for this exact file (path, size, mtime)."""
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return danka_cache_root() / "models" / f"gguf-{gguf_path.stem}-{digest}"


def ensure_converted(
    gguf_path: str | Path,
    *,
    target: Path | None = None,
    info: dict | None = None,
    log: Log = print,
) -> Path:
    """The plain HF folder of ``gguf_path`` (``target``, default :func:`cache_dir_for`),
    converting it first if needed. ``info`` is added to the folder's marker file.

    The conversion is written into ``.tmp-<target name>-<random>`` beside ``target`` and
    renamed. A signal or an error removes the temporary folder (every command unwinds on
    SIGTERM: danka.interrupt); one a killed process left is removed by the next
    conversion (:func:`sweep_orphans`). A cache that cannot be written (read-only, a file
    in the way) is one message naming ``DANKA_CACHE``."""
    gguf_path = Path(gguf_path).expanduser()
    check_regular(gguf_path, what=f"GGUF file {gguf_path}", fix=REGULAR_FIX)
    target = target or cache_dir_for(gguf_path)
    if is_complete(target):
        return target
    if target.exists():
        raise UserError(
            f"{target} exists but is not a complete danka conversion",
            fix=f"delete {target} and run again",
        )
    log(f"Converting {gguf_path.name} to a plain HF folder (one time) in {target}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_orphans(target.parent, log)
        tmp = temp_folder(target.parent, f"{TMP_PREFIX}{target.name}-")
        lock = _hold(tmp)
    except OSError as err:  # read-only filesystem, no permission, a file in the way
        raise cache_error(target.parent, err) from None
    try:
        convert(gguf_path, tmp, log, info=info)
        apply_file_mode(tmp)  # danka's one file mode (safetensors makes 0600 files)
        os.close(lock)
        lock = -1
        (tmp / LOCK).unlink()
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_complete(target):  # not a concurrent conversion that won the race
                raise
    finally:
        if lock >= 0:
            os.close(lock)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


TMP_PREFIX = ".tmp-"  # + the cache folder's name (gguf-..., smollm2-...) + random
LOCK = ".converting"  # flock'ed inside a temporary folder while its conversion runs
ORPHAN_AGE_S = 3600  # a temporary folder without a lock, older than this, is an orphan


def _hold(folder: Path) -> int:
    """An open descriptor holding an exclusive ``flock`` on ``folder/LOCK``: the kernel
    drops it when this process dies, however it dies."""
    import fcntl

    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, OPEN_MODE)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _orphaned(folder: Path) -> bool:
    """True when no live process converts into ``folder``: its lock is free (the process
    that held it died), or it has none and is over an hour old (a folder from before
    locks, or one that crashed between its creation and its lock)."""
    import fcntl
    import time

    try:
        fd = os.open(folder / LOCK, os.O_RDWR)
    except FileNotFoundError:
        try:
            return time.time() - folder.stat().st_mtime > ORPHAN_AGE_S
        except OSError:
            return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a live conversion holds it
    finally:
        os.close(fd)
    return True


def sweep_orphans(models_dir: Path, log: Log = print) -> list[str]:
    """Remove the temporary folders of conversions whose process died (``kill -9``, a
    power cut) from ``models_dir``; never one a live process converts into. Returns the
    removed names."""
    removed = []
    try:
        entries = [p for p in models_dir.iterdir() if p.name.startswith(TMP_PREFIX)]
    except OSError:
        return removed
    for folder in entries:
        if folder.is_dir() and not folder.is_symlink() and _orphaned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    if removed:
        log(
            f"Removed {len(removed)} unfinished conversion(s) a stopped process left in {models_dir}"
        )
    return removed


def cache_error(folder: Path, err: OSError) -> UserError:
    """The message for a danka cache that cannot be written."""
    import errno

    if err.errno == errno.EROFS:
        what = "is on a read-only filesystem"
    elif isinstance(err, PermissionError):
        what = "is not writable (no permission)"
    elif isinstance(err, (FileExistsError, NotADirectoryError)):
        what = "is a file (or a path through a file), not a folder"
    else:
        what = f"cannot be written ({err.strerror or err})"
    return UserError(
        f"the danka cache {what}: a .gguf model is converted there once",
        where=f"{folder} (DANKA_CACHE={os.environ.get('DANKA_CACHE') or 'unset: ~/.cache/danka'})",
        fix="set DANKA_CACHE to a writable folder, e.g. export DANKA_CACHE=/tmp/danka-cache",
    )


def check_gguf(gguf_path: Path) -> None:
    """The one check before anything reads a ``.gguf`` path (the memory plan's shape, the
    conversion): a regular file (never a pipe that blocks), then :func:`check_readable`.
    transformers reads the header unchecked: an empty file or a wrong magic is its
    ValueError, a header claiming 2**60 keys a misleading "JSON file is broken"."""
    check_regular(gguf_path, what=f"GGUF file {gguf_path}", fix=REGULAR_FIX)
    check_readable(gguf_path)


# the header: magic, version (u32), tensor count and metadata key count (u64 each); the
# least a key's entry takes (its name's length, its type, a one-byte value) and a tensor's
# (its name's length, dimensions, type, data offset)
HEADER, MIN_KEY, MIN_TENSOR = 24, 8 + 4 + 1, 8 + 4 + 4 + 8


def check_header(gguf_path: Path) -> None:
    """Refuse what the header says that the file cannot be, from its first bytes: not
    'GGUF', a version the reader does not read, more tensors, keys or key bytes than the
    file's size holds (2**60 keys: the reader failed with 'IndexError: index 0 is out of
    bounds'). Byte order as the reader takes it: a version of 0 in its low half is
    big-endian."""
    import struct

    def refuse(why: str, fix: str = "download the .gguf file again") -> None:
        raise UserError(
            f"cannot read the GGUF file {gguf_path}: {why}", where=str(gguf_path), fix=fix
        )

    with open(gguf_path, "rb") as f:
        head, size = f.read(HEADER + 8), os.fstat(f.fileno()).st_size
    if head[:4] != b"GGUF":
        refuse(
            "it does not start with 'GGUF', so it is not a GGUF file",
            "give a .gguf model file, or the model's Hugging Face folder",
        )
    if len(head) < HEADER:
        refuse(f"it ends inside its header ({size} bytes): a cut file")
    order = "<" if struct.unpack("<I", head[4:8])[0] & 0xFFFF else ">"
    version, tensors, keys = struct.unpack(order + "IQQ", head[4:HEADER])
    if version not in (2, 3):
        refuse(f"it is GGUF version {version}; versions 2 and 3 are read", "convert it again")
    room = size - HEADER
    claims = [(tensors * MIN_TENSOR, f"{tensors:,} tensors"), (keys * MIN_KEY, f"{keys:,} keys")]
    if keys and len(head) == HEADER + 8:  # the first key's name: its length, then its bytes
        first = struct.unpack(order + "Q", head[HEADER:])[0]
        claims.append((8 + first, f"a key of {first:,} bytes"))
    for need, claim in claims:
        if need > room:
            refuse(f"its header claims {claim}, more than its {size:,} bytes hold (a damaged file)")


def check_readable(gguf_path: Path) -> None:
    """Refuse a damaged header (:func:`check_header`), then a file whose tensors run past
    its end (a cut download) before transformers reads it: its error for that case
    ("cannot reshape array ...") names no cause. The ``gguf`` package (what transformers
    reads GGUF with) maps every tensor it lists."""
    check_header(gguf_path)
    try:
        from gguf import GGUFReader
    except ImportError:  # transformers will name the missing package itself
        return
    fix = "download the .gguf file again and compare its size with the original"
    try:
        reader = GGUFReader(str(gguf_path))
        end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, IndexError, KeyError, OSError) as err:
        raise UserError(
            f"cannot read the GGUF file {gguf_path}: it is truncated or damaged "
            f"({type(err).__name__}: {str(err)[:120]})",
            where=str(gguf_path),
            fix=fix,
        ) from err
    size = gguf_path.stat().st_size
    if end > size:
        raise UserError(
            f"cannot read the GGUF file {gguf_path}: it is truncated or damaged (its tensors "
            f"need {end:,} bytes, the file has {size:,})",
            where=str(gguf_path),
            fix=fix,
        )


def convert(gguf_path: Path, out: Path, log: Log = print, *, info: dict | None = None) -> None:
    """Dequantise ``gguf_path`` with transformers and save model + tokenizer into ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from danka.models.special_tokens import fix_special_tokens, sync_special_tokens

    check_readable(gguf_path)
    with library_errors(
        (ValueError, KeyError, OSError),
        f"transformers cannot read the GGUF file {gguf_path}",
        where=str(gguf_path),
        fix="use a GGUF of an architecture transformers supports (llama, mistral, qwen2, "
        "qwen3, ...), or the model's Hugging Face folder",
    ):
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name
        )
    for change in fix_special_tokens(tokenizer):
        log(f"  tokenizer: {change}")
    for change in sync_special_tokens(model, tokenizer):
        log(f"  model: {change}")
    # The weights are already dequantised floats; transformers still tags the model as
    # "gguf-quantised" and refuses to save it, so drop that tag first.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))  # safetensors, float32 (the dequantised values)
    tokenizer.save_pretrained(str(out))
    marker = {"source": str(gguf_path.resolve()), **(info or {})}
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
