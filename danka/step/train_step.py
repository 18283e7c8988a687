"""One training step, steps 1-7: sample prompts -> rollout -> rewards -> old/reference
log-probs -> values -> advantages -> update, each a stage bound once (danka/step/stages.py)
and timed by the step's own :class:`PhaseClock`. It knows nothing of the run around it
(checkpoints, evaluation, logs: the trainer package), so a benchmark runs this very step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

from danka.step.dynamic_sampling import concat_scored, mean_stats
from danka.step.records import Prepared, Scored, StepResult, UpdateStats
from danka.step.stages import Stages

# The step's phases, in order: the keys of its clock (time/<phase>, peak/<phase>), of the
# out-of-memory guard, of the perf/<phase>_* metrics and of the benchmarks' tables. The
# memory plan prices logprobs and values as one peak, "prepare" (danka.planning.memory).
PHASES = ("rollout", "reward", "logprobs", "values", "advantages", "update")


def train_step(s: Stages, step: int, micro: int, clock: PhaseClock | None = None) -> StepResult:
    """Steps 1-7 of step ``step`` at micro-batch ``micro``; the typed result carries
    everything the loop and the log need, the micro-batch the step ended at included (an
    out-of-memory retry halves it). With nothing informative to train on (dynamic
    sampling) the update is skipped, logged, and the last round is what gets logged.
    ``clock``: the phases' timer (a benchmark passes one that also profiles a phase)."""
    clock = PhaseClock() if clock is None else clock
    scored, rounds, dynamic = sample_and_score(s, clock, micro)  # 1-3 (a round, or DAPO's)
    stats = [r.stats for r in rounds]
    if scored is None:
        s.log.warning(
            f"step {step}: dynamic sampling found no group with differing rewards in "
            f"{len(rounds)} round(s); update skipped"
        )
        s.opts.step_schedules()
        return clock.result(rounds[-1], stats, None, None, dynamic, micro)
    prepared, update, micro = prepare_and_update(s, scored, step, micro, clock)  # 4-7
    if update.skipped:
        s.log.warning(f"step {step}: {update.reason}; optimizer step skipped")
    kl = s.measured_kl(prepared, update)  # the same on every rank
    s.adapt_kl(kl)
    return clock.result(scored, stats, prepared, update, dynamic, micro, kl)


def prepare_and_update(
    s: Stages, scored: Scored, step: int, micro: int, clock: PhaseClock
) -> tuple[Prepared, UpdateStats, int]:
    """Steps 4-7 on scored samples: (the prepared batch, the update's stats, the
    micro-batch the update ended at: an out-of-memory retry halves it)."""
    with clock("logprobs"):
        logp, micro = s.old_and_ref(scored, micro)  # 4. old / reference log-probs
    with clock("values"):
        values, micro = s.values(scored, micro)  # 5. critic values (estimators with a critic)
    with clock("advantages"):
        prepared = s.advantages(scored, logp, values)  # 6. advantages (the registry's estimator)
    with clock("update"):
        update, micro = s.update(prepared, step, micro)  # 7. update (actor, critic); schedules
    return prepared, update, micro


def sample_and_score(s: Stages, clock: PhaseClock, micro: int):
    """Steps 1-3: (the samples to train on or None, every round scored, DynamicStats).
    Without dynamic sampling one round; with it (DAPO) rounds repeat until the step has
    ``batch_size`` informative groups or ``max_sampling_rounds`` were generated."""
    rounds: list[Scored] = []
    kept: list[Scored] = []
    have = generated = informative = 0
    for _ in range(s.dynamic.max_rounds if s.dynamic is not None else 1):
        prompt_idx = s.next_prompts()  # 1. sample prompts
        with clock("rollout"):
            rollout = s.sample(prompt_idx, micro)  # 2. rollout (single-turn or the agent loop)
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

    def __init__(self, around: Callable[[str], contextlib.AbstractContextManager] | None = None):
        self.around = around  # a context each phase also runs in (a benchmark's profiler)
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
            with self.around(name) if self.around is not None else contextlib.nullcontext():
                yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() / 2**30
                self.peaks[name] = max(self.peaks.get(name, 0.0), peak)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def result(self, scored, stats, prepared, update, dynamic, micro, kl=None) -> StepResult:
        """The step's result with its timings (``step``: the whole step)."""
        seconds = {**self.seconds, "step": time.perf_counter() - self.t0}
        return StepResult(
            scored=scored,
            rounds=stats,
            prepared=prepared,
            update=update,
            dynamic=dynamic,
            seconds=seconds,
            peaks_gib=dict(self.peaks),
            micro=micro,
            kl_measured=kl,
        )
