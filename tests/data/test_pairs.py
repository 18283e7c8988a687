"""Preference pairs: TRL's explicit/implicit prompt layouts, OpenRLHF's keys, bad pairs."""

from __future__ import annotations

import json

import pytest

from danka.data.formats import ReadOptions
from danka.data.pairs import PairColumns, load_pairs, split_shared_prefix
from danka.errors import UserError


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_explicit_prompt_text_and_messages(tmp_path):
    msgs = [{"role": "user", "content": "2+2?"}]
    path = _write(tmp_path / "p.jsonl", [
        {"prompt": "Sky?", "chosen": "Blue.", "rejected": "Green.", "margin": 2},
        {"prompt": msgs, "chosen": [{"role": "assistant", "content": "4"}],
         "rejected": [{"role": "assistant", "content": "5"}]},
    ])  # fmt: skip
    pairs, n_bad = load_pairs(str(path))
    assert n_bad == 0 and len(pairs) == 2
    assert (pairs[0].prompt, pairs[0].chosen, pairs[0].rejected) == ("Sky?", "Blue.", "Green.")
    assert pairs[0].margin == 2.0 and pairs[1].margin is None
    assert pairs[1].prompt == msgs and pairs[1].chosen[0]["content"] == "4"
    assert pairs[0].location == f"{path}:1"


def test_implicit_prompt_is_the_shared_prefix():
    # text: split per character; the space before the split goes with the answers
    assert split_shared_prefix("Q: sky? A: blue", "Q: sky? A: green") == (
        "Q: sky? A:", " blue", " green")  # fmt: skip
    user = {"role": "user", "content": "Sky?"}
    c, r = {"role": "assistant", "content": "Blue"}, {"role": "assistant", "content": "Red"}
    assert split_shared_prefix([user, c], [user, r]) == ([user], [c], [r])


def test_openrlhf_style_keys(tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"input": "Hi", "good": "Hello!", "bad": "Go away."}])
    pairs, _ = load_pairs(str(path), PairColumns("good", "bad", "input"))
    assert (pairs[0].prompt, pairs[0].chosen, pairs[0].rejected) == ("Hi", "Hello!", "Go away.")


@pytest.mark.parametrize(
    "row, reason",
    [
        ({"prompt": "q", "chosen": "a"}, "missing 'rejected'"),
        ({"prompt": "q", "chosen": "same", "rejected": "same"}, "identical"),
        ({"prompt": "q", "chosen": " ", "rejected": "b"}, "'chosen' is an empty string"),
        ({"chosen": "abc", "rejected": "abcd"}, "'chosen' is empty after the shared prefix"),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}, "must be a number"),
        ({"prompt": "q", "chosen": 3, "rejected": "b"}, "a string or a list of chat messages"),
    ],
)
def test_bad_pair_names_file_and_line(tmp_path, row, reason):
    good = {"prompt": "q", "chosen": "a", "rejected": "b"}
    path = _write(tmp_path / "p.jsonl", [good, row])
    with pytest.raises(UserError) as err:
        load_pairs(str(path))
    assert f"{path}:2" in str(err.value) and reason in str(err.value)


def test_skip_writes_bad_rows_and_keeps_the_good(tmp_path):
    path = _write(tmp_path / "p.jsonl", [
        {"prompt": "q", "chosen": "a", "rejected": "b"},
        {"prompt": "q", "chosen": "x", "rejected": "x"},
    ])  # fmt: skip
    bad_path = tmp_path / "out" / "bad_rows.jsonl"
    pairs, n_bad = load_pairs(str(path), read=ReadOptions("skip", bad_path))
    assert len(pairs) == 1 and n_bad == 1
    bad = json.loads(bad_path.read_text())
    assert bad["location"] == f"{path}:2" and "identical" in bad["reason"]
    with pytest.raises(UserError, match="all 1 rows are bad"):
        load_pairs(str(_write(tmp_path / "q.jsonl", [{"chosen": "x", "rejected": "x"}])),
                   read=ReadOptions("skip"))  # fmt: skip
