"""The headline numbers of BENCHMARKS.md, read back from the bench's JSON files.

    python -m bench summary                 # the headline table, then every file's rows
    python -m bench summary --results DIR   # another results folder

The headline (BENCHMARKS.md opens with it, verbatim): one row per question a user asks,
its answer computed from one file, and that file's device, date and command from
``INDEX.md``. The rows below it: each names the file it comes from and computes every ratio
from the two sides stored in that file, so a number in BENCHMARKS.md can be checked against
the run that made it. A file that is missing gives no row (a machine that ran only part of
the suite); model paths are shown by their file name, never the machine's folder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.lib.common import parser

RESULTS = Path(__file__).resolve().parent / "results"
Row = tuple[str, str, str]  # what, measured, file


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def rollout(d: dict, name: str) -> Iterator[Row]:
    sides = d["sides"]
    parts = []
    ran = [side for side, v in sides.items() if side.startswith("fast") and "tok_s" in v]
    for side in ran:  # danka's engine variants
        v = sides[side]
        lora = ", ".join(
            f"{label} {v[key]:,.0f}"
            for key, label in (
                ("lora_tok_s", "LoRA live"),
                ("lora_auto_tok_s", "LoRA live"),
                ("lora_base_tok_s", "LoRA base"),
                ("lora_merge_tok_s", "LoRA merge"),
            )
            if key in v
        )
        parts.append(f"{side} {v['tok_s']:,.0f} tok/s" + (f" ({lora})" if lora else ""))
    first = ran[0] if ran else None  # every other side's ratio is against the first danka side
    for side in ("hf-dynamic", "hf-static", "vllm"):
        if "tok_s" in sides.get(side, {}) and first:
            ratio = sides[first]["tok_s"] / sides[side]["tok_s"]
            parts.append(f"{side} {sides[side]['tok_s']:,.0f} ({first} {ratio:.2f}x)")
    shape = f"{Path(str(d['model'])).name} {d['prompts']} x {d['new_tokens']}"
    yield f"rollout {shape}", "; ".join(parts), name


def update(d: dict, name: str) -> Iterator[Row]:
    sections = d["result"]["sections"]
    head = sections.get("logprob_memory", {}).get("results", {})
    for k in ("chunked_eager", "chunked", "naive"):  # the log-prob head alone, when run
        v = head.get(k)
        if v and "step_s" in v:
            yield (
                f"log-prob head fwd+bwd, {head['tokens']} x {head['vocab']:,} vocab, {k}",
                f"{1000 * v['step_s']:.1f} ms, +{v['extra_gib']:.2f} GiB",
                name,
            )
    res = sections["update_05b"]["results"]
    for variant, v in res["variants"].items():
        yield (
            f"full update, {res['shape']} shape, {res['tokens_per_step']} tokens, {variant}",
            f"{v['tok_s']:,.0f} tok/s, MFU {_pct(v['mfu'])}, peak {v['peak_gib']:.2f} GiB",
            name,
        )


def ppo_7b(d: dict, name: str) -> Iterator[Row]:
    res = d["result"]["sections"]["ppo_7b"]["results"]
    for engine, r in res["engines"].items():
        if "peak_gib" not in r:
            continue
        step = (r.get("vs_estimate") or {}).get("step") or {}
        err = step.get("rel_error")
        est = f", estimate in the file {err:+.1%}" if err is not None else ""
        yield (
            f"PPO step, {res['shape']} shape, {engine}",
            f"peak {r['peak_gib']:.2f} GiB, median step {r['median_step_s']:.2f} s{est}",
            name,
        )


def trl(d: dict, name: str) -> Iterator[Row]:
    for variant, entry in d["variants"].items():
        sides = entry["sides"]
        t = sides.get("trl", {})
        for side in ("danka", "danka-eager"):  # danka-eager: the log-prob head run eagerly
            k = sides.get(side, {})
            if not k.get("median_step_s"):
                continue
            what = "" if side == "danka" else " (eager head)"
            sets = f" [{', '.join(k['overrides'])}]" if k.get("overrides") else ""
            if not t.get("median_step_s"):  # a danka-only run (an A/B of danka settings)
                yield (
                    f"GRPO step, danka only, {variant}{what}{sets}",
                    f"danka {k['median_step_s']:.2f} s; peak {k['peak_gib']:.2f} GiB",
                    name,
                )
                continue
            yield (
                f"GRPO step vs TRL {t.get('trl', '?')}, {variant}{what}{sets}",
                f"danka {k['median_step_s']:.2f} s vs TRL {t['median_step_s']:.2f} s "
                f"({t['median_step_s'] / k['median_step_s']:.1f}x); peak {k['peak_gib']:.2f} vs "
                f"{t['peak_gib']:.2f} GiB",
                name,
            )


def equivalence(d: dict, name: str) -> Iterator[Row]:
    cases = [
        f"{c['name']} {c['rel']:.1e} {'pass' if c.get('pass') else 'FAIL'}"
        if c.get("rel") is not None
        else f"{c['name']} {c.get('skipped') or 'no result'}"
        for c in d["equivalence"]
    ]
    yield "2 GPUs vs 1, relative weight difference", "; ".join(cases), name


def scaling(d: dict, name: str) -> Iterator[Row]:
    for r in d["scaling"]:
        one, two = r.get("1gpu", {}).get("median", {}), r.get("2gpu", {}).get("median", {})
        s1, s2 = one.get("time/step"), two.get("time/step_max") or two.get("time/step")
        measured = f"{s1:.2f} s -> {s2:.2f} s ({s1 / s2:.2f}x)" if s1 and s2 else "incomplete"
        model = Path(str(r.get("model", "?"))).name
        shape = f"{model} {r.get('prompts', '?')} x {r.get('samples', '?')} x {r.get('new_tokens', '?')}"
        yield f"2-GPU scaling, {r['engine']} engine, {shape}", measured, name


def learning(d: dict, name: str) -> Iterator[Row]:
    b, a = d["before"], d["after"]
    key = "strict" if "strict" in b else "accuracy"
    length = ""
    if b.get("mean_length") is not None and a.get("mean_length") is not None:
        length = f", mean answer {b['mean_length']:.0f} -> {a['mean_length']:.0f} tokens"
    yield (
        f"learning run ({d.get('device', '?')}), held-out {key}",
        f"{_pct(b[key])} -> {_pct(a[key])} in {d['steps']} steps, {d['train_minutes']} min"
        + (f", {d['skipped_steps']} skipped" if "skipped_steps" in d else "")
        + length,
        name,
    )
    sb, sa = d.get("sampled_before"), d.get("sampled_after")
    if sb and sa:  # calc_tool_learning.py: K sampled answers per held-out problem
        yield (
            f"learning run ({d.get('device', '?')}), held-out sampled "
            f"(T={sa['temperature']:g}, {sa['n']} x {sa['samples']})",
            f"{_pct(sb['accuracy'])} -> {_pct(sa['accuracy'])}, valid-call rate "
            f"{_pct(sb['valid_call_rate'])} -> {_pct(sa['valid_call_rate'])}",
            name,
        )


def gsm8k_run(d: dict, name: str) -> Iterator[Row]:
    """python -m bench gsm8k: a real model's held-out GSM8K accuracy, first -> last evaluation."""
    b, a = d["before"], d["after"]
    algorithm = d.get("config", {}).get("trainer", {}).get("algorithm", "?")
    model = Path(str(d.get("model", {}).get("file", "?"))).name
    yield (
        f"GSM8K learning run, {model}, {algorithm}",
        f"strict {_pct(b['strict'])} -> {_pct(a['strict'])}, flexible {_pct(b['flexible'])} -> "
        f"{_pct(a['flexible'])} ({a['n']} questions), {d['steps']} steps, "
        f"{d['wall_minutes_to_final_eval']:.1f} min to the final evaluation, peak "
        f"{d['peak_gib']:.2f} GiB",
        name,
    )


