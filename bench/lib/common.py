"""What the benchmarks share: the environment record, sides in fresh processes, timing on
a device, and writing one result JSON.

A result JSON records the environment (torch / transformers / peft versions, the GPU, the
commit, the date) and both sides of every ratio, so each number can be checked against the
run that produced it. Timing a side in the process where another side ran first misleads
(warm caches, allocator state, compiled graphs), so comparisons run each side in its own
fresh ``python -m bench SUB --side NAME`` process.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
GIB = 2**30


def environment() -> dict:
    """Versions, GPU and commit, read in a child process (this one never initialises CUDA)."""
    code = (
        "import json, torch, transformers, peft;"
        "d = {'torch': torch.__version__, 'transformers': transformers.__version__,"
        " 'peft': peft.__version__, 'cuda': torch.version.cuda,"
        " 'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None};"
        "print(json.dumps(d))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    env = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    env.update(
        python=platform.python_version(),
        commit=commit.stdout.strip() or None,
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    return env


def bench_command(subcommand: str, *args: str) -> list[str]:
    """``python -m bench SUBCOMMAND ARGS``: how a benchmark starts a side in a new process."""
    return [sys.executable, "-m", "bench", subcommand, *args]


def child_env() -> dict[str, str]:
    """The environment for a child process: this checkout first on PYTHONPATH."""
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)
    return {**os.environ, "PYTHONPATH": path}


def run_child(cmd: list[str], timeout: float) -> dict:
    """Run one benchmark side in a fresh process: its wall time, or the error it died with."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-5:], "rc": proc.returncode}
    return {"wall_s": time.perf_counter() - t0}


def run_side(cmd: list[str], out: Path, timeout: float) -> dict:
    """Run one side writing its JSON to ``out`` (``--out`` added): that JSON plus the
    child's status (wall time or error)."""
    out.unlink(missing_ok=True)
    status = run_child(cmd + ["--out", str(out)], timeout)
    res = json.loads(out.read_text()) if out.exists() else {}
    res.update(status)
    return res


@contextlib.contextmanager
def sides_folder(out_dir: str | Path) -> Iterator[Path]:
    """``OUT_DIR/_sides``: where the sides :func:`run_side` starts write their JSON; removed
    once they have all run (kept when one raised, to look into)."""
    folder = Path(out_dir) / "_sides"
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def ratio(a_name: str, a: float, b_name: str, b: float) -> dict:
    """Both sides of a tok/s ratio and the ratio, as every result JSON keeps them."""
    return {f"{a_name}_tok_s": a, f"{b_name}_tok_s": b, "ratio": a / b}


def parser(subcommand: str, doc: str) -> argparse.ArgumentParser:
    """The argument parser of ``python -m bench SUBCOMMAND``, its help from ``doc``."""
    return argparse.ArgumentParser(
        prog=f"python -m bench {subcommand}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def sides_main(args, one_side: Callable, compare: Callable, name: str) -> int:
    """``main`` of a benchmark whose sides run in fresh processes: with ``--side`` this
    process is one side; else ``compare`` runs them all and its result is written as
    ``--name`` or ``name``, with the environment record."""
    if args.side:
        one_side(args)
        return 0
    env = environment()
    res = compare(args)
    res["environment"] = env
    write_result(res, args.out_dir, args.name or name)
    return 0


def add_output_args(p: argparse.ArgumentParser, timeout: int | None = None) -> None:
    """``--out-dir`` and ``--name`` of a benchmark that writes one result; ``--timeout``
    (seconds per child process) for one that starts its sides in child processes."""
    p.add_argument("--out-dir", default=str(RESULTS), help="where the result JSON goes")
    p.add_argument("--name", help="result file name without .json (default: from the settings)")
    if timeout is not None:
        p.add_argument("--timeout", type=int, default=timeout, help="seconds per child process")


def write_result(res: dict, out_dir: str | Path, name: str) -> Path:
    """Write ``res`` as ``OUT_DIR/NAME.json`` (and a copy into ``$OUT`` when set)."""
    out = Path(out_dir) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, default=str))
    copy = Path(os.environ["OUT"]) / out.name if os.environ.get("OUT") else None
    if copy is not None and not (copy.exists() and copy.samefile(out)):  # --out-dir $OUT
        shutil.copy(out, copy)
    print(f"wrote {out}", flush=True)
    return out


