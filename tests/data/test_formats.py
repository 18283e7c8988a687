import json

import pandas as pd
import pytest

from danka.data.formats import (
    Columns,
    ReadOptions,
    detect_format,
    load_prompt_rows,
    to_prompt_row,
)
from danka.errors import UserError

GSM_ANSWER = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 1,072"
VERL_ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "How many? Let's think"}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "72"},
    "extra_info": {"split": "train", "index": 0},
}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_seed_format_ground_truth_from_response_and_reward_in_extra():
    row = to_prompt_row({"prompt": "Q?", "response": GSM_ANSWER, "reward": 0.3}, 4, "f:5")
    assert (row.index, row.prompt, row.ground_truth) == (4, "Q?", "1072")
    assert row.data_source == "openai/gsm8k"  # a '####' answer picks the GSM8K rule reward
    assert row.extra["reward"] == 0.3 and row.extra["response"] == GSM_ANSWER


def test_seed_format_custom_keys_and_answer_key():
    record = {"q": "Q?", "r": "no hashes here", "score": 1, "gold": 7}
    row = to_prompt_row(record, 0, "f:1", Columns("seed", prompt_key="q", response_key="r"))
    assert row.ground_truth is None and row.data_source == "unknown"
    row = to_prompt_row(record, 0, "f:1", Columns("seed", prompt_key="q", answer_key="gold"))
    assert row.ground_truth == "7"


def test_trl_string_and_messages_extra_columns_and_answer():
    row = to_prompt_row({"prompt": "Q?", "solution": "42", "level": 3}, 0, "f:1")
    assert row.ground_truth == "42" and row.extra == {"solution": "42", "level": 3}
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Q?"}]
    row = to_prompt_row({"prompt": msgs, "answer": GSM_ANSWER}, 1, "f:2", Columns("trl"))
    assert row.prompt == msgs and row.ground_truth == "1072"
    assert row.data_source == "openai/gsm8k"


def test_verl_format():
    row = to_prompt_row(VERL_ROW, 2, "f:row 2")
    assert row.prompt == VERL_ROW["prompt"] and row.ground_truth == "72"
    assert row.data_source == "openai/gsm8k"
    assert row.extra["ability"] == "math" and row.extra["extra_info"]["index"] == 0


def test_gsm8k_raw_format():
    row = to_prompt_row({"question": "How many?", "answer": GSM_ANSWER}, 0, "f:1")
    assert (row.prompt, row.ground_truth, row.data_source) == ("How many?", "1072", "openai/gsm8k")


@pytest.mark.parametrize(
    "record, expected",
    [
        (VERL_ROW, "verl"),
        ({"question": "q", "answer": "a"}, "gsm8k"),
        ({"prompt": "p", "response": "r", "reward": 1.0}, "seed"),
        ({"prompt": "p", "answer": "a"}, "trl"),
        ({"text": "p"}, None),
    ],
)
def test_auto_detection(record, expected):
    assert detect_format(record) == expected


@pytest.mark.parametrize(
    "record, reason",
    [
        ({"text": "p", "response": "r"}, "missing 'prompt'"),
        ({"prompt": 12, "response": "r"}, "must be a string or a list of chat messages, got int"),
        ({"prompt": [{"content": "hi"}], "response": "r"}, "prompt[0] must be an object"),
        ({"prompt": [{"role": "user"}], "response": "r"}, "needs a string 'content'"),
        ({"prompt": "", "response": "r"}, "empty string"),
    ],
)
def test_bad_rows_name_location_reason_and_keys(record, reason):
    with pytest.raises(UserError) as err:
        to_prompt_row(record, 0, "mini.json:7", Columns("seed"))
    text = str(err.value)
    assert text.startswith("mini.json:7:") and reason in text
    assert f"has keys {sorted(record)}" in text and "on_bad_row" in text


def test_load_each_format_from_files(tmp_path):
    seed = _jsonl(
        tmp_path / "mini_gsm8k.json", [{"prompt": "Q", "response": GSM_ANSWER, "reward": 0.1}]
    )
    verl = tmp_path / "train.parquet"
    pd.DataFrame([VERL_ROW, VERL_ROW]).to_parquet(verl)
    raw = _jsonl(tmp_path / "train.jsonl", [{"question": "Q", "answer": GSM_ANSWER}])
    assert load_prompt_rows(seed).format == "seed"
    got = load_prompt_rows(str(verl))
    assert got.format == "verl" and [r.ground_truth for r in got.rows] == ["72", "72"]
    assert got.rows[1].prompt == VERL_ROW["prompt"]  # parquet structs come back as dicts
    assert load_prompt_rows(raw).rows[0].ground_truth == "1072"


def test_detection_once_per_file_gives_precise_error_for_a_later_row(tmp_path):
    path = _jsonl(
        tmp_path / "d.jsonl", [{"prompt": "a", "response": "r"}, {"promt": "b", "response": "r"}]
    )
    with pytest.raises(UserError) as err:
        load_prompt_rows(path)
    assert f"{path}:2" in str(err.value) and "missing 'prompt'" in str(err.value)
    assert "(seed format)" in str(err.value)


def test_undetectable_file(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    with pytest.raises(UserError, match="cannot detect the data format.*'text'"):
        load_prompt_rows(path)


def test_skip_writes_bad_rows_jsonl_and_counts(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": 3}\nnot json\n{"prompt": "b"}\n')
    bad_path = tmp_path / "out" / "bad_rows.jsonl"
    got = load_prompt_rows(str(path), read=ReadOptions("skip", bad_path))
    assert [r.prompt for r in got.rows] == ["a", "b"] and got.n_bad == 2
    bad = [json.loads(line) for line in bad_path.read_text().splitlines()]
    assert {b["location"] for b in bad} == {f"{path}:2", f"{path}:3"}
    assert any("got int" in b["reason"] for b in bad) and any(
        "invalid JSON" in b["reason"] for b in bad
    )


def test_skip_with_all_rows_bad_is_an_error(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": 1}, {"prompt": None}])
    with pytest.raises(UserError, match="all 2 rows are bad"):
        load_prompt_rows(path, Columns("trl"), ReadOptions("skip", tmp_path / "bad.jsonl"))


def test_limit_counts_good_rows(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": p} for p in "abcde"])
    got = load_prompt_rows(path, read=ReadOptions(limit=3))
    assert [r.prompt for r in got.rows] == ["a", "b", "c"] and [r.index for r in got.rows] == [
        0,
        1,
        2,
    ]


def test_unknown_format_and_policy(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}])
    with pytest.raises(UserError, match="unknown data format"):
        load_prompt_rows(path, Columns("alpaca"))
    with pytest.raises(UserError, match="unknown on_bad_row"):
        load_prompt_rows(path, read=ReadOptions("ignore"))
