"""Builtin tools. Standard library only: the tool worker process imports this module.

``calculator`` evaluates arithmetic from the parsed syntax tree (``ast``), never with
``eval``: numbers, ``+ - * / // % **``, unary signs and parentheses, nothing else (no
names, calls or attributes). Exponents and operand sizes are bounded so a call cannot
hang the worker (``9**9**9``).

``python`` runs a snippet in a fresh interpreter and returns what it printed. What it
does, and what it does NOT guarantee (it is a convenience, not a sandbox):

* ``python -I`` (isolated: no PYTHONPATH, no user site, no current-directory import),
  working directory = a new empty temporary folder, deleted afterwards;
* environment reduced to ``PATH`` and ``LANG`` (no proxies, tokens or HF variables);
* a wall-clock timeout (kill), and POSIX rlimits: CPU seconds, 1 GiB address space,
  16 MiB per written file, no core files;
* no network only where the OS allows an unprivileged network namespace
  (``unshare --net --map-root-user``, probed once; :func:`network_isolated` says
  whether it is in force). Elsewhere the snippet CAN reach the network;
* it CAN read any file the trainer's user can read (absolute paths), and write outside
  the temporary folder. Offer it only to models and data you trust, or run the trainer
  inside a container.
"""

from __future__ import annotations

import ast
import functools
import operator
import os
import shutil
import subprocess
import sys
import tempfile

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 1000  # |b| in a ** b
MAX_DIGITS = 4000  # operands of * and ** beyond this many digits are refused
PYTHON_TIMEOUT_S = 10.0  # wall-clock limit of one python snippet (below the worker timeout)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (limit {MAX_EXPONENT})")
        for x in (left, right):
            if isinstance(x, int) and x.bit_length() > MAX_DIGITS * 3.33:
                raise ValueError("number too large")
        return _BINOPS[type(node.op)](left, right)
    raise ValueError(f"unsupported expression element: {ast.dump(node)[:60]}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "4821 * 397" or "(12 + 3) / 5".

    Args:
        expression: numbers with + - * / // % ** and parentheses.
    """
    text = str(expression).replace("×", "*").replace("÷", "/").replace("^", "**")
    text = text.replace(",", "").strip()
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    try:
        value = _value(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)  # 1913867 / 397 -> "4821", not "4821.0"
    return str(value)


@functools.cache
def network_isolated() -> bool:
    """True if ``unshare --net --map-root-user`` works here (snippets get no network)."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        probe = subprocess.run(
            [exe, "--net", "--map-root-user", "true"], capture_output=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _limits(cpu_s: int) -> None:  # runs in the child between fork and exec
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def python(code: str) -> str:
    """Run a Python snippet in a fresh interpreter and return what it printed.

    Args:
        code: Python source; print() the values you want to see.
    """
    timeout_s = PYTHON_TIMEOUT_S
    argv = [sys.executable, "-I", "-c", str(code)]
    if network_isolated():
        argv = [str(shutil.which("unshare")), "--net", "--map-root-user", *argv]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    with tempfile.TemporaryDirectory(prefix="danka-python-tool-") as cwd:
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
                preexec_fn=functools.partial(_limits, int(timeout_s) + 1),
            )
        except subprocess.TimeoutExpired:
            return f"error: the snippet ran longer than {timeout_s:g} s and was killed"
    out = done.stdout
    if done.returncode != 0:
        out += done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        out += f"\n(exit code {done.returncode})"
    return out.strip() or "(no output)"


BUILTIN_TOOLS = {"calculator": calculator, "python": python}