def error_text(err: BaseException) -> str:
    """One line for a result JSON: the exception's type and message, cut at 500 chars."""
    return f"{type(err).__name__}: {err}".strip()[:500]


# ----------------------------------------------------------------------------- timing


def is_cuda(dev) -> bool:
    """Whether ``dev`` (a device or its name) is a CUDA device."""
    import torch

    return torch.device(dev).type == "cuda"


def sync(dev) -> None:
    import torch

    if is_cuda(dev):
        torch.cuda.synchronize(dev)


def reset_peak(dev) -> None:
    import torch

    if is_cuda(dev):
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)


def peak_gib(dev) -> float | None:
    """``torch.cuda.max_memory_allocated`` in GiB since the last reset; None off CUDA."""
    import torch

    return torch.cuda.max_memory_allocated(dev) / GIB if is_cuda(dev) else None


class DevicePeak:
    """The most bytes the device had in use while the block ran, sampled every ``every``
    seconds on a thread: every allocation of the process, whoever made it (torch's cached
    blocks, the CUDA context, vLLM's own pool). ``torch.cuda.max_memory_allocated`` cannot
    stand in: vLLM's sleep mode unmaps its pool behind torch's allocator, whose counts do
    not see it. ``used``: a callable giving the bytes in use now (default: ``_device_used``,
    the bytes nvidia-smi shows in use)."""

    def __init__(self, dev=None, every: float = 0.002, used: Callable[[], int] | None = None):
        import threading

        self._used = used or _device_used(dev)
        self.every = every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> DevicePeak:
        self.peak = self._used()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._used())

    @property
    def gib(self) -> float:
        return self.peak / GIB


@functools.cache
def _device_used(dev) -> Callable[[], int]:
    """The device's bytes in use, read through NVML (the driver's library, as nvidia-smi
    reads it): it never enters the CUDA runtime, so the polling thread cannot disturb a CUDA
    graph another thread is capturing. Without NVML, ``torch.cuda.mem_get_info``. One
    reader per device (NVML is opened once, not at every step)."""
    import torch

    nvml = _nvml_used(str(torch.cuda.get_device_properties(dev).uuid))
    if nvml is not None:
        return nvml

    def used() -> int:
        free_b, total_b = torch.cuda.mem_get_info(dev)
        return total_b - free_b

    return used


def _nvml_used(uuid: str) -> Callable[[], int] | None:
    """NVML's used bytes of the GPU ``uuid`` (torch's form, without "GPU-"), or None."""
    import ctypes

    class Memory(ctypes.Structure):  # nvmlMemory_t
        _fields_ = [(k, ctypes.c_ulonglong) for k in ("total", "free", "used")]

    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        handle = ctypes.c_void_p()
        if lib.nvmlInit_v2() or lib.nvmlDeviceGetHandleByUUID(
            f"GPU-{uuid.removeprefix('GPU-')}".encode(), ctypes.byref(handle)
        ):
            return None
    except (OSError, AttributeError):
        return None
    memory = Memory()

    def used() -> int:
        lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
        return memory.used

    return used


def free(dev) -> None:
    import torch

    gc.collect()
    if is_cuda(dev):
        torch.cuda.empty_cache()


def timed_call(fn: Callable[[], object], dev) -> tuple[float, object]:
    """(seconds, result) of ``fn()``, the device synchronised before and after."""
    sync(dev)
    t0 = time.perf_counter()
    result = fn()
    sync(dev)
    return time.perf_counter() - t0, result


def timed(fn: Callable[[], object], dev) -> float:
    """Seconds of ``fn()``, the device synchronised before and after."""
    return timed_call(fn, dev)[0]


def fmt(x, spec: str = "{:.2f}") -> str:
    """A table cell: ``-`` for None, ``nan``/``inf`` as written, else ``spec``."""
    import math

    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return spec.format(x) if isinstance(x, (int, float)) else str(x)


def variant_rows(variants: dict, rows_of: Callable[[str, dict], list]) -> list:
    """Table rows of every variant: ``rows_of(name, result)``, or one ERROR row."""
    rows = []
    for key, v in variants.items():
        rows += [(key, "ERROR", v["error"][:60])] if "error" in v else rows_of(key, v)
    return rows
