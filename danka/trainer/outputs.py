"""What a run writes while it trains: train.log lines, metrics.jsonl, completions, the
trackers, held-out evaluations, and the closing result file. Rank 0 writes; other ranks
get ``dist.Null`` writers (they still evaluate, in step with rank 0)."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from danka import callbacks
from danka import distributed as dist
from danka.config.schema import DankaConfig
from danka.lifecycle import check_run_lock
from danka.logging.metrics import (
    CompletionsWriter,
    MetricsWriter,
    format_step_line,
    remove_completions_after,
    truncate_metrics_after,
)
from danka.logging.runlog import setup_run_logger
from danka.logging.trackers import SafeTrackers, build_trackers
from danka.trainer.evaluate import evaluate
from danka.trainer.run import Run
from danka.types import RolloutBatch


def is_main_process() -> bool:
    return not dist.requested() or os.environ.get("RANK", "0") == "0"


def run_logger(output_dir: Path) -> logging.Logger:
    return setup_run_logger(output_dir) if is_main_process() else dist.quiet_logger()


@dataclass
class Outputs:
    output_dir: Path
    log: logging.Logger
    main: bool
    metrics: MetricsWriter | dist.Null
    completions: CompletionsWriter | dist.Null
    trackers: SafeTrackers | dist.Null
    history: dict = field(default_factory=lambda: {"eval": []})

    @classmethod
    def open(cls, cfg: DankaConfig, log: logging.Logger, resolved: dict, start: int) -> Outputs:
        """Writers that continue after step ``start`` (later lines of an abandoned
        continuation are removed: those steps will be redone)."""
        out, main = Path(cfg.output_dir), is_main_process()
        if main:
            truncate_metrics_after(out, start)
            remove_completions_after(out, start)
        trackers = dist.Null()
        if main:
            trackers = SafeTrackers(
                build_trackers(out, cfg.logging, run_name=out.name, config=resolved, log=log), log
            )
        return cls(
            output_dir=out,
            log=log,
            main=main,
            metrics=MetricsWriter(out) if main else dist.Null(),
            completions=CompletionsWriter(out) if main else dist.Null(),
            trackers=trackers,
        )

    def record(
        self, run: Run, step: int, metrics: dict, batch: RolloutBatch, completions: list[str]
    ) -> None:
        """metrics.jsonl, trackers, sample completions and (every log_interval) train.log."""
        if self.main:  # the output dir may have been deleted and taken by another run
            check_run_lock(self.output_dir, what=f"step {step}'s metrics")
        self.metrics.write(step, metrics)
        self.trackers.log(metrics, step)
        lg = run.cfg.logging
        if lg.save_completions and self.main:
            k = min(lg.save_completions, len(completions))
            rows = batch.prompt_index[:k].tolist()
            self.completions.write(
                step,
                prompts=[run.train.texts[i] for i in rows],
                completions=completions[:k],
                rewards=batch.rewards[:k].tolist(),
                reward_parts={name: v[:k].tolist() for name, v in batch.reward_parts.items()},
                ground_truths=[run.train.rows[i].ground_truth for i in rows],
            )
        if step % lg.log_interval == 0 or step == run.state.total_steps:
            self.log.info(format_step_line(step, metrics))

    def evaluate(self, run: Run, step: int) -> float | None:
        """Held-out accuracy at ``step`` (None without held-out prompts); every rank
        evaluates the whole set, rank 0 writes OUTPUT/eval/step_N.json."""
        if run.eval is None:
            return None
        self.log.info(f"step {step} | evaluating {len(run.eval.rows)} held-out prompts (greedy)")
        t0 = time.perf_counter()
        result = evaluate(run, run.eval.rows, run.eval.ids, run.eval.texts)
        seconds = time.perf_counter() - t0
        samples = result.pop("_samples")
        self.history["eval"].append({"step": step, **result})
        callbacks.on_eval(step, self.history["eval"][-1])
        if self.main:
            check_run_lock(self.output_dir, what=f"the step {step} evaluation")
            (self.output_dir / "eval").mkdir(exist_ok=True)
            (self.output_dir / "eval" / f"step_{step}.json").write_text(
                json.dumps({"step": step, **result, "samples": samples}, indent=2)
            )
            self.trackers.log(result, step)
            self.log.info(
                f"step {step} | held-out accuracy: {100 * result['eval/accuracy']:.1f}% "
                f"({int(result['eval/n'])} problems, {seconds:.1f} s)"
            )
        return result["eval/accuracy"]

    def close(self) -> None:
        self.trackers.close()
        self.metrics.close()

    def finish(self, run: Run, seconds: float, stopped: str | None = None) -> dict:
        """The closing line and the result file: held-out accuracy before -> after.
        ``stopped``: the signal that ended the run early (no final evaluation: the
        result records the steps done and ``stopped``)."""
        result: dict = {"steps": run.state.total_steps, "seconds": round(seconds, 1)}
        if stopped:
            result["stopped"] = stopped
        evals = self.history["eval"]
        if len(evals) >= 2 and not stopped:
            before, after = evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]
            n = int(evals[-1]["eval/n"])
            curve = [(e["step"], e["eval/accuracy"]) for e in evals]
            result.update(before=before, after=after, n=n, curve=curve)
            line = (
                f"held-out accuracy: before {100 * before:.1f}% -> after {100 * after:.1f}% "
                f"({100 * (after - before):+.1f} points, {n} problems)"
            )
            self.log.info(line)
            print(line, flush=True)
        (self.output_dir / run.cfg.logging.result_file).write_text(json.dumps(result, indent=2))
        return result
