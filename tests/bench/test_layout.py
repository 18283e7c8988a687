"""bench/ has one entry point, every subcommand is a module with ``main(argv)``, only
``bench/danka_side.py`` reaches into ``danka.trainer``, and no bench module imports in a
circle."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from bench.__main__ import COMMANDS, main

BENCH = Path(__file__).resolve().parents[2] / "bench"
OWN_ENTRY_POINT = {"__main__.py"}


def _trees() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text(), str(p)) for p in sorted(BENCH.glob("*.py"))}


def _imports(tree: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_one_entry_point():
    def has_main_block(tree: ast.Module) -> bool:
        return any(isinstance(n, ast.If) and "__main__" in ast.dump(n.test) for n in tree.body)

    blocks = {name for name, tree in _trees().items() if has_main_block(tree)}
    assert blocks == OWN_ENTRY_POINT, "use python -m bench SUB, not a script"


def test_every_subcommand_is_a_module_with_main():
    for name, (module, _) in COMMANDS.items():
        if importlib.util.find_spec(module) is None:  # another branch's module, not here yet
            continue
        tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "main" in functions, f"{module} ({name}) has no main(argv)"


def test_only_danka_side_imports_trainer_internals():
    reach = {
        name: sorted(i for i in _imports(tree) if i.startswith("danka.trainer"))
        for name, tree in _trees().items()
    }
    assert {name: got for name, got in reach.items() if got and name != "danka_side.py"} == {}


def test_no_import_cycle_between_bench_modules():
    modules = {Path(name).stem for name in _trees()}
    graph = {
        Path(name).stem: {
            i.split(".")[1] for i in _imports(tree) if i.startswith("bench.") and i.count(".") >= 1
        }
        & modules
        for name, tree in _trees().items()
    }

    def reaches(start: str, node: str, seen: set[str]) -> bool:
        for nxt in graph[node] - {node}:
            if nxt == start or (nxt not in seen and reaches(start, nxt, seen | {nxt})):
                return True
        return False

    assert [m for m in graph if reaches(m, m, {m})] == []


def test_usage_lists_every_subcommand_and_unknown_ones_fail(capsys):
    assert main([]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in COMMANDS)
    assert main(["no-such-bench"]) == 2
