"""CLI registration of the user tools: generate, chat, eval, plot, export, doctor, estimate.

``danka.cli.build_parser`` imports this module; each ``@command`` adds a subcommand. Heavy
imports (torch models, matplotlib) happen inside the run functions, so ``danka --help``
stays fast.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from danka.commands import command
from danka.errors import UserError
from danka.io import prepare_output_file, write_text_atomic


def _model_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument(
        "--model",
        required=required,
        help="base model: local folder, .gguf file or hub id (default: the adapter's base)",
    )
    p.add_argument("--adapter", help="LoRA adapter folder, e.g. OUTPUT/actor/checkpoint_N")
    p.add_argument("--dtype", default="auto", help="auto | bf16 | fp16 | fp32")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")


def _gen_args(p: argparse.ArgumentParser, temperature: float = 0.7) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer tokens")
    p.add_argument(
        "--temperature",
        type=float,
        default=temperature,
        help=f"0 = greedy (default {temperature:g})",
    )
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--system", help="system message (replaces the run's data.system_prompt)")
    p.add_argument(
        "--no-prompt-format",
        dest="prompt_format",
        action="store_false",
        help="answer the bare prompt: without the system prompt, instruction and worked "
        "examples (data.*) the checkpoint was trained and evaluated with (applied by default)",
    )


def _flags(args, *names: str) -> dict:
    """The parsed flags ``names`` as keywords: each flag's dest is the keyword it feeds."""
    return {k: getattr(args, k) for k in names}


def _gen_kwargs(args, log) -> dict:
    """The ``_gen_args`` flags as keywords of generate_text / generate_file / chat_loop,
    with the run's prompt format (danka.tools.prompt_source) unless --no-prompt-format."""
    from danka.tools.prompt_source import prompt_format_for

    fmt = prompt_format_for(
        args.model, args.adapter, apply=args.prompt_format, system=args.system, log=log
    )
    return {**fmt.options(), **_flags(args, "max_new_tokens", "temperature", "top_p", "seed")}


# --tools for generate / chat / eval (the training loop: danka.agent)
def _tool_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tools",
        action="append",
        help="offer tools as agent.tools does: calculator | python | path/to/file.py:function "
        "(repeat, or comma-separate); the answer runs through the training's agent loop",
    )
    p.add_argument("--max-turns", type=int, help="with --tools: assistant turns (default 4)")
    p.add_argument(
        "--max-tool-calls", type=int, help="with --tools: tool calls per answer (default 8)"
    )
    p.add_argument(
        "--tool-prompt",
        help="with --tools: the system text offering them (agent.tool_prompt: auto | hermes | "
        "smollm | own text with {schemas}; default auto)",
    )
    p.add_argument(
        "--tool-demo",
        help="with --tools: worked examples before the prompt (agent.tool_demo: auto | none | "
        "demo.json; default auto)",
    )


_TOOL_FLAGS = ("max_turns", "max_tool_calls", "tool_prompt", "tool_demo")  # need --tools


def _tool_specs(args) -> list[str]:
    """``--tools a,b --tools c`` -> ``[a, b, c]``; the tool flags refused without tools."""
    specs = [s.strip() for arg in args.tools or [] for s in arg.split(",") if s.strip()]
    if args.tools is not None and not specs:
        raise UserError("--tools is empty", where="--tools", fix="--tools calculator")
    given = [f for f in _TOOL_FLAGS if getattr(args, f) is not None]
    if given and not specs and not getattr(args, "config", None):
        flag = "--" + given[0].replace("_", "-")
        raise UserError(f"{flag} needs --tools", where=flag, fix="add --tools calculator")
    return specs


def _tool_rollout(args, max_new_tokens: int):
    """The validated rollout settings of ``--tools`` (None without it); bad specs fail
    here, before any model loads."""
    from danka.agent.setup import cli_agent_config, validate_agent

    specs = _tool_specs(args)
    if not specs:
        return None
    flags = _flags(args, *_TOOL_FLAGS)
    cfg = cli_agent_config(specs, max_new_tokens=max_new_tokens, **flags)
    validate_agent(cfg, base_dir=Path.cwd(), max_new_tokens=max_new_tokens)
    return cfg


