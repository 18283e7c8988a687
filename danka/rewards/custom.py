"""User reward functions loaded from an explicitly named file: ``path/to/file.py:function``.

Two contracts are recognised from the function's signature:

* verl (per sample): ``compute_score(data_source, solution_str, ground_truth,
  extra_info=None, **kwargs) -> float`` (a dict with a ``"score"`` key is also accepted,
  as in recent verl). Called with keywords, once per completion.
* TRL (batched): ``fn(prompts, completions, **kwargs) -> list[float | None]``. Called
  once per batch with keywords ``prompts``, ``completions``, ``completion_ids``,
  ``trainer_state`` (always None here) and every other dataset column as a list
  (``ground_truth``, plus ``solution``/``answer`` aliases of it when the row has no such
  column). As in TRL, for chat-format rows ``prompts[i]`` is the message list and
  ``completions[i]`` is ``[{"role": "assistant", "content": text}]``; otherwise both
  are strings.

Security: the code runs only from the file the config names (resolved against the
config's folder); nothing is imported by module name. The file is never executed in the
trainer's process: :func:`load_reward_function` starts the reward worker (worker.py),
which imports the file and reports the signature, under the worker's time limit and
process-group rules. So a file that calls ``sys.exit()``/``os._exit()``, hangs, crashes
or forks at import ends or blocks only its worker, and the run stops with a message
(exit 2), never with a false success. The worker that checked the file then serves the
calls, so the file's import-time code runs once per worker start. This module imports
no torch so the reward worker process starts fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danka.errors import UserError
from danka.usercode.contract import (  # noqa: F401  (re-exported: the contracts live there)
    TRL_SIGNATURE,
    VERL_SIGNATURE,
    Kind,
    call_custom,
    check_user_file,
    contract_of,
    detect_kind,
    load_function_from_file,
    problem_with,
    to_score,
    to_scores,
    trl_call_args,
    verl_call_args,
)


@dataclass(frozen=True)
class CustomReward:
    """A user reward function: where it lives and which contract it follows. ``worker``:
    the running worker process that loaded it (guard.py's GuardedReward takes it over)."""

    path: Path  # absolute path of the .py file
    function: str  # attribute name inside the file
    kind: Kind  # "verl" (per sample) or "trl" (batched)
    worker: Any = field(default=None, compare=False, repr=False)

    @property
    def spec(self) -> str:
        return f"{self.path}:{self.function}"

    def load(self) -> Callable[..., Any]:
        """The function, imported in THIS process (runs the file's top-level code here:
        for the worker and for tests, never for the trainer)."""
        return load_function_from_file(self.path, self.function)


def is_custom_spec(name: str) -> bool:
    """True for ``something.py:function`` (as opposed to a builtin reward name)."""
    file, sep, func = str(name).rpartition(":")
    return bool(sep) and file.endswith(".py") and bool(func)


def resolve_spec(spec: str, base_dir: Path) -> tuple[Path, str]:
    """``path/to/file.py:function`` -> (absolute path, function); UserError if malformed."""
    file, sep, function = str(spec).rpartition(":")
    if not sep or not file.endswith(".py") or not function.isidentifier():
        raise UserError(
            f"bad custom reward {spec!r}",
            fix="write it as path/to/file.py:function_name",
        )
    path = Path(file).expanduser()
    if not path.is_absolute():
        path = Path(base_dir) / path
    return path.resolve(), function


def load_reward_function(spec: str, base_dir: Path, *, timeout_s: float = 30.0) -> CustomReward:
    """Load ``path/to/file.py:function`` (relative to ``base_dir``, the config's folder)
    in a reward worker process and detect its contract; the worker keeps running and
    serves the calls (see the module docstring). ``timeout_s`` (``reward.timeout_s``, at
    least worker.LOAD_FLOOR_S) bounds the import. UserError on a malformed spec, a missing
    file, an import error, an exit or a hang at import, a missing function or a signature
    that is neither verl's nor TRL's."""
    from danka.usercode.worker import Target, Worker  # the worker module imports this one

    path, function = resolve_spec(spec, base_dir)
    check_user_file(path, function)  # missing, or a pipe the worker's import would block on
    where = f"{path}:{function}"
    worker = Worker(Target(str(path), function, "auto", where), timeout_s)
    kind = worker.start()
    return CustomReward(path=path, function=function, kind=kind, worker=worker)  # type: ignore[arg-type]
