"""``danka train``: the whole algorithm, top to bottom.

Each step: 1 sample prompts -> 2 rollout -> 3 rewards -> 4 old/reference log-probs ->
5 values (critic) -> 6 advantages -> 7 update (actor, critic) -> 8 log -> 9 checkpoint ->
10 evaluate. Stages hand typed records on (Rollout -> Scored -> OldAndRef -> Prepared ->
UpdateStats, danka/trainer/records.py), each stage bound once to what it needs
(danka/trainer/stages.py); which algorithm needs what (a critic, a reference, a
correction) is registry metadata resolved once into ``run.algo``. The loop acts on the
fields of the ``StepResult`` and builds the metrics dict only to write it
(danka/trainer/metrics.py). It measures its own phases: ``time/<phase>`` in every line.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch

from danka import callbacks
from danka import distributed as dist
from danka.checkpoint import config_hash
from danka.checkpoint.cadence import save_due
from danka.config import config_to_dict
from danka.config.schema import DankaConfig
from danka.config.secrets import mask_secrets
from danka.lifecycle import StopRequest, current_stop
from danka.logging.progress import TrainProgress
from danka.logging.runlog import close_run_logger, run_logger_open
from danka.trainer.checkpointing import check_compatible, save
from danka.trainer.dynamic_sampling import concat_scored, mean_stats
from danka.trainer.forward import effective_token_ratio
from danka.trainer.guards import TrainingFault
from danka.trainer.metrics import step_metrics
from danka.trainer.outputs import Outputs, is_main_process, run_logger
from danka.trainer.preflight import preflight
from danka.trainer.records import Scored, StepResult
from danka.trainer.resume import resolve_resume, resume_from
from danka.trainer.run import Run
from danka.trainer.setup import build_run
from danka.trainer.stages import Stages, build_stages


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
    run = build_run(cfg, base_dir, out_dir, log)
    try:
        return _fit(run, cfg, resolved, ckpt, t0, main)
    finally:
        if run.agent is not None:  # the tool worker process, also on errors
            run.agent.close()


def _fit(run: Run, cfg: DankaConfig, resolved: dict, ckpt, t0: float, main: bool) -> dict:
    """``fit`` once the run is built."""
    log = run.log
    log.info(describe(run))
    stages = build_stages(run)
    if cfg.speed.preflight:  # before a restore, which then sets every RNG as saved
        preflight(run, stages, log)
    start, history = resume_from(run, ckpt, resolved, main)
    outputs = Outputs.open(cfg, log, resolved, start)
    outputs.history, outputs.t0 = history, t0
    if start == 0 and not history["eval"]:
        outputs.evaluate(run, 0)
    bad_in_a_row, t_train, h = 0, time.perf_counter(), config_hash(resolved)
    t_eval = t_train
    stop, t_saved, stopping = current_stop(), time.perf_counter(), False
    stop_requested(stop)  # from here a signal waits for the end of the step (then saves)
    with TrainProgress(
        run.state.total_steps, start_step=start, enabled=cfg.logging.progress and main
    ) as bar:
        for step in range(start + 1, run.state.total_steps + 1):
            result = train_step(stages, step)  # 1-7
            m = metrics_of(run, result)
            outputs.record(step, m, result.scored, run.train, run.state.total_steps)  # 8. log
            callbacks.on_step(step, m)
            bar.update(step, m)
            # after each step: stop? (signal, bad steps, time limit) then evaluate and save
            bad_in_a_row = 0 if result.finite else bad_in_a_row + 1
            check_bad_steps(run, bad_in_a_row, step)
            maybe_stop_early(run, step, t_train)
            stopping = stop_requested(stop)
            last = step == run.state.total_steps  # also when max_train_minutes cut the run
            due = every(cfg.eval.every_steps, step) or minutes_due(cfg.eval.every_minutes, t_eval)
            if not stopping and (last or due):  # 10. evaluate
                record = outputs.evaluate(run, step, full=last)  # (the checkpoint keeps it)
                t_eval = time.perf_counter()
                if record is not None and not last:  # the last one is in the closing line
                    bar.update(step, {"eval/accuracy": record["eval/accuracy"]})
            minutes = (time.perf_counter() - t_saved) / 60
            saved = stopping or save_due(  # 9. checkpoint
                step, run.state.total_steps, cfg.checkpoint.save_steps,
                cfg.checkpoint.save_minutes, minutes,
            )  # fmt: skip
            if saved:
                callbacks.on_checkpoint(step, save(run, step, outputs.history, resolved, h))
                t_saved = time.perf_counter()
            if not stopping and stop_requested(stop):  # came during the evaluation or the save
                stopping = True  # stop now, not after one more step
                if not saved:
                    callbacks.on_checkpoint(step, save(run, step, outputs.history, resolved, h))
            if stopping:
                run.log.warning(
                    f"{signal_name(stop)}: stopped after step {step} (checkpoint saved); "
                    "continue with --resume auto"
                )
                run.state.total_steps = step
            if last or stopping:
                break
    outputs.close()
    run.rewards.close()
    if not main:
        return {"steps": run.state.total_steps}
    stopped = signal_name(stop) if stopping else None
    return outputs.finish(run, time.perf_counter() - t0, stopped=stopped)


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


def train_step(s: Stages, step: int) -> StepResult:
    """Steps 1-7 of one training step; the typed result carries everything the loop and
    the log need. With nothing informative to train on (dynamic sampling) the update is
    skipped, logged, and the last round is what gets logged."""
    clock = PhaseClock()
    scored, rounds, dynamic = sample_and_score(s, clock)  # 1-3 (one round, or DAPO's rounds)
    stats = [r.stats for r in rounds]
    if scored is None:
        s.log.warning(
            f"step {step}: dynamic sampling found no group with differing rewards in "
            f"{len(rounds)} round(s); update skipped"
        )
        s.opts.step_schedules()
        return clock.result(rounds[-1], stats, None, None, dynamic)
    with clock("logprobs"):
        logp = s.old_and_ref(scored)  # 4. old / reference log-probs
    with clock("values"):
        values = s.values(scored)  # 5. critic values (estimators that need a critic)
    with clock("advantages"):
        prepared = s.advantages(scored, logp, values)  # 6. advantages (the registry's estimator)
    with clock("update"):
        update = s.update(prepared, step)  # 7. update (actor, critic); schedules step
    if update.skipped:
        s.log.warning(f"step {step}: {update.reason}; optimizer step skipped")
    kl = s.measured_kl(prepared, update)  # the same on every rank
    s.adapt_kl(kl)
    return clock.result(scored, stats, prepared, update, dynamic, kl)


def sample_and_score(s: Stages, clock: PhaseClock):
    """Steps 1-3: (the samples to train on or None, every round scored, DynamicStats).
    Without dynamic sampling one round; with it (DAPO) rounds repeat until the step has
    ``batch_size`` informative groups or ``max_sampling_rounds`` were generated."""
    rounds: list[Scored] = []
    kept: list[Scored] = []
    have = generated = informative = 0
    for _ in range(s.dynamic.max_rounds if s.dynamic is not None else 1):
        prompt_idx = s.next_prompts()  # 1. sample prompts
        with clock("rollout"):
            rollout = s.sample(prompt_idx)  # 2. rollout (single-turn or the agent loop)
        with clock("reward"):
            scored = s.score(rollout)  # 3. rewards
        rounds.append(scored)
        if s.dynamic is None:
            return scored, rounds, None
        good, n_good = s.dynamic.keep(scored, have)
        generated += n_groups(scored)
        informative += n_good
        if good is not None:
            kept.append(good)
            have += n_groups(good)
        if have >= s.dynamic.batch_size:
            break
    dynamic = s.dynamic.record(len(rounds), generated, informative, have)
    if not kept:
        return None, rounds, dynamic
    merged = concat_scored(kept, s.dynamic.pad_id, mean_stats([r.stats for r in rounds]))
    return merged, rounds, dynamic


def n_groups(scored: Scored) -> int:
    gi = scored.batch.group_index
    return int(gi.max()) + 1 if gi.numel() else 0


class PhaseClock:
    """Seconds per phase of one step and, on CUDA, each phase's peak memory (the device is
    synchronised at the boundaries, so GPU work is charged to the phase that queued it)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() / 2**30
                self.peaks[name] = max(self.peaks.get(name, 0.0), peak)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def result(self, scored, stats, prepared, update, dynamic, kl=None) -> StepResult:
        """The step's result with its timings (``step``: the whole step)."""
        seconds = {**self.seconds, "step": time.perf_counter() - self.t0}
        return StepResult(
            scored=scored, rounds=stats, prepared=prepared, update=update, dynamic=dynamic,
            seconds=seconds, peaks_gib=dict(self.peaks), kl_measured=kl,
        )  # fmt: skip


