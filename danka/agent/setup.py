"""Building the agent loop from the config (``agent.tools`` / ``agent.environment``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from danka.agent.chat import ChatFormat, check_tool_prompt
from danka.agent.demo import load_demo
from danka.agent.env import ToolEnvironment, UserEnvironment, load_environment_class
from danka.agent.loop import AgentLimits, AgentLoop
from danka.agent.tools import load_tools
from danka.agent.worker import ToolRunner
from danka.errors import UserError
from danka.rollout.base import AnswerOptions


def check_agent_config(agent: Any, *, max_new_tokens: int) -> None:
    """Refuse inconsistent agent settings (called once at start-up, before any model)."""
    if agent.tools and agent.environment:
        raise UserError(
            "agent.tools and agent.environment are both set",
            where="agent",
            fix="use one: tools (the model calls functions) or an environment class "
            "(which can run its own tools inside step())",
        )
    check_tool_prompt(agent.tool_prompt)
    for key in ("max_turns", "max_tool_calls", "tool_max_chars"):
        if getattr(agent, key) < 1:
            raise UserError(f"agent.{key} must be >= 1, got {getattr(agent, key)}")
    if agent.tool_timeout_s <= 0:
        raise UserError(f"agent.tool_timeout_s must be > 0, got {agent.tool_timeout_s}")
    if agent.max_total_tokens < 0:
        raise UserError(
            f"agent.max_total_tokens must be >= 0, got {agent.max_total_tokens}",
            fix="0 means trainer.max_new_tokens",
        )
    if agent.max_total_tokens and agent.max_total_tokens < max_new_tokens:
        raise UserError(
            f"agent.max_total_tokens {agent.max_total_tokens} is below the per-turn "
            f"trainer.max_new_tokens {max_new_tokens}",
            where="agent.max_total_tokens",
            fix="raise it (it budgets all turns together), or 0 for trainer.max_new_tokens",
        )


def build_agent_loop(
    agent: Any,
    tokenizer: Any,
    *,
    base_dir: Path | str,
    max_new_tokens: int,
    instruction: str | None = None,
) -> AgentLoop | None:
    """The loop for ``agent.tools`` or ``agent.environment``; None when neither is set.

    ``max_new_tokens`` (trainer.max_new_tokens) is the per-turn cap; the whole response
    gets ``agent.max_total_tokens`` (0: the same ``max_new_tokens``). ``instruction``
    (data.instruction) ends the questions of the builtin worked examples, as every prompt.
    """
    if not agent.tools and not agent.environment:
        return None
    check_agent_config(agent, max_new_tokens=max_new_tokens)
    limits = AgentLimits(
        max_turns=agent.max_turns,
        max_tool_calls=agent.max_tool_calls,
        max_total_tokens=agent.max_total_tokens or max_new_tokens,
    )
    if agent.environment:
        cls = load_environment_class(agent.environment, base_dir)
        return AgentLoop(
            tokenizer,
            lambda: UserEnvironment(cls, agent.environment),
            limits=limits,
            kv_reuse=agent.kv_reuse,
        )
    tools = load_tools(list(agent.tools), base_dir, timeout_s=agent.tool_timeout_s)
    runner = ToolRunner(
        tools,
        timeout_s=agent.tool_timeout_s,
        max_chars=agent.tool_max_chars,
        sandbox=agent.tool_sandbox,
    )
    builtin = [t.name for t in tools if t.source == "builtin"]
    demo = load_demo(agent.tool_demo, builtin, base_dir, instruction)
    chat = ChatFormat(tokenizer, agent.tool_prompt, demo)
    return AgentLoop(
        tokenizer,
        lambda: ToolEnvironment(runner, chat, agent.max_tool_calls),
        schemas=[t.schema for t in tools],
        limits=limits,
        chat=chat,
        runner=runner,
        kv_reuse=agent.kv_reuse,
    )


def prompt_messages(
    rows: list[Any],
    *,
    system_prompt: str | None = None,
    instruction: str | None = None,
    examples: Sequence[Mapping[str, str]] = (),
) -> list[list[dict[str, str]]]:
    """The chat messages of each row (data.system_prompt / instruction / examples applied),
    the ``prompt_messages`` argument of ``AgentLoop.rollout``."""
    from danka.data.template import build_messages

    style = {"system_prompt": system_prompt, "instruction": instruction, "examples": examples}
    return [build_messages(r.prompt, **style) for r in rows]


def validate_agent(agent: Any, *, base_dir: Path | str, max_new_tokens: int) -> None:
    """Every agent setting and tool spec checked before any model loads (UserError)."""
    check_agent_config(agent, max_new_tokens=max_new_tokens)
    if agent.environment:
        load_environment_class(agent.environment, base_dir)
    else:
        tools = load_tools(list(agent.tools), base_dir, timeout_s=agent.tool_timeout_s)
        load_demo(agent.tool_demo, [t.name for t in tools if t.source == "builtin"], base_dir)


def cli_agent_config(
    tools: list[str],
    *,
    base: Any = None,
    max_turns: int | None = None,
    max_tool_calls: int | None = None,
    tool_prompt: str | None = None,
    tool_demo: str | None = None,
    max_new_tokens: int = 256,
) -> Any:
    """The agent settings of ``danka generate/chat/eval --tools``: ``base`` (a config's
    ``agent`` section, or the defaults) with the flags given on the command line. Without
    a config's tool settings the whole answer may take ``max_turns * max_new_tokens`` tokens."""
    from danka.schema.sections import AgentConfig

    cfg = AgentConfig()
    if base is not None:  # a plain copy: a validated config is read-only
        for f in fields(AgentConfig):
            setattr(cfg, f.name, copy.copy(getattr(base, f.name)))
    if tools:
        cfg.tools, cfg.environment = list(tools), None
    if max_turns is not None:
        cfg.max_turns = max_turns
    if max_tool_calls is not None:
        cfg.max_tool_calls = max_tool_calls
    if tool_prompt is not None:
        cfg.tool_prompt = tool_prompt
    if tool_demo is not None:
        cfg.tool_demo = tool_demo
    if base is None or not (base.tools or base.environment):  # no training budget to keep
        cfg.max_total_tokens = max(cfg.max_turns, 1) * max_new_tokens
    return cfg


