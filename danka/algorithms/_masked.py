"""Masked reductions over (B, R) tensors. ``mask`` is 1.0 on valid tokens, 0.0 on padding."""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) over ``dim`` (all dims if None)."""
    prod = values * mask
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) / sum(mask) over ``dim``; an all-padding row gives 0, not NaN."""
    return masked_sum(values, mask, dim) / masked_sum(torch.ones_like(values), mask, dim).clamp(
        min=1e-8
    )


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid entries (scalar). ``unbiased`` applies Bessel's correction
    n / (n - 1) like verl; with n <= 1 valid entries the correction is skipped (var = 0)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    n = mask.sum()
    if unbiased and n > 1:
        var = var * n / (n - 1)
    return var


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) with mean and unbiased var over valid entries
    (verl's ``masked_whiten``). With ``shift_mean=False`` the mean is added back, i.e.
    only the scale is normalised. Padding positions are NOT zeroed here."""
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened
