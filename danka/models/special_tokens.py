"""Special tokens: the end-of-turn token a chat template closes a reply with, and
making tokenizer and model agree on eos/pad (GGUF conversions often do not)."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from danka.errors import UserError

_SENTINEL = "DANKA_SENTINEL_REPLY"


def end_of_turn_token(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The special token that closes an assistant turn in the chat template, or None.

    Renders ``[user, assistant(SENTINEL)]`` and reads the first added/special token after
    the sentinel: ``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama 3, ``<end_of_turn>``
    for Gemma, ``</s>`` for Mistral.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": _SENTINEL},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # noqa: BLE001 - exotic templates: keep the tokenizer's eos
        return None
    if not isinstance(text, str) or _SENTINEL not in text:
        return None
    tail = text.split(_SENTINEL, 1)[1].lstrip(" ")
    if not tail:
        return None
    special = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    first = tokenizer.convert_ids_to_tokens(tokenizer.encode(tail, add_special_tokens=False)[:1])
    if first and first[0] in special:
        return first[0]
    # Some tokenizers split a special token that is not registered as "added": match text.
    for token in sorted(special, key=len, reverse=True):
        if token and tail.startswith(token):
            return token
    return None


def fix_special_tokens(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Make eos the end-of-turn token, give the tokenizer a pad token, pad on the left.

    Returns one message per change. pad == eos is left as is (masks carry the padding).
    """
    changes: list[str] = []
    eot = end_of_turn_token(tokenizer)
    if eot is not None and tokenizer.eos_token != eot:
        changes.append(f"eos_token {tokenizer.eos_token!r} -> {eot!r} (ends an assistant turn)")
        tokenizer.eos_token = eot
    if tokenizer.pad_token is None:
        vocab = tokenizer.get_vocab()
        pad = "<|endoftext|>" if "<|endoftext|>" in vocab else tokenizer.eos_token
        if pad is None:
            raise UserError(
                "the tokenizer has neither a pad token nor an eos token",
                fix="use a tokenizer with a chat template, or pass tokenizer_kwargs={'pad_token': ...}",
            )
        changes.append(f"pad_token None -> {pad!r}")
        tokenizer.pad_token = pad
    if tokenizer.padding_side != "left":
        changes.append(f"padding_side {tokenizer.padding_side!r} -> 'left' (for generation)")
        tokenizer.padding_side = "left"
    return changes


def sync_special_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Copy the tokenizer's eos/pad ids into ``model.config`` and ``model.generation_config``.

    ``generate`` stops on ``generation_config.eos_token_id``; a list there (Llama 3 style) is
    kept and the eos id added to it.
    """
    changes: list[str] = []
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    configs = [model.config]
    if getattr(model, "generation_config", None) is not None:
        configs.append(model.generation_config)
    for cfg in configs:
        kind = type(cfg).__name__
        old = getattr(cfg, "eos_token_id", None)
        new = (old if eos in old else [eos, *old]) if isinstance(old, list) else eos
        if eos is not None and new != old:
            cfg.eos_token_id = new
            changes.append(f"{kind}.eos_token_id {old} -> {new}")
        if pad is not None and getattr(cfg, "pad_token_id", None) != pad:
            changes.append(f"{kind}.pad_token_id {getattr(cfg, 'pad_token_id', None)} -> {pad}")
            cfg.pad_token_id = pad
    return changes
