"""danka.trainer.optim: the AdamW kernel choice and the learning-rate schedule."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as td

from danka.trainer.optim import adamw_kernel, build_optimizer, build_scheduler


@pytest.fixture
def one_rank_group(tmp_path):
    td.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield
    td.destroy_process_group()


def _mixed_params():
    """What FSDP2 leaves under torchrun: sharded layers (DTensor) next to whole tensors
    (embeddings, final norm, lm_head, value head)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    sharded = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
    whole = torch.nn.Parameter(torch.ones(3))
    for p in (sharded, whole):
        p.grad = torch.ones_like(p)
    return [sharded, whole]


def test_a_dtensor_and_tensor_mix_takes_the_per_tensor_adamw(one_rank_group):
    params = _mixed_params()
    # the failure found on 2 x H200 (full-parameter and PPO under torchrun): torch's fused
    # AdamW refuses the mix (reproduced here with the CPU fused kernel)
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        torch.optim.AdamW(params, lr=0.1, fused=True).step()
    assert adamw_kernel(params) == {"foreach": False, "fused": False}
    opt = build_optimizer(params, lr=0.1, weight_decay=0.0)
    assert len(opt.param_groups) == 1  # the checkpoint layout of one process
    opt.step()
    # Adam's first step moves every element by lr (m / sqrt(v) = g / |g| = 1): 1 - 0.1
    assert torch.allclose(params[1].detach(), torch.full((3,), 0.9))
    assert torch.allclose(params[0].full_tensor().detach(), torch.full((4, 2), 0.9))


def test_plain_cpu_params_keep_torch_defaults():
    assert adamw_kernel([torch.nn.Parameter(torch.ones(2))]) == {}
    assert adamw_kernel([]) == {}


def test_linear_warmup_then_cosine_to_zero():
    p = torch.nn.Parameter(torch.ones(1))
    opt = build_optimizer([p], lr=1.0, weight_decay=0.0)
    sched = build_scheduler(opt, kind="cosine", warmup_steps=2, total_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    # warm-up (s+1)/2: 0.5, 1.0; then 0.5 (1 + cos(pi (s-2)/4)) for s = 2..5: 1, 0.854, 0.5, 0.146
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.8535534, 0.5, 0.1464466])
