"""Masking secrets before a config is written anywhere (config.json, TensorBoard, wandb,
MLflow, train.log).

A value is masked when its key looks like a credential: the key, lower-cased, with ``-``
and spaces read as ``_``, contains ``token``, ``secret``, ``password``, ``passwd``,
``api_key``/``apikey``, ``access_key``, ``private_key``, ``credential`` or the word
``auth``, or its last ``_``-separated word is ``key`` (``key``, ``hf_key``,
``openai_key``). Keys that only name text units or data columns are NOT secrets:
``max_new_tokens``, ``eos_token``, ``pad_token_id``, ``tokenizer_kwargs``,
``answer_key``, ``reward_key`` (see ``_NOT_SECRET``). Masking walks nested dicts, lists
and tuples, and dataclasses (converted to dicts); the input is not modified. ``None`` and
empty values stay as they are (nothing to hide, and "unset" stays visible).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

_SECRET_WORDS = re.compile(
    r"token|secret|passw(or)?d|api_?key|access_?key|private_?key|credential"
    r"|(^|_)auth($|_|orization)"
)
# Model/tokenizer vocabulary that contains "token" but holds no credential.
_NOT_SECRET = re.compile(
    r"(^|_)(max|min)_(new_)?tokens?($|_)|tokens?_(id|ids|length|limit|budget|count)s?$"
    r"|^(bos|eos|pad|unk|sep|cls|mask)_token|tokeni[sz]er|_tokens$|^num_.*tokens?"
    r"|^tokens?_per_|^chat_template"
    r"|^(answer|prompt|label|response|text|input|output|image|query|chosen|rejected"
    r"|solution|sort|group|column|reward|data|source|id|index|messages?|split|name|margin)_key$"
)


def is_secret_key(key: Any) -> bool:
    """True when a value stored under ``key`` should not be logged (see module docstring)."""
    if not isinstance(key, str):
        return False
    k = re.sub(r"[-\s.]+", "_", key.strip().lower())
    if _NOT_SECRET.search(k):
        return False
    return bool(_SECRET_WORDS.search(k)) or k.split("_")[-1] == "key"


def mask_secrets(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, dataclasses, scalars) in which every
    non-empty value under a secret-looking key is replaced by ``"***"``, at any depth:
    ``{"reward": {"functions": [{"kwargs": {"api_key": "sk-1"}}]}}`` ->
    ``{"reward": {"functions": [{"kwargs": {"api_key": "***"}}]}}``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, Mapping):
        return {
            k: (MASK if is_secret_key(k) and v not in (None, "") else mask_secrets(v))
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [mask_secrets(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(mask_secrets(v) for v in obj)
    return obj
