"""A run's prompt format: what went around every prompt in training and evaluation.

``data.system_prompt``, ``data.instruction`` and ``data.examples`` (worked turns before the
question) shape what the policy learnt to answer: a model trained and scored after a worked
turn answers worse without it (SmolLM2 on the quickstart's sums: "47 + 38 = 75" bare,
"47 + 38 = 85" after the example). So a checkpoint keeps its format
(``danka_training.json``'s ``prompt_format``) and ``danka generate`` / ``chat`` put it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PromptFormat:
    """The three settings of ``data`` that wrap a prompt (danka.data.template.build_messages)."""

    system_prompt: str | None = None  # data.system_prompt
    instruction: str | None = None  # data.instruction
    examples: tuple[dict[str, str], ...] = ()  # data.examples: user/assistant turns

    @classmethod
    def of(cls, data_cfg: Any) -> PromptFormat:
        """From a config's ``data`` section (a DataConfig, or its dict in a run's config.json)."""
        get = data_cfg.get if isinstance(data_cfg, dict) else lambda k: getattr(data_cfg, k, None)
        return cls.from_json({k: get(k) for k in ("system_prompt", "instruction", "examples")})

    @classmethod
    def from_json(cls, data: Any) -> PromptFormat:
        """From :meth:`to_json`'s dict; what is not text (a hand-edited file) is left out."""
        data = data if isinstance(data, dict) else {}
        text = lambda v: v if isinstance(v, str) and v else None  # noqa: E731
        turns = data.get("examples") if isinstance(data.get("examples"), list) else []
        examples = tuple(
            {"role": str(m["role"]), "content": str(m["content"])}
            for m in turns
            if isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m
        )
        return cls(text(data.get("system_prompt")), text(data.get("instruction")), examples)

    def to_json(self) -> dict[str, Any]:
        return {
            "system_prompt": self.system_prompt,
            "instruction": self.instruction,
            "examples": [dict(m) for m in self.examples],
        }

    def __bool__(self) -> bool:
        return bool(self.system_prompt or self.instruction or self.examples)

    def style(self) -> dict[str, Any]:
        """Keywords of render_prompt / encode_prompts."""
        return {
            "system_prompt": self.system_prompt,
            "instruction": self.instruction,
            "examples": self.examples,
        }

    def options(self) -> dict[str, Any]:
        """Keywords of generate_text / AnswerOptions (``system`` for the system prompt)."""
        return {
            "system": self.system_prompt,
            "instruction": self.instruction,
            "examples": self.examples,
        }

    def describe(self) -> str:
        """``1 worked example (data.examples), the system prompt, the instruction 'Reply...'``."""
        parts = []
        if self.examples:
            pairs = (len(self.examples) + 1) // 2
            parts.append(f"{pairs} worked example{'s' if pairs > 1 else ''} (data.examples)")
        if self.system_prompt:
            parts.append("the system prompt (data.system_prompt)")
        if self.instruction:
            parts.append(f"the instruction {self.instruction!r} (data.instruction)")
        return ", ".join(parts) or "none"
