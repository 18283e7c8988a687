"""``plots/report.html`` opens with the verdict: held-out accuracy before -> after next to
the guess floor, each labelled function, the answers' length, the run doctor's findings
(each with its fix), in that order, before any chart; a run in progress says so; text from
the run folder is escaped; the accuracy chart plots percent."""

from __future__ import annotations

import html
import json
import math
import shutil
from pathlib import Path

import pytest

from danka.diagnose import diagnose, read_run_dir
from danka.tools.plot import accuracy_figure, accuracy_lines, plot_run, reward_spread
from tests.tools.conftest import in_order

# lr 1e-3 with LoRA and no KL: a risk (kl_off_high_lr); the adaptive controller from a
# coefficient of 0: a problem (kl_adaptive_from_zero). Both from the config alone.
RISKY_CONFIG = {
    "optim": {"lr": 1e-3},
    "lora": {"enable_lora": True},
    "loss": {"kl": {"coef": 0.0, "adaptive": True}},
    "reward": {"functions": [{"name": "gsm8k", "label": "strict", "weight": 1.0},
                             {"name": "format", "label": "format", "weight": 0.0}]},
}  # fmt: skip


def _eval(step: int, acc: float, **extra) -> dict:
    return {"step": step, "eval/accuracy": acc, "eval/n": 200.0, "eval/guess_floor": 0.05,
            "eval/guess_floor/strict": 0.05, "eval/correct/strict": acc, **extra,
            "samples": []}  # fmt: skip


