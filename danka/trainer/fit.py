"""``danka train``: the whole algorithm, top to bottom.

Each step: 1 sample prompts -> 2 rollout -> 3 rewards -> 4 old/reference log-probs ->
5 values (critic) -> 6 advantages -> 7 update (actor, critic) -> 8 log -> 9 checkpoint ->
10 evaluate. Stages hand typed records on (Rollout -> Scored -> OldAndRef -> Prepared ->
UpdateStats, danka/step/records.py), each stage bound once to what it needs
(danka/step/stages.py); which algorithm needs what (a critic, a reference, a
correction) is registry metadata resolved once into ``stages.algo``. The loop owns the
run's one changing record, ``RunState`` (step, last step, micro-batch, bad steps:
danka/trainer/state.py), passes it to each step and takes the next one from
``state.after(result)``; it builds the metrics dict only to write it
(danka/step/metrics.py). It measures its own phases: ``time/<phase>`` in every line.
When to evaluate, save and stop it asks one owner, ``RunClocks`` (danka/trainer/clocks.py),
whose answer is the same on every rank.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from danka import callbacks
from danka import distributed as dist
from danka.checkpoint import config_hash
from danka.config import config_to_dict
from danka.lifecycle import StopRequest, current_stop
from danka.logging.progress import TrainProgress
from danka.logging.runlog import close_run_logger, run_logger_open
from danka.schema.secrets import mask_secrets
from danka.schema.sections import DankaConfig
from danka.step.train_step import train_step
from danka.trainer.build import Built, build
from danka.trainer.clocks import RunClocks
from danka.trainer.outputs import Outputs, is_main_process, run_logger
from danka.trainer.preflight import preflight
from danka.trainer.resume import resolve_resume, resume_from
from danka.trainer.saving import check_compatible
from danka.trainer.state import RunState


def fit(cfg: DankaConfig, base_dir: Path, *, resume: str | None = None) -> dict:
    """Train as ``cfg`` says (validated, never changed here); returns the result dict
    (steps, seconds, held-out accuracy before/after) also written to the result file."""
    t0, out_dir, main = time.perf_counter(), Path(cfg.output_dir), is_main_process()
    out_dir.mkdir(parents=True, exist_ok=True)
    opened = main and not run_logger_open()  # else danka.train() opened it and closes it
    try:
        return _build_and_fit(cfg, base_dir, resume, t0, out_dir, main)
    finally:
        if opened:
            close_run_logger()  # a later run, or the caller's own logging, starts clean


def _build_and_fit(cfg, base_dir: Path, resume, t0: float, out_dir: Path, main: bool) -> dict:
    log = run_logger(out_dir)
    resolved = config_to_dict(cfg)
    ckpt = resolve_resume(resume, out_dir, log)
    if ckpt is not None:
        check_compatible(ckpt, resolved)  # before minutes of model loading
    if main:
        (out_dir / "config.json").write_text(json.dumps(mask_secrets(resolved), indent=2))
    built = build(cfg, base_dir, out_dir, log)
    try:
        return _fit(built, cfg, resolved, ckpt, t0, main)
    finally:
        built.close_agent()  # the tool worker process, also on errors


def _fit(built: Built, cfg: DankaConfig, resolved: dict, ckpt, t0: float, main: bool) -> dict:
    """``fit`` once the run is built: the loop owns the run's state."""
    log, s = built.log, built.stages
    log.info(describe(cfg, built))
    micro = built.micro
    if cfg.speed.preflight:  # before a restore, which then sets every RNG as saved
        micro = preflight(s, micro, log)
    start, history = resume_from(built.checkpointer, ckpt, resolved, main)
    outputs = Outputs.open(cfg, log, resolved, start, history, t0)
    if built.evaluator is not None:
        built.evaluator.remember(history.floors, outputs.probe_file)  # a resumed run's step 0
    state = RunState(step=start, total=built.total_steps, micro=micro)
    if start == 0 and not history.evals:
        evaluate(built, outputs, state, full=True)
    h, stop, stopping = config_hash(resolved), current_stop(), False
    clocks = RunClocks.start(cfg, log)  # when to evaluate, save, stop: agreed by all ranks
    stop_requested(stop)  # from here a signal waits for the end of the step (then saves)
    with TrainProgress(state.total, start_step=start, enabled=cfg.logging.progress and main) as bar:
        while not state.done:
            step = state.next_step
            result = train_step(s, state.next_step, state.micro)  # 1-7
            m = s.metrics(result)
            outputs.record(step, m, result.scored, s.prompts, state.total)  # 8. log
            callbacks.on_step(step, m)
            bar.update(step, m)
            # after each step: stop? (bad steps, time limit, signal) then evaluate and save
            due = clocks.after_step(step, state.total)
            state = state.after(
                result, max_bad_steps=cfg.trainer.max_bad_steps, out_of_time=due.out_of_time
            )
            stopping = stop_requested(stop)
            last = state.done  # also when max_train_minutes cut the run
            if not stopping and (last or due.evaluate):  # 10. evaluate (the checkpoint keeps it)
                record = evaluate(built, outputs, state, full=last)
                clocks.evaluated()
                if record is not None and not last:  # the last one is in the closing line
                    bar.update(step, {"eval/accuracy": record["eval/accuracy"]})
            saved = stopping or due.save  # 9. checkpoint
            if saved:
                _save(built, outputs, resolved, h, state.step)
                clocks.saved()
            if not stopping and stop_requested(stop):  # came during the evaluation or the save
                stopping = True  # stop now, not after one more step
                if not saved:
                    _save(built, outputs, resolved, h, state.step)
            if stopping:
                log.warning(
                    f"{signal_name(stop)}: stopped after step {step} (checkpoint saved); "
                    "continue with --resume auto"
                )
                state = state.stopped()
                break
    outputs.close()
    s.rewards.close()
    if not main:
        return {"steps": state.total}
    stopped = signal_name(stop) if stopping else None
    return outputs.finish(state.total, time.perf_counter() - t0, stopped=stopped)


