"""The wheels vLLM needs on a GPU machine without internet, resolved from wheel METADATA.

    python3 scripts/vllm_wheels.py DIR [--vllm 0.26.0] [--keep-fa2]

Downloads (pip download --no-deps, binary wheels for CPython 3.12 on manylinux x86_64) the
vllm wheel and, breadth first, every ``Requires-Dist`` of every downloaded wheel that
applies on Linux x86_64 / Python 3.12 (markers evaluated there; a requirement's extras
pull in the lines marked ``extra == "..."`` for them, no other ``extra`` line counts),
except:

* packages the GPU machine already has (``ON_GPU_MACHINE``: its installed list; their
  versions are not checked here: vllm 0.26.0's pins torch 2.11.0, torchaudio 2.11.0 and
  torchvision 0.26.0 match what it has);
* ``LAZY``: what vLLM imports only on paths danka does not take (MLA kernels, tilelang and
  its z3 solver, video decoding, the CUDA compiler wheels humming-kernels asks for, the
  CUDA 12 build of CUTLASS's DSL), and numba / numpy / the CUDA runtime (the machine's own).

Writes DIR/wheels/*.whl, DIR/wheels.txt (one line per wheel: name, size, who asked for it)
and, without ``--keep-fa2``, repacks the vllm wheel without ``vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so``
(FlashAttention 2 kernels, 129.5 MB; an H200 runs the bundled FlashAttention 3).
``scripts/vllm_wheels.sh`` calls this, then packs and splits DIR/wheels.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from collections import defaultdict
from email.parser import Parser
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

# wheel platforms accepted: glibc up to 2.34 (llguidance 1.7 needs 2.31, cryptography's
# newest wheels 2.34); the GPU machine's glibc must be at least the newest one taken
# (DIR/wheels.txt shows each wheel's tag)
PLATFORMS = tuple(f"manylinux_2_{v}_x86_64" for v in (34, 31, 28, 27, 24, 17)) + (
    "manylinux2014_x86_64",
)
# the GPU machine's installed distributions (pip list), normalised names
ON_GPU_MACHINE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentence-transformers sentencepiece setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp
""".split()
# imported only lazily by vLLM (or the machine's own copy is used): never carried
LAZY = {
    "tokenspeed-mla", "tokenspeed-triton",  # MLA attention kernels (DeepSeek-style models)
    "tilelang", "z3-solver",  # tilelang kernels and the solver it brings
    "pynvvideocodec", "torchcodec",  # video decoding (multimodal inputs)
    # the CUDA compiler pieces humming-kernels[cu13] asks for (JIT of its own kernels)
    "nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl",
    "nvidia-cutlass-dsl-libs-cu12",  # CUTLASS DSL's CUDA 12 build (the machine runs CUDA 13)
    "numba", "numpy",  # the machine's own (numba 0.65 pin not carried)
    "nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "nvidia-cublas",  # the machine's CUDA 13
}  # fmt: skip
# the environment requirement markers are evaluated in (the GPU machine)
ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "platform_release": "",
    "platform_version": "",
    "implementation_version": "3.12.3",
}
FA2 = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def applies(req: Requirement, extras: set[str]) -> bool:
    """Whether ``req`` is needed on the GPU machine for a dependent that asked for
    ``extras`` (a line without a marker always is)."""
    if req.marker is None:
        return True
    text = str(req.marker)
    if "extra" not in text:
        return req.marker.evaluate(ENV)
    return any(Marker(text).evaluate({**ENV, "extra": e}) for e in extras)


def metadata(wheel: Path) -> tuple[str, list[Requirement]]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(name).decode())
    return msg["Name"], [Requirement(r) for r in msg.get_all("Requires-Dist") or []]


