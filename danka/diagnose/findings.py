"""Findings, the check registry, and the two ways to run the checks: over a whole run
(:func:`diagnose`, for ``danka doctor RUN_DIR``) and step by step while it trains
(:class:`LiveDiagnoser`, for the ``[WARNING]`` lines). Both call the same check functions.

A check is ``fn(rec: RunRecord, at: int) -> Finding | None``: does the problem show at
position ``at`` of the stream it reads (``CheckMeta.reads``), using only what was known
then (``rec.<stream>[: at + 1]``)? Because checks look only backwards, the doctor's
"first seen at step N" is the step at which the live run warned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from danka.diagnose.record import RunRecord
from danka.registry import Registry

STREAMS = ("config", "metrics", "evals", "completions")
SEVERITIES = ("problem", "risk")


@dataclass(frozen=True)
class Finding:
    """One diagnosis. ``step`` is the first step it held (None: from the config alone).

    severity ``problem``: the run shows it (or a setting certainly does nothing); the
    doctor exits 1. ``risk``: a setting that invites a failure the run does not show (yet);
    reported, exit 0.
    """

    id: str  # the check's name, e.g. "length_collapse"
    what: str  # one sentence
    evidence: str  # steps and numbers
    fix: str
    step: int | None = None
    severity: str = "problem"

    def to_dict(self) -> dict:
        return asdict(self)

    def message(self) -> str:
        """One line for train.log / the console (the logger adds ``[WARNING]``)."""
        when = "at start-up" if self.step is None else f"step {self.step}"
        return f"{self.what} ({when}: {self.evidence}); fix: {self.fix}"


@dataclass(frozen=True)
class CheckMeta:
    """What a check reads and how it runs."""

    reads: str = "metrics"  # one of STREAMS: which list ``at`` indexes
    severity: str = "problem"
    # final: judged once, on the last record (held-out accuracy "after training"); the
    # live run checks it in LiveDiagnoser.finish, the doctor on the run's last evaluation
    final: bool = False


Check = Callable[[RunRecord, int], "Finding | None"]
CHECKS: Registry[CheckMeta] = Registry("run check", CheckMeta())


def _length(rec: RunRecord, stream: str) -> int:
    return 1 if stream == "config" else len(getattr(rec, stream))


def _run_check(name: str, rec: RunRecord, at: int) -> Finding | None:
    meta = CHECKS.meta(name)
    found = CHECKS.get(name)(rec, at)
    if found is None:
        return None
    # the registry's severity is the check's: one place says whether it fails the doctor
    return Finding(
        found.id or name, found.what, found.evidence, found.fix, found.step, meta.severity
    )


def _checks(reads: str | None = None, final: bool | None = None) -> list[str]:
    names = [n for n, _ in CHECKS.items()]
    if reads is not None:
        names = [n for n in names if CHECKS.meta(n).reads == reads]
    if final is not None:
        names = [n for n in names if CHECKS.meta(n).final == final]
    return names


# Positions a check runs at, at most, in one diagnose: every one up to this many records,
# then a regular sample (a 250k-step run gets a verdict in seconds, not hours).
MAX_POSITIONS = 20_000


def _first_hit(name: str, rec: RunRecord, n: int) -> Finding | None:
    """The check's finding at the first position it holds. Over :data:`MAX_POSITIONS`
    records every ``stride``-th position is tried (and the last), and the first hit is
    traced back to the first position of its run of hits; a condition that holds for
    fewer than ``stride`` consecutive records between two tries can be missed."""
    stride = max(1, -(-n // MAX_POSITIONS))
    tried = list(range(stride - 1, n, stride))
    if n and (not tried or tried[-1] != n - 1):
        tried.append(n - 1)
    before = -1
    for at in tried:
        found = _run_check(name, rec, at)
        if found is not None:
            for earlier in range(before + 1, at):
                first = _run_check(name, rec, earlier)
                if first is not None:
                    return first
            return found
        before = at
    return None


def diagnose(rec: RunRecord) -> list[Finding]:
    """Every finding of a finished (or live) run, each at the first position it holds;
    ordered config first, then by step."""
    found: list[Finding] = []
    for name in _checks():
        meta = CHECKS.meta(name)
        n = _length(rec, meta.reads)
        if meta.final:
            f = _run_check(name, rec, n - 1) if n > 0 else None
        else:
            f = _first_hit(name, rec, n)
        if f is not None:
            found.append(f)
    return sorted(found, key=lambda f: (f.step is not None, f.step or 0))


def config_findings(config: dict) -> list[Finding]:
    """The start-up checks: what the config alone says (before any model loads)."""
    rec = RunRecord(config=config)
    found = (_run_check(name, rec, 0) for name in _checks("config"))
    return [f for f in found if f is not None]


class LiveDiagnoser:
    """The checks, fed as the run goes; every method returns the NEW findings only (each
    check reports once). The loop prints each as ``log.warning(finding.message())``.

        doc = LiveDiagnoser(resolved_config)
        warn(doc.start())                          # before step 1
        warn(doc.observe(step, metrics))           # after each step's metrics line
        warn(doc.observe_completions(step, rows))  # the records written to completions/
        warn(doc.observe_eval(step, eval_record))  # after each held-out evaluation
        warn(doc.finish())                         # after the final evaluation
    """

    def __init__(self, config: dict):
        self.run = RunRecord(config=config)
        self.reported: set[str] = set()

    def _new(self, found: list[Finding | None]) -> list[Finding]:
        out = []
        for f in found:
            if f is not None and f.id not in self.reported:
                self.reported.add(f.id)
                out.append(f)
        return out

    def _at_last(self, reads: str) -> list[Finding]:
        at = _length(self.run, reads) - 1
        names = [n for n in _checks(reads, final=False) if n not in self.reported]
        return self._new([_run_check(n, self.run, at) for n in names])

    def start(self) -> list[Finding]:
        return self._new(list(config_findings(self.run.config)))

    def observe(self, step: int, metrics: dict) -> list[Finding]:
        self.run.metrics.append({"step": step, **metrics})
        return self._at_last("metrics")

    def observe_completions(self, step: int, records: list[dict]) -> list[Finding]:
        self.run.completions.append((step, list(records)))
        return self._at_last("completions")

    def observe_eval(self, step: int, record: dict) -> list[Finding]:
        self.run.evals.append({**record, "step": step})
        return self._at_last("evals")

    def finish(self) -> list[Finding]:
        """The final checks (held-out accuracy after training vs the guess floor and vs
        before), on the last evaluation observed."""
        out: list[Finding | None] = []
        for name in _checks(final=True):
            reads = CHECKS.meta(name).reads
            at = _length(self.run, reads) - 1
            if at >= 0 and name not in self.reported:
                out.append(_run_check(name, self.run, at))
        return self._new(out)
