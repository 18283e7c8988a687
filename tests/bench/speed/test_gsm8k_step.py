"""bench train --only gsm8k_step on a tiny model (CPU), the FLOP formula worked by hand, and
bench/gpu/speed.sh's commands against the benchmarks' own parsers."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from bench.memory import plan_check
from bench.peers import vs_trl
from bench.speed import rollout, step_variants, train
from danka.models import flops

ROOT = Path(__file__).resolve().parents[3]


def test_tiny_gsm8k_step_phases_profile_variants_and_plan(tmp_path):
    assert train.main([
        "--tiny", "--device", "cpu", "--only", "gsm8k_step", "--step-algos", "grpo",
        "--step-steps", "2", "--profile", "--step-variants", "base,mb2,fusednorm,full",
        "--out-dir", str(tmp_path), "--name", "s",
    ]) == 0  # fmt: skip
    res = json.loads((tmp_path / "s.json").read_text())
    sec = res["result"]["sections"]["gsm8k_step"]
    assert sec["status"] == "ok", sec
    g = sec["results"]["algos"]["grpo"]
    assert "error" not in g and "status" not in g, g
    # one algorithm: its goal numbers also at the file's top level
    assert {k: res[k] for k in ("median_step_s", "update_mfu", "peak_gib")} == {
        k: g[k] for k in ("median_step_s", "update_mfu", "peak_gib")
    }
    assert res["median_step_s"] > 0 and 0 < res["update_mfu"] < 1
    # tiny GRPO: 2 prompts x 4 samples; the example's LoRA r32; a CPU plans micro-batch 4
    assert g["sizes"]["micro_batch"] == 4 and g["lora"] and g["lora_r"] == 32
    assert [s["step"] for s in g["steps"]] == [1, 2] and g["steps"][1]["profiled"]
    ph = g["phases"]
    assert list(ph)[:4] == ["rollout", "reward", "logprobs", "values"]
    for phase in ("rollout", "logprobs", "update"):
        assert ph[phase]["s"] > 0 and ph[phase]["tok_s"] > 0 and ph[phase]["mfu"] > 0
    # the rollout's tokens are the generated ones; the trained phases' the real P + R
    rec = g["steps"][1]
    assert ph["rollout"]["tokens"] == rec["response_tokens"] <= 8 * 16
    assert ph["update"]["tokens"] == rec["prompt_tokens"] + rec["response_tokens"]
    assert rec["logprob_passes"] == 2  # pi_old (two optimizer steps) + pi_ref (KL 0.001)
    assert set(g["profile"]) == {"logprobs", "values", "update"}  # --profile-phases default
    assert g["profile"]["update"]["kind"] == "cpu_ops" and g["profile"]["update"]["kernels"]
    # the memory plan of the same config, read from `danka estimate --json`
    assert g["plan"]["peak_phase"] in ("rollout", "prepare", "update"), g["plan"]
    assert "vs_plan" not in g  # a CPU measures no peaks
    v = g["variants"]
    assert g["variants_on"] == {"sequences": 4, "of": 8}  # one mini-batch: 1 prompt x 4
    assert v["base"]["micro_batch"] == 4 and v["mb2"]["micro_batch"] == 2, v
    assert v["fusednorm"]["fused_norm"] and not v["base"]["fused_norm"], v
    assert v["full"]["full"] and v["full"]["phases"]["update"]["mfu_6nt"] > 0
    assert v["base"]["tokens"] == v["full"]["tokens"]  # every variant trains the same rows


def test_variant_names_parse():
    assert step_variants.parse_variant("mb32+gc") == {
        "micro": 32, "chunk": None, "gc": True, "graphs": False, "fusednorm": False,
        "full": False}  # fmt: skip
    assert step_variants.parse_variant("full+chunk512")["chunk"] == 512
    assert step_variants.parse_variant("mb64+graphs")["graphs"]
    assert not any(v for k, v in step_variants.parse_variant("base").items())
    with pytest.raises(ValueError, match="mbN, chunkN"):
        step_variants.parse_variant("micro8")


def test_flops_worked_by_hand():
    c = flops.Counts(body=100, head=10, lora=1, total=120)
    # forward: 2 N T + 2 Vh R + 2 Nl T = 2*100*7 + 2*10*3 + 2*1*7 = 1474 (T = 4 + 3, R = 3)
    assert flops.forward(c, 7, 3) == 1474
    lora = flops.phase_flops(c, prompt=4, response=3, sequences=2, logprob_passes=2,
                             critic=False, full=False)  # fmt: skip
    assert lora["logprobs"] == 2 * 1474
    assert lora["update"] == 2 * 1474 + 2 * 1 * 7  # input grads only + the adapter's grads
    assert lora["values"] == 0
    # rollout: 2 (N + Nl) (P + G) + 2 Vh (G + S) = 2*101*7 + 2*10*(3 + 2)
    assert lora["rollout"] == 1414 + 100
    full = flops.phase_flops(c, prompt=4, response=3, sequences=2, logprob_passes=1,
                             critic=True, full=True, epochs=2)  # fmt: skip
    assert full["update"] == 2 * (3 * 1474 + 3 * 2 * 100 * 7)  # actor + critic, 2 epochs
    assert flops.mfu(790e12, 1.0) == 1.0 and flops.mfu(1.0, None) is None
    assert flops.mfu_6nt(c, 10, 6 * 120 * 10 / 790e12) == pytest.approx(1.0)


def test_counts_of_tied_and_untied_models():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    kw = dict(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    untied = Qwen2ForCausalLM(Qwen2Config(**kw, tie_word_embeddings=False))
    c = flops.Counts.of(untied)
    everything = sum(p.numel() for p in untied.parameters())
    assert c.head == 50 * 8 and c.total == everything == c.body + 2 * 50 * 8 and c.lora == 0
    tied = flops.Counts.of(Qwen2ForCausalLM(Qwen2Config(**kw, tie_word_embeddings=True)))
    assert tied.body == c.body and tied.total == c.body + 50 * 8


def _commands(script: Path) -> list[tuple[str, list[str]]]:
    """Every ``python3 -m bench SUB ARGS`` of a driver script, its variables filled in."""
    text = re.sub(r"\\\n\s*", " ", script.read_text())
    subs = {"$GGUF": "/w/q.gguf", "$DATA": "data/gsm8k/train.jsonl", "$R": "bench/results",
            "${p}": "16", "$p": "16", "${v}": "lora", "$v": "lora", "$side": "180"}  # fmt: skip
    out = []
    for m in re.finditer(r"python3 -m bench (\S+) ([^\n]*)", text):
        line = m.group(2)
        for k, v in subs.items():
            line = line.replace(f'"{k}"', v).replace(k, v)
        out.append((m.group(1), [a.strip('"') for a in line.split()]))
    return out


def test_gpu_speed_script_commands_parse():
    script = ROOT / "bench" / "gpu" / "speed.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    parsers = {"train": train.parse, "rollout": rollout.parse, "trl": vs_trl.parse,
               "plan-check": plan_check.parse}  # fmt: skip
    cmds = _commands(script)
    assert [c for c, _ in cmds] == ["train", "train", "train", "rollout", "trl", "plan-check",
                                    "trl", "train"]  # fmt: skip
    for sub, argv in cmds:
        args = parsers[sub](argv)  # an unknown flag or a bad value exits here
        if sub == "train":
            for spec in (args.step_variants or "").split(","):
                step_variants.parse_variant(spec)
            assert set(args.only.split(",")) <= set(train.SECTIONS)


def test_tiny_random_update_counts_lora(tmp_path):
    assert train.main([
        "--tiny", "--device", "cpu", "--only", "update_05b", "--update-variants",
        "mb4,mb4+lora,mb4+fusednorm", "--out-dir", str(tmp_path), "--name", "u",
    ]) == 0  # fmt: skip
    res = json.loads((tmp_path / "u.json").read_text())["result"]["sections"]["update_05b"]
    v = res["results"]["variants"]
    assert v["mb4"]["lora"] is False and v["mb4+lora"]["lora"] is True, v
    assert v["mb4+fusednorm"]["fused_norm"] and "error" not in v["mb4+fusednorm"], v
    assert v["mb4+fusednorm"]["step_s"] > 0 and not v["mb4"]["fused_norm"]
    counts = res["results"]["counts"]
    assert counts["lora"]["lora"] > 0 == counts["full"]["lora"]
    b, p, r = 4, 16, 48  # tiny: 4 sequences x (16 + 48) tokens
    for kind, key in (("lora", "mb4+lora"), ("full", "mb4")):
        expect = flops.phase_flops(flops.Counts(**counts[kind]), prompt=b * p, response=b * r,
                                   sequences=b, logprob_passes=0, critic=False,
                                   full=kind == "full")["update"]  # fmt: skip
        assert v[key]["model_tflop"] * 1e12 == pytest.approx(expect)
        assert torch.isfinite(torch.tensor(v[key]["mfu_model"]))