def gsm8k_floors(d: dict, name: str) -> Iterator[Row]:
    """python -m bench gsm8k-floors: the strict accuracy of answers that do not reason."""
    f = d["floors"]
    yield (
        f"GSM8K strict floors ({d['n']} test questions)",
        f"constant {f['constant']['answer']!r} {_pct(f['constant']['strict'])}, last number "
        f"of the question {_pct(f['last_number_of_question']['strict'])}",
        name,
    )


def quickstart(d: dict, name: str) -> Iterator[Row]:
    """The quickstart run: held-out accuracy before and after, and what the run took."""
    accuracy = f"{_pct(d['held_out_before'])} -> {_pct(d['held_out_after'])}"
    if "guess_floor" in d:  # every accuracy next to what no model needs to score
        length = d["response_length"]
        accuracy += (
            f" (guess floor {_pct(d['guess_floor'])}), mean answer {length['before']:.0f} -> "
            f"{length['after']:.0f} tokens"
        )
    took = f"wall clock {d['wall_clock']}, peak {d['max_rss_gb']} GB"
    yield (
        f"quickstart ({d['n']} held-out problems), {d['steps']} steps",
        f"{accuracy}; {took}",
        name,
    )


def packing(d: dict, name: str) -> Iterator[Row]:
    r = d["sections"]["packing"]["results"]
    yield (
        "effective-token ratio (GSM8K lengths)",
        f"padded {_pct(r['padded_ratio'])}, grouped {_pct(r['danka_ratio'])}, "
        f"packed {_pct(r['packed_ratio'])}",
        name,
    )


