"""calibrl's calibration figures inside Inspect AI (``pip install "calibrl[inspect]"``; tested with inspect_ai
0.3.285; docs/inspect.md).

    from inspect_ai import Task
    from inspect_ai.scorer import match
    from calibrl.inspect import confidence_scorer

    Task(dataset=..., solver=..., scorer=confidence_scorer(match(), confidence="logprob_mean"))

Inspect then reports, beside the wrapped scorer's ``accuracy`` and ``stderr``, calibrl's ``ece``, ``smooth_ece``,
``brier``, ``auroc``, ``prr`` and ``aurc`` and the count ``no_confidence``, in its results and its log.

:func:`confidence_scorer` keeps the wrapped scorer's verdict (its Score, unchanged) and records in the Score's
metadata the sample's confidence (``calibrl_confidence``, a probability of being right), the value that ranks
it (``calibrl_score``) and where the confidence came from (``calibrl_confidence_source``). The confidence is, by name:

- ``"logprob_mean"``: exp of the mean token log-probability of the output's first choice (its score: the mean
  itself). The model must return log-probabilities: ``GenerateConfig(logprobs=True)`` (``--logprobs`` on Inspect's
  command line), on a provider that gives them.
- ``"stated"``: the confidence the output states in its last ``<confidence>x</confidence>`` tag
  (:func:`calibrl.tasks.verbalized.parse_verbalized_confidence`, the reader ``calibrl eval`` uses).
- or a function of the user's, ``TaskState -> float in [0, 1] or None`` (sync or async).

The metrics (also importable one by one, and registered in Inspect as ``calibrl/ece`` ... through the ``inspect_ai``
entry point) read those two values from each Score's metadata, so they serve any scorer that writes them. Each is
computed by :func:`calibrl.evaluation.scoring.confidence_figures`, the function of ``calibrl eval``'s table of
confidence sources, with its default 10 bins: the same samples give the same numbers. A sample counts as right
when its value converts to 1 (Inspect's ``CORRECT``, ``True``, ``1``); partial credit counts as wrong.

The metrics take every epoch's score (``scores="unreduced"``): each sampled answer is one sample, as in
``calibrl eval``, whatever the task's epoch reducer. A sample without a confidence (no log-probs, no tag, the
function returned None) is left out of the figures, counted by ``no_confidence``, and named in a warning; with
none at all the figures are NaN.
"""

from __future__ import annotations

import inspect as _pyinspect
import logging
import math
from collections.abc import Callable
from typing import Any

try:
    from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, accuracy, metric, scorer, stderr
    from inspect_ai.scorer import value_to_float
    from inspect_ai.solver import TaskState
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("calibrl.inspect needs Inspect AI: pip install \"calibrl[inspect]\"") from exc

from calibrl.tasks.verbalized import parse_verbalized_confidence

__all__ = ["CONFIDENCE_KEY", "FIGURES", "SCORE_KEY", "SOURCE_KEY", "aurc", "auroc", "brier", "confidence_scorer", "ece",
           "no_confidence", "prr", "smooth_ece"]

logger = logging.getLogger(__name__)

CONFIDENCE_KEY = "calibrl_confidence"  # Score.metadata: the sample's confidence, a probability in [0, 1]
SCORE_KEY = "calibrl_score"  # Score.metadata: the value AUROC, PRR and AURC rank (default: the confidence)
SOURCE_KEY = "calibrl_confidence_source"  # Score.metadata: "logprob_mean", "stated" or "function"
FIGURES = ("ece", "smooth_ece", "brier", "auroc", "prr", "aurc")  # the metrics confidence_scorer reports

_to_float = value_to_float()


# ------------------------------------------------------------------------------------------------ confidences
def _logprob_mean(state: TaskState) -> tuple[float, float] | None:
    """(exp of the mean token log-probability, the mean) of the output's first choice; None without log-probs."""
    choices = state.output.choices if state.output is not None else []
    logprobs = choices[0].logprobs if choices else None
    if logprobs is None or not logprobs.content:
        return None
    mean = math.fsum(t.logprob for t in logprobs.content) / len(logprobs.content)
    return math.exp(mean), mean


def _stated(state: TaskState) -> tuple[float, float] | None:
    stated = parse_verbalized_confidence(state.output.completion if state.output is not None else "")
    return None if stated is None else (stated, stated)


CONFIDENCES: dict[str, Callable[[TaskState], tuple[float, float] | None]] = {
    "logprob_mean": _logprob_mean,
    "stated": _stated,
}


async def _user_confidence(fn: Callable[[TaskState], Any], state: TaskState) -> tuple[float, float] | None:
    value = fn(state)
    if _pyinspect.isawaitable(value):
        value = await value
    if value is None:
        return None
    value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"calibrl.inspect: the confidence function {getattr(fn, '__name__', fn)!r} returned "
                         f"{value!r} for sample {state.sample_id!r}; a confidence is a probability in [0, 1] "
                         f"(or None when the sample has none)")
    return value, value


