"""danka.trainer.budget: an explicit micro-batch the memory plan cannot fit is refused at
start-up (the plan is arithmetic on the model config: no GPU needed to test it)."""

import pytest
import yaml

from danka.config import load_config
from danka.errors import UserError
from danka.models.tiny import qwen2_7b_config
from danka.planning.memory import GIB, MARGIN, OVERHEAD_BYTES, estimate_memory
from danka.trainer.budget import planned_sizes


def _config(tmp_path, rollout=None, **trainer):
    """Qwen2-7B shape (known offline), GRPO + LoRA, 4 prompts x 4 samples, no checkpointing."""
    cfg = {
        "model": {"actor_model_name_or_path": "Qwen/Qwen2-7B-Instruct"},
        "trainer": {
            "algorithm": "grpo",
            "batch_size": 4,
            "samples_per_prompt": 4,
            "max_length": 1024,
            "max_new_tokens": 512,
            **trainer,
        },  # fmt: skip
        "data": {"train_dataset": "x.jsonl"},
        "rollout": {"engine": "hf", **(rollout or {})},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config(str(path), [])[0]


def _need(cfg) -> int:
    return estimate_memory(cfg, model_config=qwen2_7b_config())["peak"] + OVERHEAD_BYTES


def test_an_explicit_micro_batch_that_cannot_fit_is_refused_with_the_fixes(tmp_path):
    cfg = _config(tmp_path, micro_batch_size=16)  # 16 x 1024 tokens of full activations
    need = _need(cfg)
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
    need = _need(cfg)
    assert planned_sizes(cfg, need).size == 2  # fits exactly
    # over by less than the plan's margin of error: left to the out-of-memory retries
    assert planned_sizes(cfg, int(need / (1 + MARGIN / 2))).size == 2
    assert planned_sizes(cfg, None).size == 2  # a CPU run plans nothing


def test_tool_rollouts_are_not_checked(tmp_path):
    """The plan does not model multi-turn tool rollouts: it refuses nothing there."""
    cfg = _config(tmp_path, rollout={"tools": ["calculator"]}, micro_batch_size=16)
    assert planned_sizes(cfg, 24 * GIB).size == 16
