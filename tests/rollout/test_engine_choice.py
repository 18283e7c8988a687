"""rollout.engine: auto resolves with a reason; engine options are typed (issue 12, 14)."""

from __future__ import annotations

import pytest
import torch

from danka.models.tiny import qwen2_7b_config
from danka.planning.engine import choose_engine
from danka.planning.memory import GIB
from danka.rollout.base import EngineOptions, SamplingParams, build_engine
from danka.schema.sections import DankaConfig

CUDA = torch.device("cuda")


def cfg(**rollout) -> DankaConfig:
    c = DankaConfig()
    c.model.actor_model_name_or_path = "Qwen/Qwen2-7B-Instruct"
    c.lora.enable_lora = True
    for k, v in rollout.items():
        setattr(c.rollout, k, v)
    return c


def test_explicit_engine_wins():
    assert choose_engine(cfg(engine="fast"), CUDA) == ("fast", "rollout.engine: fast")
    assert choose_engine(cfg(engine="hf"), torch.device("cpu"))[0] == "hf"


def test_the_tutorial_s_backend_switch_selects_hf():
    from danka.config.compat import config_notes
    from danka.config.load import config_from_dict

    data = {
        "model": {"actor_model_name_or_path": "Qwen/Qwen2-7B-Instruct"},
        "data": {"train_dataset": "x.jsonl"},
        "backend": {"hf_transformers": {"enable_hf_transformers": True}},
    }
    c = config_from_dict(data)
    assert c.rollout.engine == "hf"
    assert config_notes(c) == [
        "backend.hf_transformers.enable_hf_transformers: true is read as rollout.engine: hf "
        "(the HF generate rollout)"
    ]
    assert choose_engine(c, CUDA, free_bytes=200 * GIB) == ("hf", "rollout.engine: hf")


def test_cpu_and_quantised_use_hf():
    assert choose_engine(cfg(), torch.device("cpu"))[0] == "hf"
    c = cfg()
    c.model.load_in_4bit = True
    name, reason = choose_engine(c, CUDA, free_bytes=200 * GIB)
    assert name == "hf" and "quantised" in reason


def test_fast_only_when_the_estimated_step_fits_free_memory():
    c, config = cfg(), qwen2_7b_config()
    name, reason = choose_engine(c, CUDA, model_config=config, free_bytes=140 * GIB)
    assert name == "fast" and "fits" in reason
    name, reason = choose_engine(c, CUDA, model_config=config, free_bytes=15 * GIB)
    assert name == "hf" and "more than 15.0 GiB free" in reason


def test_hf_generation_batch_size_counts_sequences(monkeypatch):
    from danka.rollout.hf import HFGenerateEngine

    calls = []
    monkeypatch.setattr(
        HFGenerateEngine,
        "_generate_chunk",
        staticmethod(
            lambda model, part, params, *a: (
                calls.append(len(part)) or [[1]] * (len(part) * params.n)
            )
        ),
    )
    model = torch.nn.Linear(1, 1)
    engine = build_engine("hf", EngineOptions(generation_batch_size=8))
    engine.generate(model, [[1]] * 10, SamplingParams(n=4), eos_ids=[1], pad_id=0)
    assert calls == [2, 2, 2, 2, 2]  # 8 sequences = 2 prompts x 4 samples per call


def test_unknown_option_is_refused():
    from danka.errors import UserError

    # keep_cache: true asks the engine to keep a cache HF has not: refused, not ignored
    # (false and null are the default: tests/rollout/test_engine_registry.py)
    with pytest.raises(UserError, match="does not support"):
        build_engine("hf", EngineOptions(keep_cache=True))
    assert build_engine("fast", EngineOptions(keep_cache=False)).options.keep_cache is False
