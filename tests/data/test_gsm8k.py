import json

import pyarrow.parquet as pq
import pytest

from danka.data.formats import load_prompt_rows
from danka.data.gsm8k import GSM8K_INSTRUCTION, convert_gsm8k, reference_answer
from danka.errors import UserError

# Hand-written rows in the official GSM8K layout (not read from ../shared).
OFFICIAL = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A shop sells 1,200 pens.", "answer": "It sells 1,200 pens.\n#### 1,200"},
    {"question": "Temperature drops 5 from 2.", "answer": "2-5=-3\n#### -3"},
]


@pytest.mark.parametrize(
    "text, expected",
    [("x\n#### 72", "72"), ("#### 1,234", "1234"), ("#### $5.50", "5.50"), ("#### -3", "-3")],
)
def test_extract_gsm8k_answer(text, expected):
    assert reference_answer(text) == expected


def test_extract_without_marker_raises():
    with pytest.raises(ValueError):
        reference_answer("the answer is 7")


def test_convert_writes_verl_layout_parquet_and_jsonl(tmp_path):
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in OFFICIAL))
    out = tmp_path / "out"
    summary = convert_gsm8k(input_path=src, from_hub=False, output_dir=out, limit=2)
    assert summary["splits"] == {"train": 2}
    assert sorted(p.name for p in out.iterdir()) == ["train.jsonl", "train.parquet"]
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert rows == [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    first = rows[0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["prompt"] == [
        {"role": "user", "content": OFFICIAL[0]["question"] + " " + GSM8K_INSTRUCTION}
    ]
    assert first["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert first["extra_info"] == {
        "split": "train",
        "index": 0,
        "answer": OFFICIAL[0]["answer"],
        "question": OFFICIAL[0]["question"],
    }
    assert rows[1]["reward_model"]["ground_truth"] == "1200"  # commas stripped
    # and the result loads back as verl rows
    loaded = load_prompt_rows(str(out / "train.parquet"))
    assert loaded.format == "verl" and [r.ground_truth for r in loaded.rows] == ["7", "1200"]


def test_convert_rejects_non_gsm8k_rows(tmp_path):
    src = tmp_path / "test.jsonl"
    src.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(UserError, match=f"{src}:1"):
        convert_gsm8k(input_path=src, from_hub=False, output_dir=tmp_path / "o", limit=None)
    with pytest.raises(UserError, match="exactly one"):
        convert_gsm8k(input_path=src, from_hub=True, output_dir=tmp_path / "o", limit=None)
