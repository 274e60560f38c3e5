"""Compute every figure ``calibrl eval`` reports for one set of samples (one file, one benchmark or overall).

All numbers come from :mod:`calibrl.metrics`, :mod:`calibrl.posthoc` and :mod:`calibrl.selection`; this module
only decides which arrays go in:

- accuracy figures (``accuracy`` = mean@k, ``pass@k``) use each row's ``correct``;
- confidence figures use ``Samples.confidence()`` in [0, 1] (exp(logprob_mean), decision_prob, or the top class
  probability) against ``Samples.confidence_target()`` (``correct``; for class_probs: top class == label);
  AUROC ranks ``Samples.score()`` (logprob_mean itself for sequence confidence, which orders like exp(.));
- bootstrap intervals resample prompts (:func:`calibrl.metrics.bootstrap_ci`);
- ``--posthoc`` figures are out-of-fold (folds split by prompt, :func:`calibrl.posthoc.cross_validated_posthoc`);
- ``confidence_sources``: every confidence field the input has (logprob_mean, decision_prob, class_probs,
  verbalized_confidence), each scored on the rows that have it (the others are excluded and counted);
- ``abstention`` (``--abstain-precision``): a threshold certified on a calibration half of the prompts and its
  coverage and precision on the other half (:func:`calibrl.metrics.calibrated_abstention`);
- selection and scaling need ``answer`` on every row (and logprob_mean on every row for weighted / pc / rpc;
  a logprob_mean column with gaps counts as absent, and the skipped methods are listed in ``selection_skipped``);
  with a verbalized confidence on some rows, ``weighted_verbalized`` votes with it
  (:func:`calibrl.selection.voting.confidence_weighted_vote`; a path that states none adds nothing);
- DeepConf (:mod:`calibrl.selection.deepconf`): the four trace signals of ``token_confidence`` are confidence
  sources scored by their ranking only (AUROC, per-prompt AUROC, AURC; no ECE / Brier), the ``deepconf_*``
  selections need them on every row, a ``--deepconf-online`` file adds ``deepconf_online``, and every input with
  ``n_tokens`` says what its selections spend (``selection_tokens_per_prompt``, ``tokens`` on the curves).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from calibrl import metrics as M
from calibrl.evaluation.samples import DEEPCONF_SOURCES, Samples
from calibrl.evaluation.settings import EvalSettings
from calibrl.metrics.registry import MetricInputs, compute_metrics, confidence_source, metric, metrics_for
from calibrl.metrics import stated_abstention
from calibrl.metrics.rejection import PRRReplicates
from calibrl.metrics.smooth import SmoothECEReplicates
from calibrl.selection import ScalingCurve, scaling_curve, select
from calibrl.selection.voting import confidence_weighted_vote

__all__ = ["ScopeResult", "answer_sources", "evaluate_samples", "rank_sources", "source_arrays", "source_bootstrap"]

_COVERAGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass
class ScopeResult:
    """Metrics of one (input, scope) pair plus the arrays the plots need."""

    label: str
    scope: str
    metrics: dict[str, Any]
    confidence: np.ndarray | None  # None: the input has no confidence (accuracy and majority vote only)
    target: np.ndarray | None
    posthoc_confidence: np.ndarray | None = None
    curves: dict[str, ScalingCurve] = field(default_factory=dict)
    # {source: (confidence, target)} on the rows having that source (the per-source reliability curves)
    sources: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def _f(x: Any) -> float | int | None:
    """JSON-friendly number (nan -> None; a count stays an int)."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    x = float(x)
    return None if np.isnan(x) else x


def _confidence_metrics(conf: np.ndarray, target: np.ndarray, score: np.ndarray, pidx: np.ndarray, n_bins: int):
    """Every declared ``eval`` metric that reads a confidence (:mod:`calibrl.metrics.registry`) of ``conf`` [N]
    (ranked by ``score`` [N]) against ``target`` [N], and the precision at each coverage of answering the most
    confident samples."""
    inputs = MetricInputs({"confidence": conf, "score": score, "correct": target, "prompt_index": pidx},
                          {"n_bins": n_bins})
    out = _declared("eval", inputs, reads_confidence=True)
    by_conf = inputs["confidence_ranking"]  # AURC's ranking: the confidence thresholded to answer or abstain
    out["precision_at_coverage"] = {str(k): _f(v) for k, v in by_conf.precision_at_coverage.items()}
    return out


_CONFIDENCE_INPUTS = frozenset({"confidence", "score", "ranking", "confidence_ranking", "per_prompt", "decision_prob"})


def _declared(context: str, inputs: MetricInputs, *, reads_confidence: bool) -> dict[str, Any]:
    """The declared metrics of ``context`` that apply to ``inputs`` and read a confidence (``reads_confidence``)
    or correctness alone (accuracy), so that each is computed against its own target (a class_probs confidence
    predicts the top class, the accuracy counts ``correct``); JSON-friendly values."""
    found = compute_metrics(context, inputs, where=lambda m: bool(m.needs & _CONFIDENCE_INPUTS) == reads_confidence)
    return {name: _f(value) for name, value in found.items()}


