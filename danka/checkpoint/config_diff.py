"""Config fingerprint and a readable diff, for the "config changed since the checkpoint"
warning on resume."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

from danka.schema.moved import relocate, retire


def config_hash(resolved_config: dict) -> str:
    """First 16 hex digits of the sha256 of the canonical JSON of the resolved config."""
    text = json.dumps(resolved_config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return re.sub(r"e([+-])0+(\d)", r"e\1\2", repr(value)).replace("e+", "e")
    return "null" if value is None else str(value)


_MISSING = object()


def current_layout(cfg: dict) -> dict:
    """A copy of a resolved config dict with every key in its current place."""
    out = copy.deepcopy(cfg)
    relocate(out)
    retire(out)  # the retired backend switches, as what they mean now
    return out


def diff_configs(old: dict, new: dict) -> list[str]:
    """One line per changed leaf, dotted keys, sorted: ``"optim.lr: 1e-5 -> 2e-5"``;
    keys present on one side only show ``<unset>`` on the other. A config saved with keys
    in their older place (danka/schema/moved.py) is compared in the current layout."""
    a, b = _flatten(current_layout(old)), _flatten(current_layout(new))
    lines = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va == vb:
            continue
        sa = "<unset>" if va is _MISSING else _fmt(va)
        sb = "<unset>" if vb is _MISSING else _fmt(vb)
        lines.append(f"{key}: {sa} -> {sb}")
    return lines
