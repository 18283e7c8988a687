"""A name -> entry table, so that config strings pick a variant (torch-free: the reward
worker imports it).

Every registry holds entries of ONE kind (see advantages.py, losses.py, kl.py; rollout
engines, reward functions and CLI subcommands use it too), so callers always do
``REGISTRY.get(name)(...)`` and never branch on the name. An entry may carry typed
metadata (a frozen dataclass given at registration), e.g. whether an advantage
estimator needs a critic: "which kind is this?" is asked with ``REGISTRY.meta(name)``,
never with a string compare.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from danka.errors import UserError

F = TypeVar("F")
M = TypeVar("M")


class Registry(Generic[M]):
    """Named entries of one kind, e.g. ``Registry("advantage estimator", EstimatorMeta())``.

    ``default_meta`` is the metadata of an entry registered without any.

    >>> EST = Registry("advantage estimator")
    >>> @EST.register("mine")
    ... def mine(inp): ...
    >>> EST.get("mine") is mine
    True
    """

    def __init__(self, kind: str, default_meta: M | None = None):
        self.kind = kind
        self.default_meta = default_meta
        self._table: dict[str, Any] = {}
        self._meta: dict[str, M | None] = {}

    def register(self, name: str, meta: M | None = None) -> Callable[[F], F]:
        """Decorator adding an entry under ``name``; a taken name raises ValueError
        (two variants silently shadowing each other is a programming bug)."""

        def deco(fn: F) -> F:
            self.add(name, fn, meta)
            return fn

        return deco

    def add(self, name: str, entry: Any, meta: M | None = None) -> None:
        """Add ``entry`` (any object) under ``name``; see :meth:`register`."""
        if name in self._table:
            old = self._table[name]
            by = f"{getattr(old, '__module__', '?')}.{getattr(old, '__qualname__', old)}"
            raise ValueError(f"{self.kind} {name!r} is already registered (by {by})")
        self._table[name] = entry
        self._meta[name] = meta if meta is not None else self.default_meta

    def get(self, name: str, where: str | None = None) -> Any:
        """The entry registered as ``name``; an unknown name is a UserError listing
        the valid names. ``where`` names the config key that held the name."""
        self._check(name, where)
        return self._table[name]

    def meta(self, name: str, where: str | None = None) -> M:
        """The metadata of ``name`` (the registry's default if it was registered without)."""
        self._check(name, where)
        meta = self._meta[name]
        if meta is None:
            raise ValueError(f"{self.kind} registry keeps no metadata")
        return meta

    def _check(self, name: object, where: str | None) -> None:
        try:
            if name in self._table:
                return
        except TypeError:
            pass
        raise UserError(
            f"unknown {self.kind} {name!r}",
            where=where,
            fix=f"use one of: {', '.join(self.names())}",
        )

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._table)

    def items(self) -> list[tuple[str, Any]]:
        """(name, entry) in registration order."""
        return list(self._table.items())

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._table
        except TypeError:
            return False

    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self):
        """Names, sorted (so ``sorted(REG)`` and ``set(REG)`` read like a dict's keys)."""
        return iter(self.names())

    def __getitem__(self, name: str) -> Any:
        """Dict-style lookup: KeyError for an unknown name (``get`` raises a UserError)."""
        return self._table[name]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
