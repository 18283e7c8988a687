import json

from danka.cli import main
from danka.diagnose import read_run_dir
from danka.tools.plot import ema, plot_run, read_metrics, reward_distributions, series

EXPECTED = [
    "eval_accuracy",
    "reward",
    "groups",  # the fake run's rewards are 0/1
    "kl",
    "entropy",
    "response_length",
    "timings",
    "reward_histogram",
]


def test_plot_run_writes_every_png_and_a_self_contained_report(tmp_path, make_run):
    run = make_run(tmp_path / "run")
    paths = plot_run(run)
    names = [p.stem for p in paths[:-1]]
    assert names == EXPECTED
    for p in paths[:-1]:
        assert p.parent == run / "plots"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = paths[-1]
    assert report.name == "report.html"
    text = report.read_text()
    assert text.count("data:image/png;base64,") == len(EXPECTED)
    assert "12 steps logged" in text
    assert "src='plots/" not in text  # nothing refers to a file outside the page


def test_truncated_last_line_is_skipped(tmp_path, make_run):
    run = make_run(tmp_path / "run", truncated_tail=True)
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 13))
    assert len(plot_run(run)) == len(EXPECTED) + 1


def test_series_drops_non_finite_and_keeps_the_last_value_of_a_repeated_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "kl": 0.1},
        {"step": 2, "kl": None},
        {"step": 3, "kl": "inf"},
        {"step": 3, "kl": 0.3},
        {"step": 4},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert series(read_metrics(path), "kl") == ([1.0, 3.0], [0.1, 0.3])


def test_ema_is_debiased():
    # w = 0.5: acc1 = 0.5*2 = 1 -> /(1-0.5) = 2; acc2 = 0.5*1 + 0.5*4 = 2.5 -> /(1-0.25) = 3.333
    assert ema([2.0, 4.0], weight=0.5) == [2.0, 2.5 / 0.75]


def test_histogram_uses_first_and_last_completions(tmp_path, make_run):
    run = make_run(tmp_path / "run")
    dists = reward_distributions(read_run_dir(run), read_metrics(run / "metrics.jsonl"))
    assert list(dists.values()) == [[0, 0, 1, 0], [1, 1, 0, 1]]
    assert list(dists) == ["step 1 (samples)", "step 12 (samples)"]


def test_few_steps_and_missing_metrics_do_not_crash(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.3}) + "\n")
    paths = plot_run(run)
    assert [p.name for p in paths] == ["report.html"]
    assert "Not plotted (no data yet)" in paths[0].read_text()
    # a single step with a reward: one point, no smoothing, no histogram
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    assert [p.stem for p in plot_run(run)] == ["reward", "report"]


def test_cli_plot(tmp_path, make_run, capsys):
    run = make_run(tmp_path / "run")
    assert main(["plot", str(run)]) == 0
    assert "report.html" in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "run folder not found" in capsys.readouterr().err
