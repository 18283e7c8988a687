"""Prompt text as the model sees it (chat template), its token ids, and left padding.

A chat template already writes the special tokens (``<|im_start|>``, BOS, ...), so the
rendered text is encoded with ``add_special_tokens=False``; without a template the raw
text is encoded with the tokenizer's defaults (a BOS where the model wants one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from danka.errors import UserError
from danka.types import PromptRow

OVERLONG_POLICIES = ("error", "drop", "truncate_left")


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def build_messages(
    prompt: str | list[dict[str, str]],
    *,
    system_prompt: str | None = None,
    instruction: str | None = None,
    examples: Sequence[Mapping[str, str]] = (),
) -> list[dict[str, str]]:
    """Chat messages for ``prompt``: a string becomes one user message; ``system_prompt``
    is prepended unless the messages already have a system message; ``examples``
    (data.examples: worked user/assistant turns, few-shot) go after the system message and
    before the prompt's own, as written; ``instruction`` is appended (after a space) to the
    last user message (the prompt's) unless it already ends with it.
    """
    messages = (
        [{"role": "user", "content": prompt}]
        if isinstance(prompt, str)
        else [dict(m) for m in prompt]
    )
    if system_prompt and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    if examples:  # a small model copies the form of its "own" earlier answer
        at = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        messages[at:at] = [{"role": m["role"], "content": m["content"]} for m in examples]
    if instruction:
        for msg in reversed(messages):
            if msg["role"] == "user":
                if not msg["content"].rstrip().endswith(instruction.strip()):
                    msg["content"] = f"{msg['content']} {instruction}"
                break
    return messages


def render_prompt(
    tokenizer: Any,
    prompt: str | list[dict[str, str]],
    *,
    system_prompt: str | None = None,
    instruction: str | None = None,
    examples: Sequence[Mapping[str, str]] = (),
) -> str:
    """The exact prompt text: the chat template with ``add_generation_prompt=True`` when the
    tokenizer has one, else the message contents joined by blank lines (a plain string
    prompt with no system prompt, instruction or examples comes back unchanged).
    """
    messages = build_messages(
        prompt, system_prompt=system_prompt, instruction=instruction, examples=examples
    )
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages)


def control_token_warning(
    tokenizer: Any, rows: Sequence[PromptRow], examples: Sequence[Mapping[str, str]] = ()
) -> str | None:
    """One warning line when a worked turn (data.examples) or a data row writes one of the
    tokenizer's control tokens (``<|im_start|>``, ``<|im_end|>``, ...: its special tokens)
    in its text, else None. The tokenizer reads them as turn boundaries, not as text:
    ``<|im_end|>\n<|im_start|>system ...`` inside a question forges a system turn. The
    line names the first (the examples first, then the rows in order) as the tokenizer
    writes it, and how many turns hold one; ``data.allow_control_tokens`` silences it."""
    specials = {t for t in getattr(tokenizer, "all_special_tokens", []) if len(str(t)) > 1}
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    specials |= {t.content for t in added.values() if getattr(t, "special", False)}
    specials = {str(t) for t in specials if len(str(t)) > 1}
    if not specials:
        return None
    pattern = re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))
    hits: list[tuple[str, str]] = []  # (where, token)

    def scan(where: str, prompt: Any, sep: str = ", ") -> None:
        turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        for t, m in enumerate(turns):
            text = m.get("content") if isinstance(m, Mapping) else None
            if isinstance(text, str) and (found := pattern.search(text)):
                turn = "" if isinstance(prompt, str) else f"{sep}turn {t} ({m.get('role')})"
                hits.append((where + turn, found.group()))

    scan("data.examples", list(examples), sep=" ")
    for row in rows:
        scan(f"data row {row.index}", row.prompt)
    if not hits:
        return None
    where, token = hits[0]
    return (
        f"{where} holds the chat control token {token!r}: the tokenizer reads it as a turn "
        "boundary, not as text (e.g. '<|im_end|>\\n<|im_start|>system ...' forges a system "
        f"turn); {len(hits)} rows or turns hold one. Remove them, or set "
        "data.allow_control_tokens: true if they are meant"
    )


@dataclass
class EncodedPrompts:
    """Prompts ready for generation; lists are aligned with ``rows`` (the kept rows)."""

    input_ids: list[list[int]]  # per kept row, unpadded, at most max_prompt_length ids
    rows: list[PromptRow]  # kept rows, in input order
    texts: list[str]  # rendered text of each kept row (before any left truncation)
    templated: bool  # True if the chat template was applied
    n_dropped: int = 0  # over-long rows left out (policy drop)
    n_truncated: int = 0  # over-long rows cut from the left (policy truncate_left)
    dropped: list[str] = field(default_factory=list)  # "row INDEX (N tokens)" of dropped rows


def encode_prompts(
    tokenizer: Any,
    rows: list[PromptRow],
    *,
    max_prompt_length: int,
    policy: str = "error",
    system_prompt: str | None = None,
    instruction: str | None = None,
    examples: Sequence[Mapping[str, str]] = (),
    location: str = "data",
) -> EncodedPrompts:
    """Render and tokenize ``rows``; prompts longer than ``max_prompt_length`` tokens are
    an error, dropped, or cut from the left (keeping the end, where the generation prompt
    and the question sit), per ``policy``. ``location`` names the source in errors.
    """
    if policy not in OVERLONG_POLICIES:
        raise UserError(
            f"unknown overlong_prompt policy {policy!r}",
            "data.overlong_prompt",
            f"use one of {', '.join(OVERLONG_POLICIES)}",
        )
    templated = has_chat_template(tokenizer)
    style = {"system_prompt": system_prompt, "instruction": instruction, "examples": examples}
    texts = [render_prompt(tokenizer, r.prompt, **style) for r in rows]
    all_ids = tokenizer(texts, add_special_tokens=not templated)["input_ids"] if texts else []
    out = EncodedPrompts([], [], [], templated)
    for row, text, ids in zip(rows, texts, all_ids):
        ids = list(ids)
        if len(ids) > max_prompt_length:
            if policy == "error":
                raise UserError(
                    f"prompt is {len(ids)} tokens, longer than max_prompt_length "
                    f"{max_prompt_length}",
                    f"{location}: row {row.index}",
                    "raise data.max_prompt_length, or set data.overlong_prompt to drop "
                    "(leave such rows out) or truncate_left (keep the last tokens)",
                )
            if policy == "drop":
                out.n_dropped += 1
                out.dropped.append(f"row {row.index} ({len(ids)} tokens)")
                continue
            ids = ids[-max_prompt_length:]
            out.n_truncated += 1
        out.input_ids.append(ids)
        out.rows.append(row)
        out.texts.append(text)
    if rows and not out.rows:
        raise UserError(
            f"all {len(rows)} prompts are longer than max_prompt_length {max_prompt_length}",
            location,
            "raise data.max_prompt_length or set data.overlong_prompt: truncate_left",
        )
    return out


def left_pad(
    ids: list[list[int]],
    pad_id: int,
    *,
    width: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token id lists to ``(B, P)``, ``P = width`` (default: the longest list);
    returns ``(ids, mask)``, both long and on ``device`` (default CPU), mask 1 on real
    tokens. Left padding keeps every prompt's last token in the last column, where
    generation continues.
    """
    if width is None:
        width = max((len(x) for x in ids), default=0)
    out = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        if row:
            out[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return out.to(device), mask.to(device)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def distinct(seqs: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """``seqs`` without repeats, in first-seen order, and for each of ``seqs`` the index of
    its copy there (a GRPO step holds ``n`` copies of each prompt)."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(s), len(first)) for s in seqs]
    return [list(s) for s in first], index


def mask_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids from an attention mask (b, L): ``cumsum - 1``, as ``generate`` computes
    them (padding anywhere in a row does not shift the positions of the tokens after it)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)