def shared_prefix(d: dict, name: str) -> Iterator[Row]:
    """python -m bench shared-prefix: plain vs shared-prefix paths, each side a fresh process."""
    a, b = d["sides"]["plain"], d["sides"]["shared"]
    for key, what in (
        ("eval_200_greedy_s", "200 greedy answers"),
        ("rollout_8x8_s", "8 x 8 sampled"),
        ("train_fwd_bwd_16_rows_s", "training fwd+bwd, 16 rows"),
    ):
        yield (
            f"shared prefix ({d.get('device', '?')}), {what}",
            f"{a[key]:.2f} s -> {b[key]:.2f} s ({a[key] / b[key]:.2f}x); same tokens: "
            f"{d['same_eval_tokens'] and d['same_rollout_tokens']}",
            name,
        )


def small_card(d: dict, name: str) -> Iterator[Row]:
    """python -m bench small-card: a smaller card simulated, micro-batch auto."""
    engine = "QLoRA, HF" if d["qlora"] else d["overrides"][-1].split("=")[-1]
    yield (
        f"7B-shape PPO step in a {d['budget_gib']:.0f} GiB budget ({engine})",
        f"micro-batch {d['micro_batch_final']} (planned {d['micro_batch_planned']}); peak "
        f"{d['measured_peak_gib']:.2f} GiB, planned {d['planned_peak_gib']:.2f} "
        f"({d['plan_error']:+.1%}); {d['median_step_s']:.2f} s a step; "
        f"{d['oom_retries']} out-of-memory retries",
        name,
    )


# file pattern -> row maker; a file matching several patterns uses the first
READERS: list[tuple[str, Callable[[dict, str], Iterator[Row]]]] = [
    ("rollout_*x*.json", rollout),
    ("gsm8k_qwen05_*.json", gsm8k_run),
    ("train_update_05b*.json", update),
    ("train_ppo_7b*.json", ppo_7b),
    ("trl_*.json", trl),
    ("equivalence_2x*.json", equivalence),
    ("scale_2x_*.json", scaling),
    ("*_result.json", learning),
    ("calc_tool_learning_h200*.json", learning),
    ("packing_gsm8k_lengths.json", packing),
    ("gsm8k_floors.json", gsm8k_floors),
    ("quickstart_cpu.json", quickstart),
    ("shared_prefix_*.json", shared_prefix),
    ("small_card_*.json", small_card),
]


def rows(results: Path) -> list[Row]:
    out: list[Row] = []
    seen: set[Path] = set()
    for pattern, reader in READERS:
        for path in sorted(results.glob(pattern)):
            if path in seen or path.name.endswith("_profile.json"):
                continue
            seen.add(path)
            try:
                out.extend(reader(json.loads(path.read_text()), path.name))
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
                out.append((f"unreadable: {path.name}", f"{type(err).__name__}: {err}", path.name))
    return out


def _pp(x: float) -> str:
    return f"{100 * x:.1f}%"


def _learned(d: dict) -> str:
    b, a = d["before"], d["after"]
    return (
        f"strict {_pp(b['strict'])} -> {_pp(a['strict'])}, flexible {_pp(b['flexible'])} -> "
        f"{_pp(a['flexible'])} (all {a['n']:,} test questions, greedy) in "
        f"{d['wall_minutes_to_final_eval']:.1f} min{_to(d, '0.33')}; peak {d['peak_gib']:.2f} GiB"
    )


def _to(d: dict, level: str) -> str:
    """The first minute at ``level`` strict from a run's ``minutes_to`` as ", 33% at 4.12 min"
    (nothing for older files, or where it was not reached)."""
    got = (d.get("minutes_to") or {}).get(level)
    return f", {float(level):.0%} at {got:.2f} min" if got is not None else ""


def _vs_trl(variant: str) -> Callable[[dict], str]:
    def answer(d: dict) -> str:
        sides = d["variants"][variant]["sides"]
        k, t = sides["danka"], sides["trl"]
        return (
            f"{t['median_step_s'] / k['median_step_s']:.1f}x faster: {k['median_step_s']:.2f} s "
            f"vs {t['median_step_s']:.2f} s a step; peak {k['peak_gib']:.2f} vs "
            f"{t['peak_gib']:.2f} GiB"
        )

    return answer


