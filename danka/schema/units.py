"""Sizes a user writes: ``24GiB`` for a memory budget."""

from __future__ import annotations

import re

from danka.errors import UserError
from danka.limits import read_decimal

GIB = 2**30


def parse_memory(text: str, where: str = "--gpu-memory") -> int:
    """``"24GB"``, ``"24GiB"``, ``"80G"``, ``"24"`` -> bytes. GPU makers' "GB" are GiB
    (a 24 GB card holds 24 x 2^30 bytes), so both mean 2^30; MB/MiB likewise 2^20."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([gGmMtT]?)(i?[bB])?\s*", text)
    shown = repr(text if len(text) <= 40 else text[:40] + "...")
    if not match:
        raise UserError(
            f"cannot read memory size {shown}", where=where, fix="write it like 24GB, 80GiB or 40"
        )
    unit = {"": GIB, "g": GIB, "m": 2**20, "t": 2**40}[match.group(2).lower()]
    number = read_decimal(match.group(1))  # None past 40 characters: no overflow below
    size = -1 if number is None else int(number * unit)
    if not 0 < size <= 2**60:  # up to an exbibyte: no card holds more
        raise UserError(
            f"cannot read memory size {shown} (a positive size up to 1024 PiB)",
            where=where,
            fix="write it like 24GB, 80GiB or 40",
        )
    return size
