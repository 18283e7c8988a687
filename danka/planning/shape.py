"""The model a plan is priced for, read without weights: its config (a local folder, a
``.gguf`` file, the HF cache, danka's table of known shapes, or the Hub) and its
:class:`ModelShape` (the dimensions and the parameter counts, made once on PyTorch's
``meta`` device, the slow part of planning)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from danka.errors import UserError
from danka.models.dims import dims, text_config
from danka.planning.known_shapes import FAMILIES, known_config


def load_model_config(name: str, base_dir: Path | None = None) -> Any:
    """The transformers config of ``name`` without weights: a local folder, a ``.gguf``
    file, the HF cache, danka's table of known shapes (:mod:`danka.planning.known_shapes`),
    then the Hub when it answers."""
    from transformers import AutoConfig

    from danka.models.gguf import check_gguf
    from danka.safe_read import refuse_special_files

    for candidate in (Path(name).expanduser(), (base_dir or Path.cwd()) / name):
        if candidate.is_dir():  # a pipe inside would block transformers' open
            refuse_special_files(
                candidate,
                what=f"model folder {candidate}",
                fix="give a model folder of regular files",
            )
        if candidate.is_dir() and (candidate / "config.json").is_file():
            return AutoConfig.from_pretrained(str(candidate))
        if candidate.is_file() and candidate.suffix == ".gguf":
            check_gguf(candidate)  # the loader's bounded reader: transformers reads unchecked
            return AutoConfig.from_pretrained(str(candidate.parent), gguf_file=candidate.name)
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        pass
    known = known_config(name)
    if known is not None:
        return known
    from danka.models.loading import hub_reachable

    if hub_reachable(timeout=3.0):
        try:
            return AutoConfig.from_pretrained(name)
        except (OSError, ValueError) as err:
            raise UserError(
                f"no model config for {name!r}: {err}",
                where="model",
                fix="check the model id or pass a local folder",
            ) from err
    raise UserError(
        f"no model config for {name!r}: not a local folder, not in the HF cache, "
        f"not a known shape ({FAMILIES}), and the Hub cannot be reached",
        where="model.actor_model_name_or_path",
        fix="pass a local model folder or .gguf file (only its config is read)",
    )


def count_parameters(config: Any, target_modules: list[str] | str, rank: int) -> tuple[int, int]:
    """``(params, lora_params)`` of the model ``config`` describes, built on the meta device.

    LoRA adds ``r x (in + out)`` per adapted linear layer (Hu et al. 2021); ``all-linear``
    adapts every linear layer but the LM head, as peft does.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    if isinstance(target_modules, str) and target_modules != "all-linear":
        target_modules = [t.strip() for t in target_modules.split(",") if t.strip()]
    head = model.get_output_embeddings()
    lora = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        short = name.rsplit(".", 1)[-1]
        hit = module is not head if target_modules == "all-linear" else short in target_modules
        if hit:
            lora += rank * (module.in_features + module.out_features)
    return params, lora


def vocab_of(config: Any) -> int | None:
    """The vocabulary size of a transformers config (None for no config)."""
    return None if config is None else text_config(config).vocab_size


@dataclass(frozen=True)
class ModelShape:
    """What the plan reads of a model: H hidden, I intermediate, L layers, V vocabulary,
    q = heads x head_dim, kv = kv_heads x head_dim; parameters and LoRA parameters (for
    the config's targets and rank)."""

    H: int
    I: int  # noqa: E741  (the docstrings' name for the MLP width)
    L: int
    V: int
    q: int
    kv: int
    params: int
    lora_params: int
    model_type: str | None = None

    @classmethod
    def of(cls, config: Any, target_modules: list[str] | str, rank: int) -> ModelShape:
        params, lora = count_parameters(config, target_modules, rank)
        return cls(
            **dims(config),
            params=params,
            lora_params=lora,
            model_type=getattr(config, "model_type", None),
        )

    def dims(self) -> dict[str, int]:
        return {"H": self.H, "I": self.I, "L": self.L, "V": self.V, "q": self.q, "kv": self.kv}


def model_config_or_none(name: str, base_dir: Path | None = None) -> Any:
    """The model's config, or None where it cannot be read before the model loads (the
    caller decides whether a plan needs it: :func:`load_model_config` says why)."""
    try:
        return load_model_config(name, base_dir)
    except (UserError, OSError, ValueError):
        return None