def source_arrays(samples: Samples, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, confidence, score, target)`` of confidence source ``kind`` on the rows that have it.

    ``rows`` [N] bool marks them; the other three are [n] over those rows: ``confidence`` in [0, 1] (exp of
    logprob_mean, decision_prob, top class probability, verbalized confidence), ``score`` the value AUROC ranks
    (logprob_mean itself, else the confidence) and ``target`` what the confidence predicts (``correct``; for
    class_probs whether the top class is the label, so class_probs rows need a label too).
    """
    rows = samples.source_mask(kind)
    if kind == "class_probs":
        labelled = samples.labels >= 0 if samples.labels is not None else np.zeros(len(samples), dtype=bool)
        rows &= labelled
        probs = samples.class_probs[rows]
        conf = probs.max(axis=1)
        return rows, conf, conf, probs.argmax(axis=1) == samples.labels[rows]
    if kind in DEEPCONF_SOURCES:  # a ranking score, no probability: the score is all there is
        values = samples.deepconf_signal(kind)[rows]
        return rows, values, values, samples.correct[rows]
    values = getattr(samples, kind)[rows]
    conf = np.exp(values) if kind == "logprob_mean" else values
    return rows, conf, values, samples.correct[rows]


def answer_sources(samples: Samples, answer_ids: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The confidences free once answers are clustered, ``{source: (confidence, score)}`` [N] each:
    ``answer_consistency`` (its own score) and ``semantic_entropy`` (score = minus the entropy; its confidence is
    the score too: not a probability). Samples without an answer agree with nobody
    (:mod:`calibrl.metrics.consistency`)."""
    answered = np.array([a is not None for a in samples.answers.tolist()], dtype=bool)
    consistency = M.answer_consistency(answer_ids, samples.prompt_index, answered=answered)
    negated = -M.semantic_entropy(answer_ids, samples.prompt_index, answered=answered)
    return {"answer_consistency": (consistency, consistency), "semantic_entropy": (negated, negated)}


def _source_metrics(conf: np.ndarray, score: np.ndarray, target: np.ndarray, pidx: np.ndarray, n_rows: int,
                    probability: bool, n_bins: int, only: frozenset[str] | None = None) -> dict[str, Any]:
    """One confidence source's figures on the rows that have it (``conf``, ``score``, ``target``, ``pidx`` [n]):
    every declared ``sources`` metric (AUROC, PRR and AURC rank ``score``; for a probability also ECE, smooth ECE,
    Brier and the mean of ``conf``), None where one does not apply (a ranking-only source has no ECE)."""
    n = len(target)
    figures: dict[str, Any] = {"n": n, "n_excluded": n_rows - n, "probability": probability}
    names = [m.name for m in metrics_for("sources") if only is None or m.name in only]
    if n == 0:
        return {**figures, **dict.fromkeys(names)}
    inputs = MetricInputs({"confidence": conf if probability else None, "score": score, "correct": target,
                           "prompt_index": pidx}, {"n_bins": n_bins})
    found = compute_metrics("sources", inputs, where=None if only is None else lambda m: m.name in only)
    figures.update({k: _f(found[k]) if k in found else None for k in names})
    return figures


def confidence_figures(confidence, correct, score=None, prompt_index=None, *, n_bins: int = 10,
                       only: Iterable[str] | None = None) -> dict[str, Any]:
    """One confidence's figures exactly as ``calibrl eval``'s table of confidence sources computes them (every
    declared ``sources`` metric: AUROC, PRR, AURC, ECE, smooth ECE, Brier, ...; None where one is undefined).
    ``confidence`` [N] in [0, 1]; ``correct`` [N] bool; ``score`` [N] what AUROC, PRR and AURC rank (default the
    confidence; exp(score) = confidence ranks the same); ``prompt_index`` [N] (default: each sample its own
    prompt); ``only``: just these figures (each computed as in the full table). The harnesses' metrics
    (:mod:`calibrl.inspect`, :mod:`calibrl.lm_eval`) report these, one figure per metric, so their numbers equal
    ``calibrl eval``'s on the same samples."""
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    target = np.asarray(correct, dtype=bool).reshape(-1)
    rank = conf if score is None else np.asarray(score, dtype=np.float64).reshape(-1)
    pidx = np.arange(len(conf)) if prompt_index is None else np.asarray(prompt_index).reshape(-1)
    if not len(conf) == len(target) == len(rank) == len(pidx):
        raise ValueError(f"confidence_figures: lengths differ (confidence {len(conf)}, correct {len(target)}, "
                         f"score {len(rank)}, prompt_index {len(pidx)})")
    if len(conf) and not (np.all(np.isfinite(conf)) and conf.min() >= 0.0 and conf.max() <= 1.0):
        raise ValueError("confidence_figures: every confidence must be a probability in [0, 1]")
    return _source_metrics(conf, rank, target, pidx, len(conf), True, n_bins,
                           None if only is None else frozenset(only))


SOURCE_INTERVALS = ("auroc", "prr", "smooth_ece")  # the source figures with bootstrap intervals
_DEDUP_PROMPTS = 64  # up to this many prompts, repeated bootstrap draws are computed once


