"""Every place a benchmark reaches into danka's trainer, in one file, through its public
builders only.

The training benchmarks run danka's own step (``danka.step.train_step``: the step ``danka
train`` runs, with a clock a benchmark may hook, e.g. to profile a phase) on random-weight
models that have no files to load, so they cannot go through ``danka train``: they build
the model set (``step.model_set.build_models``), hand it to ``trainer.build.assemble``
(the builder ``build`` ends in) with stand-in rewards, and hold the step number and
micro-batch in a ``RunState`` of their own. A/B switches are config settings
(``speed.fused_logprob_head``, ``speed.shared_prefix_forward``,
``rollout.shared_prefix``), never patched module globals. Nothing else in ``bench/``
imports ``danka.trainer``.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from danka.data.splits import load_rows
from danka.models import fused_norm as _fused_norm
from danka.models import lora_linear as _lora_linear
from danka.models import prefix as _prefix
from danka.models.lora import compute_adapters_in
from danka.models.speed import compile_forward
from danka.planning.run_plan import cap_process
from danka.rewards.combine import RewardOutput
from danka.rewards.combine import reward_specs as _reward_specs
from danka.step import train_step as _step
from danka.step.forward import (
    ForwardSettings,
    effective_token_ratio,
    policy_logprobs,
    trim,
)
from danka.step.model_set import build_models
from danka.step.prompt_set import PromptSet
from danka.step.records import (
    ON_POLICY,
    Prepared,
    Scored,
    StepResult,
    TrainBatch,
    select_rollout,
)
from danka.step.stages import Stages
from danka.step.train_step import PhaseClock
from danka.step.update import UpdateSettings, update
from danka.trainer.build import Built, assemble, build
from danka.trainer.components import build_model_set
from danka.trainer.state import RunState
from danka.types import PromptRow, RolloutBatch

__all__ = ["ForwardSettings", "cap_process", "effective_token_ratio", "policy_logprobs", "trim"]


class _NoText:
    """Tokenizer stand-in for random-weight runs: completions decode to empty strings."""

    pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def random_rewards(rows, prompts, completions, **_) -> RewardOutput:
    """Reward stand-in for random-weight runs: N(0, 1) scores, so advantages are non-zero."""
    b = len(completions)
    ones = torch.ones(b, dtype=torch.bool)
    return RewardOutput(
        scores=torch.randn(b), per_function={}, valid=ones, num_errors=0, num_calls=b
    )


def wrap_models(cfg, base: torch.nn.Module, log):
    """The trainer's model set (policy adapter, critic adapter + value head, reference =
    adapters off) around an already-built ``base``."""
    return build_models(cfg, base, lambda: None, log.info)


def load_models(cfg, dev: torch.device, log):
    """The trainer's model set loaded the way ``danka train`` loads it (quantisation too)."""
    models, _ = build_model_set(cfg, dev, log)
    return models


@dataclass
class BenchRun:
    """A run as a benchmark drives it: what ``danka train`` builds (``Built``) and the
    state its loop would own (the benchmark steps it, so it holds it here)."""

    built: Built
    state: RunState


def build_run_for_bench(
    cfg, models, dev, dtype, log, *, prompts=None, engine=None, eos=(), pad=0, sizes=None
) -> BenchRun:
    """``trainer.build.assemble`` with stand-ins for what a random-weight model has no
    files for: the tokenizer (empty completions) and the rewards (N(0, 1)). ``prompts``:
    token-id lists to sample from; ``sizes``: the plan of the sizes that are ``auto``
    (danka.planning.micro)."""
    prompts = prompts or [[pad]] * cfg.trainer.batch_size
    rows = [PromptRow(index=i, prompt="") for i in range(len(prompts))]
    train = PromptSet(rows=rows, texts=[""] * len(rows), ids=prompts)
    built = assemble(
        cfg, models, engine=engine, rewards=random_rewards, train=train, tokenizer=_NoText(),
        log=log, eos_ids=list(eos), pad_id=pad, sizes=sizes,
    )  # fmt: skip
    return _bench_run(built)


def build_run_from_config(cfg, base_dir: Path, out_dir: Path, log) -> BenchRun:
    """What ``danka train`` builds: model, tokenizer, data, rewards, engine."""
    return _bench_run(build(cfg, base_dir, out_dir, log))


def _bench_run(built: Built) -> BenchRun:
    return BenchRun(built, RunState(step=0, total=built.total_steps, micro=built.micro))


def close_run(run: BenchRun) -> None:
    """Release the run's engine buffers and reward workers."""
    s = run.built.stages
    getattr(s.sampling.engine, "release", lambda: None)()
    getattr(s.rewards, "close", lambda: None)()


def policy_of(run: BenchRun) -> torch.nn.Module:
    return run.built.stages.models.policy


