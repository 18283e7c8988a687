"""bench.peers.vs_trl: TRL's GRPOTrainer vs `danka train` on the same settings (CPU smoke)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from bench.lib import danka_side
from bench.lib.gsm8k_data import GSM8K_EXAMPLE
from bench.peers import vs_trl

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("variant", ["lora", "full"])
def test_danka_side_config_is_valid_and_equal_to_the_trl_settings(tmp_path, variant):
    from danka.config import load_config

    args = SimpleNamespace(
        variant=variant, steps=3, prompts=8, generations=8, micro=16, new_tokens=256
    )
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in vs_trl.prompts(8)))
    raw = vs_trl.danka_config(args, "HuggingFaceTB/SmolLM2-135M-Instruct", data, tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg, _ = load_config(str(path), [])  # danka's own validation accepts it
    t = cfg.trainer
    assert (t.batch_size, t.samples_per_prompt, t.max_new_tokens) == (8, 8, 256)
    assert cfg.loss.kl.coef == 0.0 and cfg.model.use_gradient_checkpointing
    assert cfg.lora.enable_lora is (variant == "lora") and cfg.lora.lora_r == 16
    assert cfg.optim.lr == (2e-4 if variant == "lora" else 1e-5)


def test_reward_is_the_last_number_rule():
    done = [[{"role": "assistant", "content": "It is 12, no: 85"}], "85.", "85 or 86", ""]
    assert vs_trl.last_number_reward(done, answer=["85"] * 4) == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed")
def test_trl_and_danka_sides_one_json(tmp_path):
    cmd = [sys.executable, "-m", "bench", "trl", "--out-dir", str(tmp_path), "--name", "t"]
    cmd += ["--tiny", "--variants", "lora", "--prompts", "2", "--generations", "2"]
    cmd += ["--new-tokens", "8", "--micro", "4", "--steps", "2"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)
    res = json.loads((tmp_path / "t.json").read_text())
    sides = res["variants"]["lora"]["sides"]
    assert "error" not in sides["trl"] and "error" not in sides["danka"], sides
    assert len(sides["trl"]["step_s"]) == len(sides["danka"]["step_s"]) == 2
    ratio = res["variants"]["lora"]["trl_over_danka_step_time"]
    assert ratio == sides["trl"]["median_step_s"] / sides["danka"]["median_step_s"]
    assert sides["trl"]["trl"] and res["environment"]["torch"]


def test_danka_set_overrides_reach_danka_train_as_its_own_overrides(tmp_path):
    from danka.cli import build_parser
    from danka.config import load_config

    args = SimpleNamespace(
        variant="full", steps=3, prompts=8, generations=8, micro=16, new_tokens=256,
        danka_set=["rollout.keep_cache=false", "trainer.logprob_chunk_size=256"],
    )  # fmt: skip
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in vs_trl.prompts(8)))
    path = tmp_path / "c.yaml"
    raw = vs_trl.danka_config(args, "HuggingFaceTB/SmolLM2-135M-Instruct", data, tmp_path)
    path.write_text(yaml.safe_dump(raw))
    cmd = danka_side.danka_train_command(path, args.danka_set, eager_head=False)
    assert cmd[1:4] == ["-m", "danka", "train"]
    parsed = build_parser().parse_args(cmd[3:])  # what `danka train` sees
    cfg, _ = load_config(parsed.config, parsed.overrides)
    assert cfg.rollout.keep_cache is False  # YAML false, not the string "false"
    assert cfg.speed.logprob_chunk_size == 256 and cfg.trainer.batch_size == 8
    # the same CLI, the head's per-chunk work eager: a setting, not a patched global
    eager = danka_side.danka_train_command(path, args.danka_set, eager_head=True)
    assert eager[:-1] == cmd and eager[-1] == "speed.fused_logprob_head=false"
    cfg, _ = load_config(parsed.config, build_parser().parse_args(eager[3:]).overrides)
    assert cfg.speed.fused_logprob_head is False


def test_random_weights_copy_keeps_config_and_tokenizer(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from danka.models.tiny import save_tiny_model

    src = save_tiny_model(tmp_path / "src")
    out = vs_trl.save_random_copy(str(src), tmp_path / "random")
    a = AutoModelForCausalLM.from_pretrained(str(src))
    b = AutoModelForCausalLM.from_pretrained(str(out))
    assert a.config.num_hidden_layers == b.config.num_hidden_layers
    assert b.dtype == torch.bfloat16  # the benchmark's weights: bf16, random
    wa, wb = a.get_input_embeddings().weight, b.get_input_embeddings().weight.float()
    assert wa.shape == wb.shape and not torch.allclose(wa, wb)
    tok_a, tok_b = AutoTokenizer.from_pretrained(str(src)), AutoTokenizer.from_pretrained(str(out))
    assert tok_a.chat_template == tok_b.chat_template and len(tok_a) == len(tok_b)


def _gsm8k_args(tmp_path, variant: str, gc: str = "auto") -> SimpleNamespace:
    rows = tmp_path / "g.jsonl"
    rows.write_text("".join(json.dumps({"question": f"Tom has {i} apples. How many?",
                    "answer": f"He has {i}.\n#### {i}"}) + "\n" for i in range(4)))  # fmt: skip
    return SimpleNamespace(variant=variant, steps=3, prompts=2, generations=8, micro=8,
                           new_tokens=512, task="gsm8k", gc=gc, gsm8k_data=str(rows))  # fmt: skip


@pytest.mark.parametrize("variant", ["lora", "full"])
def test_gsm8k_task_is_the_examples_settings_on_both_sides(tmp_path, variant):
    from danka.config import load_config

    args = _gsm8k_args(tmp_path, variant)
    example, _ = load_config(str(GSM8K_EXAMPLE), [])
    raw = vs_trl.danka_config(args, "HuggingFaceTB/SmolLM2-135M-Instruct",
                              vs_trl.gsm8k_data(args), tmp_path)  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg, _ = load_config(str(path), [])  # danka's own validation accepts it
    assert cfg.data.format == "gsm8k" and cfg.data.instruction == example.data.instruction
    assert cfg.reward.functions[0].name == "gsm8k"
    assert cfg.reward.functions[0].kwargs == {"method": "strict", "format_score": 0.0}
    assert cfg.loss.kl.coef == example.loss.kl.coef and not cfg.model.use_gradient_checkpointing
    assert cfg.trainer.max_length == example.trainer.max_length
    z = vs_trl.settings(args)  # what the TRL side is given
    assert (z["beta"], z["gc"]) == (cfg.loss.kl.coef, False)
    assert z["lr"] == cfg.optim.lr == (example.optim.lr if variant == "lora" else 1e-6)
    if variant == "lora":
        assert (z["lora_r"], z["lora_alpha"]) == (cfg.lora.lora_r, cfg.lora.lora_alpha) == (32, 64)
    assert vs_trl.settings(_gsm8k_args(tmp_path, variant, gc="on"))["gc"] is True


def test_gsm8k_rows_and_strict_reward_as_danka_scores_them(tmp_path):
    args = _gsm8k_args(tmp_path, "lora")
    rows = vs_trl.trl_rows(args, 3)
    assert [r["answer"] for r in rows] == ["0", "1", "2"]
    (msg,) = rows[1]["prompt"]  # one user message: the question, then the instruction
    assert msg["role"] == "user" and msg["content"].startswith("Tom has 1 apples. How many? ")
    assert msg["content"].endswith(vs_trl.settings(args)["instruction"])
    done = [[{"role": "assistant", "content": "so #### 7"}], "#### 7.", "7", "#### 8 then #### 7"]
    assert vs_trl.gsm8k_strict_reward(done, answer=["7"] * 4) == [1.0, 0.0, 0.0, 1.0]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed")
def test_trl_and_danka_sides_gsm8k_task(tmp_path):
    args = _gsm8k_args(tmp_path, "lora")
    cmd = [sys.executable, "-m", "bench", "trl", "--out-dir", str(tmp_path), "--name", "t"]
    cmd += ["--tiny", "--task", "gsm8k", "--gsm8k-data", args.gsm8k_data, "--variants", "lora"]
    cmd += ["--prompts", "2", "--generations", "2", "--new-tokens", "8", "--micro", "4"]
    subprocess.run(cmd + ["--steps", "2"], cwd=ROOT, check=True, capture_output=True, timeout=900)
    res = json.loads((tmp_path / "t.json").read_text())
    assert res["task"] == "gsm8k" and res["batch"]["prompts"] == 2 and "partial" not in res
    sides = res["variants"]["lora"]["sides"]
    assert "error" not in sides["trl"] and "error" not in sides["danka"], sides
    assert len(sides["trl"]["rollout_s"]) == 2 and sides["trl"]["generated_tok_s"] > 0
    assert sides["danka"]["generated_tok_s"] > 0 and sides["trl"]["settings"]["beta"] == 0.001
