"""YAML + ``key=value`` overrides -> a typed ``DankaConfig``, checked once at start-up.

Errors name the file, the line and the key, and say what to write instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from danka.config.validate import freeze, validate
from danka.errors import UserError
from danka.limits import check_limits
from danka.safe_read import MAX_CONFIG_BYTES, decode_utf8, load_yaml, read_bytes
from danka.schema.moved import new_key, relocate, retire
from danka.schema.sections import LOADERS, DankaConfig


def _key_lines(text: str) -> dict[str, int]:
    """Map dotted key paths to their 1-based line in the YAML text."""
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                path = f"{prefix}{key_node.value}"
                lines[path] = key_node.start_mark.line + 1
                walk(value_node, path + ".")
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{prefix[:-1]}[{i}].")

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, "")
    return lines


class _Source:
    """Where values came from, for error messages."""

    def __init__(self, path: Path | None, text: str = ""):
        self.path = path
        self.lines = _key_lines(text) if text else {}
        self.overridden: dict[str, str] = {}  # dotted key -> "#k: key=value" as typed
        self.explicit: set[str] = set()  # dotted keys the user set (file or override)
        self.written: dict[str, str] = {}  # key -> the older name the user wrote (moved.py)

    def renamed(self, moves: dict[str, str]) -> None:
        """Keys moved from their old place (``moves``: new dotted key -> old): messages
        find their lines under the new name and show the name the user wrote."""
        for new, old in moves.items():
            self.written[new] = old
            for key in [k for k in self.lines if k == old or k.startswith(old + ".")]:
                self.lines[new + key[len(old) :]] = self.lines[key]

    def _shown(self, key: str) -> str:
        for new, old in self.written.items():
            if key == new or key.startswith(new + "."):
                return f"{old + key[len(new) :]} (now {key})"
        return key

    def override_of(self, key: str) -> str | None:
        """The override (``command-line override #k: key=value``) that set ``key``: the
        key itself, a list or mapping holding it (``reward.functions=[{weight: .nan}]``
        for ``reward.functions[0].weight``), or a section it created (``foo.bar=1``
        makes the unknown key ``foo``); None when the file (or the default) set it."""
        for k, shown in reversed(self.overridden.items()):  # the last override wins
            inside = key.startswith((k + ".", k + "["))
            if key == k or inside or (k.startswith(key + ".") and key not in self.lines):
                return f"command-line override {shown}" + (f": key {key}" if inside else "")
        return None

    def line_of(self, key: str) -> int | None:
        """The line that sets ``key``; for an item of a list of plain values (which has
        no line of its own, ``eval.probe_prompts[1]``) the list's."""
        while key not in self.lines and key.endswith("]"):
            key = key[: key.rindex("[")]
        return self.lines.get(key)

    def where(self, key: str) -> str:
        if by_override := self.override_of(key):
            return by_override
        if self.path is None:
            return f"config key {self._shown(key)}"
        line = self.line_of(key)
        shown = self._shown(key)
        return f"{self.path}:{line}: key {shown}" if line else f"{self.path}: key {shown}"


def read_yaml(path: Path) -> tuple[dict, str]:
    if path.is_dir():
        raise UserError(
            "this is a folder, not a config file",
            where=str(path),
            fix="give the YAML file itself, e.g. danka train "
            + str(path / "config.yaml" if (path / "config.yaml").is_file() else "CONFIG.yaml"),
        )
    if not path.exists() and not path.is_symlink():
        raise UserError(
            "config file not found", where=str(path), fix="check the path (danka train CONFIG.yaml)"
        )
    what, fix = "the config file", "give the YAML config file itself (danka train CONFIG.yaml)"
    raw = read_bytes(path, limit=MAX_CONFIG_BYTES, what=what, fix=fix)  # never a pipe
    text = decode_utf8(
        raw, path, what=what, fix="save the file as UTF-8 (most editors: 'Save with encoding')"
    )
    try:
        data = load_yaml(text, where=str(path))  # alias bombs and deep nesting refused
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise UserError(
            f"invalid YAML ({getattr(err, 'problem', err)})",
            where=where,
            fix="fix the YAML syntax (indentation, colons, quotes)",
        ) from None
    _refuse_duplicate_keys(path, text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(
            "the config must be a mapping of sections",
            where=str(path),
            fix="start with sections like 'model:', 'trainer:', 'data:'",
        )
    return data, text


def _refuse_duplicate_keys(path: Path, text: str) -> None:
    """UserError naming both lines when one mapping sets a key twice (PyYAML silently keeps
    the last value: ``total_steps: 2`` on line 4 and ``total_steps: 500`` on line 10 ran
    500 steps)."""

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in node.value:
                key, line = str(key_node.value), key_node.start_mark.line + 1
                if key in seen:
                    raise UserError(
                        f"duplicate key {prefix + key!r}: set on line {seen[key]} and again on "
                        f"line {line}",
                        where=f"{path}:{line}",
                        fix="keep one of the two lines",
                    )
                seen[key] = line
                walk(value_node, f"{prefix}{key}.")
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{prefix[:-1]}[{i}].")

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        walk(root, "")


def apply_overrides(data: dict, overrides: list[str], source: _Source) -> None:
    """Apply ``a.b.c=value`` overrides; values are parsed as YAML (lists, null, numbers)."""
    if isinstance(overrides, str):  # danka.train(..., overrides="a=1"): one override
        overrides = [overrides]
    named: dict[str, tuple[int, str]] = {}  # current dotted key -> (#k, the name written)
    for number, item in enumerate(overrides, 1):
        if not isinstance(item, str):
            raise UserError(
                f"an override must be a 'key=value' string, got {_shown(item, 60)}",
                where="overrides",
                fix="overrides=['trainer.total_steps=2', ...]",
            )
        if "=" not in item:
            raise UserError(
                f"override {item!r} has no '='",
                where="command line",
                fix="write overrides as section.key=value, e.g. trainer.batch_size=8",
            )
        key, raw = item.split("=", 1)
        written = key.strip()
        key = new_key(written)  # a key under its older name (moved.py) lands in its place
        _refuse_both_names(named, key, written, number)
        named[key] = (number, written)
        if key != written:
            source.written[key] = written
        text = raw.strip()
        shown = f"#{number}: {written}={text if len(text) <= 60 else text[:60] + '...'}"
        try:
            value = (
                load_yaml(raw, where=f"command-line override {written}") if raw.strip() else None
            )
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UserError(
                    f"{part!r} is not a section",
                    where=f"command-line override {shown}",
                    fix="override a leaf key, e.g. optim.lr=1e-5",
                )
            node = child
        node[parts[-1]] = value
        source.overridden.pop(key, None)  # re-added last: the override in effect
        source.overridden[key] = shown


def _refuse_both_names(named: dict[str, tuple[int, str]], key: str, written: str, number: int):
    """UserError when override #``number`` (``written``, now ``key``) and an earlier one
    name one setting (or a section and a key in it) under its older and its current name
    (config/moved.py): the last would win silently, where the same pair in a file is
    refused. One name given twice is an ordinary override of an override."""
    for other, (k, name) in named.items():
        same = other == key or other.startswith(key + ".") or key.startswith(other + ".")
        if same and (name == other) != (written == key):  # one old name, one current
            old, new = (name, written) if name != other else (written, name)
            raise UserError(
                f"both {old} and {new} are set; {old} is the older name of {new_key(old)}",
                where=f"command-line overrides #{k} and #{number}",
                fix=f"keep only the one with {new}",
            )


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return str(tp).replace("typing.", "")
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


class _NotFinite(UserError):
    """NaN or infinity for a float setting (reported as such, not as a type error)."""


def _coerce(value: Any, tp: Any, key: str, source: _Source) -> Any:
    """Check ``value`` against the annotation ``tp``; build nested dataclasses."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key, source)
            except _NotFinite:
                raise
            except UserError:
                pass
        raise _type_error(value, tp, key, source)
    if tp is type(None):
        if value is None:
            return None
        raise _type_error(value, tp, key, source)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _type_error(value, tp, key, source, section=True)
        return build_dataclass(tp, value, source, prefix=key + ".")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise _type_error(value, tp, key, source)
        return [_coerce(v, item_tp, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _type_error(value, tp, key, source)
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _type_error(value, tp, key, source)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _type_error(value, tp, key, source)
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if abs(value) < 2**1000 else math.inf  # int past float
        elif isinstance(value, str):  # YAML reads 1e-5 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise _type_error(value, tp, key, source)
        if not math.isfinite(number):  # no setting means anything at NaN or infinity
            raise _NotFinite(
                f"must be a finite number, got {_shown(value, 40)}",
                where=source.where(key),
                fix=f"set {key} to a finite number (NaN and infinity are never valid)",
            )
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise _type_error(value, tp, key, source)
    return value


def _shown(value: Any, n: int = 200) -> str:
    """``repr(value)``, cut to ``n`` characters (a value may be a 100k-item list)."""
    import reprlib

    short = reprlib.Repr()
    short.maxstring, short.maxother, short.maxlevel = n, n, 3
    text = short.repr(value)
    return text if len(text) <= n else text[:n] + "..."


def _type_error(value: Any, tp: Any, key: str, source: _Source, section: bool = False):
    if section:
        return UserError(
            f"expected a section (mapping), got {_shown(value)}",
            where=source.where(key),
            fix=f"write {key}: followed by indented keys",
        )
    return UserError(
        f"expected {_type_name(tp)}, got {_shown(value)} ({type(value).__name__})",
        where=source.where(key),
        fix=f"set {key} to a value of type {_type_name(tp)}",
    )


def build_dataclass(cls: type, data: dict, source: _Source, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in hints:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = (
                f"did you mean {prefix}{close[0]}?"
                if close
                else (f"valid keys here: {', '.join(names)}")
            )
            raise UserError(f"unknown key {full!r}", where=source.where(full), fix=hint)
        kwargs[key] = _coerce(value, hints[key], full, source)
    return cls(**kwargs)


def load_config(
    path: str | Path | None, overrides: list[str] | None = None
) -> tuple[DankaConfig, Path]:
    """Read, override, type-check and validate. Returns the config and its base folder."""
    if path is None:
        return config_from_dict({}, overrides), Path.cwd()
    cfg_path = Path(path)
    data, text = read_yaml(cfg_path)
    base_dir = cfg_path.parent.resolve()
    return config_from_dict(data, overrides, path=cfg_path, text=text, base_dir=base_dir), base_dir


def config_from_dict(
    data: dict,
    overrides: list[str] | None = None,
    *,
    path: Path | None = None,
    text: str = "",
    base_dir: Path | None = None,
) -> DankaConfig:
    """:func:`load_config` for a mapping already in memory (the Python API); ``path`` and
    ``text`` (the YAML it came from, if any) only serve error messages; ``base_dir`` (the
    folder relative data and reward paths are read from; default the current one) is
    kept on the config: :func:`config_base_dir`."""
    import copy

    from danka.config.compat import add_note, apply_fallbacks  # torch-free helpers only

    if not isinstance(data, dict):
        raise UserError(
            f"a config must be a mapping of sections, got {type(data).__name__}",
            where=str(path) if path else "config",
            fix="pass a dict like {'model': {...}, 'trainer': {...}, 'data': {...}}",
        )
    data = copy.deepcopy(data)
    source = _Source(path, text)
    source.renamed(relocate(data, source.where))  # keys under their older name (moved.py)
    apply_overrides(data, overrides or [], source)
    notes = retire(data, source.where)  # the tutorial's retired backend switches
    config = build_dataclass(DankaConfig, data, source)
    source.explicit = set(_dotted_keys(data))
    config._danka_source = source  # later checks' errors are located too: located()
    with located(config):  # a check naming its key bare (the reward specs) is located
        check_limits(config, source)  # integers within what each setting counts (limits.py)
        validate(config, source)
    apply_fallbacks(config)  # seed keys that cannot work here: one warning each, see compat
    for note in notes:
        add_note(config, note)
    config._danka_base_dir = Path(base_dir) if base_dir else Path.cwd()
    freeze(config)  # read-only from here: a run keeps its changing state elsewhere
    return config


def _is_key(config: Any, where: Any) -> bool:
    """True when ``where`` is a bare dotted key of ``config`` (``rollout.keep_cache``,
    ``reward.functions[0].name``); not a file name such as ``data.jsonl``."""
    if not isinstance(where, str) or not re.fullmatch(r"[a-z_]\w*(\.\w+|\[\d+\])*", where):
        return False
    node = config
    for name, index in re.findall(r"(\w+)|\[(\d+)\]", where):
        if isinstance(node, dict):
            return True  # a mapping setting (kwargs): any key may be in it
        if index and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        elif name and dataclasses.is_dataclass(node) and hasattr(node, name):
            node = getattr(node, name)
        else:
            return False
    return True


@contextmanager
def located(config: Any) -> Iterator[None]:
    """Inside the block, a UserError whose ``where`` is a bare key of the validated
    ``config`` (a check that names only its key: the reward specs, the engine's options,
    the probe prompts in tokens) is said where the user wrote that key, as a loading
    error is: ``command-line override #k: key=value`` or ``FILE:LINE: key K``."""
    try:
        yield
    except UserError as err:
        source = getattr(config, "_danka_source", None)
        if source is not None and _is_key(config, err.where):
            err.located(source.where(err.where))
        raise


def config_base_dir(config: DankaConfig) -> Path:
    """The folder a validated config's relative paths are read from (its YAML's folder)."""
    return getattr(config, "_danka_base_dir", None) or Path.cwd()


def _dotted_keys(data: dict, prefix: str = ""):
    for key, value in data.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _dotted_keys(value, f"{prefix}{key}.")


def config_to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


LOADERS.update(from_dict=config_from_dict, from_yaml=load_config)  # DankaConfig.from_dict/yaml
