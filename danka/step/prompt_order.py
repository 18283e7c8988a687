"""The order prompts are visited in: a seeded permutation per epoch, resumable exactly."""

from __future__ import annotations

import torch

from danka.errors import UserError


class PromptSampler:
    """Yields batches of prompt indices; ``state_dict`` pins the order and the position.

    Epoch ``e`` visits ``randperm(n, generator=seed + e)`` (or ``arange`` without shuffle),
    so the order depends only on (seed, epoch) and a resumed run continues it exactly.
    A batch never straddles two epochs: the tail of an epoch that is smaller than the
    batch is dropped (drop_last), as in verl.
    """

    def __init__(self, num_prompts: int, batch_size: int, *, seed: int, shuffle: bool = True):
        if num_prompts < batch_size:
            raise ValueError(f"{num_prompts} prompts are fewer than batch_size {batch_size}")
        self.n, self.batch_size, self.seed, self.shuffle = num_prompts, batch_size, seed, shuffle
        self.epoch, self.position = 0, 0

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.batch_size

    def _order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n)
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.n, generator=gen)

    def next_batch(self) -> list[int]:
        if self.position + self.batch_size > self.n:
            self.epoch, self.position = self.epoch + 1, 0
        order = self._order(self.epoch)
        idx = order[self.position : self.position + self.batch_size].tolist()
        self.position += self.batch_size
        return idx

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n:
            raise UserError(
                f"the checkpoint was trained on {state['n']} prompts, this run has {self.n}",
                where="data.train_dataset",
                fix="resume with the checkpoint's training data (same file, data.limit and "
                "data.eval_size), or start a new output_dir",
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
