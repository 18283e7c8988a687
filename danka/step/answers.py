"""Step 2, sampling: answers to a step's prompts from the live policy, as one ``Rollout``
whether they come from one ``engine.generate`` call or from the multi-turn agent loop
(``agent.tools`` / ``agent.environment``, danka/agent). Held-out evaluation samples
through the same function with greedy settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from danka import distributed as dist
from danka.agent.loop import AgentLoop
from danka.agent.setup import prompt_messages
from danka.rollout.base import RolloutEngine, SamplingParams, engine_meta
from danka.step.guards import Sizes, oom_guard
from danka.step.model_set import ModelSet
from danka.step.prompt_set import PromptSet
from danka.step.records import Rollout
from danka.types import RolloutBatch


@dataclass(frozen=True)
class SampleContext:
    """What sampling needs: the engine, the models, the prompt set it draws from, and the
    sampling settings."""

    engine: RolloutEngine
    models: ModelSet
    prompts: PromptSet
    params: SamplingParams
    tokenizer: object  # decodes response ids (single-turn)
    eos_ids: list[int]
    pad_id: int
    sizes: Sizes  # for an out-of-memory message (at the run's micro-batch)
    agent: AgentLoop | None = None
    environment: bool = False  # agent.environment: its step rewards are a reward part
    system_prompt: str | None = None  # data.system_prompt / instruction / examples (agent)
    instruction: str | None = None
    examples: Sequence[Mapping[str, str]] = ()
    chunk: int = 256  # prompts per call where a caller splits a long list (evaluation)


def decode(tokenizer, batch: RolloutBatch) -> list[str]:
    """The response text of every sample (special tokens dropped)."""
    return [
        tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
        for ids, mask in zip(batch.response_ids, batch.response_mask)
    ]


def _weights(ctx: SampleContext):
    """Under FSDP2 an engine that reads the weights directly needs them gathered."""
    if engine_meta(ctx.engine.name).reads_weights:
        return dist.rollout_weights(ctx.models.policy)
    return nullcontext()


def sample(ctx: SampleContext, prompt_idx: list[int], micro: int) -> Rollout:
    """``ctx.params.n`` answers to each prompt ``prompt_idx`` (rows of ``ctx.prompts``);
    ``micro``: the run's micro-batch, named if the rollout runs out of memory."""
    device = next(ctx.models.policy.parameters()).device
    with oom_guard("rollout", ctx.sizes.at(micro), device), _weights(ctx), ctx.models.actor():
        if ctx.agent is not None:
            return _agent(ctx, prompt_idx)
        batch = ctx.engine.generate(
            ctx.models.policy,
            [ctx.prompts.ids[i] for i in prompt_idx],
            ctx.params,
            eos_ids=ctx.eos_ids,
            pad_id=ctx.pad_id,
        )
    batch.prompt_index = torch.tensor(prompt_idx, dtype=torch.long)[batch.group_index]
    texts = decode(ctx.tokenizer, batch)
    return Rollout(batch=batch, completions=texts, shown=texts)


def _agent(ctx: SampleContext, prompt_idx: list[int]) -> Rollout:
    """The multi-turn loop: ``loss_mask`` 0 on tool and environment tokens; the rewards
    read each sample's final answer, the log shows its messages."""
    assert ctx.agent is not None
    rows = [ctx.prompts.rows[i] for i in prompt_idx]
    msgs = prompt_messages(
        rows, system_prompt=ctx.system_prompt, instruction=ctx.instruction, examples=ctx.examples
    )
    out = ctx.agent.rollout(
        ctx.engine,
        ctx.models.policy,
        rows,
        msgs,
        ctx.params,
        eos_ids=ctx.eos_ids,
        pad_id=ctx.pad_id,
    )
    batch = out.batch
    batch.loss_mask = out.loss_mask
    batch.prompt_index = torch.tensor(prompt_idx, dtype=torch.long)[batch.group_index]
    return Rollout(
        batch=batch,
        completions=list(out.final_texts),
        shown=list(out.completions),
        messages=list(out.completions),
        env_rewards=out.env_rewards if ctx.environment else None,
        agent_stats=dict(out.metrics),
    )
