"""Paired and hierarchical prompt-level bootstrap intervals for the DIFFERENCE of a metric between two evaluations.

Two evaluations of the same held-out prompts (two checkpoints, two methods) share each prompt's difficulty: a
prompt that is easy for one is easy for the other. Their difference is then known better than two independent
intervals suggest, and worse than an interval that treats every sample as independent suggests (samples of one
prompt share its difficulty too). :func:`paired_bootstrap_difference` resamples PROMPTS (clusters) with
replacement once per replicate and applies the same draw to both evaluations; :func:`hierarchical_bootstrap_difference`
adds the training seeds: it resamples seeds, then prompts, for a difference averaged over seeds.

Metrics: any callable of the per-sample arrays (a loop over replicates, as :func:`calibrl.metrics.bootstrap_ci`),
or the pooled AUROC (``"auroc"`` or :func:`calibrl.metrics.auroc`, arrays ``confidence`` and ``correct``), computed
for all replicates at once from one sort (:func:`prompt_weighted_auroc`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from calibrl.metrics._arrays import as_1d, as_correct, as_scores, to_numpy
from calibrl.metrics.bootstrap import PROMPT_IDS_KEY, percentile_interval

__all__ = ["DifferenceCI", "PromptAUROCTable", "auroc_table", "hierarchical_bootstrap_difference",
           "paired_bootstrap_difference", "prompt_weighted_auroc"]

# float64 cells a vectorised AUROC chunk may hold ([replicates, samples]): about 64 MB per array
_CHUNK_CELLS = 8_000_000


class DifferenceCI(NamedTuple):
    """``point`` = metric(a) - metric(b) on the full data (for the hierarchical version: its mean over seeds), the
    percentile interval [``low``, ``high``] of the replicates, ``a`` and ``b`` the two metrics themselves (seed means
    for the hierarchical version), ``replicates`` [n_boot] the bootstrap differences (nan where undefined)."""

    point: float
    low: float
    high: float
    a: float
    b: float
    replicates: np.ndarray


# ------------------------------------------------------------------------------------------ vectorised AUROC


class PromptAUROCTable(NamedTuple):
    """One evaluation's samples sorted by score, in the form :func:`prompt_weighted_auroc` reads (built once by
    :func:`auroc_table`). ``neg_prompt`` [N-] the prompt of each wrong sample in ascending score order;
    ``pos_prompt`` [N+] the prompt of each right sample; ``pos_below`` / ``pos_upto`` [N+] how many wrong samples
    (in that order) score strictly below / at most the right sample's score; ``n_pos`` / ``n_neg`` [G] right and
    wrong samples per prompt."""

    neg_prompt: np.ndarray
    pos_prompt: np.ndarray
    pos_below: np.ndarray
    pos_upto: np.ndarray
    n_pos: np.ndarray
    n_neg: np.ndarray


def auroc_table(confidence: Any, correct: Any, prompt_index: np.ndarray, n_prompts: int) -> PromptAUROCTable:
    """Sort the samples once (scores ``confidence`` [N], ``correct`` [N] bool, ``prompt_index`` [N] in
    0..n_prompts-1) into the :class:`PromptAUROCTable` of :func:`prompt_weighted_auroc`."""
    s = as_scores(confidence)
    y = as_correct(correct)
    g = np.asarray(prompt_index, dtype=np.intp)
    if not (s.size == y.size == g.size):
        raise ValueError(f"confidence ({s.size}), correct ({y.size}) and prompt ids ({g.size}) differ in length")
    order = np.argsort(s, kind="mergesort")
    s, y, g = s[order], y[order], g[order]
    neg_before = np.concatenate(([0], np.cumsum(~y)))  # [N+1] wrong samples among sorted positions < i
    # each sorted position's tie block [start, end): equal scores count one half
    new = np.concatenate(([True], s[1:] != s[:-1])) if s.size else np.zeros(0, bool)
    starts = np.flatnonzero(new)
    ends = np.concatenate((starts[1:], [s.size]))
    block = np.cumsum(new) - 1
    pos = np.flatnonzero(y)
    return PromptAUROCTable(
        neg_prompt=g[~y], pos_prompt=g[pos], pos_below=neg_before[starts[block[pos]]],
        pos_upto=neg_before[ends[block[pos]]],
        n_pos=np.bincount(g[y], minlength=n_prompts).astype(np.float64),
        n_neg=np.bincount(g[~y], minlength=n_prompts).astype(np.float64))


def prompt_weighted_auroc(table: PromptAUROCTable, weights: np.ndarray) -> np.ndarray:
    """Pooled AUROC with every sample of prompt p counted ``weights[r, p]`` times, for each row r of ``weights``
    [R, G] (a bootstrap replicate's prompt counts) -> [R] (nan where a row has no right or no wrong sample).

    Formula (Mann-Whitney, ties one half): with w_i = weights[r, prompt of sample i],
    AUROC_r = sum_{i right} w_i (sum_{j wrong, s_j < s_i} w_j + 1/2 sum_{j wrong, s_j = s_i} w_j)
              / ((sum_{i right} w_i) (sum_{j wrong} w_j)).
    The inner sums are a cumulative sum of the wrong samples' weights in score order, read at each right sample's
    tie block (``pos_below``, ``pos_upto``): O(R N) per call, rows in chunks of about 8 million cells; whole-number
    weights are summed exactly in integers. Equals
    :func:`calibrl.metrics.auroc` of the resampled rows (a replicate of :func:`calibrl.metrics.bootstrap_ci`).
    """
    w = np.atleast_2d(np.asarray(weights))
    n_neg = table.neg_prompt.size
    # whole counts (a bootstrap's) whose sums fit int32: the cumulative sum in int32, the pair sum in int64 (exact,
    # and about 3x faster than float64 here); anything else in float64
    exact = w.dtype.kind in "iub" and w.size and int(w.max()) * (n_neg + 1) < 2 ** 31 and int(w.min()) >= 0
    kind = np.int32 if exact else np.float64
    w = w.astype(kind, copy=False)
    out = np.empty(w.shape[0], dtype=np.float64)
    chunk = max(1, _CHUNK_CELLS // max(1, n_neg + table.pos_prompt.size))
    for lo in range(0, w.shape[0], chunk):
        wc = w[lo:lo + chunk]  # [c, G]
        cum = np.zeros((wc.shape[0], n_neg + 1), dtype=kind)
        np.cumsum(np.take(wc, table.neg_prompt, axis=1), axis=1, out=cum[:, 1:])  # [c, N-+1] wrong weight below
        pair = np.take(cum, table.pos_below, axis=1).astype(np.int64 if exact else np.float64)  # [c, N+]
        pair += np.take(cum, table.pos_upto, axis=1)
        num = np.einsum("ij,ij->i", np.take(wc, table.pos_prompt, axis=1).astype(pair.dtype), pair) * 0.5
        den = (wc @ table.n_pos) * (wc @ table.n_neg)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[lo:lo + chunk] = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return out


def _is_auroc(metric: Any) -> bool:
    if isinstance(metric, str):
        if metric != "auroc":
            raise ValueError(f"metric: the only metric named by a string is 'auroc', got {metric!r}; pass a callable")
        return True
    from calibrl.metrics.calibration import auroc

    return metric is auroc


# ------------------------------------------------------------------------------------------ inputs


def _arrays(arrays: Mapping[str, Any], name: str) -> dict[str, np.ndarray]:
    if not isinstance(arrays, Mapping) or not arrays:
        raise ValueError(f"{name} must be a non-empty dict of per-sample arrays, got {type(arrays).__name__}")
    return {k: np.asarray(to_numpy(v)) for k, v in arrays.items()}


def _common_prompts(ids_a: Any, ids_b: Any, *, name_a: str, name_b: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Dense indices of both evaluations' prompt ids into their common prompt list; the two sets must be equal."""
    a, b = as_1d(ids_a, name_a), as_1d(ids_b, name_b)
    if a.dtype == object or b.dtype == object or a.dtype.kind != b.dtype.kind:
        a, b = a.astype(str), b.astype(str)
    uniq, inv = np.unique(np.concatenate((a, b)), return_inverse=True)
    ga, gb = inv[: a.size], inv[a.size:]
    in_a = np.bincount(ga, minlength=uniq.size) > 0
    in_b = np.bincount(gb, minlength=uniq.size) > 0
    if not (in_a & in_b).all():
        only = uniq[in_a != in_b][:5]
        raise ValueError(f"{name_a} and {name_b} must hold the same prompts (a paired bootstrap resamples prompts "
                         f"of both); prompts in only one of them: {', '.join(map(str, only))}")
    return ga.astype(np.intp), gb.astype(np.intp), int(uniq.size)


def _check_rows(arrays: dict[str, np.ndarray], n: int, name: str) -> None:
    for k, v in arrays.items():
        if v.shape[0] != n:
            raise ValueError(f"{name}[{k!r}] has {v.shape[0]} rows but its prompt ids have {n}")


def _check(alpha: float, n_boot: int) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")


class _Evaluation:
    """One evaluation's arrays and prompt index, able to score itself under prompt counts [R, G]."""

    def __init__(self, metric: Callable[..., Any] | str, arrays: dict[str, np.ndarray], g: np.ndarray, n_prompts: int):
        self.metric, self.arrays, self.g, self.n_prompts = metric, arrays, g, n_prompts
        self.fast = _is_auroc(metric)
        if self.fast:
            missing = {"confidence", "correct"} - set(arrays)
            if missing:
                raise ValueError(f"the AUROC needs the arrays 'confidence' and 'correct'; missing {sorted(missing)}")
            self.table = auroc_table(arrays["confidence"], arrays["correct"], g, n_prompts)
        else:
            order = np.argsort(g, kind="stable")
            count = np.bincount(g, minlength=n_prompts)
            self.order, self.count = order, count
            self.start = np.concatenate(([0], np.cumsum(count)[:-1]))

    def full(self) -> float:
        if self.fast:
            return float(prompt_weighted_auroc(self.table, np.ones((1, self.n_prompts)))[0])
        return _call(self.metric, self.arrays)

    def drawn(self, draws: np.ndarray) -> np.ndarray:
        """The metric on each replicate; ``draws`` [R, G'] the prompts drawn (in draw order) -> [R]."""
        if self.fast:
            r = draws.shape[0]
            flat = (draws + self.n_prompts * np.arange(r)[:, None]).reshape(-1)
            counts = np.bincount(flat, minlength=r * self.n_prompts).reshape(r, self.n_prompts)
            return prompt_weighted_auroc(self.table, counts)
        out = np.empty(draws.shape[0])
        for i, drawn in enumerate(draws):
            lengths = self.count[drawn]
            draw_of_sample = np.repeat(np.arange(drawn.size), lengths)
            offset = np.arange(int(lengths.sum())) - (np.cumsum(lengths) - lengths)[draw_of_sample]
            idx = self.order[self.start[drawn][draw_of_sample] + offset]
            out[i] = _call(self.metric, {k: draw_of_sample if k == PROMPT_IDS_KEY else v[idx]
                                         for k, v in self.arrays.items()})
        return out


def _draw_chunks(rng: np.random.Generator, *, n_boot: int, n_prompts: int):
    """Yield ``(first replicate, draws [c, G])``: replicate r's G prompts drawn with replacement,
    ``rng.integers(0, G, size=G)`` one replicate after the other, about 4 million draws per chunk."""
    chunk = max(1, min(n_boot, 4_000_000 // max(1, n_prompts)))
    for lo in range(0, n_boot, chunk):
        yield lo, np.stack([rng.integers(0, n_prompts, size=n_prompts) for _ in range(min(chunk, n_boot - lo))])


def _call(metric: Callable[..., Any], arrays: Mapping[str, np.ndarray]) -> float:
    out = metric(**arrays)
    if isinstance(out, tuple):
        out = out[0]
    return float(out)


# ------------------------------------------------------------------------------------------ public


def paired_bootstrap_difference(
    metric: Callable[..., Any] | str,
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    prompt_ids_a: Any,
    prompt_ids_b: Any,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    paired: bool = True,
) -> DifferenceCI:
    """Percentile interval of metric(a) - metric(b), two evaluations of the same prompts, with PROMPTS resampled.

    ``a`` and ``b``: dicts of per-sample arrays ([N_a] and [N_b], passed to ``metric`` as keyword arguments;
    for ``metric="auroc"`` or :func:`calibrl.metrics.auroc`, the keys ``confidence`` and ``correct``);
    ``prompt_ids_a`` [N_a], ``prompt_ids_b`` [N_b]: each sample's prompt. Both evaluations must hold the same
    G prompts (any number of samples each). Replicate r draws G prompts with replacement
    (``rng.integers(0, G, size=G)`` on ``numpy.random.default_rng(seed)``, prompts numbered in sorted id order) and
    scores BOTH evaluations on every sample of the drawn prompts (paired): the prompt's difficulty, shared by
    the two, cancels in the difference. ``paired=False`` draws b's prompts independently of a's (from
    ``default_rng([seed, 1])``: the interval of two unrelated evaluations, for comparison only). A ``"prompt_ids"`` array in ``a`` or ``b`` is replaced in
    each replicate by fresh ids numbering the draws (as :func:`calibrl.metrics.bootstrap_ci`).

    Returns :class:`DifferenceCI`: ``low``/``high`` the ``alpha/2`` and ``1 - alpha/2`` percentiles of the
    replicate differences (nan replicates, e.g. an AUROC with one class, ignored).
    """
    _check(alpha, n_boot)
    arrays_a, arrays_b = _arrays(a, "a"), _arrays(b, "b")
    ga, gb, n_prompts = _common_prompts(prompt_ids_a, prompt_ids_b, name_a="prompt_ids_a", name_b="prompt_ids_b")
    _check_rows(arrays_a, ga.size, "a")
    _check_rows(arrays_b, gb.size, "b")
    ea, eb = _Evaluation(metric, arrays_a, ga, n_prompts), _Evaluation(metric, arrays_b, gb, n_prompts)
    point_a, point_b = ea.full(), eb.full()
    replicates = np.empty(n_boot)
    rng = np.random.default_rng(seed)
    rng_b = rng if paired else np.random.default_rng([seed, 1])
    for lo, draws_a in _draw_chunks(rng, n_boot=n_boot, n_prompts=n_prompts):
        draws_b = draws_a if paired else np.stack([rng_b.integers(0, n_prompts, size=n_prompts)
                                                   for _ in range(draws_a.shape[0])])
        replicates[lo:lo + draws_a.shape[0]] = ea.drawn(draws_a) - eb.drawn(draws_b)
    low, high = percentile_interval(replicates, alpha=alpha)
    return DifferenceCI(point_a - point_b, low, high, point_a, point_b, replicates)


def hierarchical_bootstrap_difference(
    metric: Callable[..., Any] | str,
    a: Sequence[Mapping[str, Any]],
    b: Sequence[Mapping[str, Any]],
    *,
    prompt_ids_a: Sequence[Any],
    prompt_ids_b: Sequence[Any],
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    crossed: bool | None = None,
) -> DifferenceCI:
    """Percentile interval of the seed-averaged difference mean_s [metric(a_s) - metric(b_s)] (S training seeds),
    seeds and prompts resampled (a two-stage cluster bootstrap).

    ``a[s]``, ``b[s]``: seed s's two evaluations (dicts of per-sample arrays, as :func:`paired_bootstrap_difference`;
    a and b of one seed are paired: same prompts), ``prompt_ids_a[s]``, ``prompt_ids_b[s]`` their prompt ids.
    Replicate r draws S seeds with replacement (``rng.integers(0, S, size=S)``), then prompts:

    * ``crossed=True`` (the default when every seed holds the same prompts: one held-out set evaluated by every
      seed): ONE draw of the G prompts (``rng.integers(0, G, size=G)``) serves every drawn seed, since a prompt
      hard for one seed's model is hard for all (resampling seeds and prompts independently, the bootstrap of a
      crossed design: McCullagh 2000, Owen 2007; a fresh prompt draw per seed would average the shared prompt
      effect away and understate the width by up to a factor sqrt(S));
    * ``crossed=False`` (each seed its own prompts, nested): each drawn seed, in draw order, draws its own G_s
      prompts (``rng.integers(0, G_s, size=G_s)``).

    The replicate's value is the mean over the S drawn seeds of the paired difference under its prompt draw.
    ``point`` is the mean over seeds of the full-data differences; ``a``/``b`` the seed means of the metrics.
    """
    _check(alpha, n_boot)
    n_seeds = len(a)
    if n_seeds < 1 or not (len(b) == len(prompt_ids_a) == len(prompt_ids_b) == n_seeds):
        raise ValueError(f"a, b, prompt_ids_a and prompt_ids_b need one entry per seed; got {len(a)}, {len(b)}, "
                         f"{len(prompt_ids_a)}, {len(prompt_ids_b)}")
    pairs = []
    for s in range(n_seeds):
        arrays_a, arrays_b = _arrays(a[s], f"a[{s}]"), _arrays(b[s], f"b[{s}]")
        ga, gb, n_prompts = _common_prompts(prompt_ids_a[s], prompt_ids_b[s], name_a=f"prompt_ids_a[{s}]",
                                            name_b=f"prompt_ids_b[{s}]")
        _check_rows(arrays_a, ga.size, f"a[{s}]")
        _check_rows(arrays_b, gb.size, f"b[{s}]")
        ids = np.unique(as_1d(prompt_ids_a[s], f"prompt_ids_a[{s}]").astype(str))
        pairs.append((_Evaluation(metric, arrays_a, ga, n_prompts), _Evaluation(metric, arrays_b, gb, n_prompts),
                      n_prompts, ids))
    same = all(p[2] == pairs[0][2] and np.array_equal(p[3], pairs[0][3]) for p in pairs)
    if crossed is None:
        crossed = same
    elif crossed and not same:
        raise ValueError("crossed=True needs every seed to hold the same prompts; these seeds' prompt sets differ")
    full = np.array([ea.full() - eb.full() for ea, eb, _, _ in pairs])
    means_a = float(np.mean([ea.full() for ea, _, _, _ in pairs]))
    means_b = float(np.mean([eb.full() for _, eb, _, _ in pairs]))

    rng = np.random.default_rng(seed)
    seed_draws = np.empty((n_boot, n_seeds), dtype=np.intp)
    prompt_draws: list[list[np.ndarray]] = []  # [B][S] the prompts drawn for each drawn seed
    for r in range(n_boot):
        seed_draws[r] = rng.integers(0, n_seeds, size=n_seeds)
        if crossed:
            shared = rng.integers(0, pairs[0][2], size=pairs[0][2])
            prompt_draws.append([shared] * n_seeds)
        else:
            prompt_draws.append([rng.integers(0, pairs[s][2], size=pairs[s][2]) for s in seed_draws[r]])
    total = np.zeros(n_boot)
    for s, (ea, eb, _, _) in enumerate(pairs):
        rows, slots = np.nonzero(seed_draws == s)  # every (replicate, slot) that drew seed s
        if rows.size == 0:
            continue
        draws = np.stack([prompt_draws[r][j] for r, j in zip(rows, slots)])
        np.add.at(total, rows, ea.drawn(draws) - eb.drawn(draws))
    replicates = total / n_seeds
    low, high = percentile_interval(replicates, alpha=alpha)
    return DifferenceCI(float(full.mean()), low, high, means_a, means_b, replicates)
