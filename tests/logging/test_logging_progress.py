"""Non-TTY progress prints one plain line per step; live mode renders through rich."""

from __future__ import annotations

import io

import danka.logging.progress as progress_mod
from danka.logging import TrainProgress


def test_plain_lines_when_not_a_tty(monkeypatch):
    monkeypatch.setattr(progress_mod, "_gpu_memory", lambda: None)  # same text on GPU hosts
    out = io.StringIO()  # isatty() is False
    with TrainProgress(10, start_step=2, stream=out) as progress:
        assert progress.enabled and not progress.live
        progress.update(3, {"reward": 0.5, "val/accuracy": 0.25, "time/rollout": 1.25})
        progress.note("saved checkpoint 3")
        progress.update(4, {"reward": 0.75, "perf/tokens_per_s": 1234.4})
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(
        "[progress] step 3/10 | reward 0.500 | acc 0.250 | rollout 1.2s | elapsed 0:00:0"
    )
    assert "| eta " in lines[0]
    assert lines[1] == "saved checkpoint 3"
    assert lines[2].startswith("[progress] step 4/10 | reward 0.750 | 1234 tok/s | elapsed")


def test_disabled_prints_nothing():
    out = io.StringIO()
    with TrainProgress(5, enabled=False, stream=out) as progress:
        progress.update(1, {"reward": 1.0})
        progress.note("x")
    assert out.getvalue() == ""


def test_live_mode_renders():
    out = io.StringIO()
    with TrainProgress(4, stream=out, live=True) as progress:
        progress.update(2, {"reward": 0.5})
        progress.note("evaluation: 0.4")
    text = out.getvalue()
    assert "2/4" in text and "reward 0.500" in text and "evaluation: 0.4" in text


def test_gpu_memory_piece(monkeypatch):
    monkeypatch.setattr(progress_mod, "_gpu_memory", lambda: "gpu 1.0/80 GiB")
    assert progress_mod.summarize({"reward": 1.0}) == ["reward 1.000", "gpu 1.0/80 GiB"]


def test_training_throughput_metric_is_shown():
    pieces = progress_mod.summarize({"reward": 0.5, "throughput/gen_tokens_per_s": 812.6})
    assert "813 tok/s" in pieces


def test_work_progress_lines_throttled_and_final(monkeypatch):
    clock = iter([0.0, 0.0, 1.0, 6.0, 7.0, 8.0, 9.0, 9.0, 9.0])
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    with progress_mod.WorkProgress(48, "eval", unit="prompts", stream=out) as p:
        p.advance(16, tokens=160)  # t=1: under every_s since the start, no line
        p.advance(16, tokens=160)  # t=6: a line
        p.advance(16, tokens=160)  # t=7: the last item, always a line
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[eval] 32/48 prompts | ")
    assert "eta " in lines[0]
    assert lines[1].startswith("[eval] 48/48 prompts | ") and "eta" not in lines[1]
    assert "tok/s" in lines[1]


def test_work_progress_slow_rates_read_as_seconds_per_item(monkeypatch):
    clock = iter([0.0, 0.0, 80.0, 80.0])
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    with progress_mod.WorkProgress(24, "rm eval", unit="pairs", stream=out) as p:
        p.advance(4)
    assert "| 20.0 s/pair |" in out.getvalue()


def test_phases_that_did_not_run_are_left_out():
    from danka.logging.progress import summarize

    pieces = summarize(
        {"reward": 0.5, "time/rollout": 1.25, "time/values": 0.0, "time/reward": 0.01}
    )
    assert pieces == ["reward 0.500", "rollout 1.2s"]
