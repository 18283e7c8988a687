"""Bounded reads of the files danka is handed: configs, run folders, checkpoints, models.

Each of these can be something else than the regular file its name promises, and a plain
``read_text()`` then hangs or crashes instead of saying what is wrong:

- a named pipe (``mkfifo config.json``) blocks ``open`` until someone writes to it, a
  device (``/dev/zero``) never ends, a folder, a socket or a symlink loop raise an
  ``OSError`` whose traceback names no fix. :func:`check_regular` refuses them by their
  ``stat`` BEFORE anything is opened; :func:`open_regular` opens without blocking and checks
  the descriptor again (``fstat``), so a file swapped for a pipe in between cannot hang;
- a size limit per kind of file: a config is kilobytes; a multi-gigabyte "config.json" is
  not one, and reading it whole would take the machine's memory;
- JSON nested deeper than the parser's recursion limit (``[[[[...`` 100k deep) raises
  ``RecursionError``, which is not a ``JSONDecodeError``: :func:`loads_json` reports both;
- text that is not UTF-8 is named with its line.

Every refusal is a :class:`~danka.errors.UserError` (exit 2) naming the file and the fix.
JSON-lines files a run appends to (metrics, completions) are read by
:func:`iter_json_lines` in chunks, one line at a time, skipping what does not parse (a live
run's half-written last line) and lines over the size limit without holding them.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from danka.errors import UserError

MiB = 1 << 20
MAX_CONFIG_BYTES = 8 * MiB  # a YAML config or an override: kilobytes in practice
MAX_JSON_BYTES = 64 * MiB  # a JSON file of a run, checkpoint or model folder (not weights)
MAX_LINE_BYTES = 16 * MiB  # one line of a JSON-lines file (as data.files allows per row)
MAX_LINES_BYTES = 2048 * MiB  # a JSON-lines file a run appends to (metrics of ~2M steps)

_SPECIAL = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(mode: int) -> str | None:
    """What a ``st_mode`` is when it is not a regular file ("a named pipe (FIFO)", ...)."""
    for test, name in _SPECIAL:
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def _stat_error(path: Path, err: OSError, what: str, fix: str) -> UserError:
    reasons = {
        errno.ENOENT: "does not exist",
        errno.ELOOP: "is a symbolic link loop (links that point at each other)",
        errno.EACCES: "cannot be read (no permission)",
        errno.ENOTDIR: "is on a path through a file, not a folder",
        errno.ENAMETOOLONG: "has a name too long for the filesystem",
    }
    reason = reasons.get(err.errno, f"cannot be read ({err.strerror or err})")
    return UserError(f"{what} {reason}", where=str(path), fix=fix)


def check_regular(path: str | Path, *, what: str = "the file", fix: str = "") -> os.stat_result:
    """``os.stat(path)`` when it is a regular file (through symlinks), else UserError:
    missing, a folder, a named pipe, a device, a socket, a symlink loop, unreadable."""
    path = Path(path)
    fix = fix or "give the path of a regular file"
    try:
        st = os.stat(path)
    except OSError as err:
        raise _stat_error(path, err, what, fix) from None
    kind = special_kind(st.st_mode)
    if kind is not None:
        raise UserError(f"{what} is {kind}, not a regular file", where=str(path), fix=fix)
    return st


def is_regular(path: str | Path) -> bool:
    """True for an existing regular file (through symlinks); False for anything else,
    a symlink loop and an unreadable path included. Never blocks."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def open_regular(path: str | Path, *, what: str = "the file", fix: str = "") -> BinaryIO:
    """The regular file ``path`` opened for reading in binary; never blocks on a pipe."""
    check_regular(path, what=what, fix=fix)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags | os.O_CLOEXEC)
    except OSError as err:
        raise _stat_error(Path(path), err, what, fix or "give the path of a regular file") from None
    kind = special_kind(os.fstat(fd).st_mode)
    if kind is not None:  # swapped after the check
        os.close(fd)
        raise UserError(f"{what} is {kind}, not a regular file", where=str(path), fix=fix)
    return os.fdopen(fd, "rb")


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


