"""TEST-ONLY REFERENCE: the rules of the DeepConf authors' offline analysis (facebookresearch/deepconf, MIT:
``analysis_offline.py``: calculate_mean_confidence, calculate_tail_confidence, calculate_bottom_window_confidence,
filter_top_confidence, weighted_majority_vote; ``helper.py``: compute_confidence), re-derived here as plain
per-trace Python loops so that tests/test_deepconf.py can check :mod:`calibrl.selection.deepconf` against them.

It is not calibrl's implementation (that one is vectorised over all paths and reads windows off one cumulative
sum): each window is summed afresh, the lowest windows come from a full sort, the percentile from one
``np.percentile`` call per prompt, and a tie between answers goes to the answer seen first, as in the authors'
``max`` over an insertion-ordered dict. Rules followed exactly as the authors' code has them:

- token confidence: minus the mean of the position's top-k log-probs;
- mean: the mean of all token confidences; tail: of the last ``tail`` (all when the trace is not longer);
- windows of ``window`` tokens at every start (stride 1); a trace shorter than a window uses its mean;
- bottom: the mean of the ``max(1, int(n_windows * 0.1))`` lowest window means; min: the lowest window mean;
- top filter: keep a trace when its signal >= ``np.percentile(signals, (1 - top) * 100)``;
- vote: each trace adds its signal to its answer's weight; the answer with the largest weight wins.
"""

from __future__ import annotations

import numpy as np


def token_confidence(top_logprobs_per_position):
    return [-float(np.mean(values)) for values in top_logprobs_per_position if values]


def mean_signal(confs):
    return float(np.mean(confs)) if confs else 0.0


def tail_signal(confs, tail=2048):
    if not confs:
        return 0.0
    return float(np.mean(confs[-tail:] if len(confs) > tail else confs))


def window_means(confs, window):
    return [sum(confs[start:start + window]) / window for start in range(len(confs) - window + 1)]


def bottom_signal(confs, window=2048, fraction=0.1):
    if not confs:
        return 0.0
    if len(confs) < window:
        return float(np.mean(confs))
    means = sorted(window_means(confs, window))
    count = max(1, int(len(means) * fraction))
    return float(np.mean(means[:count]))


def min_signal(confs, window=2048):
    if not confs:
        return 0.0
    if len(confs) < window:
        return float(np.mean(confs))
    return float(min(window_means(confs, window)))


def keep_top(signals, top):
    threshold = np.percentile(signals, (1 - top) * 100)
    return [value >= threshold for value in signals]


def weighted_vote(answers, weights):
    """The winning answer; a tie goes to the answer seen first."""
    totals: dict = {}
    for answer, weight in zip(answers, weights):
        totals[answer] = totals.get(answer, 0.0) + weight
    best = None
    for answer, total in totals.items():
        if best is None or total > totals[best]:
            best = answer
    return best


def prompt_selections(answers, confs_per_trace, *, window=2048, tail=2048):
    """{selection name: winning answer} of one prompt's traces (each with an answer), calibrl's names."""
    signals = {
        "mean": [mean_signal(c) for c in confs_per_trace],
        "tail": [tail_signal(c, tail) for c in confs_per_trace],
        "bottom10": [bottom_signal(c, window) for c in confs_per_trace],
        "min": [min_signal(c, window) for c in confs_per_trace],
    }
    out = {f"deepconf_{name}": weighted_vote(answers, values) for name, values in signals.items()}
    for name in ("tail", "bottom10"):
        for top in (0.1, 0.9):
            kept = keep_top(signals[name], top)
            out[f"deepconf_{name}_top{round(top * 100)}"] = weighted_vote(
                [a for a, k in zip(answers, kept) if k], [s for s, k in zip(signals[name], kept) if k])
    return signals, out


# ------------------------------------------------------------------------------------------------- online rules
# TEST-ONLY transcription of the authors' online code, deepconf 0.1.0 on PyPI (facebookresearch/deepconf
# ``deepconf/`` at 675529d): ``utils.py`` compute_confidence and compute_least_grouped, ``processors.py``
# ConfPerReqLogitsProcessor.compute_conf, ``wrapper.py`` _deepthink_online and _perform_basic_voting. Written per
# trace, one list at a time, as the authors loop.

def vllm_returned_entries(logprobs_row, sampled, k):
    """What vLLM returns for one position with ``logprobs=k``: the k most probable tokens' log-probs, and the
    sampled token's when it is not among them (``logprobs_row``: the whole [V] log-softmax, a list or array)."""
    order = sorted(range(len(logprobs_row)), key=lambda t: -float(logprobs_row[t]))[:k]
    values = [float(logprobs_row[t]) for t in order]
    if sampled not in order:
        values.append(float(logprobs_row[sampled]))
    return values


def compute_confidence(entries_per_position, decimals=3):
    """utils.compute_confidence: minus the mean of every returned entry, rounded (``decimals=None``: not rounded,
    as calibrl stores C_i)."""
    out = []
    for entries in entries_per_position:
        if entries:
            value = -float(np.mean(entries))
            out.append(round(value, decimals) if decimals is not None else value)
    return out


def compute_least_grouped(confs, group_size):
    """utils.compute_least_grouped: the window means, each rounded to 3 decimals; a trace shorter than the window
    has one value, its (unrounded) mean; an empty one [0]."""
    if len(confs) < group_size:
        return [sum(confs) / len(confs)] if confs else [0]
    means = []
    for i in range(len(confs) - group_size + 1):
        window = confs[i:i + group_size]
        means.append(round(sum(window) / len(window), 3))
    return means


def processor_confidence(logits_row, topk):
    """processors.ConfPerReqLogitsProcessor.compute_conf: from the logits it is handed (before the temperature),
    minus the mean log of the top-k probabilities."""
    probabilities = np.exp(np.asarray(logits_row, dtype=np.float64) - np.max(logits_row))
    probabilities /= probabilities.sum()
    top = np.sort(probabilities)[::-1][:topk]
    return -float(np.log(top).sum()) / topk


def online_threshold(warmup_min_confs, confidence_percentile):
    """wrapper._deepthink_online: conf_bar = np.percentile(warm-up min_confs, 100 - confidence_percentile)."""
    return float(np.percentile(warmup_min_confs, 100 - confidence_percentile))


def online_vote(warmup, final, conf_bar):
    """wrapper._perform_basic_voting, online: warm-up traces with min_conf >= conf_bar, final traces not marked
    'gconf_threshold' (min_conf < conf_bar), each with an answer, weigh in with their min_conf. ``warmup`` /
    ``final``: lists of (answer or None, min_conf). Returns (answers, weights) in the authors' order."""
    answers, weights = [], []
    for answer, min_conf in warmup:
        if min_conf >= conf_bar and answer:
            answers.append(answer)
            weights.append(min_conf)
    for answer, min_conf in final:
        if min_conf < conf_bar:  # stop_reason "gconf_threshold"
            continue
        if answer:
            answers.append(answer)
            weights.append(min_conf)
    return answers, weights
