"""bench.peers.trl_learn: TRL's GSM8K curve, on danka's prompts, reward and evaluation."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.peers import trl_learn

ROOT = Path(__file__).resolve().parents[3]
QUESTIONS = [
    ("Tom has 5 apples and buys 13 more. How many apples does he have?", "18"),
    ("A box holds 12 eggs. How many eggs are in 3 boxes?", "36"),
    ("Ann reads 20 pages a day. How many pages does she read in 4 days?", "80"),
    ("A pen costs $3. How much do 7 pens cost?", "21"),
]


def gsm8k_files(folder: Path) -> tuple[Path, Path]:
    """A training file of the first three questions and a test file of the last two (one
    shared question would make danka's loader refuse the pair: train and test overlap)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.jsonl", folder / "test.jsonl"
    for path, rows in zip(paths, (QUESTIONS[:3], QUESTIONS[3:] * 3)):
        lines = [json.dumps({"question": q, "answer": f"... #### {a}"}) for q, a in rows]
        path.write_text("\n".join(lines) + "\n")
    return paths


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeModel:
    def __init__(self) -> None:
        self.saved: list[str] = []

    def save_pretrained(self, path: str) -> None:
        self.saved.append(Path(path).name)


def test_saves_every_two_minutes_of_training_and_stops_at_the_limit(tmp_path):
    clock, model = FakeClock(), FakeModel()
    saver = trl_learn.MinuteSaver(tmp_path, every=2.0, limit=5.0, started=0.0, clock=clock)
    clock.t = 30.0  # start-up: training begins half a minute after the command
    saver.begin()
    stops = []
    # minutes into training at each step's end: 2.1 passes 2, 4.5 passes 4, 5.2 the limit
    for step, elapsed in enumerate([0.9, 1.95, 2.1, 3.0, 4.5, 5.2], start=1):
        clock.t = 30.0 + 60 * elapsed
        stops.append(saver.step_end(step, model))
    assert stops == [False] * 5 + [True]
    # minutes count from the command's start: 0.5 + 2.1 = 2.6, 0.5 + 4.5, 0.5 + 5.2
    assert [(s["step"], s["minute"]) for s in saver.saves] == [(3, 2.6), (5, 5.0), (6, 5.7)]
    assert model.saved == ["minute_002.60_step_3", "minute_005.00_step_5", "minute_005.70_step_6"]
    clock.t += 3.0
    saver.end(6, model)  # the stopping step is saved already: not twice
    rec = saver.record()
    assert len(rec["saves"]) == 3 and rec["wall_minutes"] == 5.75 and rec["train_started"] == 0.5


def test_a_slow_step_past_two_save_minutes_saves_once_and_training_ended_early_saves_last():
    assert trl_learn.due(4.5, 2.0, 2.0, 20.0) == (True, False, 6.0)  # 2 and 4 passed: one save
    assert trl_learn.due(5.9, 6.0, 2.0, 20.0) == (False, False, 6.0)
    assert trl_learn.due(20.0, 22.0, 2.0, 20.0) == (True, True, 22.0)  # the limit
    clock, model = FakeClock(), FakeModel()
    saver = trl_learn.MinuteSaver(Path("a"), every=2.0, limit=5.0, started=0.0, clock=clock)
    saver.begin()
    clock.t = 60.0
    assert saver.step_end(1, model) is False and saver.saves == []
    saver.end(1, model)  # TRL stopped by itself (no more data): the last step is kept
    assert [s["step"] for s in saver.saves] == [1] and saver.record()["wall_minutes"] == 1.0


def job(tmp_path: Path) -> trl_learn.Job:
    train, test = gsm8k_files(tmp_path / "data")
    return trl_learn.load_job(str(train), str(test), tmp_path)


def test_trl_sees_the_prompt_danka_renders(tmp_path):
    from danka.data.template import encode_prompts
    from danka.models.tiny import tiny_tokenizer

    j, tok = job(tmp_path), tiny_tokenizer()
    rows = trl_learn.trl_rows(j)
    assert [r["answer"] for r in rows] == ["18", "36", "80"]
    d = j.data
    danka = encode_prompts(
        tok,
        j.train,
        max_prompt_length=10**6,
        system_prompt=d.system_prompt,
        instruction=d.instruction,
        examples=d.examples,
    )
    for row, text, ids in zip(rows, danka.texts, danka.input_ids):
        # what GRPOTrainer does with a conversational prompt (no tools: the model's template)
        got = tok.apply_chat_template(
            [row["prompt"]], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"][0]
        assert list(got) == ids
        assert (
            tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
            == text
        )
    assert text.count(j.data.instruction) == 1 and QUESTIONS[2][0] in text


def test_reward_is_dankas_strict_rule(tmp_path):
    from danka.rewards.combine import build_reward_computer
    from danka.types import PromptRow

    done = [
        "so 5 + 13 = 18\n#### 18",
        "#### 18.0",
        "The answer is 18.",
        "#### 17",
        "#### 1,800",
        [{"role": "assistant", "content": "#### 18"}],
    ]
    truth = ["18", "18", "18", "18", "1800", "18"]
    got = trl_learn.gsm8k_strict_reward(done, answer=truth)
    # verl's strict: the number after the last "####" equals the truth as written
    # (commas dropped), no answer or a wrong one scores 0 (format score 0)
    assert got == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    strict = [s for s in job(tmp_path).specs if s.label == "strict"]  # the example's, trained on
    assert [(s.name, s.kwargs) for s in strict] == [
        ("gsm8k", {"method": "strict", "format_score": 0.0})
    ]
    rewards = build_reward_computer(strict, base_dir=ROOT)
    try:
        rows = [PromptRow(index=i, prompt="q", ground_truth=t) for i, t in enumerate(truth)]
        texts = [d if isinstance(d, str) else d[0]["content"] for d in done]
        assert rewards(rows, ["q"] * len(rows), texts).scores.tolist() == got
    finally:
        rewards.close()


def fake_eval(n: int, strict: float, flexible: float, seconds: float) -> dict:
    """What danka's ``evaluate_rows`` returns (the keys read), plus the seconds taken."""
    per = {"strict": strict, "flexible": flexible, "boxed": 0.01, "format": 0.9}
    return {
        "n": n,
        "accuracy": strict,
        "correct_per_function": per,
        "response_length": 250.0,
        "truncation_rate": 0.02,
        "seconds": seconds,
    }


RUN = {
    "train_started": 1.0,
    "wall_minutes": 21.5,
    "saves": [
        {"minute": m, "step": s, "adapter": f"a{s}"} for m, s in ((3.0, 6), (9.0, 20), (21.4, 47))
    ],
    "trl_settings": {"lr": 1e-5},
    "train_log": [],
}


def test_each_adapter_is_scored_on_the_subset_but_the_base_and_the_last_on_every_row(
    tmp_path, monkeypatch
):
    test = [f"row{i}" for i in range(10)]
    seen = []
    results = iter(
        [
            fake_eval(10, 0.0, 0.25, 20.0),
            fake_eval(4, 0.30, 0.31, 8.0),
            fake_eval(4, 0.47, 0.48, 8.0),
            fake_eval(10, 0.52, 0.53, 20.0),
        ]
    )

    def evaluate(model_path, adapter, rows, job, args):
        seen.append((adapter, len(rows)))
        return next(results)

    monkeypatch.setattr(trl_learn, "evaluate", evaluate)
    fake_job = SimpleNamespace(test=test)
    written = []
    args = SimpleNamespace(eval_subset=4)
    curve = trl_learn.evaluate_run(args, "m", fake_job, RUN, lambda c: written.append(len(c)))
    assert seen == [(None, 10), ("a6", 4), ("a20", 4), ("a47", 10)] and written == [1, 2, 3, 4]
    r = trl_learn.summarize(curve, RUN)
    assert {"before", "after", "curve", "milestones", "wall_minutes", "eval_note"} <= set(r)
    assert r["before"] == {
        "step": 0,
        "minute": 1.0,
        "n": 10,
        "strict": 0.0,
        "flexible": 0.25,
        "boxed": 0.01,
        "format": 0.9,
        "mean_length": 250.0,
        "truncated": 0.02,
        "seconds": 20.0,
    }
    assert (r["after"]["step"], r["after"]["minute"], r["after"]["strict"]) == (47, 21.4, 0.52)
    assert [(p["step"], p["minute"], p["n"]) for p in r["curve"]] == [
        (0, 1.0, 10),
        (6, 3.0, 4),
        (20, 9.0, 4),
        (47, 21.4, 10),
    ]
    assert r["wall_minutes"] == 21.5 and r["n"] == 10 and r["eval_seconds"] == 56.0
    # verl: 0.458 at 36 min (here 0.47 at minute 9.0: 4x), 0.512 at 97 (0.52 at 21.4: 4.53x)
    m = {x["strict"]: x for x in r["milestones"]}
    assert (m[0.458]["minutes"], m[0.458]["speedup_vs_verl"]) == (9.0, 4.0)
    assert (m[0.512]["minutes"], m[0.512]["speedup_vs_verl"]) == (21.4, 4.53)
    assert not m[0.556]["reached"]
    # 30% first at minute 3.0, 33-38% first at minute 9.0 (47%)
    assert r["minutes_to"] == {"0.3": 3.0, "0.33": 9.0, "0.36": 9.0, "0.38": 9.0}
    assert r["trl_settings"] == {"lr": 1e-5} and "not in its minutes" in r["eval_note"]


def test_without_trl_the_command_says_how_to_install_it(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: None if n == "trl" else real(n))
    with pytest.raises(SystemExit, match="pip install trl==1.16.0"):
        trl_learn.main(["--tiny", "--out", str(tmp_path / "r.json")])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed")
def test_tiny_model_learns_for_seconds_and_is_scored_by_danka(tmp_path):
    train, test = gsm8k_files(tmp_path / "data")
    out = tmp_path / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "trl-learn",
        "--tiny",
        "--train",
        str(train),
        "--test",
        str(test),
        "--minutes",
        "0.1",
        "--save-minutes",
        "0.04",
        "--prompts",
        "2",
        "--generations",
        "2",
        "--micro",
        "4",
        "--new-tokens",
        "8",
        "--eval-tokens",
        "8",
        "--eval-subset",
        "2",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(out),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)
    r = json.loads(out.read_text())
    curve, saves = r["curve"], json.loads((tmp_path / "work" / "run.json").read_text())["saves"]
    assert len(saves) >= 2 and len(curve) == len(saves) + 1 and "partial" not in r
    assert [p["n"] for p in curve] == [3] + [2] * (len(saves) - 1) + [3]
    assert [p["step"] for p in curve[1:]] == [s["step"] for s in saves]
    assert curve[0]["minute"] < curve[1]["minute"] < curve[-1]["minute"] <= r["wall_minutes"]
    assert 0.099 <= r["wall_minutes"] - curve[0]["minute"] < 1.0  # trained ~6 s, then stopped
    assert all(Path(s["adapter"], "adapter_config.json").is_file() for s in saves)
    assert set(r["versions"]) >= {"torch", "transformers", "peft", "trl"}
    assert r["trl_settings"]["lora_r"] == 32 and r["trl_settings"]["beta"] == 0.0
    assert r["train_log"] and all(0.0 <= p["strict"] <= 1.0 for p in curve)


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--micro", "0"], "--micro must be above 0"),
        (["--minutes", "-1"], "--minutes must be above 0"),
        (["--save-minutes", "0"], "--save-minutes must be above 0"),
        (["--eval-subset", "-5"], "--eval-subset must be 0 or more"),
        (["--micro", "7"], "--micro must divide prompts x generations"),
    ],
)
def test_wrong_numbers_exit_2_naming_the_flag(flags, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        trl_learn.parse(["--tiny", "--out", str(tmp_path / "r.json"), *flags])
    assert err.value.code == 2 and says in capsys.readouterr().err
