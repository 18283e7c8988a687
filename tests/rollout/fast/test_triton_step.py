"""danka/rollout/fast/triton_step.py (the fused decode-step kernels) against the unfused ops, on a
GPU or under Triton's CPU interpreter; and the engine's fused decode layer against the
unfused one.

Skipped where triton is not importable (CI). Run with triton on the path:
``PYTHONPATH=/tmp/triton_site:. TRITON_INTERPRET=1 python -m pytest -q THIS_FILE``.
"""

import pytest
import torch

from .triton_setup import triton_device

DEVICE = triton_device()  # before danka's kernels import triton

import danka.rollout.fast.triton_decode  # noqa: E402,F401  (registers the attention op)
from danka.rollout.base import SamplingParams  # noqa: E402
from danka.rollout.fast import triton_step  # noqa: E402
from danka.rollout.fast.engine import FastEngine  # noqa: E402
from danka.rollout.fast.model import _rope  # noqa: E402
from danka.rollout.fast.options import FastExperiments, FastOptions  # noqa: E402

from .test_fast_engine import fast_run, tiny  # noqa: E402


def _rand(*shape, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


def _rope_tables(t, d):
    """cos and the signed sin (first half negated), as fast.model.rope_tables builds them."""
    inv = 1.0 / (500.0 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([torch.arange(t).float()[:, None] * inv] * 2, dim=-1)
    sin = emb.sin()
    sin[:, : d // 2] = -sin[:, : d // 2]
    return emb.cos().to(DEVICE), sin.to(DEVICE)


@pytest.mark.parametrize("heads, kv_heads, d", [(4, 2, 16), (9, 3, 64), (14, 2, 32)])
def test_rope_write_equals_rope_then_index_copy(heads, kv_heads, d):
    """Every query head rotated as fast.model._rope rotates it, and exactly the new key
    (rotated) and value written at ``slot``, nothing else in the cache touched. fp32, so
    the one-rounding kernel and the per-op reference agree to fp32 rounding."""
    b, t, slot = 5, 24, 11
    qkv = _rand(b, (heads + 2 * kv_heads) * d, seed=1)
    cos_t, sin_t = _rope_tables(t, d)
    pos = torch.tensor([3, 0, 11, 7, 20], device=DEVICE)
    k = _rand(b, kv_heads, t, d, seed=2)
    v = _rand(b, kv_heads, t, d, seed=3)
    k0, v0 = k.clone(), v.clone()
    slot_t = torch.tensor([slot], device=DEVICE)
    q = triton_step.rope_write(qkv, cos_t, sin_t, pos, slot_t, k, v, heads)

    nqk = heads + kv_heads
    qk = _rope(qkv[:, : nqk * d].view(b, nqk, d), cos_t[pos][:, None], sin_t[pos][:, None])
    want_q = qk[:, :heads].reshape(b, kv_heads, heads // kv_heads, d)
    torch.testing.assert_close(q, want_q, atol=1e-5, rtol=1e-5)
    k0[:, :, slot] = qk[:, heads:]
    v0[:, :, slot] = qkv[:, nqk * d :].view(b, kv_heads, d)
    torch.testing.assert_close(k, k0, atol=1e-5, rtol=1e-5)
    assert torch.equal(v, v0)  # the value is copied, not computed


def test_rope_write_reads_strided_rows():
    """qkv as a column slice of a wider output (the folded-adapter layout): row stride >
    width; the kernel follows the stride."""
    heads, kv_heads, d, b = 4, 2, 16, 3
    wide = _rand(b, (heads + 2 * kv_heads) * d + 24, seed=4)
    qkv = wide[:, : (heads + 2 * kv_heads) * d]
    cos_t, sin_t = _rope_tables(8, d)
    pos = torch.tensor([1, 2, 3], device=DEVICE)
    slot_t = torch.tensor([4], device=DEVICE)
    args = (cos_t, sin_t, pos, slot_t)
    k1, v1 = _rand(b, kv_heads, 8, d, seed=5), _rand(b, kv_heads, 8, d, seed=6)
    k2, v2 = k1.clone(), v1.clone()
    got = triton_step.rope_write(qkv, *args, k1, v1, heads)
    want = triton_step.rope_write(qkv.contiguous(), *args, k2, v2, heads)
    assert torch.equal(got, want) and torch.equal(k1, k2) and torch.equal(v1, v2)


def test_silu_mul_equals_silu_times_up():
    gu = _rand(6, 2 * 40, seed=7)
    got = triton_step.silu_mul(gu)
    g, u = gu.chunk(2, dim=-1)
    torch.testing.assert_close(got, torch.nn.functional.silu(g) * u, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("m, n, r", [(8, 96, 8), (64, 200, 48), (5, 70, 3), (16, 64, 80)])
def test_lora_expand_equals_the_fp32_product(m, n, r):
    """x += u @ B.T for any sizes (masked edges; r = 80 runs two rank blocks of 64), fp32
    u/B in IEEE fp32; and the residual form x += y + u @ B.T with bf16 x, y, u, B: one
    rounding of the fp32 sum (at most one bf16 step from the reference's)."""
    u, b, x = _rand(m, r, seed=8), _rand(n, r, seed=9), _rand(m, n, seed=10)
    want = x + u @ b.T
    triton_step.lora_expand(x, u, b)
    torch.testing.assert_close(x, want, atol=1e-4, rtol=1e-5)

    bf = torch.bfloat16
    xb, yb = _rand(m, n, seed=11, dtype=bf), _rand(m, n, seed=12, dtype=bf)
    ub, bb = _rand(m, r, seed=13, dtype=bf), _rand(n, r, seed=14, dtype=bf)
    ref = (xb.float() + yb.float() + ub.float() @ bb.float().T).to(bf)
    triton_step.lora_expand(xb, ub, bb, y=yb)
    assert ((xb.float() - ref.float()).abs() <= ref.float().abs() * 2**-7 + 1e-2).all()


def test_lora_expand_reads_strided_u_and_y():
    """u and y as column slices of one wider GEMM output (A folded into W: [y | u])."""
    m, n, r = 4, 32, 8
    z = _rand(m, n + r, seed=15)
    b, x = _rand(n, r, seed=16), _rand(m, n, seed=17)
    want = x + z[:, :n] + z[:, n:] @ b.T
    triton_step.lora_expand(x, z[:, n:], b, y=z[:, :n])
    torch.testing.assert_close(x, want, atol=1e-4, rtol=1e-5)


def test_lora_expand_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="shapes"):
        triton_step.lora_expand(_rand(4, 6), _rand(4, 3), _rand(5, 3))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fused_decode_layer_equals_the_unfused_one(kind):
    """The engine with the fused step (Triton attention, triton_step's kernels, residual
    adds inside the GEMMs) samples the same greedy tokens as the unfused step, log-probs to
    fp32 rounding (tiny fp32 models; Qwen2 has q/k/v biases and tied embeddings)."""
    model = tiny(kind).to(DEVICE)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=12)
    plain = FastEngine(
        FastOptions(attention="triton"), FastExperiments(use_cuda_graph=False, fused_step=False)
    )
    ref = fast_run(model, params, plain, eos=())
    fused = FastEngine(FastOptions(attention="triton"), FastExperiments(use_cuda_graph=False))
    got = fast_run(model, params, fused, eos=())
    assert fused._path.fused_step and not plain._path.fused_step
    assert got.response_ids.tolist() == ref.response_ids.tolist()
    torch.testing.assert_close(got.rollout_logprobs, ref.rollout_logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "options",
    [
        {},  # co-located: A folded into rows reserved after W (no copy)
        {"colocate_weights": False},  # A folded into an engine copy of W
        {"colocate_weights": False, "fuse_weights": False},  # A unfolded: a second GEMM
    ],
)
def test_fused_decode_layer_with_a_live_adapter_equals_the_unfused_one(options):
    """A live fp32 LoRA adapter on every projection: the fused step's one-kernel adapter
    path (lora_expand after the shrink) gives the unfused path's tokens and log-probs, in
    each of the engine's low-rank modes."""
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(tiny("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    model = model.to(DEVICE).eval()
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=12)
    ref = fast_run(model, params, FastEngine(FastOptions(attention="triton"), FastExperiments(use_cuda_graph=False, fused_step=False)), eos=())  # fmt: skip
    engine = FastEngine(
        FastOptions(attention="triton"), FastExperiments(use_cuda_graph=False, **options)
    )
    got = fast_run(model, params, engine, eos=())
    assert got.response_ids.tolist() == ref.response_ids.tolist()
    torch.testing.assert_close(got.rollout_logprobs, ref.rollout_logprobs, atol=1e-4, rtol=0)
