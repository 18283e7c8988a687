"""The builtin ``python`` tool runs model-written code: sandboxed by default, tried with the
red team's shape (read /etc/passwd, write outside its folder, open a socket) in every mode
this machine can run; where none works, a loud start-up warning. And tool files, like
reward files, are imported only in a separate process, bounded by a time limit."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest

from danka.agent import sandbox
from danka.agent.sandbox import choose, run_snippet, startup_warning, works
from danka.agent.tools import load_tools
from danka.agent.worker import ToolRunner
from danka.errors import UserError

from .conftest import REPO, child_env

ESCAPES = """
import os, socket
secret = {secret!r}
for name, attempt in [
    ("read /etc/passwd", lambda: open("/etc/passwd").read()),
    ("read the user's file", lambda: open(secret).read()),
    ("write outside", lambda: open({outside!r}, "w").write("pwned")),
    ("open a socket", lambda: socket.create_connection(("1.1.1.1", 53), timeout=3)),
]:
    try:
        attempt()
        print(name, "ESCAPED")
    except OSError as err:
        print(name, "blocked", type(err).__name__)
open("/tmp/inside.txt", "w").write("ok")  # its own folder is writable
print("inside", open("/tmp/inside.txt").read())
"""


def _sandboxes() -> list:
    return [
        pytest.param(
            mode,
            marks=pytest.mark.skipif(
                not works(mode),
                reason=f"{mode} cannot run here ("
                + ("no bwrap on PATH" if mode == "bwrap" else "no usable user/mount/net namespaces")
                + ")",
            ),
        )
        for mode in ("namespaces", "bwrap")
    ]


@pytest.mark.parametrize("mode", _sandboxes())
def test_the_red_teams_escapes_are_blocked(tmp_path, mode):
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's data")
    outside = tmp_path / "outside.txt"
    code = ESCAPES.format(secret=str(secret), outside=str(outside))
    done = run_snippet(code, mode, 30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "ESCAPED" not in done.stdout, done.stdout
    assert sum("blocked" in line for line in lines) == 4, done.stdout
    assert "inside ok" in lines
    assert not outside.exists()


@pytest.mark.parametrize("mode", _sandboxes())
def test_limits_hold_in_the_sandbox(mode):
    big = run_snippet("x = bytearray(2 << 30)", mode, 30)  # over the 1 GiB address space
    assert big.returncode != 0 and "MemoryError" in big.stderr
    t0 = time.monotonic()
    assert run_snippet("while True: pass", mode, 2).returncode is None  # killed at 2 s
    assert time.monotonic() - t0 < 10
    forks = run_snippet(
        "import os\nn = 0\ntry:\n    for _ in range(500):\n        if os.fork() == 0:\n"
        "            import time; time.sleep(5); os._exit(0)\n        n += 1\n"
        "except OSError:\n    pass\nprint(n)",
        mode,
        30,
    )
    if mode == "bwrap" and os.geteuid() == 0:
        return  # bwrap keeps the host uid 0, which RLIMIT_NPROC exempts (auto prefers namespaces)
    assert int(forks.stdout.split()[0]) < 500  # RLIMIT_NPROC stopped the fork loop


def test_the_builtin_tool_uses_the_chosen_sandbox():
    from danka.agent import builtins

    mode = choose("auto")
    if mode == "none":
        pytest.skip("no sandbox works on this machine")
    builtins.use_sandbox(mode)
    try:
        out = builtins.python("import os; print(os.path.exists('/etc/passwd'), os.getcwd())")
    finally:
        builtins._SANDBOX.clear()
    assert out == "False /tmp"


def _no_sandbox_here(monkeypatch):
    monkeypatch.setattr(sandbox, "works", lambda mode: mode == "none")


def test_without_a_sandbox_the_runner_warns_loudly_at_start_up(monkeypatch, caplog):
    _no_sandbox_here(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="danka"):
        runner = ToolRunner(load_tools(["python"]), sandbox="auto")
    runner.close()
    assert runner.sandbox == "none"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("UNSANDBOXED" in w and "read and write your files" in w for w in warnings)
    assert any("agent.tool_sandbox: none" in w for w in warnings)


def test_an_explicit_none_accepts_the_risk_without_the_warning(monkeypatch, caplog):
    _no_sandbox_here(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="danka"):
        ToolRunner(load_tools(["python"]), sandbox="none").close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert startup_warning("none", "none") is None


@pytest.mark.parametrize("mode", ["bwrap", "namespaces"])
def test_an_explicit_sandbox_that_cannot_work_is_refused(monkeypatch, mode):
    _no_sandbox_here(monkeypatch)
    with pytest.raises(UserError, match=f"agent.tool_sandbox: {mode} does not work"):
        choose(mode)


def test_the_config_refuses_an_unavailable_sandbox_before_any_model(tmp_path):
    """``agent.tool_sandbox: bwrap`` on a PATH without bwrap: exit 2 from --print-config."""
    (tmp_path / "rows.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    (tmp_path / "c.yaml").write_text(
        textwrap.dedent("""\
        model: {actor_model_name_or_path: some/model}
        data: {train_dataset: rows.jsonl}
        trainer: {max_length: 512, max_new_tokens: 16}
        rollout: {tools: [python], tool_sandbox: bwrap}
        """)
    )
    env = child_env(PATH=str(tmp_path))  # no bwrap there
    done = subprocess.run(
        [sys.executable, "-m", "danka", "train", str(tmp_path / "c.yaml"), "--print-config"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "agent.tool_sandbox: bwrap does not work" in done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------- tool files at import

TOOL = '''
def lookup(city: str) -> str:
    """Weather.

    Args:
        city: the city
    """
    return city
'''


def test_a_tool_file_that_exits_at_import_is_reported(tmp_path):
    """Before: the tool file was imported in the trainer; os._exit(0) ended it with 0."""
    (tmp_path / "t.py").write_text("import os; os._exit(0)\n" + TOOL)
    script = (
        f"from danka.agent.tools import load_tools; load_tools(['t.py:lookup'], {str(tmp_path)!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=child_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert "ended its probe process while being imported (exit code 0)" in done.stderr


def test_a_tool_file_that_hangs_at_import_is_stopped(tmp_path):
    (tmp_path / "t.py").write_text("import time; time.sleep(600)\n" + TOOL)
    t0 = time.monotonic()
    with pytest.raises(UserError, match="took over 10 s"):
        load_tools(["t.py:lookup"], tmp_path, timeout_s=1)
    assert time.monotonic() - t0 < 60


def test_a_tool_file_is_not_imported_in_this_process(tmp_path):
    marker = tmp_path / "imported_in"
    (tmp_path / "t.py").write_text(
        f"import os\nopen({str(marker)!r}, 'a').write(str(os.getpid()) + ' ')\n" + TOOL
    )
    [tool] = load_tools(["t.py:lookup"], tmp_path)
    assert str(os.getpid()) not in marker.read_text().split()
    assert tool.schema["function"]["name"] == "lookup"
    assert tool.check_arguments({"city": "Oslo"}) is None
    assert "unexpected keyword argument 'town'" in tool.check_arguments({"city": "A", "town": "B"})
    assert "missing a required argument: 'city'" in tool.check_arguments({})
