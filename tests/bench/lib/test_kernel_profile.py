"""Kernel names -> the classes of the profile tables in BENCHMARKS.md."""

import torch

from bench.lib.kernel_profile import kernel_class


def test_kernel_classes_of_real_h200_kernel_names():
    # names from a profiled rollout on an H200 (rollout.compile: true)
    fmha = "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel"
    assert kernel_class(fmha) == "attention"  # a CUTLASS kernel, but attention
    assert kernel_class("nvjet_sm90_tst_64x8_64x16_2x4_h_badd_TNT") == "gemm"
    fused = "triton_poi_fused__scaled_dot_product_efficient_attention_add_constant_pad_nd_4"
    assert kernel_class(fused) == "elementwise/other"  # inductor's pointwise kernel
    assert kernel_class("triton_per_fused__fused_rms_norm_0") == "norm/softmax/reduce"
    assert kernel_class("memcpy32_post") == "copy/cast/fill"


def test_host_ops_counts_calls_and_self_time_per_step():
    from torch.profiler import ProfilerActivity, profile

    from bench.lib.kernel_profile import host_ops

    a = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):  # two steps of 3 matmuls
            for _ in range(3):
                a @ a
    rows = {r["name"]: r for r in host_ops(prof, steps=2, top=5)}
    assert rows["aten::mm"]["calls"] == 3 and rows["aten::mm"]["self_ms"] > 0
