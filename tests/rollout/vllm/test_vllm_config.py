"""The vllm engine from the config: the seed's ``backend.vllm.enable_vllm: true`` picks it;
missing vLLM, a torch pin it does not match or no GPU is exit 2 with what to do; the memory
plan holds its share in every phase and hands it to vLLM as gpu_memory_utilization; auto
picks it only where the speed table says so."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from danka.config import load_config
from danka.errors import UserError
from danka.models.tiny import qwen2_0_5b_config
from danka.planning import vllm as plan_vllm
from danka.planning.engine import choose_engine
from danka.planning.inputs import PlanInput
from danka.planning.memory import GIB, estimate_memory
from danka.planning.micro import plan_memory
from danka.planning.shape import ModelShape
from danka.rollout.base import EngineOptions, build_engine
from danka.rollout.vllm.calls import check_vllm, torch_pin_problem
from danka.rollout.vllm.memory import RESERVE_BYTES, vllm_share
from danka.schema.sections import DankaConfig
from tests.rollout.vllm import fake_vllm

CUDA = torch.device("cuda")
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
ENABLE = "backend.vllm.enable_vllm=true"
BASE = [f"model.actor_model_name_or_path={QWEN}", "data.task=arithmetic"]


def cfg(**over) -> DankaConfig:
    c = DankaConfig()
    c.model.actor_model_name_or_path = QWEN
    c.trainer.batch_size, c.trainer.samples_per_prompt = 8, 8
    c.trainer.max_new_tokens, c.trainer.max_length = 512, 768
    for dotted, value in over.items():
        section, key = dotted.split("__")
        setattr(getattr(c, section), key, value)
    return c


def no_vllm(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a)
    )


def test_seed_switch_maps_to_the_vllm_engine(monkeypatch):
    fake_vllm.install(monkeypatch)
    c, _ = load_config(None, [*BASE, ENABLE])
    name, reason = choose_engine(c, CUDA, free_bytes=100 * GIB)
    assert name == "vllm" and reason == "backend.vllm.enable_vllm: true"
    assert choose_engine(cfg(rollout__engine="vllm"), CUDA)[0] == "vllm"


def test_missing_vllm_is_exit_2_with_the_install_hint(monkeypatch):
    no_vllm(monkeypatch)
    c = cfg()
    c.backend.vllm.enable_vllm = True
    with pytest.raises(UserError) as info:
        choose_engine(c, CUDA, free_bytes=100 * GIB)
    assert info.value.exit_code == 2 and "not installed" in str(info.value)
    assert "pip install 'danka[vllm]'" in info.value.fix


def test_no_gpu_and_torch_pin_are_refused(monkeypatch):
    fake_vllm.install(monkeypatch)
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        check_vllm("cpu")
    assert torch_pin_problem(["torch==2.11.0", "numba==0.65.0"], "2.11.0+cu130") is None
    problem = torch_pin_problem(["torch==2.11.0"], "2.13.0+cpu")
    assert problem == "vllm needs torch==2.11.0, this environment has torch 2.13.0+cpu"
    assert torch_pin_problem(['zentorch==2.11.0.0; extra == "zen"'], "2.13.0") is None
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: ["torch==2.11.0"])
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    with pytest.raises(UserError, match="needs torch==2.11.0") as info:
        check_vllm("cuda")
    assert "danka[vllm]" in info.value.fix


def test_enable_vllm_conflicts_with_another_engine():
    for over in (["rollout.engine=hf"], ["backend.hf_transformers.enable_hf_transformers=true"]):
        with pytest.raises(UserError, match="set only one of them"):
            load_config(None, [*BASE, ENABLE, *over])


def test_plan_holds_vllms_share_in_every_phase():
    config = qwen2_0_5b_config()
    fast = estimate_memory(cfg(rollout__engine="fast"), model_config=config)
    vllm = estimate_memory(cfg(rollout__engine="vllm", rollout__keep_cache=True),
                           model_config=config)  # fmt: skip
    share = vllm.vllm_share
    assert fast.vllm_share is None and vllm.assumptions.rollout_engine == "vllm"
    # 64 sequences x 768 tokens (48 blocks of 16) x 24 layers x 2 x 128 x 2 bytes
    assert share.kv_cache == 24 * 2 * 128 * 2 * 64 * 768
    assert share.weights == vllm.components["weights"]  # its own copy of the base
    held = vllm.components["vLLM weights + work (held)"] + share.kv_cache
    assert held == share.total
    for phase in ("prepare", "update"):  # held through the update: kept awake
        assert vllm.phases[phase] - fast.phases[phase] == pytest.approx(share.total)
    assert vllm.phases["rollout"] >= vllm.persistent + share.total


def test_a_sleeping_vllm_holds_only_its_graphs_and_buffers_through_the_update():
    config = qwen2_0_5b_config()
    fast = estimate_memory(cfg(rollout__engine="fast"), model_config=config)
    awake = estimate_memory(cfg(rollout__engine="vllm", rollout__keep_cache=True),
                            model_config=config)  # fmt: skip
    asleep = estimate_memory(cfg(rollout__engine="vllm"), model_config=config)  # the default
    also = estimate_memory(cfg(rollout__engine="vllm", rollout__keep_cache=False),
                           model_config=config)  # fmt: skip
    share = asleep.vllm_share
    assert share == awake.vllm_share  # the same engine while it generates
    assert asleep.phases == also.phases  # null and false: both asleep
    assert asleep.phases["rollout"] == awake.phases["rollout"]
    # the work: a 1 GiB reserve + transients (activations, logits) the update reuses
    assert share.work > RESERVE_BYTES and share.asleep == RESERVE_BYTES
    for phase in ("prepare", "update"):  # weights, KV cache and transients given back
        assert asleep.phases[phase] - fast.phases[phase] == pytest.approx(RESERVE_BYTES)
        assert awake.phases[phase] - asleep.phases[phase] == pytest.approx(
            share.weights + share.kv_cache + share.work - RESERVE_BYTES
        )


def test_engine_gets_gpu_memory_utilization_from_the_plan(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * GIB, 140 * GIB))
    c = cfg()
    shape = ModelShape.of(qwen2_0_5b_config(), c.lora.target_modules, c.lora.lora_r)
    opts = plan_vllm.engine_memory(
        c, plan_memory(PlanInput.of(c), shape, 100 * GIB).sizes, shape, CUDA
    )
    share = estimate_memory(cfg(rollout__engine="vllm"), model_config=qwen2_0_5b_config())
    total = share.vllm_share.total
    assert opts["max_model_len"] == 768
    assert total / (140 * GIB) <= opts["gpu_memory_fraction"] < total / (140 * GIB) + 0.001
    fake = build_engine("vllm", EngineOptions(generation_batch_size=64, **opts))
    assert fake.gpu_memory_utilization == opts["gpu_memory_fraction"]
    assert fake.max_model_len == 768 and fake.max_num_seqs == 64
    c.eval.max_new_tokens = 1024  # evaluation answers longer: vLLM must hold its sequences
    opts = plan_vllm.engine_memory(
        c, plan_memory(PlanInput.of(c), shape, 100 * GIB).sizes, shape, CUDA
    )
    assert opts["max_model_len"] == 256 + 1024


def test_auto_picks_vllm_only_where_the_table_says(monkeypatch):
    fake_vllm.install(monkeypatch)
    c, config = cfg(), qwen2_0_5b_config()
    assert choose_engine(c, CUDA, model_config=config, free_bytes=100 * GIB)[0] == "fast"
    row = plan_vllm.FasterAt(("qwen2",), 64, 512, None, "bench/results/example.json, H200")
    monkeypatch.setattr(plan_vllm, "VLLM_FASTER_AT", (row,))
    name, reason = choose_engine(c, CUDA, model_config=config, free_bytes=100 * GIB)
    assert name == "vllm" and "example.json" in reason
    no_vllm(monkeypatch)  # not installed: the table does not apply
    assert choose_engine(c, CUDA, model_config=config, free_bytes=100 * GIB)[0] == "fast"


def test_danka_train_with_enable_vllm_on_a_cpu_exits_2_before_loading(tmp_path, capsys):
    from danka.cli import main
    from danka.logging.runlog import close_run_logger
    from danka.models.tiny import save_tiny_model
    from tests.trainer.conftest import make_config

    model = save_tiny_model(tmp_path / "model")
    config = make_config(tmp_path, model, backend={"vllm": {"enable_vllm": True}})
    try:
        code = main(["train", str(config), "--output-dir", str(tmp_path / "out")])
    finally:
        close_run_logger()
    assert code == 2
    err = capsys.readouterr().err
    assert "rollout.engine: vllm needs a CUDA GPU" in err and "fix:" in err


def test_vllms_work_is_priced_at_the_tokens_it_batches():
    from danka.models.dims import dims

    d = dims(qwen2_0_5b_config())
    # 4 sequences x 100 tokens: vLLM batches 400 tokens at once, not 8192
    share = vllm_share(d, dtype_bytes=2, weight_bytes=0, sequences=4, max_model_len=100)
    per_token = 2 * (3 * d["H"] + d["q"] + 2 * d["kv"] + 3 * d["I"])
    assert share.work == 400 * per_token + 4 * d["V"] * 4 * 3 + RESERVE_BYTES
