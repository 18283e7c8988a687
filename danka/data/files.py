"""Read raw records from a data source: a file, a saved dataset folder, or a hub dataset.

Every record comes back with a *location* string used in error messages:

- ``path/train.jsonl:12``           JSON lines, 1-based line number (as editors show it)
- ``path/data.json:item 3``         JSON array, 0-based item index
- ``path/train.parquet:row 7``      Parquet, 0-based row index (as ``df.iloc`` counts)
- ``path/folder:row 7``             ``datasets.save_to_disk`` folder
- ``hf:openai/gsm8k[train]:row 7``  hub dataset

Nothing here knows about prompt formats; :mod:`danka.data.formats` turns records into
:class:`~danka.types.PromptRow`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from danka.errors import UserError
from danka.io import atomic_path, write_text_atomic  # noqa: F401  (re-exported)
from danka.safe_read import check_regular

DATASET_TYPES = ("json", "jsonl", "parquet", "hf")
_FILE_SUFFIXES = {".json": "json", ".jsonl": "jsonl", ".parquet": "parquet"}
# "owner/name" or "name", optionally ":config" (e.g. "openai/gsm8k:main").
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?$")
_JSONL_FIX = "each line must be one JSON object (check with python -m json.tool)"

Record = tuple[str, dict[str, Any]]


def read_records(
    source: str,
    *,
    base_dir: Path | None = None,
    split: str = "train",
    dataset_type: str | None = None,
    bad_lines: list[tuple[str, str]] | None = None,
) -> list[Record]:
    """All records of ``source`` as ``(location, record)`` pairs, in file order.

    ``source`` is a path (relative ones are resolved against ``base_dir``, e.g. the
    config file's folder, then the current directory) or a hub dataset name
    ``owner/name[:config]``. ``dataset_type`` (json, jsonl, parquet, hf) overrides the
    detection from the suffix; ``json`` accepts a JSON array *or* JSON lines. A folder is
    read with ``datasets.load_from_disk`` (a ``DatasetDict`` gives its ``split``), or, if
    it is not a saved dataset, as ``{split}.parquet`` / ``{split}.jsonl`` inside it.

    ``bad_lines``: if given, JSON lines that do not parse are appended to it as
    ``(location, reason)`` instead of raising (for ``on_bad_row: skip``).
    """
    if dataset_type is not None and dataset_type not in DATASET_TYPES:
        raise UserError(
            f"unknown dataset_type {dataset_type!r}",
            "data.dataset_type",
            f"use one of {', '.join(DATASET_TYPES)}, or leave it unset to detect from the file",
        )
    path = _resolve(source, base_dir)
    if dataset_type == "hf" or (path is None and dataset_type is None and _looks_like_hub(source)):
        records = _read_hub(source, split)
    elif path is None:
        raise UserError(
            f"data file not found: {source}",
            source,
            "check the path (relative paths are resolved against the config file's folder, "
            f"then the current directory{'' if base_dir is None else f': {base_dir}'})",
        )
    elif path.is_dir():
        records = _read_folder(path, split, bad_lines)
    else:
        kind = dataset_type or _FILE_SUFFIXES.get(path.suffix.lower())
        if kind is None:
            raise UserError(
                f"cannot tell the format of {path.name} from its suffix",
                str(path),
                "name it .jsonl, .json or .parquet, or set data.dataset_type (json, jsonl, parquet)",
            )
        records = _read_file(path, kind, bad_lines)
    if not records and not bad_lines:
        raise UserError(
            "the data source has no rows", source, "point the data path at a non-empty file"
        )
    return records


def _resolve(source: str, base_dir: Path | None) -> Path | None:
    """The existing path that ``source`` names, or None."""
    candidate = Path(source).expanduser()
    if candidate.is_absolute():  # lexists: a symlink loop is named, not "not found"
        return candidate if os.path.lexists(candidate) else None
    for root in ([base_dir] if base_dir is not None else []) + [Path.cwd()]:
        if os.path.lexists(root / candidate):
            return root / candidate
    return None


def _looks_like_hub(source: str) -> bool:
    return bool(_HUB_NAME.match(source)) and Path(source).suffix.lower() not in _FILE_SUFFIXES


MAX_RECORD_BYTES = 16 << 20  # one row of text data: far above any prompt a model can take


def _long_lines(path: Path) -> dict[int, int]:
    """{line number: bytes} of the lines over :data:`MAX_RECORD_BYTES`, counted on the raw
    bytes in 1 MiB chunks (nothing is decoded, parsed or held whole)."""
    found: dict[int, int] = {}
    with open(path, "rb") as f:
        lineno, size = 1, 0
        for chunk in iter(lambda: f.read(1 << 20), b""):
            parts = chunk.split(b"\n")
            for part in parts[:-1]:
                size += len(part)
                if size > MAX_RECORD_BYTES:
                    found[lineno] = size
                lineno, size = lineno + 1, 0
            size += len(parts[-1])  # the line goes on in the next chunk
        if size > MAX_RECORD_BYTES:
            found[lineno] = size
    return found


def _refuse_long_lines(path: Path, bad_lines: list | None) -> set[int]:
    """UserError for the first JSON line over the limit (why: a 50 MB line was refused only
    after minutes of tokenising at 11.7 GB of memory); with ``bad_lines`` (``on_bad_row:
    skip``) each is recorded there and its number returned, to be skipped."""
    found = _long_lines(path)
    for lineno, size in sorted(found.items()):
        what = (
            f"line is {size / 2**20:.1f} MB, over danka's limit of {MAX_RECORD_BYTES >> 20} MB "
            "per row (no prompt that long fits a model)"
        )
        if bad_lines is None:
            raise UserError(
                what,
                f"{path}:{lineno}",
                "remove or shorten the row (data.on_bad_row: skip skips it)",
            )
        bad_lines.append((f"{path}:{lineno}", what))
    return set(found)


def _is_json_array(path: Path, kind: str) -> bool:
    if kind != "json":
        return False
    with open(path, "rb") as f:
        return f.read(4096).lstrip().startswith(b"[")


def _read_file(path: Path, kind: str, bad_lines: list | None) -> list[Record]:
    check_regular(path, what="the data file", fix="give a .jsonl, .json or .parquet file")
    if kind == "parquet":
        return _read_parquet(path)
    skip: set[int] = set()
    if path.stat().st_size > MAX_RECORD_BYTES and not _is_json_array(path, kind):
        skip = _refuse_long_lines(path, bad_lines)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"not UTF-8 text ({err})", str(path), "save the file as UTF-8 JSON"
        ) from err
    if kind == "json" and text.lstrip().startswith("["):
        return _parse_json_array(path, text)
    return _parse_json_lines(path, text, bad_lines, skip)


def _parse_json_array(path: Path, text: str) -> list[Record]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(
            f"invalid JSON: {err.msg} (line {err.lineno}, column {err.colno})",
            f"{path}:{err.lineno}",
            "the file must be one JSON array of objects, or one JSON object per line "
            "(check with python -m json.tool)",
        ) from err
    except (RecursionError, ValueError) as err:  # nested thousands deep; a 5000-digit number
        raise UserError(
            f"unreadable JSON ({type(err).__name__}: {str(err)[:100]})",
            str(path),
            "the file must be one JSON array of objects",
        ) from None
    records = []
    for i, item in enumerate(items):
        where = f"{path}:item {i}"
        if not isinstance(item, dict):
            raise UserError(
                f"array item is a {type(item).__name__}, not a JSON object",
                where,
                'each item must be an object such as {"prompt": ...}',
            )
        records.append((where, item))
    return records


def _parse_json_lines(
    path: Path, text: str, bad_lines: list | None, skip: set[int] = frozenset()
) -> list[Record]:
    records = []
    # JSON Lines ends a record at "\n" only: str.splitlines() would also split at U+2028,
    # U+0085 ... which JSON allows unescaped inside strings (json.dumps(ensure_ascii=False))
    for lineno, line in enumerate(text.split("\n"), start=1):
        if lineno in skip or not line.strip():  # skip: over the size limit, reported
            continue
        where = f"{path}:{lineno}"
        try:
            item = json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError) as err:
            reason = (
                f"invalid JSON: {err.msg} (column {err.colno})"
                if isinstance(err, json.JSONDecodeError)
                else f"unreadable JSON ({type(err).__name__}: {str(err)[:100]})"
            )
            if bad_lines is None:
                raise UserError(reason, where, _JSONL_FIX) from err
            bad_lines.append((where, reason))
            continue
        if not isinstance(item, dict):
            reason = f"line is a JSON {type(item).__name__}, not an object"
            if bad_lines is None:
                raise UserError(reason, where, _JSONL_FIX)
            bad_lines.append((where, reason))
            continue
        records.append((where, item))
    return records


def _read_parquet(path: Path) -> list[Record]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise UserError(
            f"cannot read Parquet file: {err}", str(path), "check that it is a valid .parquet file"
        ) from err
    return [(f"{path}:row {i}", row) for i, row in enumerate(table.to_pylist())]


def _read_folder(path: Path, split: str, bad_lines: list | None) -> list[Record]:
    is_saved = (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()
    if not is_saved:
        for name, kind in ((f"{split}.parquet", "parquet"), (f"{split}.jsonl", "jsonl")):
            if (path / name).exists():
                return _read_file(path / name, kind, bad_lines)
        raise UserError(
            f"folder is neither a saved dataset nor holds {split}.parquet / {split}.jsonl",
            str(path),
            "point data.train_dataset at a file, or save the dataset with "
            "datasets.Dataset.save_to_disk",
        )
    from datasets import DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(path))
    except Exception as err:
        raise UserError(
            f"cannot load saved dataset: {err}", str(path), "re-save it with save_to_disk"
        ) from err
    if isinstance(ds, DatasetDict):
        if split not in ds:
            raise UserError(
                f"saved dataset has no split {split!r} (it has: {', '.join(ds)})",
                str(path),
                "set the split to one of those",
            )
        ds = ds[split]
    return [(f"{path}:row {i}", dict(row)) for i, row in enumerate(ds)]


def _read_hub(source: str, split: str) -> list[Record]:
    from datasets import load_dataset

    name, _, config = source.partition(":")
    try:
        ds = load_dataset(name, config or None, split=split)
    except Exception as err:  # offline, unknown name, gated, bad split: all end here
        raise UserError(
            f"no local file or folder {source!r}, and cannot load it as a hub dataset "
            f"{name!r} (split {split!r}): the hub may be unreachable or the name wrong "
            f"({type(err).__name__}: {str(err)[:200]})",
            source,
            "pass a local file instead (.jsonl, .json, .parquet or a save_to_disk folder); "
            "GSM8K's official train.jsonl can be converted with danka.data.gsm8k.convert_gsm8k",
        ) from err
    return [(f"hf:{source}[{split}]:row {i}", dict(row)) for i, row in enumerate(ds)]


def write_parquet_atomic(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows), str(tmp))
