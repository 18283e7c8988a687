"""Tools as plain Python functions (TRL's convention).

A tool is a function with type hints and a Google-style docstring whose ``Args:`` section
describes every parameter; its JSON schema (OpenAI/HF "function" format, the one chat
templates take as ``tools=``) comes from ``transformers.utils.get_json_schema``. Configured
as ``agent.tools: [calculator, python, path/to/file.py:function]``: a builtin name or a
function in a file the config names (relative paths resolve against the config's folder).
A tool file is never imported in the trainer's process: a probe process (the reward
worker's process rules: own session, killed with everything it started, a time limit)
imports it, builds the schema and reports the signature; the tool worker (worker.py)
imports it again to run the calls. So a file that exits, hangs or forks at import stops
with a message, never with a false success.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danka.agent.builtins import BUILTIN_TOOLS
from danka.errors import UserError


@dataclass(frozen=True)
class ToolSpec:
    """One tool: how the worker finds it, and the schema the model sees."""

    name: str  # the function name the model calls
    source: str  # "builtin" or the absolute path of the .py file
    function: str  # attribute name (the builtin's name for builtins)
    schema: dict[str, Any] = field(compare=False)  # {"type": "function", "function": {...}}
    fn: Callable[..., Any] | None = field(default=None, compare=False, repr=False)  # builtins
    # the signature of a file tool, as its probe saw it: (names, required, takes **kwargs)
    signature: tuple[tuple[str, ...], tuple[str, ...], bool] = field(
        default=((), (), True), compare=False
    )

    def check_arguments(self, arguments: dict[str, Any]) -> str | None:
        """Why ``arguments`` do not fit the signature (missing/unknown names), or None."""
        if self.fn is not None:
            try:
                inspect.signature(self.fn).bind(**arguments)
            except TypeError as exc:
                return f"bad arguments for {self.name}: {exc}"
            except ValueError:
                return None
            return None
        names, required, var_kw = self.signature
        missing = [n for n in required if n not in arguments]
        if missing:
            return f"bad arguments for {self.name}: missing a required argument: {missing[0]!r}"
        unknown = [k for k in arguments if k not in names]
        if unknown and not var_kw:
            return (
                f"bad arguments for {self.name}: got an unexpected keyword argument {unknown[0]!r}"
            )
        return None


def tool_schema(fn: Callable[..., Any], where: str) -> dict[str, Any]:
    """The JSON schema of ``fn`` from its type hints and Google-style docstring."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 - transformers raises several exception types
        raise UserError(
            f"cannot build a tool schema for {getattr(fn, '__name__', fn)!r}: {exc}",
            where=where,
            fix="give the function type hints for every argument and a Google-style "
            "docstring: a description line, then 'Args:' with one 'name: description' "
            "line per argument",
        ) from exc


def _builtin_or_file(spec: str, base_dir: Path | str) -> ToolSpec | tuple[Path, str]:
    """A builtin's ToolSpec, or (absolute path, function) of a file tool."""
    if spec in BUILTIN_TOOLS:
        fn = BUILTIN_TOOLS[spec]
        return ToolSpec(spec, "builtin", spec, tool_schema(fn, f"builtin tool {spec}"), fn)
    file, sep, function = str(spec).rpartition(":")
    if not sep or not file.endswith(".py") or not function.isidentifier():
        raise UserError(
            f"unknown tool {spec!r}",
            where="agent.tools",
            fix=f"use a builtin ({', '.join(sorted(BUILTIN_TOOLS))}) or path/to/file.py:function",
        )
    path = Path(file).expanduser()
    path = (path if path.is_absolute() else Path(base_dir) / path).resolve()
    if not path.is_file():
        from danka.usercode.contract import load_function_from_file

        load_function_from_file(path, function)  # raises the "file not found" UserError
    return path, function


def load_tool(spec: str, base_dir: Path | str = ".", *, timeout_s: float = 10.0) -> ToolSpec:
    """A builtin name (``calculator``, ``python``) or ``path/to/file.py:function``."""
    return load_tools([spec], base_dir, timeout_s=timeout_s)[0]


def load_tools(
    specs: list[str], base_dir: Path | str = ".", *, timeout_s: float = 10.0
) -> list[ToolSpec]:
    """Every configured tool; UserError on a bad spec or two tools with the same name.
    File tools are probed together in one process; ``timeout_s``
    (``agent.tool_timeout_s``, at least 10 s) bounds importing the tool files."""
    found = [_builtin_or_file(s, base_dir) for s in specs]
    files = [f for f in found if not isinstance(f, ToolSpec)]
    probed = iter(probe_tool_files(files, timeout_s) if files else [])
    tools = [f if isinstance(f, ToolSpec) else next(probed) for f in found]
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(
            f"two tools are named {dup[0]!r}", where="agent.tools", fix="rename one function"
        )
    return tools


