"""The multi-turn loop on a scripted engine (exact tokens) and on the real HF engine."""

from __future__ import annotations

import pytest
import torch

from danka.agent.env import UserEnvironment, load_environment_class
from danka.agent.loop import AgentLimits, AgentLoop
from danka.agent.setup import build_agent_loop
from danka.models.tiny import tiny_tokenizer
from danka.rollout.base import SamplingParams, finish_batch
from danka.schema.sections import AgentConfig
from danka.types import PromptRow

LIMITS = AgentLimits(max_turns=4, max_tool_calls=4, max_total_tokens=400)
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'


class ScriptedEngine:
    """Answers each prompt with ``script(decoded_prompt)`` + the end-of-turn token; records
    how many sequences every generate call got."""

    name = "scripted"

    def __init__(self, tokenizer, script):
        self.tok, self.script, self.calls = tokenizer, script, []

    def generate(self, model, prompt_ids, params, *, eos_ids, pad_id, generator=None):
        self.calls.append(len(prompt_ids))
        texts = [self.script(self.tok.decode(ids)) for ids in prompt_ids]
        responses = [ids + [2] for ids in self.tok(texts, add_special_tokens=False)["input_ids"]]
        limits = {"eos_ids": eos_ids, "pad_id": pad_id, "max_new_tokens": params.max_new_tokens}
        return finish_batch(prompt_ids, responses, params.n, **limits)


def calculator_script(prompt: str) -> str:
    """Question "What is A * B?" -> call the tool once, then answer with its result (the
    newest question counts: a chat holds earlier ones)."""
    if prompt.rfind("<tool_response>") > prompt.rfind("What is "):
        return prompt.rsplit("<tool_response>\n", 1)[1].split("\n", 1)[0]
    question = prompt.rsplit("What is ", 1)[1].split("?")[0]
    return CALL % question


@pytest.fixture
def tok():
    return tiny_tokenizer()


@pytest.fixture
def tool_loop(tok):
    loops = []

    def make(limits=LIMITS):
        kw = {k: getattr(limits, k) for k in ("max_turns", "max_tool_calls", "max_total_tokens")}
        loops.append(
            build_agent_loop(
                AgentConfig(tools=["calculator"], tool_demo="none", **kw),  # no worked examples
                tok,
                base_dir=".",
                max_new_tokens=limits.max_total_tokens,
            )
        )
        return loops[-1]

    yield make
    for loop in loops:
        loop.close()


def rollout(loop, engine, questions, n=1, max_new_tokens=200):
    rows = [PromptRow(index=i, prompt=q) for i, q in enumerate(questions)]
    msgs = [[{"role": "user", "content": q}] for q in questions]
    params = SamplingParams(n=n, temperature=0.0, max_new_tokens=max_new_tokens)
    return loop.rollout(engine, None, rows, msgs, params, eos_ids=[2], pad_id=0)


