"""Environments: what answers a model turn in a multi-turn rollout.

A user environment is a class in a file the config names (``agent.environment:
path/to/file.py:Class``), instantiated once per sample, OpenRLHF's agent contract::

    class Guess:
        def reset(self, row) -> str | None:       # row: danka.types.PromptRow
            ...                                   # the first user message (None: row.prompt)
        def step(self, action_text: str) -> tuple[str | None, float, bool]:
            ...                                   # (observation, reward, done)

``action_text`` is the decoded assistant turn. A non-empty observation becomes the next
``user`` message; ``done`` ends the sample; the rewards of all steps are summed into the
sample's environment reward (``AgentRollout.env_rewards``). The environment runs in the
trainer process without a timeout (it is the user's own task code); an exception in it
is a ``UserError`` naming the class and the sample.

Tools are the built-in special case (:class:`ToolEnvironment`): a turn without a tool
call is the final answer (done); otherwise the calls run in the guarded worker and their
results come back as tool messages.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danka.agent.chat import ChatFormat
from danka.agent.parse import parse_tool_calls
from danka.agent.worker import ToolRunner
from danka.errors import UserError
from danka.types import PromptRow


@dataclass
class Step:
    """What answering one model turn gave."""

    messages: list[dict[str, Any]]  # inserted after the turn (empty when done)
    reward: float = 0.0
    done: bool = False
    stop_reason: str | None = None  # why the sample ended, when done
    calls: int = 0  # tool calls answered in the turn (calls over max_tool_calls are not)
    valid_calls: int = 0  # of which parsed, named a known tool and fit its signature
    tool_errors: int = 0  # of the valid ones: raised, timed out
    tool_seconds: float = 0.0
    call_log: list[dict[str, Any]] = field(default_factory=list)  # parsed calls, for messages


class ToolEnvironment:
    """Executes the tool calls of each turn (one instance per sample)."""

    def __init__(self, runner: ToolRunner, chat: ChatFormat, max_tool_calls: int):
        self.runner, self.chat, self.max_tool_calls = runner, chat, max_tool_calls
        self.calls_made = 0

    def reset(self, row: PromptRow) -> str | None:
        return None

    def step(self, action_text: str) -> Step:
        calls = parse_tool_calls(action_text)
        if not calls:
            return Step([], done=True, stop_reason="answer")
        if self.calls_made + len(calls) > self.max_tool_calls:
            return Step([], done=True, stop_reason="max_tool_calls")  # not run, not counted
        self.calls_made += len(calls)
        out = Step([], calls=len(calls))
        for call in calls:
            valid = call.ok and call.name in self.runner.tools
            if valid:
                problem = self.runner.tools[call.name].check_arguments(call.arguments)
                valid = problem is None
            result = self.runner.run(call)
            out.valid_calls += int(valid)
            out.tool_errors += int(valid and not result.ok)
            out.tool_seconds += result.seconds
            out.messages.append(self.chat.tool_message(result.content))
            if call.ok:
                out.call_log.append(call.as_message_call())
        return out


class UserEnvironment:
    """Adapts a user class (reset/step, see the module docstring) to :class:`Step`."""

    def __init__(self, cls: type, spec: str):
        self.spec = spec
        self.env = self._call(cls, "creating")
        self.row_index: int | None = None

    def _call(self, fn, what: str, *args):
        try:
            return fn(*args)
        except Exception as exc:
            tb = "".join(traceback.format_exception(exc)[-3:]).strip()
            index = getattr(self, "row_index", None)
            row = f" (data row {index})" if index is not None else ""
            raise UserError(
                f"the environment failed while {what}{row}:\n    {tb}",
                where=self.spec,
                fix="fix the environment class; reset(row) returns the first user message "
                "or None, step(text) returns (observation, reward, done)",
            ) from exc

    def reset(self, row: PromptRow) -> str | None:
        self.row_index = row.index
        first = self._call(self.env.reset, "resetting", row)
        return None if first is None else str(first)

    def step(self, action_text: str) -> Step:
        result = self._call(self.env.step, "stepping", action_text)
        if not (isinstance(result, tuple) and len(result) == 3):
            raise UserError(
                f"step() returned {type(result).__name__}, expected (observation, reward, done)",
                where=self.spec,
            )
        observation, reward, done = result
        messages = (
            [] if done or not observation else [{"role": "user", "content": str(observation)}]
        )
        if not done and not observation:
            raise UserError(
                "step() returned no observation and done=False: the model would have "
                "nothing new to answer",
                where=self.spec,
                fix="return an observation, or done=True",
            )
        return Step(messages, float(reward), bool(done), "env_done" if done else None)


def load_environment_class(spec: str, base_dir: Path | str = ".") -> type:
    """The class named by ``path/to/file.py:Class`` (only from the file the config names)."""
    from danka.usercode.contract import load_function_from_file

    file, sep, name = str(spec).rpartition(":")
    if not sep or not file.endswith(".py") or not name.isidentifier():
        raise UserError(
            f"bad environment {spec!r}",
            where="agent.environment",
            fix="write it as path/to/file.py:ClassName",
        )
    path = Path(file).expanduser()
    path = (path if path.is_absolute() else Path(base_dir) / path).resolve()
    cls = load_function_from_file(path, name)
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise UserError(
            f"{name} is not an environment class (missing: {', '.join(missing) or 'a class'})",
            where=f"{path}:{name}",
            fix="define a class with reset(self, row) and step(self, action_text)",
        )
    return cls
