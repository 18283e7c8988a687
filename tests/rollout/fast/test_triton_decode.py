"""danka/rollout/fast/triton_decode.py (on a GPU, or under Triton's CPU interpreter) vs the fp32
reference.

Skipped where triton is not importable (CI). Run with triton on the path:
``PYTHONPATH=/tmp/triton_site:. TRITON_INTERPRET=1 python -m pytest -q THIS_FILE``.
"""

import pytest
import torch

from .triton_setup import triton_device

DEVICE = triton_device()  # before danka's kernel imports triton

import danka.rollout.fast.triton_decode as tda  # noqa: E402
from bench.speed.decode_attention import matmul_softmax  # noqa: E402


def _case(b, kvh, g, d, cap, live, start, slot, seed=0):
    """bf16 q/k/v on DEVICE with a (b, kvh, cap, D) cache sliced to ``live`` slots (a
    strided view, as the engine passes); slots after ``slot`` hold garbage (1e4) that must
    be ignored. Returns q, k, v, start, slot and the fp32 reference on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, kvh, g, d, generator=gen).to(torch.bfloat16)
    k = torch.randn(b, kvh, cap, d, generator=gen)
    v = torch.randn(b, kvh, cap, d, generator=gen)
    k[:, :, slot + 1 :] = 1e4
    v[:, :, slot + 1 :] = 1e4
    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    start_t = torch.tensor(start, dtype=torch.int64)
    slots = torch.arange(live)
    valid = (slots[None] >= start_t[:, None]) & (slots[None] <= slot)
    mask = torch.where(valid, 0.0, float("-inf"))[:, None, None, :]  # (b, 1, 1, live)
    kl, vl = k[:, :, :live], v[:, :, :live]
    ref = matmul_softmax(q.float(), kl.float(), vl.float(), mask)
    kd, vd = k.to(DEVICE)[:, :, :live], v.to(DEVICE)[:, :, :live]
    slot_t = torch.tensor([slot], dtype=torch.int64, device=DEVICE)
    return q.to(DEVICE), kd, vd, start_t.to(DEVICE), slot_t, ref


@pytest.mark.parametrize(
    "g, d, live, start, slot, splits",
    [
        # SmolLM2's group (9 q / 3 kv heads); one block; row 1 starts at slot 0
        (3, 64, 64, [5, 0], 40, None),
        # Qwen2.5-0.5B's group (14 / 2); 3 blocks in 3 splits; row 1's padding covers
        # all of split 0 (an empty split), row 2 sees only slots 100..150
        (7, 32, 192, [0, 70, 100], 150, 3),
        # 3 blocks, 2 splits of 128 slots (the second half-used); slot < L - 1
        (3, 32, 192, [0, 17], 180, 2),
        # default split plan (interpreter assumes 132 SMs: 3 splits of 64 here)
        (7, 32, 192, [3, 64], 191, None),
    ],
)
def test_matches_fp32_reference(g, d, live, start, slot, splits):
    b, kvh, cap = len(start), 2, live + 64
    q, k, v, start_t, slot_t, ref = _case(b, kvh, g, d, cap, live, start, slot)
    assert not k.is_contiguous()  # a slice of the bigger cache, strides passed through
    got = tda.decode_attention(q, k, v, start_t, slot_t, splits=splits)
    assert got.shape == (b, kvh, g, d) and got.dtype == torch.bfloat16
    assert torch.isfinite(got.float()).all()  # the 1e4 garbage after `slot` never reached a row
    assert (got.float().cpu() - ref).abs().max() < 2e-2


def test_single_valid_slot_copies_v():
    # start = slot = 10: softmax over one slot is 1, so the output is v[:, :, 10] exactly
    # for every query head (bf16 -> fp32 -> bf16 round-trips exactly)
    q, k, v, start_t, slot_t, _ = _case(2, 1, 3, 32, 128, 64, [10, 10], 10)
    got = tda.decode_attention(q, k, v, start_t, slot_t)
    assert torch.equal(got, v[:, :, 10:11].expand(2, 1, 3, 32))


def test_split_plan_fills_the_gpu():
    # up to 16 programs per SM (132 SMs: 2112), never below one 64-slot block per split.
    # b=64, Hkv=3: 192 programs x 11 splits would reach 2112; L=256 has 4 blocks -> 4 x 64
    assert tda.split_plan(64, 3, 256, 132) == (4, 64)
    # the engine's one graph over a 416-slot capacity: 7 blocks, 7 splits of one block
    assert tda.split_plan(64, 3, 416, 132) == (7, 64)
    # b=256, Hkv=3: 768 programs x 3 splits >= 2112; 6 blocks -> chunks of 2 blocks -> 3
    assert tda.split_plan(256, 3, 384, 132) == (3, 128)
    # b=256, Hkv=8: 2048 programs, cdiv(2112, 2048) = 2 splits of 3 blocks
    assert tda.split_plan(256, 8, 384, 132) == (2, 192)
    # never below one block per split
    assert tda.split_plan(1, 1, 128, 132) == (2, 64)


def test_custom_op_equals_the_function_and_fp32_inputs_are_exact():
    # torch.ops.danka.decode_attention (what the engine calls) is the same computation;
    # with fp32 inputs both products are IEEE fp32 (no TF32): error ~1e-6, not ~1e-3
    q, k, v, start_t, slot_t, ref = _case(2, 2, 7, 32, 256, 192, [0, 70], 150)
    via_op = torch.ops.danka.decode_attention(q, k, v, start_t, slot_t)
    assert torch.equal(via_op, tda.decode_attention(q, k, v, start_t, slot_t))
    got = tda.decode_attention(q.float(), k.float(), v.float(), start_t, slot_t)
    assert got.dtype == torch.float32
    assert (got.cpu() - ref).abs().max() < 1e-5
