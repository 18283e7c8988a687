"""``danka generate`` and ``danka chat``: answers from a model, optionally with a LoRA adapter.

The prompt goes through the tokenizer's chat template exactly as in training
(:func:`danka.data.template.render_prompt`). A single prompt streams its answer
(``transformers.TextStreamer``); a file of prompts is generated in batches by the rollout
engine and written as JSON lines. An adapter folder (``OUTPUT/actor/checkpoint_N``) is
loaded with ``PeftModel.from_pretrained`` on top of its base model.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch

from danka.errors import UserError
from danka.models.loading import pick_device, stop_ids
from danka.rollout.base import AnswerOptions
from danka.safe_read import read_json, refuse_special_files
from danka.schema.dtypes import canonical_dtype
from danka.types import PromptRow

EXIT_WORDS = ("/exit", "/quit")


def read_adapter_config(adapter: str | Path) -> dict[str, Any]:
    """``adapter_config.json`` of a PEFT adapter folder (UserError if it is not one)."""
    folder = Path(adapter).expanduser()
    if not folder.is_dir():
        raise UserError(
            "adapter folder not found",
            where=str(folder),
            fix="give a PEFT adapter folder, e.g. OUTPUT/actor/checkpoint_N",
        )
    cfg_path = folder / "adapter_config.json"
    if not cfg_path.is_file():
        hint = (
            " (it holds a full model: pass it as --model instead)"
            if (folder / "config.json").is_file()
            else ""
        )
        raise UserError(
            f"not a PEFT adapter folder: no adapter_config.json{hint}",
            where=str(folder),
            fix="give OUTPUT/actor/checkpoint_N of a LoRA run",
        )
    fix = "re-save the adapter (danka train writes one)"
    refuse_special_files(folder, what="the adapter folder", fix=fix)  # peft would block
    config = read_json(cfg_path, what="adapter_config.json", fix=fix)
    if not isinstance(config, dict):
        raise UserError("adapter_config.json is not a JSON object", where=str(cfg_path), fix=fix)
    return config


def base_model_of(adapter: str | Path, model: str | None) -> str:
    """``model`` if given, else the adapter's ``base_model_name_or_path``."""
    if model:
        return model
    base = read_adapter_config(adapter).get("base_model_name_or_path")
    if not base:
        raise UserError(
            "the adapter does not name its base model",
            where=str(adapter),
            fix="pass --model with the base model it was trained on",
        )
    return base