def test_loss_mask_covers_model_tokens_only(tok, tool_loop):
    engine = ScriptedEngine(tok, calculator_script)
    out = rollout(tool_loop(), engine, ["What is 12 * 34?"])
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    turn1 = enc(CALL % "12 * 34") + [2]
    # Hand-built: after the model's <|im_end|> the ChatML template closes the line, adds
    # the tool response as a user turn (no native tool support) and opens the next turn.
    inserted = enc("\n") + [1] + enc("user\n<tool_response>\n408\n</tool_response>") + [2]
    inserted += enc("\n") + [1] + enc("assistant\n")
    turn2 = enc("408") + [2]
    expected = turn1 + inserted + turn2
    b = out.batch
    assert b.response_ids[0].tolist() == expected
    assert b.response_mask[0].tolist() == [1.0] * len(expected)
    assert out.loss_mask[0].tolist() == [1.0] * len(turn1) + [0.0] * len(inserted) + [1.0] * len(
        turn2
    )
    assert out.final_texts == ["408"] and out.stop_reasons == ["answer"]
    assert [m["role"] for m in out.completions[0]] == ["assistant", "user", "assistant"]
    assert [m["role"] for m in out.trajectories[0]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert out.trajectories[0][2]["tool_calls"][0]["function"]["name"] == "calculator"
    assert "<tools>" in tok.decode(b.prompt_ids[0])  # the default tool system text
    assert out.metrics["agent/tool_calls"] == 1.0 and out.metrics["agent/valid_call_rate"] == 1.0
    assert out.metrics["agent/turns"] == 2.0 and not b.truncated.any()


def test_finished_samples_drop_out_of_the_next_generate_call(tok, tool_loop):
    def script(prompt):  # question 0 answers at once, question 1 uses the tool
        return "7" if "What is 7?" in prompt else calculator_script(prompt)

    engine = ScriptedEngine(tok, script)
    out = rollout(tool_loop(), engine, ["What is 7?", "What is 2 * 3?"], n=2)
    assert engine.calls == [4, 2]  # 2 prompts x n=2, then only the two tool users
    assert out.final_texts == ["7", "7", "6", "6"]
    assert out.batch.group_index.tolist() == [0, 0, 1, 1]
    assert out.loss_mask[0].sum() == out.batch.response_mask[0].sum()  # no tool tokens
    assert out.metrics["agent/tool_calls"] == 0.5  # 2 calls over 4 samples


def test_limits_end_samples(tok, tool_loop):
    always_call = ScriptedEngine(tok, lambda p: CALL % "1 + 1")
    out = rollout(
        tool_loop(AgentLimits(max_turns=2, max_tool_calls=9, max_total_tokens=900)),
        always_call,
        ["What is 1?"],
    )
    assert out.stop_reasons == ["max_turns"] and out.metrics["agent/turns"] == 2.0
    # the last turn's tool response is not appended: the response ends with the model's EOS
    assert out.batch.response_ids[0, -1].item() == 2 and out.loss_mask[0, -1].item() == 1.0

    out = rollout(
        tool_loop(AgentLimits(max_turns=9, max_tool_calls=1, max_total_tokens=900)),
        always_call,
        ["What is 1?"],
    )
    assert out.stop_reasons == ["max_tool_calls"] and out.metrics["agent/tool_calls"] == 1.0

    out = rollout(
        tool_loop(AgentLimits(max_turns=9, max_tool_calls=9, max_total_tokens=100)),
        always_call,
        ["What is 1?"],
    )
    assert out.stop_reasons == ["length"] and out.batch.truncated.tolist() == [True]
    assert out.batch.response_mask.sum() <= 100


def test_a_cut_turn_is_marked_and_its_call_earns_no_bonus(tok, tool_loop):
    """A complete <tool_call> block, then no end-of-turn token before the per-turn cap
    (120 tokens): the call never runs, the turn is marked truncated, and the tool_answer
    bonus (0.1 x valid / calls) does not count it: 0.0, not 0.1."""
    from danka.agent.rewards import TRUNCATED, tool_answer_reward

    rambles = ScriptedEngine(tok, lambda p: CALL % "12*34" + " and so on" * 200)
    out = rollout(tool_loop(), rambles, ["What is 12*34?"], max_new_tokens=120)
    assert out.stop_reasons == ["length"] and out.metrics["agent/tool_calls"] == 0.0
    (turn,) = out.completions[0]
    assert turn[TRUNCATED] is True and "</tool_call>" in turn["content"]
    assert tool_answer_reward(None, out.completions, ["408"]) == [0.0]


def test_malformed_call_gets_an_error_turn_and_lowers_the_valid_rate(tok, tool_loop):
    def script(prompt):
        if "<tool_response>" in prompt:
            return "done"
        return '<tool_call>{"name": "calculator", "arguments": {"expression": 1</tool_call>'

    out = rollout(tool_loop(), ScriptedEngine(tok, script), ["What is 1?"])
    assert "error: the tool call is not valid JSON" in out.trajectories[0][3]["content"]
    assert out.metrics["agent/valid_call_rate"] == 0.0 and out.final_texts == ["done"]


ENV_FILE = '''
class Guess:
    """Guess the secret; the episode ends early on a right guess."""

    def reset(self, row):
        self.secret, self.tries = row.extra["secret"], 0
        return "Guess my number between 1 and 9."

    def step(self, action_text):
        self.tries += 1
        if action_text.strip() == self.secret:
            return None, 1.0, True
        return "Wrong, try again.", -0.25, False
'''


def test_environment_that_ends_early(tok, tmp_path):
    (tmp_path / "env.py").write_text(ENV_FILE)
    spec = "env.py:Guess"
    cls = load_environment_class(spec, tmp_path)
    loop = AgentLoop(tok, lambda: UserEnvironment(cls, spec), limits=AgentLimits(max_turns=5))
    guesses = iter(["3", "5", "4"])  # sample 0 guesses 3 (right); sample 1: 5 then 4
    engine = ScriptedEngine(tok, lambda p: next(guesses))
    rows = [
        PromptRow(0, "ignored", extra={"secret": "3"}),
        PromptRow(1, "x", extra={"secret": "4"}),
    ]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=20)
    out = loop.rollout(
        engine, None, rows, [[{"role": "user", "content": "x"}]] * 2, params, eos_ids=[2], pad_id=0
    )
    assert engine.calls == [2, 1]
    assert out.stop_reasons == ["env_done", "env_done"]
    assert out.env_rewards.tolist() == [1.0, 0.75]  # -0.25 + 1.0
    assert out.trajectories[1][0] == {"role": "user", "content": "Guess my number between 1 and 9."}
    assert [m["content"] for m in out.trajectories[1][1:]] == ["5", "Wrong, try again.", "4"]


