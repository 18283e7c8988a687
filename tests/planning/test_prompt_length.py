"""The plan prices the data's longest prompt (danka.planning.memory.prompt_tokens)."""

from __future__ import annotations

import json

import yaml

from danka.cli import main
from danka.config import load_config
from danka.models.tiny import qwen2_0_5b_config, save_tiny_model
from danka.planning.inputs import PlanInput
from danka.planning.memory import price
from danka.planning.shape import ModelShape


def _cfg(tmp_path, **data):
    raw = {
        "model": {"actor_model_name_or_path": "m"},
        "trainer": {"algorithm": "grpo", "batch_size": 4, "samples_per_prompt": 4,
                    "micro_batch_size": 4, "max_length": 1024, "max_new_tokens": 512},
        "data": {"train_dataset": "x.jsonl", **data},
        "speed": {"logprob_chunk_size": 1024},
    }  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(str(path), [])[0]


def _plan(inp):
    shape = ModelShape.of(qwen2_0_5b_config(), inp.target_modules, inp.lora_r)
    return price(inp.with_(generation_batch_size=16), shape)


def test_a_micro_batch_is_priced_at_the_longest_prompt_plus_new_tokens(tmp_path):
    cfg = _cfg(tmp_path)
    bound, data = _plan(PlanInput.of(cfg)), _plan(PlanInput.of(cfg, 100))
    a, b = bound.assumptions, data.assumptions
    assert (a.prompt_tokens, a.prompt_tokens_from, a.sequence_tokens) == (
        512, "data.max_prompt_length", 1024)  # fmt: skip
    assert (b.prompt_tokens, b.prompt_tokens_from, b.sequence_tokens) == (100, "data", 612)
    assert b.update_tokens_per_micro_batch == 4 * 612
    # activations are linear in the tokens of a micro-batch: 612 / 1024 of the bound's
    key = "activations (no checkpointing)"
    assert data.components[key] * 1024 == bound.components[key] * 612
    assert data.peak < bound.peak


def test_the_config_bound_caps_the_data_and_tools_keep_the_bound(tmp_path):
    cfg = _cfg(tmp_path, max_prompt_length=200)
    capped = _plan(PlanInput.of(cfg, 700)).assumptions  # longer rows are dropped or cut
    assert (capped.prompt_tokens, capped.prompt_tokens_from) == (200, "data")
    # a tool rollout grows its sequences turn by turn: the bound
    tools = _plan(PlanInput.of(cfg, 100).with_(tools=True)).assumptions
    assert (tools.prompt_tokens, tools.prompt_tokens_from) == (200, "data.max_prompt_length")


def test_estimate_reads_the_training_prompts(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "tiny", arch="qwen2")
    rows = [{"prompt": "one two"}, {"prompt": " ".join(["word"] * 40)}]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _cfg(tmp_path)  # writes c.yaml
    raw = yaml.safe_load((tmp_path / "c.yaml").read_text())
    raw["model"]["actor_model_name_or_path"] = str(model)
    raw["trainer"]["batch_size"] = 2
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert main(["estimate", str(tmp_path / "c.yaml"), "--gpu-memory", "24GB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    a = plan["assumptions"]
    assert a["prompt_tokens_from"] == "data" and 40 <= a["prompt_tokens"] < 512
    assert a["sequence_tokens"] == a["prompt_tokens"] + 512
    assert not list(tmp_path.glob("**/bad_rows.jsonl"))  # the estimate writes nothing
