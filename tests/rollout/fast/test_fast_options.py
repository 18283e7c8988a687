"""The fast engine's settings: options and experiments apart, "auto" decided in one
function, and the geometry the memory plan prices is the engine's own."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch

from danka.errors import UserError
from danka.planning import memory
from danka.rollout.fast.engine import FastEngine
from danka.rollout.fast.options import (
    FastExperiments,
    FastOptions,
    FastPath,
    resolve_path,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_engine_takes_options_and_experiments_only():
    assert list(inspect.signature(FastEngine.__init__).parameters) == [
        "self",
        "options",
        "experiments",
    ]
    engine = FastEngine(FastOptions(batch_size=12), FastExperiments(seq_round=8))
    assert (engine.max_batch, engine.seq_round) == (12, 8)
    assert FastEngine().max_batch == 256  # batch_size 0: MAX_BATCH


def test_every_option_has_help():
    import dataclasses

    for f in dataclasses.fields(FastOptions):
        assert len(f.metadata["help"]) > 20, f.name


def test_the_memory_plan_prices_the_engine_s_geometry():
    engine = FastEngine()
    assert engine.seq_round == memory.SEQ_ROUND == 32
    assert engine.prefill_batch == memory.PREFILL_PROMPTS == 32


def test_auto_resolved_on_a_cpu_by_hand():
    # CPU: SDPA (triton needs CUDA), eager, small copies fused, lora auto = base, cache freed
    path = resolve_path(FastOptions(), FastExperiments(), CPU, copy_bytes=2**20)
    assert path == FastPath("sdpa", False, False, True, False, False, "base")
    assert path.line() == (
        "fast engine: sdpa attention, torch sampling, eager, fused weight copies, LoRA base, "
        "cache freed after each call"
    )
    # a 7B's copies (> 1 GiB) are read live; asked: kept cache, adapter path
    big = resolve_path(
        FastOptions(keep_cache=True, lora_compute="adapter"), FastExperiments(), CPU, 2**31
    )
    assert (big.fuse_weights, big.keep_cache, big.lora_compute) == (False, True, "adapter")


def test_auto_on_cuda_without_triton_is_sdpa_with_graphs(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "triton", None)
    monkeypatch.delitem(
        __import__("sys").modules, "danka.rollout.fast.triton_decode", raising=False
    )
    path = resolve_path(FastOptions(), FastExperiments(), CUDA, copy_bytes=0)
    assert (path.attention, path.fused_step, path.cuda_graphs) == ("sdpa", False, True)
    off = resolve_path(FastOptions(), FastExperiments(use_cuda_graph=False), CUDA, 0)
    assert not off.cuda_graphs


def test_paths_that_cannot_run_are_refused():
    with pytest.raises(UserError, match="merge keeps merged copies") as info:
        resolve_path(FastOptions(lora_compute="merge"), FastExperiments(), CPU, 2**31)
    assert info.value.where == "rollout.lora_compute"
    with pytest.raises(UserError) as info:
        FastOptions(lora_compute="fp8")
    assert info.value.where == "rollout.lora_compute"


def test_the_chosen_path_is_logged_once(caplog):
    from danka.rollout.base import SamplingParams
    from tests.rollout.fast.test_fast_engine import PROMPTS, tiny

    model, engine = tiny("llama"), FastEngine()
    params = SamplingParams(n=1, max_new_tokens=2)
    with caplog.at_level(logging.INFO, logger="danka.rollout"):
        for _ in range(2):  # the second call frees and re-reads the model: same path
            engine.generate(model, PROMPTS, params, eos_ids=[299], pad_id=0)
    lines = [r.message for r in caplog.records if r.message.startswith("fast engine:")]
    assert lines == [engine._path.line()]
