"""The CPU-side helpers under an NCCL-like rule, checked in one process.

NCCL refuses CPU tensors ("No backend type associated with device type cpu"), which gloo
on CPU never shows. Here ``torch.distributed`` is replaced by a fake world of 2 identical
ranks whose DEFAULT group refuses CPU tensors exactly like NCCL, while the gloo
``cpu_group`` takes them: every helper that reduces a count, a flag, metrics or statistics
must route through the CPU group (the old helpers used the default group and fail here).
"""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as td

from danka import distributed as dist
from danka.algorithms._masked import masked_whiten

CPU_GROUP = object()  # stands in for the gloo group


@pytest.fixture
def nccl_like(monkeypatch):
    """Two ranks holding the same values: a sum over ranks doubles a tensor."""
    calls: list[str] = []

    def all_reduce(t, op=None, group=None, async_op=False):
        if group is not CPU_GROUP and t.device.type == "cpu":
            raise RuntimeError("No backend type associated with device type cpu")
        calls.append("all_reduce")
        if op != td.ReduceOp.MAX:  # the max of two equal values is the value
            t.mul_(2)

    def all_gather_object(out, obj, group=None):
        if group is not CPU_GROUP:  # NCCL pickles into a CUDA tensor: not on this machine
            raise RuntimeError("No backend type associated with device type cpu")
        calls.append("all_gather_object")
        out[:] = [obj] * len(out)

    def barrier(group=None, **kwargs):
        if group is not CPU_GROUP:
            raise RuntimeError("No backend type associated with device type cpu")
        calls.append("barrier")

    monkeypatch.setattr(td, "is_initialized", lambda: True)
    monkeypatch.setattr(td, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(td, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(td, "all_reduce", all_reduce)
    monkeypatch.setattr(td, "all_gather_object", all_gather_object)
    monkeypatch.setattr(td, "barrier", barrier)
    monkeypatch.setattr(dist, "_CPU_GROUP", CPU_GROUP)
    return calls


def test_scalar_helpers_use_the_cpu_group(nccl_like):
    assert dist.all_sum(1.5) == 3.0  # 1.5 on each of 2 ranks
    assert dist.all_mean(1.5) == 1.5
    assert dist.all_sum_many([1.0, -2.0]) == [2.0, -4.0]
    dist.barrier()
    assert nccl_like == ["all_reduce"] * 3 + ["barrier"]


def test_all_finite_agrees(nccl_like):
    assert dist.all_finite(True)
    assert dist.all_finite(torch.tensor([1.0, 2.0]))
    assert not dist.all_finite(False)
    assert not dist.all_finite(torch.tensor(float("nan")))  # one rank's NaN fails everyone


def test_reduce_metrics_means_and_sums(nccl_like):
    out = dist.reduce_metrics({"reward": 0.5, "time/step": 2.0}, {"actor/pg_loss": 0.25})
    # reward: (0.5 + 0.5) / 2 ranks = 0.5; pg_loss is a partial sum: 0.25 + 0.25 = 0.5;
    # time/step: mean 2.0 and slowest rank 2.0
    assert out == {"actor/pg_loss": 0.5, "reward": 0.5, "time/step": 2.0, "time/step_max": 2.0}
    assert nccl_like == ["all_gather_object", "all_reduce", "all_reduce"]


def test_global_whiten_equals_whitening_the_whole_batch(nccl_like):
    x = torch.tensor([[1.0, 2.0, 9.0], [4.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    got = dist.global_masked_whiten(x, mask)
    # the 2 ranks hold the same rows: the global batch is x stacked twice
    want = masked_whiten(torch.cat([x, x]), torch.cat([mask, mask]))[:2]
    torch.testing.assert_close(got, want)
    # by hand: valid values 1,2,4,-1,0 twice: n = 10, mean = 12/10 = 1.2,
    # sum sq dev per copy = 0.04+0.64+7.84+4.84+1.44 = 14.8 -> var = 29.6 / 9
    assert float(got[0, 0]) == pytest.approx((1.0 - 1.2) / (29.6 / 9) ** 0.5, rel=1e-6)
    kept = dist.global_masked_whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(kept, got + 1.2)


def test_helpers_are_identities_on_one_process():
    assert not dist.is_active()
    assert dist.all_sum(2.0) == 2.0 and dist.all_finite(True)
    assert dist.reduce_metrics({"a": 1.0}, {"b": 2.0}) == {"a": 1.0, "b": 2.0}
    with pytest.raises(ValueError, match="both averaged and summed"):
        dist.reduce_metrics({"a": 1.0}, {"a": 2.0})
    x, mask = torch.tensor([[1.0, 3.0]]), torch.ones(1, 2)
    torch.testing.assert_close(dist.global_masked_whiten(x, mask), masked_whiten(x, mask))


def test_device_and_backend_selection(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dist.rank_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert dist.rank_device(torch.device("cpu")) == torch.device("cpu")
    assert dist.backend_for(torch.device("cuda", 1)) == "nccl"
    assert dist.backend_for(torch.device("cpu")) == "gloo"


def test_init_forces_no_nccl_environment(monkeypatch):
    """NVLink multicast settings belong to a machine's environment, not to the library."""
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    made = types.SimpleNamespace(backend=None)
    monkeypatch.setattr(td, "is_initialized", lambda: made.backend is not None)
    monkeypatch.setattr(td, "init_process_group", lambda b: setattr(made, "backend", b))
    monkeypatch.setattr(td, "get_backend", lambda group=None: made.backend)
    monkeypatch.setattr(dist, "_CPU_GROUP", None)
    assert dist.init(torch.device("cpu")) == torch.device("cpu")
    assert made.backend == "gloo" and dist.cpu_group() is td.group.WORLD
    import os

    assert "NCCL_NVLS_ENABLE" not in os.environ


def test_check_config_takes_the_critic_and_fast_engine_and_refuses_odd_batches(monkeypatch):
    from danka.errors import UserError

    monkeypatch.setattr(dist, "world_size", lambda: 2)
    trainer = types.SimpleNamespace(batch_size=4, mini_batch_size=2, advantage_estimator="gae")
    rollout, speed = types.SimpleNamespace(compile=False), types.SimpleNamespace(compile=False)
    cfg = types.SimpleNamespace(trainer=trainer, rollout=rollout, speed=speed)
    dist.check_config(cfg, "fast")  # no refusal
    for section in (rollout, speed):  # compiled forwards: refused under torchrun
        section.compile = True
        with pytest.raises(UserError, match="compile is not supported with 2 processes"):
            dist.check_config(cfg, "fast")
        section.compile = False
    trainer.mini_batch_size = 3
    with pytest.raises(UserError, match=r"mini_batch_size \(3\) does not split over 2"):
        dist.check_config(cfg, "hf")


def test_measured_kl_is_global(nccl_like):
    # update() normalises by GLOBAL token counts: the loss term's KL on a rank is its share
    # (its KL sum / all ranks' tokens), so 2 ranks of 0.25 each measure 0.25 + 0.25 = 0.5
    assert dist.measured_kl(None, 0.25) == 0.5
    # the reward penalty's KL is a mean over a rank's own tokens: averaged, (0.25+0.25)/2
    assert dist.measured_kl(0.25, 9.0) == 0.25
    assert dist.measured_kl(None, None) is None


def test_measured_kl_on_one_process():
    assert dist.measured_kl(None, 0.25) == 0.25 and dist.measured_kl(0.5, None) == 0.5