def _generate_args(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt; the answer streams to the terminal")
    src.add_argument("--file", help="prompts file (jsonl/json/parquet, any format danka reads)")
    _gen_args(p, temperature=0.0)  # greedy: the answer held-out accuracy scores (danka eval)
    p.add_argument("--batch-size", type=int, default=16, help="prompts per generate call (--file)")
    p.add_argument("--output", help="write JSON lines here instead of stdout")
    _tool_args(p)


def _need_model(args) -> None:
    if not args.model and not args.adapter:
        raise UserError(
            "no model given",
            where="command line",
            fix="pass --model M (a folder, .gguf or hub id) and/or --adapter DIR",
        )


@command(
    "generate",
    "answer a prompt (streamed) or a file of prompts (JSON lines)",
    _generate_args,
    computes=True,
)
def _generate(args) -> int:
    from danka.tools.generate import generate_file, generate_text, load_for_inference

    _need_model(args)
    if args.file and not Path(args.file).exists():
        raise UserError("prompts file not found", where=args.file, fix="check the path")
    if args.output:  # a folder or an unwritable place fails before the model loads
        prepare_output_file(args.output)
    tools = _tool_rollout(args, args.max_new_tokens)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731 - keep stdout for answers
    model, tok = load_for_inference(
        args.model, args.adapter, dtype=args.dtype, device=args.device, log=log
    )
    gen = _gen_kwargs(args, log)
    if args.prompt is not None and tools is not None:
        return _generate_prompt_with_tools(model, tok, args, tools, gen)
    if args.prompt is not None:
        answer = generate_text(model, tok, args.prompt, stream=args.output is None, **gen)
        if args.output:
            line = {"prompt": args.prompt, "completion": answer}
            write_text_atomic(Path(args.output), json.dumps(line, ensure_ascii=False) + "\n")
            log(f"wrote the answer to {Path(args.output).resolve()}")
        return 0
    if args.output:  # each batch's lines are written (and flushed) as it is done
        with open(args.output, "w", encoding="utf-8") as f:
            count = generate_file(
                model, tok, args.file, f, tools, batch_size=args.batch_size, **gen
            )
        log(f"wrote {count} answers to {Path(args.output).resolve()}")
    else:
        generate_file(model, tok, args.file, sys.stdout, tools, batch_size=args.batch_size, **gen)
    return 0


def _generate_prompt_with_tools(model, tok, args, tools, gen: dict) -> int:
    """``generate --prompt P --tools T``: every turn printed (or written with --output)."""
    from danka.rollout.base import AnswerOptions
    from danka.tools.generate import format_turns, tool_generate_batch
    from danka.types import PromptRow

    opts = AnswerOptions(**gen)
    [item], _ = tool_generate_batch(model, tok, [PromptRow(0, args.prompt)], tools, opts)
    turns = item["trajectories"][0]
    if not args.output:
        print(format_turns(turns))
        return 0
    line = {"prompt": args.prompt, "completion": item["completions"][0], "messages": turns}
    write_text_atomic(Path(args.output), json.dumps(line, ensure_ascii=False) + "\n")
    print(f"wrote the turns to {Path(args.output).resolve()}", file=sys.stderr)
    return 0


def _chat_args(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    _gen_args(p)
    _tool_args(p)


@command("chat", "chat with a model in the terminal (/exit quits)", _chat_args, computes=True)
def _chat(args) -> int:
    from danka.tools.generate import chat_loop, load_for_inference

    _need_model(args)
    tools = _tool_rollout(args, args.max_new_tokens)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    model, tok = load_for_inference(
        args.model, args.adapter, dtype=args.dtype, device=args.device, log=log
    )

    def read_line(prompt: str) -> str:
        if sys.stdin.isatty():
            return input(prompt)
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line

    chat_loop(model, tok, read_line=read_line, tools=tools, **_gen_kwargs(args, log))
    return 0


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="training config: model, data and reward come from it")
    p.add_argument("overrides", nargs="*", help="dotted overrides for the config")
    _model_args(p)
    p.add_argument("--data", help="prompts file (without CONFIG)")
    p.add_argument(
        "--split",
        default="test",
        help="split read when --data is a dataset folder or hub name (files have none)",
    )
    p.add_argument("--reward", help="builtin reward (gsm8k, math, ...) or path.py:function")
    p.add_argument("--n", type=int, help="only the first N prompts")
    p.add_argument(
        "--samples",
        type=int,
        default=1,
        help="answers per prompt: 1 = greedy accuracy, K > 1 = pass@k at temperature 1",
    )
    p.add_argument("--max-new-tokens", type=int, help="answer tokens (default: config or 256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", help="write the result JSON here")
    _tool_args(p)
    # sampled held-out accuracy at the training temperature
    p.add_argument(
        "--temperature",
        type=float,
        help="with --samples K > 1: sample at this temperature instead of 1 (e.g. the "
        "config's sampling.temperature); accuracy is then the mean over all K answers",
    )


@command(
    "eval",
    "accuracy / pass@k of a model (+ adapter) under a reward function",
    _eval_args,
    computes=True,
)
def _eval(args) -> int:
    from danka.tools.evaluate import format_result, run_eval

    if args.data and not Path(args.data).exists():
        raise UserError("data file not found", where=args.data, fix="check the path")
    inputs = _flags(args, "config", "overrides", "model", "adapter", "data", "split", "reward", "n")
    answers = _flags(args, "samples", "max_new_tokens", "temperature", "seed", "dtype", "device")
    tools = _flags(args, *_TOOL_FLAGS)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    result = run_eval(
        output=args.output, log=log, tools=_tool_specs(args), **inputs, **answers, **tools
    )
    print(format_result(result))  # run_eval said where the result file went
    if result.get("stopped"):  # a partial result was kept; exit as the signal says
        return 128 + signal.Signals[result["stopped"]]
    return 0


def _plot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("output_dir", help="a run's output folder (works on a run in progress)")


@command("plot", "plot a run's curves to OUTPUT/plots/ and report.html", _plot_args)
def _plot(args) -> int:
    from danka.tools.plot import plot_run

    folder = Path(args.output_dir)
    if not folder.is_dir():
        raise UserError(
            "run folder not found",
            where=str(folder),
            fix="give the output_dir of a danka train run",
        )
    if not (folder / "metrics.jsonl").exists():
        raise UserError(
            "no metrics.jsonl in this folder (is it a run's output_dir?)",
            where=str(folder),
            fix="give the output_dir of a danka train run",
        )
    for path in plot_run(folder):
        print(path)
    return 0


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--adapter",
        required=True,
        help="LoRA adapter folder, a full-parameter checkpoint, or a run folder (its newest)",
    )
    p.add_argument("--output", required=True, help="new folder for the merged model")
    p.add_argument("--model", help="base model (default: the adapter's base_model_name_or_path)")
    p.add_argument(
        "--dtype",
        default="trained",
        help="trained (default: the dtype the adapter was trained in, fp32 for a CPU run) | "
        "bf16 | fp16 | fp32 | auto",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty folder")
    p.add_argument(
        "--gguf",
        nargs="?",
        const="f16",
        choices=["f16", "bf16", "q8_0", "f32"],
        help="also write OUTPUT/<name>-<type>.gguf for llama.cpp / Ollama / LM Studio "
        "(default type f16)",
    )


@command(
    "export",
    "merge a LoRA adapter into its base model (HF safetensors folder; --gguf for llama.cpp)",
    _export_args,
)
def _export(args) -> int:
    from danka.tools.export import export_merged

    flags = _flags(args, "model", "dtype", "device", "overwrite", "gguf")
    export_merged(args.adapter, args.output, **flags)
    return 0


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dir",
        nargs="?",
        help="a run's output folder: diagnose the run (is it learning?) instead of the machine",
    )
    p.add_argument("--json", action="store_true", help="with RUN_DIR: the findings as JSON")


