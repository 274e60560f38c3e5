"""The model's own abstentions: each sample is right, wrong, or abstained ("I don't know",
:mod:`calibrl.tasks.abstention`), and the figures the abstention papers report, over all N samples:

    answer rate            A / N                  A answered (not abstained)
    accuracy answered      R / A                  R right (an abstention is never right)
    hallucination rate     W / N                  W = A - R wrong answers
    accuracy/hallucination R / W                  behaviorally calibrated RL's ratio (arXiv 2512.19920)

Where each sample's exact success probability is known (the testbed), :func:`risk_threshold_regret` gives the
expected reward of the samples under the risk-threshold reward and how far it falls short of the Bayes-optimal
policy's.

And, where some items have no right answer (``answerable`` false), how often the model declines each kind
(:func:`declined_by_kind`): on the unanswerable items it should always; on the others, declining is a lost answer.

Also the comparison with a confidence threshold that answers as often (:func:`versus_threshold`): which wrong
answers does each avoid? Shapes: ``correct``, ``abstained``, ``score`` [N]; a sample both abstained and marked
correct counts as abstained.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["RiskRegret", "StatedAbstention", "declined_by_kind", "risk_threshold_regret", "stated_abstention",
           "versus_threshold"]


class StatedAbstention(NamedTuple):
    """The module docstring's figures, with their counts (``n``, ``answered``, ``right``, ``wrong``)."""

    answer_rate: float
    accuracy_answered: float
    hallucination_rate: float
    accuracy_hallucination_ratio: float
    n: int
    answered: int
    right: int
    wrong: int


def _outcomes(correct: Any, abstained: Any) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(correct, dtype=bool).reshape(-1)
    a = np.asarray(abstained, dtype=bool).reshape(-1)
    if c.shape != a.shape:
        raise ValueError(f"correct has {c.size} samples and abstained {a.size}")
    return c & ~a, a


def stated_abstention(correct: Any, abstained: Any) -> StatedAbstention:
    """The figures of the module docstring (NaN where a denominator is 0: no sample, none answered, none wrong)."""
    c, a = _outcomes(correct, abstained)
    n, answered, right = c.size, int((~a).sum()), int(c.sum())
    wrong = answered - right
    with np.errstate(invalid="ignore", divide="ignore"):
        return StatedAbstention(answered / n if n else float("nan"), right / answered if answered else float("nan"),
                                wrong / n if n else float("nan"), right / wrong if wrong else float("nan"),
                                n, answered, right, wrong)


def versus_threshold(score: Any, correct: Any, abstained: Any) -> dict[str, Any]:
    """The model's abstentions against answering the ``answered`` most confident samples by ``score`` (higher =
    surer; ties broken by the samples' order, stable): the same answer rate, another choice of what to answer.

    Returns ``{"answered", "model": {...}, "threshold": {...}, "declined_by_both"}``: for each of the two, the
    accuracy among the samples it answers and its hallucination rate (wrong answers over all samples);
    ``declined_by_both`` the samples both decline. An abstained sample has no answer, so where the threshold
    answers it, it counts as not right (as its ``correct`` says): the threshold cannot answer what the model did
    not say."""
    c, a = _outcomes(correct, abstained)
    s = np.asarray(score, dtype=np.float64).reshape(-1)
    if s.shape != c.shape:
        raise ValueError(f"score has {s.size} samples and correct {c.size}")
    n, answered = c.size, int((~a).sum())
    order = np.argsort(-s, kind="stable")
    by_threshold = np.zeros(n, dtype=bool)
    by_threshold[order[:answered]] = True  # the most confident `answered` samples
    out: dict[str, Any] = {"answered": answered}
    for name, answers in (("model", ~a), ("threshold", by_threshold)):
        right = int((c & answers).sum())
        out[name] = {"accuracy_answered": right / answered if answered else float("nan"),
                     "hallucination_rate": (answered - right) / n if n else float("nan")}
    out["declined_by_both"] = int((a & ~by_threshold).sum())
    return out


def declined_by_kind(abstained: Any, answerable: Any) -> tuple[float, float]:
    """(share of the samples of unanswerable items that decline, share of the samples of answerable items that
    decline); NaN where there is no sample of that kind."""
    a = np.asarray(abstained, dtype=bool).reshape(-1)
    can = np.asarray(answerable, dtype=bool).reshape(-1)
    if a.shape != can.shape:
        raise ValueError(f"abstained has {a.size} samples and answerable {can.size}")
    return (float(a[~can].mean()) if (~can).any() else float("nan"),
            float(a[can].mean()) if can.any() else float("nan"))


class RiskRegret(NamedTuple):
    """:func:`risk_threshold_regret`'s figures: means over prompts, and each prompt's regret."""

    utility: float
    optimum: float
    regret: float
    per_prompt: np.ndarray


def risk_threshold_regret(success: Any, abstained: Any, best: Any, prompt_index: Any, *,
                          threshold: float) -> RiskRegret:
    """A policy's expected reward under the risk-threshold reward at t = ``threshold`` (right 1, wrong -t / (1 - t),
    declining 0: :func:`calibrl.tasks.abstention.risk_threshold_reward`), from exact success probabilities, against
    the Bayes-optimal policy's (behaviorally calibrated RL, arXiv 2512.19920: answering pays iff P(right) > t)::

        u_i   = 0 if sample i declines, else (s_i - t) / (1 - t)     its expected reward (s_i: P(right))
        opt_x = max(0, (b_x - t) / (1 - t))                          the optimum on prompt x (b_x: its best answer's s)
        regret_x = opt_x - mean of u_i over the samples of prompt x  (>= 0 whenever b_x bounds every s_i)

    ``utility``, ``optimum`` and ``regret`` are means over prompts (each prompt weighs the same whatever its
    number of samples); ``per_prompt`` is regret_x in the order of the sorted prompt indices. Shapes: ``success``,
    ``abstained``, ``best`` (each sample's prompt's b_x), ``prompt_index`` [N]. A declining sample's ``success`` is
    not read."""
    t = float(threshold)
    if not 0.0 < t < 1.0:
        raise ValueError(f"risk_threshold_regret: threshold must be in (0, 1), got {threshold!r}")
    s = np.asarray(success, dtype=np.float64).reshape(-1)
    a = np.asarray(abstained, dtype=bool).reshape(-1)
    b = np.asarray(best, dtype=np.float64).reshape(-1)
    pid = np.asarray(prompt_index).reshape(-1)
    if not (s.shape == a.shape == b.shape == pid.shape):
        raise ValueError(f"success ({s.size}), abstained ({a.size}), best ({b.size}) and prompt_index ({pid.size}) "
                         "need one entry per sample")
    if s.size == 0:
        raise ValueError("risk_threshold_regret: no samples")
    utility = np.where(a, 0.0, (s - t) / (1.0 - t))
    _, group, counts = np.unique(pid, return_inverse=True, return_counts=True)
    mean_utility = np.bincount(group, weights=utility) / counts
    optimum = np.maximum(0.0, (np.bincount(group, weights=b) / counts - t) / (1.0 - t))
    per_prompt = optimum - mean_utility
    return RiskRegret(float(mean_utility.mean()), float(optimum.mean()), float(per_prompt.mean()), per_prompt)
