"""The report tells the whole run: a header (model, algorithm, settings, device, start,
wall time), held-out answers before -> after, the drift probe's answers that degenerated;
its charts keep every legend off the data, draw only the phases that ran, and show a 0/1
reward's answer groups instead of a 0..1 band. All on a synthetic run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from danka.diagnose import read_run_dir
from danka.tools.plot import (
    accuracy_figure,
    accuracy_lines,
    binary,
    group_outcomes,
    groups_figure,
    plot_run,
    reward_figure,
    timing_figure,
)
from danka.tools.run_story import answer_pairs, header_of, probe_drift, question
from tests.tools.conftest import in_order

CONFIG = {
    "model": {"actor_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"},
    "trainer": {
        "algorithm": "grpo",
        "total_steps": 8,
        "batch_size": 8,
        "samples_per_prompt": 4,
        "max_new_tokens": 16,
    },
    "optim": {"lr": 3e-4, "critic_lr": 1e-5},
    "lora": {"enable_lora": True, "lora_r": 16, "lora_alpha": 32.0},
    "loss": {"kl": {"coef": 0.001}},
    "sampling": {"temperature": 0.7},
    "data": {"task": "arithmetic"},
    "reward": {"functions": [{"name": "last_number", "weight": 1.0}]},
    "logging": {"result_file": "quickstart_result.json"},
}
LOG = (
    "2026-12-06 23:32:03 [INFO] Data: 2000 training prompts\n"
    "2026-12-06 23:32:42 [INFO] Loaded model HuggingFaceTB/SmolLM2-135M-Instruct with bfloat16\n"
    "2026-12-06 23:32:42 [INFO]   model: 134.5M parameters, attn sdpa, device cuda:0 "
    "(NVIDIA H200), from /cache/SmolLM2\n"
)


def chatml(q: str) -> str:
    return (
        f"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 36 + 47?"
        f"<|im_end|>\n<|im_start|>assistant\n36 + 47 = 83<|im_end|>\n<|im_start|>user\n{q}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def templated(q: str) -> str:
    """A probe prompt as the model reads it: the chat template, no worked turn."""
    return f"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"


def _sample(q: str, truth: str, answer: str, ok: bool) -> dict:
    return {"prompt": chatml(q), "completion": answer, "ground_truth": truth, "correct": ok}


FLUENT = {
    "What is the capital of France?": "The capital of France is Paris.",
    "Name three colours.": "Red, green and blue.",
}
LOOP = "Red, green, blue, red, green, blue, red, green, blue, red, green, blue."


def _eval(step: int, acc: float, samples: list[dict], probe: dict, degenerate: float) -> dict:
    return {
        "step": step,
        "eval/accuracy": acc,
        "eval/n": 200.0,
        "eval/guess_floor": 0.025,
        "probe/n": 2.0,
        "probe/degenerate_frac": degenerate,
        "probe/kl": 0.042,
        "probe_answers": [{"prompt": templated(p), "answer": a} for p, a in probe.items()],
        "samples": samples,
    }


def write_story_run(folder: Path, *, probe_after: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "logs").mkdir()
    (folder / "logs" / "train.log").write_text(LOG)
    metrics = [
        {
            "step": s,
            "reward": 0.1 * s,
            "time/rollout": 2.0,
            "time/update": 1.0,
            "time/values": 2e-5,  # a run without a critic times a no-op
            "time/advantages": 0.0,
            "time/step": 3.0,
            "reward/zero_adv_groups": 0.5,
        }
        for s in range(1, 9)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    before = [
        _sample("What is 12 + 30?", "42", "12 + 30 = 42", True),  # stays right
        _sample("What is 47 + 38?", "85", "47 + 38 = 75", False),  # turns right
        _sample("What is 50 + 11?", "61", "50 + 11 = 61", True),  # turns wrong
        _sample("What is 20 + 20?", "40", "20 + 20 = 50", False),  # stays wrong
    ]
    after = [
        _sample("What is 12 + 30?", "42", "12 + 30 = 42", True),
        _sample("What is 47 + 38?", "85", "47 + 38 = 85", True),
        _sample("What is 50 + 11?", "61", "50 + 11 = 62", False),
        _sample("What is 20 + 20?", "40", "20 + 20 = 30", False),
    ]
    probe = probe_after or FLUENT
    degenerate = 0.5 if probe_after else 0.0
    (folder / "eval").mkdir()
    for record in (_eval(0, 0.5, before, FLUENT, 0.0), _eval(8, 0.5, after, probe, degenerate)):
        (folder / "eval" / f"step_{record['step']}.json").write_text(json.dumps(record))
    (folder / "completions").mkdir()
    groups = {1: {"a": [1, 0, 0, 0], "b": [0, 0, 0, 0]}, 8: {"a": [1, 1, 1, 1], "b": [1, 0, 1, 0]}}
    for step, by_prompt in groups.items():
        rows = [
            {"prompt": p, "completion": "x", "reward": r}
            for p, rewards in by_prompt.items()
            for r in rewards
        ]
        (folder / "completions" / f"step_{step}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
    (folder / "quickstart_result.json").write_text(json.dumps({"steps": 8, "seconds": 253.3}))
    return folder


def test_question_is_the_prompts_last_turn():
    assert question(chatml("What is 47 + 38?")) == "What is 47 + 38?"
    llama = (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nName a colour."
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert question(llama) == "Name a colour."
    assert question("Question: 2 + 2?\nAnswer:") == "Question: 2 + 2?\nAnswer:"


def test_header_reads_config_log_and_result(tmp_path):
    run = write_story_run(tmp_path / "run")
    h = header_of(run, read_run_dir(run), steps=8)
    assert (h.model, h.algorithm) == ("HuggingFaceTB/SmolLM2-135M-Instruct", "grpo")
    assert h.device == "cuda:0 (NVIDIA H200), bfloat16"
    assert (h.started, h.wall_seconds) == ("2026-12-06 23:32", 253.3)
    settings = dict(h.settings)
    assert settings["steps"] == "8 of 8" and settings["batch"] == "8 prompts x 4 samples"
    assert settings["lr"] == "0.0003"  # no critic lr for GRPO
    assert settings["LoRA"] == "r 16, alpha 32" and settings["KL coef"] == "0.001"
    assert settings["reward"] == "last_number" and settings["data"] == "arithmetic"


def test_answers_turned_right_first_then_turned_wrong(tmp_path):
    run = write_story_run(tmp_path / "run")
    pairs = answer_pairs(read_run_dir(run), k=3)
    assert [p.question for p in pairs] == [
        "What is 47 + 38?",
        "What is 50 + 11?",
        "What is 12 + 30?",
    ]
    assert (pairs[0].before, pairs[0].after, pairs[0].truth) == (
        "47 + 38 = 75",
        "47 + 38 = 85",
        "85",
    )
    assert (pairs[0].before_ok, pairs[0].after_ok) == (False, True)


def test_probe_shows_only_the_answers_that_degenerated(tmp_path):
    fine = probe_drift(read_run_dir(write_story_run(tmp_path / "a")))
    assert (fine.before, fine.after, fine.worse) == (0.0, 0.0, ())
    worse = {**FLUENT, "Name three colours.": LOOP}
    drift = probe_drift(read_run_dir(write_story_run(tmp_path / "b", probe_after=worse)))
    assert (drift.n, drift.after, drift.kl, drift.step) == (2, 0.5, 0.042, 8)
    assert drift.worse == ((templated("Name three colours."), "Red, green and blue.", LOOP),)


def test_report_has_header_answers_and_probe_before_the_charts(tmp_path):
    run = write_story_run(tmp_path / "run", probe_after={**FLUENT, "Name three colours.": LOOP})
    page = plot_run(run)[-1].read_text(encoding="utf-8")
    assert "&lt;|im_start|&gt;system" not in page.split("Drift probe")[1]  # the question only
    in_order(
        page,
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "cuda:0 (NVIDIA H200), bfloat16",
        "4 min 13 s",
        "<h2>Verdict</h2>",
        "Held-out answers: step 0 &rarr; step 8",
        "47 + 38 = 85",
        "Drift probe",
        "0.0% &rarr; 50.0%",
        "step 8: degenerated",
        "Red, green, blue, red",
        "<h2>Charts</h2>",
    )


def test_zero_one_reward_draws_its_groups(tmp_path):
    rec = read_run_dir(write_story_run(tmp_path / "run"))
    assert binary(rec)
    first, last = group_outcomes(rec)
    # step 1: a=[1,0,0,0] has a right answer, b none -> any 1/2, all 0/2
    assert (first.step, first.n, first.any_correct, first.all_correct) == (1, 2, 0.5, 0.0)
    # step 8: a all right, b mixed -> any 2/2, all 1/2
    assert (last.any_correct, last.all_correct) == (1.0, 0.5)
    names = [p.stem for p in plot_run(tmp_path / "run")]
    assert "groups" in names


def test_a_graded_reward_is_not_binary(tmp_path):
    run = write_story_run(tmp_path / "run")
    (run / "completions" / "step_1.jsonl").write_text(json.dumps({"prompt": "a", "reward": 0.5}))
    assert not binary(read_run_dir(run))


def test_timing_chart_draws_only_the_phases_that_ran(tmp_path):
    rec = read_run_dir(write_story_run(tmp_path / "run"))
    fig = timing_figure(rec.metrics)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["rollout", "update"]  # values 2e-5 s and advantages 0 s; no "other"
    # 1 s of a 4 s step outside the phases (the evaluation, a save) is drawn as "other"
    longer = [{**r, "time/step": 4.0} for r in rec.metrics]
    fig = timing_figure(longer)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["rollout", "update", "other"]


def _overlaps(fig) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # lays the figure out as savefig does
    renderer = canvas.get_renderer()
    axes = fig.axes[0].get_window_extent(renderer)
    return any(leg.get_window_extent(renderer).overlaps(axes) for leg in fig.legends)


@pytest.mark.parametrize("chart", ["accuracy", "reward", "groups", "timings"])
def test_every_legend_sits_off_the_axes(tmp_path, chart):
    rec = read_run_dir(write_story_run(tmp_path / "run"))
    figures = {
        "accuracy": lambda: accuracy_figure(accuracy_lines(rec, rec.metrics), "accuracy"),
        "reward": lambda: reward_figure([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4], []),
        "groups": lambda: groups_figure(group_outcomes(rec), rec.metrics),
        "timings": lambda: timing_figure(rec.metrics),
    }
    fig = figures[chart]()
    assert fig.legends and not fig.axes[0].get_legend()
    assert not _overlaps(fig)
