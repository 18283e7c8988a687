"""``danka train``: set up, resume, run the steps, checkpoint, evaluate, report."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from danka import distributed as dist
from danka.checkpoint import (
    complete_checkpoints,
    config_hash,
    delete_checkpoints_after,
    find_latest_checkpoint,
    verify_checkpoint,
)
from danka.config import config_to_dict
from danka.config.schema import DankaConfig
from danka.errors import UserError
from danka.logging.metrics import (
    CompletionsWriter,
    MetricsWriter,
    format_step_line,
    remove_completions_after,
    truncate_metrics_after,
)
from danka.logging.progress import TrainProgress
from danka.logging.runlog import setup_run_logger
from danka.logging.trackers import SafeTrackers, build_trackers
from danka.trainer.checkpointing import check_compatible, restore, save
from danka.trainer.evaluate import evaluate
from danka.trainer.fit import is_finite_step, train_step
from danka.trainer.guards import TrainingFault
from danka.trainer.preflight import preflight
from danka.trainer.setup import build_run


def _resolve_resume(resume: str | None, output_dir: Path, log) -> Path | None:
    """The state dir to resume from. ``auto`` with nothing complete to resume is not an
    error (a job script can always pass it): the run starts at step 0 and says so."""
    if resume is None:
        done = complete_checkpoints(output_dir)
        if done:  # why: a fresh run would mix its checkpoints with these (and truncate metrics)
            raise UserError(
                f"output_dir already holds checkpoints of an earlier run (newest: {done[0]})",
                where=str(output_dir),
                fix="continue that run with --resume auto, or set output_dir to a new folder "
                "(or delete this one)",
            )
        return None
    if resume == "auto":
        found = find_latest_checkpoint(output_dir)
        if found is None:
            log.info(f"--resume auto: no complete checkpoint in {output_dir}, starting from step 0")
        return found
    path = Path(resume)
    if not path.exists():
        raise UserError(
            "checkpoint not found",
            where=str(path),
            fix="give OUTPUT/state/checkpoint_N or use --resume auto",
        )
    if path.parent.name in ("actor", "critic"):  # accept OUTPUT/actor/checkpoint_N too
        path = path.parent.parent / "state" / path.name
    if not path.name.startswith("checkpoint_") or not path.is_dir():
        raise UserError(
            "not a checkpoint folder",
            where=str(path),
            fix="give OUTPUT/state/checkpoint_N (or OUTPUT/actor/checkpoint_N), "
            "or use --resume auto to take the newest complete one",
        )
    verify_checkpoint(path)
    return path


def train(cfg: DankaConfig, base_dir: Path, *, resume: str | None = None) -> dict:
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    main = not dist.requested() or os.environ.get("RANK", "0") == "0"
    log = setup_run_logger(output_dir) if main else dist.quiet_logger()  # rank 0 writes
    t0 = time.perf_counter()
    resolved = config_to_dict(cfg)
    ckpt = _resolve_resume(resume, output_dir, log)
    if ckpt is not None:
        check_compatible(ckpt, resolved)  # before minutes of model loading
    if main:
        (output_dir / "config.json").write_text(json.dumps(resolved, indent=2))

    run = build_run(cfg, base_dir, output_dir, log)
    t = cfg.trainer
    log.info(
        f"{t.algorithm} ({t.advantage_estimator}): {run.total_steps} steps x {t.batch_size} "
        f"prompts x {t.samples_per_prompt} samples = {t.batch_size * t.samples_per_prompt} "
        f"sequences/step; {t.batch_size // t.mini_batch_size} optimizer step(s)/step x "
        f"{t.ppo_epochs} epoch(s); micro-batch {t.micro_batch_size} sequences; "
        f"{len(run.train.rows)} train prompts, {len(run.eval.rows) if run.eval else 0} held-out"
    )
    if t.preflight:  # before a restore, which then sets every RNG as the checkpoint had it
        preflight(run, log)
    start = 0
    history: dict = {"eval": []}
    if ckpt is not None:
        start, history = restore(run, ckpt, resolved)
        log.info(f"Resumed from {ckpt} at step {start}")
        if main:
            # newer checkpoints belong to the abandoned continuation (its metrics lines go
            # too); left in place, a later --resume auto would jump back onto them
            for name in delete_checkpoints_after(output_dir, start):
                log.warning(f"removing {name} (newer than the resumed step {start})")
    if main:  # steps after the checkpoint will be redone: their logged lines go
        truncate_metrics_after(output_dir, start)
        remove_completions_after(output_dir, start)
    # every rank trains; rank 0 alone writes logs, metrics and files (dist.Null elsewhere)
    metrics_out = MetricsWriter(output_dir) if main else dist.Null()
    completions_out = CompletionsWriter(output_dir) if main else dist.Null()
    trackers = (
        dist.Null()
        if not main
        else SafeTrackers(
            build_trackers(
                output_dir,
                tensorboard=cfg.logging.tensorboard,
                wandb_project=cfg.logging.wandb_project,
                mlflow_experiment=cfg.logging.mlflow_experiment,
                run_name=output_dir.name,
                config=resolved,
                log=log,
            ),
            log,
        )
    )

    def run_eval(step: int) -> None:
        if run.eval is None:
            return
        result = evaluate(run, run.eval.rows, run.eval.ids, run.eval.texts)
        samples = result.pop("_samples")
        history["eval"].append({"step": step, **result})
        if not main:  # every rank evaluates the whole held-out set (in step), rank 0 writes
            return
        (output_dir / "eval").mkdir(exist_ok=True)
        (output_dir / "eval" / f"step_{step}.json").write_text(
            json.dumps({"step": step, **result, "samples": samples}, indent=2)
        )
        trackers.log(result, step)
        log.info(
            f"step {step} | held-out accuracy: {100 * result['eval/accuracy']:.1f}% "
            f"({int(result['eval/n'])} problems)"
        )

    if start == 0 and not history["eval"]:
        run_eval(0)
    bad_in_a_row = 0
    h = config_hash(resolved)
    t_train = time.perf_counter()
    progress = cfg.logging.progress and main
    with TrainProgress(run.total_steps, start_step=start, enabled=progress) as bar:
        for step in range(start + 1, run.total_steps + 1):
            metrics, batch, completions = train_step(run, step)
            bad_in_a_row = 0 if is_finite_step(metrics) else bad_in_a_row + 1
            metrics_out.write(step, metrics)
            trackers.log(metrics, step)
            if cfg.logging.save_completions and main:
                write_completions(completions_out, run, step, batch, completions)
            if step % cfg.logging.log_interval == 0 or step == run.total_steps:
                log.info(format_step_line(step, metrics))
            bar.update(step, metrics)
            if bad_in_a_row >= t.max_bad_steps:
                raise TrainingFault(
                    f"{bad_in_a_row} steps in a row had a non-finite loss or gradient "
                    f"(last: step {step})",
                    where="training",
                    fix="lower trainer.lr, set trainer.max_grad_norm, use bfloat16 instead of "
                    "float16, or check the reward for inf values; resume with --resume auto "
                    "from the last good checkpoint",
                )
            out_of_time = (
                t.max_train_minutes is not None
                and (time.perf_counter() - t_train) / 60 >= t.max_train_minutes
            )
            if dist.is_active():  # stop together: one rank alone in a collective would hang
                out_of_time = dist.all_sum(float(out_of_time)) > 0
            if out_of_time and step < run.total_steps:
                log.info(
                    f"trainer.max_train_minutes ({t.max_train_minutes}) reached at step {step}"
                )
                run.total_steps = step
            is_last = step == run.total_steps
            if t.eval_steps and step % t.eval_steps == 0 and not is_last:
                run_eval(step)
                bar.update(step, {"eval/accuracy": history["eval"][-1]["eval/accuracy"]})
            if (t.save_steps and step % t.save_steps == 0) or is_last:
                if is_last:
                    run_eval(step)
                save(run, step, history, resolved, h)
            if is_last:  # also when max_train_minutes cut the run short
                break
    trackers.close()
    metrics_out.close()
    run.rewards.close()
    if not main:
        return {"steps": run.total_steps}
    return finish(run, history, time.perf_counter() - t0)


def write_completions(writer, run, step: int, batch, completions: list[str]) -> None:
    k = min(run.cfg.logging.save_completions, len(completions))
    groups = batch.group_index[:k].tolist()
    idx = run.last_prompt_idx
    writer.write(
        step,
        prompts=[run.train.texts[idx[g]] for g in groups],
        completions=completions[:k],
        rewards=batch.rewards[:k].tolist(),
        reward_parts={name: v[:k].tolist() for name, v in run.last_reward_parts.items()},
        ground_truths=[run.train.rows[idx[g]].ground_truth for g in groups],
    )


def finish(run, history: dict, seconds: float) -> dict:
    """The closing line and the result file: held-out accuracy before -> after."""
    cfg = run.cfg
    result: dict = {"steps": run.total_steps, "seconds": round(seconds, 1)}
    evals = history["eval"]
    if len(evals) >= 2:
        before, after = evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]
        n = int(evals[-1]["eval/n"])
        result.update(
            before=before, after=after, n=n, curve=[(e["step"], e["eval/accuracy"]) for e in evals]
        )
        line = (
            f"held-out accuracy: before {100 * before:.1f}% -> after {100 * after:.1f}% "
            f"({100 * (after - before):+.1f} points, {n} problems)"
        )
        run.log.info(line)
        print(line, flush=True)
    path = Path(cfg.output_dir) / cfg.logging.result_file
    path.write_text(json.dumps(result, indent=2))
    try:
        from danka.tools.plot import plot_run

        plot_run(Path(cfg.output_dir))
    except Exception as err:  # a plot must never fail a finished run
        run.log.warning(f"plot failed: {err}")
    return result