def load_for_inference(
    model: str | None,
    adapter: str | None = None,
    *,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
    log: Callable[[str], Any] = print,
) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` in eval mode: the base model (``model``, or the adapter's base)
    with the adapter applied (not merged). The tokenizer comes from the adapter folder when
    it holds one, else from the base."""
    from danka.models.loading import load_causal_lm, load_tokenizer, sync_special_tokens
    from danka.models.threads import use_cpu_threads
    from danka.tools.adapter_load import attach_adapter
    from danka.tools.locate import is_adapter, resolve_checkpoint

    if model and adapter is None and Path(model).expanduser().is_dir():
        # OUTPUT/actor/checkpoint_N as --model: a LoRA checkpoint is its base + adapter; a
        # run folder means its newest checkpoint
        found = resolve_checkpoint(model, flag="--model")
        model, adapter = (None, str(found)) if is_adapter(found) else (str(found), None)
    if adapter is not None:
        read_adapter_config(adapter)  # fail on a bad folder before loading any weights
        model = base_model_of(adapter, model)
    if not model:
        raise UserError("no model given", where="command line", fix="pass --model M")
    tok_source = (
        adapter if adapter and (Path(adapter) / "tokenizer_config.json").is_file() else model
    )
    tokenizer = load_tokenizer(str(tok_source), trust_remote_code=trust_remote_code, log=log)
    net = load_causal_lm(
        model,
        dtype=canonical_dtype(dtype),
        device=pick_device(device, where="--device"),
        trust_remote_code=trust_remote_code,
        log=log,
    )
    use_cpu_threads("auto", next(net.parameters()).device.type, log)  # a shared CPU: one line
    if adapter is not None:
        net = attach_adapter(net, adapter, base_name=model)
        log(f"Loaded adapter {adapter}")
    sync_special_tokens(net, tokenizer)
    net.eval()
    return net, tokenizer


def _encode(tokenizer: Any, text: str, templated: bool) -> list[int]:
    # a chat template already writes the special tokens
    return list(tokenizer(text, add_special_tokens=not templated)["input_ids"])


def _sampling_kwargs(temperature: float, top_p: float) -> dict[str, Any]:
    if temperature <= 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": None}


@torch.no_grad()
def generate_text(
    model: torch.nn.Module,
    tokenizer: Any,
    prompt: str | list[dict[str, str]],
    *,
    system: str | None = None,
    instruction: str | None = None,
    examples: Sequence[Mapping[str, str]] = (),
    max_new_tokens: int = 256,
    temperature: float = 0.7,
    top_p: float = 0.95,
    seed: int | None = 0,
    stream: bool = True,
) -> str:
    """One answer to ``prompt`` (text or chat messages); streamed to stdout token by token
    when ``stream``. ``temperature <= 0`` is greedy. ``system``, ``instruction``,
    ``examples``: the run's prompt format (danka.data.prompt_format), as in training."""
    from transformers import TextStreamer

    from danka.data.template import has_chat_template, render_prompt

    if seed is not None:
        torch.manual_seed(seed)
    style = {"system_prompt": system, "instruction": instruction, "examples": examples}
    text = render_prompt(tokenizer, prompt, **style)
    ids = torch.tensor([_encode(tokenizer, text, has_chat_template(tokenizer))])
    device = next(model.parameters()).device
    streamer = (
        TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if stream else None
    )
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=torch.ones_like(ids).to(device),
        max_new_tokens=max_new_tokens,
        eos_token_id=stop_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        streamer=streamer,
        **_sampling_kwargs(temperature, top_p),
    )
    return tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)


@torch.no_grad()
def generate_batch(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: list[PromptRow],
    opts: AnswerOptions | None = None,
    *,
    max_prompt_length: int = 1_000_000,
    progress: Any = None,
    on_batch: Callable[[list[dict[str, Any]]], Any] | None = None,
) -> list[dict[str, Any]]:
    """``opts.n`` answers per row through the HF rollout engine. Returns one dict per row:
    ``{"index", "row", "prompt", "completions": [n texts], "response_tokens": [n],
    "truncated": [n]}`` (``prompt`` is the rendered text the model saw). ``progress``: a
    :class:`danka.logging.progress.WorkProgress` advanced by each batch's prompts;
    ``on_batch(items)``: called with each batch's finished dicts as soon as they are (a
    caller that writes or scores as it goes keeps its work when stopped)."""
    from danka.data.template import encode_prompts

    opts = opts or AnswerOptions()
    engine, params = opts.start("hf", opts.batch_size)
    batch_size, n = opts.batch_size, opts.n
    enc = encode_prompts(
        tokenizer,
        rows,
        max_prompt_length=max_prompt_length,
        system_prompt=opts.system,
        instruction=opts.instruction,
        examples=opts.examples,
    )
    out: list[dict[str, Any]] = []
    for row, text in zip(enc.rows, enc.texts):
        out.append(
            {
                "index": row.index,
                "row": row,
                "prompt": text,
                "completions": [],
                "response_tokens": [],
                "truncated": [],
            }
        )
    for start in range(0, len(enc.input_ids), batch_size):
        batch = engine.generate(
            model,
            enc.input_ids[start : start + batch_size],
            params,
            eos_ids=stop_ids(tokenizer),
            pad_id=tokenizer.pad_token_id,
        )
        for k in range(batch.size):
            item = out[start + k // n]
            mask = batch.response_mask[k].bool()
            item["completions"].append(
                tokenizer.decode(batch.response_ids[k][mask].tolist(), skip_special_tokens=True)
            )
            item["response_tokens"].append(int(mask.sum()))
            item["truncated"].append(bool(batch.truncated[k]))
        if progress is not None:
            progress.advance(batch.size // n, tokens=int(batch.response_mask.sum()))
        if on_batch is not None:
            on_batch(out[start : start + batch_size])
    return out


@torch.no_grad()
def tool_generate_batch(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: list[PromptRow],
    tools: Any,
    opts: AnswerOptions | None = None,
    *,
    base_dir: str | Path = ".",
    loop: Any = None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """:func:`generate_batch` with tools: the training's agent loop (``danka.agent``) for
    the rollout settings ``tools`` (a ``AgentConfig``; ``opts.max_new_tokens`` per turn).
    Each dict also holds ``trajectories`` (per answer, the messages after the prompt, tool
    turns included); ``completions`` are the final answers. Returns the agent metrics too.
    ``loop``: an open loop to reuse (kept open), else one is built and closed."""
    from danka.agent.setup import agent_generate, build_agent_loop

    opts = opts or AnswerOptions()
    own = loop is None
    if own:  # per turn as in training: the answer cap, the prompts' instruction
        per_turn = {"max_new_tokens": opts.max_new_tokens, "instruction": opts.instruction}
        loop = build_agent_loop(tools, tokenizer, base_dir=base_dir, **per_turn)
    try:
        return agent_generate(model, tokenizer, rows, loop, opts)
    finally:
        if own:
            loop.close()


def format_turns(messages: list[dict[str, Any]]) -> str:
    """A trajectory for the terminal: one ``[role] text`` block per message."""
    return "\n".join(f"[{m['role']}] {m.get('content', '')}" for m in messages)


def generate_file(
    model: torch.nn.Module,
    tokenizer: Any,
    path: str,
    output: TextIO,
    tools: Any = None,
    **kwargs: Any,
) -> int:
    """Answer every prompt of ``path`` (any format danka reads); one JSON line per answer
    on ``output``: ``{"index", "prompt", "completion", "response_tokens", "truncated"}``,
    with ``tools`` (rollout settings) also ``messages``: the turns after the prompt, tool
    calls and responses included (``completion`` is the final answer). Lines are written
    (and flushed) batch by batch: a stopped run keeps every answer it finished.
    Returns the number of lines written."""
    from danka.data.formats import load_prompt_rows
    from danka.logging.progress import WorkProgress

    rows = load_prompt_rows(path).rows
    opts = AnswerOptions(**kwargs)
    progress = WorkProgress(len(rows), "generate", unit="prompts")  # stderr
    written = 0

    def write(items: list[dict[str, Any]]) -> None:  # each batch as it is done
        nonlocal written
        for item in items:
            line = {
                "index": item["index"],
                "prompt": item["prompt"],
                "completion": item["completions"][0],
                "response_tokens": item["response_tokens"][0],
                "truncated": item["truncated"][0],
            }
            if tools is not None:
                line["messages"] = item["trajectories"][0]
            output.write(json.dumps(line, ensure_ascii=False) + "\n")
            written += 1
        output.flush()

    if tools is not None:
        items, _ = tool_generate_batch(model, tokenizer, rows, tools, opts)
        progress.advance(len(rows))
        write(items)
    else:
        generate_batch(model, tokenizer, rows, opts, progress=progress, on_batch=write)
    return written


def chat_loop(
    model: torch.nn.Module,
    tokenizer: Any,
    *,
    system: str | None = None,
    read_line: Callable[[str], str] = input,
    out: TextIO | None = None,
    tools: Any = None,
    **gen: Any,
) -> list[dict[str, str]]:
    """Interactive chat: each line read is a user turn; the whole conversation is the
    prompt of the next answer. ``/exit`` (or end of input) quits; ``/reset`` starts over.
    With ``tools`` (rollout settings) each answer runs through the agent loop and every
    turn is printed (``[assistant]`` calls, tool responses, the final answer); the tool
    turns stay in the conversation. Returns the conversation."""
    out = out or sys.stdout
    messages: list[dict[str, str]] = []
    loop = None
    if tools is not None:
        from danka.agent.setup import build_agent_loop

        loop = build_agent_loop(
            tools, tokenizer, base_dir=".", max_new_tokens=gen.get("max_new_tokens", 256)
        )
    out.write("danka chat: /exit quits, /reset clears the conversation\n")
    try:
        while True:
            try:
                line = read_line("> ")
            except EOFError:
                break
            text = line.strip()
            if text in EXIT_WORDS:
                break
            if text == "/reset":
                messages.clear()
                continue
            if not text:
                continue
            messages.append({"role": "user", "content": text})
            if loop is not None:
                turns = _tool_turns(model, tokenizer, messages, tools, loop, system, gen)
                out.write(format_turns(turns) + "\n")
                messages += turns
            else:
                answer = generate_text(model, tokenizer, list(messages), system=system, **gen)
                if not gen.get("stream", True):
                    out.write(answer + "\n")
                messages.append({"role": "assistant", "content": answer})
            out.flush()
    finally:
        if loop is not None:
            loop.close()
    return messages


def _tool_turns(model, tokenizer, messages, tools, loop, system, gen) -> list[dict[str, str]]:
    """The turns answering ``messages`` through the agent loop (role/content only: the
    ``<tool_call>`` text stays in the assistant content, as the model wrote it)."""
    opts = AnswerOptions(system=system, **{k: v for k, v in gen.items() if k != "stream"})
    row = PromptRow(index=0, prompt=[dict(m) for m in messages])
    [item], _ = tool_generate_batch(model, tokenizer, [row], tools, opts, loop=loop)
    return [{"role": m["role"], "content": m["content"]} for m in item["trajectories"][0]]