# ------------------------------------------------------------------------------------------------ metrics
def _arrays(scores: list[SampleScore]) -> tuple[list[float], list[float], list[bool], list[int], list[str],
                                                list[bool]]:
    """(confidence, score, correct, prompt index, ids of the samples without a confidence, whether the confidence
    is exp of the score, a mean log-probability) of ``scores``."""
    conf, rank, right, prompt, missing, from_logprobs = [], [], [], [], [], []
    prompts: dict[Any, int] = {}
    for item in scores:
        meta = item.score.metadata or {}
        value = meta.get(CONFIDENCE_KEY)
        if value is None:
            missing.append(str(item.sample_id))
            continue
        conf.append(float(value))
        score = meta.get(SCORE_KEY)  # absent or null (a scorer of the user's own): the confidence itself
        rank.append(float(value if score is None else score))
        right.append(_to_float(item.score.value) == 1.0)
        prompt.append(prompts.setdefault(item.sample_id, len(prompts)))
        from_logprobs.append(meta.get(SOURCE_KEY) == "logprob_mean")
    return conf, rank, right, prompt, missing, from_logprobs


def _figure(name: str, scores: list[SampleScore]) -> float:
    import numpy as np

    from calibrl.evaluation.scoring import confidence_figures

    conf, rank, right, prompt, missing, from_logprobs = _arrays(scores)
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        logger.warning("calibrl.inspect: %d of %d scores have no confidence (sample %s); %s is computed over the "
                       "other %d", len(missing), len(scores), shown, name, len(conf))
    if not conf:
        return float("nan")
    # a mean log-probability's confidence as calibrl eval computes it: numpy's exp over the array (math.exp, which
    # the scorer recorded, can differ from it in the last digit)
    conf = np.where(from_logprobs, np.exp(rank), conf)
    value = confidence_figures(conf, right, rank, prompt, only=(name,))[name]
    return float("nan") if value is None else float(value)


def _calibrl_metric(name: str) -> Callable[[], Metric]:
    """Inspect's metric ``name``: calibrl's declared metric of that name (its label and direction come from the
    declaration, calibrl.metrics.declared) over the scores' confidences."""
    from calibrl.metrics.registry import metric as declared

    found = declared(name)

    def factory() -> Metric:
        def compute(scores: list[SampleScore]) -> float:
            return _figure(name, scores)

        return compute

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = (f"{found.title} of the samples' confidences, as calibrl declares it; "
                       f"{'higher' if found.higher else 'lower'} is better (docs/metrics.md).")
    registered = metric(name=name, scores="unreduced")(factory)
    registered.__doc__ = factory.__doc__  # Inspect's wrapper does not carry it over
    return registered


ece = _calibrl_metric("ece")
smooth_ece = _calibrl_metric("smooth_ece")
brier = _calibrl_metric("brier")
auroc = _calibrl_metric("auroc")
prr = _calibrl_metric("prr")
aurc = _calibrl_metric("aurc")


@metric(scores="unreduced")
def no_confidence() -> Metric:
    """How many scores have no confidence (left out of calibrl's figures)."""

    def compute(scores: list[SampleScore]) -> int:
        return sum((item.score.metadata or {}).get(CONFIDENCE_KEY) is None for item in scores)

    return compute


# ------------------------------------------------------------------------------------------------ the scorer
@scorer(metrics=[accuracy(), stderr(), ece(), smooth_ece(), brier(), auroc(), prr(), aurc(), no_confidence()])
def confidence_scorer(base: Scorer | str = "match", confidence: str | Callable[[TaskState], Any] = "logprob_mean",
                      ) -> Scorer:
    """``base``'s verdict on each sample, with the sample's confidence recorded for calibrl's metrics.

    Args:
        base: any Inspect scorer (``match()``, ``choice()``, ``model_graded_qa()``, one of the user's), or its
            registered name with its defaults (``"match"``, ``"choice"``, ``"mypackage/myscorer"``: the form
            Inspect's command line passes, ``inspect score LOG --scorer calibrl/confidence_scorer -S base=match``);
            its Score is kept as it is, with two entries added to its metadata.
        confidence: ``"logprob_mean"`` (exp of the output's mean token log-probability; needs log-probs from
            the model), ``"stated"`` (the output's ``<confidence>x</confidence>``), or a function
            ``TaskState -> probability in [0, 1] or None``.
    """
    if isinstance(base, str):
        from inspect_ai.scorer._scorer import scorer_create  # what Inspect's own command line resolves names with

        base = scorer_create(base)
    if isinstance(confidence, str):
        if confidence not in CONFIDENCES:
            raise ValueError(f"confidence_scorer: unknown confidence {confidence!r}; the named ones are "
                             f"{sorted(CONFIDENCES)}, or pass a function TaskState -> float in [0, 1] or None")
        reader, source = CONFIDENCES[confidence], confidence

        async def read(state: TaskState) -> tuple[float, float] | None:
            return reader(state)
    elif callable(confidence):
        source = "function"

        async def read(state: TaskState) -> tuple[float, float] | None:
            return await _user_confidence(confidence, state)
    else:
        raise TypeError(f"confidence_scorer: confidence must be a name or a function, got {confidence!r}")

    async def score(state: TaskState, target: Target) -> Score:
        verdict = await base(state, target)
        if verdict is None:
            return verdict
        if isinstance(verdict.value, (dict, list)):
            raise ValueError(f"confidence_scorer: the wrapped scorer returned a {type(verdict.value).__name__} "
                             f"value for sample {state.sample_id!r}; calibration needs one right / wrong value")
        found = await read(state)
        extra: dict[str, Any] = {CONFIDENCE_KEY: None, SCORE_KEY: None, SOURCE_KEY: source}
        if found is not None:
            extra.update({CONFIDENCE_KEY: found[0], SCORE_KEY: found[1]})
        return verdict.model_copy(update={"metadata": {**(verdict.metadata or {}), **extra}})

    return score