def source_bootstrap(arrays: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]],
                     n_groups: int, *, n_boot: int, alpha: float, seed: int,
                     progress: Callable[[str], Any] | None = None,
                     prompts: PromptReplicates | None = None, prompts_auroc: str | None = None) -> dict[str, Any]:
    """Prompt-bootstrap intervals of AUROC, PRR and (probabilities only) smooth ECE for every confidence source,
    all from the same prompt draws as :func:`prompt_bootstrap` (same ``seed``), so differences between sources
    are paired. ``arrays``: ``{source: (prompt index, confidence, score, target, is probability)}`` on the rows
    having the source. Returns ``{"intervals": {source: {metric: (low, high)}}, "replicates": {source: {metric:
    [n_boot]}}}``. ``prompts``: a :class:`PromptReplicates` of the same ``n_groups``, handed each chunk of draws
    (with the AUROC replicates of source ``prompts_auroc``, when that source is its very score and target)."""
    from calibrl.metrics.bootstrap import percentile_interval, resampled_prompt_counts

    prr_of = {k: PRRReplicates(score, target, pidx, n_groups) for k, (pidx, _, score, target, _) in arrays.items()}
    smooth_of = {k: SmoothECEReplicates(conf, target, pidx, n_groups)
                 for k, (pidx, conf, _, target, probability) in arrays.items() if probability}
    reps: dict[str, dict[str, list[np.ndarray]]] = {k: {m: [] for m in SOURCE_INTERVALS} for k in arrays}
    # with few prompts, replicates repeat (3 prompts allow 10 different draws): a replicate's figures depend on its
    # counts alone, each computed row by row, so a repeated one takes the first one's values, the same bits
    seen: dict[bytes, int] | None = {} if n_groups <= _DEDUP_PROMPTS else None
    done = 0
    if prompts is not None and prompts.n_groups != n_groups:
        raise ValueError(f"prompts draws {prompts.n_groups} prompts, the sources {n_groups}")
    for drawn, counts in resampled_prompt_counts(n_groups, n_boot=n_boot, seed=seed):
        if progress is not None:
            progress(f"confidence sources, replicates {done + 1}-{done + len(counts)} of {n_boot}")
        done += len(counts)
        rows = np.arange(len(counts))
        if seen is not None:  # the position of each replicate's first occurrence among all replicates so far
            first = np.array([seen.setdefault(row.tobytes(), done - len(counts) + i) for i, row in enumerate(counts)])
            new_rows = np.flatnonzero(first == done - len(counts) + rows)
        else:
            first, new_rows = done - len(counts) + rows, rows
        fresh = counts if seen is None else counts[new_rows]  # every replicate is new where none is looked up
        fresh_int = PRRReplicates.narrow(fresh)  # once for every source's ranking pass
        for k, (pidx, conf, score, target, probability) in arrays.items():
            none = np.empty(0)
            # one pass over the tie runs of the source's scores
            prr, auc = prr_of[k].with_auroc(fresh_int) if len(fresh) else (none, none)
            smooth = smooth_of[k](fresh) if probability and len(fresh) else np.full(len(fresh), np.nan)
            for metric, values in (("prr", prr), ("auroc", auc), ("smooth_ece", smooth)):
                if seen is None:
                    reps[k][metric].append(values)
                    continue
                known = np.concatenate([*reps[k][metric], np.full(len(counts), np.nan)])
                known[done - len(counts) + new_rows] = values
                reps[k][metric].append(known[first])
        if prompts is not None:
            prompts.add(drawn, counts, None if prompts_auroc is None else reps[prompts_auroc]["auroc"][-1])
    replicates = {k: {m: np.concatenate(v) for m, v in by.items()} for k, by in reps.items()}
    intervals = {k: {m: percentile_interval(v, alpha=alpha) for m, v in by.items()} for k, by in replicates.items()}
    return {"intervals": intervals, "replicates": replicates}


def rank_sources(sources: dict[str, dict[str, Any]], replicates: dict[str, dict[str, np.ndarray]] | None,
                 *, alpha: float) -> dict[str, Any]:
    """Which confidence to trust: the sources ordered by AUROC (best first, undefined last) and, with bootstrap
    replicates, the paired interval of the best one's lead over the runner-up in AUROC and in PRR, and of the
    probability with the lowest smooth ECE over the next one (``{"order": [...], "auroc": {...}, "prr": {...},
    "smooth_ece": {...}}``; a lead is ``{"best", "over", "difference", "interval"}``)."""
    from calibrl.metrics.bootstrap import percentile_interval

    def order(key: str, higher: bool) -> list[str]:
        defined = [k for k, m in sources.items() if m.get(key) is not None]
        return sorted(defined, key=lambda k: -sources[k][key] if higher else sources[k][key])

    out: dict[str, Any] = {"order": order("auroc", True) + [k for k in sources if sources[k].get("auroc") is None]}
    for key in ("auroc", "prr", "smooth_ece"):
        ranked = order(key, metric(key).higher)
        if len(ranked) < 2:
            continue
        best, over = ranked[:2]
        lead = {"best": best, "over": over, "difference": _f(sources[best][key] - sources[over][key]),
                "interval": None}
        if replicates is not None:
            diff = replicates[best][key] - replicates[over][key]
            lead["interval"] = [_f(x) for x in percentile_interval(diff, alpha=alpha)]
        out[key] = lead
    return out