def _rollout_ratio(other: str) -> Callable[[dict], str]:
    def answer(d: dict) -> str:
        fast, them = d["sides"]["fast-default"]["tok_s"], d["sides"][other]["tok_s"]
        return f"{fast / them:.1f}x: {fast:,.0f} vs {them:,.0f} tok/s (every sequence to 512)"

    return answer


def _clock(text: str) -> str:
    """``/usr/bin/time``'s ``m:ss.cc`` as minutes and seconds."""
    minutes, seconds = text.split(":")
    return f"{int(minutes)} min {float(seconds):.0f} s"


def _quickstart(d: dict) -> str:
    return (
        f"{_pp(d['held_out_before'])} -> {_pp(d['held_out_after'])} held out ({d['n']} "
        f"problems, guess floor {_pp(d['guess_floor'])}) in {_clock(d['wall_clock'])}; peak "
        f"RAM {d['max_rss_gb']} GB"
    )


def _small_card(d: dict) -> str:
    return (
        f"yes: micro-batch {d['micro_batch_final']} (auto), peak {d['measured_peak_gib']:.2f} "
        f"GiB (planned {d['planned_peak_gib']:.2f}), {d['median_step_s']:.2f} s a step"
    )


# question, the file that answers it, how
HEADLINE: list[tuple[str, str, Callable[[dict], str]]] = [
    (
        "Does the quickstart learn on a CPU? (SmolLM2-135M, GRPO + LoRA, 8 steps)",
        "quickstart_cpu.json",
        _quickstart,
    ),
    (
        "What does a real model learn on GSM8K? (Qwen2.5-Coder-0.5B-Instruct, "
        "`examples/gsm8k_grpo.yaml`, 8 training minutes)",
        "gsm8k_qwen05_grpo.json",
        _learned,
    ),
    (
        "The same with PPO? (the example's first recipe; the GPU shared with a GRPO run)",
        "gsm8k_qwen05_ppo_tune1.json",
        _learned,
    ),
    (
        "A GRPO step against TRL's GRPOTrainer, LoRA (SmolLM2-135M, 8 x 8 x 256 tokens)",
        "trl_smollm2_real_8x8_lora.json",
        _vs_trl("lora"),
    ),
    ("The same, full-parameter", "trl_smollm2_real_8x8_full.json", _vs_trl("full")),
    (
        "Rollout against HF `generate` (static cache + compile), Qwen2.5-Coder-0.5B, 256 GSM8K "
        "prompts x 512 tokens",
        "rollout_qwen05_gsm8k_256x512.json",
        _rollout_ratio("hf-static"),
    ),
    (
        "Rollout against vLLM 0.26, the same shape",
        "vllm_vs_fast_qwen05_gsm8k_256x512.json",
        _rollout_ratio("vllm"),
    ),
    (
        "Does the single-card tutorial's PPO + LoRA step fit a 24 GB card? (Qwen2-7B shape, "
        "random weights, the process capped at 24 GiB)",
        "small_card_24gib.json",
        _small_card,
    ),
]


def index(results: Path) -> dict[str, tuple[str, str, str]]:
    """File name -> (device, date, command) from ``INDEX.md``'s table (a row may name two
    files, a JSON and its PNG: the JSON counts)."""
    out: dict[str, tuple[str, str, str]] = {}
    path = results / "INDEX.md"
    for line in path.read_text().splitlines() if path.is_file() else []:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 5 and cells[0].startswith("`"):
            for name in re.findall(r"`([^`]+\.json)`", cells[0]):
                out[name] = (cells[2], cells[3], cells[4])
    return out


def headline(results: Path) -> str:
    """The headline table: one row per question whose file is in ``results``."""
    where = index(results)
    lines = [
        "| question | danka measured | device | date | command | file |",
        "|---|---|---|---|---|---|",
    ]
    for question, name, answer in HEADLINE:
        path = results / name
        if not path.is_file():
            continue
        device, date, command = where.get(name, ("?", "?", "see the file"))
        try:
            measured = answer(json.loads(path.read_text()))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
            measured = f"unreadable: {type(err).__name__}: {err}"
        lines.append(f"| {question} | {measured} | {device} | {date} | {command} | `{name}` |")
    return "\n".join(lines)


def table(items: list[Row]) -> str:
    lines = ["| what | measured | file |", "|---|---|---|"]
    lines += [f"| {w} | {m} | `{f}` |" for w, m, f in items]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser("summary", __doc__)
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    print(headline(args.results))
    print()
    print(table(rows(args.results)))
    return 0
