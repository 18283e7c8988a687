"""Advantage estimators: one typed input, one output shape, in a registry.

Every estimator is ``fn(inp: AdvantageInput) -> (advantages (B, R), returns (B, R) | None)``,
both zero on masked tokens and on invalid samples. ``returns`` are critic targets and
exist only for estimators registered with ``needs_critic=True`` (gae); critic-free
estimators return None. Shapes: B = samples in the step, R = response length
(right-padded).

Registry metadata (:class:`EstimatorMeta`): ``needs_critic`` (values in, returns out: the
trainer builds a critic) and ``grouped`` (compares the samples of one prompt: needs
samples_per_prompt >= 2).

Group statistics (grpo, dr_grpo, rloo, reinforce_plus_plus_baseline) use the sequence
score = sum_t token_rewards[i, t] over the loss-mask tokens, grouped by ``group_index``;
samples with ``valid`` False (e.g. reward.on_error: skip_sample) are left out of their
group's mean, std and count, and get advantage 0. The standard deviation is
``torch.std``'s unbiased estimate (divide by n - 1), as verl does.

A group of two or more valid samples whose scores are all equal (max - min <= ``equal_tol``)
gets advantage exactly 0 in every grouped estimator. Computed naively it does not: the
float32 mean of eight scores of 1.6 is 1.6000001, so s - mean = -1.19e-7 and GRPO's
(s - mean) / (std + 1e-6) with std = 1.27e-7 gives -0.106 on every token of a group that
carries no signal (verl has the same; TRL's eps 1e-4 makes it ~1000x smaller, not 0).

ReMax (Li et al. 2023) is not here: its baseline is the reward of a greedy rollout,
an extra (B,) input that AdvantageInput does not carry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from danka.algorithms._masked import masked_whiten
from danka.errors import UserError
from danka.registry import Registry


@dataclass(frozen=True)
class EstimatorMeta:
    """What an estimator needs; the trainer and the config check read it, never the name."""

    needs_critic: bool = False  # reads values, returns critic targets: PPO's critic is built
    grouped: bool = False  # compares samples of one prompt: samples_per_prompt >= 2
    whiten: str = ""  # how the advantages are normalised, for the docs and --print-config


ADVANTAGE_ESTIMATORS: Registry[EstimatorMeta] = Registry("advantage estimator", EstimatorMeta())


@dataclass
class AdvantageInput:
    """Everything any estimator may read. Tensors share one device.

    ``response_mask`` is the mask of the tokens the loss trains on (the batch's
    ``loss_mask``); ``valid`` marks usable samples (None = all).
    """

    token_rewards: torch.Tensor  # (B, R) score on the last valid token + per-token KL penalty
    response_mask: torch.Tensor  # (B, R) float, 1 on tokens the loss trains on
    group_index: torch.Tensor  # (B,) long, samples answering one prompt share an index
    values: torch.Tensor | None = None  # (B, R) critic values V(s_t), only for gae
    gamma: float = 1.0  # discount per token
    lam: float = 1.0  # GAE lambda
    eps: float = 1e-6  # added to the group std before dividing (grpo)
    # a group whose valid scores span at most this is "all equal": advantage exactly 0.
    # Rewards are sums of a few float32 terms; rounding differences are ~1e-7 per unit of
    # reward, while two different answers differ by a reward step (>= 1e-3 in practice).
    equal_tol: float = 1e-6
    valid: torch.Tensor | None = None  # (B,) bool, False = left out of stats, advantage 0
    whiten: bool = True  # gae: whiten the advantages over the batch's valid tokens (verl)
    # (values (B, R), mask (B, R)) -> (B, R): the batch-wide whitening of gae and the
    # REINFORCE++ estimators; the trainer passes one whose statistics span all ranks
    whitener: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = masked_whiten

    def __post_init__(self) -> None:
        b, r = self.token_rewards.shape
        if self.response_mask.shape != (b, r):
            raise ValueError(f"response_mask {tuple(self.response_mask.shape)} != {(b, r)}")
        if self.group_index.shape != (b,):
            raise ValueError(f"group_index {tuple(self.group_index.shape)} != {(b,)}")
        if self.values is not None and self.values.shape != (b, r):
            raise ValueError(f"values {tuple(self.values.shape)} != {(b, r)}")
        if self.valid is not None and self.valid.shape != (b,):
            raise ValueError(f"valid {tuple(self.valid.shape)} != {(b,)}")

    @property
    def mask(self) -> torch.Tensor:
        """(B, R) float: the loss mask with invalid samples' rows zeroed."""
        if self.valid is None:
            return self.response_mask
        return self.response_mask * self.valid.to(self.response_mask.dtype).unsqueeze(-1)


Estimator = Callable[[AdvantageInput], tuple[torch.Tensor, torch.Tensor | None]]


