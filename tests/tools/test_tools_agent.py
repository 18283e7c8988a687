"""``danka generate / chat / eval --tools``: the training's agent loop behind the CLI.

The tiny model never writes a tool call, so generation is a scripted engine (the one of
tests/agent/test_agent_loop.py: call the calculator once, then answer with its result);
everything else is real: the CLI, the loop, the tool worker, the output files."""

from __future__ import annotations

import json

import pytest
import yaml

from danka.cli import main
from tests.agent.test_agent_loop import ScriptedEngine, calculator_script

GREEDY = ["--temperature", "0", "--max-new-tokens", "64", "--device", "cpu"]
RESPONSE = "<tool_response>\n15\n</tool_response>"  # calculator("3 * 5"), default format


@pytest.fixture
def scripted(monkeypatch):
    """Every rollout engine built from now on is the scripted one; returns its call log."""
    from danka.models.tiny import tiny_tokenizer

    engine = ScriptedEngine(tiny_tokenizer(), calculator_script)
    monkeypatch.setattr("danka.rollout.base.build_engine", lambda *a, **k: engine)
    return engine


@pytest.fixture
def calc_file(tmp_path):
    path = tmp_path / "calc.jsonl"
    rows = [("What is 3 * 5?", "15"), ("What is 12 * 34?", "408"), ("What is 6 / 4?", "9")]
    path.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in rows))
    return path


def test_generate_prompt_with_tools_prints_every_turn(tiny_dir, scripted, capsys):
    argv = ["generate", "--model", str(tiny_dir), "--prompt", "What is 3 * 5?", *GREEDY]
    assert main([*argv, "--tools", "calculator"]) == 0
    out = capsys.readouterr().out
    call = '[assistant] <tool_call>{"name": "calculator", "arguments": {"expression": "3 * 5"}}'
    assert out.startswith(call)
    assert f"[user] {RESPONSE}" in out  # SmolLM2-style template: the Hermes response turn
    assert out.rstrip().endswith("[assistant] 15")
    assert scripted.calls == [1, 1]  # two turns, one generate call each


def test_generate_file_with_tools_writes_the_turns(tiny_dir, scripted, calc_file, tmp_path):
    out = tmp_path / "answers.jsonl"
    argv = ["generate", "--model", str(tiny_dir), "--file", str(calc_file), *GREEDY]
    assert main([*argv, "--tools", "calculator", "--output", str(out)]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["completion"] for x in lines] == ["15", "408", "1.5"]
    assert [m["role"] for m in lines[0]["messages"]] == ["assistant", "user", "assistant"]
    assert lines[0]["messages"][1]["content"] == RESPONSE
    assert "<tools>" in lines[0]["prompt"]  # the schemas were offered
    assert scripted.calls == [3, 3]  # all rows in one call per turn


def test_chat_with_tools_keeps_the_tool_turns(tiny_dir, scripted, monkeypatch, capsys):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("What is 3 * 5?\nWhat is 2 * 4?\n/exit\n"))
    assert main(["chat", "--model", str(tiny_dir), *GREEDY, "--tools", "calculator"]) == 0
    out = capsys.readouterr().out
    assert f"[user] {RESPONSE}" in out and "[assistant] 15" in out
    assert "[user] <tool_response>\n8\n</tool_response>" in out and "[assistant] 8" in out
    # the second question's prompt held the first exchange, tool turns included
    assert scripted.calls == [1, 1, 1, 1]


def test_eval_with_tools_scores_the_final_answer(tiny_dir, scripted, calc_file, tmp_path, capsys):
    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(tiny_dir), "--data", str(calc_file), "--reward", "tool_answer"]
    assert main([*argv, *GREEDY[2:], "--tools", "calculator", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    # answers 15, 408 right; 6 / 4 = 1.5 against the (wrong) truth 9: 2 of 3
    assert result["accuracy"] == pytest.approx(2 / 3) and result["tools"] == ["calculator"]
    assert result["agent/tool_calls"] == 1.0 and result["agent/valid_call_samples"] == 1.0
    assert result["completions"][0]["messages"][1]["content"] == RESPONSE
    assert "100.0% of answers with a valid call" in capsys.readouterr().out


def test_eval_of_a_tool_config_uses_its_tools(tiny_dir, scripted, calc_file, tmp_path):
    cfg = {
        "model": {"actor_model_name_or_path": str(tiny_dir), "device": "cpu"},
        "trainer": {"max_new_tokens": 64, "max_length": 1024},
        "rollout": {"tools": ["calculator"], "max_turns": 1, "max_total_tokens": 200},
        "data": {"train_dataset": str(calc_file)},
        "reward": {"functions": [{"name": "tool_answer"}]},
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "e.json"
    # agent.max_turns 1: the call is made, no turn is left for the answer
    assert main(["eval", str(path), "--output", str(out)]) == 0
    assert json.loads(out.read_text())["accuracy"] == 0.0
    # --max-turns replaces the config's limit: call, then answer
    assert main(["eval", str(path), "--max-turns", "2", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["accuracy"] == pytest.approx(2 / 3) and result["agent/turns"] == 2.0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tools", "no_such_tool"], "no_such_tool"),
        (["--tools", "missing.py:fn"], "missing.py"),
        (["--tools", ","], "--tools is empty"),
        (["--max-turns", "2"], "--max-turns needs --tools"),
        (["--tools", "calculator", "--max-turns", "0"], "max_turns must be >= 1"),
        (["--tools", "calculator", "--tool-prompt", "hermez"], "agent.tool_prompt"),
        (["--tools", "calculator", "--tool-demo", "nodemo.json"], "tool demo file not found"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "chat", "eval"])
def test_bad_tool_flags_exit_2_before_any_model_loads(command, flags, message, tmp_path, capsys):
    args = {
        "generate": ["--prompt", "hi"],
        "chat": [],
        "eval": ["--data", str(tmp_path / "d.jsonl"), "--reward", "tool_answer"],
    }[command]
    if command == "eval":
        (tmp_path / "d.jsonl").write_text('{"prompt": "hi", "answer": "1"}\n')
    model = str(tmp_path / "no_model")  # loading it would fail with another message
    assert main([command, "--model", model, *args, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("danka: error:") == 1
