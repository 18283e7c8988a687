import json

import pytest
import yaml

from danka.cli import main
from danka.rewards.combine import RewardSpec, build_reward_computer
from danka.tools import evaluate as ev
from danka.tools.evaluate import ks_for, pass_at_k, summarize
from danka.types import PromptRow


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n = 2 / 5
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 4) == 1.0  # n - c = 3 < k: any 4 of 5 hold a correct one
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # C(7,5)=21, C(10,5)=252
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_ks_for():
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(6) == [1, 2, 4, 6]


def test_summarize_pass_at_k_by_hand():
    correct = [[True, False, False, False], [True, True, False, False]]
    out = summarize(
        correct,
        [[1, 2, 3, 4], [5, 6, 7, 8]],
        [[False] * 4, [True] + [False] * 3],
        [[1.0, 0, 0, 0], [1.0, 1.0, 0, 0]],
    )
    # pass@1 = mean(1/4, 2/4) = 0.375
    # pass@2: row 1: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; row 2: 1 - C(2,2)/C(4,2) = 5/6
    # pass@4 = 1 for both rows
    assert out["pass@k"] == pytest.approx(
        {"pass@1": 0.375, "pass@2": (0.5 + 5 / 6) / 2, "pass@4": 1.0}
    )
    assert out["accuracy"] == pytest.approx(0.375)
    assert out["response_length"] == pytest.approx(4.5)  # (1+...+8) / 8 = 36 / 8
    assert out["truncation_rate"] == pytest.approx(1 / 8)
    assert out["mean_reward"] == pytest.approx(3 / 8)


def test_evaluate_rows_scores_sampled_answers(monkeypatch, tmp_path):
    """Generation replaced by fixed answers; the reward marks "right" as correct."""
    (tmp_path / "r.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0 if solution_str == 'right' else 0.0\n"
    )
    rows = [PromptRow(0, "a", "x"), PromptRow(1, "b", "y")]
    answers = [["right", "wrong", "wrong", "wrong"], ["right", "right", "wrong", "wrong"]]
    seen = {}

    def fake_generate(model, tok, rows, opts, progress=None, on_batch=None):
        seen.update(vars(opts))
        items = [
            {
                "index": r.index,
                "row": r,
                "prompt": r.prompt,
                "completions": a,
                "response_tokens": [3] * 4,
                "truncated": [False] * 4,
            }
            for r, a in zip(rows, answers)
        ]
        on_batch(items)  # one batch: all of them
        return items

    monkeypatch.setattr("danka.tools.generate.generate_batch", fake_generate)
    with build_reward_computer([RewardSpec("r.py:compute_score")], base_dir=tmp_path) as rw:
        out = ev.evaluate_rows(None, None, rows, rw, samples=4)
    assert seen["temperature"] == 1.0 and seen["n"] == 4  # sampled at temperature 1
    assert out["pass@k"] == pytest.approx(
        {"pass@1": 0.375, "pass@2": (0.5 + 5 / 6) / 2, "pass@4": 1.0}
    )
    assert [c["correct"] for c in out["completions"]] == [True, True]
    with build_reward_computer([RewardSpec("r.py:compute_score")], base_dir=tmp_path) as rw:
        out = ev.evaluate_rows(None, None, rows, rw, samples=4, temperature=0.7)
    # --temperature: sampled at the training temperature; accuracy = mean of the 8 = 3 / 8
    assert seen["temperature"] == 0.7 and out["accuracy"] == 0.375


def test_cli_eval_temperature_needs_samples(tiny_dir, prompts_file, yes_reward, capsys):
    base = ["eval", "--model", str(tiny_dir), "--data", str(prompts_file)]
    base += ["--reward", f"{yes_reward}:compute_score", "--temperature", "0.7"]
    assert main(base) == 2  # greedy (one answer) takes no temperature
    assert "needs --samples" in capsys.readouterr().err
    assert main([*base, "--samples", "2", "--temperature", "0"]) == 2
    assert "temperature > 0" in capsys.readouterr().err