def test_bad_environment_is_a_user_error(tmp_path):
    from danka.errors import UserError

    (tmp_path / "env.py").write_text("class NotEnv:\n    pass\n")
    with pytest.raises(UserError, match="missing: reset, step"):
        load_environment_class("env.py:NotEnv", tmp_path)


def test_two_turns_with_the_real_hf_engine_on_a_tiny_model(tok, tmp_path):
    from danka.models.tiny import tiny_causal_lm
    from danka.rollout.hf import HFGenerateEngine

    (tmp_path / "env.py").write_text(
        "class Twice:\n"
        "    def reset(self, row):\n        self.k = 0\n\n"
        "    def step(self, text):\n        self.k += 1\n"
        "        return 'again', float(self.k), self.k == 2\n"
    )
    cls = load_environment_class("env.py:Twice", tmp_path)
    loop = AgentLoop(
        tok,
        lambda: UserEnvironment(cls, "env.py:Twice"),
        limits=AgentLimits(max_turns=3, max_total_tokens=64),
    )
    model = tiny_causal_lm(tok)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    torch.nn.init.zeros_(head.weight)
    with torch.no_grad():
        head.bias.zero_()
        head.bias[2] = 10.0  # greedy decoding always ends the turn at once
    model.lm_head = head
    rows = [PromptRow(0, "hi"), PromptRow(1, "ho")]
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    msgs = [[{"role": "user", "content": r.prompt}] for r in rows]
    out = loop.rollout(HFGenerateEngine(), model, rows, msgs, params, eos_ids=[2], pad_id=0)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    inserted = enc("\n") + [1] + enc("user\nagain") + [2] + enc("\n") + [1] + enc("assistant\n")
    expected = [2] + inserted + [2]  # turn 1 (just EOS), observation, turn 2
    assert out.batch.response_ids.tolist() == [expected] * 4
    assert out.loss_mask.tolist() == [[1.0] + [0.0] * len(inserted) + [1.0]] * 4
    assert out.env_rewards.tolist() == [3.0] * 4  # 1 + 2
    assert out.stop_reasons == ["env_done"] * 4 and out.metrics["agent/turns"] == 2.0
    assert out.batch.group_index.tolist() == [0, 0, 1, 1]
    assert tok.decode(out.batch.prompt_ids[2], skip_special_tokens=True).endswith("ho\nassistant\n")


def test_an_environment_that_raises_is_a_user_error_naming_the_row(tok, tmp_path):
    from danka.errors import UserError

    (tmp_path / "env.py").write_text(
        "class Broken:\n    def reset(self, row):\n        return None\n\n"
        "    def step(self, text):\n        raise KeyError('score')\n"
    )
    cls = load_environment_class("env.py:Broken", tmp_path)
    loop = AgentLoop(tok, lambda: UserEnvironment(cls, "env.py:Broken"))
    with pytest.raises(UserError, match=r"while stepping \(data row 0\)[\s\S]*KeyError"):
        rollout(loop, ScriptedEngine(tok, lambda p: "hi"), ["x"])


def test_agent_generate_for_the_cli(tok, monkeypatch):
    from danka.agent import setup
    from danka.rollout.base import AnswerOptions

    engine = ScriptedEngine(tok, calculator_script)
    monkeypatch.setattr("danka.rollout.base.build_engine", lambda *a, **k: engine)
    rows = [PromptRow(index=7, prompt="What is 3 * 5?")]
    loop = build_agent_loop(
        AgentConfig(tools=["calculator"]), tok, base_dir=".", max_new_tokens=200
    )
    [item], metrics = setup.agent_generate(
        None, tok, rows, loop, AnswerOptions(n=2, max_new_tokens=200)
    )
    loop.close()
    assert item["index"] == 7 and item["completions"] == ["15", "15"]
    assert item["trajectories"][0][1]["content"] == "<tool_response>\n15\n</tool_response>"
    assert "<tools>" in item["prompt"] and metrics["agent/tool_calls"] == 1.0
    # the calculator's worked examples (tool_demo auto) precede the question in the prompt
    assert item["prompt"].index("What is 12 * 34?") < item["prompt"].index("What is 3 * 5?")
    assert "<tool_response>\n408\n</tool_response>" in item["prompt"]
