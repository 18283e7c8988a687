"""Checks on the training metrics (``metrics.jsonl``), one registered function each.

Every check reads ``run.metrics[: at + 1]`` only, so the step it reports is the step a
live run would have warned at. Each threshold says why it is where it is.
"""

from __future__ import annotations

from danka.diagnose.findings import CHECKS, CheckMeta, Finding
from danka.diagnose.record import RunRecord
from danka.diagnose.series import first_and_last, g, mean, median, pct, points, span
from danka.diagnose.settings import add_kl, key, reward_terms, setting

# Answers at under 0.3x their starting length while the reward rises: the policy found a
# shortcut (a bare formatted guess) rather than better reasoning. Reasoning that gets more
# concise rarely loses 70% of its length in a few dozen steps.
LENGTH_RATIO = 0.3
# Answers that started under 32 tokens (a sentence) had no reasoning to lose: shrinking
# them to a bare number is what a task like "What is a + b? Reply with only the number."
# asks for, not a shortcut.
MIN_REASONING_LENGTH = 32
# "rises": the trailing mean reward is above the first steps' by at least this (a point on
# a 0-1 correctness reward; a drift below that is batch noise).
REWARD_RISE = 0.01
# A non-primary term (format, length, a bonus) supplying more than half of the reward gain
# means the policy is optimising the bonus, not the task.
BONUS_SHARE = 0.5
# Gains below this are too small to split into shares (noise dominates the ratio).
MIN_GAIN = 0.01
# Entropy below a tenth of its start: temperature-1 samples are close to deterministic, so
# a group's answers coincide and stop carrying signal (DAPO, Yu et al. 2025, sec. 3.1).
ENTROPY_RATIO = 0.1
# More than 80% of groups with equal rewards for 10 steps in a row: the update trains on
# under a fifth of the batch, and ten steps rules out a bad streak of prompts.
ZERO_ADV_FRAC = 0.8
ZERO_ADV_STEPS = 10
# More than 30% of the first answers cut at max_new_tokens: a cut answer has no final
# answer and scores 0 on every term, so a third of the signal says "shorter is better".
TRUNCATED_FRAC = 0.3
TRUNCATED_STEPS = 3  # the first steps are the base model's answers


def _median_change(metric: str, unit: str, first: list, last: list) -> str:
    """The evidence of a collapse: "METRIC median A UNIT over steps i-j -> B over steps
    k-l (B/Ax)", the first window against the last."""
    before, now = median(first), median(last)
    return (
        f"{metric} median {g(before)} {unit} over {span(first)} -> {g(now)} over {span(last)} "
        f"({g(now / before)}x)"
    )


@CHECKS.register("length_collapse", CheckMeta(reads="metrics"))
def length_collapse(rec: RunRecord, at: int) -> Finding | None:
    parts = first_and_last(points(rec.metrics, "response_length", at))
    rewards = first_and_last(points(rec.metrics, "reward", at))
    if parts is None or rewards is None:
        return None
    (first, last), (r0, r1) = parts, rewards
    before, now = median(first), median(last)
    shrank = before >= MIN_REASONING_LENGTH and now < LENGTH_RATIO * before
    if not (shrank and mean(r1) > mean(r0) + REWARD_RISE):
        return None
    return Finding(
        "length_collapse",
        "answers shrank while the reward rose: the policy learned a short shortcut",
        f"{_median_change('response_length', 'tokens', first, last)}; reward "
        f"{g(mean(r0))} -> {g(mean(r1))}",
        "find what a short answer earns (a format bonus, a cut answer scoring 0): make "
        f"correctness the only reward, set {key('mask_truncated')}: true or "
        f"{key('overlong_buffer')}, {add_kl()}, "
        f"lower {key('lr')}, and use {key('loss_agg_mode')}: seq-mean-token-sum-norm "
        "(token-mean gives each token of a short answer more weight)",
        step=last[-1][0],
    )


@CHECKS.register("bonus_dominates", CheckMeta(reads="metrics"))
def bonus_dominates(rec: RunRecord, at: int) -> Finding | None:
    terms = [t for t in reward_terms(rec.config) if t.weight != 0]
    if not any(not t.primary for t in terms) or not any(t.primary for t in terms):
        return None
    gains: dict[str, float] = {}
    window = None
    for t in terms:
        parts = first_and_last(points(rec.metrics, f"reward/{t.key}", at))
        if parts is None:
            return None
        window = parts
        gains[t.key] = t.weight * (mean(parts[1]) - mean(parts[0]))
    total = sum(gains.values())
    bonus = {t.key: gains[t.key] for t in terms if not t.primary}
    if total < MIN_GAIN or sum(bonus.values()) / total <= BONUS_SHARE:
        return None
    primary = next(t for t in terms if t.primary)
    top = max(bonus, key=lambda k: bonus[k])
    weight = next(t.weight for t in terms if t.key == top)
    first, last = window
    return Finding(
        "bonus_dominates",
        f"most of the reward gain came from '{top}', not from the primary reward '{primary.key}'",
        f"weighted gain {span(first)} -> {span(last)}: total {g(total)}, '{top}' (weight "
        f"{g(weight)}) {g(bonus[top])} ({pct(bonus[top] / total)}), non-primary terms "
        f"{pct(sum(bonus.values()) / total)}, '{primary.key}' {g(gains[primary.key])}",
        f"drop '{top}' from {key('reward_functions')} or lower its weight well below the "
        "correctness reward's; a formatted guess must earn less than a right answer "
        "(verl's GSM8K reward is strict correctness, format_score 0)",
        step=last[-1][0],
    )


