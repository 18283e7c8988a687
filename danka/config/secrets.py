"""Mask secrets in configs before they are written or sent anywhere.

LOCAL STAND-IN (branch seed): H2 owns this module; if their ``mask_secrets`` lands, theirs
replaces this file (same name and signature).
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
_SECRET_KEY = re.compile(r"(token|key|secret|password|passwd|credential|auth)", re.I)
_NOT_SECRET = {"prompt_key", "response_key", "reward_key", "answer_key", "sort_keys"}


def _is_secret(key: str) -> bool:
    return key not in _NOT_SECRET and bool(_SECRET_KEY.search(key))


def mask_secrets(d: dict) -> dict:
    """A copy of ``d`` with the values of keys named like token/key/secret/password
    replaced by ``***`` (at any depth, also inside lists). ``d`` is not changed."""

    def walk(value: Any, key: str | None) -> Any:
        if key is not None and _is_secret(key) and isinstance(value, (str, int, float)):
            return MASK
        if isinstance(value, dict):
            return {k: walk(v, str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, None) for v in value]
        return value

    return walk(d, None)
