"""Held-out rows are never silently training rows: a dataset folder (as
`danka data gsm8k` writes) is read with data.train_split for training and data.eval_split
for evaluation; the same source and split on both sides, or a held-out prompt that is also
a training prompt, stops the run with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from danka.config import load_config
from danka.data.splits import load_rows
from danka.errors import UserError
from danka.tools.evaluate import _from_args


def _gsm8k_rows(start: int, n: int) -> list[dict]:
    return [
        {"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
        for i in range(start, start + n)
    ]


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(tmp_path: Path, **data):
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(
        json.dumps(
            {
                "model": {"actor_model_name_or_path": "unused"},
                "trainer": {"batch_size": 2, "samples_per_prompt": 2, "micro_batch_size": 4},
                "reward": {"functions": [{"name": "gsm8k"}]},
                "data": data,
            }
        )
    )
    return load_config(cfg_path)


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "gsm8k"
    _write(d / "train.jsonl", _gsm8k_rows(0, 6))
    _write(d / "test.jsonl", _gsm8k_rows(100, 3))
    return d


def test_a_folder_is_read_with_the_train_and_the_eval_split(tmp_path, folder):
    cfg, base = _cfg(tmp_path, train_dataset=str(folder), eval_dataset=str(folder))
    train, held = load_rows(cfg, base, tmp_path / "out")
    # before: both sides read the folder's train split (held-out == training rows)
    assert len(train) == 6 and len(held) == 3
    assert [r.ground_truth for r in held] == ["200", "202", "204"]


def test_same_source_and_split_on_both_sides_is_refused(tmp_path, folder):
    cfg, base = _cfg(
        tmp_path, train_dataset=str(folder), eval_dataset=str(folder), eval_split="train"
    )
    with pytest.raises(UserError, match="same split") as err:
        load_rows(cfg, base, tmp_path / "out")
    assert err.value.where == "data.eval_split"


def test_held_out_prompts_that_are_training_prompts_are_refused(tmp_path):
    train = _write(tmp_path / "train.jsonl", _gsm8k_rows(0, 6))
    held = _write(tmp_path / "held.jsonl", _gsm8k_rows(5, 3))  # row 5 is also in train
    cfg, base = _cfg(tmp_path, train_dataset=str(train), eval_dataset=str(held))
    with pytest.raises(UserError, match="1 of 3 held-out prompts are also training prompts"):
        load_rows(cfg, base, tmp_path / "out")


def test_danka_eval_reads_a_folder_with_its_test_split(folder):
    rows = _from_args("m", None, str(folder), "gsm8k")["rows"]
    assert [r.ground_truth for r in rows] == ["200", "202", "204"]  # before: the train rows
    rows = _from_args("m", None, str(folder), "gsm8k", split="train")["rows"]
    assert len(rows) == 6
