"""A plain-text look at the first prompts exactly as the model will see them.

Printed by the CLI before training: most silent RL failures start here (no chat template,
a doubled BOS, pad == eos masking the answer's end, prompts cut from the left).
"""

from __future__ import annotations

from typing import Any

from danka.data.template import EncodedPrompts
from danka.types import PromptRow

_EDGE = 8  # token ids shown at each end of a prompt


def _token(tokenizer: Any, token_id: int | None) -> str:
    if token_id is None:
        return "None"
    return f"{token_id} {tokenizer.convert_ids_to_tokens(int(token_id))!r}"


def _ids_preview(ids: list[int]) -> str:
    if len(ids) <= 2 * _EDGE:
        return str(ids)
    head, tail = ", ".join(map(str, ids[:_EDGE])), ", ".join(map(str, ids[-_EDGE:]))
    return f"[{head}, ... {len(ids) - 2 * _EDGE} more ..., {tail}]"


def describe_first_batch(
    tokenizer: Any, rows: list[PromptRow], encoded: EncodedPrompts, n: int = 2
) -> str:
    """Rendered text, token ids (first/last few), ground truth of the first ``n`` kept
    prompts; eos/pad/bos ids and tokens; kept, dropped and truncated counts; warnings.
    ``rows`` are the rows before encoding (for the counts).
    """
    lines = [
        f"prompts: {len(rows)} loaded, {len(encoded.rows)} kept, "
        f"{encoded.n_dropped} dropped as over-long, {encoded.n_truncated} truncated on the left",
        f"chat template: {'applied' if encoded.templated else 'none (raw text)'}",
        f"eos: {_token(tokenizer, tokenizer.eos_token_id)}   "
        f"pad: {_token(tokenizer, tokenizer.pad_token_id)}   "
        f"bos: {_token(tokenizer, getattr(tokenizer, 'bos_token_id', None))}",
    ]
    if tokenizer.eos_token_id is None:
        lines.append("warning: the tokenizer has no eos token; generation stops only at max length")
    if tokenizer.pad_token_id is None:
        lines.append("warning: the tokenizer has no pad token; set one (e.g. the eos token)")
    if encoded.dropped:
        lines.append("dropped: " + ", ".join(encoded.dropped[:5]))
    for i in range(min(n, len(encoded.rows))):
        row, ids = encoded.rows[i], encoded.input_ids[i]
        lines += [
            "",
            f"--- prompt {i} (row {row.index}, {len(ids)} tokens, "
            f"ground truth {row.ground_truth!r}, data_source {row.data_source!r}) ---",
            encoded.texts[i],
            "--- end of prompt text ---",
            f"ids: {_ids_preview(ids)}",
        ]
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is not None and ids[:2] == [bos, bos]:
            lines.append("warning: the prompt starts with two BOS tokens")
    return "\n".join(lines)