def set_engine(run: BenchRun, engine) -> None:
    """Swap the run's rollout engine (``None`` after releasing one)."""
    s = run.built.stages
    sampling = dataclasses.replace(s.sampling, engine=engine)
    run.built = dataclasses.replace(run.built, stages=dataclasses.replace(s, sampling=sampling))


def set_micro_batch(run: BenchRun, sequences: int) -> None:
    run.state = dataclasses.replace(run.state, micro=sequences)


def micro_batch(run: BenchRun) -> int:
    """The micro-batch the run is at (out-of-memory retries halve it)."""
    return run.state.micro


def packed_length(run: BenchRun) -> int | None:
    """Row length of ``speed.packing`` (None: packing off)."""
    return run.built.stages.updating.forward.pack_len


def stages_of(run: BenchRun, *, fused_head: bool | None = None, chunk: int | None = None) -> Stages:
    """The run's step stages, the log-prob head's fused chunks on or off when
    ``fused_head`` is given (``speed.fused_logprob_head`` for this run) and its chunk of
    ``chunk`` rows when given (``speed.logprob_chunk_size``)."""
    s = run.built.stages
    changes = {"fused_head": fused_head, "chunk_size": chunk}
    changes = {k: v for k, v in changes.items() if v is not None}
    if changes:
        fwd = dataclasses.replace(s.updating.forward, **changes)
        s = dataclasses.replace(
            s,
            updating=dataclasses.replace(s.updating, forward=fwd),
            preparing=dataclasses.replace(s.preparing, forward=fwd),
        )
    return s


def train_step(run: BenchRun, step: int) -> StepResult:
    """Step ``step`` of the training loop: its typed result (samples, phase seconds,
    peaks); the micro-batch it ended at is the run's from now on."""
    return step_result(run, step)


def packing_ratio(run: BenchRun, batch: RolloutBatch) -> float:
    """``packing/effective_token_ratio`` of ``batch`` as the run's update packs it."""
    varlen = run.built.stages.updating.forward.varlen
    return effective_token_ratio(batch, run.state.micro, packed_length(run), varlen)


def step_result(run: BenchRun, step: int, around=None) -> StepResult:
    """Step ``step`` of the training loop (the library's ``train_step``): its typed result
    (samples, phase seconds and peaks, the prepared batch); the micro-batch it ended at is
    the run's from now on. ``around(phase)``, when given, is a context each phase also
    runs in, inside the step's own clock (e.g. a profiler)."""
    result = _step.train_step(stages_of(run), step, run.state.micro, PhaseClock(around))
    run.state = dataclasses.replace(run.state, step=step, micro=result.micro)
    return result


def first_rows(scored: Scored, n: int) -> Scored:
    """The first ``n`` samples of a scored rollout (whole groups when ``n`` is a multiple of
    samples_per_prompt: a prompt's samples are adjacent)."""
    idx = torch.arange(min(n, scored.batch.size))
    rollout = select_rollout(scored.rollout, idx, scored.batch.group_index[idx])
    return dataclasses.replace(
        scored, rollout=rollout, rewards=scored.rewards[idx], valid=scored.valid[idx],
        parts={k: v[idx] for k, v in scored.parts.items()},
    )  # fmt: skip


def prepare_and_update(run: BenchRun, scored: Scored, step: int, *, chunk: int | None = None):
    """Steps 4-7 of the library's step (log-probs, values, advantages, update of step
    ``step``) on an already scored rollout at the run's micro-batch, timed by the step's
    own clock: ``(seconds, peaks GiB, prepared)`` per phase. The micro-batch the update
    ended at (an out-of-memory retry halves it) is the run's from now on."""
    clock = PhaseClock()
    prepared, _, micro = _step.prepare_and_update(
        stages_of(run, chunk=chunk), scored, step, run.state.micro, clock
    )
    run.state = dataclasses.replace(run.state, micro=micro)
    return dict(clock.seconds), dict(clock.peaks), prepared


def logprob_passes(prepared: Prepared) -> int:
    """Forward passes of the log-probs phase: pi_old unless on-policy, pi_ref with a KL
    term."""
    o = prepared.old_and_ref
    return int(o.old is not ON_POLICY) + int(o.ref is not None)


def needs_critic(run: BenchRun) -> bool:
    return run.built.stages.algo.needs_critic


def logprob_chunk(run: BenchRun) -> int:
    """Rows per chunk of the run's log-prob head (``speed.logprob_chunk_size``, planned)."""
    return run.built.stages.updating.forward.chunk_size


def set_checkpointing(run: BenchRun, on: bool) -> None:
    """Gradient checkpointing of the trained models on or off (non-reentrant)."""
    ms = run.built.stages.models
    for m in {id(m): m for m in (ms.policy, ms.critic_model) if m is not None}.values():
        if on:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            m.gradient_checkpointing_disable()


