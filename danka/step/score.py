"""Step 3, rewards: every reward function (and reward model) on a rollout's completions,
DAPO's overlong penalty, and which samples may train."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from danka.algorithms.advantages import AdvantageInput
from danka.errors import UserError
from danka.rewards.combine import RewardComputer
from danka.rewards.names import ENV, OVERLONG
from danka.rewards.shaping import overlong_penalty, response_lengths
from danka.step.prompt_set import PromptSet
from danka.step.records import RewardStats, Rollout, Scored


@dataclass(frozen=True)
class ScoreSettings:
    samples_per_prompt: int  # group size, for the share of all-equal groups
    response_budget: int  # response tokens a sample may have (agent: all turns)
    overlong_length: int = 0  # reward.overlong_buffer.length (0 = off)
    overlong_penalty: float = 1.0  # reward.overlong_buffer.penalty
    mask_truncated: bool = False  # loss.mask_truncated


EQUAL_TOL = AdvantageInput.equal_tol  # the grouped estimators' "all equal" (advantage 0)


def equal_reward_groups(
    rewards: torch.Tensor, n: int, valid: torch.Tensor | None = None, tol: float = EQUAL_TOL
) -> float | None:
    """Share of groups of ``n`` consecutive samples whose valid samples' rewards are all
    equal (max - min <= ``tol``, as the grouped estimators decide), i.e. whose
    group-relative advantage is 0; None for groups of one."""
    if n <= 1 or rewards.numel() % n:
        return None
    ok = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    hi = torch.where(ok, rewards, -torch.inf).view(-1, n).max(1).values
    lo = torch.where(ok, rewards, torch.inf).view(-1, n).min(1).values
    flat = ~(hi - lo > tol)  # a group with no valid sample (inf - inf) counts as flat
    return float(flat.float().mean())


def score(
    rewards: RewardComputer, prompts: PromptSet, rollout: Rollout, s: ScoreSettings
) -> Scored:
    """The rollout scored. An environment's step rewards (``rollout.env_rewards``) are
    part ``env``; with ``s.overlong_length`` DAPO's soft penalty is part ``overlong``.
    A sample is invalid (no loss, left out of group statistics, reward 0) when its
    reward was skipped (reward.on_error: skip_sample) or, with ``s.mask_truncated``, when
    it hit the response budget (TRL's mask_truncated_completions: a cut answer's reward
    misleads).

    ``stats.per_part[name]`` is the mean over the valid samples the function applies to (a
    TRL function returning None does not apply); ``stats.not_applicable`` the share of
    samples no function applied to."""
    batch = rollout.batch
    idx = batch.prompt_index.tolist()
    rows, texts = [prompts.rows[i] for i in idx], [prompts.texts[i] for i in idx]
    turns = {} if rollout.messages is None else {"messages": rollout.messages}  # an agent's
    out = rewards(rows, texts, rollout.completions, **turns)
    valid = out.valid.cpu().bool()
    total = out.scores.float().cpu()
    parts = {name: v.float().cpu() for name, v in out.per_function.items()}
    if rollout.env_rewards is not None:
        parts[ENV] = rollout.env_rewards.float().cpu()
        total = total + parts[ENV]
    if s.overlong_length > 0:
        parts[OVERLONG] = overlong_penalty(
            response_lengths(batch.response_mask),
            max_new_tokens=s.response_budget,
            buffer=s.overlong_length,
            penalty=s.overlong_penalty,
        )
        total = total + parts[OVERLONG]
    bad = valid & ~torch.isfinite(total)  # the weighted sum is checked in combine.py
    if bad.any():
        i = int(bad.nonzero()[0])
        shown = ", ".join(f"{name}: {float(v[i]):g}" for name, v in parts.items())
        raise UserError(
            f"the reward of sample {i} (data row {rows[i].index}) is not a finite float32 "
            f"number ({shown})",
            where="agent.environment" if ENV in parts else "reward.overlong_buffer.penalty",
            fix="make the environment's step() return finite rewards (usually -1 to 1), "
            "or lower reward.overlong_buffer.penalty; resume with --resume auto",
        )
    total = torch.where(valid, total, 0.0)
    per_part = {}
    for name, value in parts.items():
        applies = valid & out.applicable[name].cpu() if name in out.applicable else valid
        per_part[name] = float(value[applies].mean()) if applies.any() else 0.0
    stats = RewardStats(
        mean=float(total[valid].mean()) if valid.any() else 0.0,
        per_part=per_part,
        error_rate=out.error_rate,
        not_applicable=out.num_not_applicable / max(1, rollout.size),
        valid_frac=float(valid.float().mean()),
        response_length=float(batch.response_mask.sum(1).mean()),
        truncated=float(batch.truncated.float().mean()),
        zero_adv_groups=equal_reward_groups(total, s.samples_per_prompt, valid),
    )
    if s.mask_truncated:  # after the stats: they describe what was generated
        valid = valid & ~batch.truncated.bool()
    return Scored(rollout=rollout, rewards=total, parts=parts, valid=valid, stats=stats)
