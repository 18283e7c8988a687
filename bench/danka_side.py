"""Every place a benchmark reaches into danka's trainer, in one file, through its public
builders only.

The training benchmarks run danka's own step (``train_step``, ``update``) on random-weight
models that have no files to load, so they cannot go through ``danka train``: they build
the model set (``trainer.models.build_models``), hand it to ``trainer.setup.assemble_run``
(the builder ``build_run`` ends in) with stand-in rewards, and bind the step's stages with
``trainer.stages.build_stages``. A/B switches are config settings
(``trainer.fused_logprob_head``, ``trainer.shared_prefix_forward``,
``rollout.shared_prefix``), never patched module globals. Nothing else in ``bench/``
imports ``danka.trainer``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from danka.lifecycle import compile_forward
from danka.rewards.combine import RewardOutput
from danka.rollout import hf_prefix as _hf_prefix
from danka.trainer import fit as _fit
from danka.trainer.budget import cap_process
from danka.trainer.forward import (
    ForwardSettings,
    effective_token_ratio,
    policy_logprobs,
    trim,
)
from danka.trainer.models import build_models
from danka.trainer.records import ON_POLICY, Prepared, Scored, StepResult, TrainBatch
from danka.trainer.run import PromptSet, Run
from danka.trainer.setup import assemble_run, build_model_set, build_run, load_rows
from danka.trainer.setup import reward_specs as _reward_specs
from danka.trainer.stages import Stages, build_stages
from danka.trainer.update import update
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


def build_run_for_bench(
    cfg, models, dev, dtype, log, *, prompts=None, engine=None, eos=(), pad=0, sizes=None
) -> Run:
    """``assemble_run`` with stand-ins for what a random-weight model has no files for:
    the tokenizer (empty completions) and the rewards (N(0, 1)). ``prompts``: token-id
    lists to sample from; ``sizes``: the plan of the sizes that are ``auto``
    (danka.planning.micro)."""
    prompts = prompts or [[pad]] * cfg.trainer.batch_size
    rows = [PromptRow(index=i, prompt="") for i in range(len(prompts))]
    train = PromptSet(rows=rows, texts=[""] * len(rows), ids=prompts)
    return assemble_run(
        cfg, models, engine=engine, rewards=random_rewards, train=train, tokenizer=_NoText(),
        log=log, eos_ids=list(eos), pad_id=pad, sizes=sizes,
    )  # fmt: skip


def build_run_from_config(cfg, base_dir: Path, out_dir: Path, log) -> Run:
    """The ``Run`` ``danka train`` builds: model, tokenizer, data, rewards, engine."""
    return build_run(cfg, base_dir, out_dir, log)


def close_run(run: Run) -> None:
    """Release the run's engine buffers and reward workers."""
    getattr(run.engine, "release", lambda: None)()
    getattr(run.rewards, "close", lambda: None)()


def policy_of(run: Run) -> torch.nn.Module:
    return run.models.policy


def set_engine(run: Run, engine) -> None:
    """Swap the run's rollout engine (``None`` after releasing one)."""
    run.engine = engine


def set_micro_batch(run: Run, sequences: int) -> None:
    run.state.micro_batch_size = sequences


def packed_length(run: Run) -> int | None:
    """Row length of ``data.packing`` (None: packing off)."""
    return run.pack_len


def stages_of(run: Run, *, fused_head: bool | None = None, chunk: int | None = None) -> Stages:
    """The run's step stages (``build_stages``), the log-prob head's fused chunks on or off
    when ``fused_head`` is given (``trainer.fused_logprob_head`` for this run) and its
    chunk of ``chunk`` rows when given (``speed.logprob_chunk_size``)."""
    s = build_stages(run)
    changes = {"fused_head": fused_head, "chunk_size": chunk}
    changes = {k: v for k, v in changes.items() if v is not None}
    if changes:
        fwd = dataclasses.replace(s.updating.forward, **changes)
        s.updating = dataclasses.replace(s.updating, forward=fwd)
        s.preparing = dataclasses.replace(s.preparing, forward=fwd)
    return s


def train_step(run: Run, step: int) -> tuple[dict[str, float], RolloutBatch]:
    """One step of the training loop: (its metrics, its samples)."""
    result = _fit.train_step(stages_of(run), step)
    return _fit.metrics_of(run, result), result.scored.batch


# the stage calls of one step and the phase the loop's clock charges each to
STAGE_PHASES = {"sample": "rollout", "score": "reward", "old_and_ref": "logprobs",
                "values": "values", "advantages": "advantages", "update": "update"}  # fmt: skip


class _Hooked:
    """A step's stages whose phase calls go through ``hook(phase, call)`` (``call()`` runs
    the stage); every other attribute is the stages' own."""

    def __init__(self, stages: Stages, hook) -> None:
        self._stages, self._hook = stages, hook

    def __getattr__(self, name: str):
        attr = getattr(self._stages, name)
        phase = STAGE_PHASES.get(name)
        if phase is None:
            return attr
        return lambda *a, **k: self._hook(phase, lambda: attr(*a, **k))


