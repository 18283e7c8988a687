"""What the report tells besides the verdict: which run it was, and what the model answered.

Pure functions over a run folder's records (:class:`danka.diagnose.RunRecord`) and two
small files beside them: the header (model, algorithm, the settings that shape a run,
the device and the start from ``logs/train.log``, the wall time from the result file); a
few held-out answers at the first and the last evaluation (``eval/step_N.json``'s
``samples``: the same prompts in the same order at every evaluation), those whose
correctness changed first; the drift probe's answers (``probe_answers``) that degenerated
(empty, only an answer marker, or looping: :mod:`danka.diagnose.probe`) since step 0.
Nothing here fails on a run's content: a missing or odd field leaves its line out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from danka.diagnose import RunRecord
from danka.diagnose.probe import is_empty, is_marker_only, is_repeated
from danka.diagnose.settings import reward_terms, setting
from danka.errors import UserError
from danka.safe_read import loads_json, open_regular, read_text
from danka.tools.verdict import number

SHOWN_ANSWERS = 4  # held-out answers shown before -> after
_LOG_HEAD = 64 * 1024  # the model's device is logged at start-up: the log's head is enough
_DEVICE = re.compile(r"model: .*?, device (.+?), from ")
_DTYPE = re.compile(r"Loaded model .* with (\w+)$", re.MULTILINE)
_STARTED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d):\d\d ")
_SPECIAL = re.compile(r"<\|[^|>]{1,40}\|>|<s>|</s>|\[/?INST\]")
_ROLE = re.compile(r"^\s*(system|user|assistant)\s*\n", re.IGNORECASE)


@dataclass(frozen=True)
class Header:
    """Which run this was: each field as the run folder records it, None where it does
    not. ``settings``: (label, value) pairs in reading order."""

    model: str | None
    algorithm: str | None
    settings: tuple[tuple[str, str], ...]
    device: str | None  # as train.log names it, with the dtype ("cuda:0 (NVIDIA H200), bfloat16")
    started: str | None  # train.log's first timestamp, the machine's clock
    wall_seconds: float | None  # the result file's ``seconds``; None while running


def _get(config: dict, path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _g(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _settings(config: dict, steps: int) -> list[tuple[str, str]]:
    out = []
    total, minutes = _get(config, "trainer.total_steps"), _get(config, "trainer.max_train_minutes")
    if isinstance(total, int):
        limit = f", at most {_g(minutes)} min" if number(minutes) else ""
        out.append(("steps", f"{steps} of {total}{limit}"))
    batch, k = _get(config, "trainer.batch_size"), _get(config, "trainer.samples_per_prompt")
    if isinstance(batch, int):
        out.append(("batch", f"{batch} prompts x {k if isinstance(k, int) else 1} samples"))
    lr = number(_get(config, "optim.lr"))
    if lr is not None:
        critic = (
            number(setting(config, "critic_lr")) if setting(config, "algorithm") == "ppo" else None
        )
        out.append(("lr", _g(lr) + (f" (critic {_g(critic)})" if critic is not None else "")))
    if _get(config, "lora.enable_lora") is False:
        out.append(("LoRA", "off (all parameters)"))
    elif isinstance(r := _get(config, "lora.lora_r"), int):
        out.append(("LoRA", f"r {r}, alpha {_g(_get(config, 'lora.lora_alpha'))}"))
    numbers = (
        ("KL coef", "loss.kl.coef"),
        ("temperature", "sampling.temperature"),
        ("max new tokens", "trainer.max_new_tokens"),
    )
    for label, path in numbers:
        value = number(_get(config, path))
        if value is not None:
            out.append((label, _g(value)))
    data = _get(config, "data.task") or _get(config, "data.train_dataset")
    if isinstance(data, str) and data:
        out.append(("data", data))
    try:
        paid = [t.key for t in reward_terms(config) if t.weight > 0]
    except (TypeError, ValueError, AttributeError, KeyError):  # a config danka did not write
        paid = []
    if paid:
        out.append(("reward", ", ".join(paid)))
    return out


def _log_head(folder: Path) -> str:
    try:
        with open_regular(folder / "logs" / "train.log", what="train.log") as f:
            return f.read(_LOG_HEAD).decode("utf-8", "replace")
    except (UserError, OSError):
        return ""


def _wall_seconds(folder: Path, config: dict) -> float | None:
    name = setting(config, "result_file")
    if not isinstance(name, str) or "/" in name or not (folder / name).is_file():
        return None
    try:
        result = loads_json(read_text(folder / name, what=name), where=name)
    except (UserError, OSError):
        return None
    return number(result.get("seconds")) if isinstance(result, dict) else None


def header_of(folder: Path, rec: RunRecord, steps: int) -> Header:
    """The run's header from its config, train.log's head and its result file."""
    config = rec.config if isinstance(rec.config, dict) else {}
    head = _log_head(Path(folder))
    device, dtype, started = _DEVICE.search(head), _DTYPE.search(head), _STARTED.match(head)
    where = device.group(1) if device else None
    if where and dtype:
        where += f", {dtype.group(1)}"
    model = _get(config, "model.actor_model_name_or_path")
    algorithm = _get(config, "trainer.algorithm")
    return Header(
        model=model if isinstance(model, str) else None,
        algorithm=algorithm if isinstance(algorithm, str) else None,
        settings=tuple(_settings(config, steps)),
        device=where,
        started=started.group(1) if started else None,
        wall_seconds=_wall_seconds(Path(folder), config),
    )


def question(prompt: str) -> str:
    """The last turn of a prompt as the model read it: the text after the last chat
    special token (``<|im_start|>``, ``<|eot_id|>``, ...) that is more than a role name;
    the whole prompt when it has none."""
    parts = [_ROLE.sub("", p).strip() for p in _SPECIAL.split(prompt)]
    parts = [p for p in parts if p and p.lower() not in ("system", "user", "assistant")]
    return parts[-1] if parts else prompt.strip()


@dataclass(frozen=True)
class AnswerPair:
    """One held-out prompt's greedy answer at the first and at the last evaluation."""

    prompt: str
    truth: str
    before: str
    before_ok: bool
    after: str
    after_ok: bool

    @property
    def question(self) -> str:
        return question(self.prompt)