def sequence_rewards_to_tokens(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Put each sequence score (B,) on the LAST masked token of its response -> (B, R).

    The mask may have holes (an agent rollout's ``loss_mask`` is 0 on tool tokens between
    the model's turns): the score goes to the highest index with mask 1, the model's final
    end-of-turn token. Rows with no masked token get no reward (all zeros).
    """
    b, r = response_mask.shape
    out = torch.zeros((b, r), dtype=scores.dtype, device=scores.device)
    on = response_mask > 0
    has_token = on.any(dim=-1)
    # the last index with mask 1: position r-1 minus the first hit of the flipped row
    last = (r - 1) - on.flip(-1).float().argmax(dim=-1)
    rows = torch.arange(b, device=scores.device)
    out[rows[has_token], last[has_token]] = scores[has_token]
    return out


def _scores(inp: AdvantageInput) -> torch.Tensor:
    """Sequence score (B,) = sum of token rewards over the loss-mask tokens."""
    return (inp.token_rewards * inp.response_mask).sum(dim=-1)


def _flat_groups(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    valid: torch.Tensor | None = None,
    tol: float = 1e-6,
) -> torch.Tensor:
    """(B,) bool: the sample's group has >= 2 valid members and their scores span at most
    ``tol`` (max - min over the valid members). Such a group carries no signal, so every
    grouped estimator gives its samples advantage exactly 0."""
    _, inv = torch.unique(group_index, return_inverse=True)
    n_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    ok = torch.ones_like(scores, dtype=torch.bool) if valid is None else valid.bool()
    inf = torch.full_like(scores, float("inf"))
    empty = torch.full((n_groups,), float("inf"), dtype=scores.dtype, device=scores.device)
    high = (-empty).scatter_reduce(0, inv, torch.where(ok, scores, -inf), "amax")
    low = empty.scatter_reduce(0, inv, torch.where(ok, scores, inf), "amin")
    count = torch.zeros(n_groups, dtype=torch.long, device=scores.device)
    count = count.scatter_add_(0, inv, ok.long())
    flat = (count >= 2) & (high - low <= tol)
    return flat[inv]


def _group_mean_std(
    scores: torch.Tensor, group_index: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (B,) mean, unbiased std and size of the sample's group, counting only
    ``valid`` members (None = all).

    A group of (valid) size 1 gets mean 0 and std 1 (verl's convention), so normalising
    leaves its raw score: with one sample there is nothing to compare against.
    """
    _, inv = torch.unique(group_index, return_inverse=True)
    n_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    w = torch.ones_like(scores) if valid is None else valid.to(scores.dtype)
    zeros = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    count = zeros.clone().scatter_add_(0, inv, w)
    mean = zeros.clone().scatter_add_(0, inv, scores * w) / count.clamp(min=1)
    sq_dev = zeros.clone().scatter_add_(0, inv, w * (scores - mean[inv]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))  # unbiased, like torch.std
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[inv], std[inv], count[inv]


@ADVANTAGE_ESTIMATORS.register(
    "gae", EstimatorMeta(needs_critic=True, whiten="over the batch's valid tokens")
)
@torch.no_grad()
def gae(inp: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Generalised Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438).

    delta_t = r_t + gamma * V_{t+1} - V_t  (V after the last valid token is 0)
    A_t     = delta_t + gamma * lam * A_{t+1}
    returns = A + V (critic targets, before whitening);
    advantages = masked_whiten(A) over all valid tokens of the batch (as verl does;
    ``inp.whiten=False`` keeps the raw A). Padding tokens and invalid samples are
    skipped: they neither bootstrap V nor carry A nor enter the whitening statistics.
    Whitening matters early in PPO: a value head that is off by a constant c gives the
    last token delta_T = r_T - c, a bias whitening removes batch-wide (and a zero-
    initialised head never has it, see models/value_head.py).
    """
    if inp.values is None:
        raise UserError(
            "advantage estimator 'gae' needs critic values, but none were computed",
            where="config",
            fix="enable the critic (PPO), or choose a critic-free estimator: "
            "grpo, dr_grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline",
        )
    rewards, values, mask = inp.token_rewards, inp.values, inp.mask
    next_value = torch.zeros_like(rewards[:, 0])
    last_gae = torch.zeros_like(rewards[:, 0])
    adv_reversed = []
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + inp.gamma * next_value - values[:, t]
        new_gae = delta + inp.gamma * inp.lam * last_gae
        next_value = values[:, t] * m + (1 - m) * next_value
        last_gae = new_gae * m + (1 - m) * last_gae
        adv_reversed.append(last_gae)
    advantages = torch.stack(adv_reversed[::-1], dim=1)
    returns = (advantages + values) * mask
    if not inp.whiten:
        return advantages * mask, returns
    return inp.whitener(advantages, mask) * mask, returns


def _zero_flat(seq_adv: torch.Tensor, scores: torch.Tensor, inp: AdvantageInput) -> torch.Tensor:
    """``seq_adv`` (B,) with the samples of all-equal groups set to exactly 0."""
    flat = _flat_groups(scores, inp.group_index, inp.valid, inp.equal_tol)
    return torch.where(flat, torch.zeros_like(seq_adv), seq_adv)


def _broadcast(seq_adv: torch.Tensor, inp: AdvantageInput) -> torch.Tensor:
    """(B,) sequence advantages on every loss token of valid samples -> (B, R)."""
    return seq_adv.unsqueeze(-1) * inp.mask


@ADVANTAGE_ESTIMATORS.register("grpo", EstimatorMeta(grouped=True))
@torch.no_grad()
def grpo(inp: AdvantageInput) -> tuple[torch.Tensor, None]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    A_i = (s_i - mean_g(s)) / (std_g(s) + eps) on every valid token of sample i, where g
    is i's group and std is unbiased. Equal rewards in a group (max - min <= equal_tol)
    -> A = 0 exactly (no signal; see the module docstring for why this is enforced).
    A group of size 1 uses mean 0, std 1 (verl), so A = s / (1 + eps), about the raw
    score. No critic: returns None.
    """
    scores = _scores(inp)
    mean, std, _ = _group_mean_std(scores, inp.group_index, inp.valid)
    seq = (scores - mean) / (std + inp.eps)
    adv = _broadcast(_zero_flat(seq, scores, inp), inp)
    return adv, None


@ADVANTAGE_ESTIMATORS.register("dr_grpo", EstimatorMeta(grouped=True))
@torch.no_grad()
def dr_grpo(inp: AdvantageInput) -> tuple[torch.Tensor, None]:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like Training", arXiv:2503.20783).

    A_i = s_i - mean_g(s): GRPO without the division by the group std, which biases
    updates towards too-easy/too-hard prompts. Pair with the ``seq-mean-token-sum-norm``
    loss aggregation to also remove the length bias. Size-1 group -> raw score; equal
    rewards -> A = 0 exactly.
    """
    scores = _scores(inp)
    mean, _, _ = _group_mean_std(scores, inp.group_index, inp.valid)
    adv = _broadcast(_zero_flat(scores - mean, scores, inp), inp)
    return adv, None


@ADVANTAGE_ESTIMATORS.register("rloo", EstimatorMeta(grouped=True))
@torch.no_grad()
def rloo(inp: AdvantageInput) -> tuple[torch.Tensor, None]:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019).

    A_i = s_i - (sum_{j in g, j != i} s_j) / (n - 1) = n/(n-1) * (s_i - mean_g(s)).
    A group of size 1 has no other sample: A = raw score. Equal rewards -> A = 0 exactly.
    No critic: returns None.
    """
    scores = _scores(inp)
    mean, _, count = _group_mean_std(scores, inp.group_index, inp.valid)
    scale = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.ones_like(count))
    adv = _broadcast(_zero_flat((scores - mean) * scale, scores, inp), inp)
    return adv, None


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over valid tokens (reset after the last one)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return returns * mask


@ADVANTAGE_ESTIMATORS.register(
    "reinforce_plus_plus", EstimatorMeta(whiten="over the batch's valid tokens")
)
@torch.no_grad()
def reinforce_plus_plus(inp: AdvantageInput) -> tuple[torch.Tensor, None]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262).

    G_t = sum_{k >= t} gamma^(k-t) r_k (returns-to-go of the token rewards, which include
    any per-token KL penalty); advantages = masked_whiten(G) over all valid tokens of the
    batch (global normalisation, no critic, no groups). No critic: returns None.
    """
    returns = discounted_returns(inp.token_rewards, inp.mask, inp.gamma)
    adv = inp.whitener(returns, inp.mask) * inp.mask
    return adv, None


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline", EstimatorMeta(grouped=True))
@torch.no_grad()
def reinforce_plus_plus_baseline(inp: AdvantageInput) -> tuple[torch.Tensor, None]:
    """REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262, "REINFORCE++-baseline").

    a_i = s_i - mean_g(s) broadcast over valid tokens, then whitened over the valid tokens
    of the batch's informative samples. Size-1 group -> baseline 0. A group with equal
    rewards gets A = 0 exactly and is left out of the whitening statistics: whitening it
    with the others would shift its 0 to -mean/std, a push from a group with no signal.
    No critic: returns None.
    """
    scores = _scores(inp)
    mean, _, _ = _group_mean_std(scores, inp.group_index, inp.valid)
    flat = _flat_groups(scores, inp.group_index, inp.valid, inp.equal_tol)
    centred = _broadcast(scores - mean, inp)
    mask = inp.mask * (~flat).to(inp.mask.dtype).unsqueeze(-1)
    adv = inp.whitener(centred, mask) * mask
    return adv, None
