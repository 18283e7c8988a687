"""The fast engine with ``rollout.decode_attention: triton`` (danka/rollout/fast/triton_decode.py)
against the same engine with SDPA: same tokens, log-probs to float rounding.

On a GPU the kernel is compiled; on a CPU it runs under Triton's interpreter (set before
triton is first imported, so run this file alone there:
``PYTHONPATH=/path/to/triton:. python -m pytest -q tests/rollout/fast/test_fast_triton.py``).
Skipped where triton is not importable (CI).
"""

import pytest
import torch

from .triton_setup import triton_device

DEVICE = triton_device()  # before danka's kernel imports triton

from danka.errors import UserError  # noqa: E402
from danka.rollout.base import SamplingParams  # noqa: E402
from danka.rollout.fast.engine import FastEngine  # noqa: E402
from danka.rollout.fast.options import FastExperiments, FastOptions  # noqa: E402

from .test_fast_engine import fast_run, tiny  # noqa: E402


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen2-untied"])
def test_triton_attention_equals_sdpa_left_padded(kind):
    # fp32 tiny models (GQA 4 query / 2 KV heads); prompts of 7, 2, 4 and 1 tokens, so the
    # rows start at different cache slots (the kernel reads `start` instead of a mask)
    model = tiny(kind).to(DEVICE)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=12)
    ref = fast_run(
        model,
        params,
        FastEngine(FastOptions(attention="sdpa"), FastExperiments(use_cuda_graph=False)),
        eos=(),
    )
    engine = FastEngine(FastOptions(attention="triton"), FastExperiments(use_cuda_graph=False))
    got = fast_run(model, params, engine, eos=())
    assert len(set(ref.response_ids.flatten().tolist())) > 4  # a non-degenerate reference
    assert got.response_ids.tolist() == ref.response_ids.tolist()
    torch.testing.assert_close(got.rollout_logprobs, ref.rollout_logprobs, atol=1e-4, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("compile_step", [False, True])
def test_triton_attention_in_one_cuda_graph_for_every_step(compile_step):
    """The kernel reads the live bound from the device, so ONE graph (over the whole
    capacity) serves every step whatever live_chunk says; eager or torch.compile'd layer
    (the kernel is an opaque custom op there), fused step or not: the tokens of the eager
    SDPA engine."""
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA GPU")
    model = tiny("qwen2").cuda()
    params = SamplingParams(n=3, temperature=0.0, max_new_tokens=40)
    plain = FastEngine(
        FastOptions(attention="sdpa"), FastExperiments(use_cuda_graph=False, live_chunk=0)
    )
    eager = fast_run(model, params, plain, eos=())
    engine = FastEngine(
        FastOptions(compile_step=compile_step, attention="triton"), FastExperiments(live_chunk=16)
    )
    graphed = fast_run(model, params, engine, eos=())
    assert engine.stats["graphs_captured"] == 1
    assert engine._path.fused_step is not compile_step  # compile runs the unfused layer
    assert graphed.response_ids.tolist() == eager.response_ids.tolist()
    torch.testing.assert_close(graphed.rollout_logprobs, eager.rollout_logprobs, atol=1e-4, rtol=0)
    bf16 = tiny("llama").to("cuda", torch.bfloat16)  # the dtype runs use: close, not equal
    sampled = SamplingParams(n=4, temperature=1.0, max_new_tokens=24)
    sdpa, auto = (
        FastEngine(FastOptions(attention="sdpa")),
        FastEngine(),
    )  # auto: triton on a CUDA model
    a = fast_run(bf16, sampled, sdpa, eos=(), generator=torch.Generator().manual_seed(1))
    b = fast_run(bf16, sampled, auto, eos=(), generator=torch.Generator().manual_seed(1))
    assert (sdpa._path.attention, auto._path.attention) == ("sdpa", "triton")
    same = (a.response_ids == b.response_ids).float().mean().item()
    assert same > 0.9, same  # bf16 rounding may flip a late sampled token, not most


def test_triton_attention_refuses_a_cpu_model_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=2)
    with pytest.raises(UserError, match="runs on a CUDA GPU") as info:
        fast_run(tiny("llama"), params, FastEngine(FastOptions(attention="triton")), eos=())
    assert info.value.fix == "set rollout.decode_attention: sdpa"
