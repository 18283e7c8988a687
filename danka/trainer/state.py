"""What may change while a run goes (the validated config never does)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunState:
    total_steps: int  # lowered when trainer.max_train_minutes ends the run early
    micro_batch_size: int  # halved on out-of-memory with speed.auto_micro_batch
    logprob_chunk_size: int = 1024  # speed.logprob_chunk_size, or what the plan chose for auto
