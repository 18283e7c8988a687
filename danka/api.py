"""The Python API: ``danka.train(config) -> TrainResult``.

``danka train CONFIG key=value`` is this function behind a command line::

    import danka

    result = danka.train("examples/quickstart.yaml", overrides=["trainer.total_steps=2"])
    cfg = danka.Config.from_dict({"model": {...}, "trainer": {...}, "data": {...}})
    result = danka.train(cfg, callbacks=[MyCallback()])
    print(result.before, "->", result.after, result.checkpoint)

A run here is the CLI's run: the output folder is locked (one run per folder), train.log
gets the start-up warnings, SIGTERM/Ctrl-C finish the step and save a checkpoint (in the
main thread), and the plots are drawn at the end. Bad input raises
:class:`danka.errors.UserError` (the CLI prints it and exits 2). One process only: for
several GPUs use ``danka train --nproc N``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danka.schema.sections import DankaConfig

ConfigLike = DankaConfig | dict | str | Path


@dataclass(frozen=True)
class TrainResult:
    """What a run produced (also in ``OUTPUT/<logging.result_file>``)."""

    output_dir: Path
    steps: int
    seconds: float
    before: float | None = None  # held-out accuracy before training (None: no held-out data)
    after: float | None = None  # ... and after
    n: int | None = None  # held-out problems
    checkpoint: Path | None = None  # the newest complete OUTPUT/actor/checkpoint_N
    stopped: str | None = None  # "SIGTERM" / "SIGINT" when a signal ended the run early
    raw: dict = field(default_factory=dict)  # the result file's contents


def _non_defaults(obj: Any, default: Any) -> dict:
    """The fields of dataclass ``obj`` that differ from ``default``'s, as a nested dict:
    what the user set (so algorithm presets still fill what they did not)."""
    out: dict = {}
    for f in dataclasses.fields(obj):
        value, base = getattr(obj, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(value) and dataclasses.is_dataclass(base):
            sub = _non_defaults(value, base)
            if sub:
                out[f.name] = sub
        elif value != base:
            out[f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def to_config(config: ConfigLike, overrides: list[str] | None = None) -> tuple[DankaConfig, Path]:
    """A validated, read-only config and the folder its relative paths are read from."""
    from danka.config.load import config_base_dir, config_from_dict, load_config
    from danka.errors import UserError

    if isinstance(config, (str, Path)):
        return load_config(config, overrides)
    if isinstance(config, dict):
        cfg = config_from_dict(config, overrides)
        return cfg, config_base_dir(cfg)
    if isinstance(config, DankaConfig):
        data = _non_defaults(config, DankaConfig())
        base = config_base_dir(config)
        return config_from_dict(data, overrides, base_dir=base), base
    raise UserError(
        f"danka.train takes a config path, a dict or a danka.Config, got {type(config).__name__}",
        where="danka.train",
        fix="danka.train('config.yaml') or danka.train(danka.Config.from_dict({...}))",
    )


def train(
    config: ConfigLike,
    overrides: list[str] | None = None,
    *,
    callbacks: Iterable[Any] = (),
    resume: str | None = None,
    discard_newer: bool = False,
    plot: bool = True,
) -> TrainResult:
    """Train as ``config`` says: a YAML path, a dict laid out as the YAML is, or a
    :class:`danka.Config`; ``overrides`` are ``key=value`` strings as on the command line.
    ``callbacks``: objects with ``on_step`` / ``on_eval`` / ``on_checkpoint``
    (:mod:`danka.callbacks`). ``resume``: ``"auto"`` or a checkpoint path (as
    ``--resume``). Returns the :class:`TrainResult`."""
    from danka.callbacks import check_callbacks
    from danka.errors import UserError

    cbs = check_callbacks(callbacks)  # a wrong object fails before any work
    try:
        cfg, base_dir = to_config(config, overrides)
        raw, _ = run_training(
            cfg, base_dir, resume=resume, discard_newer=discard_newer, callbacks=cbs, plot=plot
        )
    except UserError as err:
        raise in_api_words(err) from None
    return result_of(cfg, raw)  # after SIGTERM/Ctrl-C: .stopped names the signal


# the command line's words in errors raised below danka.train -> the argument a Python
# caller passes instead (longest first: "--resume auto" before "--resume")
API_WORDS = (
    ("`--resume auto`", 'resume="auto"'),
    ("--resume auto", 'resume="auto"'),
    ("--resume PATH", 'resume="OUTPUT/state/checkpoint_N"'),
    ("--discard-newer", "discard_newer=True"),
    ("--resume", "resume="),
)


def in_api_words(err):
    """``err`` (a UserError) with its fix in danka.train's arguments, not the CLI's flags."""
    for part in ("what", "where", "fix"):
        text = getattr(err, part)
        if text:
            for cli, api in API_WORDS:
                text = text.replace(cli, api)
            setattr(err, part, text)
    head = f"{err.where}: {err.what}" if err.where else err.what
    err.args = (head + (f"\n  fix: {err.fix}" if err.fix else ""),)
    return err


def result_of(cfg: DankaConfig, raw: dict) -> TrainResult:
    from danka.tools.locate import latest_actor_checkpoint

    out = Path(cfg.output_dir)
    return TrainResult(
        output_dir=out,
        steps=int(raw.get("steps", 0)),
        seconds=float(raw.get("seconds", 0.0)),
        before=raw.get("before"),
        after=raw.get("after"),
        n=raw.get("n"),
        checkpoint=latest_actor_checkpoint(out),
        stopped=raw.get("stopped"),
        raw=raw,
    )


def run_training(
    cfg: DankaConfig,
    base_dir: Path,
    *,
    resume: str | None = None,
    discard_newer: bool = False,
    callbacks: Iterable[Any] = (),
    plot: bool = True,
) -> tuple[dict, int]:
    """One process's run, as ``danka train`` does it: lock the output folder, check a
    ``resume`` target (deleting newer checkpoints only with ``discard_newer``), log the
    start-up warnings, turn SIGTERM/SIGINT into checkpoint-and-stop, fit, plot. Returns
    (the result dict, the signal exit code or 0). A failure is also written to
    OUTPUT/logs/train.log, and a run that never finished a step leaves no half-written
    outputs. Under torchrun (the CLI's ``--nproc``) every rank runs this: the launcher holds
    the run lock, each rank a rank lock (it dies with its launcher); rank 0 logs."""
    import os
    from contextlib import nullcontext

    from danka import callbacks as cb
    from danka import distributed as dist
    from danka.config.compat import config_notes, fallback_warnings
    from danka.lifecycle import RankLock, RunLock, StopRequest, note_failure
    from danka.logging.runlog import close_run_logger, setup_run_logger
    from danka.models.threads import use_cpu_threads
    from danka.trainer.fit import fit

    output_dir = Path(cfg.output_dir)
    main = not dist.requested() or os.environ.get("RANK", "0") == "0"
    if RunLock.held_by_parent():  # a rank of --nproc: the launcher holds the run lock
        lock = RankLock(output_dir)
    else:
        lock = RunLock(output_dir) if main else nullcontext()
    result: dict = {}
    with lock:
        log = None
        try:
            if main:
                discard = check_resume_target(resume, discard_newer, output_dir)
                log = setup_run_logger(output_dir)  # fit() reuses it (same arguments)
                if discard is not None:
                    discard(log)
                for line in config_notes(cfg):
                    log.info(line)
                for line in fallback_warnings(cfg):
                    log.warning(line)
            say = log.info if log is not None else (lambda line: None)  # rank 0 says it
            threads = use_cpu_threads(cfg.speed.cpu_threads, cfg.model.device, say)
            with StopRequest(log) as stop, cb.active([*callbacks, threads]):
                try:
                    result = fit(cfg, base_dir, resume=resume)
                finally:
                    dist.destroy()
                    threads.restore()  # the caller's own torch work gets its threads back
        except BaseException as err:
            if main:  # the message in train.log too; no half-written outputs
                note_failure(output_dir, err)
            raise
        finally:
            if main:
                close_run_logger()  # the caller's own logging sees danka's lines again
    if stop.requested:
        # under --nproc the launcher reports the signal (143/130): a rank that stopped
        # cleanly exits 0, so torchrun does not report it as a failed worker
        return result, 0 if RunLock.held_by_parent() and dist.requested() else stop.exit_code
    if plot:
        plot_quietly(cfg.output_dir)
    return result, 0


def check_resume_target(resume: str | None, discard_newer: bool, output_dir: Path):
    """``--resume PATH`` to an older checkpoint would drop the newer ones: refused unless
    ``discard_newer``; then returns ``discard(log)``, which deletes them (logged). None
    when there is nothing to discard."""
    from danka.checkpoint.retention import delete_checkpoints_after, newer_checkpoints
    from danka.errors import UserError

    if not resume or resume == "auto":
        return None
    name = Path(resume).name
    if not name.startswith("checkpoint_") or not name[len("checkpoint_") :].isdigit():
        return None  # fit() names the problem
    step = int(name[len("checkpoint_") :])
    newer = newer_checkpoints(Path(output_dir), step)
    if newer and discard_newer:  # asked for: deleted (fit would only set them aside)

        def discard(log) -> None:
            for gone in delete_checkpoints_after(Path(output_dir), step):
                log.warning(f"removing {gone} (newer than the resumed step {step})")

        return discard
    if newer:
        raise UserError(
            f"{len(newer)} newer checkpoint(s) exist ({', '.join(newer)}); resuming from "
            f"{name} would replace them",
            where=str(output_dir),
            fix="add --discard-newer to delete them, use --resume auto for the newest, or "
            "copy the checkpoint to a new output_dir",
        )
    return None


def plot_quietly(output_dir: str | Path) -> None:
    """The curves of a finished run (rank 0); a plot must never fail a finished run."""
    import os
    import sys

    from danka import distributed as dist

    if dist.requested() and os.environ.get("RANK", "0") != "0":
        return
    try:
        from danka.tools.plot import plot_run

        plot_run(Path(output_dir))
    except Exception as err:  # noqa: BLE001
        print(f"danka: warning: plot failed: {err}", file=sys.stderr)


__all__ = ["TrainResult", "run_training", "to_config", "train"]
