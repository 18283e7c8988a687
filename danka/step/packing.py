"""Sequence packing for the update: several sequences share one row, without padding.

Each sequence is laid out as its real prompt tokens followed by its real response tokens,
with position ids restarting at 0; transformers reads the restarts from ``position_ids``
(with ``attention_mask=None`` and no cache) and builds a block-diagonal causal mask, so a
token attends only to its own sequence. Rows are filled first-fit decreasing up to
``max_len`` tokens; the tail of a row that is not full is one more (ignored) sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from danka.types import RolloutBatch


@dataclass
class Packed:
    input_ids: torch.Tensor  # (rows, L) long
    position_ids: torch.Tensor  # (rows, L) long, restarting at 0 for each sequence
    row: torch.Tensor  # (b, R) long: row of the hidden state that predicts response token j
    col: torch.Tensor  # (b, R) long: its column (entries past a response's end point at 0)
    real_tokens: int  # prompt + response tokens of the micro-batch

    @property
    def computed_tokens(self) -> int:
        return int(self.input_ids.numel())


def assign_rows(lengths: list[int], max_len: int) -> list[list[int]]:
    """First-fit decreasing: sequence indices per row, each row <= max_len tokens (a longer
    sequence gets a row of its own)."""
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for r, used in enumerate(fill):
            if used + lengths[i] <= max_len:
                rows[r].append(i)
                fill[r] += lengths[i]
                break
        else:
            rows.append([i])
            fill.append(lengths[i])
    return rows


def pack(mb: RolloutBatch, max_len: int, pad_id: int) -> Packed:
    """Pack the sequences of a (trimmed) micro-batch into rows of at most ``max_len``."""
    p_len = mb.prompt_mask.sum(1).long().tolist()
    r_len = mb.response_mask.sum(1).long().tolist()
    seqs = [
        torch.cat([mb.prompt_ids[i][mb.prompt_mask[i].bool()], mb.response_ids[i, : r_len[i]]])
        for i in range(mb.size)
    ]
    rows = assign_rows([len(s) for s in seqs], max_len)
    width = max(sum(len(seqs[i]) for i in members) for members in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    b, r = mb.response_ids.shape
    row_of = torch.zeros((b, r), dtype=torch.long)
    col_of = torch.zeros((b, r), dtype=torch.long)
    for k, members in enumerate(rows):
        off = 0
        for i in members:
            n = len(seqs[i])
            ids[k, off : off + n] = seqs[i]
            pos[k, off : off + n] = torch.arange(n)
            q = r_len[i]
            # response token j sits at column off + p + j and is predicted one column earlier
            row_of[i, :q] = k
            col_of[i, :q] = off + p_len[i] - 1 + torch.arange(q)
            off += n
        pos[k, off:] = torch.arange(width - off)  # the unused tail: one more, ignored, sequence
    return Packed(ids, pos, row_of, col_of, real_tokens=sum(p_len) + sum(r_len))
