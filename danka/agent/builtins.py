"""Builtin tools. Standard library only: the tool worker process imports this module.

``calculator`` evaluates arithmetic from the parsed syntax tree (``ast``), never with
``eval``: numbers, ``+ - * / // % **``, unary signs and parentheses, nothing else (no
names, calls or attributes). Exponents and operand sizes are bounded so a call cannot
hang the worker (``9**9**9``).

``python`` runs a snippet of model-written code in a fresh interpreter and returns what
it printed, sandboxed by default (danka/agent/sandbox.py, ``agent.tool_sandbox``): its
own temporary folder is the only writable place and the only folder of the user's it can
see, no network, a wall-clock timeout (its whole process tree is killed) and rlimits
(CPU seconds, 1 GiB address space, 16 MiB per file, a process count, no core files).
Where no sandbox works here and the config did not say ``agent.tool_sandbox: none``,
the trainer warns loudly at start-up: unconfined, the code can read and write the
user's files and reach the network.
"""

from __future__ import annotations

import ast
import operator

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


_SANDBOX: list[str] = []  # the mode the tool worker was told to use (use_sandbox)


def use_sandbox(mode: str) -> None:
    """``agent.tool_sandbox`` as resolved by the trainer (bwrap, namespaces or none): the
    tool worker calls this once; without it, the best mode that works here is used."""
    _SANDBOX[:] = [mode]


def python(code: str) -> str:
    """Run a Python snippet in a fresh interpreter and return what it printed.

    Args:
        code: Python source; print() the values you want to see.
    """
    from danka.agent.sandbox import choose, run_snippet

    mode = _SANDBOX[0] if _SANDBOX else choose("auto")
    done = run_snippet(str(code), mode, PYTHON_TIMEOUT_S)
    if done.returncode is None:
        return f"error: the snippet ran longer than {PYTHON_TIMEOUT_S:g} s and was killed"
    out = done.stdout
    if done.returncode != 0:
        out += done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        out += f"\n(exit code {done.returncode})"
    return out.strip() or "(no output)"


BUILTIN_TOOLS = {"calculator": calculator, "python": python}
