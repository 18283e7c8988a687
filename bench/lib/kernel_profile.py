"""Where a step's time goes: the top kernels of a few calls under ``torch.profiler``.

``top_kernels(fn, device)`` runs ``fn`` ``steps`` times under the profiler (CPU + CUDA
activities; call it after a warm-up so allocation, cuBLAS heuristics and CUDA-graph capture
are not in the trace) and returns a JSON-ready dict:

* ``kernels``: the ``top`` CUDA kernels by total device time, each with ``name`` (cut at
  160 characters), ``calls`` (per step), ``total_ms`` (per step) and ``pct_of_step``
  (share of the step's wall time: ``step_s`` when given, i.e. an unprofiled timing, else
  the profiled wall time per step) and ``pct_of_kernels`` (share of all kernel time);
* ``classes``: the same time summed by kernel class (gemm, attention, norm/softmax/reduce,
  copy/cast/fill, elementwise/other), ``kernel_ms_per_step`` (all kernels) and
  ``gpu_busy_frac`` = kernel time / step time: below 1 the GPU waits on the host (launches,
  syncs) for the rest;
* ``host_ops`` (CUDA, with the CPU activity recorded): the operators and CUDA runtime calls
  that took the host's time, by self CPU time.

Kernels replayed from a CUDA graph are reported by CUPTI like launched ones. On a device
without CUDA (``--tiny --device cpu`` checks) the CPU operators by self time stand in, with
``kind: "cpu_ops"``; only the code path is checked there.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

CLASSES = (  # first match wins; names of cuBLAS / CUTLASS / FlashAttention / ATen kernels
    # attention first: PyTorch's memory-efficient kernel is a CUTLASS one ("fmha_cutlassF");
    # inductor's fused pointwise kernels ("triton_poi_fused_..._attention_...") are not
    ("attention", re.compile(r"^(?!triton_).*(flash|fmha|attention|sdpa)", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|wgmma|matmul", re.I)),
    ("norm/softmax/reduce", re.compile(r"norm|softmax|reduce|logsumexp", re.I)),
    ("copy/cast/fill", re.compile(r"copy|cast|memcpy|memset|fill|cat|index", re.I)),
)


def kernel_class(name: str) -> str:
    """The class a kernel's name belongs to (``CLASSES``), else ``elementwise/other``."""
    for cls, pattern in CLASSES:
        if pattern.search(name):
            return cls
    return "elementwise/other"


def summarize(
    times: dict[str, tuple[int, float]], steps: int, step_ms: float, top: int
) -> dict[str, object]:
    """``times`` = {name: (calls, total microseconds)} over ``steps`` steps -> the report
    (per-step values; ``step_ms`` is one step's wall time)."""
    rows = sorted(times.items(), key=lambda kv: -kv[1][1])
    total_ms = sum(us for _, us in times.values()) / 1e3 / steps
    classes: dict[str, float] = defaultdict(float)
    for name, (_, us) in rows:
        classes[kernel_class(name)] += us / 1e3 / steps
    return {
        "steps": steps,
        "step_ms": step_ms,
        "kernel_ms_per_step": total_ms,
        "gpu_busy_frac": total_ms / step_ms if step_ms > 0 else None,
        "kernels": [
            {
                "name": name[:160],
                "calls": calls / steps,
                "total_ms": us / 1e3 / steps,
                "pct_of_step": 100 * us / 1e3 / steps / step_ms if step_ms > 0 else None,
                "pct_of_kernels": 100 * us / 1e3 / steps / total_ms if total_ms > 0 else None,
            }
            for name, (calls, us) in rows[:top]
        ],
        "classes": {k: v for k, v in sorted(classes.items(), key=lambda kv: -kv[1])},
    }


def top_kernels(
    fn: Callable[[], object], device: torch.device | str, *, steps: int = 3, **options: Any
) -> dict[str, object]:
    """Profile ``steps`` calls of ``fn`` (already warmed up) on ``device``; see the module
    docstring for the fields. ``options`` (``top``, ``step_s``) are :func:`profile_call`'s."""

    def run() -> None:
        for _ in range(steps):
            fn()

    return profile_call(run, device, steps=steps, **options)[1]


def profile_call(
    fn: Callable[[], object],
    device: torch.device | str,
    *,
    steps: int = 1,
    top: int = 15,
    step_s: float | None = None,
    cpu_ops: bool = True,
) -> tuple[object, dict[str, object]]:
    """``(fn(), report)``: one call of ``fn`` (which runs ``steps`` steps) under the
    profiler, and the report of :func:`top_kernels` (see :func:`profiling`)."""
    with profiling(device, steps=steps, top=top, step_s=step_s, cpu_ops=cpu_ops) as report:
        result = fn()
    return result, report


@contextlib.contextmanager
def profiling(
    device: torch.device | str,
    *,
    steps: int = 1,
    top: int = 15,
    step_s: float | None = None,
    cpu_ops: bool = True,
):
    """The body runs under the profiler; the dict it yields holds the report of
    :func:`top_kernels` once the body is done. ``cpu_ops=False`` records only the
    device's activity on CUDA (a fraction of the events: a whole training phase has
    hundreds of thousands of kernels, and the CPU operators would triple what the profiler
    has to post-process)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CUDA] if cuda else []
    if cpu_ops or not cuda:
        activities.insert(0, ProfilerActivity.CPU)
    if cuda:
        torch.cuda.synchronize()
    report: dict[str, object] = {}
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        yield report
        if cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    times: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    if cuda:
        for evt in prof.events():
            if evt.device_type == torch.autograd.DeviceType.CUDA:
                t = times[evt.name]
                t[0] += 1
                t[1] += evt.time_range.elapsed_us()
    else:
        for avg in prof.key_averages():
            t = times[avg.key]
            t[0] += avg.count
            t[1] += avg.self_cpu_time_total
    step_ms = step_s * 1e3 if step_s else wall_ms
    report.update(summarize({k: (int(c), us) for k, (c, us) in times.items()}, steps, step_ms, top))
    if cuda and cpu_ops:
        report["host_ops"] = host_ops(prof, steps, top)
    report["kind"] = "cuda_kernels" if cuda else "cpu_ops"
    report["profiled_step_ms"] = wall_ms
    if cuda and not times:
        report["note"] = "no CUDA kernel events recorded (CUPTI unavailable?)"


def host_ops(prof, steps: int, top: int) -> list[dict[str, object]]:
    """Where the host's time goes (CUDA runs with CPU activity): the ``top`` operators and
    CUDA runtime calls (``cudaLaunchKernel``, ``cudaStreamSynchronize``...) by self CPU
    time, per step. Syncs and launches that outnumber the kernels show here."""
    rows = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:top]
    return [
        {
            "name": a.key[:120],
            "calls": a.count / steps,
            "self_ms": a.self_cpu_time_total / 1e3 / steps,
        }
        for a in rows
    ]


def profile_or_error(fn: Callable[[], object], device, **kwargs) -> dict[str, object]:
    """:func:`top_kernels`, or ``{"error": ...}`` when profiling fails (the bench goes on)."""
    try:
        return top_kernels(fn, device, **kwargs)
    except Exception as err:  # noqa: BLE001 - a profiler failure must not lose the timings
        return {"error": f"{type(err).__name__}: {err}"[:500]}
