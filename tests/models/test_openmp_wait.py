"""How torch's OpenMP threads wait (models/openmp_wait): spin alone, sleep beside another
computing process; the machine faked (a registry folder, /proc/loadavg's running count)."""

from __future__ import annotations

import os

import pytest

from danka.models import openmp_wait
from danka.models.openmp_wait import WAIT_ENV, decide, other_runs, register


def _decide(tmp_path, env, tasks=(1, 1, 1, 1, 1), torch_loaded=False):
    reads = iter(tasks)
    slept: list[float] = []
    got = decide(
        env,
        torch_loaded=torch_loaded,
        folder=tmp_path / "runs",
        tasks=lambda: next(reads),
        sleep=slept.append,
    )
    return got, slept


def test_alone_the_threads_spin_and_nothing_is_set(tmp_path):
    env: dict = {}
    got, slept = _decide(tmp_path, env)
    assert (got.policy, env) == ("active", {})
    assert got.line() == "OpenMP threads wait active (alone on the CPU)"
    assert sum(slept) == pytest.approx(openmp_wait.SETTLE_S)  # a run started with it registers
    assert (tmp_path / "runs" / str(os.getpid())).is_file()  # others see this one


def test_another_danka_run_makes_both_sleep(tmp_path):
    """Started side by side: each registers, settles, and sees the other."""
    register(tmp_path / "runs", pid=os.getppid())  # a live process: the other run
    env: dict = {}
    got, _ = _decide(tmp_path, env)
    assert env == {WAIT_ENV: "PASSIVE"}
    assert got.line() == "OpenMP threads wait passive (shared CPU: 1 other danka run)"


@pytest.mark.parametrize(
    "tasks, busy",
    [
        ((3, 3, 4, 3, 3), 2),  # another torch job's 2 threads run in every read
        ((2, 2, 2, 2, 2), 1),
        ((1, 3, 1, 2, 1), 0),  # blips (a kernel thread, a shell) in some reads only
    ],
)
def test_a_busy_process_counts_only_when_it_runs_in_every_read(tmp_path, tasks, busy):
    env: dict = {}
    got, _ = _decide(tmp_path, env, tasks)
    assert (WAIT_ENV in env) == (busy > 0)
    if busy:
        assert got.why == f"shared CPU: {busy} other busy task{'s' * (busy > 1)}"


def test_the_users_policy_is_kept_and_a_loaded_torch_is_left_alone(tmp_path):
    env = {WAIT_ENV: "active"}
    got, slept = _decide(tmp_path, env, tasks=(5, 5, 5, 5, 5))
    assert (got.policy, got.why, env[WAIT_ENV], slept) == (
        "active",
        f"{WAIT_ENV} set",
        "active",
        [],
    )
    env = {}
    got, slept = _decide(tmp_path, env, torch_loaded=True)  # libgomp has read the env
    assert (got, env, slept) == (None, {}, [])


def test_dead_runs_are_not_counted_and_their_entries_go(tmp_path):
    folder = tmp_path / "runs"
    for pid in (11, 22, 33):
        register(folder, pid=pid)
    (folder / "notes.txt").write_text("")  # not a pid: ignored
    assert other_runs(folder, pid=33, alive=lambda pid: pid == 22) == 1
    assert sorted(p.name for p in folder.iterdir()) == ["22", "33", "notes.txt"]


def test_an_unwritable_registry_still_chooses(tmp_path):
    blocker = tmp_path / "runs"
    blocker.write_text("a file where the folder should be")
    env: dict = {}
    got, _ = _decide(tmp_path, env)
    assert got.policy == "active" and register(blocker) is None