@CHECKS.register("entropy_collapse", CheckMeta(reads="metrics"))
def entropy_collapse(rec: RunRecord, at: int) -> Finding | None:
    parts = first_and_last(points(rec.metrics, "actor/entropy", at))
    if parts is None:
        return None
    first, last = parts
    before, now = median(first), median(last)
    if not (before > 0 and now < ENTROPY_RATIO * before):
        return None
    return Finding(
        "entropy_collapse",
        "the policy's entropy collapsed: its samples are nearly deterministic",
        _median_change("actor/entropy", "nats/token", first, last),
        f"lower {key('lr')}, {add_kl()}, or keep "
        f"exploration with clip-higher ({key('clip_ratio_high')}: 0.28, which acts only with "
        "several optimizer steps per rollout)",
        step=last[-1][0],
    )


@CHECKS.register("zero_advantage", CheckMeta(reads="metrics"))
def zero_advantage(rec: RunRecord, at: int) -> Finding | None:
    pts = points(rec.metrics, "reward/zero_adv_groups", at)[-ZERO_ADV_STEPS:]
    if len(pts) < ZERO_ADV_STEPS or any(v <= ZERO_ADV_FRAC for _, v in pts):
        return None
    n = setting(rec.config, "samples_per_prompt")
    return Finding(
        "zero_advantage",
        "most groups had equal rewards: the update had almost nothing to learn from",
        f"reward/zero_adv_groups > {g(ZERO_ADV_FRAC)} on every one of {span(pts)} (mean "
        f"{pct(mean(pts))})",
        "the task is too hard (all wrong) or too easy (all right) for this model: pick data "
        "where the base model is right 10-90% of the time, raise "
        f"{key('samples_per_prompt')} (now {n}), or set {key('dynamic_sampling')}: true",
        step=pts[-1][0],
    )


# Ten steps in a row in which no sample earned any reward (PPO's view of zero_advantage:
# with one sample per prompt there are no groups, but a reward that is always 0 gives the
# critic and the policy nothing to learn from either).
NO_REWARD_STEPS = 10
NO_REWARD_EPS = 1e-9


@CHECKS.register("no_reward", CheckMeta(reads="metrics"))
def no_reward(rec: RunRecord, at: int) -> Finding | None:
    pts = points(rec.metrics, "reward", at)[-NO_REWARD_STEPS:]
    if len(pts) < NO_REWARD_STEPS or any(abs(v) > NO_REWARD_EPS for _, v in pts):
        return None
    return Finding(
        "no_reward",
        "no sample earned any reward: the update had nothing to learn from",
        f"reward 0 on every one of {span(pts)}",
        "the task is too hard for this model (no sampled answer is ever right): pick data "
        "where the base model is right 10-90% of the time, or a larger model; check that "
        f"the reward reads the answer format the model writes ({key('reward_functions')}); "
        "if it writes that format only rarely, sample more answers a step "
        f"({key('batch_size')}, {key('samples_per_prompt')}) so the rare right ones are found",
        step=pts[-1][0],
    )


@CHECKS.register("truncation_at_start", CheckMeta(reads="metrics", severity="risk"))
def truncation_at_start(rec: RunRecord, at: int) -> Finding | None:
    pts = points(rec.metrics, "response/truncated", at)[:TRUNCATED_STEPS]
    if len(pts) < TRUNCATED_STEPS or median(pts) <= TRUNCATED_FRAC:
        return None
    masked = setting(rec.config, "mask_truncated") or setting(rec.config, "overlong_buffer")
    limit = setting(rec.config, "max_new_tokens")
    fix = f"raise {key('max_new_tokens')} (now {limit}) until few answers are cut"
    if not masked:
        fix += (
            f", and set {key('mask_truncated')}: true or {key('overlong_buffer')} so a "
            "cut answer does not teach 'shorter is better'"
        )
    return Finding(
        "truncation_at_start",
        "many of the first answers hit the token limit",
        f"response/truncated median {pct(median(pts))} over {span(pts)} (limit {limit} "
        f"tokens, truncated answers {'masked' if masked else 'scored as written'})",
        fix,
        step=pts[-1][0],
    )


@CHECKS.register("reward_not_finite", CheckMeta(reads="metrics"))
def reward_not_finite(rec: RunRecord, at: int) -> Finding | None:
    """The combined reward (or a term's mean) was inf or NaN at a step: its advantages are
    NaN, so the update was skipped ("policy loss is nan") and the run learned nothing
    from it. danka now stops such a step (exit 2, naming the term and its weight); a run
    from before logged "reward": "inf" and went on."""
    found = [(pts[0], name) for name, pts in rec.metrics.non_finite("reward", at)]
    if not found:
        return None
    (step, value), name = min(found)
    shown = "NaN" if value != value else g(value)
    weights = ", ".join(f"{t.key} {g(t.weight)}" for t in reward_terms(rec.config))
    return Finding(
        "reward_not_finite",
        "the reward is not a finite number: the update learned nothing from those steps",
        f"{name} {shown} at step {step}" + (f" (weights: {weights})" if weights else ""),
        f"lower the weights ({key('reward_functions')}[i].weight) so that weight x score "
        "stays a finite float32 number, or make the reward functions return finite numbers "
        "of a usual size (-1 to 1)",
        step=step,
    )
