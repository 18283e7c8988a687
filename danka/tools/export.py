"""``danka export``: merge a LoRA adapter into its base and save a standard HF model folder
(with a model card; ``--gguf TYPE`` also writes the ``.gguf`` llama.cpp runs).

``W' = W + (alpha / r) B A`` for every adapted linear layer (peft's ``merge_and_unload``,
Hu et al. 2021), then ``save_pretrained`` (safetensors) plus the tokenizer, so the folder
loads with plain ``AutoModelForCausalLM.from_pretrained`` (or vLLM, llama.cpp converters).

Before anything is written, the merged model's logits are compared with base + adapter
(unmerged) on a few token sequences. The tolerance is relative to the largest logit,
because merging rounds ``W + BA`` once in the model dtype where the unmerged model rounds
``Wx`` and ``B(Ax)`` separately: ``max|diff| <= rtol[dtype] * max(1, max|logit|)``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from danka.errors import UserError
from danka.model_card import write_folder_card

RTOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
CHECK_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Question: what is 12 * 7? Answer: 84",
    "def add(a, b):\n    return a + b\n",
)


class MergeMismatch(UserError):
    """The merged model does not reproduce base + adapter (exit code 2)."""


def folder_size(path: Path) -> int:
    """Bytes of every file under ``path`` (what ``du -sb`` counts)."""
    path = Path(path)
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def human_size(n: float) -> str:
    """``du -sh`` style: 1536 -> ``1.5K``, 15.2e9 -> ``14G``."""
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" or n >= 10 else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"


def trained_dtype(adapter: str | Path) -> str | None:
    """The dtype the base ran in while ``adapter`` (``OUTPUT/actor/checkpoint_N``) was
    trained: the run's ``Loaded model ... with DTYPE`` log line (it says what ``auto``
    became), else the checkpoint's ``model.torch_dtype`` unless it is ``auto``; None for an
    adapter danka did not train."""
    import re

    from danka.io import read_json_object
    from danka.logging.runlog import LINE_PREFIX
    from danka.safe_read import is_regular, open_regular
    from danka.schema.dtypes import canonical_dtype

    adapter = Path(adapter).expanduser().resolve()
    run_dir = adapter.parent.parent
    log = run_dir / "logs" / "train.log"
    if adapter.parent.name == "actor" and is_regular(log):
        with open_regular(log, what="train.log") as f:  # the line is near the start
            head = f.read(4 << 20).decode("utf-8", errors="replace")
        line = rf"^{LINE_PREFIX}\[INFO\] Loaded model .* with (\w+)$"
        found = re.findall(line, head, re.M)
        if found:
            return canonical_dtype(found[0])
    config = read_json_object(run_dir / "state" / adapter.name / "config.json")
    if config is not None:
        try:
            name = config["model"]["torch_dtype"]
        except (KeyError, TypeError):
            return None
        if isinstance(name, str) and canonical_dtype(name) != "auto":
            return canonical_dtype(name)
    return None


def check_ids(tokenizer: Any) -> list[torch.Tensor]:
    """A few fixed texts as ``(1, T)`` id tensors (each its own forward: no padding)."""
    return [torch.tensor([tokenizer(t)["input_ids"]]) for t in CHECK_TEXTS]


@torch.no_grad()
def logits_of(model: torch.nn.Module, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Float32 CPU logits ``(1, T, V)`` of each sequence."""
    device = next(model.parameters()).device
    return [model(input_ids=s.to(device)).logits.float().cpu() for s in seqs]


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def export_merged(
    adapter: str | Path,
    output: str | Path,
    *,
    model: str | None = None,
    dtype: str = "trained",
    device: str = "auto",
    overwrite: bool = False,
    gguf: str | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Merge ``adapter`` into its base (``model`` or the adapter's
    ``base_model_name_or_path``), check the logits, save to ``output`` with a model card;
    with ``gguf`` (f16 | bf16 | q8_0 | f32) also ``output/<name>-<gguf>.gguf``. Returns
    sizes and the check: ``{"max_abs_diff", "tolerance", "adapter_effect",
    "adapter_bytes", "merged_bytes", "output", "base_model", "dtype", "gguf"}``.
    MergeMismatch if the check fails (nothing is written then). ``adapter`` may be a run
    folder (its newest checkpoint); a full-parameter checkpoint is not merged: it is
    copied (and converted with ``gguf``)."""
    from danka.tools.export_output import check_output
    from danka.tools.locate import is_model, resolve_checkpoint

    t0 = time.perf_counter()
    adapter = resolve_checkpoint(adapter)
    output = Path(output).expanduser()
    check_output(output, adapter, overwrite=overwrite)  # never the checkpoint, a run, a file
    if is_model(adapter):  # a full-parameter checkpoint: nothing to merge
        return _export_full(adapter, output, dtype, device, gguf, log)
    peft_model, tokenizer, base_name, name = _load_adapted(adapter, model, dtype, device, log)
    merged, diff, tol, effect = _merge_checked(peft_model, tokenizer, adapter, name, log)
    log(f"saving the merged model to {output} ...")
    info = _card_info(adapter, base_name, kind="merged")
    gguf_path = _save(merged, tokenizer, output, gguf, info, log)
    a_bytes, m_bytes = folder_size(adapter), folder_size(output)
    log(
        f"saved {output}: adapter {human_size(a_bytes)} on disk -> merged model "
        f"{human_size(m_bytes)} ({name}) in {time.perf_counter() - t0:.0f} s"
    )
    return {
        "output": str(output),
        "base_model": base_name,
        "dtype": name,
        "max_abs_diff": diff,
        "tolerance": tol,
        "adapter_effect": effect,
        "adapter_bytes": a_bytes,
        "merged_bytes": m_bytes,
        "gguf": str(gguf_path) if gguf_path else None,
    }


def _load_adapted(adapter: Path, model: str | None, dtype: str, device: str, log: Any):
    """(base + adapter in eval mode, tokenizer, base model name, dtype name): the base is
    ``model`` or the adapter's own, in ``dtype`` ("trained": the dtype of its training)."""
    from danka.models.loading import (
        dtype_name,
        load_causal_lm,
        load_tokenizer,
        pick_device,
        resolve_dtype,
    )
    from danka.tools.adapter_load import attach_adapter
    from danka.tools.generate import base_model_of, canonical_dtype

    base_name = base_model_of(adapter, model)  # also checks the adapter folder
    dev = pick_device(device, where="--device")
    if dtype == "trained":  # the dtype the adapter was trained in (fp32 for a CPU run)
        dtype = trained_dtype(adapter) or "auto"
    torch_dtype = resolve_dtype(canonical_dtype(dtype), dev)
    name = dtype_name(torch_dtype)
    has_tok = (adapter / "tokenizer_config.json").is_file()
    tokenizer = load_tokenizer(str(adapter) if has_tok else base_name, log=log)
    base = load_causal_lm(base_name, dtype=name, device=dev, log=log)
    peft_model = attach_adapter(base, adapter, base_name=base_name)
    peft_model.eval()
    return peft_model, tokenizer, base_name, name


def _merge_checked(peft_model, tokenizer, adapter: Path, name: str, log: Any):
    """(merged model, max |diff|, tolerance, the adapter's own effect): the merge, its
    logits compared with base + adapter's (module docstring); MergeMismatch past ``tol``."""
    seqs = check_ids(tokenizer)
    with_adapter = logits_of(peft_model, seqs)
    with peft_model.disable_adapter():
        effect = max_abs_diff(logits_of(peft_model, seqs), with_adapter)
    merged = peft_model.merge_and_unload()
    diff = max_abs_diff(logits_of(merged, seqs), with_adapter)
    scale = max(float(x.abs().max()) for x in with_adapter)
    tol = RTOL.get(name, 5e-2) * max(1.0, scale)
    log(
        f"merge check: max |logits(merged) - logits(base + adapter)| = {diff:.3g} "
        f"(tolerance {tol:.3g} for {name}; the adapter itself moves logits by up to {effect:.3g})"
    )
    if not diff <= tol:  # also catches NaN
        raise MergeMismatch(
            f"merged logits differ from base + adapter by {diff:.3g} > {tol:.3g}",
            where=str(adapter),
            fix="export in float32 (--dtype fp32), and check that --model is the base the "
            "adapter was trained on",
        )
    return merged, diff, tol, effect


def _card_info(folder: Path, base_name: str, *, kind: str) -> dict[str, Any]:
    """The checkpoint's training facts (from danka_training.json) for the export's card;
    a folder danka did not write gets the facts it can tell."""
    from danka import __version__
    from danka.model_card import base_model_ref, read_training_info

    info = read_training_info(folder) or {
        "base_model": base_model_ref(base_name),
        "algorithm": "unknown",
        "step": "?",
        "data": {"train": "unknown", "eval": "unknown"},
        "rewards": [],
        "eval": [],
        "danka_version": __version__,
    }
    if "prompt_format" not in info:  # a checkpoint of an older danka: from its run's config
        from danka.tools.prompt_source import find_prompt_format

        found = find_prompt_format(folder)
        if found is not None:
            info["prompt_format"] = found[0].to_json()
    return {**info, "kind": kind, "exported_from": str(folder)}


def _save(model, tokenizer, output: Path, gguf: str | None, info: dict, log: Any):
    """Model, tokenizer, ``gguf`` and the card, written all at once (export_output); the
    final path of the ``.gguf`` (None without one)."""
    from danka.tools.export_output import staged_folder

    held: list[str] = []  # the .gguf's "wrote PATH" names the temporary folder until the rename
    with staged_folder(output) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        gguf_path = _write_gguf(model, tokenizer, tmp, gguf, info, log, held.append)
        write_folder_card(tmp, info, what="gguf" if gguf_path else "export")
    for line in held:  # now in place: the final path
        log(line.replace(str(tmp), str(output)))
    return output / gguf_path.name if gguf_path else None


def _write_gguf(model, tokenizer, output: Path, gguf: str | None, info: dict, log: Any, done: Any):
    """The ``.gguf`` into ``output``; ``done`` gets its closing line (said by the caller)."""
    if not gguf:
        return None
    from danka.models.gguf_export import write_gguf

    stem = Path(str(info.get("base_model") or "model")).name
    path = output / f"{stem}-{info.get('algorithm', 'danka')}-{gguf}.gguf"
    log(f"writing {path.name} ({gguf}) ...")
    write_gguf(model, tokenizer, path, out_type=gguf, name=stem, log=done)
    info["gguf_file"] = path.name
    return path


def _export_full(folder: Path, output: Path, dtype: str, device: str, gguf, log) -> dict:
    """A full-parameter checkpoint: loaded and saved again (dtype) with a card, and
    converted with ``gguf``; no merge check (there is no adapter)."""
    from danka.models.loading import dtype_name, load_causal_lm, load_tokenizer, pick_device
    from danka.tools.generate import canonical_dtype

    t0 = time.perf_counter()
    dev = pick_device(device, where="--device")
    name = "auto" if dtype == "trained" else canonical_dtype(dtype)
    tokenizer = load_tokenizer(str(folder), log=log)
    model = load_causal_lm(str(folder), dtype=name, device=dev, log=log)
    log(f"saving the model to {output} ...")
    info = _card_info(folder, str(folder), kind="full")
    gguf_path = _save(model, tokenizer, output, gguf, info, log)
    size = folder_size(output)
    log(f"saved {output}: {human_size(size)} in {time.perf_counter() - t0:.0f} s")
    return {
        "output": str(output),
        "base_model": info["base_model"],
        "dtype": dtype_name(next(model.parameters()).dtype),
        "merged_bytes": size,
        "gguf": str(gguf_path) if gguf_path else None,
    }
