"""Decode attention kernels at the fast engine's shapes (CUDA), one JSON.

    python -m bench decode-attention --name decode_attention_h200

Why: one layer's K and V at the SmolLM2 shape (64 rows x 3 heads x 384 slots x 64 x 2 bytes
x 2) are 12 MB, ~4 us of HBM traffic, yet memory-efficient attention took ~36 us a layer
call in a profiled rollout. This measures the candidates for the engine's decode step,
each as 30 (layers) calls captured in one CUDA graph and replayed (so launch gaps count as
in the engine):

- ``sdpa_efficient``: what the engine runs (GQA group as query rows, additive mask over
  the whole cache capacity T);
- ``sdpa_efficient_live``: the same over the live slots only (a length bucket L < T);
- ``matmul_softmax`` / ``_live``: two batched GEMMs and a fused fp32 softmax;
- ``sdpa_cudnn`` / ``_live``: cuDNN attention with the mask (if this build has it);
- ``sdpa_flash_nomask``: flash attention over L slots WITHOUT a mask: a lower bound (it
  would attend to left padding), not a candidate;
- ``triton_splitk_live``: ``danka/rollout/fast/triton_decode.py`` (split-K FlashDecoding, GQA
  group in one tile) over the live slots, bounds from ``start``/``slot`` on the device
  instead of a mask (skipped with the reason where triton is missing).

Every variant's output is compared with the fp32 reference (max abs difference).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.lib.common import add_output_args, parser, write_result

SHAPES = {  # name: (query heads, kv heads, head dim, layers)
    "smollm2-135m": (9, 3, 64, 30),
    "qwen2.5-0.5b": (14, 2, 64, 24),
}


def matmul_softmax(q, k, v, mask):
    """q (b, kv, G, D), k/v (b, kv, L, D), mask (b, 1, 1, L) additive -> (b, kv, G, D)."""
    s = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5) + mask
    return torch.matmul(torch.softmax(s, dim=-1).to(q.dtype), v)


def variants(q, k, v, mask, live, start=None, slot=None):
    """name -> zero-argument callable computing one layer's attention (``start`` (b,) /
    ``slot`` (1,): the valid slot range ``mask`` encodes, for the Triton kernel)."""
    kl, vl, ml = k[:, :, :live], v[:, :, :live], mask[..., :live]
    b, kvh, g, d = q.shape

    def sdpa(backends, kk, vv, mm):
        def f():
            with sdpa_kernel(backends):
                return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mm)

        return f

    def flash_nomask():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            qh = q.reshape(b, kvh * g, 1, d)
            return F.scaled_dot_product_attention(qh, kl, vl, enable_gqa=True).view(b, kvh, g, d)

    def triton_live():
        import danka.rollout.fast.triton_decode as tda  # needs triton (CUDA builds ship it)

        return tda.decode_attention(q, kl, vl, start, slot)

    return {
        "sdpa_efficient": sdpa([SDPBackend.EFFICIENT_ATTENTION], k, v, mask),
        "sdpa_efficient_live": sdpa([SDPBackend.EFFICIENT_ATTENTION], kl, vl, ml),
        "matmul_softmax": lambda: matmul_softmax(q, k, v, mask),
        "matmul_softmax_live": lambda: matmul_softmax(q, kl, vl, ml),
        "sdpa_cudnn": sdpa([SDPBackend.CUDNN_ATTENTION], k, v, mask),
        "sdpa_cudnn_live": sdpa([SDPBackend.CUDNN_ATTENTION], kl, vl, ml),
        "sdpa_flash_nomask": flash_nomask,
        "triton_splitk_live": triton_live,
    }


def time_graph(fn, layers: int, reps: int) -> float:
    """Microseconds per call of ``fn``: ``layers`` calls captured in one graph, replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (reps * layers) * 1e6


def measure(shape: str, rows: int, capacity: int, live: int, reps: int) -> dict:
    heads, kvh, d, layers = SHAPES[shape]
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(rows, kvh, heads // kvh, d, device=dev, dtype=dt, generator=gen)
    k = torch.randn(rows, kvh, capacity, d, device=dev, dtype=dt, generator=gen)
    v = torch.randn(rows, kvh, capacity, d, device=dev, dtype=dt, generator=gen)
    start = torch.randint(0, 40, (rows,), device=dev, generator=gen)  # left padding
    slots = torch.arange(capacity, device=dev)
    valid = (slots[None] >= start[:, None]) & (slots[None] < live)
    mask = torch.where(valid, 0.0, float("-inf")).to(dt)[:, None, None, :]
    ref = matmul_softmax(q.float(), k.float(), v.float(), mask.float())
    out = {"shape": shape, "rows": rows, "capacity": capacity, "live": live, "layers": layers}
    slot = torch.tensor([live - 1], device=dev)
    for name, fn in variants(q, k, v, mask, live, start, slot).items():
        try:
            got = fn()
            diff = None if "nomask" in name else float((got.float() - ref).abs().max())
            out[name] = {"us_per_layer": round(time_graph(fn, layers, reps), 2), "max_diff": diff}
        except Exception as e:  # noqa: BLE001 - a backend this build/shape lacks: record why
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser("decode-attention", __doc__)
    p.add_argument("--reps", type=int, default=50)
    add_output_args(p)
    args = p.parse_args(argv)
    cases = [
        ("smollm2-135m", 64, 384, 256),
        ("smollm2-135m", 64, 384, 128),
        ("smollm2-135m", 256, 384, 256),
        ("qwen2.5-0.5b", 64, 384, 256),
    ]
    results = [measure(*c, reps=args.reps) for c in cases]
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    doc = {"date": time.strftime("%Y-%m-%d"), "env": env, "results": results}
    write_result(doc, args.out_dir, args.name or "decode_attention")
    for r in results:
        cells = {k: v.get("us_per_layer", "err") for k, v in r.items() if isinstance(v, dict)}
        print(r["shape"], r["rows"], r["capacity"], r["live"], cells, flush=True)
    return 0