def set_packed_update(run: BenchRun, on: bool, seq_tokens: int, padded: UpdateSettings) -> None:
    """A/B of ``speed.packed_update``: the update padding-free with micro-batches of
    micro x ``seq_tokens`` real tokens and LoRA computed in the base dtype (on), or as
    ``padded`` with peft's fp32 adapter path (off)."""
    s = run.built.stages
    fwd = dataclasses.replace(padded.forward, varlen=on, seq_tokens=seq_tokens)
    s = dataclasses.replace(
        s,
        updating=dataclasses.replace(padded, forward=fwd),
        preparing=dataclasses.replace(s.preparing, forward=fwd),
    )
    run.built = dataclasses.replace(run.built, stages=s)
    policy = s.models.policy
    if s.models.lora:
        compute_adapters_in(policy, next(policy.parameters()).dtype if on else None)


def set_cuda_graphs(run: BenchRun, on: bool) -> None:
    """A/B of ``speed.cuda_graphs`` on the run's log-prob, value and update forwards."""
    s = run.built.stages
    up = dataclasses.replace(s.updating.forward, cuda_graphs=on)
    prep = dataclasses.replace(s.preparing.forward, cuda_graphs=on)
    s = dataclasses.replace(
        s,
        updating=dataclasses.replace(s.updating, forward=up),
        preparing=dataclasses.replace(s.preparing, forward=prep),
    )
    run.built = dataclasses.replace(run.built, stages=s)


def cuda_graphs_on(run: BenchRun) -> bool:
    return run.built.stages.updating.forward.cuda_graphs


def train_batch(batch: RolloutBatch, advantages: torch.Tensor) -> TrainBatch:
    """An on-policy training batch (pi_old = the policy at the update's one optimiser step)
    of ``batch``'s sequences with the given (B, R) advantages."""
    valid = torch.ones(batch.size, dtype=torch.bool)
    return TrainBatch.of(batch, valid=valid, advantages=advantages, old_logprobs=ON_POLICY)


def update_step(
    run: BenchRun, batch: TrainBatch, *, fused_head: bool = True, chunk: int | None = None
) -> None:
    """The update phase alone (log-probs, loss, backward, optimiser) on a ready batch."""
    s = stages_of(run, fused_head=fused_head, chunk=chunk)
    update(
        s.models, s.algo, s.opts, batch, s.updating, micro_size=run.state.micro,
        kl_coef=float(s.kl_ctl.value), generator=s.generator,
    )  # fmt: skip


def compile_failures() -> list[str]:
    """Why compiled decoder layers fell back to eager (danka.models.speed), if they did."""
    from danka.models import speed

    return list(speed._compile_failed)


def fuse_lora(model: torch.nn.Module, fused: bool) -> None:
    """danka.models.lora_linear's fused layer (``fused``) or peft's LoRA forward, per variant."""
    for m in model.modules():
        if hasattr(m, "lora_A"):  # peft's layers only: their A/B keep the bf16 casts
            _lora_linear.uninstall(m)
            if fused and _lora_linear.fusable(m):
                _lora_linear.install(m)


def fuse_norms(on: bool, *models: torch.nn.Module | None) -> None:
    """A/B of danka.models.fused_norm on ``models`` (None: skipped)."""
    for model in models:
        if model is not None:
            _fused_norm.uninstall(model)
            if on:
                _fused_norm.install(model)


def run_models(run: BenchRun) -> tuple:
    """Every model the run's forwards go through: policy, critic, reference copy (or None)."""
    m = run.built.stages.models
    return m.policy, m.critic_model, m.reference_copy


def compile_body(model: torch.nn.Module, dev: torch.device) -> None:
    """``speed.compile: true`` on an already-built model."""
    compile_forward(model, True, dev)


def common_prefix_len(prompts: list[list[int]]) -> int:
    return _prefix.common_prefix_len(prompts)


def danka_train_command(config: Path, overrides: list[str], eager_head: bool) -> list[str]:
    """``danka train CONFIG KEY=VALUE ...`` as a child command; ``eager_head`` runs it with
    the log-prob head's per-chunk work eager (``speed.fused_logprob_head: false``)."""
    extra = ["speed.fused_logprob_head=false"] if eager_head else []
    return [sys.executable, "-m", "danka", "train", str(config), *overrides, *extra]


def held_out_rows(cfg, base_dir: Path, run_dir: Path) -> list[PromptRow]:
    """The held-out rows ``danka train`` evaluates on for this config."""
    return load_rows(cfg, base_dir, run_dir)[1]


def reward_specs(cfg, rows: list[PromptRow]):
    """The reward functions ``danka train`` scores these rows with."""
    return _reward_specs(cfg, rows)
