"""The drift probe: a few general prompts answered greedily at every evaluation, to see
whether RL on one task broke the model's answers to everything else (the single-card tutorial's
"the trained model still answers a general question fluently").

Per evaluation: :func:`probe_stats` over the answers (length, and the share that are
empty, only an answer marker, or looping), and :func:`mean_kl`, how far the current
policy moved on the step-0 answers. The trainer does the model calls; this is the maths.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

# Short prompts that need words to answer (a bare number or "####" is never a good
# answer), none about arithmetic, so a policy trained to emit "#### N" shows it here.
PROBE_PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "Name three colours.",
    "How do you make a cup of tea?",
    "Give me a word that means the same as 'happy'.",
    "What does a cat like to eat?",
    "Say good morning in Spanish.",
    "Describe a sunny day in one sentence.",
)

# A line, or a run of 4 words, that occurs 3 times: twice happens in normal prose (a
# refrain, a list's lead-in), three times in a few sentences is a loop.
REPEAT_TIMES = 3
REPEAT_NGRAM = 4
_BOXED = re.compile(r"\\(?:boxed|fbox)")


def is_empty(text: str) -> bool:
    return not text.strip()


def is_marker_only(text: str) -> bool:
    """Not empty, and not one letter once ``\\boxed`` is removed: only an answer marker
    (``####``), numbers, braces and punctuation, e.g. ``#### 5`` or ``14\\n14``."""
    body = _BOXED.sub("", text).strip()
    return bool(body) and not any(ch.isalpha() for ch in body)


def is_repeated(text: str) -> bool:
    """A non-empty line occurs REPEAT_TIMES times, or a run of REPEAT_NGRAM words does
    (case-insensitive)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines and Counter(lines).most_common(1)[0][1] >= REPEAT_TIMES:
        return True
    words = text.lower().split()
    grams = [tuple(words[i : i + REPEAT_NGRAM]) for i in range(len(words) - REPEAT_NGRAM + 1)]
    return bool(grams) and Counter(grams).most_common(1)[0][1] >= REPEAT_TIMES


@dataclass(frozen=True)
class ProbeStats:
    """Summary of one evaluation's probe answers (fractions of the n answers)."""

    n: int
    mean_length: float  # tokens
    empty_frac: float
    marker_only_frac: float
    repeated_frac: float
    degenerate_frac: float  # empty, marker-only or repeated (an answer counts once)

    def metrics(self, kl: float | None = None) -> dict[str, float]:
        """``probe/<field>`` for the eval file (and ``probe/kl`` when given)."""
        out = {f"probe/{k}": float(v) for k, v in asdict(self).items()}
        if kl is not None:
            out["probe/kl"] = float(kl)
        return out


def probe_stats(completions: Sequence[str], token_lengths: Sequence[int]) -> ProbeStats:
    """Stats of the probe answers; ``token_lengths[i]`` is answer i's length in tokens."""
    if len(completions) != len(token_lengths):
        raise ValueError(f"{len(completions)} completions, {len(token_lengths)} lengths")
    n = len(completions)
    if n == 0:
        return ProbeStats(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    empty = [is_empty(c) for c in completions]
    marker = [is_marker_only(c) for c in completions]
    repeated = [is_repeated(c) for c in completions]
    bad = [a or b or c for a, b, c in zip(empty, marker, repeated)]
    return ProbeStats(
        n=n,
        mean_length=sum(token_lengths) / n,
        empty_frac=sum(empty) / n,
        marker_only_frac=sum(marker) / n,
        repeated_frac=sum(repeated) / n,
        degenerate_frac=sum(bad) / n,
    )


def mean_kl(logp_now: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor) -> float:
    """Drift on the step-0 probe answers, in nats per token (B, R inputs, ``mask`` 1 on
    the answers' tokens):

        KL ~ sum_t m_t (log pi_0(y_t) - log pi_t(y_t)) / sum_t m_t

    with y the answers pi_0 (the model at step 0) gave, ``logp_ref`` their log-probs under
    pi_0 (computed once, at step 0) and ``logp_now`` under the current policy pi_t.

    This is the k1 estimator of KL(pi_0 || pi_t) (Schulman 2020, "Approximating KL
    divergence"), chosen because of what the tokens are: the probe answers are greedy, not
    samples from pi_0, so no estimator is unbiased here, and k1 at least reads plainly as
    the log-likelihood per token the policy lost on the base model's own answers. k3
    (r - 1 - log r, r = pi_t / pi_0) is preferred for its low variance while unbiased,
    which needs tokens sampled from pi_0; on greedy tokens that reason is gone. k1 may be slightly
    negative (the policy grew more sure of the base's answers); a policy that collapsed to
    "#### N" reads several nats per token. 0 for an empty mask.
    """
    if logp_now.shape != logp_ref.shape or logp_now.shape != mask.shape:
        raise ValueError(f"shapes {logp_now.shape}, {logp_ref.shape}, {mask.shape} differ")
    m = mask.to(torch.float64)
    total = m.sum()
    if total == 0:
        return 0.0
    diff = (logp_ref.to(torch.float64) - logp_now.to(torch.float64)) * m
    return float(diff.sum() / total)
