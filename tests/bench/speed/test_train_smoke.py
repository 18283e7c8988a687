"""python -m bench train on CPU with tiny models: the sections run and report sane numbers."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bench.lib.danka_side import effective_token_ratio
from bench.speed import train
from bench.speed.packing import padded_batch


def test_tiny_sections_run_in_process(tmp_path):
    assert train.main([
        "--tiny", "--device", "cpu", "--only", "update_05b,logprob_memory,packing",
        "--update-variants", "mb4,mb2+gc", "--train-mode", "--out-dir", str(tmp_path),
        "--name", "b",
    ]) == 0  # fmt: skip
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["bench"] == "train" and result["environment"]["torch"]
    report = result["result"]
    secs = report["sections"]
    assert [s["status"] for s in secs.values()] == ["ok", "ok", "ok"], secs

    upd = secs["update_05b"]["results"]
    assert upd["tokens_per_step"] == 4 * (16 + 48)  # tiny: 4 sequences x (16 + 48) tokens
    for name, v in upd["variants"].items():
        assert "error" not in v, v
        assert v["tok_s"] > 0 and math.isfinite(v["mfu"]) and v["peak_gib"] is None  # CPU
        assert v["gc_active"] == name.endswith("+gc")  # --train-mode: checkpointing really runs

    lp = secs["logprob_memory"]["results"]
    # fp32 on CPU: the chunked head must equal the full log-softmax, values and gradients
    for k in ("chunked_eager", "chunked"):  # on a CPU both run eagerly
        assert max(lp[f"{k}_max_abs_diff"].values()) < 1e-4

    pk = secs["packing"]["results"]
    assert 0 < pk["padded_ratio"] <= pk["danka_ratio"] <= 1


def test_padded_batch_masks_give_the_hand_computed_ratio():
    # prompts of 2 and 1 tokens, responses of 1 and 3: one micro-batch pads to P=2, R=3,
    # real 2+1+1+3 = 7 of 2 x (2+3) = 10 -> 0.7; micro-batches of 1 trim each row -> 1.0
    batch = padded_batch(torch.tensor([2, 1]), torch.tensor([1, 3]), n=1)
    assert batch.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert batch.response_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert effective_token_ratio(batch, 8) == pytest.approx(0.7)
    assert effective_token_ratio(batch, 1) == pytest.approx(1.0)


def test_phase_timings_come_from_the_loop():
    # the bench reads time/<phase> from the loop's own clock (no monkeypatching)
    import time

    from danka.step.train_step import PhaseClock

    clock = PhaseClock()
    with clock("rollout"):
        time.sleep(0.01)
    with clock("rollout"):  # a phase entered twice adds up
        time.sleep(0.01)
    seconds = {**clock.seconds}
    assert set(seconds) == {"rollout"} and seconds["rollout"] >= 0.02

    r = clock.result(None, [], None, None, None, micro=4)
    assert r.seconds["step"] >= r.seconds["rollout"]
