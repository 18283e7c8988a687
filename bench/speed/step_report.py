"""The tables of section ``gsm8k_step`` (``python -m bench train``): the readable summary
printed after each algorithm, and the rows of the final table."""

from __future__ import annotations

from bench.lib.common import fmt


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _k(x) -> str:
    return "-" if x is None else f"{x / 1e3:.1f}k"


def report(algo: str, r: dict) -> str:
    """The readable summary of one algorithm: phases, plan vs measured, top kernels,
    variants."""
    if "error" in r:
        return f"\n== gsm8k_step {algo}: ERROR {r['error']}"
    z = r["sizes"]
    lines = [
        f"\n== gsm8k_step {algo.upper()}: {r['config']}, {z['prompts']} x "
        f"{z['samples_per_prompt']} x <= {z['max_new_tokens']} new tokens, micro-batch "
        f"{z['micro_batch']}, log-prob chunk {z['logprob_chunk']}, "
        f"{'LoRA r' + str(r['lora_r']) if r['lora'] else 'full-parameter'}; timed steps "
        f"{r['timed_steps']} (median)",
        f"{'phase':<11}{'s':>8}{'share':>8}{'tokens':>10}{'tok/s':>9}{'TFLOP':>8}"
        f"{'MFU':>7}{'peak GiB':>10}  top kernel (% of phase)",
    ]
    for phase, row in r["phases"].items():
        prof = r.get("profile", {}).get(phase, {})
        top = (prof.get("kernels") or [{}])[0]
        top_s = f"{top['name'][:48]} ({fmt(top.get('pct_of_step'), '{:.0f}')}%)" if top else ""
        lines.append(
            f"{phase:<11}{fmt(row['s']):>8}{_pct(row['share']):>8}"
            f"{fmt(row.get('tokens'), '{:,.0f}'):>10}{_k(row.get('tok_s')):>9}"
            f"{fmt(row.get('tflop'), '{:.1f}'):>8}{_pct(row.get('mfu')):>7}"
            f"{fmt(row.get('peak_gib')):>10}  {top_s}"
        )
    vs = r.get("vs_plan")
    if vs:
        cells = [f"{k} {fmt(v['estimate_gib'])}/{fmt(v['measured_gib'])} "
                 f"({fmt(v['rel_error'], '{:+.0%}')})" for k, v in vs.items() if k != "within_15pct"]  # fmt: skip
        lines.append("plan/measured GiB: " + ", ".join(cells))
    for phase, prof in r.get("profile", {}).items():
        if "error" in prof:
            lines.append(f"profile {phase}: {prof['error']}")
            continue
        if not prof.get("kernels"):  # e.g. GRPO's values: no critic, nothing ran
            continue
        busy = _pct(prof.get("gpu_busy_frac"))
        classes = ", ".join(f"{k} {v:.0f} ms" for k, v in list(prof["classes"].items())[:4])
        lines.append(f"profile {phase}: kernels {fmt(prof['kernel_ms_per_step'], '{:.0f}')} ms, "
                     f"GPU busy {busy}: {classes}")  # fmt: skip
        for k in prof["kernels"][:5]:
            lines.append(
                f"    {fmt(k['pct_of_step'], '{:5.1f}')}%  {k['calls']:>7.0f} x  {k['name'][:90]}"
            )
    if r.get("variants"):
        on = r["variants_on"]
        lines.append(f"variants: steps 4-7 on {on['sequences']} of {on['of']} sequences, uncapped")
        lines.append(f"{'variant':<16}{'micro':>6}{'chunk':>6}{'logprobs s':>11}{'update s':>9}"
                     f"{'upd tok/s':>10}{'upd MFU':>8}{'6NT':>7}{'peak GiB':>9}")  # fmt: skip
        for name, v in r["variants"].items():
            if "phases" not in v:
                lines.append(f"{name:<16}{v.get('error') or v.get('skipped')}")
                continue
            up = v["phases"].get("update", {})
            lines.append(
                f"{name:<16}{v['micro_batch']:>6}{v['logprob_chunk']:>6}"
                f"{fmt(v['seconds'].get('logprobs')):>11}{fmt(v['seconds'].get('update')):>9}"
                f"{_k(up.get('tok_s')):>10}{_pct(up.get('mfu')):>8}{_pct(up.get('mfu_6nt')):>7}"
                f"{fmt(v['peak_gib']):>9}"
            )
    return "\n".join(lines)


def rows(res: dict) -> list[tuple[str, str, str]]:
    """(metric, value, reference) rows for ``python -m bench train``'s final table."""
    out = []
    for algo, r in res["algos"].items():
        if "error" in r:
            out.append((f"{algo}", "ERROR", r["error"][:60]))
            continue
        step = r["phases"].get("step", {})
        out.append((f"{algo} step s | peak GiB", f"{fmt(step.get('s'))} | "
                    f"{fmt((r['phase_peak_gib'] or {}).get('step'))}",
                    f"micro {r['sizes']['micro_batch']}, chunk {r['sizes']['logprob_chunk']}"))  # fmt: skip
        for phase in ("rollout", "logprobs", "values", "update"):
            row = r["phases"].get(phase)
            if row and row["s"] > 0.0005:
                out.append((f"{algo} {phase} s | tok/s | MFU",
                            f"{fmt(row['s'])} | {_k(row.get('tok_s'))} | {_pct(row.get('mfu'))}",
                            f"peak {fmt(row.get('peak_gib'))} GiB"))  # fmt: skip
        for name, v in (r.get("variants") or {}).items():
            up = (v.get("phases") or {}).get("update", {})
            value = (f"{fmt(v['seconds']['trained'])} | {_pct(up.get('mfu'))}" if "phases" in v
                     else (v.get("error") or v.get("skipped") or "")[:40])  # fmt: skip
            out.append((f"{algo} variant {name} s(4-7) | upd MFU", value,
                        f"peak {fmt(v.get('peak_gib'))} GiB" if "phases" in v else ""))  # fmt: skip
    return out
