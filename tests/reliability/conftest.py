"""Shared by the reliability tests: a tiny model, a one-step config, ``danka`` as a real
process (exit codes, output and leftover processes are what these tests check)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.trainer.conftest import make_config, write_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    from danka.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("reliability_model"))


def one_step_config(root: Path, model_dir: Path, **sections) -> Path:
    """The trainer tests' tiny GRPO+LoRA config cut to 1 step (``sections`` update it)."""
    trainer = {"total_steps": 1, "samples_per_prompt": 2, "max_new_tokens": 4}
    trainer.update(sections.pop("trainer", {}))
    path = make_config(root, model_dir, trainer=trainer, **sections)
    write_rows(root / "rows.jsonl", 8)
    return path


def edit_config(path: Path, **sections) -> None:
    cfg = yaml.safe_load(path.read_text())
    for section, values in sections.items():
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
        else:
            cfg[section] = values
    path.write_text(yaml.safe_dump(cfg))


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a ``danka`` child: this worktree's danka, one thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANKA_")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return env


@dataclass
class Done:
    returncode: int
    out: str  # stdout and stderr together
    seconds: float


def danka(*args: str, timeout: float = 300, env: dict | None = None, cwd: Path = REPO) -> Done:
    """``python -m danka ARGS`` in a new session; the output is stdout + stderr."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "danka", *args],
        cwd=cwd,
        env=env or child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )
    return Done(proc.returncode, proc.stdout, time.monotonic() - t0)


@contextmanager
def running(cmd: list[str], **popen) -> Iterator[subprocess.Popen]:
    """``cmd`` as a child (text mode) that never outlives the test: a check that fails
    while it runs kills it instead of leaving it to hang or to write into the next test."""
    proc = subprocess.Popen(cmd, text=True, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def assert_user_error(done: Done, *words: str) -> None:
    """Exit 2, one ``danka: error:`` message naming ``words`` with a fix, no traceback."""
    assert done.returncode == 2, done.out[-3000:]
    assert "Traceback" not in done.out, done.out[-3000:]
    message = done.out[done.out.index("danka: error:") :]
    for word in words:
        assert word in message, f"{word!r} not in:\n{message}"
    assert "fix:" in message


def processes_with(marker: str) -> list[int]:
    """pids of live processes whose command line holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            found.append(int(name))
    return found


def wait_until(predicate, timeout: float, step: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()
