"""The model's own abstentions: each sample is right, wrong, or abstained ("I don't know",
:mod:`calibrl.tasks.abstention`), and the figures the abstention papers report, over all N samples:

    answer rate            A / N                  A answered (not abstained)
    accuracy answered      R / A                  R right (an abstention is never right)
    hallucination rate     W / N                  W = A - R wrong answers
    accuracy/hallucination R / W                  behaviorally calibrated RL's ratio (arXiv 2512.19920)

and, where some items have no right answer (``answerable`` false), how often the model declines each kind
(:func:`declined_by_kind`): on the unanswerable items it should always; on the others, declining is a lost answer.

Also the comparison with a confidence threshold that answers as often (:func:`versus_threshold`): which wrong
answers does each avoid? Shapes: ``correct``, ``abstained``, ``score`` [N]; a sample both abstained and marked
correct counts as abstained.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["StatedAbstention", "declined_by_kind", "stated_abstention", "versus_threshold"]


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
