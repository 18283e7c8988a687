"""`danka data gsm8k` and `danka data inspect` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from danka.cli import main
from danka.models.tiny import save_tiny_model

ROOT = Path(__file__).resolve().parents[1]


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


def _gsm8k_file(path, n=250):
    path.write_text(
        "".join(
            json.dumps(
                {"question": f"Q{i}: what is {i} + 1?", "answer": f"{i}+1={i + 1}\n#### {i + 1}"}
            )
            + "\n"
            for i in range(n)
        )
    )
    return path


def test_data_gsm8k_prints_what_it_wrote_not_a_dict(tmp_path, capsys):
    src = _gsm8k_file(tmp_path / "train.jsonl", n=3)
    assert main(["data", "gsm8k", "--input", str(src), "--output", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert out == f"train: 3 rows -> {tmp_path / 'o'}/train.parquet and train.jsonl\n"


def test_data_seed_mini_writes_the_stories_200_rows(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _gsm8k_file(tmp_path / "train.jsonl")
    assert main(["data", "seed-mini", "--input", "train.jsonl"]) == 0
    assert "wrote 200 rows" in capsys.readouterr().out
    lines = (tmp_path / "mini_gsm8k.json").read_text().splitlines()
    rows = [json.loads(x) for x in lines]  # each line valid JSON (python -m json.tool)
    assert len(rows) == 200 and set(rows[0]) == {"prompt", "response", "reward"}
    assert rows[0] == {"prompt": "Q0: what is 0 + 1?", "response": "0+1=1\n#### 1", "reward": 1.0}
    # and the seed config reads it as its data.train_dataset
    from danka.config import load_config
    from danka.data.formats import Columns, load_prompt_rows

    cfg, _ = load_config(ROOT / "examples" / "single_card_ppo.yaml")
    d = cfg.data
    loaded = load_prompt_rows(
        d.train_dataset, Columns(d.format, d.prompt_key, d.response_key, d.reward_key, d.answer_key)
    ).rows
    assert len(loaded) == 200 and loaded[5].ground_truth == "6"


def test_data_seed_mini_bad_input(tmp_path, capsys):
    assert main(["data", "seed-mini"]) == 2
    assert "--input FILE or --from-hub" in capsys.readouterr().err
    bad = tmp_path / "x.jsonl"
    bad.write_text(json.dumps({"q": 1}) + "\n")
    assert main(["data", "seed-mini", "--input", str(bad), "--output", str(tmp_path / "m")]) == 2
    assert "not an official GSM8K row" in capsys.readouterr().err