def _save(built: Built, outputs: Outputs, resolved: dict, cfg_hash: str, step: int) -> None:
    """9. the checkpoint of ``step`` with the run's history, then the user's callback."""
    path = built.checkpointer.save(step, outputs.history.to_json(), resolved, cfg_hash)
    callbacks.on_checkpoint(step, path)


def evaluate(built: Built, outputs: Outputs, state: RunState, *, full: bool) -> dict | None:
    """Step 10 at ``state.step``: the evaluation stage, its result written; the record,
    None without held-out prompts."""
    if built.evaluator is None:
        return None
    result = built.evaluator(state.step, state.micro, full=full, started=outputs.t0)
    return outputs.record_eval(result)


def stop_requested(stop: StopRequest | None) -> bool:
    """SIGTERM/SIGINT arrived (danka.lifecycle); under torchrun any rank's signal stops
    every rank after the same step (one rank alone in a collective would hang)."""
    stopping = stop is not None and stop.requested
    if dist.is_active():
        stopping = dist.all_sum(float(stopping)) > 0
    return stopping


def signal_name(stop: StopRequest | None) -> str:
    """SIGTERM / SIGINT, or where this rank got none, the other rank's."""
    return stop.name if stop is not None and stop.signum is not None else "signal on another rank"


def describe(cfg: DankaConfig, built: Built) -> str:
    """The start-up line: algorithm, resolved loss settings, sizes."""
    t, lo, s = cfg.trainer, cfg.loss, built.stages
    rc = t.rollout_correction
    held = len(built.evaluator.held.prompts.rows) if built.evaluator is not None else 0
    return (
        f"{t.algorithm} ({t.advantage_estimator}, policy loss {lo.policy_loss}, clip "
        f"[{lo.clip_ratio_low:g}, {lo.clip_ratio_high:g}], {lo.agg_mode}"
        f"{f', rollout correction {rc.mode} (cap {rc.cap:g})' if s.algo.correction else ''}): "
        f"{built.total_steps} steps x {t.batch_size} prompts x {t.samples_per_prompt} "
        f"samples = {t.batch_size * t.samples_per_prompt} sequences/step; "
        f"{t.batch_size // t.mini_batch_size} optimizer step(s)/step x {t.ppo_epochs} "
        f"epoch(s); micro-batch {built.micro} sequences; "
        f"{len(s.prompts.rows)} train prompts, {held} held-out"
    )