@command(
    "doctor",
    "check this machine (no argument), or diagnose a run: danka doctor RUN_DIR",
    _doctor_args,
)
def _doctor(args) -> int:
    if args.run_dir:
        from danka.tools.run_doctor import run_doctor_on

        return run_doctor_on(args.run_dir, as_json=args.json)
    if args.json:
        raise UserError("--json needs RUN_DIR", where="--json", fix="danka doctor OUTPUT --json")
    from danka.tools.doctor import run_doctor

    return run_doctor()


def _estimate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        help="training config (the model's config.json is read, and the "
        "training prompts for their longest length)",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides for the config")
    p.add_argument("--gpu-memory", help="GPU memory, e.g. 24GB (default: this GPU's, else 24GB)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


@command("estimate", "GPU memory plan per phase, and whether the config fits", _estimate_args)
def _estimate(args) -> int:
    from danka.config import load_config
    from danka.config.load import located
    from danka.planning.inputs import PlanInput
    from danka.planning.memory import judged, price
    from danka.planning.micro import plan_memory
    from danka.planning.shape import ModelShape, load_model_config
    from danka.schema.units import parse_memory
    from danka.tools.estimate import format_plan
    from danka.trainer.components import data_prompt_tokens

    cfg, base_dir = load_config(args.config, args.overrides)
    if args.gpu_memory:
        budget = parse_memory(args.gpu_memory)
    else:
        import torch

        budget = (
            torch.cuda.get_device_properties(0).total_memory
            if torch.cuda.is_available()
            else parse_memory("24GB")
        )
    with located(cfg):  # a refusal naming a bare key: said at its override or line
        # the model first: one it cannot read is the error, not also a note on the prompts
        config = load_model_config(cfg.model.actor_model_name_or_path, base_dir)  # read once
        longest = data_prompt_tokens(cfg, base_dir, log=lambda msg: print(msg, file=sys.stderr))
    inp = PlanInput.of(cfg, longest)
    shape = ModelShape.of(config, inp.target_modules, inp.lora_r)
    sizes = plan_memory(inp, shape, budget)  # the sizes that are auto
    plan = judged(price(sizes.sizes, shape), sizes.sizes, shape, budget)
    auto = sizes.line() if sizes.auto else None
    if args.json:
        result = plan.to_dict() | ({"micro_batch_plan": auto} if auto else {})
        print(json.dumps(result, indent=2, default=str))
    else:
        print(format_plan(plan, auto))
    return 0


def _distill_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="prompt -> response rows (seed format)")
    p.add_argument("--teacher", help="builtin reward (gsm8k, math, ...) or path.py:function")
    p.add_argument("--teacher-model", help="a trained reward classifier folder as the teacher")
    p.add_argument("--student", required=True, help="small model (hub id, folder) to train")
    p.add_argument("--output", required=True, help="where the student classifier goes")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--limit", type=int, help="only the first N rows")
    p.add_argument("--response-key", default="response", help="column with the response text")
    p.add_argument("--answer-key", help="column with the ground truth (default: '#### N' in it)")


