"""``danka estimate CONFIG``: the memory plan of danka/planning/memory.py, as text."""

from __future__ import annotations

from typing import Any

from danka.planning.memory import GIB, MARGIN

__all__ = ["format_plan"]


def format_plan(result: dict[str, Any]) -> str:
    """The plan as aligned text: components, phases, verdict and fixes."""
    gib = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    a = result["assumptions"]
    lines = [
        f"model {result['model']}: {result['params'] / 1e9:.3f}B parameters, "
        f"{result['dtype']}; LoRA {result['lora_params'] / 1e6:.2f}M parameters",
        f"rollout: {a['rollout_sequences']} sequences x {a['sequence_tokens']} tokens; "
        f"update: {a['update_tokens_per_micro_batch']} tokens per micro-batch (worst case: every sequence at max_length)",
        "",
    ]
    if "micro_batch_plan" in result:  # trainer.micro_batch_size: auto
        lines[-1:-1] = [f"trainer.micro_batch_size: auto -> {result['micro_batch_plan']}"]
    width = max(len(k) for k in result["components"])
    lines += [f"  {k:<{width}}  {gib(v)}" for k, v in result["components"].items()]
    if result["chunk_rows"] < result["response_rows"]:
        lines.append(
            f"  (chunks of {result['chunk_rows']} of the {result['response_rows']} response "
            f"rows; full logits would take {result['full_logits_would_be'] / GIB:.2f} GiB)"
        )
    else:
        lines.append(
            f"  (one chunk holds all {result['response_rows']} response rows of a micro-batch "
            "(micro_batch_size x max_new_tokens): chunking saves nothing at these settings)"
        )
    lines.append("")
    for phase, value in result["phases"].items():
        mark = "  <- peak" if phase == result["peak_phase"] else ""
        lines.append(f"  phase {phase:<8} {gib(value)}{mark}")
    lines.append(f"  + CUDA context and fragmentation ~{result['overhead'] / GIB:.1f} GiB")
    if "fits" in result:
        total = (result["peak"] + result["overhead"]) / GIB
        budget, spare = result["gpu_memory"] / GIB, result["headroom"] / GIB
        if not result["fits"]:
            verdict = f"does not fit in {budget:.1f} GiB (needs ~{total:.2f} GiB)"
        elif result["tight"]:
            verdict = (
                f"fits only just in {budget:.1f} GiB (needs ~{total:.2f} GiB, {spare:.2f} GiB "
                f"to spare, under the {100 * MARGIN:.0f}% margin this estimate's error needs: "
                "expect out-of-memory on long batches)"
            )
        else:
            verdict = f"fits in {budget:.1f} GiB (needs ~{total:.2f} GiB, {spare:.2f} GiB to spare)"
        lines.append(f"\nverdict: {verdict}")
        for fix in result.get("suggestions", []):
            lines.append(f"  try: {fix}")
    return "\n".join(lines)
