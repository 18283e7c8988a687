"""Print danka's dependencies pinned at their lower bounds (``name>=X`` -> ``name==X``),
one per line, from pyproject.toml (``name>=X,<Y`` too): what ``scripts/test_lower_bounds.sh``
installs.
``--skip NAME`` leaves a package out (torch: installed from the CPU index first)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's own copy of tomli
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def pins(extras: list[str], skip: set[str]) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    out = []
    for req in reqs:
        # name>=X, or name>=X,<Y where a newer release is known to break danka
        m = re.fullmatch(
            r"\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][^,;\s]*)\s*(,\s*<\s*[0-9][^,;\s]*\s*)?", req
        )
        if not m:
            raise SystemExit(f"no plain lower bound in {req!r}: write it as name>=X[,<Y]")
        if m.group(1).lower() not in skip:
            out.append(f"{m.group(1)}=={m.group(2)}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--skip", action="append", default=[])
    args = ap.parse_args()
    print("\n".join(pins(args.extra, {s.lower() for s in args.skip})))
