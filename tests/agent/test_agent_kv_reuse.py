"""The agent loop on the fast engine: KV cache kept across turns vs full re-prefill (CPU)."""

from __future__ import annotations

import pytest
import torch

from danka.agent.env import UserEnvironment, load_environment_class
from danka.agent.loop import AgentLimits, AgentLoop
from danka.models.tiny import tiny_causal_lm, tiny_tokenizer
from danka.rollout.base import SamplingParams
from danka.rollout.fast import FastEngine
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
        loop = AgentLoop(tok, lambda: UserEnvironment(cls, "env.py:Echo"), limits=limits)
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
