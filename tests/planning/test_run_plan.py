"""danka.planning.run_plan: the start-up plan in one call; an explicit micro-batch the
memory plan cannot fit is refused at start-up (the plan is arithmetic on the model config:
no GPU needed to test it)."""

import pytest

from danka.config import load_config
from danka.errors import UserError
from danka.models.tiny import qwen2_7b_config
from danka.planning import run_plan as budget
from danka.planning.inputs import PlanInput
from danka.planning.memory import GIB, MARGIN
from danka.planning.shape import ModelShape
from tests.planning.test_micro import _need


def _config(tmp_path, rollout=None, **trainer):
    """The planning tests' Qwen2-7B config with the HF engine (what the trainer prices
    explicit sizes with here), no checkpointing."""
    from tests.planning.test_micro import _config as planning_config

    planning_config(tmp_path, rollout={"engine": "hf", **(rollout or {})}, **trainer)
    return load_config(str(tmp_path / "c.yaml"), [])[0]


def planned_sizes(cfg, gpu_memory):
    inp = PlanInput.of(cfg)
    shape = ModelShape.of(qwen2_7b_config(), inp.target_modules, inp.lora_r)
    return budget.planned_sizes(cfg, gpu_memory, shape=shape)


def test_an_explicit_micro_batch_that_cannot_fit_is_refused_with_the_fixes(tmp_path):
    cfg = _config(tmp_path, micro_batch_size=16)  # 16 x 1024 tokens of full activations
    need = _need(PlanInput.of(cfg))
    assert need > 80 * GIB * (1 + MARGIN)
    with pytest.raises(UserError) as err:
        planned_sizes(cfg, 80 * GIB)
    text = str(err.value)
    assert (
        f"trainer.micro_batch_size 16 does not fit: the plan peaks at {need / GIB:.1f} GiB" in text
    )
    assert "of 80.0 GiB" in text and "in the update" in text
    # the fixes: what auto would pick, and a single change that fits (checkpointing)
    assert "trainer.micro_batch_size: auto (micro-batch" in text
    assert "model.use_gradient_checkpointing=true" in text


def test_an_explicit_micro_batch_that_fits_or_is_just_over_stands(tmp_path):
    cfg = _config(tmp_path, micro_batch_size=2)
    need = _need(PlanInput.of(cfg))
    assert planned_sizes(cfg, need).micro == 2  # fits exactly
    # over by less than the plan's margin of error: left to the out-of-memory retries
    assert planned_sizes(cfg, int(need / (1 + MARGIN / 2))).micro == 2
    assert planned_sizes(cfg, None).micro == 2  # a CPU run plans nothing


def test_tool_rollouts_are_not_checked(tmp_path):
    """The plan does not model multi-turn tool rollouts: it refuses nothing there."""
    cfg = _config(tmp_path, rollout={"tools": ["calculator"]}, micro_batch_size=16)
    assert planned_sizes(cfg, 24 * GIB).micro == 16


def test_a_cpu_run_is_planned_in_one_call_and_the_engine_checked_before_sizing(tmp_path):
    """On a CPU: nothing budgeted, no shape read, HF chosen (and why), the trainer's check
    called with it before the sizes (a refusal there stops the plan), the sizes as
    written."""
    import logging

    import torch

    cfg = _config(tmp_path, micro_batch_size=2)
    seen: list[str] = []
    plan = budget.plan_run(
        cfg, torch.device("cpu"), prompt_tokens=40, log=logging.getLogger("t"), check=seen.append
    )
    assert (plan.budget, plan.shape, plan.engine, plan.engine_memory) == (None, None, "hf", {})
    assert plan.engine_why == "rollout.engine: hf" and seen == ["hf"]
    assert plan.sizes.micro == 2

    def refuse(name: str) -> None:
        raise UserError(f"{name} refused", where="rollout.engine", fix="x")

    with pytest.raises(UserError, match="hf refused"):
        budget.plan_run(
            cfg, torch.device("cpu"), prompt_tokens=40, log=logging.getLogger("t"), check=refuse
        )
