"""``danka generate`` / ``chat`` answer as the model was scored: the run's prompt format
(data.examples, system prompt, instruction) saved beside the adapter, or read from an
older run's config, is put around the prompt by default; ``--no-prompt-format`` turns it
off; the model card shows it."""

from __future__ import annotations

import json
import shutil

import pytest

import danka
from danka.cli import main
from danka.data.prompt_format import PromptFormat
from danka.model_card import CARD_FILE, TRAINING_FILE, training_info, write_folder_card

GREEDY = ["--temperature", "0", "--max-new-tokens", "4", "--device", "cpu"]
EXAMPLES = [
    {"role": "user", "content": "What is 36 + 47?"},
    {"role": "assistant", "content": "36 + 47 = 83"},
]
DATA = {"task": "arithmetic", "examples": EXAMPLES, "instruction": "Answer briefly."}


def _config(tiny_dir):
    return danka.Config.from_dict(
        {
            "model": {"actor_model_name_or_path": str(tiny_dir)},
            "trainer": {"algorithm": "grpo", "total_steps": 2, "batch_size": 2},
            "data": DATA,
            "reward": {"functions": [{"name": "last_number"}]},
        }
    )


@pytest.fixture()
def checkpoint(tiny_dir, adapter_dir, tmp_path):
    """``RUN/actor/checkpoint_2``: the adapter with the card and training facts a run writes."""
    folder = tmp_path / "run" / "actor" / "checkpoint_2"
    shutil.copytree(adapter_dir, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tiny_dir)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    write_folder_card(folder, training_info(_config(tiny_dir), 2, {"eval": []}, lora=True))
    return folder


def _rendered(monkeypatch) -> list[str]:
    """The prompt texts danka.data.template.render_prompt gives the model."""
    import danka.data.template as template

    seen, real = [], template.render_prompt
    monkeypatch.setattr(
        template, "render_prompt", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1]
    )
    return seen


def test_the_checkpoint_keeps_its_format_and_the_card_shows_it(checkpoint):
    info = json.loads((checkpoint / TRAINING_FILE).read_text())
    assert PromptFormat.from_json(info["prompt_format"]) == PromptFormat(
        None, "Answer briefly.", tuple(EXAMPLES)
    )
    card = (checkpoint / CARD_FILE).read_text()
    assert "## Prompt format" in card and "36 + 47 = 83" in card and "--no-prompt-format" in card


def test_generate_applies_the_saved_format_and_the_flag_turns_it_off(
    checkpoint, monkeypatch, capsys
):
    seen = _rendered(monkeypatch)
    argv = ["generate", "--adapter", str(checkpoint), "--prompt", "What is 47 + 38?", *GREEDY]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "prompt format: 1 worked example (data.examples)" in err
    assert "36 + 47 = 83" in seen[-1] and "What is 47 + 38? Answer briefly." in seen[-1]
    assert seen[-1].index("What is 36 + 47?") < seen[-1].index("What is 47 + 38?")

    assert main([*argv, "--no-prompt-format"]) == 0
    assert "prompt format: none (--no-prompt-format)" in capsys.readouterr().err
    assert "36 + 47" not in seen[-1] and "Answer briefly" not in seen[-1]
    assert seen[-1].endswith(
        "<|im_start|>user\nWhat is 47 + 38?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_file_of_prompts_and_chat_get_the_format_too(checkpoint, tmp_path, monkeypatch):
    import io

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 1 + 2?"}) + "\n")
    out = tmp_path / "a.jsonl"
    argv = ["generate", "--adapter", str(checkpoint), "--file", str(prompts), *GREEDY]
    assert main([*argv, "--output", str(out)]) == 0
    assert "36 + 47 = 83" in json.loads(out.read_text())["prompt"]
    assert main([*argv, "--output", str(out), "--no-prompt-format"]) == 0
    assert "36 + 47" not in json.loads(out.read_text())["prompt"]

    seen = _rendered(monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 5 + 6?\n/exit\n"))
    assert main(["chat", "--adapter", str(checkpoint), *GREEDY]) == 0
    assert "36 + 47 = 83" in seen[-1] and "What is 5 + 6? Answer briefly." in seen[-1]


def test_an_older_checkpoint_reads_its_run_config(checkpoint, monkeypatch, capsys):
    """A checkpoint written before the format was saved: the run's config.json has it; a
    folder with neither answers the bare prompt and says nothing about a format."""
    info = json.loads((checkpoint / TRAINING_FILE).read_text())
    del info["prompt_format"]
    (checkpoint / TRAINING_FILE).write_text(json.dumps(info))
    run = checkpoint.parent.parent
    (run / "config.json").write_text(json.dumps({"data": DATA}))
    seen = _rendered(monkeypatch)
    argv = ["generate", "--adapter", str(checkpoint), "--prompt", "What is 47 + 38?", *GREEDY]
    assert main(argv) == 0
    assert str(run / "config.json") in capsys.readouterr().err
    assert "36 + 47 = 83" in seen[-1]

    (run / "config.json").unlink()
    assert main(argv) == 0
    assert "prompt format" not in capsys.readouterr().err
    assert "36 + 47" not in seen[-1]


def test_generate_answers_greedily_by_default_as_evaluation_scores():
    from danka.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["generate", "--model", "m", "--prompt", "x"]).temperature == 0.0
    assert parse(["chat", "--model", "m"]).temperature == 0.7  # a conversation samples