@command(
    "distill",
    "distil a reward (rule, function or model) into a small classifier",
    _distill_args,
    computes=True,
)
def _distill(args) -> int:
    from danka.tools.distill import distill

    models = _flags(args, "data", "teacher", "teacher_model", "student")
    training = _flags(args, "epochs", "lr", "batch_size", "max_length", "limit")
    columns = _flags(args, "response_key", "answer_key")
    distill(output=Path(args.output), **models, **training, **columns)
    return 0


def _push_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        help="a checkpoint (OUTPUT/actor/checkpoint_N), a run folder (its newest checkpoint) "
        "or a danka export folder",
    )
    p.add_argument("repo_id", help="Hub model repo, owner/name (created if missing)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--token", help="Hub token (default: HF_TOKEN or `hf auth login`'s)")
    p.add_argument("--endpoint", help="another Hub endpoint (default: HF_ENDPOINT or the Hub)")
    p.add_argument("--message", help="commit message")


@command("push", "upload a checkpoint or export (with its model card) to the HF Hub", _push_args)
def _push(args) -> int:
    from danka.tools.hub import push

    push(
        args.path,
        args.repo_id,
        private=True if args.private else None,
        token=args.token,
        endpoint=args.endpoint,
        commit_message=args.message,
    )
    return 0
