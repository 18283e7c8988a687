"""``data.examples`` (few-shot turns before every prompt): loaded as written, refused with
the key and the fix when the turns cannot be a worked example."""

from pathlib import Path

import pytest

from danka.cli import main
from danka.config import load_config
from danka.errors import UserError

BASE = """
model:
  actor_model_name_or_path: some/model
data:
  train_dataset: rows.jsonl
"""
SHOT = """  examples:
    - {role: user, content: "What is 36 + 47?"}
    - {role: assistant, content: "36 + 47 = 83"}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_examples_load_as_written(tmp_path):
    cfg, _ = load_config(write(tmp_path, BASE + SHOT))
    assert cfg.data.examples == [
        {"role": "user", "content": "What is 36 + 47?"},
        {"role": "assistant", "content": "36 + 47 = 83"},
    ]
    assert load_config(write(tmp_path, BASE))[0].data.examples == []  # none by default


@pytest.mark.parametrize(
    "examples, words",
    [
        ('"What is 36 + 47?"', "expected list"),  # the loader's type check names the key too
        ('["What is 36 + 47?"]', "expected dict"),  # turns as plain strings
        ('[{role: user, content: "Q?"}]', "end with a user turn"),
        ('[{role: assistant, content: "83"}]', "turn 0 has role 'assistant', expected 'user'"),
        ('[{role: system, content: "S"}, {role: user, content: "Q?"}]', "role 'system'"),
        ('[{role: user, content: "Q?"}, {role: assistant, content: "  "}]', "turn 1 .* no text"),
        ('[{role: user, text: "Q?"}, {role: assistant, content: "A"}]', "not a {role, content}"),
        ('[{role: user, content: "Q?"}, {role: assistant, content: 83}]', "turn 1 .* no text"),
    ],
)
def test_bad_examples_name_the_key_and_the_fix(tmp_path, examples, words):
    with pytest.raises(UserError, match=words) as err:
        load_config(write(tmp_path, BASE + f"  examples: {examples}\n"))
    assert "data.examples" in str(err.value)


def test_bad_examples_exit_2_with_the_fix(tmp_path, capsys):
    path = write(tmp_path, BASE + '  examples: [{role: user, content: "Q?"}]\n')
    assert main(["train", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "data.examples" in err and "ending with the assistant's" in err
    assert "Traceback" not in err
