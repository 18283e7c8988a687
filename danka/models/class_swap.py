"""A module's forward replaced by swapping its class for a cached subclass that mixes one in.

Why a class and not a per-module bound ``forward``: with ``speed.compile`` every decoder
layer's code is compiled once and reused, and a guard on a per-module function would
recompile it for each layer (measured on an H100: the recompile limit hit, most layers eager).
A subclass also keeps the module's behaviour otherwise (isinstance checks, state dicts,
``extra_repr``). The mixin's ``forward`` reaches the original as ``self._danka_base.forward``.
"""

from __future__ import annotations

from torch import nn

_CLASSES: dict[tuple[type, type], type] = {}


def swap_in(module: nn.Module, mixin: type) -> None:
    """``module``'s class becomes ``Fused<its class>``, ``mixin`` first (once: a module that
    already has it keeps it)."""
    if isinstance(module, mixin):
        return
    cls = type(module)
    if (mixin, cls) not in _CLASSES:
        _CLASSES[mixin, cls] = type(f"Fused{cls.__name__}", (mixin, cls), {"_danka_base": cls})
    module.__class__ = _CLASSES[mixin, cls]


def swap_out(module: nn.Module, mixin: type) -> None:
    """Undo :func:`swap_in` (nothing for a module without ``mixin``)."""
    if isinstance(module, mixin):
        module.__class__ = module._danka_base
