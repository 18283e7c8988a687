"""The ``danka`` command: ``danka train CONFIG [key=value ...]`` and the other subcommands.

Bad input (config, data, reward code, checkpoint) prints one message and exits with 2;
``--debug`` shows the traceback too.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from danka import __version__
from danka.commands import COMMANDS, command
from danka.errors import UserError, as_user_error
from danka.interrupt import Terminated, exit_on_terminate
from danka.limits import check_flag_numbers


def _config_args(p: argparse.ArgumentParser) -> None:
    """CONFIG, overrides and the options _load_train_config reads (train and rm)."""
    p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.batch_size=8")
    p.add_argument(
        "--config_file",
        "--config-file",
        dest="config_file",
        help="the config file (alias of the positional CONFIG)",
    )
    p.add_argument("--output-dir", "--output_dir", dest="output_dir", help="where results go")
    p.add_argument("--seed", type=int, help="random seed (trainer.seed)")


def _train_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config with defaults and exit (no model is loaded)",
    )
    p.add_argument("--resume", help="auto (newest complete checkpoint) or a checkpoint path")
    p.add_argument(
        "--verbose", action="store_true", help="every metric in each step's line (logging.verbose)"
    )
    p.add_argument(
        "--nproc",
        type=int,
        help="train with N processes on this machine (re-runs itself through torchrun)",
    )
    _train_lifecycle_args(p)


def _without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def _load_train_config(args):
    from danka.config import load_config

    path = args.config_file or args.config
    overrides = list(args.overrides)
    if args.config_file and args.config:
        overrides.insert(
            0, args.config
        )  # `train --config_file X key=value`: positional is an override
    if path and "=" in path and not os.path.exists(path):
        raise UserError(
            f"{path!r} looks like an override, but no config file was given",
            where="command line",
            fix="danka train CONFIG.yaml key=value ...",
        )
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    if args.seed is not None:
        overrides.append(f"trainer.seed={args.seed}")
    if getattr(args, "verbose", False):  # danka train --verbose
        overrides.append("logging.verbose=true")
    if path is None:
        raise UserError(
            "no config file given", where="command line", fix="danka train examples/quickstart.yaml"
        )
    return load_config(path, overrides)


@command("train", "train a policy with PPO/GRPO from a YAML config", _train_args, computes=True)
def _train(args) -> int:
    import yaml

    from danka import distributed as dist
    from danka.config import config_to_dict
    from danka.config.compat import config_notes, fallback_warnings
    from danka.schema.secrets import mask_secrets

    if args.help_config:
        from danka.config.help import config_help

        print(config_help(), end="")
        return 0
    cfg, base_dir = _load_train_config(args)  # bad input fails once, before any launch
    if args.print_config:
        _check_rewards(cfg)
        for line in config_notes(cfg):
            print(f"[INFO] {line}", file=sys.stderr)
        for line in fallback_warnings(cfg):
            print(f"[WARNING] {line}", file=sys.stderr)
        print(yaml.safe_dump(mask_secrets(config_to_dict(cfg)), sort_keys=False), end="")
        return 0
    return _run_train(args, cfg, base_dir, dist)


# run lifecycle (lock, signals, --discard-newer, --help-config) ---------------------------
def _train_lifecycle_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--discard-newer",
        action="store_true",
        help="with --resume PATH to an older checkpoint: delete the newer checkpoints "
        "(without it danka refuses, keeping them)",
    )
    p.add_argument(
        "--help-config",
        action="store_true",
        help="list every config key with its help text and default, then exit",
    )


def _check_rewards(cfg) -> None:
    """Reward names and kwargs are checked by --print-config too (no model is loaded)."""
    from danka.rewards import check_reward_specs

    check_reward_specs(cfg.reward.functions)


def _run_train(args, cfg, base_dir, dist) -> int:
    """``--nproc N``: re-run under torchrun; else the Python API's run (danka.api)."""
    from pathlib import Path

    from danka.api import check_resume_target, run_training
    from danka.lifecycle import LOCK_HELD_ENV, RunLock, run_forwarding_signals

    output_dir = Path(cfg.output_dir)
    if args.nproc and args.nproc > 1 and not dist.requested():
        with RunLock(output_dir):
            check_resume_target(args.resume, args.discard_newer, output_dir)
            argv = dist.torchrun_argv(args.nproc, _without_nproc(args.raw_argv))
            env = {**os.environ, LOCK_HELD_ENV: str(os.getpid())}
            return run_forwarding_signals(argv, env=env)
    _, code = run_training(cfg, base_dir, resume=args.resume, discard_newer=args.discard_newer)
    if not dist.requested() or os.environ.get("RANK", "0") == "0":  # where it all went
        from danka.tools.locate import latest_actor_checkpoint

        ckpt, report = latest_actor_checkpoint(output_dir), output_dir / "plots" / "report.html"
        parts = [f"report {report.resolve()}"] if report.is_file() else []
        parts += [f"newest checkpoint {ckpt.resolve()}"] if ckpt else []
        print(f"wrote {output_dir.resolve()}" + (f": {'; '.join(parts)}" if parts else ""))
    return code


