"""The two call contracts of user reward functions, and importing a user's file.

* verl (per sample): ``compute_score(data_source, solution_str, ground_truth,
  extra_info=None, **kwargs) -> float`` (or a dict with a ``"score"`` key);
* TRL (batched): ``fn(prompts, completions, **kwargs) -> list[float | None]``.

custom.py's docstring says how each is called. The functions here run in whichever
process calls them: :func:`load_function_from_file` executes the file's top-level code, so
only the reward worker (worker.py) and the tool worker call it, never the trainer. No
torch here: the worker process starts fast.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from danka.errors import UserError
from danka.safe_read import check_regular

if TYPE_CHECKING:
    from danka.types import PromptRow

Kind = Literal["verl", "trl"]

VERL_SIGNATURE = "compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float"
TRL_SIGNATURE = "fn(prompts, completions, **kwargs) -> list[float | None]"
_VERL_ARGS = {"data_source", "solution_str", "ground_truth", "extra_info"}
_TRL_ARGS = {"prompts", "completions", "completion_ids", "trainer_state"}


def _short_traceback(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError) and exc.text:  # the offending line, not only its number
        return f"SyntaxError: {exc.msg}: {exc.text.strip()[:120]!r}"
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def _user_line(exc: BaseException, path: Path) -> int | None:
    """The line of ``path`` where importing it failed: a syntax error's own line, else the
    last traceback frame inside the file (None if the failure is not located there)."""
    if isinstance(exc, SyntaxError) and exc.lineno and Path(exc.filename or "") == path:
        return exc.lineno
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename) == path:
            line = frame.lineno
    return line


def check_user_file(path: Path, function: str) -> None:
    """UserError unless ``path`` is a regular file: missing, or a pipe (importing it would
    block), a device, a folder, a symlink loop."""
    if not path.exists() and not path.is_symlink():
        raise UserError(
            f"reward function file not found (looking for function {function!r})",
            where=str(path),
            fix="check the path; relative paths are resolved against the config file's folder",
        )
    check_regular(path, what="the Python file", fix="give a .py file")


def load_function_from_file(path: Path, function: str) -> Callable[..., Any]:
    """Execute ``path`` as a fresh module and return its attribute ``function``.

    Raises UserError for a missing file, an import-time error (with the traceback's last
    line) or a missing/non-callable attribute.
    """
    expected = f"expected one of:\n    {VERL_SIGNATURE}   (verl)\n    {TRL_SIGNATURE}   (TRL)"
    check_user_file(path, function)
    # A private, path-derived module name: never shadows or reuses an installed module.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    mod_name = f"_danka_user_reward_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise UserError("cannot load this file as Python code", where=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses/pickle inside the file need it
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything, even SystemExit
        sys.modules.pop(mod_name, None)
        line = _user_line(exc, path)
        raise UserError(
            f"importing the reward file failed: {_short_traceback(exc)} "
            f"(while loading function {function!r})",
            where=f"{path}:{line}" if line else str(path),
            fix="run `python " + str(path) + "` to see the full traceback and fix the file",
        ) from exc
    fn = getattr(module, function, None)
    if fn is None or not callable(fn):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise UserError(
            f"no function {function!r} in the reward file"
            + (" (it is not callable)" if fn is not None else ""),
            where=str(path),
            fix=f"name a function defined there ({', '.join(names) or 'none found'}); {expected}",
        )
    return fn


def detect_kind(fn: Callable[..., Any]) -> Kind | None:
    """ "verl", "trl", or None when the signature fits neither contract."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    names = set(params)
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    required = {
        n
        for n, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    positional_only = any(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params.values())
    if positional_only:  # both contracts pass arguments by keyword
        return None
    if "solution_str" in names:
        return "verl" if required <= _VERL_ARGS else None
    if "completions" in names or (has_var_kw and not required):
        return "trl"
    return None


def contract_of(fn: Callable[..., Any], path: Path, function: str) -> Kind:
    """``fn``'s contract ("verl" or "trl"); UserError naming both signatures for neither."""
    kind = detect_kind(fn)
    if kind is not None:
        return kind
    try:
        shown = f"{function}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        shown = function
    raise UserError(
        f"reward function {shown} has neither the verl nor the TRL signature",
        where=f"{path}:{function}",
        fix=(
            f"use one of:\n    {VERL_SIGNATURE}   (verl, per sample)\n"
            f"    {TRL_SIGNATURE}   (TRL, batched; other dataset columns arrive "
            "as keyword lists)"
        ),
    )


# ---- building the call arguments (main process) ---------------------------------------


def verl_call_args(row: PromptRow, completion: str) -> dict[str, Any]:
    """Keyword arguments of one verl ``compute_score`` call. ``extra_info`` is the row's
    ``extra["extra_info"]`` when that is a dict (verl parquet files), else ``row.extra``."""
    extra = row.extra.get("extra_info") if isinstance(row.extra.get("extra_info"), dict) else None
    return {
        "data_source": row.data_source,
        "solution_str": completion,
        "ground_truth": row.ground_truth,
        "extra_info": extra if extra is not None else dict(row.extra),
    }


def trl_call_args(
    rows: Sequence[PromptRow],
    completions: Sequence[str],
    completion_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Keyword arguments of one batched TRL call (see the module docstring)."""
    chat = [isinstance(r.prompt, list) for r in rows]
    args: dict[str, Any] = {
        "prompts": [r.prompt for r in rows],
        "completions": [
            [{"role": "assistant", "content": c}] if is_chat else c
            for c, is_chat in zip(completions, chat)
        ],
        "completion_ids": [list(ids) for ids in completion_ids] if completion_ids else None,
        "trainer_state": None,
        "ground_truth": [r.ground_truth for r in rows],
        "data_source": [r.data_source for r in rows],
    }
    columns = sorted({k for r in rows for k in r.extra})
    for col in columns:
        if col not in args:
            args[col] = [r.extra.get(col) for r in rows]
    for alias in ("solution", "answer"):  # TRL examples read the reference as `solution`
        args.setdefault(alias, args["ground_truth"])
    return args


# ---- checking what came back (worker or main process) ---------------------------------


def to_score(value: Any) -> float | None:
    """A returned value as a float (None stays None; NaN stays NaN). Accepts python
    numbers and bools, numpy scalars, one-element arrays/tensors (any device), and verl's
    ``{"score": x, ...}`` dicts. TypeError for anything else."""
    if value is None:
        return None
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"returned a dict without a 'score' key: keys {sorted(value)}")
        return to_score(value["score"])
    if isinstance(value, (bool, int, float)):
        return float(value)
    if hasattr(value, "item"):  # numpy scalars/arrays, torch tensors (CUDA too)
        try:
            return float(value.item())
        except (ValueError, RuntimeError, TypeError) as exc:
            shape = getattr(value, "shape", "?")
            raise TypeError(
                f"returned a {type(value).__name__} of shape {tuple(shape)}, expected one number"
            ) from exc
    if isinstance(value, str):
        raise TypeError(f"returned a str ({value[:40]!r}), expected a number")
    try:
        return float(value)  # e.g. fractions.Fraction, decimal.Decimal
    except (TypeError, ValueError):
        raise TypeError(f"returned a {type(value).__name__}, expected a number") from None


def to_scores(values: Any, n: int) -> list[float | None]:
    """A batched (TRL) return value as n floats-or-None; TypeError on a wrong type/length."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()  # 1-D numpy array or tensor
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"returned a {type(values).__name__}, expected a list of {n} numbers")
    if len(values) != n:
        raise TypeError(f"returned {len(values)} values for {n} completions")
    return [to_score(v) for v in values]


def problem_with(value: float | None) -> str | None:
    """Why a converted score cannot be used (None, NaN, inf), or None if it is fine."""
    if value is None:
        return "returned None"
    if math.isnan(value):
        return "returned NaN"
    if math.isinf(value):
        return f"returned {value}"
    return None


def call_custom(
    fn: Callable[..., Any], kind: Kind, args: dict[str, Any], kwargs: dict[str, Any]
) -> Any:
    """One call: verl -> ``float | None``; trl -> ``list[float | None]`` of the batch size.
    Exceptions (the user's, or TypeError for a bad return value) propagate."""
    if kind == "verl":
        if not _accepts(fn, "extra_info"):
            args = {k: v for k, v in args.items() if k != "extra_info"}
        return to_score(fn(**args, **kwargs))
    return to_scores(fn(**args, **kwargs), len(args["completions"]))


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
