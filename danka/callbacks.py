"""Callbacks: your code at a training step, an evaluation and a saved checkpoint.

``danka.train(config, callbacks=[MyCallback()])`` calls, on the process that trains:

- ``on_step(step, metrics)`` after each step is logged (``metrics``: the dict written to
  ``metrics.jsonl`` -- ``loss``, ``reward``, ``kl``, ``time/*``...);
- ``on_eval(step, result)`` after each held-out evaluation (``eval/accuracy``, ``eval/n``,
  ``eval/correct/<reward>``...; step 0 is the evaluation before training);
- ``on_checkpoint(step, path)`` after a checkpoint is complete (``path``: its
  ``OUTPUT/actor/checkpoint_N`` folder, adapter or full model).

A callback is any object with some of these methods (subclass :class:`Callback` to get
no-op defaults). An exception in a callback stops the run like any other error. The loop
calls the module functions :func:`on_step`, :func:`on_eval` and :func:`on_checkpoint`,
which reach the callbacks of the innermost :func:`active` block (a context variable, so
two runs in two threads each see their own).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class CallbackProtocol(Protocol):
    def on_step(self, step: int, metrics: dict[str, float]) -> None: ...

    def on_eval(self, step: int, result: dict[str, float]) -> None: ...

    def on_checkpoint(self, step: int, path: Path) -> None: ...


class Callback:
    """Base class with no-op hooks: override the ones you need."""

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        """After step ``step`` (1-based) was logged."""

    def on_eval(self, step: int, result: dict[str, float]) -> None:
        """After the held-out evaluation at ``step`` (0 = before training)."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        """After checkpoint ``step`` is complete; ``path`` = ``OUTPUT/actor/checkpoint_N``."""


HOOKS = ("on_step", "on_eval", "on_checkpoint")
_ACTIVE: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
    "danka_callbacks", default=()
)


def check_callbacks(callbacks: Iterable[Any]) -> tuple[Any, ...]:
    """The callbacks as a tuple; TypeError for an object with none of the hooks."""
    out = tuple(callbacks or ())
    for cb in out:
        if not any(callable(getattr(cb, name, None)) for name in HOOKS):
            raise TypeError(
                f"{cb!r} is not a callback: it has none of {', '.join(HOOKS)} "
                "(subclass danka.Callback and override the hooks you need)"
            )
    return out


@contextlib.contextmanager
def active(callbacks: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """Within the block, the loop's hooks reach ``callbacks``."""
    cbs = check_callbacks(callbacks)
    token = _ACTIVE.set(cbs)
    try:
        yield cbs
    finally:
        _ACTIVE.reset(token)


def _call(name: str, *args: Any) -> None:
    for cb in _ACTIVE.get():
        hook = getattr(cb, name, None)
        if callable(hook):
            hook(*args)


def on_step(step: int, metrics: dict[str, float]) -> None:
    _call("on_step", step, dict(metrics))


def on_eval(step: int, result: dict[str, float]) -> None:
    _call("on_eval", step, {k: v for k, v in result.items() if not k.startswith("_")})


def on_checkpoint(step: int, state_dir: Path | None) -> None:
    """``state_dir``: what the checkpoint writer returned (``OUTPUT/state/checkpoint_N``;
    None on ranks that wrote nothing): the hook gets the ``actor`` folder beside it."""
    if state_dir is None:
        return
    state_dir = Path(state_dir)
    _call("on_checkpoint", step, state_dir.parent.parent / "actor" / state_dir.name)
