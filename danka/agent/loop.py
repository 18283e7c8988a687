"""The multi-turn rollout: generate a turn, let the environment answer, repeat.

Per step, with ``B = len(prompts) * n`` samples (sample ``i * n + j`` answers prompt i):

1. every sample starts from its prompt ids; its environment is reset with its row;
2. all still-active samples generate their next assistant turn in ONE
   ``session.generate`` call (``n=1``: the samples are already expanded), each up to the
   end-of-turn token or the per-turn cap ``params.max_new_tokens``;
3. each turn is decoded and passed to the environment (tools: parse the ``<tool_call>``
   blocks and run them in the guarded worker); a turn without a call, ``done``, a cut
   turn (no end-of-turn token), or a limit ends the sample;
4. the environment's messages (tool responses, observations) and the next assistant
   header are tokenized through the chat template and appended with ``loss_mask`` 0;
5. repeat until no sample is active or ``max_turns`` turns were generated.

Limits: ``max_turns`` (assistant turns), ``max_tool_calls`` (per sample),
``max_total_tokens`` (response tokens over all turns, tool tokens included). Works with
every engine: through its ``session`` when it has one (the fast engine keeps each
sample's KV cache across turns and prefills only the inserted tokens; ``agent/prefill_tokens``
and ``agent/reused_tokens`` report it per sample), else through ``generate``, which
re-encodes the whole prefix each turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from danka.agent.chat import ChatFormat
from danka.agent.env import Step
from danka.agent.rewards import TRUNCATED
from danka.agent.worker import ToolRunner
from danka.data.template import left_pad
from danka.errors import UserError
from danka.rollout.base import RolloutEngine, SamplingParams
from danka.types import PromptRow, RolloutBatch


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int = 4  # assistant turns per sample
    max_tool_calls: int = 8  # tool calls per sample
    max_total_tokens: int = 512  # response tokens per sample: all turns + inserted turns


@dataclass
class _Sample:
    prompt: list[int]
    env: Any
    messages: list[dict[str, Any]]
    n_prompt_messages: int = 0
    ids: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    active: bool = True
    truncated: bool = False
    stop_reason: str = "max_turns"
    turns: int = 0
    calls: int = 0
    valid_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    env_reward: float = 0.0


@dataclass
class AgentRollout:
    """One step's multi-turn rollout. ``batch`` is shaped as single-turn engines return
    it: ``response_ids``/``response_mask`` (B, R) cover every model turn AND every
    inserted tool/environment token; ``rollout_logprobs`` is 0 on inserted tokens (None
    if the engine reports none)."""

    batch: RolloutBatch
    loss_mask: torch.Tensor  # (B, R) float, 1 only on model-generated tokens
    trajectories: list[list[dict[str, Any]]]  # per sample: prompt + all turns as messages
    final_texts: list[str]  # per sample: the last assistant turn (the final answer)
    env_rewards: torch.Tensor  # (B,) float, sum of the environment's step rewards
    stop_reasons: list[str]  # answer | env_done | max_turns | max_tool_calls | length
    metrics: dict[str, float]
    prompt_lengths: list[int]  # per sample: how many trajectory messages are the prompt

    @property
    def completions(self) -> list[list[dict[str, Any]]]:
        """Per sample, the messages after the prompt (what rewards score, TRL-style)."""
        return [t[n:] for t, n in zip(self.trajectories, self.prompt_lengths)]


class AgentLoop:
    """Multi-turn rollouts for one tokenizer and one kind of environment.

    ``make_env()`` returns a fresh environment per sample (a ``ToolEnvironment`` or a
    ``UserEnvironment``); ``schemas`` are the tool schemas shown in the prompt.
    """

    def __init__(
        self,
        tokenizer: Any,
        make_env: Callable[[], Any],
        *,
        schemas: list[dict[str, Any]] | None = None,
        limits: AgentLimits = AgentLimits(),
        chat: ChatFormat | None = None,
        runner: ToolRunner | None = None,
        kv_reuse: bool | None = None,
    ):
        self.tokenizer, self.make_env, self.limits = tokenizer, make_env, limits
        self.kv_reuse = kv_reuse  # agent.kv_reuse: see open_session
        self.schemas = list(schemas or [])
        self.chat = chat or ChatFormat(tokenizer)
        self.runner = runner  # the tool worker, stopped by close()

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()

    def encode_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a prompt offering the tools (chat template or default text)."""
        text = self.chat.prompt(messages, self.schemas)
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def rollout(
        self,
        engine: RolloutEngine,
        model: torch.nn.Module,
        rows: list[PromptRow],
        prompt_messages: list[list[dict[str, Any]]],
        params: SamplingParams,
        *,
        eos_ids: list[int],
        pad_id: int,
        generator: torch.Generator | None = None,
    ) -> AgentRollout:
        """``params.n`` multi-turn samples per row (see the module docstring)."""
        lim = self.limits
        samples = []
        for row, msgs in zip(rows, prompt_messages):  # 1. start every sample
            for _ in range(params.n):
                env = self.make_env()
                first = env.reset(row)
                msgs_k = [dict(m) for m in msgs]
                if first is not None:  # the environment poses the first user message
                    msgs_k = [m for m in msgs_k if m["role"] == "system"]
                    msgs_k.append({"role": "user", "content": first})
                prompt = self.encode_prompt(msgs_k)
                shown = self.chat.prompt_messages(msgs_k, self.schemas)
                samples.append(_Sample(prompt, env, shown, len(shown)))
        has_logprobs = True
        session = open_session(
            engine, model, self.kv_reuse, eos_ids=eos_ids, pad_id=pad_id, generator=generator
        )
        try:
            for turn in range(lim.max_turns):
                keys = [i for i, s in enumerate(samples) if s.active]
                if not keys:
                    break
                active = [samples[i] for i in keys]
                budget = max(lim.max_total_tokens - len(s.ids) for s in active)
                turn_params = replace(
                    params, n=1, max_new_tokens=min(params.max_new_tokens, budget)
                )
                # 2. one batched call for every active sample (the session drops the others)
                out = session.generate(keys, [s.prompt + s.ids for s in active], turn_params)
                has_logprobs &= out.rollout_logprobs is not None
                for k, s in enumerate(active):
                    self._take_turn(s, out, k, set(eos_ids), last=turn == lim.max_turns - 1)
        finally:
            session.close()
        for s in samples:
            s.active = False
        rollout = self._pack(samples, has_logprobs, pad_id, params.n)
        for name, value in getattr(session, "stats", {}).items():  # KV re-use across turns
            rollout.metrics[f"agent/{name}"] = value / len(samples)
        return rollout

    def _take_turn(self, s: _Sample, out: RolloutBatch, k: int, eos: set[int], last: bool):
        """Steps 3 and 4 for sample ``s`` (row ``k`` of this turn's ``out``)."""
        length = int(out.response_mask[k].sum())
        room = self.limits.max_total_tokens - len(s.ids)
        ids = out.response_ids[k, : min(length, room)].tolist()
        lps = (
            out.rollout_logprobs[k, : len(ids)].tolist()
            if out.rollout_logprobs is not None
            else [0.0] * len(ids)
        )
        s.ids += ids
        s.loss += [1.0] * len(ids)
        s.logprobs += lps
        s.turns += 1
        ended = bool(ids) and ids[-1] in eos
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if not ended:  # cut by the per-turn cap or the total budget: its calls never run
            s.messages.append({"role": "assistant", "content": text, TRUNCATED: True})
            s.active, s.truncated, s.stop_reason = False, True, "length"
            return
        step: Step = s.env.step(text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if step.call_log:
            message["tool_calls"] = step.call_log
        s.messages.append(message)
        s.calls += step.calls
        s.valid_calls += step.valid_calls
        s.tool_errors += step.tool_errors
        s.tool_seconds += step.tool_seconds
        s.env_reward += step.reward
        if step.done:
            s.active, s.stop_reason = False, step.stop_reason or "env_done"
            return
        if last:  # no turn left to read the answer: insert nothing
            s.active, s.stop_reason = False, "max_turns"
            return
        end_text = self.tokenizer.decode(ids[-1:], skip_special_tokens=False)
        inserted = self._encode(self.chat.continuation(step.messages, end_text))
        s.messages += step.messages
        if len(s.ids) + len(inserted) >= self.limits.max_total_tokens:
            # no room for the tool response plus at least one generated token
            s.active, s.truncated, s.stop_reason = False, True, "length"
            return
        s.ids += inserted
        s.loss += [0.0] * len(inserted)
        s.logprobs += [0.0] * len(inserted)

    def _pack(self, samples: list[_Sample], has_logprobs: bool, pad_id: int, n: int):
        b = len(samples)
        width = max(1, max(len(s.ids) for s in samples))
        r_ids = torch.full((b, width), pad_id, dtype=torch.long)
        r_mask = torch.zeros((b, width), dtype=torch.float32)
        loss = torch.zeros((b, width), dtype=torch.float32)
        lp = torch.zeros((b, width), dtype=torch.float32)
        for k, s in enumerate(samples):
            r_ids[k, : len(s.ids)] = torch.tensor(s.ids, dtype=torch.long)
            r_mask[k, : len(s.ids)] = 1.0
            loss[k, : len(s.ids)] = torch.tensor(s.loss)
            lp[k, : len(s.ids)] = torch.tensor(s.logprobs)
        p_ids, p_mask = left_pad([s.prompt for s in samples], pad_id)
        batch = RolloutBatch(
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            response_ids=r_ids,
            response_mask=r_mask,
            group_index=torch.arange(b, dtype=torch.long) // n,
            truncated=torch.tensor([s.truncated for s in samples], dtype=torch.bool),
            rollout_logprobs=lp if has_logprobs else None,
        )
        finals = [
            next((m["content"] for m in reversed(s.messages) if m["role"] == "assistant"), "")
            for s in samples
        ]
        return AgentRollout(
            batch=batch,
            loss_mask=loss,
            trajectories=[s.messages for s in samples],
            final_texts=finals,
            env_rewards=torch.tensor([s.env_reward for s in samples], dtype=torch.float32),
            stop_reasons=[s.stop_reason for s in samples],
            metrics=rollout_metrics(samples),
            prompt_lengths=[s.n_prompt_messages for s in samples],
        )


class _Regenerate:
    """The turns of an engine without sessions: ``generate`` re-prefills every prefix."""

    def __init__(self, engine: RolloutEngine, model: torch.nn.Module, **generate_kw: Any):
        self.engine, self.model, self.generate_kw = engine, model, generate_kw

    def generate(self, keys: list[int], sequences: list[list[int]], params: SamplingParams):
        return self.engine.generate(self.model, sequences, params, **self.generate_kw)

    def close(self) -> None:
        pass


def open_session(
    engine: RolloutEngine,
    model: torch.nn.Module,
    kv_reuse: bool | None = None,
    **generate_kw: Any,
):
    """The engine's multi-turn session (``engine.session``: the fast engine keeps each
    sample's KV cache across turns and prefills only new tokens) when ``kv_reuse``
    (agent.kv_reuse) is None and the engine has one, or is True (an engine without one
    is then refused); else one that calls ``engine.generate`` each turn.
    ``generate_kw``: ``eos_ids``, ``pad_id``, ``generator``."""
    opener = getattr(engine, "session", None)
    if kv_reuse is False or (kv_reuse is None and opener is None):
        return _Regenerate(engine, model, **generate_kw)
    if opener is None:
        what = f"agent.kv_reuse needs the fast rollout engine; this run uses {engine.name!r}"
        fix = "set rollout.engine: fast (a CUDA GPU), or agent.kv_reuse: false"
        raise UserError(what, where="agent.kv_reuse", fix=fix)
    return opener(model, **generate_kw)


def rollout_metrics(samples: list[Any]) -> dict[str, float]:
    """Means over samples; ``agent/valid_call_rate`` is over all attempted calls,
    ``agent/valid_call_samples`` the share of samples with at least one valid call."""
    b = max(1, len(samples))
    calls = sum(s.calls for s in samples)
    metrics = {
        "agent/turns": sum(s.turns for s in samples) / b,
        "agent/tool_calls": calls / b,
        "agent/valid_call_rate": sum(s.valid_calls for s in samples) / calls if calls else 0.0,
        "agent/valid_call_samples": sum(s.valid_calls > 0 for s in samples) / b,
        "agent/tool_errors": sum(s.tool_errors for s in samples) / b,
        "agent/tool_time_s": sum(s.tool_seconds for s in samples),
        "agent/loss_tokens": sum(sum(s.loss) for s in samples) / b,
        "agent/inserted_tokens": sum(len(s.loss) - sum(s.loss) for s in samples) / b,
    }
    for reason in sorted({s.stop_reason for s in samples}):
        metrics[f"agent/stop/{reason}"] = sum(s.stop_reason == reason for s in samples) / b
    return metrics
