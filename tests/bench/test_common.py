"""bench/common.py: where a result file goes."""

from __future__ import annotations

import json


def test_write_result_copies_into_out_and_takes_out_as_its_own_folder(tmp_path, monkeypatch):
    from bench.common import write_result

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    write_result({"a": 1}, tmp_path / "results", "r")  # a copy lands in $OUT
    assert json.loads((out / "r.json").read_text()) == {"a": 1}
    write_result({"a": 2}, out, "r")  # --out-dir $OUT: the file is its own copy, no error
    assert json.loads((out / "r.json").read_text()) == {"a": 2}
