"""Hub-ready checkpoint and export folders: the model card, the training facts, the base.

Every ``actor/checkpoint_N`` (adapter or full model) and every ``danka export`` folder gets

- ``README.md``: a Hugging Face model card (YAML metadata through ``huggingface_hub``'s
  ``ModelCardData``: ``base_model``, ``library_name``, tags) saying what the base was, the
  algorithm, the data, the rewards, and the held-out accuracy before -> after with its
  noise floor (the 95% half-width of the difference of two accuracies on n problems,
  ``1.96 * sqrt(p0 (1 - p0) / n + p1 (1 - p1) / n)``: a change smaller than that may be
  chance);
- ``danka_training.json``: the same facts as data, plus the local folder the base was
  actually loaded from;
- for an adapter, ``adapter_config.json``'s ``base_model_name_or_path`` set to the model
  the user named (a Hub id stays a Hub id, never ``~/.cache/danka/models/...``), so the
  folder loads with ``PeftModel.from_pretrained`` on any machine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from danka.data.prompt_format import PromptFormat
from danka.data.template import build_messages
from danka.io import read_json_object

TRAINING_FILE = "danka_training.json"
CARD_FILE = "README.md"
ADAPTER_CONFIG = "adapter_config.json"


def base_model_ref(name: str) -> str:
    """What a card names as the base: the Hub id the user wrote (the SmolLM2 aliases
    canonical), else the absolute path of the local folder or ``.gguf`` file."""
    from danka.models import smollm2

    if smollm2.is_smollm2_id(name):
        return smollm2.SMOLLM2_ID
    path = Path(name).expanduser()
    if path.exists() or name.endswith(".gguf") or name.startswith(("/", ".", "~")):
        return str(path.resolve())
    return name


def is_hub_id(ref: str) -> bool:
    return not ref.startswith("/") and not Path(ref).exists()


def noise_floor(before: float, after: float, n: int) -> float:
    """95% half-width of ``after - before`` for two accuracies measured on ``n`` problems."""
    if n <= 0:
        return float("nan")
    var = before * (1 - before) / n + after * (1 - after) / n
    return 1.96 * math.sqrt(max(var, 0.0))


def describe_data(cfg: Any) -> dict[str, str]:
    """The training and held-out data in words (from a validated DankaConfig)."""
    d = cfg.data
    if d.task:
        train = f"generated task {d.task} ({d.task_train_size} problems)"
        held = f"{d.eval_size} held-out {d.task} problems (disjoint)" if d.eval_size else "none"
    else:
        train = d.train_dataset
        if d.eval_dataset:
            held = d.eval_dataset
        elif d.eval_size:
            held = f"the last {d.eval_size} rows of {d.train_dataset}"
        else:
            held = "none"
    return {"train": train, "eval": held}


def training_info(cfg: Any, step: int, history: dict | None, *, lora: bool) -> dict[str, Any]:
    """The facts a card is written from (also ``danka_training.json``)."""
    from danka import __version__

    t = cfg.trainer
    info: dict[str, Any] = {
        "base_model": base_model_ref(cfg.model.actor_model_name_or_path),
        "kind": "lora" if lora else "full",
        "algorithm": t.algorithm,
        "advantage_estimator": t.advantage_estimator,
        "step": step,
        "data": describe_data(cfg),
        "rewards": [{"name": f.name, "weight": f.weight} for f in cfg.reward.functions],
        "eval": [
            {"step": e["step"], "accuracy": e["eval/accuracy"], "n": int(e["eval/n"])}
            for e in (history or {}).get("eval", [])
            if "eval/accuracy" in e
        ],
        "danka_version": __version__,
        "prompt_format": PromptFormat.of(cfg.data).to_json(),  # generate/chat put it back
    }
    if cfg.model.reward_model_name_or_path:
        info["rewards"].append(
            {"name": f"model:{cfg.model.reward_model_name_or_path}", "weight": 1.0}
        )
    if lora:
        lc = cfg.lora
        info["lora"] = {
            "r": lc.lora_r,
            "alpha": lc.lora_alpha,
            "target_modules": lc.target_modules,
        }
    return info


def _eval_lines(evals: list[dict]) -> list[str]:
    if not evals:
        return ["No held-out evaluation was recorded for this checkpoint."]
    first, last = evals[0], evals[-1]
    n = last["n"]
    if len(evals) == 1:
        return [
            f"Held-out accuracy at step {first['step']}: {100 * first['accuracy']:.1f}% "
            f"({n} problems)."
        ]
    b, a = first["accuracy"], last["accuracy"]
    floor = noise_floor(b, a, n)
    return [
        "| | step | held-out accuracy |",
        "|---|---|---|",
        f"| before | {first['step']} | {100 * b:.1f}% |",
        f"| after | {last['step']} | {100 * a:.1f}% |",
        "",
        f"Change: {100 * (a - b):+.1f} points on {n} held-out problems (greedy). Noise floor: "
        f"+/-{100 * floor:.1f} points (95% interval of the difference); a smaller change may "
        "be chance.",
    ]


def card_text(info: dict[str, Any], *, what: str = "checkpoint") -> str:
    """The README.md of a folder described by ``info`` (:func:`training_info`)."""
    from huggingface_hub import ModelCardData

    base = info["base_model"]
    kind = info.get("kind", "lora")
    library = "peft" if kind == "lora" else "transformers"
    tags = ["danka", "reinforcement-learning", info["algorithm"]]
    if kind == "lora":
        tags.append("lora")
    if what == "gguf":
        tags.append("gguf")
    data = ModelCardData(
        base_model=base if is_hub_id(base) else None,
        library_name=library,
        pipeline_tag="text-generation",
        tags=tags,
    )
    rewards = ", ".join(f"`{r['name']}` (weight {r['weight']:g})" for r in info["rewards"])
    kind_text = {
        "lora": "a LoRA adapter",
        "full": "a full-parameter model",
        "merged": "the base with the LoRA adapter merged in",
    }[kind]
    lines = [
        "---",
        data.to_yaml(),
        "---",
        "",
        f"# {Path(str(info.get('name') or base)).name} ({info['algorithm']}, danka)",
        "",
        f"This is {kind_text}, trained with danka (RL post-training) from `{base}`.",
        "",
        f"- algorithm: `{info['algorithm']}`"
        + (
            f" (advantages: `{info['advantage_estimator']}`)"
            if info.get("advantage_estimator")
            else ""
        ),
        f"- steps: {info['step']}",
        f"- training data: {info['data']['train']}",
        f"- held-out data: {info['data']['eval']}",
        f"- rewards: {rewards or 'from the data source'}",
    ]
    if info.get("lora"):
        lc = info["lora"]
        lines.append(f"- LoRA: r={lc['r']}, alpha={lc['alpha']:g}, on {lc['target_modules']}")
    lines += ["", "## Held-out evaluation", "", *_eval_lines(info["eval"])]
    lines += _format_lines(PromptFormat.from_json(info.get("prompt_format")))
    lines += ["", "## Use", "", *_usage(kind, base, what, info.get("gguf_file"))]
    lines += ["", f"danka {info.get('danka_version', '')}".rstrip(), ""]
    return "\n".join(lines)


def _format_lines(fmt: PromptFormat) -> list[str]:
    """The card's "Prompt format" section: what went around every prompt in training and
    evaluation, as chat messages (the model answers best with the same)."""
    if not fmt:
        return []
    messages = build_messages("QUESTION", **fmt.style())
    return [
        "",
        "## Prompt format",
        "",
        f"Trained and evaluated with {fmt.describe()} around every prompt; it answers best "
        "with the same. `danka generate` / `danka chat` on this folder apply it by default "
        "(`--no-prompt-format`: the bare prompt). As chat messages (QUESTION: yours):",
        "",
        "```python",
        f"messages = {json.dumps(messages, indent=2, ensure_ascii=False)}",
        "```",
    ]


def _usage(kind: str, base: str, what: str, gguf_file: str | None) -> list[str]:
    if what == "gguf" and gguf_file:
        return ["```bash", f"llama-cli -m {gguf_file} -cnv", "```"]
    if kind == "lora":
        return [
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f'base = AutoModelForCausalLM.from_pretrained("{base}")',
            'model = PeftModel.from_pretrained(base, "THIS_FOLDER_OR_REPO")',
            "```",
            "",
            "or `danka generate --adapter THIS_FOLDER --prompt ...`.",
        ]
    return [
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER_OR_REPO")',
        "```",
    ]


def write_folder_card(folder: Path, info: dict[str, Any], *, what: str = "checkpoint") -> None:
    """``README.md`` + ``danka_training.json`` into ``folder``."""
    folder = Path(folder)
    (folder / TRAINING_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
    (folder / CARD_FILE).write_text(card_text(info, what=what), encoding="utf-8")


def point_adapter_at(folder: Path, base_ref: str) -> str | None:
    """Set ``adapter_config.json``'s ``base_model_name_or_path`` to ``base_ref``; returns
    the path it named before (the local folder the base was loaded from)."""
    path = Path(folder) / ADAPTER_CONFIG
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    local = config.get("base_model_name_or_path")
    config["base_model_name_or_path"] = base_ref
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return local


def hub_ready_writers(
    writers: dict[str, Callable[[Path], None]], cfg: Any, step: int, history: dict, lora: bool
) -> dict[str, Callable[[Path], None]]:
    """Checkpoint part writers whose ``actor`` part also writes the card, the training
    facts and the adapter's base reference (inside the part folder, so the checkpoint's
    manifest covers them)."""
    actor = writers.get("actor")
    if actor is None:
        return writers

    def write_actor(folder: Path) -> None:
        actor(folder)
        info = training_info(cfg, step, history, lora=lora)
        local = point_adapter_at(folder, info["base_model"]) if lora else None
        if local and local != info["base_model"]:
            info["base_model_local_path"] = local
        write_folder_card(folder, info)

    return {**writers, "actor": write_actor}


def read_training_info(folder: str | Path) -> dict[str, Any] | None:
    return read_json_object(Path(folder) / TRAINING_FILE)
