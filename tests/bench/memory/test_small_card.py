"""python -m bench small-card on CPU with a tiny model: the JSON a small-card run writes,
and the out-of-memory retries it counts."""

from __future__ import annotations

import json

import torch

from bench.memory import small_card


def _run(tmp_path, *args: str) -> dict:
    argv = ["--tiny", "--device", "cpu", "--steps", "2", "--out-dir", str(tmp_path)]
    assert small_card.main([*argv, "--name", "s", *args]) == 0
    return json.loads((tmp_path / "s.json").read_text())


def test_a_cpu_run_plans_no_memory_and_needs_no_retry(tmp_path):
    res = _run(tmp_path)
    # tiny PPO: 2 prompts x 1 sample = 2 sequences a mini-batch; a CPU takes the largest
    # divisor up to 8, so 2
    assert res["micro_batch_planned"] == res["micro_batch_final"] == 2
    assert res["plan"] == "micro-batch 2, log-prob chunk 1024 (auto: a CPU run, no memory plan)"
    assert res["planned_peak_gib"] is None and res["budget_gib"] is None
    assert res["steps"] == 2 and res["oom_retries"] == 0 and res["median_step_s"] > 0


def test_an_out_of_memory_in_the_update_is_counted_and_the_size_kept(tmp_path, monkeypatch):
    import danka.step.update as upd

    real = upd.actor_minibatch

    def flaky(models, algo, opt, mini, settings, micro_size, *rest):
        if micro_size > 1:
            raise torch.OutOfMemoryError("out of memory")
        return real(models, algo, opt, mini, settings, micro_size, *rest)

    monkeypatch.setattr(upd, "actor_minibatch", flaky)
    res = _run(tmp_path)
    assert res["micro_batch_planned"] == 2 and res["micro_batch_final"] == 1
    assert res["oom_retries"] == 1  # halved once, kept for step 2
    assert res["oom_lines"][0].startswith("out of memory in the update: micro_batch_size 2 -> 1")