def _too_large(path: str | Path, limit: int, what: str, fix: str) -> UserError:
    return UserError(
        f"{what} is larger than {_size(limit)}, far more than such a file holds",
        where=str(path),
        fix=fix or "give the right file",
    )


def read_bytes(path: str | Path, *, limit: int, what: str = "the file", fix: str = "") -> bytes:
    """The bytes of the regular file ``path``; UserError when it holds over ``limit``."""
    with open_regular(path, what=what, fix=fix) as f:
        if os.fstat(f.fileno()).st_size > limit:  # a sparse terabyte: not even a part read
            raise _too_large(path, limit, what, fix)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _too_large(path, limit, what, fix)
    return data


def decode_utf8(raw: bytes, path: str | Path, *, what: str = "the file", fix: str = "") -> str:
    """``raw`` as UTF-8 text; UserError naming the line of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise UserError(
            f"{what} is not UTF-8 text (byte {raw[err.start]:#04x} at offset {err.start})",
            where=f"{path}:{line}",
            fix=fix or "save the file as UTF-8",
        ) from None


def read_text(
    path: str | Path, *, limit: int = MAX_JSON_BYTES, what: str = "the file", fix: str = ""
) -> str:
    """UTF-8 text of the regular file ``path``, at most ``limit`` bytes."""
    return decode_utf8(read_bytes(path, limit=limit, what=what, fix=fix), path, what=what, fix=fix)


def loads_json(text: str | bytes, *, where: str, what: str = "the file", fix: str = "") -> Any:
    """``json.loads`` whose failures, a structure nested too deep included, are UserErrors."""
    fix = fix or "check it with python -m json.tool FILE"
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(
            f"{what} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})",
            where=f"{where}:{err.lineno}",
            fix=fix,
        ) from None
    except RecursionError:
        raise UserError(
            f"{what} is JSON nested deeper than the parser allows (thousands of levels): "
            "not a file danka or a model library writes",
            where=where,
            fix=fix,
        ) from None
    except UnicodeDecodeError as err:  # bytes given
        raise UserError(f"{what} is not UTF-8 text ({err.reason})", where=where, fix=fix) from None
    except ValueError as err:  # an integer of over 4300 digits
        raise UserError(
            f"{what} holds a value Python cannot read ({str(err).split(':')[0]})",
            where=where,
            fix=fix,
        ) from None


def read_json(
    path: str | Path, *, limit: int = MAX_JSON_BYTES, what: str = "the file", fix: str = ""
) -> Any:
    """The JSON value of the regular file ``path`` (UTF-8, at most ``limit`` bytes)."""
    text = read_text(path, limit=limit, what=what, fix=fix)
    return loads_json(text, where=str(path), what=what, fix=fix)


def parse_line(line: bytes) -> Any | None:
    """One JSON line's value, or None when it does not parse (broken, half-written, nested
    too deep, not UTF-8)."""
    try:
        return json.loads(line) if line.strip() else None
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def iter_lines(
    path: str | Path,
    *,
    max_line: int = MAX_LINE_BYTES,
    limit: int = MAX_LINES_BYTES,
    what: str = "the file",
    fix: str = "",
) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of each line of the regular file ``path``, read in 1 MiB
    chunks; a line over ``max_line`` bytes is skipped without being held whole. UserError
    (before reading) for a file over ``limit`` bytes (a sparse terabyte would take hours)."""
    with open_regular(path, what=what, fix=fix) as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise _too_large(path, limit, what, fix)
        lineno, pending, skipping = 1, b"", False
        for chunk in iter(lambda: f.read(MiB), b""):
            parts = chunk.split(b"\n")
            for part in parts[:-1]:
                if not skipping and len(pending) + len(part) <= max_line:
                    yield lineno, pending + part
                lineno, pending, skipping = lineno + 1, b"", False
            if not skipping:
                pending += parts[-1]
                if len(pending) > max_line:
                    pending, skipping = b"", True
        if pending and not skipping:
            yield lineno, pending


