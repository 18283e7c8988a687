"""``python -m bench rollout`` at the real shape: GSM8K prompts as danka renders them, the
model's end tokens, the tokens a call really generated, and the rollout goals."""

from __future__ import annotations

import torch

from bench.lib.gsm8k_data import example_instruction, gsm8k_rows


def gsm8k_prompts(args) -> list[list[int]]:
    """The first ``--prompts`` rows of ``--prompts-from`` as danka renders them."""
    from danka.data.template import encode_prompts

    rows = gsm8k_rows(args.prompts_from, args.prompts)
    instruction = example_instruction() if args.instruction is None else args.instruction
    enc = encode_prompts(tokenizer(args), rows, max_prompt_length=1 << 16, instruction=instruction)
    return enc.input_ids


def tokenizer(args):
    from danka.models.loading import load_tokenizer

    return load_tokenizer(args.model, log=lambda *_: None)


def eos_ids(args) -> list[int]:
    """The ids that end an answer for ``--model`` (danka's own stop ids)."""
    from danka.models.loading import stop_ids

    return stop_ids(tokenizer(args))


def generated_tokens(response_ids: torch.Tensor, eos: list[int]) -> int:
    """Tokens up to and including each row's first end token (all of a row without one)."""
    if not eos:
        return response_ids.numel()
    hit = torch.isin(response_ids, torch.tensor(eos))
    first = torch.where(hit.any(1), hit.float().argmax(1) + 1, response_ids.shape[1])
    return int(first.sum())


GOAL_OVER_HF_STATIC, GOAL_TOK_S = 4.0, 50_000


def goals(res: dict) -> dict:
    """The rollout goals, for the engine ``danka train`` builds (side ``fast-default``; else
    ``fast``) with a live LoRA in the default mode when measured: >= 4x HF's static cache
    and >= 50k generated tokens/s, EOS off (equal work) and on."""
    side = "fast-default" if "fast-default" in res["sides"] else "fast"
    fast, hf = res["sides"].get(side, {}), res["sides"].get("hf-static", {})
    prefix = next((p for p in ("lora_auto_", "lora_base_", "") if f"{p}tok_s" in fast), "")
    out: dict = {"side": side, "variant": prefix.rstrip("_") or "plain",
                 "over_hf_static_goal": GOAL_OVER_HF_STATIC, "tok_s_goal": GOAL_TOK_S}  # fmt: skip
    for tag in ("", "eos_"):
        got, base = fast.get(f"{tag}{prefix}tok_s"), hf.get(f"{tag}tok_s")
        name = "eos_on" if tag else "eos_off"
        if got:
            out[name] = {"tok_s": got, "tok_s_met": got >= GOAL_TOK_S}
            if base:
                out[name].update(over_hf_static=got / base,
                                 over_met=got / base >= GOAL_OVER_HF_STATIC)  # fmt: skip
    return out
