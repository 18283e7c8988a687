"""Running tool calls guarded: a timeout per call, errors become text, never a crash.

All calls run in ONE worker process (a fresh ``python -c`` interpreter that imports only
the standard library, this module and the tool files), one call after another. A call
over ``timeout_s`` gets the worker's process group SIGKILLed and a new one started for
the next call; a thread could not be stopped. The process machinery (own session and
process group, death with the trainer, ignoring Ctrl-C, the group kill) is the reward
worker's (usercode/worker.py: ``spawn_worker``, ``guard_child``, ``kill_group``,
``forget_worker``); only the protocol differs. Requests and replies are JSON lines on the
worker's stdin and on a duplicate of its original stdout; the tool's own ``print`` output
goes to stderr, so it cannot corrupt the protocol.

A tool's return value becomes the tool message: a ``str`` as is, anything JSON can write
(numbers, lists, dicts) as JSON, anything else ``str(value)``; replies longer than
``max_chars`` are cut. POSIX only.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from danka.agent.parse import ToolCall
from danka.agent.tools import ToolSpec
from danka.errors import UserError
from danka.usercode.worker import (
    forget_worker,
    guard_child,
    kill_group,
    load_timeout,
    spawn_worker,
)


@dataclass
class ToolResult:
    """What one call gave: the message text the model sees, and how it went."""

    content: str
    ok: bool  # the tool returned (no parse error, unknown tool, exception or timeout)
    seconds: float


def to_text(value: Any) -> str:
    """A tool's return value as message text (see the module docstring)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


# ---- the worker process -----------------------------------------------------------------


def _worker_main() -> None:
    """``python -c ... <tools json> <parent pid>``: answer one JSON request line with one
    reply line."""
    guard_child(int(sys.argv[2]))
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the tools' print() goes to stderr
    sys.stdout = sys.stderr
    fns = {}
    if len(sys.argv) > 3:  # agent.tool_sandbox as the trainer resolved it
        from danka.agent.builtins import use_sandbox

        use_sandbox(sys.argv[3])
    for name, source, function in json.loads(sys.argv[1]):
        if source == "builtin":
            from danka.agent.builtins import BUILTIN_TOOLS

            fns[name] = BUILTIN_TOOLS[function]
        else:
            from pathlib import Path

            from danka.usercode.contract import load_function_from_file

            fns[name] = load_function_from_file(Path(source), function)
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"ok": True, "content": to_text(fns[request["name"]](**request["arguments"]))}
        except BaseException as exc:  # noqa: BLE001 - report everything, keep serving
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
            reply = {"ok": False, "content": "".join(tb[-1:]).strip()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


_WORKER_CODE = "from danka.agent.worker import _worker_main; _worker_main()"


class ToolRunner:
    """Executes parsed calls against ``tools`` with a per-call timeout."""

    def __init__(
        self,
        tools: list[ToolSpec],
        *,
        timeout_s: float = 10.0,
        max_chars: int = 2000,
        sandbox: str = "auto",
    ):
        self.tools = {t.name: t for t in tools}
        self.timeout_s, self.max_chars = float(timeout_s), int(max_chars)
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self.sandbox = "none"  # where the builtin python tool runs (agent.tool_sandbox)
        if "python" in self.tools and self.tools["python"].source == "builtin":
            from danka.agent.sandbox import choose, startup_warning

            self.sandbox = choose(sandbox)
            warning = startup_warning(sandbox, self.sandbox)
            log = logging.getLogger("danka.agent")
            if warning:
                log.warning(warning)
            else:
                log.info(f"builtin python tool: sandbox {self.sandbox}")

    # -- process management
    def _start(self) -> None:
        listing = [[t.name, t.source, t.function] for t in self.tools.values()]
        args = [json.dumps(listing), str(os.getpid()), self.sandbox]
        self._proc = spawn_worker(
            self, _WORKER_CODE, args, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._buf = b""
        limit = load_timeout(self.timeout_s)
        if self._readline(limit) is None:
            code = self._proc.poll()
            self.close()
            raise UserError(
                f"the tool worker did not start within {limit:g} s"
                + (f" (it exited with code {code})" if code is not None else "")
                + ": importing a tool file failed, exited or hung",
                where="agent.tools",
                fix="run `python FILE` for each tool file; import-time code must be fast "
                "and must not exit",
            )

    def _readline(self, timeout_s: float) -> bytes | None:
        """One line from the worker, or None on timeout or worker exit."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def close(self) -> None:
        """Stop the worker and its process group (SIGKILL: it may be stuck in a tool)."""
        if self._proc is not None:
            kill_group(self._proc)
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
            self._proc = None
        forget_worker(self)

    # -- calls
    def run(self, call: ToolCall) -> ToolResult:
        """Execute one call; every failure is a ``ToolResult`` with ``ok=False``."""
        t0 = time.perf_counter()
        if not call.ok:
            return ToolResult(f"error: {call.error}", False, 0.0)
        tool = self.tools.get(call.name or "")
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(f"error: unknown tool {call.name!r} (tools: {known})", False, 0.0)
        problem = tool.check_arguments(call.arguments)
        if problem is not None:
            return ToolResult(f"error: {problem}", False, 0.0)
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        try:
            line = json.dumps({"name": tool.name, "arguments": call.arguments}) + "\n"
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
            reply = self._readline(self.timeout_s)
        except (BrokenPipeError, TypeError, ValueError) as exc:
            reply, error = None, f"error: could not send the call ({exc})"
        else:
            error = f"error: {tool.name} timed out after {self.timeout_s:g} s"
        seconds = time.perf_counter() - t0
        if reply is None:
            self.close()  # killed; a fresh worker serves the next call
            return ToolResult(error, False, seconds)
        answer = json.loads(reply)
        text = answer["content"] if answer["ok"] else f"error: {answer['content']}"
        if len(text) > self.max_chars:
            text = text[: self.max_chars] + f"... [{len(text) - self.max_chars} more chars]"
        return ToolResult(text, bool(answer["ok"]), seconds)
