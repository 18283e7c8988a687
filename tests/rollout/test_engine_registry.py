"""Rollout engines by capability: typed options, ``auto``, refusals at start-up."""

import pytest
import torch

from danka.errors import UserError
from danka.rollout.base import (
    ROLLOUT_ENGINES,
    EngineMeta,
    EngineOptions,
    build_engine,
    engine_meta,
    register_engine,
    resolve_engine,
)


def test_auto_picks_by_capability():
    assert resolve_engine("auto", "cuda", quantized=False) == "fast"
    assert resolve_engine("auto", "cuda", quantized=True) == "hf"  # reads a bnb base
    assert resolve_engine("auto", "cpu", quantized=False) == "hf"
    with pytest.raises(UserError, match="cannot sample from a quantised"):
        resolve_engine("fast", "cuda", quantized=True)


def test_generation_batch_size_reaches_the_engine():
    assert build_engine("hf", EngineOptions(generation_batch_size=3)).batch_size == 3
    assert build_engine("hf").batch_size == 0  # not set: the engine's default


def test_compile_reaches_the_fast_engine_and_hf_refuses_it():
    assert build_engine("fast", EngineOptions(compile=True)).options.compile_step
    assert not build_engine("fast").options.compile_step
    with pytest.raises(UserError, match="rollout.compile is set") as info:
        build_engine("hf", EngineOptions(compile=True))
    assert info.value.where == "rollout.compile"


def test_an_option_the_engine_does_not_honour_is_refused():
    @register_engine("_test_plain", EngineMeta())
    class Plain:
        def __init__(self):
            pass

    try:
        assert isinstance(build_engine("_test_plain"), Plain)
        with pytest.raises(UserError) as info:
            build_engine("_test_plain", EngineOptions(generation_batch_size=8))
        assert "rollout.generation_batch_size is set (8)" in str(info.value)
        assert info.value.where == "rollout.generation_batch_size"
    finally:
        ROLLOUT_ENGINES._table.pop("_test_plain")
        ROLLOUT_ENGINES._meta.pop("_test_plain")


def test_engines_declare_logprob_reporting():
    assert engine_meta("fast").reports_logprobs and not engine_meta("hf").reports_logprobs
    assert engine_meta("vllm").reports_logprobs
    with pytest.raises(UserError, match="unknown rollout engine 'sglang'"):
        build_engine("sglang")


def test_decode_attention_reaches_the_fast_engine_and_is_validated(monkeypatch):
    assert build_engine("fast").options.attention == "auto"
    assert build_engine("fast", EngineOptions(decode_attention="sdpa")).options.attention == "sdpa"
    with pytest.raises(UserError, match="not a decode attention kernel") as info:
        build_engine("fast", EngineOptions(decode_attention="flash"))
    assert info.value.where == "rollout.decode_attention"
    # HF generate has no such setting: refused, never silently ignored
    with pytest.raises(UserError, match="rollout.decode_attention is set"):
        build_engine("hf", EngineOptions(decode_attention="triton"))
    # without the triton package: one message saying how to get it (None in sys.modules
    # makes `import triton` raise ImportError, as on a CPU build of torch)
    monkeypatch.setitem(__import__("sys").modules, "triton", None)
    monkeypatch.delitem(
        __import__("sys").modules, "danka.rollout.fast.triton_decode", raising=False
    )
    with pytest.raises(UserError, match="needs the triton package") as info:
        build_engine("fast", EngineOptions(decode_attention="triton"))
    assert "pip install triton" in info.value.fix
    # auto never fails for a missing triton: SDPA, on any device
    from danka.rollout.fast.options import resolve_attention

    assert resolve_attention("auto", torch.device("cuda")) == "sdpa"
    assert resolve_attention("auto", torch.device("cpu")) == "sdpa"
    assert resolve_attention("sdpa", torch.device("cuda")) == "sdpa"


@pytest.mark.parametrize("value", [None, False])
def test_keep_cache_false_is_the_default_everywhere(value):
    """Before: false (the documented default) was refused by the HF engine, after the
    model had loaded; None and False mean the same for every engine (keeps_cache)."""
    build_engine("hf", EngineOptions(keep_cache=value))


def test_keep_cache_true_on_the_hf_engine_is_refused_by_the_config_check(tmp_path):
    from danka.config import load_config
    from tests.config.bad_config import BASE, write_config

    path = write_config(tmp_path, BASE + "rollout:\n  engine: hf\n  keep_cache: false\n")
    load_config(path)
    with pytest.raises(UserError, match="does not support it") as err:
        load_config(path, ["rollout.keep_cache=true"])
    assert "rollout.keep_cache" in str(err.value) and "#1" in str(err.value)
    with pytest.raises(UserError, match="rollout.compile"):  # every engine option alike
        load_config(path, ["rollout.compile=true"])
    load_config(path, ["rollout.engine=fast", "rollout.keep_cache=true"])


def test_keep_cache_true_where_auto_picks_hf_is_refused_before_the_model_loads(tmp_path):
    import logging

    from danka.config import load_config
    from danka.planning.run_plan import plan_run
    from danka.trainer.components import check_engine
    from tests.config.bad_config import write_config

    cfg, _ = load_config(write_config(tmp_path), ["rollout.keep_cache=true"])  # engine auto
    with pytest.raises(UserError, match="rollout.keep_cache is set"):
        plan_run(
            cfg,
            torch.device("cpu"),
            prompt_tokens=None,
            log=logging.getLogger("test"),
            check=lambda name: check_engine(cfg, name),
        )
