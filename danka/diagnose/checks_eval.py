"""Checks on the held-out evaluations (``eval/step_N.json``) and on the sampled training
completions (``completions/step_N.jsonl``)."""

from __future__ import annotations

import math
from collections import Counter

from danka.diagnose.findings import CHECKS, CheckMeta, Finding
from danka.diagnose.record import RunRecord
from danka.diagnose.series import finite, g, pct
from danka.diagnose.settings import add_kl, key
from danka.rewards.builtin import last_number_in

GUESS_FLOOR_KEY = "eval/guess_floor"  # written by the evaluation (danka.diagnose.floors)
# More than 30% of held-out answers cut at the limit: they score 0, so accuracy measures
# the token budget as much as the model.
EVAL_TRUNCATED_FRAC = 0.3
# A drop larger than two standard errors of the difference of two accuracies on n
# questions is not evaluation noise.
DROP_SIGMAS = 2.0
# General-prompt answers: half of them newly empty / only an answer / looping, or their
# length under 0.3x the base model's, means the policy forgot how to answer anything else.
PROBE_DEGENERATE_RISE = 0.5
PROBE_LENGTH_RATIO = 0.3
# One answer for at least 30% of the distinct prompts of the last 5 saved steps, and 3x
# as often as that answer is right: the policy guesses instead of solving. A prompt-
# dependent answer is as common as its ground truth (for GSM8K or arithmetic <= 3%).
CONSTANT_SHARE = 0.3
CONSTANT_OVER_TRUTH = 3.0
CONSTANT_MIN_PROMPTS = 8  # fewer distinct prompts cannot show a pattern
COMPLETION_STEPS = 5


def _number(record: dict, name: str) -> float | None:
    return finite(record.get(name))


def _floor(rec: RunRecord, upto: int) -> float | None:
    for e in reversed(rec.evals[: upto + 1]):
        v = _number(e, GUESS_FLOOR_KEY)
        if v is not None:
            return v
    return None


@CHECKS.register("below_guess_floor", CheckMeta(reads="evals", final=True))
def below_guess_floor(rec: RunRecord, at: int) -> Finding | None:
    last = rec.evals[at]
    acc, floor = _number(last, "eval/accuracy"), _floor(rec, at)
    if not last.get("step") or acc is None or floor is None or acc > floor:
        return None
    return Finding(
        "below_guess_floor",
        "after training, held-out accuracy is at or below what a constant guess scores",
        f"eval/accuracy {pct(acc)} at step {last['step']} <= guess floor {pct(floor)} (the "
        "best of: the most common answer, the prompt's last number, an empty answer)",
        "the model did not learn the task: read the other findings (a bonus it optimised "
        "instead, collapsed answers); choose a task or model whose base accuracy is clearly "
        "above the floor",
        step=int(last["step"]),
    )


@CHECKS.register("accuracy_dropped", CheckMeta(reads="evals", final=True))
def accuracy_dropped(rec: RunRecord, at: int) -> Finding | None:
    first, last = rec.evals[0], rec.evals[at]
    a0, a1 = _number(first, "eval/accuracy"), _number(last, "eval/accuracy")
    n = _number(last, "eval/n") or _number(first, "eval/n")
    if at == 0 or a0 is None or a1 is None or not n:
        return None
    se = math.sqrt((a0 * (1 - a0) + a1 * (1 - a1)) / n)
    if a0 - a1 <= max(DROP_SIGMAS * se, 1 / n):
        return None
    return Finding(
        "accuracy_dropped",
        "held-out accuracy fell during training",
        f"eval/accuracy {pct(a0)} at step {first.get('step', 0)} -> {pct(a1)} at step "
        f"{last['step']} ({int(n)} questions; the drop is over {g(DROP_SIGMAS)} standard "
        "errors)",
        f"lower {key('lr')}, {add_kl()}, and check that the reward pays for correct answers only",
        step=int(last["step"]),
    )


# After training, held-out answers cut at the limit: at least this share, and at least
# RUNAWAY_RATIO times the base model's share. A cut answer has no final answer: a policy
# that learned to ramble to the limit scores by luck (the reward read a number mid-ramble)
# and stops learning once every sample is cut (mask_truncated then trains on nothing).
RUNAWAY_FRAC = 0.3
RUNAWAY_RATIO = 3.0


def _base_and_trained(rec: RunRecord, at: int, *names: str):
    """``(step, [(value at step 0, value at evaluation at) per name])`` (a value None where
    not finite), or None before training or without a step-0 evaluation (a resumed run's
    history may lack one)."""
    base = next((e for e in rec.evals if e.get("step") == 0), None)
    now = rec.evals[at]
    if base is None or not now.get("step"):
        return None
    return int(now["step"]), [(_number(base, n), _number(now, n)) for n in names]


