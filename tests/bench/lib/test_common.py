"""bench/lib/common.py: where a result file goes."""

from __future__ import annotations

import json


def test_write_result_copies_into_out_and_takes_out_as_its_own_folder(tmp_path, monkeypatch):
    from bench.lib.common import write_result

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    write_result({"a": 1}, tmp_path / "results", "r")  # a copy lands in $OUT
    assert json.loads((out / "r.json").read_text()) == {"a": 1}
    write_result({"a": 2}, out, "r")  # --out-dir $OUT: the file is its own copy, no error
    assert json.loads((out / "r.json").read_text()) == {"a": 2}


def test_device_peak_keeps_the_most_seen_while_the_block_ran_not_the_last():
    import threading

    from bench.lib.common import GIB, DevicePeak

    seen = threading.Event()
    level = {"bytes": 1 * GIB}
    polls = []

    def used() -> int:
        polls.append(level["bytes"])
        if len(polls) >= 3:
            seen.set()
        return level["bytes"]

    with DevicePeak(every=0.001, used=used) as peak:
        level["bytes"] = 5 * GIB  # a short peak inside the block ...
        assert seen.wait(5)
        polls.clear()
        seen.clear()
        assert seen.wait(5)  # ... sampled at least three times
        level["bytes"] = 2 * GIB  # ... and gone before the block ends
        polls.clear()
        seen.clear()
        assert seen.wait(5)
    assert peak.gib == 5.0
    n = len(polls)
    level["bytes"] = 9 * GIB  # after the block: no more sampling
    import time

    time.sleep(0.02)
    assert len(polls) == n and peak.gib == 5.0
