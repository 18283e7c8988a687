"""The fast engine's static decode state (one per (batch bucket, KV capacity)) and its
sampling seed: what the captured CUDA graphs read and write."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from danka.rollout.fast_sampling import MAX_EOS


@dataclass
class Slots:
    """Static decode state for one (b, T); captured graphs read and write exactly these."""

    tok: torch.Tensor  # (b,) long, token fed at the next step
    pos: torch.Tensor  # (b,) long, its RoPE position
    start: torch.Tensor  # (b,) long, first real cache slot of each row (left padding)
    done: torch.Tensor  # (b,) bool, emitted an EOS (or is a padding row)
    slot: torch.Tensor  # (1,) long, cache slot written at the next step
    gen: torch.Tensor  # (1,) long, output column written at the next step
    out_tok: torch.Tensor  # (b, T) long, sampled tokens (pad after EOS)
    out_lp: torch.Tensor  # (b, T) float, their log-probs (0 after EOS)
    eos: torch.Tensor  # (MAX_EOS,) long, EOS ids padded with -1
    pad: torch.Tensor  # () long
    temperature: torch.Tensor  # () float
    top_p: torch.Tensor  # () float
    graphs: dict = field(default_factory=dict)  # ((greedy, top_k, top_p on), live) -> graph

    @classmethod
    def new(cls, b: int, t: int, device: torch.device) -> Slots:
        def z(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            tok=z(b), pos=z(b), start=z(b), done=z(b, dtype=torch.bool), slot=z(1), gen=z(1),
            out_tok=z(b, t), out_lp=z(b, t, dtype=torch.float32), eos=z(MAX_EOS), pad=z(),
            temperature=z(dtype=torch.float32), top_p=z(dtype=torch.float32),
        )  # fmt: skip


def draw_seed(generator: torch.Generator | None) -> int:
    """A sampling seed from ``generator``, or from the global CPU RNG (which danka's
    checkpoints capture, so a resumed run samples the same tokens)."""
    if generator is None:
        return int(torch.randint(0, 2**62, (1,)))
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
