"""Model FLOPs per phase (hand-worked) and the perf metrics built from them."""

from __future__ import annotations

import pytest

from danka.models.flops import Counts, perf_metrics, phase_flops


def test_phase_flops_by_hand():
    c = Counts(body=10, head=4, lora=1, total=15)
    # T = 6 + 4 = 10 tokens, R = 4; F = 2*10*10 + 2*4*4 + 2*1*10 = 200 + 32 + 20 = 252
    lora = phase_flops(c, prompt=6, response=4, sequences=2, logprob_passes=2, critic=True,
                       full=False)  # fmt: skip
    assert lora["logprobs"] == 2 * 252
    # critic forward 2*10*10 + 2*1*10 = 220; LoRA actor 2F + 2*1*10 = 524, critic 2*220 + 20
    assert lora["values"] == 220
    assert lora["update"] == 524 + 460
    # rollout: 2 (N + Nl) (P + G) + 2 Vh (G + S) = 2*11*10 + 2*4*6 = 268
    assert lora["rollout"] == 268
    full = phase_flops(Counts(10, 4, 0, 14), prompt=6, response=4, sequences=2,
                       logprob_passes=0, critic=False, full=True, epochs=2)  # fmt: skip
    assert full["update"] == 2 * 3 * (200 + 32) and full["logprobs"] == 0


def test_perf_metrics_divide_by_the_phase_seconds():
    out = perf_metrics({"update": 4e12, "values": 0.0, "logprobs": 1e12},
                       {"update": 2.0, "logprobs": 0.0}, peak=8e12)  # fmt: skip
    assert out == {"perf/update_tflops": pytest.approx(2.0), "perf/update_mfu": pytest.approx(0.25)}
    assert perf_metrics({"update": 4e12}, {"update": 2.0}, None) == {"perf/update_tflops": 2.0}