def step_result(run: Run, step: int, hook=None) -> StepResult:
    """One step of the training loop (``train_step``): its typed result (samples, phase
    seconds and peaks, the prepared batch). ``hook(phase, call)``, when given, runs each
    phase's stage call (``call()``) inside the loop's own clock, e.g. under a profiler."""
    s = stages_of(run)
    return _fit.train_step(_Hooked(s, hook) if hook else s, step)


def first_rows(scored: Scored, n: int) -> Scored:
    """The first ``n`` samples of a scored rollout (whole groups when ``n`` is a multiple of
    samples_per_prompt: a prompt's samples are adjacent)."""
    idx = torch.arange(min(n, scored.batch.size))
    r = scored.rollout
    env = None if r.env_rewards is None else r.env_rewards[idx]
    rollout = dataclasses.replace(r, batch=r.batch.select(idx), completions=r.completions[:n],
                                  shown=r.shown[:n], env_rewards=env)  # fmt: skip
    return dataclasses.replace(
        scored, rollout=rollout, rewards=scored.rewards[idx], valid=scored.valid[idx],
        parts={k: v[idx] for k, v in scored.parts.items()},
    )  # fmt: skip


def prepare_and_update(run: Run, scored: Scored, step: int, *, chunk: int | None = None):
    """Steps 4-7 of ``train_step`` (log-probs, values, advantages, update) on an already
    scored rollout, timed by the loop's own clock: ``(seconds, peaks GiB, prepared)`` per
    phase."""
    s = stages_of(run, chunk=chunk)
    clock = _fit.PhaseClock()
    with clock("logprobs"):
        logp = s.old_and_ref(scored)
    with clock("values"):
        values = s.values(scored)
    with clock("advantages"):
        prepared = s.advantages(scored, logp, values)
    with clock("update"):
        s.update(prepared, step)
    return dict(clock.seconds), dict(clock.peaks), prepared


def logprob_passes(prepared: Prepared) -> int:
    """Forward passes of the log-probs phase: pi_old unless on-policy, pi_ref with a KL
    term."""
    o = prepared.old_and_ref
    return int(o.old is not ON_POLICY) + int(o.ref is not None)


def needs_critic(run: Run) -> bool:
    return run.algo.needs_critic


def micro_batch(run: Run) -> int:
    """The micro-batch the run is at (out-of-memory retries halve it)."""
    return run.state.micro_batch_size


def logprob_chunk(run: Run) -> int:
    """Rows per chunk of the run's log-prob head (``speed.logprob_chunk_size``, planned)."""
    return stages_of(run).updating.forward.chunk_size


def set_checkpointing(run: Run, on: bool) -> None:
    """Gradient checkpointing of the trained models on or off (non-reentrant)."""
    models = [run.models.policy, run.models.critic_model]
    for m in {id(m): m for m in models if m is not None}.values():
        if on:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            m.gradient_checkpointing_disable()


def train_batch(batch: RolloutBatch, advantages: torch.Tensor) -> TrainBatch:
    """An on-policy training batch (pi_old = the policy at the update's one optimiser step)
    of ``batch``'s sequences with the given (B, R) advantages."""
    b = batch
    return TrainBatch(
        prompt_ids=b.prompt_ids, prompt_mask=b.prompt_mask, response_ids=b.response_ids,
        response_mask=b.response_mask, loss_mask=b.loss_mask,
        valid=torch.ones(b.size, dtype=torch.bool), advantages=advantages,
        old_logprobs=ON_POLICY,
    )  # fmt: skip


def update_step(run: Run, batch: TrainBatch, *, fused_head: bool = True) -> None:
    """The update phase alone (log-probs, loss, backward, optimiser) on a ready batch."""
    s = stages_of(run, fused_head=fused_head)
    update(
        s.models, s.algo, s.opts, batch, s.updating, micro_size=run.state.micro_batch_size,
        kl_coef=float(run.kl_ctl.value), generator=run.update_generator,
    )  # fmt: skip


def compile_body(model: torch.nn.Module, dev: torch.device) -> None:
    """``trainer.compile: true`` on an already-built model."""
    compile_forward(model, True, dev)


def common_prefix_len(prompts: list[list[int]]) -> int:
    return _hf_prefix.common_prefix_len(prompts)


def danka_train_command(config: Path, overrides: list[str], eager_head: bool) -> list[str]:
    """``danka train CONFIG KEY=VALUE ...`` as a child command; ``eager_head`` runs it with
    the log-prob head's per-chunk work eager (``trainer.fused_logprob_head: false``)."""
    extra = ["trainer.fused_logprob_head=false"] if eager_head else []
    return [sys.executable, "-m", "danka", "train", str(config), *overrides, *extra]


def held_out_rows(cfg, base_dir: Path, run_dir: Path) -> list[PromptRow]:
    """The held-out rows ``danka train`` evaluates on for this config."""
    return load_rows(cfg, base_dir, run_dir)[1]


def reward_specs(cfg, rows: list[PromptRow]):
    """The reward functions ``danka train`` scores these rows with."""
    return _reward_specs(cfg, rows)
