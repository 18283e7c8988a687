"""The fast engine's static decode state (one per (batch bucket, KV capacity)) and its
sampling seed: what the captured CUDA graphs read and write."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from danka.rollout.fast.sampling import MAX_EOS

BUCKETS = (8, 16, 32, 64, 128, 256)


def bucket_size(rows: int, graphs: bool) -> int:
    """Batch rows actually run: exact without graphs, else the next bucket (multiples of 256
    above the largest), so one captured graph serves every batch up to its size."""
    if not graphs:
        return rows
    for b in BUCKETS:
        if rows <= b:
            return b
    return -(-rows // BUCKETS[-1]) * BUCKETS[-1]


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
            tok=z(b),
            pos=z(b),
            start=z(b),
            done=z(b, dtype=torch.bool),
            slot=z(1),
            gen=z(1),
            out_tok=z(b, t),
            out_lp=z(b, t, dtype=torch.float32),
            eos=z(MAX_EOS),
            pad=z(),
            temperature=z(dtype=torch.float32),
            top_p=z(dtype=torch.float32),
        )


def draw_seed(generator: torch.Generator | None) -> int:
    """A sampling seed from ``generator``, or from the global CPU RNG (which danka's
    checkpoints capture, so a resumed run samples the same tokens)."""
    if generator is None:
        return int(torch.randint(0, 2**62, (1,)))
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))


class LayerCache:
    """A KV cache kept as one ``(B, Hkv, T, D)`` tensor per layer, indexed like the engine's
    5-D ``(layers, B, Hkv, T, D)`` cache (``c[i]``, ``c[i, rows, :, :n] = x``, ``c[:, :b]``):
    per-layer tensors let a cache be re-laid-out one layer at a time, so moving to a new
    size holds the old and the new cache for one layer only (``FastEngine`` staged decode).
    """

    def __init__(self, layers: list[torch.Tensor]):
        self.layers = layers

    @classmethod
    def zeros(cls, n_layers: int, shape: tuple, dtype, device) -> LayerCache:
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)])

    @property
    def shape(self) -> tuple:
        return (len(self.layers), *self.layers[0].shape)

    def __getitem__(self, idx):
        if isinstance(idx, int):
            return self.layers[idx]
        first, rest = (idx[0], idx[1:]) if isinstance(idx, tuple) else (idx, ())
        if isinstance(first, int):
            return self.layers[first][rest]
        if first != slice(None):
            raise IndexError("LayerCache: layers are indexed by one int or ':'")
        return LayerCache([t[rest] for t in self.layers])

    def __setitem__(self, idx, value) -> None:
        if not (isinstance(idx, tuple) and isinstance(idx[0], int)):
            raise IndexError("LayerCache: assign into one layer, c[i, ...] = x")
        self.layers[idx[0]][idx[1:]] = value

    def moved(self, rows: torch.Tensor, length: int, shape: tuple) -> LayerCache:
        """A new cache of per-layer ``shape`` holding slots ``[0, length)`` of rows ``rows``
        (in that order) at rows ``[0, len(rows))``; each old layer is dropped as soon as it is
        copied (the old and the new cache coexist for one layer only)."""
        out = []
        for i, old in enumerate(self.layers):
            new = torch.zeros(shape, dtype=old.dtype, device=old.device)
            new[: len(rows), :, :length] = old[rows, :, :length]
            out.append(new)
            self.layers[i] = None  # type: ignore[call-overload]
        self.layers = []
        return LayerCache(out)