# ---- the probe: a tool file imported in its own process ---------------------------------

_SCHEMA_TIMEOUT_S = 120.0  # building the schema imports transformers (slow on a busy machine)


def _probe_main() -> None:
    """``python -c ... <parent pid> <[[path, function], ...] json>``: import the files, say
    so (``{"imported": true}``), then print one JSON line: every tool's schema and
    signature, or ``{"error": [what, where, fix]}``."""
    import json
    import sys

    from danka.errors import UserError
    from danka.usercode.contract import load_function_from_file
    from danka.usercode.worker import guard_child

    guard_child(int(sys.argv[1]))
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what the files print goes to stderr, not into the reply
    try:
        fns = [(p, f, load_function_from_file(Path(p), f)) for p, f in json.loads(sys.argv[2])]
        out.write('{"imported": true}\n')
        out.flush()
        reply: dict = {"tools": []}
        for path, function, fn in fns:
            params = inspect.signature(fn).parameters
            named = [
                n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            ]
            reply["tools"].append(
                {
                    "schema": tool_schema(fn, f"{path}:{function}"),
                    "names": named,
                    "required": [n for n in named if params[n].default is params[n].empty],
                    "var_kw": any(p.kind is p.VAR_KEYWORD for p in params.values()),
                }
            )
    except UserError as err:
        reply = {"error": [err.what, err.where, err.fix]}
    except (TypeError, ValueError) as err:  # no signature
        reply = {"error": [f"cannot read a tool's signature: {err}", None, None]}
    out.write(json.dumps(reply) + "\n")
    out.flush()


def probe_tool_files(files: list[tuple[Path, str]], timeout_s: float) -> list[ToolSpec]:
    """The ToolSpecs of the file tools ``files`` ((path, function) each), from one probe
    process; UserError when a file fails, exits or hangs at import (over
    ``max(timeout_s, 10 s)``: then the probe and what it started are killed)."""
    import json
    import subprocess

    from danka.usercode.worker import forget_worker, kill_group, load_timeout, spawn_worker

    class _Owner:
        proc: subprocess.Popen | None = None

        def close(self) -> None:
            if self.proc is not None:
                kill_group(self.proc)
            forget_worker(self)

    owner = _Owner()
    where = ", ".join(f"{p}:{f}" for p, f in files)
    code = "from danka.agent.tools import _probe_main; _probe_main()"
    listing = json.dumps([[str(p), f] for p, f in files])
    owner.proc = spawn_worker(owner, code, [str(os.getpid()), listing], stdout=subprocess.PIPE)
    try:
        lines = _read_lines(owner.proc, [load_timeout(timeout_s), _SCHEMA_TIMEOUT_S])
    finally:
        owner.close()
    if not lines:
        code = owner.proc.returncode
        died = code is not None and code >= 0
        raise UserError(
            f"a tool file ended its probe process while being imported (exit code {code})"
            if died
            else f"importing the tool files took over {load_timeout(timeout_s):g} s (the limit "
            "is agent.tool_timeout_s, at least 10 s); the probe and every process it "
            "started were stopped",
            where=where,
            fix="remove the sys.exit()/os._exit() (or the crash) from the file's top-level code"
            if died
            else "make the file's import-time code fast, or raise agent.tool_timeout_s",
        )
    reply = json.loads(lines[-1])
    if "error" in reply:
        what, err_where, fix = reply["error"]
        raise UserError(what, where=err_where or where, fix=fix)
    if "tools" not in reply:
        raise UserError("building the tool schemas took too long", where=where)
    return [
        ToolSpec(
            f,
            str(p),
            f,
            t["schema"],
            signature=(tuple(t["names"]), tuple(t["required"]), t["var_kw"]),
        )
        for (p, f), t in zip(files, reply["tools"])
    ]


def _read_lines(proc, limits: list[float]) -> list[bytes]:
    """Up to one line per limit from ``proc.stdout``, each within its own limit; stops at
    a timeout or at the end of the output (an exited process: returncode is set then)."""
    import select
    import time

    fd, buf, lines = proc.stdout.fileno(), b"", []
    for limit in limits:
        deadline = time.monotonic() + limit
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return lines
            chunk = os.read(fd, 65536)
            if not chunk:
                proc.wait()
                return lines
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        lines.append(line)
        if b'"imported"' not in line:
            return lines  # an error reply ends the probe
    return lines
