"""``danka estimate CONFIG``: the memory plan of danka/planning/memory.py, as text."""

from __future__ import annotations

from danka.planning.memory import GIB, MARGIN, MemoryPlan

__all__ = ["format_plan"]


def _prompt_source(source: str) -> str:
    if source == "data":
        return "the longest training prompt"
    return f"the bound {source} allows"


def format_plan(plan: MemoryPlan, sizes: str | None = None) -> str:
    """The plan as aligned text: components, phases, verdict and fixes; ``sizes``: the
    line of the sizes ``auto`` planned (danka.planning.micro.SizePlan.line)."""
    gib = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    a = plan.assumptions
    lines = [
        f"model {plan.model}: {plan.params / 1e9:.3f}B parameters, "
        f"{plan.dtype}; LoRA {plan.lora_params / 1e6:.2f}M parameters",
        f"rollout: {a.rollout_sequences} sequences x {a.sequence_tokens} tokens (prompts up to "
        f"{a.prompt_tokens}: {_prompt_source(a.prompt_tokens_from)}); "
        f"update: {a.update_tokens_per_micro_batch} tokens per micro-batch (worst case: every sequence at max_length)",
        "",
    ]
    if sizes is not None:  # trainer.micro_batch_size: auto
        lines[-1:-1] = [f"trainer.micro_batch_size: auto -> {sizes}"]
    width = max(len(k) for k in plan.components)
    lines += [f"  {k:<{width}}  {gib(v)}" for k, v in plan.components.items()]
    if plan.chunk_rows < plan.response_rows:
        lines.append(
            f"  (chunks of {plan.chunk_rows} of the {plan.response_rows} response "
            f"rows; full logits would take {plan.full_logits_would_be / GIB:.2f} GiB)"
        )
    else:
        lines.append(
            f"  (one chunk holds all {plan.response_rows} response rows of a micro-batch "
            "(micro_batch_size x max_new_tokens): chunking saves nothing at these settings)"
        )
    lines.append("")
    for phase, value in plan.phases.items():
        mark = "  <- peak" if phase == plan.peak_phase else ""
        lines.append(f"  phase {phase:<8} {gib(value)}{mark}")
    lines.append(f"  + CUDA context and fragmentation ~{plan.overhead / GIB:.1f} GiB")
    v = plan.verdict
    if v is not None:
        total = (plan.peak + plan.overhead) / GIB
        budget, spare = v.gpu_memory / GIB, v.headroom / GIB
        if not v.fits:
            verdict = f"does not fit in {budget:.1f} GiB (needs ~{total:.2f} GiB)"
        elif v.tight:
            verdict = (
                f"fits only just in {budget:.1f} GiB (needs ~{total:.2f} GiB, {spare:.2f} GiB "
                f"to spare, under the {100 * MARGIN:.0f}% margin this estimate's error needs: "
                "expect out-of-memory on long batches)"
            )
        else:
            verdict = f"fits in {budget:.1f} GiB (needs ~{total:.2f} GiB, {spare:.2f} GiB to spare)"
        lines.append(f"\nverdict: {verdict}")
        for fix in v.suggestions:
            lines.append(f"  try: {fix}")
    return "\n".join(lines)