def _ranked_negatives(score: np.ndarray, target: np.ndarray, pidx: np.ndarray):
    """Samples ranked once for :func:`_weighted_auroc_numerators`: the prompt of each negative in increasing
    score ``neg_g`` [n_neg], and per positive its prompt ``pos_g`` [n_pos] and how many negatives score strictly
    below it (``lo``) and at most as high (``hi``), [n_pos] each."""
    order = np.argsort(score, kind="mergesort")
    s_sorted, t_sorted, g_sorted = score[order], target[order], pidx[order]
    neg_s, pos_s = s_sorted[~t_sorted], s_sorted[t_sorted]
    lo = np.searchsorted(neg_s, pos_s, side="left")
    hi = np.searchsorted(neg_s, pos_s, side="right")
    return g_sorted[~t_sorted], g_sorted[t_sorted], lo, hi


_AUROC_BLOCK = 1 << 21  # replicate x sample entries per block: 16 MB per int64 array, about 5 alive at once


def _weighted_auroc_numerators(counts: np.ndarray, neg_g: np.ndarray, pos_g: np.ndarray, lo: np.ndarray,
                               hi: np.ndarray) -> np.ndarray:
    """Twice the Mann-Whitney count of each replicate, samples weighted by their prompt's count, [b] int64.

    ``counts`` [b, G] integer-valued prompt counts of b replicates; the rest from :func:`_ranked_negatives`.
    With w_i = counts[r, prompt of i] and C_r(j) = sum of the weights of the j lowest negatives,
    2 U_r = sum over positives i of w_i * (C_r(lo_i) + C_r(hi_i)): the weighted negatives below i, ties counting
    1/2 (twice). Integers throughout, so U_r / (weighted positives x weighted negatives) is exactly the AUROC of
    replicate r's gathered rows. Replicates go in blocks of at most ``_AUROC_BLOCK`` / n_samples, so memory stays
    about 5 x 16 MB whatever the number of replicates.
    """
    out = np.empty(len(counts), dtype=np.int64)
    tie = np.flatnonzero(hi > lo)  # positives tied with some negative: C(hi) != C(lo)
    step = max(1, _AUROC_BLOCK // max(1, neg_g.size + pos_g.size))
    for a in range(0, len(counts), step):
        kb = counts[a:a + step].astype(np.int64)  # [r, G]
        cum = np.zeros((len(kb), neg_g.size + 1), dtype=np.int64)  # [r, n_neg + 1] C_r(0 .. n_neg)
        np.cumsum(np.take(kb, neg_g, axis=1), axis=1, out=cum[:, 1:])
        w_pos = np.take(kb, pos_g, axis=1)  # [r, n_pos]
        twice = 2 * np.einsum("ri,ri->r", w_pos, np.take(cum, lo, axis=1))
        if tie.size:  # C(lo) + C(hi) = 2 C(lo) + (C(hi) - C(lo))
            gap = np.take(cum, hi[tie], axis=1) - np.take(cum, lo[tie], axis=1)
            twice += np.einsum("ri,ri->r", w_pos[:, tie], gap)
        out[a:a + step] = twice
    return out


class PromptReplicates:
    """The replicates of :func:`prompt_bootstrap`, a chunk of prompt draws at a time: ``add(drawn, counts)`` for
    each chunk of :func:`calibrl.metrics.bootstrap.resampled_prompt_counts` (``auroc``: the chunk's AUROC
    replicates when already computed), then ``intervals(alpha)``. :func:`source_bootstrap` feeds it the draws it
    makes, so the eval draws its prompts once for both bootstraps (a million samples: 0.5-1 s of draws saved)."""

    def __init__(self, correct: np.ndarray, pidx: np.ndarray, score: np.ndarray | None, conf: np.ndarray | None,
                 target: np.ndarray | None, *, n_bins: int, auroc_given: bool = False):
        self.n_groups = n_groups = int(pidx.max()) + 1
        y = np.asarray(correct, dtype=bool)
        self.n_p = n_p = np.bincount(pidx, minlength=n_groups)
        self.acc_p = np.bincount(pidx, weights=y, minlength=n_groups).astype(np.int64) / n_p  # as mean_at_k's c / n
        self.conf = conf
        self.stats: dict[str, list[np.ndarray]] = {"accuracy": []}
        if conf is not None:
            t = np.asarray(target, dtype=bool)
            if not auroc_given:
                self.neg_g, self.pos_g, self.lo, self.hi = _ranked_negatives(np.asarray(score), t, pidx)
            self.pos_p = np.bincount(pidx[t], minlength=n_groups).astype(np.float64)  # [G] positives per prompt
            self.neg_p = n_p - self.pos_p
            edges = M.bin_edges(conf, n_bins=n_bins, strategy="uniform")
            cell = pidx * n_bins + np.searchsorted(edges[1:-1], conf, side="left")  # [N] (prompt, bin)
            size = n_groups * n_bins
            self.cnt_pb = np.bincount(cell, minlength=size).reshape(n_groups, n_bins).astype(np.float64)
            self.conf_pb = np.bincount(cell, weights=conf, minlength=size).reshape(n_groups, n_bins)
            self.acc_pb = np.bincount(cell, weights=t, minlength=size).reshape(n_groups, n_bins)
            self.sq_p = np.bincount(pidx, weights=(conf - t) ** 2, minlength=n_groups)
            self.stats.update(auroc=[], ece=[], brier=[])

    def add(self, drawn: np.ndarray, counts: np.ndarray, auroc: np.ndarray | None = None) -> None:
        """One chunk: ``drawn`` [b, G] the prompts drawn in draw order, ``counts`` [b, G] how many times each."""
        stats = self.stats
        stats["accuracy"].append(self.acc_p[drawn].mean(axis=1))
        if self.conf is None:
            return
        if auroc is not None:
            stats["auroc"].append(np.asarray(auroc))
        else:
            twice_u = _weighted_auroc_numerators(counts, self.neg_g, self.pos_g, self.lo, self.hi)  # [b]
            den = (counts @ self.pos_p) * (counts @ self.neg_p)  # [b] weighted positives x negatives (whole numbers)
            with np.errstate(invalid="ignore", divide="ignore"):
                auc = np.where(den > 0, (twice_u.astype(np.float64) / 2.0) / den, np.nan)
            stats["auroc"].append(auc)
        cnt, cs, acs = counts @ self.cnt_pb, counts @ self.conf_pb, counts @ self.acc_pb  # [b, n_bins]
        with np.errstate(invalid="ignore", divide="ignore"):
            gaps = np.abs(acs / cnt - cs / cnt)
        frac = cnt / np.maximum(cnt.sum(axis=1, keepdims=True), 1)
        stats["ece"].append(np.where(cnt > 0, frac * np.nan_to_num(gaps), 0.0).sum(axis=1))
        stats["brier"].append((counts @ self.sq_p) / (counts @ self.n_p))

    def intervals(self, alpha: float) -> dict[str, tuple[float, float]]:
        from calibrl.metrics.bootstrap import percentile_interval

        return {k: percentile_interval(np.concatenate(v), alpha=alpha) for k, v in self.stats.items()}


def prompt_bootstrap(correct: np.ndarray, pidx: np.ndarray, score: np.ndarray | None, conf: np.ndarray | None,
                     target: np.ndarray | None, *, n_bins: int, n_boot: int, alpha: float, seed: int,
                     progress: Callable[[str], Any] | None = None,
                     auroc_replicates: np.ndarray | None = None) -> dict[str, tuple[float, float]]:
    """Prompt-bootstrap intervals of accuracy (mean@k) and, with a confidence, AUROC, ECE (uniform bins) and Brier:
    those of :func:`calibrl.metrics.bootstrap_ci` with the same ``seed`` (the same prompt draws), computed from
    each replicate's prompt counts instead of its gathered rows (:class:`PromptReplicates`).

    ``correct``, ``pidx`` (dense prompt index), ``score`` / ``conf`` / ``target`` [N]. A replicate holding prompt p
    ``k_p`` times weighs p's samples by ``k_p``: accuracy is the mean of the drawn prompts' accuracies (the very
    same sum); AUROC the Mann-Whitney count with weights over samples ranked once, all replicates of a chunk at
    once (:func:`_weighted_auroc_numerators`; integer counts: the same value exactly); ECE and Brier sums of
    per-(prompt, bin) and per-prompt totals (equal up to float rounding, ~1e-16 relative). Replicates where a
    metric is nan are ignored, as in :func:`~calibrl.metrics.bootstrap_ci`.
    ``progress(description)`` is called before each chunk of replicates. ``auroc_replicates`` [n_boot]: the
    AUROC of these very replicates already computed (:func:`source_bootstrap` of the same score, target and seed
    gives the same values exactly); its interval is then taken from them instead of counted again.
    """
    from calibrl.metrics.bootstrap import resampled_prompt_counts

    replicates = PromptReplicates(correct, pidx, score, conf, target, n_bins=n_bins,
                                  auroc_given=auroc_replicates is not None)
    done = 0
    for drawn, counts in resampled_prompt_counts(replicates.n_groups, n_boot=n_boot, seed=seed):
        if progress is not None:
            progress(f"replicates {done + 1}-{done + len(counts)} of {n_boot}")
        done += len(counts)
        replicates.add(drawn, counts, None if auroc_replicates is None
                       else np.asarray(auroc_replicates)[done - len(counts):done])
    return replicates.intervals(alpha)


def _deepconf_inputs(samples: Samples) -> tuple[np.ndarray | None, str]:
    """DeepConf's [N, 4] trace signals for the selections, or None and why: they need a token_confidence array
    with at least one token on every path (a path without one would silently lose its vote)."""
    signals = samples.deepconf_signals
    if signals is None:
        return None, "no token_confidence in the input"
    missing = int(np.isnan(signals[:, 0]).sum())
    if missing:
        return None, f"token_confidence missing or empty on {missing} of {len(samples)} rows"
    return signals, ""


def _deepconf_online_and_tokens(samples: Samples, answer_ids: np.ndarray, sel: dict[str, Any], result: ScopeResult,
                                out: dict[str, Any], *, step: Callable[[str], Any]) -> None:
    """What the selections spend, and DeepConf online's answer when the input is a ``--deepconf-online`` file.

    ``out["selection_tokens_per_prompt"]``: the mean over prompts of the tokens of all their paths, what every
    offline selection on this input spends (an online file's count its stopped traces); each scaling curve gets
    ``tokens`` per N (N times the mean tokens of a path). ``sel["deepconf_online"]``: the online vote
    (:func:`calibrl.selection.deepconf.online_vote`) when every row says whether it voted."""
    from calibrl.selection.deepconf import online_vote

    tokens = samples.n_tokens
    if tokens is not None and not np.isnan(tokens).any():
        per_prompt = np.bincount(samples.prompt_index, weights=tokens, minlength=samples.n_prompts)
        out["selection_tokens_per_prompt"] = _f(per_prompt.mean())
        for method, curve in result.curves.items():
            result.curves[method] = replace(curve, tokens=curve.ns * float(tokens.mean()))
    voted = samples.deepconf_voted
    if voted is not None and not np.isnan(voted).any() and samples.deepconf_signals is not None:
        step("DeepConf online vote")
        sel["deepconf_online"] = _f(online_vote(answer_ids, samples.correct, samples.prompt_index,
                                                deepconf_signals=samples.deepconf_signals,
                                                voted=voted == 1, lowest=samples.deepconf_lowest).accuracy)


@dataclass
class _Arrays:
    """What every block of :func:`evaluate_samples` reads: the main confidence ``conf`` [N] in [0, 1], the
    ``score`` [N] it ranks by and the ``target`` [N] it predicts (all None when the input has none)."""

    conf: np.ndarray | None
    score: np.ndarray | None
    target: np.ndarray | None

    @classmethod
    def of(cls, samples: Samples) -> _Arrays:
        if samples.confidence_kind is None:  # other tools' logs may carry correctness only
            return cls(None, None, None)
        return cls(samples.confidence(), samples.score(), samples.confidence_target())


def _counts_block(samples: Samples) -> dict[str, Any]:
    """What the input is and its accuracy figures: sizes, the declared metrics of correctness alone (accuracy =
    mean@k), pass@1 and pass@k, the completions cut short and without an answer."""
    pidx, sizes = samples.prompt_index, samples.group_sizes()
    kmax = int(sizes.min())
    out: dict[str, Any] = {
        "n_samples": len(samples),
        "n_prompts": samples.n_prompts,
        "samples_per_prompt": {"min": kmax, "max": int(sizes.max())},
        "confidence": samples.confidence_kind,
        # accuracy, and any other declared metric of correctness alone (with abstentions: answer rate and the rest)
        **_declared("eval", MetricInputs({"correct": samples.correct, "prompt_index": pidx,
                                          "abstained": samples.abstained, "answerable": samples.answerable}),
                   reads_confidence=False),
        "pass@1": _f(M.pass_at_k(samples.correct, pidx, 1)),
    }
    if samples.abstained is not None:
        out["n_abstained"] = int(samples.abstained.sum())
    if samples.answerable is not None:
        out["n_unanswerable"] = int((~samples.answerable).sum())
    if samples.truncated is not None:  # what the accuracy is made of: completions cut short, answers not found
        out["n_truncated"] = int(samples.truncated.sum())
    if samples.answers is not None:
        out["n_no_answer"] = int(np.equal(samples.answers, None).sum())
    if kmax > 1:
        out[f"pass@{kmax}"] = _f(M.pass_at_k(samples.correct, pidx, kmax))
    return out


def _source_rows(samples: Samples, answer_ids: np.ndarray | None) -> dict[str, tuple]:
    """``{source: (prompt index, confidence, score, target, is probability)}`` of every confidence source of the
    input, on the rows that have it, and of the answer-agreement ones when answers are clustered."""
    pidx = samples.prompt_index
    rows_of: dict[str, tuple] = {}
    for kind in samples.confidence_sources():
        rows, s_conf, s_score, s_target = source_arrays(samples, kind)
        rows_of[kind] = (pidx[rows], s_conf, s_score, s_target, confidence_source(kind).probability)
    if answer_ids is not None and samples.answers is not None:
        for kind, (s_conf, s_score) in answer_sources(samples, answer_ids).items():
            rows_of[kind] = (pidx, s_conf, s_score, samples.correct, confidence_source(kind).probability)
    return rows_of


def _abstention_block(samples: Samples, arrays: _Arrays, settings: EvalSettings) -> dict[str, Any]:
    """The certified abstention threshold of the main confidence (``--abstain-precision``)."""
    if arrays.conf is not None:
        found = M.calibrated_abstention(arrays.conf, arrays.target, samples.prompt_index,
                                        target_precision=settings.abstain_precision, delta=settings.abstain_delta,
                                        seed=settings.seed, method=settings.abstain_method)
        return {"confidence": samples.confidence_kind, **found.to_dict()}
    return {"confidence": None, "threshold": None, "coverage": None, "precision_heldout": None,
            "target_precision": settings.abstain_precision, "delta": settings.abstain_delta,
            "grid_size": len(M.DEFAULT_THRESHOLD_GRID), "method_name": settings.abstain_method,
            "note": "no confidence in the input"}


def _bootstrap_block(samples: Samples, arrays: _Arrays, source_rows: dict[str, tuple], sources: dict[str, Any],
                     settings: EvalSettings, step: Callable[[str], Any]) -> tuple[dict[str, Any], dict | None]:
    """Prompt-bootstrap intervals: each source's (into ``sources``), then the main figures' (returned with the
    sources' replicates, which the confidence ranking pairs)."""
    n_boot, alpha, seed, pidx = settings.bootstrap, settings.alpha, settings.seed, samples.prompt_index
    ranked_rows = {k: v for k, v in source_rows.items() if len(v[3])}
    prompts, same = None, False
    if ranked_rows and int(pidx.max()) + 1 == samples.n_prompts:  # the same draws: made once for both bootstraps
        # the main confidence is one of the sources on every row: its AUROC replicates are counted once
        main = ranked_rows.get(samples.confidence_kind)
        same = (main is not None and len(main[3]) == len(samples) and np.array_equal(main[0], pidx)
                and np.array_equal(main[2], arrays.score) and np.array_equal(main[3], arrays.target))
        prompts = PromptReplicates(samples.correct, pidx, arrays.score, arrays.conf, arrays.target,
                                   n_bins=settings.n_bins, auroc_given=same)
    replicates = None
    if ranked_rows:
        step("bootstrap of the confidence sources" + (f" and of the figures ({n_boot} prompt resamples)"
                                                      if prompts is not None else ""))
        found = source_bootstrap(ranked_rows, samples.n_prompts, n_boot=n_boot, alpha=alpha, seed=seed,
                                 progress=lambda d: step(f"bootstrap, {d}"), prompts=prompts,
                                 prompts_auroc=samples.confidence_kind if same else None)
        replicates = found["replicates"]
        for kind, by_metric in found["intervals"].items():
            sources[kind]["intervals"] = {m: [_f(lo), _f(hi)] for m, (lo, hi) in by_metric.items()
                                          if sources[kind].get(m) is not None}
    if prompts is not None:
        boot = prompts.intervals(alpha)
    else:
        step(f"bootstrap ({n_boot} prompt resamples)")
        boot = prompt_bootstrap(samples.correct, pidx, arrays.score, arrays.conf, arrays.target,
                                n_bins=settings.n_bins, n_boot=n_boot, alpha=alpha, seed=seed,
                                progress=lambda d: step(f"bootstrap, {d}"))
    return ({"n_boot": n_boot, "alpha": alpha, **{k: [_f(lo), _f(hi)] for k, (lo, hi) in boot.items()}},
            replicates)


def _posthoc_block(samples: Samples, arrays: _Arrays, settings: EvalSettings) -> tuple[dict[str, Any],
                                                                                       np.ndarray | None]:
    """The confidence figures of the out-of-fold post-hoc calibrated confidence (``--posthoc``), and it."""
    from calibrl.posthoc import cross_validated_posthoc

    method = settings.posthoc
    if arrays.conf is None:
        return {"method": method, "skipped": "no confidence in the input"}, None
    if samples.n_prompts < 2:
        return {"method": method, "skipped": "needs at least 2 prompts"}, None
    pidx = samples.prompt_index
    cal = cross_validated_posthoc(method, arrays.conf, arrays.target, pidx, n_splits=settings.n_splits,
                                  seed=settings.seed)
    # AUROC of the pooled out-of-fold values: per-fold maps differ, so it can move even for monotone maps
    return ({"method": method, "n_splits": int(min(settings.n_splits, samples.n_prompts)),
             **_confidence_metrics(cal, arrays.target, cal, pidx, settings.n_bins)}, cal)


def _selection_block(samples: Samples, answer_ids: np.ndarray, arrays: _Arrays, settings: EvalSettings,
                     result: ScopeResult, out: dict[str, Any], step: Callable[[str], Any]) -> None:
    """Answer selection over all of each prompt's paths and the scaling curves (into ``result.curves``), with
    what each needs (:func:`calibrl.selection.registry.method_needs`): the methods an input cannot run are listed
    with the reason in ``selection_skipped``."""
    from calibrl.selection.registry import method_needs

    pidx, sizes = samples.prompt_index, samples.group_sizes()
    lpm = samples.logprob_mean
    missing = {"logprob_mean": "no logprob_mean in the input"}
    if lpm is not None and np.isnan(lpm).any():
        # a partial logprob_mean column counts as absent: weighted / pc / rpc need it on every path
        missing["logprob_mean"] = f"logprob_mean missing on {int(np.isnan(lpm).sum())} of {lpm.size} rows"
        lpm = None
    if lpm is not None:
        del missing["logprob_mean"]
    if arrays.conf is None:  # best-of-N ranks paths by their confidence
        missing["confidence"] = "no confidence in the input"
    signals, why_not = _deepconf_inputs(samples)
    if signals is None:
        missing["deepconf_signals"] = why_not
    skipped: dict[str, str] = {}
    usable = []
    for method in settings.methods:
        lacking = [missing[n] for n in ("confidence", "logprob_mean", "deepconf_signals")
                   if n in method_needs(method) and n in missing]
        if lacking:
            skipped[method] = lacking[0]
        else:
            usable.append(method)
    kwargs = {"logprob_mean": lpm, "completions": samples.completion_ids, "confidence": arrays.score,
              "deepconf_signals": signals}
    sel: dict[str, Any] = {}  # accuracy of each method on all of each prompt's paths
    for method in usable:
        step(f"selection '{method}' and its scaling curve")
        # only the accuracy is read: RPC then fits only the prompts whose accuracy its pruning could change (the
        # same accuracy exactly, :func:`calibrl.selection.pruning.rpc`), 14% of them at 200,000 samples here
        only = {"accuracy_only": True} if method == "rpc" else {}
        sel[method] = _f(select(method, answer_ids, samples.correct, pidx, **kwargs, **only).accuracy)
        draws = settings.rpc_draws if method == "rpc" else settings.scaling_draws  # rpc: one fit per prompt per draw
        result.curves[method] = scaling_curve(method, answer_ids, samples.correct, pidx, n_draws=draws,
                                              seed=settings.seed,
                                              progress=lambda d, m=method: step(f"scaling curve '{m}', {d}"), **kwargs)
    verbal = samples.verbalized_confidence
    if verbal is not None and not np.isnan(verbal).all():
        # RLCR's confidence-weighted vote; paths stating no confidence add nothing to their answer's score
        step("selection 'weighted_verbalized' and its scaling curve")
        sel["weighted_verbalized"] = _f(confidence_weighted_vote(answer_ids, samples.correct, pidx,
                                                                 confidence=verbal).accuracy)
        result.curves["weighted_verbalized"] = scaling_curve(
            "confidence_weighted", answer_ids, samples.correct, pidx, confidence=verbal,
            n_draws=settings.scaling_draws, seed=settings.seed)
    _deepconf_online_and_tokens(samples, answer_ids, sel, result, out, step=step)
    out["selection"] = sel
    if skipped:
        out["selection_skipped"] = skipped
    out["scaling"] = {m: c.to_dict() for m, c in result.curves.items()}
    if result.curves and int(sizes.min()) < int(sizes.max()):
        short = int((sizes == sizes.min()).sum())
        out["scaling_note"] = (f"the scaling curves stop at N = {int(sizes.min())}: {short} of {len(sizes)} "
                               f"prompts have only {int(sizes.min())} path(s) (others up to {int(sizes.max())})")


def evaluate_samples(
    samples: Samples,
    *,
    label: str,
    scope: str = "overall",
    answer_ids: np.ndarray | None = None,
    settings: EvalSettings | None = None,
    step: Callable[[str], Any] | None = None,
) -> ScopeResult:
    """Every reported figure for ``samples`` under ``settings`` (default :class:`EvalSettings`, with its bootstrap).
    ``answer_ids``: answer clusters (from :func:`calibrl.selection.answer_clusters`) enabling selection and the
    answer-agreement confidences; ``step(description)`` is called before each slow stage (progress reporting).

    Blocks, each returning its part: the counts and accuracy; the main confidence's declared metrics; every
    confidence source's; the abstention certificate; the bootstrap intervals; the post-hoc calibration; answer
    selection and its scaling curves."""
    settings = settings or EvalSettings()
    report = step or (lambda _desc: None)

    def step(description: str) -> None:
        report(f"{label}/{scope}: {description}")

    pidx = samples.prompt_index
    arrays = _Arrays.of(samples)
    out = _counts_block(samples)
    if samples.confidence_kind == "class_probs":
        out["top_label_accuracy"] = _f(M.mean_at_k(arrays.target, pidx))
    if arrays.conf is not None:
        out.update(_confidence_metrics(arrays.conf, arrays.target, arrays.score, pidx, settings.n_bins))
    source_rows = _source_rows(samples, answer_ids)
    sources = {kind: _source_metrics(s_conf, s_score, s_target, s_pidx, len(samples), probability, settings.n_bins)
               for kind, (s_pidx, s_conf, s_score, s_target, probability) in source_rows.items()}
    if sources:
        out["confidence_sources"] = sources
    signals = samples.deepconf_signals
    if signals is not None:  # every trace within one window: the four signals are each trace's mean, one number
        defined = ~np.isnan(signals).any(axis=1)
        if defined.any() and (signals[defined] == signals[defined][:, :1]).all():
            out["deepconf_signals_equal"] = True
    if settings.abstain_precision is not None:
        out["abstention"] = _abstention_block(samples, arrays, settings)
    if samples.abstained is not None and arrays.score is not None and samples.confidence_kind != "class_probs":
        # the model's own "I don't know" against the main confidence answering as often
        found = stated_abstention.versus_threshold(arrays.score, samples.correct, samples.abstained)
        out["abstained_versus_threshold"] = {"confidence": samples.confidence_kind, "answered": found["answered"],
                                             "declined_by_both": found["declined_by_both"],
                                             **{k: {m: _f(v) for m, v in found[k].items()}
                                                for k in ("model", "threshold")}}
    replicates = None
    if settings.bootstrap > 0:
        out["bootstrap"], replicates = _bootstrap_block(samples, arrays, source_rows, sources, settings, step)
    if sources:
        out["confidence_ranking"] = rank_sources(sources, replicates, alpha=settings.alpha)

    plots = {kind: (v[1], v[3]) for kind, v in source_rows.items() if v[4] and len(v[3])}
    result = ScopeResult(label, scope, out, arrays.conf, arrays.target, sources=plots)
    if settings.posthoc:
        step(f"{settings.posthoc} post-hoc calibration ({settings.n_splits} folds by prompt)")
        out["posthoc"], result.posthoc_confidence = _posthoc_block(samples, arrays, settings)
    if answer_ids is not None and settings.methods:
        _selection_block(samples, answer_ids, arrays, settings, result, out, step)
    return result
