"""bench/ has one entry point, every subcommand is a module with ``main(argv)``, only
``bench/lib/danka_side.py`` reaches into ``danka.trainer``, a group (speed/, memory/, ...)
imports only from itself and lib/, and no bench module imports in a circle."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from bench.__main__ import COMMANDS, main

BENCH = Path(__file__).resolve().parents[2] / "bench"
OWN_ENTRY_POINT = {"bench.__main__"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(BENCH.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _trees() -> dict[str, ast.Module]:
    """Every bench module by its dotted name (``bench.speed.rollout``), parsed."""
    paths = sorted(BENCH.rglob("*.py"))
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in paths}


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


def test_the_top_holds_only_the_entry_point_and_summary():
    top = {p.name for p in BENCH.glob("*.py")}
    assert top == {"__init__.py", "__main__.py", "summary.py"}, "a module goes in a group"


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
    allowed = "bench.lib.danka_side"
    assert {name: got for name, got in reach.items() if got and name != allowed} == {}


def _bench_imports(tree: ast.Module, modules: set[str]) -> set[str]:
    return {i for i in _imports(tree) if i in modules}


def test_a_group_imports_only_itself_and_lib():
    trees = _trees()
    modules = set(trees)
    crossing = {}
    for name, tree in trees.items():
        parts = name.split(".")
        if len(parts) < 3 or parts[1] == "lib":  # the top (summary, __main__) and lib/ itself
            continue
        own = {f"bench.{parts[1]}", "bench.lib"}
        bad = sorted(
            i for i in _bench_imports(tree, modules) if ".".join(i.split(".")[:2]) not in own
        )
        if bad:
            crossing[name] = bad
    assert crossing == {}, "a module two groups use goes to bench/lib/"


def test_lib_imports_no_group():
    trees = _trees()
    modules = set(trees)
    reach = {
        name: sorted(i for i in _bench_imports(tree, modules) if not i.startswith("bench.lib"))
        for name, tree in trees.items()
        if name.startswith("bench.lib")
    }
    assert {name: got for name, got in reach.items() if got} == {}


def test_no_import_cycle_between_bench_modules():
    trees = _trees()
    modules = {name for name in trees if name.count(".") >= 2}  # not the packages themselves
    graph = {name: _bench_imports(tree, modules) for name, tree in trees.items() if name in modules}

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