def test_cli_eval_greedy_accuracy(tiny_dir, prompts_file, yes_reward, tmp_path, capsys):
    out = tmp_path / "eval.json"
    rc = main(
        [
            "eval",
            "--model",
            str(tiny_dir),
            "--data",
            str(prompts_file),
            "--reward",
            f"{yes_reward}:compute_score",
            "--max-new-tokens",
            "4",
            "--device",
            "cpu",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    result = json.loads(out.read_text())
    # the reward says "correct" iff ground truth is yes: rows 0 and 2 of 4
    assert result["accuracy"] == 0.5 and result["n"] == 4 and result["samples"] == 1
    assert [c["correct"] for c in result["completions"]] == [True, False, True, False]
    assert result["correct_per_function"] == {"compute_score": 0.5}
    assert 1 <= result["response_length"] <= 4
    assert "accuracy 50.0%" in capsys.readouterr().out


def test_cli_eval_from_config_with_pass_at_k(tiny_dir, prompts_file, yes_reward, tmp_path):
    cfg = {
        "model": {"actor_model_name_or_path": str(tiny_dir), "device": "cpu"},
        "trainer": {"max_new_tokens": 3, "max_length": 128},
        "data": {"train_dataset": str(prompts_file)},
        "reward": {"functions": [{"name": f"{yes_reward}:compute_score"}]},
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "e.json"
    assert main(["eval", str(path), "--n", "2", "--samples", "2", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    # rows 0 (yes) and 1 (no): every sample of row 0 right, of row 1 wrong
    assert result["n"] == 2 and result["samples"] == 2
    assert result["pass@k"] == {"pass@1": 0.5, "pass@2": 0.5}


def test_cli_eval_from_config_puts_data_examples_before_each_prompt(
    tiny_dir, prompts_file, yes_reward, tmp_path
):
    shot = [{"role": "user", "content": "What is 36 + 47?"},
            {"role": "assistant", "content": "36 + 47 = 83"}]  # fmt: skip
    cfg = {
        "model": {"actor_model_name_or_path": str(tiny_dir), "device": "cpu"},
        "trainer": {"max_new_tokens": 2, "max_length": 128},
        "data": {"train_dataset": str(prompts_file), "examples": shot},
        "reward": {"functions": [{"name": f"{yes_reward}:compute_score"}]},
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "e.json"
    assert main(["eval", str(path), "--n", "1", "--output", str(out)]) == 0
    [answer] = json.loads(out.read_text())["completions"]
    # the rendered prompt the model saw: the worked turn, then the row's question
    assert answer["prompt"].index("What is 36 + 47?") < answer["prompt"].index("36 + 47 = 83")
    assert answer["prompt"].index("36 + 47 = 83") < answer["prompt"].index("What is 1 + 1?")


def test_cli_eval_bad_input(tiny_dir, prompts_file, tmp_path, capsys):
    assert (
        main(
            [
                "eval",
                "--model",
                str(tiny_dir),
                "--data",
                str(tmp_path / "missing.jsonl"),
                "--reward",
                "gsm8k",
            ]
        )
        == 2
    )
    assert "data file not found" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny_dir), "--data", str(prompts_file)]) == 2
    assert "no reward function" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "--adapter",
                str(tmp_path / "none"),
                "--data",
                str(prompts_file),
                "--reward",
                "gsm8k",
            ]
        )
        == 2
    )
    assert "adapter folder not found" in capsys.readouterr().err


def test_cli_eval_config_says_it_scores_the_base_and_takes_a_run_folder(
    tiny_dir, adapter_dir, prompts_file, yes_reward, tmp_path, capsys
):
    """``danka eval CONFIG`` alone scores the base model (said at the start and in the
    result line, with the run's newest checkpoint to use instead); ``--adapter RUN``
    scores that newest checkpoint."""
    import shutil

    run = tmp_path / "out"
    for step in (1, 2):  # two complete checkpoints (manifest written), 2 is the newest
        shutil.copytree(adapter_dir, run / "actor" / f"checkpoint_{step}")
        (run / "state" / f"checkpoint_{step}").mkdir(parents=True)
        (run / "state" / f"checkpoint_{step}" / "manifest.json").write_text("{}")
    shutil.copytree(adapter_dir, run / "actor" / "checkpoint_3")  # no manifest: incomplete
    cfg = {
        "model": {"actor_model_name_or_path": str(tiny_dir), "device": "cpu"},
        "trainer": {"max_new_tokens": 3, "max_length": 128},
        "data": {"train_dataset": str(prompts_file)},
        "reward": {"functions": [{"name": f"{yes_reward}:compute_score"}]},
        "output_dir": str(run),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    (run / "config.json").write_text(json.dumps(cfg))  # fit writes the resolved config there
    assert main(["eval", str(path), "--n", "2"]) == 0
    out, err = capsys.readouterr()
    assert f"WARNING: no --adapter or --model: this scores the BASE model {tiny_dir}" in err
    assert f"--adapter {run} (its newest checkpoint: {run / 'actor' / 'checkpoint_2'})" in err
    assert "(the BASE model: no --adapter)" in out
    assert "[eval] 2/2 prompts" in err  # progress
    assert main(["eval", str(path), "--n", "2", "--adapter", str(run)]) == 0
    out, err = capsys.readouterr()
    assert f"scoring the newest checkpoint of {run}: {run / 'actor' / 'checkpoint_2'}" in err
    assert "BASE" not in out + err
