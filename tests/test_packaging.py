"""pyproject.toml says what the code needs: every third-party import is declared (or an
extra), each dependency has a plain lower bound for the lower-bounds job, the licence is an
SPDX expression with its file, and no extra is empty."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's own copy of tomli
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# import name -> distribution name, where they differ
DIST = {"yaml": "pyyaml", "math_verify": "math-verify", "flash_attn": "flash-attn"}
# imported only behind a check (find_spec / try), shipped by torch's CUDA builds, or extras
OPTIONAL = {"triton", "mlflow", "wandb", "bitsandbytes", "flash_attn"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")


def _imports() -> set[str]:
    found = set()
    for path in (ROOT / "danka").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"danka"}


def test_every_import_is_declared():
    declared = {_name(r) for r in PROJECT["dependencies"]}
    extras = {_name(r) for reqs in PROJECT["optional-dependencies"].values() for r in reqs}
    for module in sorted(_imports()):
        dist = DIST.get(module, module).lower().replace("_", "-")
        if module in OPTIONAL:
            assert module == "triton" or dist in extras, module
        else:
            assert dist in declared, f"danka imports {module} but pyproject does not declare {dist}"


def test_every_dependency_has_a_lower_bound_the_lower_bounds_job_can_pin():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from lower_bounds import pins
    finally:
        sys.path.pop(0)
    pinned = pins(["test"], set())
    assert len(pinned) == len(PROJECT["dependencies"]) + len(
        PROJECT["optional-dependencies"]["test"]
    )
    assert "torch==2.6" in pinned  # torch.distributed.fsdp.fully_shard, which danka imports


def test_fully_shard_is_where_the_torch_bound_says():
    from torch.distributed.fsdp import fully_shard  # noqa: F401  (torch >= 2.6)


def test_license_and_extras():
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert all(PROJECT["optional-dependencies"].values())
    names = {_name(r) for reqs in PROJECT["optional-dependencies"].values() for r in reqs}
    assert not {"liger", "reasoning-gym"} & (names | set(PROJECT["optional-dependencies"]))
    assert PROJECT["optional-dependencies"]["vllm"] == ["vllm==0.26.*"]  # rollout.engine: vllm