def _data_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="data_command", required=True)
    g = sub.add_parser("gsm8k", help="write GSM8K in verl's parquet layout and as jsonl")
    g.add_argument("--input", help="a GSM8K jsonl file (question/answer rows)")
    g.add_argument("--from-hub", action="store_true", help="download openai/gsm8k with datasets")
    g.add_argument("--output", required=True, help="output folder")
    g.add_argument("--limit", type=int, help="only the first N rows")
    _gsm8k_pairs_args(sub)
    _seed_mini_args(sub)
    i = sub.add_parser("inspect", help="show the first batch exactly as the model will see it")
    i.add_argument("config")
    i.add_argument("overrides", nargs="*")
    i.add_argument("-n", type=int, default=2, help="prompts to show")


@command("data", "prepare and inspect data", _data_args)
def _data(args) -> int:
    from pathlib import Path

    if args.data_command == "gsm8k":
        from danka.data.gsm8k import convert_gsm8k

        if not args.input and not args.from_hub:
            raise UserError(
                "give --input FILE or --from-hub",
                where="danka data gsm8k",
                fix="danka data gsm8k --input train.jsonl --output data/gsm8k",
            )
        info = convert_gsm8k(
            input_path=Path(args.input) if args.input else None,
            from_hub=args.from_hub,
            output_dir=Path(args.output),
            limit=args.limit,
        )
        for split, n in info["splits"].items():
            print(f"{split}: {n} rows -> {args.output}/{split}.parquet and {split}.jsonl")
        return 0
    if args.data_command == "gsm8k-pairs":
        return _gsm8k_pairs(args)
    if args.data_command == "seed-mini":
        return _seed_mini(args)
    from danka.config import load_config
    from danka.data.inspect import describe_first_batch
    from danka.data.splits import load_rows
    from danka.data.template import encode_prompts
    from danka.models.loading import load_tokenizer

    cfg, base_dir = load_config(args.config, args.overrides)
    m = cfg.model
    tok = load_tokenizer(
        m.actor_model_name_or_path,
        tokenizer_kwargs=vars(m.tokenizer_kwargs),
        trust_remote_code=m.trust_remote_code,
    )
    rows, _ = load_rows(cfg, base_dir, Path(cfg.output_dir))
    enc = encode_prompts(
        tok,
        rows,
        max_prompt_length=cfg.data.max_prompt_length,
        policy=cfg.data.overlong_prompt,
        system_prompt=cfg.data.system_prompt,
        instruction=cfg.data.instruction,
        examples=cfg.data.examples,
    )
    print(describe_first_batch(tok, rows, enc, n=args.n))
    return 0