def write_run(folder: Path, *, evals: list[dict], config: dict | None = None,
              finished: bool = True) -> Path:  # fmt: skip
    folder.mkdir(parents=True)
    metrics = [{"step": s, "reward": 0.1 * s, "response_length": 90.0 - s} for s in range(1, 13)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (folder / "config.json").write_text(json.dumps(config if config is not None else {}))
    (folder / "eval").mkdir()
    for record in evals:
        (folder / "eval" / f"step_{record['step']}.json").write_text(json.dumps(record))
    (folder / "completions").mkdir()
    for s, rewards in ((1, [0, 0, 1, 0]), (12, [1, 1, 0, 1])):
        (folder / "completions" / f"step_{s}.jsonl").write_text(
            "".join(json.dumps({"step": s, "reward": r}) + "\n" for r in rewards)
        )
    if finished:
        (folder / "result.json").write_text(json.dumps({"before": 0.1, "after": 0.4}))
    return folder


TWO_EVALS = [
    _eval(0, 0.10, **{"eval/correct/format": 0.25, "eval/response_length": 100.0,
                      "eval/truncated": 0.2, "eval/minutes": 0.5}),
    _eval(12, 0.40, **{"eval/correct/format": 0.75, "eval/response_length": 80.0,
                       "eval/truncated": 0.05, "eval/minutes": 6.0}),
]  # fmt: skip


def _report(run: Path) -> tuple[str, str]:
    """(the whole page, its verdict section)."""
    text = plot_run(run)[-1].read_text(encoding="utf-8")
    start = text.index("<section id='verdict'>")
    return text, text[start : text.index("</section>", start)]


def test_the_report_opens_with_before_after_the_floor_and_each_fix(tmp_path):
    run = write_run(tmp_path / "run", evals=TWO_EVALS, config=RISKY_CONFIG)
    page, verdict = _report(run)
    findings = diagnose(read_run_dir(run))
    assert {f.severity for f in findings} == {"problem", "risk"}
    # the verdict comes before any chart
    assert page.index("<section id='verdict'>") < page.index("<img")
    in_order(
        verdict,
        # 10% -> 40% on 200 problems: +30 points
        "10.0% &rarr; 40.0%",
        "+30.0 points",
        "200 problems",
        # floor 5%: 40 - 5 = 35 points above, 40 / 5 = 8x
        "Guess floor: <b>5.0%</b>",
        "35.0 points above it, 8.0x",
        # each function's before -> after: strict is trained, format logged only
        "<td>strict</td><td>10.0%</td><td>40.0%</td><td>+30.0 points</td><td>5.0%</td>"
        "<td>trained</td>",
        "<td>format</td><td>25.0%</td><td>75.0%</td><td>+50.0 points</td><td>-</td>"
        "<td>logged only</td>",
        "mean length 100.0 &rarr; 80.0 tokens",
        "cut at the token limit 20.0% &rarr; 5.0%",
        "Run doctor: 1 problem, 1 risk",
        # problems first, then risks, each with its evidence and fix
        *[part for f in findings if f.severity == "problem"
          for part in (html.escape(f.evidence), html.escape(f.fix))],
        *[part for f in findings if f.severity == "risk"
          for part in (html.escape(f.evidence), html.escape(f.fix))],
    )  # fmt: skip
    # the noise floor: 1.96 sqrt(0.1*0.9/200 + 0.4*0.6/200) = 0.0796 -> 8.0 points
    assert "&plusmn;8.0 points" in verdict
    assert "run finished" in verdict


def test_a_clean_run_says_no_findings(tmp_path, make_run):
    _, verdict = _report(make_run(tmp_path / "run"))
    assert "Run doctor: no findings" in verdict
    assert "5.0% &rarr; 30.0%" in verdict  # the fixture's evaluations at steps 0 and 12
    assert "Guess floor: not recorded" in verdict


def test_a_run_with_one_evaluation_is_in_progress(tmp_path):
    run = write_run(tmp_path / "run", evals=TWO_EVALS[:1], finished=False)
    _, verdict = _report(run)
    assert "Run in progress: one held-out evaluation so far: <b>10.0%</b> at step 0" in verdict
    assert "10.0% &rarr;" not in verdict
    assert "The latest accuracy 10.0% is" in verdict  # still judged against the floor
    shutil.rmtree(run / "eval")
    _, verdict = _report(run)
    assert "Run in progress: no held-out evaluation yet" in verdict
    assert "Guess floor" not in verdict


def test_two_evaluations_without_the_result_file_are_so_far(tmp_path):
    run = write_run(tmp_path / "run", evals=TWO_EVALS, finished=False)
    _, verdict = _report(run)
    assert "Run in progress: held-out accuracy so far: <b>10.0% &rarr; 40.0%</b>" in verdict
    assert "The latest accuracy 40.0%" in verdict


def test_hostile_text_from_the_run_folder_is_escaped(tmp_path):
    evil = "<script>alert(1)</script>"
    evals = [{**e, f"eval/correct/{evil}": 0.5} for e in TWO_EVALS]
    config = {**RISKY_CONFIG, "reward": {"functions": [{"name": "x", "label": evil}]}}
    run = write_run(tmp_path / "run<img src=x onerror=alert(1)>", evals=evals, config=config)
    page, verdict = _report(run)
    assert "<script>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in verdict
    assert "run&lt;img src=x onerror=alert(1)&gt;" in verdict


def test_a_broken_config_leaves_a_note_not_a_traceback(tmp_path):
    run = write_run(tmp_path / "run", evals=TWO_EVALS)
    (run / "config.json").write_text("{not json <b>")
    page, verdict = _report(run)
    assert "the run doctor could not read this folder" in verdict
    assert "12 steps logged" in verdict and "data:image/png;base64," in page


def test_the_accuracy_chart_plots_percent_and_the_floor(tmp_path):
    run = write_run(tmp_path / "run", evals=TWO_EVALS)
    record = read_run_dir(run)
    data = accuracy_lines(record, record.metrics)
    assert data.lines == {
        "eval/accuracy": ([0.0, 12.0], [10.0, 40.0]),
        "strict": ([0.0, 12.0], [10.0, 40.0]),
        "format": ([0.0, 12.0], [25.0, 75.0]),
    }
    assert data.floor == pytest.approx(5.0)
    fig = accuracy_figure(data, "Held-out accuracy")
    drawn = {ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[0].get_lines()}
    assert drawn["accuracy"] == [10.0, 40.0]
    assert drawn["strict (= accuracy)"] == [10.0, 40.0]
    assert drawn["format"] == [25.0, 75.0]
    assert drawn["guess floor 5.0%"] == [pytest.approx(5.0)] * 2
    # and over wall-clock minutes, its own chart
    by_minute = accuracy_lines(record, record.metrics, x="eval/minutes")
    assert by_minute.lines["eval/accuracy"] == ([0.5, 6.0], [10.0, 40.0])
    names = [p.stem for p in plot_run(run)]
    assert names[:3] == ["eval_accuracy", "eval_accuracy_minutes", "reward"]


def test_reward_spread_from_the_saved_samples(tmp_path):
    run = write_run(tmp_path / "run", evals=TWO_EVALS)
    first, last = reward_spread(read_run_dir(run))
    # [0, 0, 1, 0]: mean 0.25, population variance (3 * 0.0625 + 0.5625) / 4 = 0.1875
    assert (first.step, first.n, first.mean, first.low, first.high) == (1, 4, 0.25, 0.0, 1.0)
    assert first.std == pytest.approx(math.sqrt(0.1875))
    assert (last.step, last.mean) == (12, 0.75)
