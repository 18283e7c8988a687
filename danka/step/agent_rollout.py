"""``danka train`` with ``agent.tools`` / ``agent.environment``: the multi-turn agent
loop (danka/agent) in place of the single-turn ``engine.generate``.

* prompts are chat messages (``data.system_prompt`` / ``instruction`` / ``examples`` applied),
  encoded by the loop with the tool schemas (:func:`encode_agent_prompts`);
* step 2 (danka/step/answers.py) returns the same ``Rollout`` as single-turn sampling,
  with ``loss_mask`` 0 on tool and environment tokens, the final answers for the rewards,
  the trajectories for the completions log, the environment rewards and ``agent/*`` stats;
* rewards see the final assistant turn as the completion, and the messages after the
  prompt as ``messages`` (``Rollout.messages``; ``tool_answer`` reads them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from danka.agent.loop import AgentLoop
from danka.agent.setup import build_agent_loop, prompt_messages
from danka.errors import UserError
from danka.schema.sections import DankaConfig
from danka.step.prompt_set import PromptSet
from danka.types import PromptRow


def build_agent(cfg: DankaConfig, tokenizer: Any, base_dir: Path) -> AgentLoop | None:
    """The agent loop of ``agent.tools`` / ``agent.environment``; None when neither."""
    return build_agent_loop(
        cfg.agent,
        tokenizer,
        base_dir=base_dir,
        max_new_tokens=cfg.trainer.max_new_tokens,
        instruction=cfg.data.instruction,  # the worked examples are phrased like the prompts
    )


def encode_agent_prompts(
    cfg: DankaConfig, agent: AgentLoop, tokenizer: Any, rows: list[PromptRow], location: str
) -> PromptSet:
    """Rows -> the token ids the agent loop starts from (tool schemas in the prompt).
    An over-long prompt follows ``data.overlong_prompt``: ``drop`` leaves it out, anything
    else refuses it (cutting the tool schema off would change the task)."""
    d = cfg.data
    msgs = prompt_messages(
        rows, system_prompt=d.system_prompt, instruction=d.instruction, examples=d.examples
    )
    kept, texts, ids = [], [], []
    for row, m in zip(rows, msgs):
        enc = agent.encode_prompt(m)
        if len(enc) > d.max_prompt_length:
            if d.overlong_prompt == "drop":
                continue
            raise UserError(
                f"{location} row {row.index}: the prompt with the tool schemas has {len(enc)} "
                f"tokens, over data.max_prompt_length ({d.max_prompt_length})",
                where="data.max_prompt_length",
                fix="raise trainer.max_length (and data.max_prompt_length), shorten the "
                "prompt, or set data.overlong_prompt: drop",
            )
        kept.append(row)
        texts.append(tokenizer.decode(enc))
        ids.append(enc)
    return PromptSet(rows=kept, texts=texts, ids=ids)
