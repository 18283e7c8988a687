"""Every place a benchmark reaches into danka's trainer internals, in one file.

The training benchmarks run danka's own step (``train_step``, ``update``) on random-weight
models that have no files to load, so they cannot go through ``danka train``; they build a
trainer ``Run`` around the model instead, and flip two module switches for A/B runs (the
fused log-prob head, the shared-prefix paths). Nothing else in ``bench/`` imports
``danka.trainer``: when the trainer's builders change, this file is the one to change.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

import danka.models.logprobs as _logprobs
from danka.algorithms.kl import FixedKLController
from danka.lifecycle import compile_forward
from danka.rewards.combine import RewardOutput
from danka.rollout import hf_prefix as _hf_prefix
from danka.trainer import fit as _fit
from danka.trainer import shared_prefix as _shared_prefix
from danka.trainer.forward import effective_token_ratio, policy_logprobs, trim
from danka.trainer.models import build_models
from danka.trainer.optim import build_optimizer, build_scheduler
from danka.trainer.run import PromptSet, Run, RunState
from danka.trainer.sampler import PromptSampler
from danka.trainer.setup import build_algorithm, build_model_set, build_run, load_rows
from danka.trainer.setup import reward_specs as _reward_specs
from danka.trainer.update import update
from danka.types import PromptRow, RolloutBatch

__all__ = ["effective_token_ratio", "policy_logprobs", "trim"]


class _NoText:
    """Tokenizer stand-in for random-weight runs: completions decode to empty strings."""

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
    cfg, models, dev, dtype, log, *, prompts=None, engine=None, eos=(), pad=0
) -> Run:
    """A ``Run`` without tokenizer, data files or reward functions: the pieces
    ``build_run`` would load are stand-ins, so random-weight models go through the
    trainer's own ``train_step``/``update``. ``prompts``: token-id lists to sample from."""
    t = cfg.trainer
    sched = dict(kind="constant", warmup_steps=0, total_steps=10_000)
    actor_opt = build_optimizer(models.actor_params, lr=t.lr, weight_decay=t.weight_decay)
    critic_opt = critic_sched = None
    if models.critic_params:
        critic_opt = build_optimizer(models.critic_params, lr=t.critic_lr, weight_decay=0.0)
        critic_sched = build_scheduler(critic_opt, **sched)
    prompts = prompts or []
    rows = [PromptRow(index=i, prompt="") for i in range(len(prompts))]
    sampler = PromptSampler(len(prompts), t.batch_size, seed=0, shuffle=False) if prompts else None
    return Run(
        cfg=cfg, base_dir=Path.cwd(), output_dir=Path(tempfile.gettempdir()), device=dev,
        dtype=dtype, tokenizer=_NoText(), models=models, engine=engine, rewards=random_rewards,
        train=PromptSet(rows=rows, texts=[""] * len(rows), ids=prompts), eval=None,
        actor_opt=actor_opt, actor_sched=build_scheduler(actor_opt, **sched),
        critic_opt=critic_opt, critic_sched=critic_sched, kl_ctl=FixedKLController(t.kl.coef),
        sampler=sampler, log=log, algo=build_algorithm(cfg),
        state=RunState(total_steps=10_000, micro_batch_size=t.micro_batch_size),
        update_generator=torch.Generator().manual_seed(0), eos_ids=list(eos), pad_id=pad,
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


def train_step(run: Run, step: int) -> tuple[dict[str, float], RolloutBatch]:
    """One step of the training loop: (its metrics, its batch)."""
    metrics, batch, _ = _fit.train_step(run, step)
    return metrics, batch


def update_step(run: Run, batch: RolloutBatch) -> None:
    """The update phase alone (log-probs, loss, backward, optimiser) on a ready batch."""
    update(run, batch, run.update_generator)


def compile_body(model: torch.nn.Module, dev: torch.device) -> None:
    """``trainer.compile: true`` on an already-built model."""
    compile_forward(model, True, dev)


def set_fused_head(on: bool) -> None:
    """The log-prob head's per-chunk work compiled on CUDA (on) or eager (off), for A/B."""
    _logprobs.FUSED = on


def fused_head() -> bool:
    return _logprobs.FUSED


def shared_prefix_off() -> None:
    """Switch both shared-prefix paths off in this process: plain ``generate`` and the
    plain training forward (the "off" side of the shared-prefix A/B)."""
    mock.patch.object(_hf_prefix, "usable", lambda m: False).start()
    mock.patch.object(_shared_prefix, "ENABLED", False).start()


def common_prefix_len(prompts: list[list[int]]) -> int:
    return _hf_prefix.common_prefix_len(prompts)


def danka_train_command(config: Path, overrides: list[str], eager_head: bool) -> list[str]:
    """``danka train CONFIG KEY=VALUE ...`` as a child command; ``eager_head`` runs the
    same CLI with the log-prob head's per-chunk work eager."""
    if not eager_head:
        return [sys.executable, "-m", "danka", "train", str(config), *overrides]
    boot = "import sys, danka.models.logprobs as m; m.FUSED = False; "
    boot += "from danka.cli import main; sys.exit(main())"
    return [sys.executable, "-c", boot, "train", str(config), *overrides]


def held_out_rows(cfg, base_dir: Path, run_dir: Path) -> list[PromptRow]:
    """The held-out rows ``danka train`` evaluates on for this config."""
    return load_rows(cfg, base_dir, run_dir)[1]


def reward_specs(cfg, rows: list[PromptRow]):
    """The reward functions ``danka train`` scores these rows with."""
    return _reward_specs(cfg, rows)
