"""Model FLOPs of a training step's phases, and MFU: what the step's ``perf/*`` metrics
and ``python -m bench`` report, one formula for both.

MFU = model FLOPs / seconds / 790e12 (the H200's measured dense bf16 matmul ceiling, not
the data sheet's 989 TF; the H100 has the same tensor cores and clocks and is held to the
same number; other devices get TFLOP/s without an MFU). Model FLOPs count the matrix products the step needs, not what
the hardware ran: padding, a gradient-checkpointing recompute and attention's
score/value products (about 4 x layers x T x hidden per token: under 5% at GSM8K's
~700-token sequences) are left out.

Counts (:class:`Counts`): N = the decoder's parameters (every layer and the final norm; not
the input embedding, a lookup), Vh = hidden x vocabulary (the output head, tied or not),
Nl = one LoRA adapter's parameters. Tokens: T = real prompt + response tokens of the
sequences, R = real response tokens (danka's log-prob head runs over response positions
only), G = generated tokens, S = sequences.

    forward (no grad)   F(T, R) = 2 N T + 2 Vh R  (+ 2 Nl T with LoRA)
    log-probs           passes x F(T, R)          (passes: pi_old unless on-policy, + pi_ref)
    critic values       2 N T                     (no head; the value head is ~0)
    rollout             2 N (T_prompt + G) + 2 Vh (G + S)
                        (prefill, then one forward per generated token; the head on the
                        last prompt position and every generated token)
    update, full        epochs x 3 F(T, R)        (forward + input grads + weight grads)
    update, LoRA        epochs x (2 F(T, R) + 2 Nl T)
                        (the frozen base needs input grads only; the adapters' weight
                        grads are 2 Nl T)
    PPO's critic        + epochs x (2 x 2 N T (+ 2 Nl T), LoRA; 3 x 2 N T, full)

``mfu_6nt`` is the usual convention instead: 6 x every parameter (a tied matrix once) x T,
the number to hold a full-parameter update against (it counts the head over prompt tokens
too, and the embedding as if it were a matmul).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PEAK_FLOPS = 790e12  # measured dense bf16 matmul ceiling of the H200 (not the 989 TF sheet)
FORMULA = (
    "danka/models/flops.py: forward F = 2 N T + 2 Vh R (+2 Nl T LoRA); log-probs passes x F; "
    "critic 2 N T; rollout 2 N (P + G) + 2 Vh (G + S); update full 3 F, LoRA 2 F + 2 Nl T "
    "(input grads only through the frozen base), x ppo_epochs; N = decoder params without "
    "embedding, Vh = hidden x vocab, T = real prompt + response tokens, R = response tokens; "
    "attention scores, padding and checkpoint recompute not counted; MFU = FLOPs / s / 790e12"
)


@dataclass(frozen=True)
class Counts:
    """Parameter counts of a causal LM (module docstring): ``body`` N, ``head`` Vh,
    ``lora`` Nl (the ``default`` adapter's, 0 without LoRA), ``total`` every parameter
    (a tied matrix once, other adapters and the value head left out)."""

    body: int
    head: int
    lora: int
    total: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> Counts:
        out_w = model.get_output_embeddings().weight
        in_w = model.get_input_embeddings().weight
        skip = {id(out_w), id(in_w)}
        body = lora = 0
        for name, p in model.named_parameters():
            if "lora_" in name:
                lora += p.numel() if ".default." in name else 0
            elif id(p) not in skip and "value_head" not in name:
                body += p.numel()
        embed = 0 if in_w is out_w else in_w.numel()
        return cls(body, out_w.numel(), lora, body + out_w.numel() + embed)


def forward(c: Counts, tokens: float, response: float) -> float:
    return 2 * c.body * tokens + 2 * c.head * response + 2 * c.lora * tokens


def phase_flops(
    c: Counts,
    *,
    prompt: float,
    response: float,
    sequences: int,
    logprob_passes: int,
    critic: bool,
    full: bool,
    epochs: int = 1,
    generated: float | None = None,
) -> dict[str, float]:
    """Model FLOPs of each phase of one step over ``sequences`` sequences with ``prompt``
    and ``response`` real tokens in all (``generated``: the rollout's, default
    ``response``)."""
    t = prompt + response
    g = response if generated is None else generated
    fwd = forward(c, t, response)
    actor = 3 * fwd if full else 2 * fwd + 2 * c.lora * t
    critic_fwd = 2 * c.body * t + (2 * c.lora * t if not full else 0)
    critic_upd = 3 * critic_fwd if full else 2 * critic_fwd + 2 * c.lora * t
    return {
        "rollout": 2 * (c.body + c.lora) * (prompt + g) + 2 * c.head * (g + sequences),
        "logprobs": logprob_passes * fwd,
        "values": critic_fwd if critic else 0.0,
        "update": epochs * (actor + (critic_upd if critic else 0.0)),
    }


def mfu(flops: float, seconds: float | None) -> float | None:
    """Model FLOPs utilisation of the H200's 790 TFLOP/s; None without a time."""
    return flops / seconds / PEAK_FLOPS if seconds else None


def mfu_6nt(c: Counts, tokens: float, seconds: float | None) -> float | None:
    """The convention: 6 x every parameter x tokens / seconds / 790e12."""
    return mfu(6 * c.total * tokens, seconds)


def device_peak(device: torch.device) -> float | None:
    """The bf16 matmul ceiling MFU is counted against on ``device``: PEAK_FLOPS on an
    H100 or H200, None elsewhere (a CPU, another GPU: TFLOP/s only)."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    return PEAK_FLOPS if ("H100" in name or "H200" in name) else None


def perf_metrics(
    flops: dict[str, float], seconds: dict[str, float], peak: float | None
) -> dict[str, float]:
    """``perf/<phase>_tflops`` (model TFLOP/s) and ``perf/<phase>_mfu`` (a fraction of
    ``peak``, when known) of the phases that ran."""
    out: dict[str, float] = {}
    for phase, f in flops.items():
        s = seconds.get(phase, 0.0)
        if f <= 0 or s <= 0:
            continue
        out[f"perf/{phase}_tflops"] = f / s / 1e12
        if peak:
            out[f"perf/{phase}_mfu"] = f / s / peak
    return out
