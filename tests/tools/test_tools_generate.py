import json

import pytest

from danka.cli import main
from danka.errors import UserError
from danka.tools.generate import chat_loop, generate_text, load_for_inference, read_adapter_config

GREEDY = ["--temperature", "0", "--max-new-tokens", "6", "--device", "cpu"]


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_for_inference(str(tiny_dir), device="cpu", log=lambda m: None)


def test_single_prompt_streams_and_matches_the_function(tiny_dir, tiny, tmp_path, capsys):
    model, tok = tiny
    assert main(["generate", "--model", str(tiny_dir), "--prompt", "Hi", *GREEDY]) == 0
    streamed = capsys.readouterr().out
    answer = generate_text(model, tok, "Hi", max_new_tokens=6, temperature=0, stream=False)
    assert streamed.rstrip("\n") == answer  # TextStreamer printed the same greedy answer
    out = tmp_path / "one.jsonl"
    assert (
        main(
            ["generate", "--model", str(tiny_dir), "--prompt", "Hi", *GREEDY, "--output", str(out)]
        )
        == 0
    )
    assert json.loads(out.read_text()) == {"prompt": "Hi", "completion": answer}


def test_file_of_prompts_writes_one_line_per_answer(tiny_dir, prompts_file, tmp_path):
    out = tmp_path / "answers.jsonl"
    assert (
        main(
            [
                "generate",
                "--model",
                str(tiny_dir),
                "--file",
                str(prompts_file),
                *GREEDY,
                "--batch-size",
                "3",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["index"] for x in lines] == [0, 1, 2, 3]
    # the chat template was applied (tiny tokenizer: SmolLM2-like ChatML)
    assert lines[1]["prompt"].endswith(
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert all(1 <= x["response_tokens"] <= 6 for x in lines)
    assert all(x["truncated"] == (x["response_tokens"] == 6) for x in lines)


def test_adapter_changes_the_answer(tiny_dir, adapter_dir, tiny):
    model, tok = tiny
    with_adapter, tok2 = load_for_inference(
        None, str(adapter_dir), device="cpu", log=lambda m: None
    )  # base from adapter_config
    assert type(with_adapter).__name__ == "PeftModelForCausalLM"
    kw = dict(max_new_tokens=8, temperature=0, stream=False)
    assert generate_text(model, tok, "Hello", **kw) != generate_text(
        with_adapter, tok2, "Hello", **kw
    )


def test_chat_keeps_the_conversation(tiny, monkeypatch):
    import danka.tools.generate as g

    model, tok = tiny
    lines = iter(["hello", "", "and again", "/exit", "never read"])
    seen, real = [], g.generate_text

    def spy(m, t, messages, **kw):
        seen.append([x["content"] for x in messages])
        return real(m, t, messages, **kw)

    monkeypatch.setattr(g, "generate_text", spy)
    convo = chat_loop(
        model, tok, read_line=lambda _: next(lines), max_new_tokens=4, temperature=0, stream=False
    )
    assert [m["role"] for m in convo] == ["user", "assistant", "user", "assistant"]
    # the second turn's prompt holds the first exchange; the empty line is skipped
    assert seen == [["hello"], ["hello", convo[1]["content"], "and again"]]


def test_cli_chat_reads_stdin(tiny_dir, monkeypatch, capsys):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n/exit\n"))
    assert main(["chat", "--model", str(tiny_dir), *GREEDY]) == 0
    assert "/exit quits" in capsys.readouterr().out


def test_bad_input_exits_2(tiny_dir, tmp_path, capsys):
    assert (
        main(
            [
                "generate",
                "--model",
                str(tiny_dir),
                "--adapter",
                str(tmp_path / "nope"),
                "--prompt",
                "x",
            ]
        )
        == 2
    )
    assert "adapter folder not found" in capsys.readouterr().err
    assert main(["generate", "--model", str(tiny_dir), "--file", str(tmp_path / "none.jsonl")]) == 2
    assert "prompts file not found" in capsys.readouterr().err
    with pytest.raises(UserError, match="pass it as --model"):
        read_adapter_config(tiny_dir)  # a full model folder, not an adapter
