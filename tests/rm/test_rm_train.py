"""`danka rm`: a tiny classifier learns to rank chosen over rejected on held-out pairs, is
saved as a ClassifierReward with its reward mean/std, and bad input exits 2."""

from __future__ import annotations

import json
import os
import random

import pytest
import yaml

from danka.cli import main
from danka.models.tiny import save_tiny_model
from danka.rewards.model import ClassifierReward

GOOD, BAD = ("great", "correct", "yes"), ("awful", "wrong", "no")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_rm"))


def _pairs(path, n, seed):
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            prompt = f"Item {rng.randint(0, 999)}: rate it."
            # the answers differ only in a word from disjoint sets; answer order varies
            f.write(json.dumps({"prompt": prompt, "chosen": f"It is {rng.choice(GOOD)}.",
                                "rejected": f"It is {rng.choice(BAD)}."}) + "\n")  # fmt: skip
    return path


def _config(tmp_path, tiny, **over):
    cfg = {
        "model": {"actor_model_name_or_path": str(tiny), "device": "cpu"},
        "trainer": {
            "num_epochs": 2,
            "batch_size": 8,
            "micro_batch_size": 4,
            "max_length": 64,
            "lr": 3.0e-3,
            "eval_steps": 5,
        },  # fmt: skip
        "lora": {"lora_r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "data": {"train_dataset": "train.jsonl", "eval_dataset": "test.jsonl"},
        "rm": {"center_rewards_coefficient": 0.01},
        "output_dir": str(tmp_path / "out"),
    }
    for section, values in over.items():
        cfg[section].update(values)
    _pairs(tmp_path / "train.jsonl", 96, seed=0)
    _pairs(tmp_path / "test.jsonl", 24, seed=1)
    path = tmp_path / "rm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_tiny_rm_learns_to_rank_held_out_pairs_and_loads_as_classifier(tmp_path, tiny):
    assert main(["rm", str(_config(tmp_path, tiny))]) == 0
    out = tmp_path / "out"
    result = json.loads((out / "rm_result.json").read_text())
    assert result["n"] == 24 and result["steps"] == 24  # 96 pairs / 8 per step x 2 epochs
    assert result["accuracy"] >= 0.9 and result["margin"] > 0.5
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if "eval/accuracy" in e]
    assert [e["step"] for e in evals] == [0, 5, 10, 15, 20, 24]
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    assert "eval step 24 | accuracy" in (out / "logs" / "train.log").read_text()
    # the saved model: safetensors, merged (no adapter files), the trained head, mean/std
    files = {p.name for p in (out / "model").iterdir()}
    assert "model.safetensors" in files and "adapter_config.json" not in files
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["reward_mean"] == pytest.approx(result["mean"])
    assert config["reward_std"] == pytest.approx(result["std"])
    assert config["reward_max_length"] == 64  # trainer.max_length, used when it scores
    rm = ClassifierReward.from_pretrained(out / "model")  # refuses an untrained head
    assert rm.max_length == 64
    assert rm.tokenizer.truncation_side == "left"  # as trained: a long text keeps its end
    # scored as trained (64 tokens, the text's end): fresh pairs of every (good, bad) word,
    # items numbered like the training pairs' (mostly 3 digits), ranked right >= 80%
    combos = [(i, g, b) for i in (123, 456, 999) for g in GOOD for b in BAD]
    scores = rm([f"Item {i}: rate it." for i, _, _ in combos for _ in range(2)],
                [f"It is {w}." for _, g, b in combos for w in (g, b)])  # fmt: skip
    assert float((scores[0::2] > scores[1::2]).float().mean()) >= 0.8


def test_full_finetune_without_lora(tmp_path, tiny):
    path = _config(tmp_path, tiny, lora={"enable_lora": False},
                   trainer={"num_epochs": 1, "lr": 1.0e-3})  # fmt: skip
    old = os.umask(0o022)
    try:
        assert main(["rm", str(path)]) == 0
    finally:
        os.umask(old)
    result = json.loads((tmp_path / "out" / "rm_result.json").read_text())
    assert result["steps"] == 12 and result["accuracy"] > result["accuracy_before"] - 1e-9
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


def test_bad_pair_exits_2_with_file_line_and_writes_nothing(tmp_path, tiny, capsys):
    path = _config(tmp_path, tiny)
    with (tmp_path / "train.jsonl").open("a") as f:
        f.write(json.dumps({"prompt": "p", "chosen": "same", "rejected": "same"}) + "\n")
    assert main(["rm", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'train.jsonl'}:97" in err and "identical" in err
    assert not (tmp_path / "out" / "model").exists()
    # data.on_bad_row=skip: trains on the rest, the bad row goes to bad_rows.jsonl
    assert main(["rm", str(path), "data.on_bad_row=skip", "trainer.total_steps=1"]) == 0
    assert json.loads((tmp_path / "out" / "rm_result.json").read_text())["bad_rows"] == 1
    assert (tmp_path / "out" / "bad_rows.jsonl").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.kl.coef=0.1", "loss.kl.coef = 0.1 is not used by danka rm"),
        ("trainer.micro_batch_size=3", "not a multiple of micro_batch_size"),
        ("rm.center_rewards_coefficient=-1", "must be >= 0"),
        ("rm.rejected_key=chosen", "same column"),
        ("data.eval_size=4", "would use only one"),
    ],
)
def test_settings_rm_would_ignore_or_cannot_use_exit_2(tmp_path, tiny, capsys, override, message):
    assert main(["rm", str(_config(tmp_path, tiny)), override]) == 2
    assert message in capsys.readouterr().err


def test_no_held_out_pairs_is_refused(tmp_path, tiny, capsys):
    path = _config(tmp_path, tiny)
    assert main(["rm", str(path), "data.eval_dataset=null"]) == 2
    assert "needs held-out pairs" in capsys.readouterr().err


def test_the_example_config_is_a_valid_rm_config():
    from pathlib import Path

    from danka.config import load_config
    from danka.rm.train import check_rm_config

    example = Path(__file__).resolve().parents[2] / "examples" / "rm_gsm8k.yaml"
    cfg, _ = load_config(example, ["trainer.max_new_tokens=1"])  # as `danka rm` loads it
    check_rm_config(cfg)
    assert cfg.rm.center_rewards_coefficient == 0.01 and cfg.data.eval_dataset