def agent_generate(
    model: Any,
    tokenizer: Any,
    rows: list[Any],
    loop: AgentLoop,
    opts: AnswerOptions | None = None,
    *,
    engine: str = "hf",
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Generation with tools for ``danka generate/chat/eval --tools``: the training loop
    (``loop.rollout``) over ``rows``, ``opts.batch_size`` rows per generate call. Like
    ``danka.tools.generate.generate_batch`` one dict per row, ``completions`` = the final
    answers, plus ``trajectories`` (the messages after the prompt, tool turns included);
    and the agent metrics of the call."""
    from danka.models.loading import stop_ids

    opts = opts or AnswerOptions()
    n = opts.n
    gen, params = opts.start(engine, opts.batch_size * n)
    msgs = prompt_messages(
        rows, system_prompt=opts.system, instruction=opts.instruction, examples=opts.examples
    )
    out = loop.rollout(  # every row at once: the engine splits each turn into batches
        gen, model, rows, msgs, params, eos_ids=stop_ids(tokenizer), pad_id=tokenizer.pad_token_id
    )
    items = []
    for i, row in enumerate(rows):
        ks = range(i * n, (i + 1) * n)
        items.append(
            {
                "index": row.index,
                "row": row,
                "prompt": tokenizer.decode(loop.encode_prompt(msgs[i])),
                "completions": [out.final_texts[k] for k in ks],
                "trajectories": [out.completions[k] for k in ks],
                "response_tokens": [int(out.batch.response_mask[k].sum()) for k in ks],
                "truncated": [bool(out.batch.truncated[k]) for k in ks],
            }
        )
    return items, out.metrics