@CHECKS.register("runaway_length", CheckMeta(reads="evals", final=True))
def runaway_length(rec: RunRecord, at: int) -> Finding | None:
    got = _base_and_trained(rec, at, "eval/truncated", "eval/response_length")
    if got is None:
        return None
    step, [(t0, t1), (l0, l1)] = got
    if t0 is None or t1 is None or t1 < RUNAWAY_FRAC or t1 < RUNAWAY_RATIO * max(t0, 0.01):
        return None
    return Finding(
        "runaway_length",
        "after training, held-out answers run to the token limit: the policy learned to ramble",
        f"eval/truncated {pct(t0)} at step 0 -> {pct(t1)} at step {step}; mean length "
        f"{g(l0 or 0)} -> {g(l1 or 0)} tokens",
        f"lower {key('lr')}, raise {key('kl_coef')} (e.g. 0.01), or add a soft overlong penalty "
        "(reward.overlong_buffer) so answers near the limit earn less",
        step=step,
    )


@CHECKS.register("eval_truncated", CheckMeta(reads="evals", severity="risk"))
def eval_truncated(rec: RunRecord, at: int) -> Finding | None:
    e = rec.evals[at]
    t = _number(e, "eval/truncated")
    if e.get("step") != 0 or t is None or t <= EVAL_TRUNCATED_FRAC:
        return None
    return Finding(
        "eval_truncated",
        "many held-out answers of the base model hit the token limit and score 0",
        f"eval/truncated {pct(t)} at step 0 (mean length "
        f"{g(_number(e, 'eval/response_length') or 0)} tokens)",
        f"raise {key('max_new_tokens')} (or eval.max_new_tokens) so 'before' measures "
        "the model, not the budget",
        step=0,
    )


@CHECKS.register("probe_drift", CheckMeta(reads="evals"))
def probe_drift(rec: RunRecord, at: int) -> Finding | None:
    got = _base_and_trained(rec, at, "probe/degenerate_frac", "probe/mean_length", "probe/kl")
    if got is None:
        return None
    step, [(d0, d1), (l0, l1), (_, kl)] = got
    worse = d0 is not None and d1 is not None and d1 - d0 >= PROBE_DEGENERATE_RISE
    shorter = bool(l0) and l1 is not None and l1 < PROBE_LENGTH_RATIO * l0
    if not (worse or shorter):
        return None
    return Finding(
        "probe_drift",
        "answers to general prompts degenerated: the policy drifted from its base",
        f"probe answers empty/answer-only/looping {pct(d0 or 0)} -> {pct(d1 or 0)}, mean "
        f"length {g(l0 or 0)} -> {g(l1 or 0)} tokens at step {step}"
        + (f", KL to the step-0 answers {g(kl)} nats/token" if kl is not None else ""),
        f"{add_kl()}, lower {key('lr')}, or train fewer steps",
        step=step,
    )


def final_answer(text: str) -> str:
    """The answer a completion ends with: its last number (commas removed, as the
    ``last_number`` reward reads it), else its last non-empty line (first 40 characters)."""
    number = last_number_in(text or "")
    if number is not None:
        return number
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:40] if lines else ""


@CHECKS.register("constant_answers", CheckMeta(reads="completions"))
def constant_answers(rec: RunRecord, at: int) -> Finding | None:
    window = rec.completions[max(0, at - COMPLETION_STEPS + 1) : at + 1]
    by_prompt: dict[str, list[str]] = {}
    truth: dict[str, str] = {}
    for _, records in window:
        for r in records:
            p = str(r.get("prompt"))
            by_prompt.setdefault(p, []).append(final_answer(str(r.get("completion", ""))))
            truth[p] = str(r.get("ground_truth"))
    if len(by_prompt) < CONSTANT_MIN_PROMPTS:
        return None
    modal = [Counter(a).most_common(1)[0][0] for a in by_prompt.values()]
    answer, count = Counter(modal).most_common(1)[0]
    share = count / len(modal)
    right = sum(t.replace(",", "").strip() == answer for t in truth.values()) / len(truth)
    if not answer or share < CONSTANT_SHARE or share < CONSTANT_OVER_TRUTH * max(right, 1e-9):
        return None
    steps = f"{window[0][0]}-{window[-1][0]}" if len(window) > 1 else f"{window[0][0]}"
    return Finding(
        "constant_answers",
        "the policy gives the same answer to different questions: a guess, not a solution",
        f"'{answer}' is the usual answer to {count} of {len(modal)} distinct prompts in the "
        f"saved completions of steps {steps} ({pct(share)}; it is right for {pct(right)})",
        "the reward pays a formatted guess: make correctness the only reward, add a KL "
        f"({key('kl_coef')}: 0.001), lower {key('lr')}",
        step=int(window[-1][0]),
    )