# `danka data gsm8k-pairs` (hooked into `danka data` above) and `danka rm`
def _gsm8k_pairs_args(sub) -> None:
    g = sub.add_parser("gsm8k-pairs", help="preference pairs from GSM8K (for danka rm)")
    g.add_argument("--input", required=True, help="a GSM8K jsonl file (question/answer rows)")
    g.add_argument("--output", required=True, help="output folder")
    g.add_argument("--test-fraction", type=float, default=0.1, help="questions held out")
    g.add_argument("--limit", type=int, help="only the first N rows")
    g.add_argument("--seed", type=int, default=0, help="split and wrong-number seed")


def _gsm8k_pairs(args) -> int:
    from pathlib import Path

    from danka.data.gsm8k_pairs import build_gsm8k_pairs

    info = build_gsm8k_pairs(
        input_path=Path(args.input),
        output_dir=Path(args.output),
        test_fraction=args.test_fraction,
        limit=args.limit,
        seed=args.seed,
    )
    print(f"{info['train']} train / {info['test']} test pairs:")
    for path in info["files"]:
        print(f"  {path}")
    return 0


def _seed_mini_args(sub) -> None:
    g = sub.add_parser(
        "seed-mini",
        help="the tutorial's mini_gsm8k.json: the first 200 GSM8K rows as prompt/response/reward",
    )
    g.add_argument("--input", help="GSM8K's train.jsonl (question/answer rows)")
    g.add_argument("--from-hub", action="store_true", help="read openai/gsm8k with datasets")
    g.add_argument("--output", default="mini_gsm8k.json", help="default ./mini_gsm8k.json")
    g.add_argument("-n", type=int, default=200, help="rows (the tutorial's head -n 200)")


def _seed_mini(args) -> int:
    from pathlib import Path

    from danka.data.seed_mini import write_seed_mini

    info = write_seed_mini(
        input_path=Path(args.input) if args.input else None,
        from_hub=args.from_hub,
        output=Path(args.output),
        n=args.n,
    )
    print(f"wrote {info['rows']} rows (prompt, response, reward) to {info['output']}")
    return 0


@command(
    "rm", "train a reward model on preference pairs (Bradley-Terry)", _config_args, computes=True
)
def _rm(args) -> int:
    from danka.rm.train import train_reward_model

    # nothing is generated: max_new_tokens must not hold max_length up (validate checks it)
    args.overrides = ["trainer.max_new_tokens=1", *args.overrides]
    cfg, base_dir = _load_train_config(args)
    train_reward_model(cfg, base_dir)
    return 0


def build_parser() -> argparse.ArgumentParser:
    try:  # subcommands of the user tools register themselves on import
        import danka.tools.commands  # noqa: F401
    except ImportError:
        pass
    parser = argparse.ArgumentParser(
        prog="danka", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"danka {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, cmd in COMMANDS.items():
        sp = sub.add_parser(name, help=cmd.help, description=cmd.help, allow_abbrev=False)
        sp.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks"
        )
        cmd.add_args(sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `danka train C.yaml --resume auto key=value`: overrides may follow the options
    stray = [x for x in extra if x.startswith("-") or "=" not in x]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    args.raw_argv = list(sys.argv[1:] if argv is None else argv)
    try:
        check_flag_numbers(args)  # integers in range, floats finite (danka/limits.py)
        cmd = COMMANDS.get(args.command)
        if cmd.computes:  # before torch loads: spin alone, sleep beside another process
            from danka.models import openmp_wait

            openmp_wait.choose()
        with exit_on_terminate():  # SIGTERM unwinds every command (danka/interrupt.py)
            return cmd.run(args) or 0
    except Terminated as stop:
        print(f"danka: terminated ({stop.name})", file=sys.stderr)
        return int(stop.code)
    except Exception as exc:  # noqa: BLE001 - the user's input (exit 2/3) or a bug (re-raised)
        err = as_user_error(exc)
        if err is None:
            raise
        if args.debug:
            traceback.print_exc()
        print(f"danka: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("danka: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
