"""A causal LM's backbone with a one-output score head: the reward model that ``danka
distill`` and ``danka rm`` train and :class:`~danka.rewards.model.ClassifierReward` loads.

The head (``score``) of a fresh ``AutoModelForSequenceClassification`` is random; training
it is the whole point. A saved folder holds the backbone and the TRAINED head as
safetensors (a LoRA adapter is merged first), the tokenizer, and in ``config.json`` the
reward mean/std measured on held-out data (``reward_mean`` / ``reward_std``) when given;
the tokenizer keeps ``truncation_side: left``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from danka.errors import UserError
from danka.io import apply_file_mode


def resolve_source(name: str) -> str:
    """A loadable source: SmolLM2-135M-Instruct's id becomes its offline folder, a ``.gguf``
    file its converted plain folder (danka.models.gguf)."""
    from danka.models import gguf, smollm2

    if name.endswith(".gguf"):
        return str(gguf.ensure_converted(name))
    return str(smollm2.ensure_converted()) if smollm2.is_smollm2_id(name) else name


def load_score_model(
    name: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    tokenizer_kwargs: dict | None = None,
    seed: int = 0,
    log: Callable[[str], Any] = lambda *_: None,
) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)``: ``name``'s backbone plus a fresh one-output head (seeded).

    The tokenizer pads (eos/pad fixed as for the policy) and truncates from the LEFT, so
    an over-long text keeps its end, where the answer is.
    """
    from transformers import AutoModelForSequenceClassification

    from danka.models.loading import load_tokenizer

    path = resolve_source(name)
    tokenizer = load_tokenizer(
        path, tokenizer_kwargs=tokenizer_kwargs, trust_remote_code=trust_remote_code, log=log
    )
    tokenizer.truncation_side = "left"
    torch.manual_seed(seed)
    kwargs: dict[str, Any] = {"num_labels": 1, "dtype": dtype}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            path, trust_remote_code=trust_remote_code, **kwargs
        )
    except (OSError, ValueError) as err:
        raise UserError(
            f"cannot load {name!r} as a sequence classifier: {err}",
            where="model.actor_model_name_or_path",
            fix="use a local model folder or a hub id of a causal LM with a "
            "ForSequenceClassification class (llama, qwen2, mistral, ...)",
        ) from err
    # decoder classifiers read the score at the last non-pad token
    model.config.pad_token_id = tokenizer.pad_token_id
    log(
        f"Loaded {name} as a one-output classifier ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters)"
    )
    return model.to(device), tokenizer


def encode(tokenizer: Any, texts: list[str], max_length: int, device: torch.device | str):
    """Padded, truncated token ids and mask of ``texts`` on ``device``."""
    return tokenizer(
        texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    ).to(device)


def score(model: torch.nn.Module, enc: Any) -> torch.Tensor:
    """The head's output per sequence: (B,) float32 (with grad if enabled)."""
    out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    return out.logits[:, 0].float()


def save_score_model(
    model: torch.nn.Module,
    tokenizer: Any,
    output: Path,
    *,
    reward_mean: float | None = None,
    reward_std: float | None = None,
    max_length: int | None = None,
) -> torch.nn.Module:
    """Write ``output`` (safetensors + tokenizer); a peft model is merged first.

    Returns the saved (merged) model. ``reward_mean``/``reward_std`` go to config.json, and
    ``max_length`` (the tokens per text it was trained on) as ``reward_max_length``, which
    :class:`~danka.rewards.model.ClassifierReward` uses when it scores.
    """
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    if reward_mean is not None:
        model.config.reward_mean = float(reward_mean)
        model.config.reward_std = float(reward_std if reward_std is not None else 1.0)
    if max_length is not None:
        model.config.reward_max_length = int(max_length)
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output, safe_serialization=True)
    # saved with the tokenizer, so a loaded reward model also keeps a long text's end
    tokenizer.init_kwargs["truncation_side"] = tokenizer.truncation_side
    tokenizer.save_pretrained(output)
    apply_file_mode(output)  # danka's one file mode (safetensors makes 0600 files)
    return model
