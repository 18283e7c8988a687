import json

import datasets
import pandas as pd
import pytest

from danka.data.files import read_records, write_text_atomic
from danka.errors import UserError

ROWS = [{"prompt": "a", "response": "x #### 1", "reward": 0.5}, {"prompt": "b", "response": "y"}]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_locations_are_one_based_lines_and_skip_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n")
    got = read_records(str(path))
    assert [r for _, r in got] == ROWS
    assert [w for w, _ in got] == [f"{path}:1", f"{path}:3"]


def test_jsonl_string_with_unicode_line_separator_is_one_record(tmp_path):
    # U+2028 / U+0085 are legal unescaped inside a JSON string (json.dumps with
    # ensure_ascii=False writes them so); only "\n" (or "\r\n") ends a JSON Lines record
    rows = [{"prompt": "a\u2028b\x85c", "answer": "1"}, {"prompt": "d", "answer": "2"}]
    path = tmp_path / "d.jsonl"
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows), newline="")
    got = read_records(str(path))
    assert [r for _, r in got] == rows
    assert [w for w, _ in got] == [f"{path}:1", f"{path}:2"]


def test_json_array_and_json_lines_in_dot_json(tmp_path):
    array = tmp_path / "array.json"
    array.write_text(json.dumps(ROWS, indent=2))
    lines = _jsonl(tmp_path / "lines.json", ROWS)  # the seed story's mini_gsm8k.json
    assert [r for _, r in read_records(str(array))] == ROWS
    assert read_records(str(array))[1][0] == f"{array}:item 1"
    assert [r for _, r in read_records(str(lines))] == ROWS


def test_parquet_written_by_pandas(tmp_path):
    path = tmp_path / "d.parquet"
    pd.DataFrame({"prompt": ["a", "b"], "answer": ["1", "2"]}).to_parquet(path)
    got = read_records(str(path))
    assert got == [
        (f"{path}:row 0", {"prompt": "a", "answer": "1"}),
        (f"{path}:row 1", {"prompt": "b", "answer": "2"}),
    ]


def test_save_to_disk_dataset_and_dataset_dict(tmp_path):
    ds = datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}])
    ds.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": ds, "test": ds.select([1])}).save_to_disk(str(tmp_path / "dd"))
    assert [r["prompt"] for _, r in read_records(str(tmp_path / "single"))] == ["a", "b"]
    assert [r["prompt"] for _, r in read_records(str(tmp_path / "dd"), split="test")] == ["b"]
    with pytest.raises(UserError, match="no split 'valid'"):
        read_records(str(tmp_path / "dd"), split="valid")


def test_folder_with_split_file_and_base_dir(tmp_path):
    (tmp_path / "data").mkdir()
    _jsonl(tmp_path / "data" / "test.jsonl", ROWS)
    got = read_records("data", base_dir=tmp_path, split="test")
    assert len(got) == 2


def test_dataset_type_overrides_suffix(tmp_path):
    path = _jsonl(tmp_path / "rows.txt", ROWS)
    with pytest.raises(UserError, match="cannot tell the format"):
        read_records(str(path))
    assert len(read_records(str(path), dataset_type="jsonl")) == 2
    with pytest.raises(UserError, match="unknown dataset_type"):
        read_records(str(path), dataset_type="csv")


def test_invalid_json_line_names_file_line_and_error(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b",}\n')
    with pytest.raises(UserError) as err:
        read_records(str(path))
    text = str(err.value)
    assert f"{path}:2" in text and "invalid JSON" in text and "python -m json.tool" in text


def test_invalid_json_lines_collected_when_asked(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\nnot json\n[1, 2]\n')
    bad = []
    got = read_records(str(path), bad_lines=bad)
    assert [w for w, _ in got] == [f"{path}:1"]
    assert [w for w, _ in bad] == [f"{path}:2", f"{path}:3"]


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(UserError, match="data file not found"):
        read_records(str(tmp_path / "nope.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(UserError, match="no rows"):
        read_records(str(empty))


def test_hub_failure_says_how_to_pass_a_local_file(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError) as err:
        read_records("openai/gsm8k:main")
    assert "unreachable" in str(err.value) and "local file" in str(err.value)


def test_hub_name_with_config_is_passed_to_load_dataset(monkeypatch):
    calls = []

    def fake(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list([{"question": "q", "answer": "#### 1"}])

    monkeypatch.setattr(datasets, "load_dataset", fake)
    got = read_records("openai/gsm8k:main", split="test")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert got[0][0] == "hf:openai/gsm8k:main[test]:row 0"


def test_write_text_atomic_leaves_no_temp_file(tmp_path):
    write_text_atomic(tmp_path / "out.txt", "hello")
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    assert (tmp_path / "out.txt").read_text() == "hello"
