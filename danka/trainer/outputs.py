"""What a run writes while it trains: train.log lines, metrics.jsonl, completions, the
trackers, the held-out evaluations' files, and the closing result file. It only writes:
the evaluation itself is a stage (danka/step/heldout.py). Rank 0 writes; other ranks
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
from danka.data.files import write_text_atomic
from danka.diagnose import Finding, LiveDiagnoser, read_run_dir
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
from danka.schema.secrets import mask_secrets
from danka.schema.sections import DankaConfig
from danka.step.heldout import EvalResult
from danka.step.prompt_set import PromptSet
from danka.step.records import Scored
from danka.trainer.history import RunHistory


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
    save_completions: int = 0  # logging.save_completions
    log_interval: int = 1  # logging.log_interval
    verbose: bool = False  # logging.verbose: every metric in the step line, on the console too
    progress: bool = True  # logging.progress: the console's one line per step is the bar's
    result_file: str = "result.json"  # logging.result_file
    history: RunHistory = field(default_factory=RunHistory)  # recorded here only
    doctor: LiveDiagnoser | None = None  # the run doctor's checks, live (rank 0)
    t0: float = field(default_factory=time.perf_counter)  # when `danka train` started

    @classmethod
    def open(
        cls,
        cfg: DankaConfig,
        log: logging.Logger,
        resolved: dict,
        start: int,
        history: RunHistory,
        t0: float,
    ) -> Outputs:
        """Writers that continue after step ``start`` (later lines of an abandoned
        continuation are removed: those steps will be redone) with the run's ``history``
        so far; ``t0``: when ``danka train`` started."""
        out, main = Path(cfg.output_dir), is_main_process()
        if main:
            truncate_metrics_after(out, start)
            remove_completions_after(out, start)
        trackers = dist.Null()
        if main:
            trackers = SafeTrackers(
                build_trackers(out, cfg.logging, run_name=out.name, config=resolved, log=log), log
            )
        outputs = cls(
            output_dir=out,
            log=log,
            main=main,
            metrics=MetricsWriter(out) if main else dist.Null(),
            completions=CompletionsWriter(out) if main else dist.Null(),
            trackers=trackers,
            save_completions=cfg.logging.save_completions,
            log_interval=cfg.logging.log_interval,
            verbose=cfg.logging.verbose,
            progress=cfg.logging.progress,
            result_file=cfg.logging.result_file,
            history=history,
            t0=t0,
        )
        if main:
            outputs.doctor = LiveDiagnoser(mask_secrets(resolved))
            outputs.warn(outputs.doctor.start())  # settings that cannot act, risky ones
            if start:  # a resumed run: the steps before were checked (and warned) already
                past = read_run_dir(out)
                for line in past.metrics:
                    outputs.doctor.observe(int(line.get("step", 0)), line)
                for step, records in past.completions:
                    outputs.doctor.observe_completions(step, records)
        return outputs

    def warn(self, findings: list[Finding]) -> None:
        """One ``[WARNING]`` line per new finding of the run doctor (train.log + console)."""
        for finding in findings:
            self.log.warning(finding.message())

    def record(
        self, step: int, metrics: dict, scored: Scored, prompts: PromptSet, total_steps: int
    ) -> None:
        """metrics.jsonl, trackers, sample completions and (every log_interval) train.log."""
        if self.main:  # the output dir may have been deleted and taken by another run
            check_run_lock(self.output_dir, what=f"step {step}'s metrics")
        self.metrics.write(step, metrics)
        self.trackers.log(metrics, step)
        if step % self.log_interval == 0 or step == total_steps:  # on the console: one line a step
            console = self.verbose or not self.progress
            line = format_step_line(step, metrics, verbose=self.verbose)
            self.log.info(line, extra={"console": console})
        if not self.main:
            return
        self.warn(self.doctor.observe(step, metrics))
        if self.save_completions:
            k = min(self.save_completions, scored.rollout.size)
            rows = scored.batch.prompt_index[:k].tolist()
            shown = dict(
                prompts=[prompts.texts[i] for i in rows],
                completions=scored.rollout.shown[:k],
                rewards=scored.rewards[:k].tolist(),
                reward_parts={name: v[:k].tolist() for name, v in scored.parts.items()},
                ground_truths=[prompts.rows[i].ground_truth for i in rows],
            )
            self.completions.write(step, **shown)
            records = [
                {
                    "prompt": p,
                    "completion": c,
                    "reward": r,
                    "ground_truth": g,
                    "rewards": {n: v[i] for n, v in shown["reward_parts"].items()},
                }
                for i, (p, c, r, g) in enumerate(
                    zip(
                        shown["prompts"],
                        shown["completions"],
                        shown["rewards"],
                        shown["ground_truths"],
                    )
                )
            ]
            self.warn(self.doctor.observe_completions(step, records))

    @property
    def probe_file(self) -> Path:
        """The step-0 probe answers (danka.step.heldout.ProbeReference)."""
        return self.output_dir / "eval" / "probe_reference.safetensors"

    def record_eval(self, result: EvalResult) -> dict:
        """An evaluation into the history (its guess floors too, the first time), the
        callbacks, OUTPUT/eval/step_N.json (rank 0, with the step-0 probe answers once),
        the trackers, the run doctor and train.log. Returns its record."""
        step, record = result.step, result.record
        self.history.add(record, result.floors.to_json())
        callbacks.on_eval(step, record)
        if not self.main:
            return record
        check_run_lock(self.output_dir, what=f"the step {step} evaluation")
        (self.output_dir / "eval").mkdir(exist_ok=True)
        if not self.probe_file.is_file():
            result.probe_reference.save(self.probe_file)
        detail = {"guess": self.history.floors["detail"], "probe_answers": result.probe_answers}
        write_text_atomic(
            self.output_dir / "eval" / f"step_{step}.json",
            json.dumps({**record, **detail, "samples": result.samples}, indent=2),
        )
        m = result.metrics
        self.trackers.log(m, step)
        self.warn(self.doctor.observe_eval(step, record))
        self.log.info(
            f"step {step} | held-out accuracy: {100 * m['eval/accuracy']:.1f}% "
            f"({int(m['eval/n'])} problems; guess floor "
            f"{100 * m['eval/guess_floor']:.1f}%, mean answer "
            f"{m['eval/response_length']:.0f} tokens; {result.seconds:.1f} s, the drift probe "
            f"{m['eval/probe_seconds']:.1f} s of it)"
        )
        return record

    def close(self) -> None:
        self.trackers.close()
        self.metrics.close()

    def finish(self, steps: int, seconds: float, stopped: str | None = None) -> dict:
        """The closing line and the result file (``logging.result_file``): held-out
        accuracy before -> after. ``steps``: the steps done; ``stopped``: the signal that
        ended the run early (no final evaluation: the result records the steps done and
        ``stopped``)."""
        result: dict = {"steps": steps, "seconds": round(seconds, 1)}
        if stopped:
            result["stopped"] = stopped
        evals = self.history.evals
        if len(evals) >= 2 and not stopped:
            first, last = evals[0], evals[-1]
            before, after = first["eval/accuracy"], last["eval/accuracy"]
            n, floor = int(last["eval/n"]), last.get("eval/guess_floor", 0.0)
            curve = [(e["step"], e["eval/accuracy"]) for e in evals]
            result.update(before=before, after=after, n=n, guess_floor=floor, curve=curve)
            result["response_length"] = {
                "before": first["eval/response_length"],
                "after": last["eval/response_length"],
            }
            result["truncated"] = {
                "before": first["eval/truncated"],
                "after": last["eval/truncated"],
            }
            line = (
                f"held-out accuracy: before {100 * before:.1f}% -> after {100 * after:.1f}% "
                f"({100 * (after - before):+.1f} points, {n} problems), guess floor "
                f"{100 * floor:.1f}%, mean answer {first['eval/response_length']:.0f} -> "
                f"{last['eval/response_length']:.0f} tokens"
            )
            self.log.info(line)
            print(line, flush=True)
        if self.doctor is not None and not stopped:  # after training: vs the floor
            self.warn(self.doctor.finish())
        write_text_atomic(self.output_dir / self.result_file, json.dumps(result, indent=2))
        return result
