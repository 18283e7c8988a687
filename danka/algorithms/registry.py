"""A name -> function table, so that config strings pick an algorithm variant.

Every registry holds functions of ONE signature (see advantages.py, losses.py, kl.py), so
callers always do ``REGISTRY.get(name)(...)`` and never branch on the name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from danka.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


class Registry:
    """Named functions of one kind, e.g. ``Registry("advantage estimator")``.

    >>> EST = Registry("advantage estimator")
    >>> @EST.register("mine")
    ... def mine(inp): ...
    >>> EST.get("mine") is mine
    True
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._table: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator adding a function under ``name``; a taken name raises ValueError
        (two variants silently shadowing each other is a programming bug)."""

        def deco(fn: F) -> F:
            if name in self._table:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered "
                    f"(by {self._table[name].__module__}.{self._table[name].__qualname__})"
                )
            self._table[name] = fn
            return fn

        return deco

    def get(self, name: str, where: str | None = None) -> Callable[..., Any]:
        """The function registered as ``name``; an unknown name is a UserError listing
        the valid names. ``where`` names the config key that held the name."""
        try:
            return self._table[name]
        except (KeyError, TypeError):
            raise UserError(
                f"unknown {self.kind} {name!r}",
                where=where,
                fix=f"use one of: {', '.join(self.names())}",
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._table)

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
