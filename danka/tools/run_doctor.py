"""``danka doctor RUN_DIR``: is this run learning? One verdict per problem found.

Reads a finished or live run's ``metrics.jsonl``, ``config.json``, ``eval/`` and
``completions/`` (danka.diagnose.read_run_dir) and prints each finding of
danka.diagnose.diagnose: what, the evidence (steps and numbers), the fix. Exit codes: 0
nothing found (risks may be listed), 1 at least one problem, 2 not a run folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from danka.diagnose import Finding, RunRecord, diagnose, read_run_dir


def exit_code(findings: list[Finding]) -> int:
    """1 when any finding is a problem, else 0."""
    return 1 if any(f.severity == "problem" for f in findings) else 0


def summary(record: RunRecord) -> str:
    steps = record.metrics[-1]["step"] if record.metrics else 0
    evals = ", ".join(str(e.get("step")) for e in record.evals) or "none"
    saved = len(record.completions)
    return f"{steps} steps, evaluations at step(s) {evals}, {saved} completions files"


def by_severity(findings: list[Finding]) -> list[Finding]:
    """Problems first, then risks; each group in the doctor's order (config, then step)."""
    return [f for f in findings if f.severity == "problem"] + [
        f for f in findings if f.severity == "risk"
    ]


def format_report(run_dir: str, record: RunRecord, findings: list[Finding]) -> str:
    problems = [f for f in findings if f.severity == "problem"]
    risks = [f for f in findings if f.severity == "risk"]
    lines = [f"danka doctor {run_dir}: {summary(record)}"]
    for f in by_severity(findings):
        when = "config" if f.step is None else f"step {f.step}"
        lines.append(f"[{f.severity}] {f.id} ({when}): {f.what}")
        lines.append(f"    evidence: {f.evidence}")
        lines.append(f"    fix: {f.fix}")
    verdict = f"{len(problems)} problem(s)" if problems else "no problems found"
    if risks:
        verdict += f", {len(risks)} risk(s)"
    lines.append(verdict)
    return "\n".join(lines) + "\n"


def report_json(run_dir: str, record: RunRecord, findings: list[Finding]) -> dict:
    return {
        "run_dir": run_dir,
        "steps": record.metrics[-1]["step"] if record.metrics else 0,
        "eval_steps": [e.get("step") for e in record.evals],
        "problems": sum(f.severity == "problem" for f in findings),
        "risks": sum(f.severity == "risk" for f in findings),
        "findings": [f.to_dict() for f in findings],
    }


def run_doctor_on(run_dir: str | Path, as_json: bool = False, stream: TextIO | None = None) -> int:
    """Diagnose ``run_dir`` and print the report; the exit code (UserError: not a run)."""
    stream = stream or sys.stdout
    record = read_run_dir(run_dir)
    findings = diagnose(record)
    if as_json:
        stream.write(json.dumps(report_json(str(run_dir), record, findings), indent=2) + "\n")
    else:
        stream.write(format_report(str(run_dir), record, findings))
    return exit_code(findings)
