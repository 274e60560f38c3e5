"""Accuracy over several samples per prompt: mean@k and the unbiased pass@k estimator.

Inputs are flat vectors, one entry per sampled completion, with the prompt each sample answers. Prompts need not
be contiguous nor have equal sample counts. Everything is vectorised (``np.unique`` + ``np.bincount``).
(``maj@k`` -- majority vote -- lives in :mod:`calibrl.selection`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calibrl.metrics._arrays import as_correct, check_same_length, group_index

__all__ = ["mean_at_k", "pass_at_k", "per_prompt_counts"]


def per_prompt_counts(correct: Any, prompt_ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(n, c)``: samples and correct samples per prompt, in the sorted order of the unique prompt ids."""
    y = as_correct(correct)
    inv, n_groups = group_index(prompt_ids)
    check_same_length(correct=y, prompt_ids=inv)
    n = np.bincount(inv, minlength=n_groups)
    c = np.bincount(inv, weights=y, minlength=n_groups).astype(np.int64)
    return n, c


def mean_at_k(correct: Any, prompt_ids: Any) -> float:
    """mean@k: the mean over prompts of each prompt's fraction of correct samples.

    ``mean@k = (1/P) * sum_p c_p / n_p`` -- every prompt weighs the same whatever its sample count n_p
    (with equal counts this is the plain mean of ``correct``).
    """
    n, c = per_prompt_counts(correct, prompt_ids)
    return float(np.mean(c / n))


def pass_at_k(correct: Any, prompt_ids: Any, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021, "Codex"), averaged over prompts.

    For a prompt with n samples of which c are correct, ``pass@k = 1 - C(n-c, k) / C(n, k)``: the probability
    that k samples drawn without replacement from the n contain at least one correct one. The ratio is computed
    in the numerically stable product form ``C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i)`` (1 - ratio = 1
    when n - c < k), evaluated for all prompts at once as a difference of cumulative sums of ``log1p(-k/i)``.

    Raises ``ValueError`` when some prompt has fewer than k samples (the estimator is undefined there).
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = int(k)
    n, c = per_prompt_counts(correct, prompt_ids)
    if n.min() < k:
        n_short = int((n < k).sum())
        raise ValueError(
            f"pass@k with k={k} needs at least k samples per prompt, but {n_short} prompt(s) have fewer "
            f"(smallest n = {int(n.min())})"
        )
    m = n - c  # wrong samples per prompt
    # S[j] = sum_{i=k+1}^{j} log(1 - k/i) for j >= k (S[j] = 0 for j <= k); only j >= k are ever read.
    top = int(n.max())
    i = np.arange(k + 1, top + 1, dtype=np.float64)
    s = np.zeros(top + 1, dtype=np.float64)
    if top > k:
        s[k + 1 :] = np.cumsum(np.log1p(-k / i))
    has_all_wrong_k = m >= k  # otherwise every k-subset contains a correct sample
    log_ratio = s[n] - s[np.where(has_all_wrong_k, m, k)]
    ratio = np.where(has_all_wrong_k, np.exp(log_ratio), 0.0)
    return float(np.mean(1.0 - ratio))
