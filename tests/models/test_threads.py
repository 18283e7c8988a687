"""speed.cpu_threads: auto takes the CPUs this process may use (affinity, OMP_NUM_THREADS,
the cgroup quota), at least one, and never follows the load (the count changes results in
their last bits); when the load says others keep CPUs busy while the threads spin, it says
once that a resume shares them better; faked here."""

from __future__ import annotations

import os

import pytest
import torch

from danka.models import openmp_wait, threads
from danka.models.threads import ThreadGovernor, cgroup_cpu_quota, share, use_cpu_threads


@pytest.fixture(autouse=True)
def _keep_torch_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "cpus, quota, load, own, want, busy",
    [
        (2, None, 0.2, 0, 2, 0),  # alone on 2 cores: both
        (2, None, 2.1, 0, 2, 1),  # another torch job keeps 2 cores busy: said, count kept
        (2, None, 0.8, 0, 2, 1),  # a neighbour at ~0.8 of a core counts
        (2, None, 0.6, 0, 2, 0),  # background noise does not
        (8, 2.0, 0.0, 0, 2, 0),  # an 8-CPU affinity inside a 2-CPU cgroup quota
        (8, 1.5, 0.0, 0, 2, 0),  # a fractional quota rounds up
        (2, None, 2.2, 2, 2, 0),  # this run's own 2 threads in the load are not a neighbour
        (2, None, 3.1, 2, 2, 1),  # ... a second run beside them is
        (4, None, 40.0, 0, 4, 3),  # an overloaded machine: advice of one thread
    ],
)
def test_auto_counts_usable_cpus_and_the_neighbours(cpus, quota, load, own, want, busy):
    got = share(own, cpus=cpus, quota=quota, load=load)
    assert (got.threads, got.busy) == (want, busy)
    assert got.line().startswith(f"cpu threads: {want} (speed.cpu_threads: auto; {cpus} CPUs")
    advice = got.crowded()
    assert (advice is None) == (busy == 0)
    if advice:
        assert f"others keep ~{busy} of {got.usable} CPUs busy" in advice
        assert "--resume auto" in advice


def test_the_machine_is_read_affinity_load_and_omp_cap(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 0.5, 0.2))
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda root=None: None)
    assert (share().threads, share().busy) == (4, 1)  # 4 CPUs, one kept busy by someone else
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's (or torchrun's) limit
    assert share().threads == 2


def test_cgroup_quota_v2_and_v1(tmp_path):
    assert cgroup_cpu_quota(tmp_path) is None
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path) is None  # v1, unlimited
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("250000\n")
    assert cgroup_cpu_quota(tmp_path) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path) is None  # v2 says unlimited (it wins over v1)
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(tmp_path) == 1.5


def test_use_sets_torch_and_says_it_in_one_line(monkeypatch):
    monkeypatch.setattr(openmp_wait, "CHOSEN", None)  # a Python caller: torch loaded first
    monkeypatch.setattr(
        threads, "share", lambda own=0: threads.CpuShare(2, None, 2.3, own, 2, busy=1)
    )
    lines: list[str] = []
    gov = use_cpu_threads("auto", "cpu", lines.append)
    assert torch.get_num_threads() == 2 and gov.threads == 2
    assert lines[0] == "cpu threads: 2 (speed.cpu_threads: auto; 2 CPUs usable, load 2.3)"
    assert len(lines) == 2 and "--resume auto" in lines[1]
    lines.clear()
    torch.set_num_threads(2)
    gov = use_cpu_threads(3, "cpu", lines.append)
    assert torch.get_num_threads() == 3 and lines == ["cpu threads: 3 (speed.cpu_threads)"]
    gov.restore()  # danka.train gives a Python caller its count back
    assert torch.get_num_threads() == 2


def test_the_governor_keeps_the_count_and_advises_once(monkeypatch):
    """A neighbour comes and goes: the count (and so the numbers) stays; one line says,
    the first time, which count would share the CPUs better."""
    loads = iter([2.1, 3.2, 3.0, 1.2])  # alone at 2 threads; a neighbour comes; it goes
    monkeypatch.setattr(threads, "_load", lambda: next(loads))
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda root=None: None)
    monkeypatch.setattr(threads, "_affinity", lambda: 2)
    lines: list[str] = []
    gov = ThreadGovernor(lines.append, watch=True, threads=2)
    torch.set_num_threads(2)
    for step in range(1, 5):
        gov.on_step(step, {})
        assert gov.threads == 2 and torch.get_num_threads() == 2
    assert len(lines) == 1 and "others keep ~1 of 2 CPUs busy" in lines[0]


@pytest.mark.parametrize("policy", ["active", "passive"])
def test_the_wait_choice_is_logged_and_only_a_spinning_run_is_advised(monkeypatch, policy):
    """The CLI chose how the threads wait before torch loaded: that line is logged; the
    start-up advice (from the 1-minute load) is not repeated over the fresher choice, and a
    run whose threads already sleep is never told to resume."""
    monkeypatch.setattr(openmp_wait, "CHOSEN", openmp_wait.WaitChoice(policy, "why"))
    monkeypatch.setattr(
        threads, "share", lambda own=0: threads.CpuShare(2, None, 3.1, own, 2, busy=1)
    )
    lines: list[str] = []
    gov = use_cpu_threads("auto", "cpu", lines.append)
    assert lines == [f"OpenMP threads wait {policy} (why)", lines[1]]
    assert lines[1].startswith("cpu threads: 2 (speed.cpu_threads: auto")
    gov.on_step(1, {})
    assert len(lines) == (3 if policy == "active" else 2)


def test_the_setting_is_checked_at_start_up():
    import danka
    from danka.errors import UserError

    base = {"model": {"actor_model_name_or_path": "x"}, "data": {"task": "arithmetic"}}
    assert danka.Config.from_dict(base).speed.cpu_threads == "auto"
    assert danka.Config.from_dict(base, ["speed.cpu_threads=2"]).speed.cpu_threads == 2
    with pytest.raises(UserError, match="speed.cpu_threads"):
        danka.Config.from_dict(base, ["speed.cpu_threads=0"])


def test_a_users_own_spinning_policy_is_not_told_to_resume(monkeypatch):
    """OMP_WAIT_POLICY=active set by the user: a resume would spin again, so no advice."""
    chosen = openmp_wait.WaitChoice("active", "OMP_WAIT_POLICY set", user=True)
    monkeypatch.setattr(openmp_wait, "CHOSEN", chosen)
    monkeypatch.setattr(
        threads, "share", lambda own=0: threads.CpuShare(2, None, 3.1, own, 2, busy=1)
    )
    lines: list[str] = []
    gov = use_cpu_threads("auto", "cpu", lines.append)
    gov.on_step(1, {})
    assert len(lines) == 2 and not gov.advised
