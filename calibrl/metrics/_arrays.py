"""Input handling shared by the metric modules (private).

Every public metric accepts numpy arrays, torch tensors (any device, with or without grad) or Python lists and
works on flat float64 / bool numpy arrays internally.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def to_numpy(x: Any) -> np.ndarray:
    """Convert a numpy array, torch tensor or sequence to a numpy array without copying when possible."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor, without importing torch
        t = x.detach().cpu()
        if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            t = t.float()
        return t.numpy()
    return np.asarray(x)


def as_1d(x: Any, name: str) -> np.ndarray:
    arr = to_numpy(x)
    if arr.ndim == 0:
        raise ValueError(f"{name} must be a 1-D array, got a scalar")
    if arr.ndim > 1:
        if arr.ndim == 2 and 1 in arr.shape:
            arr = arr.reshape(-1)
        else:
            raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    return arr


def as_correct(correct: Any, name: str = "correct") -> np.ndarray:
    """Validate a correctness vector: bool, or numbers that are all 0 or 1. Returns bool [N]."""
    arr = as_1d(correct, name)
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be bool or 0/1 numbers, got dtype {arr.dtype}")
    out = arr != 0
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    if not np.array_equal(out, arr == 1):
        bad = arr[(arr != 0) & (arr != 1)][0]
        raise ValueError(f"{name} must be bool or 0/1, found the value {bad!r}")
    return out


def as_scores(x: Any, name: str = "confidence") -> np.ndarray:
    """A real-valued score vector (any scale, e.g. log-probabilities): float64 [N], no NaN."""
    arr = as_1d(x, name)
    if arr.dtype.kind not in "iufb":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN ({int(np.isnan(arr).sum())} values)")
    return arr


PROB_TOLERANCE = 1e-6


def as_prob(x: Any, name: str = "confidence") -> np.ndarray:
    """A probability vector: float64 [N] with every value in [0, 1].

    Values within ``PROB_TOLERANCE`` (1e-6) outside [0, 1] -- float32 softmax round-off -- are clipped;
    anything further out raises ``ValueError``.
    """
    arr = as_scores(x, name)
    if arr.size and (arr.min() < 0.0 or arr.max() > 1.0):
        if arr.min() >= -PROB_TOLERANCE and arr.max() <= 1.0 + PROB_TOLERANCE:
            return np.clip(arr, 0.0, 1.0)
        raise ValueError(
            f"{name} must lie in [0, 1] (got min {arr.min():.6g}, max {arr.max():.6g}); "
            "pass probabilities, e.g. exp(logprob_mean), not log-probabilities"
        )
    return arr


def check_same_length(**arrays: np.ndarray) -> int:
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError("arrays must have the same length, got " + ", ".join(f"{k}={n}" for k, n in lengths.items()))
    n = next(iter(lengths.values()))
    if n == 0:
        raise ValueError("empty input: " + ", ".join(lengths) + " have no elements")
    return n


def group_index(prompt_ids: Any, name: str = "prompt_ids") -> tuple[np.ndarray, int]:
    """Dense group index [N] in 0..n_groups-1 (sorted order of the unique ids) and n_groups."""
    arr = as_1d(prompt_ids, name)
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    if arr.dtype == object:
        arr = arr.astype(str)
    if arr.dtype.kind in "iub" and arr.size:
        # integer ids spanning a modest range: O(N) relabelling with bincount instead of a sort
        lo, hi = int(arr.min()), int(arr.max())
        if hi - lo <= 4 * arr.size + 1024:
            shifted = arr.astype(np.int64) - lo
            present = np.bincount(shifted, minlength=hi - lo + 1) > 0
            dense = np.cumsum(present) - 1
            return dense[shifted].astype(np.intp, copy=False), int(present.sum())
    uniq, inv = np.unique(arr, return_inverse=True)
    return inv.reshape(-1).astype(np.intp, copy=False), len(uniq)


def stable_argsort_small_ints(keys: np.ndarray) -> np.ndarray:
    """Stable argsort of non-negative integers < 2**32 via two 16-bit radix passes (numpy radix-sorts uint16)."""
    keys = keys.astype(np.int64, copy=False)
    if keys.size and int(keys.max()) < 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    if keys.size and int(keys.max()) >= 1 << 32:
        return np.argsort(keys, kind="stable")
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    return order[np.argsort((keys[order] >> 16).astype(np.uint16), kind="stable")]