def _samples(record: dict | None) -> dict[str, dict]:
    rows = (record or {}).get("samples")
    if not isinstance(rows, list):
        return {}
    return {
        r["prompt"]: r for r in rows if isinstance(r, dict) and isinstance(r.get("prompt"), str)
    }


def answer_pairs(rec: RunRecord, k: int = SHOWN_ANSWERS) -> list[AnswerPair]:
    """Up to ``k`` held-out prompts answered at the first and the last evaluation: those
    that turned right first, then those that turned wrong, then the rest, in file order."""
    evals = [e for e in rec.evals if number(e.get("eval/accuracy")) is not None]
    if len(evals) < 2:
        return []
    first, last = _samples(evals[0]), _samples(evals[-1])
    pairs = []
    for prompt, a in first.items():
        b = last.get(prompt)
        if b is None:
            continue
        pairs.append(
            AnswerPair(
                prompt,
                truth=str(a.get("ground_truth", "")),
                before=str(a.get("completion", "")),
                before_ok=a.get("correct") is True,
                after=str(b.get("completion", "")),
                after_ok=b.get("correct") is True,
            )
        )
    return sorted(pairs, key=_turned)[:k]


def _turned(p: AnswerPair) -> int:
    """0: wrong -> right, 1: right -> wrong, 2: unchanged (sorting is stable)."""
    return 0 if p.after_ok > p.before_ok else 1 if p.after_ok < p.before_ok else 2


def degenerate(text: str) -> bool:
    """Empty, only an answer marker, or looping (the probe's own tests)."""
    return is_empty(text) or is_marker_only(text) or is_repeated(text)


@dataclass(frozen=True)
class ProbeDrift:
    """The drift probe at step 0 and at the last evaluation: the share of degenerate
    answers (``probe/degenerate_frac``), the KL on the step-0 answers, and the prompts
    whose answer degenerated (prompt, before, after)."""

    n: int
    before: float
    after: float
    kl: float | None
    step: Any
    worse: tuple[tuple[str, str, str], ...]


def _answers(record: dict) -> dict[str, str]:
    rows = record.get("probe_answers")
    if not isinstance(rows, list):
        return {}
    return {str(r.get("prompt")): str(r.get("answer", "")) for r in rows if isinstance(r, dict)}


def probe_drift(rec: RunRecord) -> ProbeDrift | None:
    """The probe's change from the first to the last evaluation; None without two
    evaluations that ran it."""
    evals = [e for e in rec.evals if number(e.get("probe/degenerate_frac")) is not None]
    if len(evals) < 2:
        return None
    first, last = evals[0], evals[-1]
    before, after = _answers(first), _answers(last)
    worse = tuple(
        (p, before[p], a)
        for p, a in after.items()
        if p in before and degenerate(a) and not degenerate(before[p])
    )
    return ProbeDrift(
        n=int(number(last.get("probe/n")) or len(after)),
        before=number(first.get("probe/degenerate_frac")) or 0.0,
        after=number(last.get("probe/degenerate_frac")) or 0.0,
        kl=number(last.get("probe/kl")),
        step=last.get("step"),
        worse=worse,
    )