def _pip(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args, "--python-version", "3.12", "--implementation", "cp"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    return subprocess.run(cmd, capture_output=True, text=True)


def fetch(req: str, dest: Path) -> Path:
    """``pip download --no-deps`` of one requirement: the wheel's path."""
    proc = _pip("download", "--no-deps", "--only-binary=:all:", "-d", str(dest), req)
    for line in proc.stdout.splitlines():
        for lead in ("Saved ", "File was already downloaded "):
            if line.strip().startswith(lead):
                return Path(dest, Path(line.strip()[len(lead) :]).name)
    raise SystemExit(f"pip download {req} failed:\n{proc.stderr[-2000:]}")


def versions(name: str) -> list[str]:
    """Every version of ``name`` with a wheel for the GPU machine, newest first."""
    proc = _pip("index", "versions", "--only-binary=:all:", name)
    line = next((x for x in proc.stdout.splitlines() if "Available versions:" in x), "")
    return [v.strip() for v in line.split(":", 1)[-1].split(",") if v.strip()]


def _version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def resolve(dest: Path, vllm: str, pins: dict[str, str]):
    """Breadth first from ``vllm==VERSION`` (``pins``: {name: version} forced): every
    missing wheel, who asked for it, and the conflicts found, as (dependency, its chosen
    version, the packages whose requirement excludes it). A package asked for again with
    more extras has its requirements read again."""
    have = {norm(n) for n in ON_GPU_MACHINE} | LAZY
    wanted: dict[str, SpecifierSet] = {"vllm": SpecifierSet(f"=={vllm}")}
    asked: dict[str, list[tuple[str, SpecifierSet]]] = defaultdict(list)
    extras: dict[str, set[str]] = defaultdict(set)
    done: dict[str, Path] = {}
    pending = {"vllm"}  # packages whose requirements are to be read (again)
    while pending:
        for name in sorted(pending - set(done)):
            spec = f"=={pins[name]}" if name in pins else str(wanted[name])
            done[name] = fetch(f"{name}{spec}", dest)
        nxt: set[str] = set()
        for name in sorted(pending):
            for req in metadata(done[name])[1]:
                dep = norm(req.name)
                if dep in have or not applies(req, extras[name] | {""}):
                    continue
                more = set(req.extras) - extras[dep]
                wanted[dep] = wanted.get(dep, SpecifierSet()) & req.specifier
                asked[dep].append((name, req.specifier))
                extras[dep] |= more
                if dep not in done or more:
                    nxt.add(dep)
        pending = nxt
    conflicts = []
    for dep, wheel in done.items():
        v = _version(wheel)
        against = sorted({n for n, spec in asked[dep] if not spec.contains(v, prereleases=True)})
        if against:
            allowed = SpecifierSet()
            for _, spec in asked[dep]:
                allowed &= spec
            conflicts.append((dep, v, against, allowed))
    why = {dep: asked[dep][0][0] if asked[dep] else "-" for dep in done}
    return [(done[n], why[n]) for n in sorted(done)], conflicts


def older_fitting(parent: str, below: str, dep: str, dep_version: str, dest: Path) -> str:
    """The newest version of ``parent`` older than ``below`` whose requirement on ``dep``
    allows ``dep_version`` (its wheels downloaded to read their METADATA)."""
    for v in versions(parent):
        if Version(v) >= Version(below):
            continue
        wheel = fetch(f"{parent}=={v}", dest)
        reqs = [r for r in metadata(wheel)[1] if norm(r.name) == dep]
        if all(r.specifier.contains(dep_version, prereleases=True) for r in reqs):
            return v
    raise SystemExit(f"no version of {parent} below {below} allows {dep}=={dep_version}")


def resolve_all(dest: Path, vllm: str) -> list[tuple[Path, str]]:
    """``resolve``, stepping a package that excludes a chosen version down to its newest
    version that allows it (vllm's own pins win), until nothing conflicts."""
    pins: dict[str, str] = {}
    for _ in range(20):
        wheels, conflicts = resolve(dest, vllm, pins)
        if not conflicts:
            return wheels
        chosen = {norm(w.name.split("-")[0]): _version(w) for w, _ in wheels}
        for dep, v, against, allowed in conflicts:
            # an older ``dep`` that every asker allows first (a parent pinning it exactly,
            # opentelemetry-sdk 1.45.2 -> api==1.45.2 while api 1.45.3 is out), else older parents
            fits = [x for x in versions(dep) if allowed.contains(x, prereleases=False)]
            if fits and dep not in pins:
                pins[dep] = fits[0]
                print(f"{', '.join(against)} exclude {dep}=={v}: taking {fits[0]}")
                continue
            for parent in against:
                if parent == "vllm":
                    raise SystemExit(f"vllm's own requirement excludes {dep}=={v}")
                pins[parent] = older_fitting(parent, chosen[parent], dep, v, dest)
                print(f"{parent} {chosen[parent]} excludes {dep}=={v}: taking {pins[parent]}")
    raise SystemExit(f"still conflicting after 20 rounds: {conflicts}")


def drop_fa2(wheel: Path) -> Path:
    """The vllm wheel without FA2's kernels: the file and its RECORD line removed (pip
    checks RECORD hashes of what is there, so the wheel still installs)."""
    out = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        if FA2 not in src.namelist():
            out.unlink()
            return wheel
        for info in src.infolist():
            if info.filename == FA2:
                continue
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(
                    line
                    for line in data.splitlines(keepends=True)
                    if not line.startswith(FA2.encode())
                )
            dst.writestr(info, data)
    out.replace(wheel)
    return wheel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--vllm", default="0.26.0")
    ap.add_argument("--keep-fa2", action="store_true", help="keep FlashAttention 2's kernels")
    args = ap.parse_args(argv)
    dest = Path(args.dir) / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    wheels = resolve_all(dest, args.vllm)
    if not args.keep_fa2:
        drop_fa2(next(w for w, _ in wheels if norm(w.name.split("-")[0]) == "vllm"))
    keep = {w.name for w, _ in wheels}
    for stray in dest.glob("*.whl"):  # from an earlier run with another resolution
        if stray.name not in keep:
            stray.unlink()
    lines = [f"{w.name}\t{w.stat().st_size}\t{by}" for w, by in wheels]
    (Path(args.dir) / "wheels.txt").write_text("\n".join(lines) + "\n")
    total = sum(w.stat().st_size for w, _ in wheels)
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
