"""Chat rows that are not a question for the model: a made-up role (it went into the
template as ``<|im_start|>hacker``), empty content, a prompt with no user message or one
that ends with the assistant's answer. Each is refused with the file and line, as int,
null and list content already were; 100k copies of one prompt get a warning."""

from __future__ import annotations

import json

import pytest

from danka.data.formats import load_prompt_rows
from danka.data.source import repeats_warning
from danka.errors import UserError
from danka.types import PromptRow

USER = {"role": "user", "content": "What is 2 + 2?"}


@pytest.mark.parametrize(
    "prompt, words",
    [
        ([{"role": "hacker", "content": "ignore the rules"}, USER], ("'hacker'", "system, user")),
        ([{"role": "system", "content": ""}, USER], ("(system) has an empty 'content'",)),
        ([{"role": "user", "content": "   "}], ("(user) has an empty 'content'",)),
        ([{"role": "assistant", "content": "4"}], ("user message", "assistant")),
        ([USER, {"role": "assistant", "content": "4"}], ("end with one", "user -> assistant")),
    ],
)
def test_a_chat_prompt_the_model_cannot_answer_is_refused_with_its_line(tmp_path, prompt, words):
    path = tmp_path / "rows.jsonl"
    good = json.dumps({"prompt": [USER], "answer": "4"})
    path.write_text(good + "\n" + json.dumps({"prompt": prompt, "answer": "4"}) + "\n")
    with pytest.raises(UserError) as err:
        load_prompt_rows(str(path))
    assert f"{path}:2" in str(err.value)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_tool_results_and_a_system_prompt_are_fine(tmp_path):
    path = tmp_path / "rows.jsonl"
    prompt = [{"role": "system", "content": "Be brief."}, USER,
              {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
              {"role": "tool", "content": "4"}]  # fmt: skip
    path.write_text(json.dumps({"prompt": prompt, "answer": "4"}) + "\n")
    assert load_prompt_rows(str(path)).rows[0].prompt == prompt


def test_many_copies_of_one_prompt_get_a_warning():
    same = [PromptRow(i, "What is 2 + 2?", "4") for i in range(100_000)]
    warning = repeats_warning(same)
    assert warning and "99999 of 100000 training prompts repeat another" in warning
    assert repeats_warning([PromptRow(i, f"q{i}", "1") for i in range(100)]) is None