def iter_json_lines(path: str | Path, **kw: Any) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each line of ``path`` that parses as JSON (see
    :func:`iter_lines` for ``kw`` and the size limit)."""
    for lineno, line in iter_lines(path, **kw):
        value = parse_line(line)
        if value is not None:
            yield lineno, value


def refuse_special_files(folder: str | Path, *, what: str, fix: str, depth: int = 2) -> None:
    """UserError for the first entry of ``folder`` (and its subfolders, ``depth`` levels)
    that a library reading the folder would block or crash on: a named pipe, a device, a
    socket or a symlink loop. Symlinked folders are not followed."""
    todo = [(Path(folder), 0)]
    while todo:
        here, level = todo.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            return  # the caller reports a missing or unreadable folder itself
        for entry in entries:
            try:
                st = os.stat(entry.path)
            except FileNotFoundError:
                continue  # a dangling link: a library that needs the file names it
            except OSError as err:
                raise _stat_error(Path(entry.path), err, f"{what}: this entry", fix) from None
            if stat.S_ISDIR(st.st_mode):
                if level + 1 < depth and not entry.is_symlink():
                    todo.append((Path(entry.path), level + 1))
                continue
            kind = special_kind(st.st_mode)
            if kind is not None:
                raise UserError(
                    f"{what}: this entry is {kind}, not a regular file",
                    where=entry.path,
                    fix=fix,
                )


# ---------------------------------------------------------------- YAML (configs, overrides)

# Values a YAML document may expand to through its aliases: a config has a few hundred.
# "10 levels of 9 aliases" (a 1 KB file) expands to 9^10 values: every walk over it (the
# duplicate-key check, a key's line, the dataclass build, --print-config) never ended.
MAX_YAML_VALUES = 100_000


def _children(node: Any) -> list:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: Any, where: str, limit: int) -> None:
    """UserError when the node graph ``root`` refers to itself (a recursive alias) or
    expands to over ``limit`` values; linear in the nodes written, not in the expansion."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(root, False)]
    fix = "write the values out, or use fewer levels of aliases (*name)"
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > limit:
                raise UserError(
                    f"the YAML holds over {limit:,} values, counting each alias (*name) as "
                    "the values it stands for (an alias bomb?); no config holds that many",
                    where=f"{where}:{node.start_mark.line + 1}",
                    fix=fix,
                )
            continue
        if key in size:
            continue
        if len(getattr(node, "value", "")) > 4000 and node.tag.endswith(":int"):
            raise UserError(
                "an integer of thousands of digits (no setting counts that far)",
                where=f"{where}:{node.start_mark.line + 1}",
                fix="write numbers of at most a few digits",
            )
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise UserError(
                    "a YAML alias refers to the value that contains it (a recursive alias)",
                    where=f"{where}:{child.start_mark.line + 1}",
                    fix=fix,
                )
            if id(child) not in size:
                stack.append((child, False))


def load_yaml(text: str, *, where: str, limit: int = MAX_YAML_VALUES) -> Any:
    """``yaml.safe_load(text)``, bounded: composed once, refused (UserError naming
    ``where`` and the line) when its aliases expand to over ``limit`` values or refer to
    themselves, or when it nests deeper than the parser can go. Syntax errors are
    ``yaml.YAMLError`` as from ``safe_load`` (callers word those themselves)."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_expansion(node, where, limit)
            return loader.construct_document(node)
        except RecursionError:
            raise UserError(
                "the YAML nests deeper than the parser allows (hundreds of levels)",
                where=where,
                fix="write a flat config: sections of keys, as in examples/",
            ) from None
        except ValueError as err:  # an integer of over 4300 digits
            raise UserError(
                f"the YAML holds a value Python cannot read ({str(err).split(':')[0]})",
                where=where,
                fix="write numbers of at most a few digits",
            ) from None
    finally:
        loader.dispose()
