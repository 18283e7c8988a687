"""`danka data gsm8k` and `danka data inspect` through the CLI."""

from __future__ import annotations

import json

import pandas as pd

from danka.cli import main
from danka.models.tiny import save_tiny_model


def test_data_gsm8k_writes_verl_parquet_and_jsonl(tmp_path, capsys):
    src = tmp_path / "train.jsonl"
    src.write_text(
        json.dumps({"question": "Ann has 2 pens and buys 3. How many?", "answer": "2+3=5\n#### 5"})
        + "\n"
        + json.dumps({"question": "What is 1,000 + 1?", "answer": "#### 1,001"})
        + "\n"
    )
    assert main(["data", "gsm8k", "--input", str(src), "--output", str(tmp_path / "out")]) == 0
    df = pd.read_parquet(tmp_path / "out" / "train.parquet")
    assert [r["ground_truth"] for r in df["reward_model"]] == ["5", "1001"]
    assert df["data_source"].tolist() == ["openai/gsm8k"] * 2
    assert len((tmp_path / "out" / "train.jsonl").read_text().splitlines()) == 2


def test_data_gsm8k_needs_an_input(tmp_path, capsys):
    assert main(["data", "gsm8k", "--output", str(tmp_path / "out")]) == 2
    assert "--input FILE or --from-hub" in capsys.readouterr().err


def test_data_inspect_shows_the_rendered_prompt(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "m")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "What is 2 + 3?", "answer": "5"}) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"model: {{actor_model_name_or_path: {model}}}\n"
        f"data: {{train_dataset: {rows}}}\ntrainer: {{max_length: 256}}\n"
    )
    assert main(["data", "inspect", str(cfg), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "<|im_start|>user\nWhat is 2 + 3?<|im_end|>" in out
    assert "eos:" in out and "<|im_end|>" in out and "ground truth '5'" in out
