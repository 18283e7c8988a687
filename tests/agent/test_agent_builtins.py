import pytest

from danka.agent import builtins
from danka.agent.builtins import calculator


def test_calculator_is_exact():
    assert calculator("4821 * 397") == "1913937"  # 4821*397 = 1,913,937
    assert calculator("1913937 / 397") == "4821"  # exact division prints an integer
    assert calculator("7 / 2") == "3.5"
    assert calculator("(12 + 3) * -2 ** 2") == "-60"  # -(2**2) = -4; 15 * -4
    assert calculator("1,000 × 3") == "3000"


@pytest.mark.parametrize(
    "expr",
    ["__import__('os').system('true')", "x + 1", "(1).real", "9 ** 9 ** 9", "1 / 0", "2 +"],
)
def test_calculator_refuses_anything_but_bounded_arithmetic(expr):
    with pytest.raises(ValueError):
        calculator(expr)


def test_python_runs_isolated_in_a_temp_dir(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "secret")
    out = builtins.python(
        "import os, sys; print(os.getcwd()); print(os.environ.get('HF_TOKEN')); "
        "print(sys.flags.isolated)"
    )
    cwd, token, isolated = out.splitlines()
    assert cwd == "/tmp" or "danka-python-tool-" in cwd  # sandboxed: its folder is /tmp
    assert token == "None" and isolated == "1"


def test_python_reports_errors_and_timeouts(monkeypatch):
    assert "ZeroDivisionError" in builtins.python("1/0")
    assert "exit code 1" in builtins.python("1/0")
    monkeypatch.setattr(builtins, "PYTHON_TIMEOUT_S", 0.5)
    assert "killed" in builtins.python("while True: pass")


def test_python_has_no_network_where_namespaces_work():
    from danka.agent.sandbox import choose

    if choose("auto") == "none":
        pytest.skip("no sandbox works here: the snippet could reach the net")
    out = builtins.python(
        "import socket\ntry:\n socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
        " print('connected')\nexcept OSError as e:\n print('no network')"
    )
    assert out == "no network"
