"""``danka train``: the whole algorithm, top to bottom.

Each step: 1 sample prompts -> 2 rollout -> 3 rewards -> 4 old/reference log-probs ->
5 values (critic) -> 6 advantages -> 7 update (actor, critic) -> 8 log -> 9 checkpoint ->
10 evaluate. A ``RolloutBatch`` (danka/types.py) is the only thing passed between the
stages (danka/trainer/steps.py); which algorithm needs what (a critic, a reference, a
correction) is registry metadata resolved once into ``run.algo``. The loop measures its
own phases: ``time/<phase>`` in every metrics line.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import torch

from danka import distributed as dist
from danka.checkpoint import config_hash
from danka.checkpoint.cadence import save_due
from danka.config import config_to_dict
from danka.config.schema import DankaConfig
from danka.config.secrets import mask_secrets
from danka.lifecycle import StopRequest, current_stop
from danka.logging.progress import TrainProgress
from danka.trainer import steps
from danka.trainer.checkpointing import check_compatible, save
from danka.trainer.forward import effective_token_ratio
from danka.trainer.guards import TrainingFault
from danka.trainer.outputs import Outputs, is_main_process, run_logger
from danka.trainer.preflight import preflight
from danka.trainer.resume import resolve_resume, resume_from
from danka.trainer.run import Run
from danka.trainer.setup import build_run
from danka.trainer.update import NonFiniteError
from danka.types import RolloutBatch


def fit(cfg: DankaConfig, base_dir: Path, *, resume: str | None = None) -> dict:
    """Train as ``cfg`` says (validated, never changed here); returns the result dict
    (steps, seconds, held-out accuracy before/after) also written to the result file."""
    t0, out_dir, main = time.perf_counter(), Path(cfg.output_dir), is_main_process()
    out_dir.mkdir(parents=True, exist_ok=True)
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
    if cfg.trainer.preflight:  # before a restore, which then sets every RNG as saved
        preflight(run, log)
    start, history = resume_from(run, ckpt, resolved, main)
    outputs = Outputs.open(cfg, log, resolved, start)
    outputs.history = history
    if start == 0 and not history["eval"]:
        outputs.evaluate(run, 0)
    bad_in_a_row, t_train, h = 0, time.perf_counter(), config_hash(resolved)
    stop, t_saved, stopping = current_stop(), time.perf_counter(), False
    stop_requested(stop)  # from here a signal waits for the end of the step (then saves)
    with TrainProgress(
        run.state.total_steps, start_step=start, enabled=cfg.logging.progress and main
    ) as bar:
        for step in range(start + 1, run.state.total_steps + 1):
            m, batch, completions = train_step(run, step)  # 1-7
            outputs.record(run, step, m, batch, completions)  # 8. log
            bar.update(step, m)
            # after each step: stop? (signal, bad steps, time limit) then evaluate and save
            bad_in_a_row = 0 if is_finite_step(m) else bad_in_a_row + 1
            check_bad_steps(run, bad_in_a_row, step)
            maybe_stop_early(run, step, t_train)
            stopping = stop_requested(stop)
            last = step == run.state.total_steps  # also when max_train_minutes cut the run
            if not stopping and (last or every(cfg.trainer.eval_steps, step)):  # 10. evaluate
                acc = outputs.evaluate(run, step)  # (first: the checkpoint keeps its result)
                if acc is not None and not last:  # the last one is in the closing line
                    bar.update(step, {"eval/accuracy": acc})
            minutes = (time.perf_counter() - t_saved) / 60
            saved = stopping or save_due(  # 9. checkpoint
                step, run.state.total_steps, cfg.trainer.save_steps,
                cfg.trainer.save_minutes, minutes,
            )  # fmt: skip
            if saved:
                save(run, step, outputs.history, resolved, h)
                t_saved = time.perf_counter()
            if not stopping and stop_requested(stop):  # came during the evaluation or the save
                stopping = True  # stop now, not after one more step
                if not saved:
                    save(run, step, outputs.history, resolved, h)
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


def train_step(run: Run, step: int) -> tuple[dict[str, float], RolloutBatch, list[str]]:
    """Steps 1-7 of one training step; returns (metrics, the batch, decoded completions).
    With dynamic sampling, steps 1-3 repeat until the step has informative groups; with
    none at all the update is skipped (logged) and the last round is what gets logged."""
    m: dict[str, float] = {}
    t_step = time.perf_counter()
    rounds: list[tuple[RolloutBatch, list[str], dict[str, float]]] = []

    def rollout_and_score(prompt_idx: list[int]) -> RolloutBatch:
        if run.agent is not None:  # multi-turn: rewards score the final answers
            with phase(m, "rollout"):
                got = steps.agent_step(run, prompt_idx)  # 2. rollout (tools / environment)
            m.update(got.metrics)
            with phase(m, "reward"):
                scored = steps.score(run, got.batch, got.completions, got.env_rewards)  # 3.
            rounds.append((got.batch, got.trajectories, scored))  # the log shows tool turns
            return got.batch
        with phase(m, "rollout"):
            batch = steps.rollout(run, prompt_idx)  # 2. rollout
        with phase(m, "reward"):
            completions = run.decode(batch)
            rounds.append((batch, completions, steps.score(run, batch, completions)))  # 3.
        return batch

    def next_prompts() -> list[int]:
        return steps.sample_prompts(run)  # 1. sample prompts

    if run.dynamic is None:
        batch = rollout_and_score(next_prompts())
        completions = rounds[0][1]
    else:
        batch, ds_metrics = run.dynamic.collect(next_prompts, rollout_and_score)
        m.update(ds_metrics)
        completions = run.decode(batch) if batch is not None else rounds[-1][1]
    for key in rounds[0][2]:  # reward statistics over everything generated this step
        m[key] = sum(r[2].get(key, 0.0) for r in rounds) / len(rounds)
    if batch is None:
        run.log.warning(
            f"step {step}: dynamic sampling found no group with differing rewards in "
            f"{len(rounds)} round(s); update skipped"
        )
        m["dynamic_sampling/skipped_update"] = 1.0
        step_schedules(run)
        m["time/step"] = time.perf_counter() - t_step
        return step_metrics(run, rounds[-1][0], m), rounds[-1][0], completions
    with phase(m, "logprobs"):
        m.update(steps.logprobs(run, batch))  # 4. old/reference log-probs
    with phase(m, "values"):
        steps.values(run, batch)  # 5. values (critic)
    with phase(m, "advantages"):
        m.update(steps.advantages(run, batch))  # 6. advantages
    with phase(m, "update"):
        m.update(update_or_skip(run, batch, step))  # 7. update (actor, critic)
    steps.adapt_kl(run, m)
    m["time/step"] = time.perf_counter() - t_step
    return step_metrics(run, batch, m), batch, completions


@contextlib.contextmanager
def phase(metrics: dict[str, float], name: str):
    """Adds the seconds spent in the block to ``metrics["time/<name>"]``; on CUDA also the
    block's peak memory as ``memory/<name>_peak_gib`` (the device is synchronised at the
    boundaries, so GPU work is charged to the phase that queued it)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**30
            metrics[f"memory/{name}_peak_gib"] = peak
            metrics["memory/peak_gib"] = max(metrics.get("memory/peak_gib", 0.0), peak)
        metrics[f"time/{name}"] = metrics.get(f"time/{name}", 0.0) + time.perf_counter() - t0


