"""What a run's report opens with: did the run make the model better, and what went wrong.

Pure functions over a run's records (:class:`danka.diagnose.RunRecord`) and the run
doctor's findings: held-out accuracy at the first and the last evaluation next to the guess
floor (the best a constant answer scores, ``eval/guess_floor``) and the noise floor (the 95%
half-width of the difference of two accuracies, :func:`danka.model_card.noise_floor`), each
labelled correctness function (``eval/correct/<name>``), the answers' length and the share
cut at the token limit. A run with fewer than two evaluations, or without its result file,
is in progress; the verdict says so instead of inventing an "after".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from danka.diagnose import Finding, RunRecord, diagnose, read_run_dir
from danka.diagnose.settings import reward_terms, setting
from danka.errors import UserError
from danka.model_card import noise_floor
from danka.tools.run_doctor import by_severity

CORRECT = "eval/correct/"


def number(value: Any) -> float | None:
    """A finite float, else None (null, ``"inf"`` strings, text a run should not hold)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):  # a 400-digit integer
        return None
    return out if math.isfinite(out) else None


@dataclass(frozen=True)
class Change:
    """One quantity at the first evaluation and at the last (or the first and last
    training step, for the answers' length without evaluations)."""

    before: float
    after: float

    @property
    def delta(self) -> float:
        return self.after - self.before


@dataclass(frozen=True)
class Function:
    """A labelled correctness function (``eval/correct/<name>``): its accuracy before ->
    after, its own guess floor (``eval/guess_floor/<name>``) and whether the reward pays
    for it (weight > 0) or it is only logged."""

    name: str
    accuracy: Change | None  # None: one evaluation only
    latest: float
    floor: float | None
    trained: bool | None  # None: the config does not say


@dataclass(frozen=True)
class Verdict:
    """The report's first section. ``before``/``after`` are the first and last evaluation
    records; with fewer than two evaluations ``accuracy`` is None and ``latest`` is the only
    one (or None)."""

    steps: int  # last training step logged
    eval_steps: tuple[int, ...]
    finished: bool  # the run wrote its result file (logging.result_file)
    accuracy: Change | None
    latest: dict[str, Any] | None  # the last evaluation record
    first: dict[str, Any] | None  # the first evaluation record
    floor: float | None  # eval/guess_floor
    noise: float | None  # 95% half-width of after - before, points as a fraction
    functions: tuple[Function, ...]
    length: Change | None  # mean answer length, tokens
    truncated: Change | None  # share of answers cut at the token limit
    length_source: str  # "held-out answers" or "training samples"
    findings: tuple[Finding, ...]  # problems first, then risks
    doctor_note: str | None  # why the doctor could not run (then findings is empty)

    @property
    def latest_accuracy(self) -> float | None:
        return number((self.latest or {}).get("eval/accuracy"))


def _n(record: dict[str, Any] | None) -> int | None:
    v = number((record or {}).get("eval/n"))
    return int(v) if v else None


def _change(first: dict | None, last: dict | None, key: str) -> Change | None:
    if first is None or last is None or first is last:
        return None
    a, b = number(first.get(key)), number(last.get(key))
    return None if a is None or b is None else Change(a, b)


def _floor(evals: list[dict[str, Any]], key: str = "eval/guess_floor") -> float | None:
    """The floor the evaluations recorded (the newest that has one)."""
    for record in reversed(evals):
        v = number(record.get(key))
        if v is not None:
            return v
    return None


def _trained(config: dict) -> dict[str, bool]:
    """Logged reward name -> the reward pays for it (weight > 0)."""
    try:
        return {t.key: t.weight > 0 for t in reward_terms(config)}
    except (TypeError, ValueError, AttributeError):  # a config danka did not write
        return {}


def _functions(evals: list[dict[str, Any]], config: dict) -> tuple[Function, ...]:
    if not evals:
        return ()
    first, last = evals[0], evals[-1]
    names = [k[len(CORRECT) :] for k in last if k.startswith(CORRECT)]
    trained = _trained(config)
    out = []
    for name in names:
        latest = number(last.get(CORRECT + name))
        if latest is None:
            continue
        out.append(
            Function(
                name,
                _change(first, last, CORRECT + name),
                latest,
                _floor(evals, f"eval/guess_floor/{name}"),
                trained.get(name),
            )
        )
    return tuple(out)


def _lengths(rec: RunRecord, first: dict | None, last: dict | None):
    """(length, truncated, source): held-out answers when the evaluations have them, else
    the training samples' first -> last step."""
    length = _change(first, last, "eval/response_length")
    truncated = _change(first, last, "eval/truncated")
    if length is not None or truncated is not None:
        return length, truncated, "held-out answers"
    rows = [m for m in rec.metrics if number(m.get("response_length")) is not None]
    if len(rows) < 2:
        return None, None, "training samples"
    a, b = rows[0], rows[-1]
    source = f"training samples, step {a.get('step')} → {b.get('step')}"
    return _change(a, b, "response_length"), _change(a, b, "response/truncated"), source


def _finished(folder: Path, config: dict) -> bool:
    name = setting(config, "result_file")
    return isinstance(name, str) and "/" not in name and (folder / name).is_file()


def doctor(folder: Path) -> tuple[RunRecord, tuple[Finding, ...], str | None]:
    """The run as the doctor reads it and its findings (problems first, then risks), or an
    empty record and the reason when the folder cannot be diagnosed."""
    try:
        rec = read_run_dir(folder)
    except UserError as err:
        return RunRecord(), (), f"the run doctor could not read this folder: {err}"
    try:
        return rec, tuple(by_severity(diagnose(rec))), None
    except Exception as err:  # noqa: BLE001 - a report must never fail on a run's content
        return rec, (), f"the run doctor failed: {type(err).__name__}: {err}"


def verdict_of(
    folder: Path, rec: RunRecord, findings: tuple[Finding, ...], doctor_note: str | None = None
) -> Verdict:
    """The verdict of the run in ``folder`` (read for its result file only)."""
    evals = [e for e in rec.evals if number(e.get("eval/accuracy")) is not None]
    first, last = (evals[0], evals[-1]) if evals else (None, None)
    accuracy = _change(first, last, "eval/accuracy")
    ns = [n for n in (_n(first), _n(last)) if n]  # the middle ones may be on a subset
    noise = noise_floor(accuracy.before, accuracy.after, min(ns)) if accuracy and ns else None
    length, truncated, source = _lengths(rec, first, last)
    steps = [int(s) for m in rec.metrics if (s := number(m.get("step"))) is not None]
    return Verdict(
        steps=max(steps, default=0),
        eval_steps=tuple(int(number(e.get("step")) or 0) for e in evals),
        finished=_finished(Path(folder), rec.config),
        accuracy=accuracy,
        latest=last,
        first=first,
        floor=_floor(evals),
        noise=noise,
        functions=_functions(evals, rec.config),
        length=length,
        truncated=truncated,
        length_source=source,
        findings=findings,
        doctor_note=doctor_note,
    )
