"""``OUTPUT/plots/report.html``: one self-contained page (PNGs embedded as base64) that
opens with which run it was and the verdict, then what the model answered, then the charts.

The header (:class:`danka.tools.run_story.Header`): model, algorithm, the settings that
shape a run, device, start and wall time.

The verdict (:class:`danka.tools.verdict.Verdict`): held-out accuracy before -> after in
percent with the points gained and the number of problems, next to the guess floor; each
labelled correctness function before -> after; the answers' mean length and the share cut
at the token limit before -> after; the run doctor's findings (problems, then risks: what,
the evidence, the fix), or "no findings". A run in progress says so instead of an "after".
After the verdict: a few held-out answers at the first and the last evaluation, and the
drift probe (general prompts): its share of degenerate answers, and the answers that
degenerated. Every string from the run folder is escaped: a run can hold any text.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from danka.tools.run_story import AnswerPair, Header, ProbeDrift, question
from danka.tools.verdict import Change, Verdict

REPORT = "report.html"
_CAPTIONS = {
    "eval_accuracy": "Held-out accuracy at each evaluation (greedy), in percent. Bold: the "
    "accuracy; dashed: each labelled correctness function; red dotted: the guess floor.",
    "eval_accuracy_minutes": "The same over wall-clock minutes since the run started.",
    "reward": "Mean reward per step over all samples, and smoothed; for a reward that is not "
    "0/1, green: how the rewards of the saved samples (completions/step_N.jsonl) spread "
    "around their mean.",
    "groups": "A 0/1 reward's answer groups (the samples of one prompt), in percent of the "
    "groups: with any answer right, with every answer right (saved samples), and with mixed "
    "rewards (all groups): only mixed groups give GRPO something to learn.",
    "kl": "KL divergence to the reference policy, per token.",
    "entropy": "Policy entropy per token; a fall to near 0 means the policy stopped exploring.",
    "response_length": "Mean length of the sampled answers, in tokens.",
    "timings": "Seconds per step, by the phases that ran.",
    "reward_histogram": "Rewards of the first and the last saved samples.",
}
_STYLE = """
body{font-family:system-ui,sans-serif;max-width:960px;margin:auto;padding:0 16px;color:#222}
h1{font-size:1.4em;margin-bottom:0}.status{color:#555;margin-top:4px}
#verdict{border:1px solid #ccc;border-radius:6px;padding:4px 18px 12px;background:#fafafa}
.headline{font-size:1.25em}.good{color:#0a6b2d}.bad{color:#a40000}.note{color:#555}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 10px;
text-align:right}th:first-child,td:first-child{text-align:left}
.finding{border-left:5px solid #a40000;background:#fff;padding:6px 10px;margin:8px 0}
.finding.risk{border-left-color:#d08a00}.sev{font-weight:bold;text-transform:uppercase}
.finding div{margin-top:3px}img{max-width:100%;border:1px solid #ddd;margin:4px 0}
code{background:#eee;padding:0 3px}
table.header td{text-align:left}table.header td:first-child{color:#555}
.answer{white-space:pre-wrap;text-align:left;max-height:9em;overflow:auto;font-size:.9em;
font-family:ui-monospace,monospace;vertical-align:top}td.answer{min-width:220px}
.ok{color:#0a6b2d;font-weight:bold}.no{color:#a40000;font-weight:bold}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _points(x: float) -> str:
    return f"{100 * x:+.1f} points"


def _count(k: int, what: str) -> str:
    return f"{k} {what}" if k == 1 else f"{k} {what}s"


def _n(record: dict | None) -> str:
    try:
        return f"{int(float((record or {}).get('eval/n'))):,}"
    except (TypeError, ValueError):
        return "?"


def _step(record: dict | None) -> str:
    return _e((record or {}).get("step", "?"))


def _status(v: Verdict, folder: Path) -> str:
    evals = ", ".join(str(s) for s in v.eval_steps) or "none"
    state = "finished" if v.finished else "in progress (no result file yet)"
    return (
        f"{v.steps} steps logged; held-out evaluations at step(s) {evals}; run {state}. "
        f"Folder: {folder}"
    )


def _accuracy(v: Verdict) -> list[str]:
    last, first = v.latest, v.first
    if v.accuracy is None:
        if last is None:
            what = "no held-out evaluation yet" if not v.finished else "no held-out evaluation"
            return [
                f"<p class='headline'>Run {'in progress' if not v.finished else 'finished'}"
                f": {what}, so no before &rarr; after.</p>"
            ]
        when = "Run in progress: one" if not v.finished else "Only one"
        return [
            f"<p class='headline'>{when} held-out evaluation so far: <b>"
            f"{_pct(v.latest_accuracy)}</b> at step {_step(last)} ({_n(last)} problems); "
            "the before &rarr; after comes with the next evaluation.</p>"
        ]
    a = v.accuracy
    cls = "good" if a.delta > 0 else "bad" if a.delta < 0 else ""
    n0, n1 = _n(first), _n(last)
    problems = f"{n1} problems" if n0 == n1 else f"{n0} &rarr; {n1} problems"
    head = "Held-out accuracy" if v.finished else "Run in progress: held-out accuracy so far"
    out = [
        f"<p class='headline'>{head}: <b>{_pct(a.before)} &rarr; {_pct(a.after)}</b> "
        f"(<span class='{cls}'>{_points(a.delta)}</span>; {problems}, step {_step(first)} "
        f"&rarr; step {_step(last)})</p>"
    ]
    if v.noise is not None:
        out.append(
            f"<p class='note'>A change within &plusmn;{100 * v.noise:.1f} points may be "
            "chance (95% interval of the difference of two accuracies).</p>"
        )
    return out


def _floor(v: Verdict) -> list[str]:
    what = (
        "the best a constant answer scores on this set: the most common answer, the "
        "prompt's last number, or an empty answer"
    )
    if v.floor is None:
        return ["<p>Guess floor: not recorded by these evaluations.</p>"] if v.latest else []
    acc = v.latest_accuracy
    if acc is None:
        return [f"<p>Guess floor: <b>{_pct(v.floor)}</b> ({what}).</p>"]
    label = "final" if v.finished and v.accuracy else "latest"
    if acc > v.floor:
        times = f", {acc / v.floor:.1f}x" if v.floor > 0 else ""
        judged = f"<span class='good'>{_points(acc - v.floor).lstrip('+')} above it{times}</span>"
    else:
        judged = "<span class='bad'>at or below it: no better than a constant guess</span>"
    return [
        f"<p>Guess floor: <b>{_pct(v.floor)}</b> ({what}). The {label} accuracy "
        f"{_pct(acc)} is {judged}.</p>"
    ]


def _cells(c: Change | None, latest: float) -> str:
    if c is None:  # one evaluation: its value only
        return f"<td>{_pct(latest)}</td>"
    return f"<td>{_pct(c.before)}</td><td>{_pct(c.after)}</td><td>{_points(c.delta)}</td>"


def _functions(v: Verdict) -> list[str]:
    if not v.functions:
        return []
    steps = f"<th>step {_step(v.latest)}</th>"
    if v.accuracy is not None:
        steps = f"<th>step {_step(v.first)}</th>{steps}<th>change</th>"
    rows = [
        f"<table><tr><th>correctness function</th>{steps}<th>guess floor</th><th>reward</th></tr>"
    ]
    for f in v.functions:
        pays = {True: "trained", False: "logged only", None: "-"}[f.trained]
        floor = _pct(f.floor) if f.floor is not None else "-"
        cells = _cells(f.accuracy if v.accuracy is not None else None, f.latest)
        rows.append(f"<tr><td>{_e(f.name)}</td>{cells}<td>{floor}</td><td>{pays}</td></tr>")
    return [*rows, "</table>"]


def _lengths(v: Verdict) -> list[str]:
    parts = []
    if v.length is not None:
        parts.append(f"mean length {v.length.before:.1f} &rarr; {v.length.after:.1f} tokens")
    if v.truncated is not None:
        t = v.truncated
        parts.append(f"cut at the token limit {_pct(t.before)} &rarr; {_pct(t.after)}")
    if not parts:
        return []
    return [f"<p>{_e(v.length_source.capitalize())}: {'; '.join(parts)}.</p>"]


def _doctor(v: Verdict) -> list[str]:
    if v.doctor_note:
        return [f"<h3>Run doctor</h3><p class='bad'>{_e(v.doctor_note)}</p>"]
    problems = sum(f.severity == "problem" for f in v.findings)
    risks = len(v.findings) - problems
    if not v.findings:
        return [
            "<h3>Run doctor: no findings</h3><p>No problem and no risk found "
            "(<code>danka doctor</code> on this folder says the same).</p>"
        ]
    out = [f"<h3>Run doctor: {_count(problems, 'problem')}, {_count(risks, 'risk')}</h3>"]
    for f in v.findings:
        when = "from the config" if f.step is None else f"first at step {_e(f.step)}"
        out.append(
            f"<div class='finding {_e(f.severity)}'><span class='sev'>{_e(f.severity)}</span> "
            f"<code>{_e(f.id)}</code> ({when}): {_e(f.what)}"
            f"<div><i>evidence:</i> {_e(f.evidence)}</div>"
            f"<div><b>fix:</b> {_e(f.fix)}</div></div>"
        )
    return out


def _duration(seconds: float) -> str:
    m, sec = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h} h {m} min" if h else f"{m} min {sec} s" if m else f"{sec} s"


def header_html(h: Header, finished: bool) -> str:
    """Which run it was: the rows the run folder records, as a two-column table."""
    if h.wall_seconds is not None:
        wall = f"{_duration(h.wall_seconds)} (start-up to the final evaluation)"
    else:
        wall = "no result file yet" if not finished else None
    rows = [
        ("model", h.model),
        ("algorithm", h.algorithm),
        *h.settings,
        ("device", h.device),
        ("started", h.started and f"{h.started} (the machine's clock)"),
        ("wall time", wall),
    ]
    cells = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows if v)
    return f"<table class='header'>{cells}</table>"


def _mark(ok: bool) -> str:
    return "<span class='ok'>right</span>" if ok else "<span class='no'>wrong</span>"


def answers_html(pairs: list[AnswerPair], v: Verdict) -> str:
    """Held-out prompts answered at the first and the last evaluation, side by side."""
    if not pairs:
        return ""
    a, b = _step(v.first), _step(v.latest)
    out = [
        f"<section id='answers'><h2>Held-out answers: step {a} &rarr; step {b}</h2>",
        "<p class='note'>The same held-out prompts, answered greedily at the first and at the "
        "last evaluation; those whose answer turned right (then wrong) come first. Each "
        "question is the prompt's last turn; the whole prompt as the model read it is "
        "under it.</p>",
        f"<table><tr><th>question</th><th>expected</th><th>step {a}</th><th>step {b}</th></tr>",
    ]
    for p in pairs:
        out.append(
            f"<tr><td class='answer'>{_e(p.question)}<details><summary>whole prompt</summary>"
            f"{_e(p.prompt)}</details></td><td>{_e(p.truth)}</td>"
            f"<td class='answer'>{_mark(p.before_ok)}\n{_e(p.before)}</td>"
            f"<td class='answer'>{_mark(p.after_ok)}\n{_e(p.after)}</td></tr>"
        )
    return "\n".join([*out, "</table></section>"])


def probe_html(d: ProbeDrift | None) -> str:
    """The drift probe from step 0 to the last evaluation, and the answers that
    degenerated (none shown when none did)."""
    if d is None:
        return ""
    cls = "bad" if d.after > d.before else "good" if d.after < d.before else ""
    kl = f"; KL on the step-0 answers {d.kl:.3f} nats/token" if d.kl is not None else ""
    out = [
        "<section id='probe'><h2>Drift probe: general prompts</h2>",
        f"<p>Degenerate answers (empty, only an answer marker, or looping) to the {d.n} "
        f"general prompts: <b class='{cls}'>{_pct(d.before)} &rarr; {_pct(d.after)}</b> "
        f"(step 0 &rarr; step {_e(d.step)}){kl}.</p>",
    ]
    if not d.worse:
        out.append("<p class='note'>No answer degenerated since step 0.</p>")
    else:
        out.append(
            f"<table><tr><th>prompt</th><th>step 0</th><th>step {_e(d.step)}: degenerated</th></tr>"
        )
        out += [
            f"<tr><td>{_e(question(p))}</td><td class='answer'>{_e(a)}</td>"
            f"<td class='answer'>{_e(b)}</td></tr>"
            for p, a, b in d.worse
        ]
        out.append("</table>")
    return "\n".join([*out, "</section>"])


def verdict_html(v: Verdict, folder: Path, header: Header | None = None) -> str:
    """The report's first section: the run's name, status and header, then the verdict:
    accuracy, floor, functions, lengths, doctor."""
    parts = [
        "<section id='verdict'>",
        f"<h1>danka run: {_e(folder.name)}</h1>",
        f"<p class='status'>{_e(_status(v, folder))}</p>",
        header_html(header, v.finished) if header is not None else "",
        "<h2>Verdict</h2>",
        *_accuracy(v),
        *_floor(v),
        *_functions(v),
        *_lengths(v),
        *_doctor(v),
        "</section>",
    ]
    return "\n".join(parts)


def write_report(
    output_dir: Path,
    verdict: Verdict,
    pngs: list[Path],
    missing: list[str],
    story: tuple[Header, list[AnswerPair], ProbeDrift | None] | None = None,
) -> Path:
    """``plots/report.html``: the header and the verdict, the answers before -> after and
    the drift probe (``story``), then every PNG embedded as base64 (one file that can be
    mailed or attached to an issue)."""
    output_dir = Path(output_dir)
    header, pairs, drift = story if story is not None else (None, [], None)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>danka run {_e(output_dir.name)}</title><style>{_STYLE}</style></head><body>",
        verdict_html(verdict, output_dir, header),
        answers_html(pairs, verdict),
        probe_html(drift),
        "<section id='charts'><h2>Charts</h2>",
    ]
    for png in pngs:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        caption = _CAPTIONS.get(png.stem, "")
        parts.append(
            f"<figure><img alt='{_e(png.stem)}' src='data:image/png;base64,{data}'>"
            f"<figcaption class='note'>{_e(caption)}</figcaption></figure>"
        )
    if missing:
        parts.append(f"<p class='note'>Not plotted (no data yet): {_e(', '.join(missing))}</p>")
    parts.append("</section></body></html>")
    path = output_dir / "plots" / REPORT
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