def describe(run: Run) -> str:
    """The start-up line: algorithm, resolved loss settings, sizes."""
    t = run.cfg.trainer
    rc = t.rollout_correction
    return (
        f"{t.algorithm} ({t.advantage_estimator}, policy loss {t.policy_loss}, clip "
        f"[{t.clip_ratio_low:g}, {t.clip_ratio_high:g}], {t.loss_agg_mode}"
        f"{f', rollout correction {rc.mode} (cap {rc.cap:g})' if run.algo.correction else ''}): "
        f"{run.state.total_steps} steps x {t.batch_size} prompts x {t.samples_per_prompt} "
        f"samples = {t.batch_size * t.samples_per_prompt} sequences/step; "
        f"{t.batch_size // t.mini_batch_size} optimizer step(s)/step x {t.ppo_epochs} "
        f"epoch(s); micro-batch {run.state.micro_batch_size} sequences; "
        f"{len(run.train.rows)} train prompts, {len(run.eval.rows) if run.eval else 0} held-out"
    )


def update_or_skip(run: Run, batch: RolloutBatch, step: int) -> dict[str, float]:
    """Step 7; a non-finite loss or gradient skips the optimiser step (logged)."""
    try:
        m = steps.update_actor_critic(run, batch, step)
        m["skipped_step"] = 0.0
    except NonFiniteError as err:
        run.log.warning(f"step {step}: {err}; optimizer step skipped")
        m = {"skipped_step": 1.0}
    step_schedules(run)
    return m


def step_schedules(run: Run) -> None:
    """The schedules follow the step number, with or without an optimiser step."""
    run.actor_sched.step()
    if run.critic_sched is not None:
        run.critic_sched.step()


def step_metrics(run: Run, batch: RolloutBatch, m: dict[str, float]) -> dict[str, float]:
    """The step's summary numbers (reduced over ranks under torchrun)."""
    # the actor's loss; during trainer.critic_warmup_steps (no actor update) the critic's,
    # the only loss optimised then (a missing actor loss is not a non-finite one)
    m["loss"] = m.get("actor/loss", m.get("critic/vf_loss", float("nan")))
    m["lr"] = run.actor_sched.get_last_lr()[0]
    m["kl_coef"] = float(run.kl_ctl.value)
    m["packing/effective_token_ratio"] = effective_token_ratio(
        batch, run.state.micro_batch_size, run.pack_len
    )
    if dist.is_active():
        m = dist.reduce_metrics(m)
    m["throughput/gen_tokens_per_s"] = float(batch.response_mask.sum()) / max(
        m["time/rollout"], 1e-9
    )
    return m


def every(k: int, step: int) -> bool:
    """``step`` is a multiple of ``k`` (0 = never)."""
    return bool(k) and step % k == 0


def is_finite_step(metrics: dict) -> bool:
    if metrics.get("dynamic_sampling/skipped_update"):  # nothing to train on is not a fault
        return True
    return metrics.get("skipped_step", 0.0) == 0.0 and math.isfinite(metrics.get("loss", 0.0))


def check_bad_steps(run: Run, bad_in_a_row: int, step: int) -> None:
    if bad_in_a_row >= run.cfg.trainer.max_bad_steps:
        raise TrainingFault(
            f"{bad_in_a_row} steps in a row had a non-finite loss or gradient (last: step {step})",
            where="training",
            fix="lower trainer.lr, set trainer.max_grad_norm, use bfloat16 instead of "
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
