"""Vectorised per-group reductions shared by every estimator.

Samples arrive as flat vectors [N] with an integer group id per sample (groups need not be contiguous nor of
equal size). Every helper maps group ids to a dense index 0..n_groups-1 once and reduces with ``index_add_``,
so no estimator loops over groups in Python.
"""

from __future__ import annotations

import torch


def dense_group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary integer group ids [N] to a dense index [N] in 0..n_groups-1; return (index, n_groups)."""
    _, index = torch.unique(group_ids, return_inverse=True)
    n_groups = int(index.max().item()) + 1 if index.numel() else 0
    return index, n_groups


def segment_sum(values: torch.Tensor, index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Sum ``values`` [N, ...] per group -> [n_groups, ...]."""
    out = values.new_zeros((n_groups, *values.shape[1:]))
    return out.index_add_(0, index, values)


def group_count(index: torch.Tensor, n_groups: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Number of samples per group -> [n_groups]."""
    return segment_sum(torch.ones_like(index, dtype=dtype), index, n_groups)


def group_mean(values: torch.Tensor, index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Per-group mean of ``values`` [N] -> [n_groups]."""
    return segment_sum(values, index, n_groups) / group_count(index, n_groups, values.dtype)


def group_std(values: torch.Tensor, index: torch.Tensor, n_groups: int, *, unbiased: bool = True) -> torch.Tensor:
    """Per-group standard deviation of ``values`` [N] -> [n_groups].

    ``unbiased=True`` applies Bessel's correction (divide by n - 1), as ``torch.std`` and TRL's GRPOTrainer do.
    A group with a single sample (or, unbiased, fewer than two) has std 0 rather than NaN.
    """
    count = group_count(index, n_groups, values.dtype)
    mean = segment_sum(values, index, n_groups) / count
    sq_dev = (values - mean[index]) ** 2
    denom = (count - 1.0) if unbiased else count
    var = segment_sum(sq_dev, index, n_groups) / denom.clamp_min(1.0)
    return var.clamp_min(0.0).sqrt()