def describe(run: Run) -> str:
    """The start-up line: algorithm, resolved loss settings, sizes."""
    t, lo = run.cfg.trainer, run.cfg.loss
    rc = t.rollout_correction
    return (
        f"{t.algorithm} ({t.advantage_estimator}, policy loss {lo.policy_loss}, clip "
        f"[{lo.clip_ratio_low:g}, {lo.clip_ratio_high:g}], {lo.agg_mode}"
        f"{f', rollout correction {rc.mode} (cap {rc.cap:g})' if run.algo.correction else ''}): "
        f"{run.state.total_steps} steps x {t.batch_size} prompts x {t.samples_per_prompt} "
        f"samples = {t.batch_size * t.samples_per_prompt} sequences/step; "
        f"{t.batch_size // t.mini_batch_size} optimizer step(s)/step x {t.ppo_epochs} "
        f"epoch(s); micro-batch {run.state.micro_batch_size} sequences; "
        f"{len(run.train.rows)} train prompts, {len(run.eval.rows) if run.eval else 0} held-out"
    )


def metrics_of(run: Run, result: StepResult) -> dict[str, float]:
    """Step 8's metrics dict (built once, here, from the typed result)."""
    batch = result.scored.batch
    return step_metrics(
        result,
        lr=run.actor_sched.get_last_lr()[0],
        kl_coef=float(run.kl_ctl.value),
        packing_ratio=effective_token_ratio(batch, run.state.micro_batch_size, run.pack_len),
    )


def every(k: int, step: int) -> bool:
    """``step`` is a multiple of ``k`` (0 = never)."""
    return bool(k) and step % k == 0


def minutes_due(minutes: float, since: float) -> bool:
    """``minutes`` (0 = never) have passed since ``since`` (a perf_counter time); the same
    answer on every rank."""
    due = bool(minutes) and (time.perf_counter() - since) / 60 >= minutes
    if dist.is_active():  # one rank alone in an evaluation's collectives would hang
        due = dist.all_sum(float(due)) > 0
    return due


def check_bad_steps(run: Run, bad_in_a_row: int, step: int) -> None:
    if bad_in_a_row >= run.cfg.trainer.max_bad_steps:
        raise TrainingFault(
            f"{bad_in_a_row} steps in a row had a non-finite loss or gradient (last: step {step})",
            where="training",
            fix="lower optim.lr, set optim.max_grad_norm, use bfloat16 instead of "
            "float16, or check the reward for inf values; resume with --resume auto "
            "from the last good checkpoint",
        )


def maybe_stop_early(run: Run, step: int, t_train: float) -> None:
    """trainer.max_train_minutes: the current step becomes the last one (checkpoint and
    final evaluation follow). All ranks stop together."""
    limit = run.cfg.trainer.max_train_minutes
    out_of_time = limit is not None and (time.perf_counter() - t_train) / 60 >= limit
    if dist.is_active():  # one rank alone in a collective would hang
        out_of_time = dist.all_sum(float(out_of_time)) > 0
    if out_of_time and step < run.state.total_steps:
        run.log.info(f"trainer.max_train_minutes ({limit}) reached at step {step}")
        run.state.total_steps = step
