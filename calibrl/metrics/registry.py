"""Every metric is one declaration: its name, the arrays it needs, its direction, its labels and the function that
computes it. ``calibrl eval``, the training callback (:class:`calibrl.trl.CalibrationEvalCallback`), the training
telemetry (:mod:`calibrl.trl.telemetry`), the testbed's evaluation, the reports' tables and the figures all read
:data:`METRICS`; a metric added here (or in a user's file loaded as a plugin) appears in each of them whose inputs
it finds.

A metric receives the arrays it names in ``needs`` as keyword arguments (one entry per sample, numpy) plus any
setting its signature names (:data:`SETTINGS`, e.g. ``n_bins``) and returns a float (NaN: undefined on these
inputs; None: does not apply, left out)::

    from calibrl.metrics import register_metric

    @register_metric("overconfidence", higher=False, needs={"confidence", "correct"})
    def overconfidence(confidence, correct):
        return float(confidence.mean() - correct.mean())

Which contexts provide which inputs (:data:`INPUTS`): every context has ``correct`` and ``prompt_index``;
``confidence`` (a probability) and ``score`` (a ranking) come from ``calibrl eval`` (its main confidence, its
post-hoc calibrated one, each confidence source: a source that only ranks has a ``score`` and no ``confidence``),
the callback and the telemetry (exp of the mean token log-probability and the log-probability itself);
``decision_prob`` from decision tasks; ``p_true`` and the other truths only from the testbed.

Look a metric up with :func:`metric` or :func:`higher_is_better`: both read prefixed keys (``eval_calibration/ece``,
``calibration/auroc``) and a metric's older names (:attr:`Metric.aliases`), and an unknown key raises ``KeyError``:
the direction of a key is never guessed. A confidence source is declared with :func:`register_confidence_source`
(``probability=False`` for a score that only ranks: it then gets AUROC, PRR and AURC but no ECE, smooth ECE or
Brier, and a blank in those columns of the report's table of confidence sources).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibrl._registry import already_registered

__all__ = [
    "CONFIDENCE_SOURCES", "CONTEXTS", "INPUTS", "METRICS", "SETTINGS", "ConfidenceSource", "Metric", "MetricError",
    "MetricInputs", "compute_metrics", "confidence_source", "higher_is_better", "metric", "metrics_for", "record_value",
    "register_confidence_source", "register_metric",
]

# Where metrics are computed. A metric is computed in every context it lists whose inputs it finds.
CONTEXTS: dict[str, str] = {
    "eval": "calibrl eval, each input and scope: the main confidence (and the post-hoc calibrated one)",
    "sources": "calibrl eval's table of confidence sources: each source on the rows that have it",
    "callback": "CalibrationEvalCallback: held-out samples during training, logged as eval_calibration/<name>",
    "telemetry": "the training batches' rollouts, logged as calibration/<name>",
    "testbed": "the testbed's evaluations (calibrl demo and the studies)",
}

# The arrays a metric can need: [N], one entry per sample. The last group is derived once per computation from
# the others (a metric needing it shares the one sort or pass with every other metric that does).
INPUTS: dict[str, str] = {
    "correct": "[N] bool: the sample is right (for class_probs: the top class is the label)",
    "prompt_index": "[N] int in 0 .. G-1: the sample's prompt (a prompt's samples are one cluster)",
    "confidence": "[N] float in [0, 1]: the probability of being right the sample's confidence states",
    "score": "[N] float: the value the confidence ranks by, higher = surer (a log-probability, minus an entropy, "
             "or the confidence itself)",
    "decision_prob": "[N] float: the probability of the decided class, NaN where a completion has no decision",
    "logprob_mean": "[N] float: the mean token log-probability of the completion",
    "n_tokens": "[N] int: the completion's tokens",
    "abstained": "[N] bool: the sample declined to answer (\"I don't know\"; calibrl.tasks.abstention)",
    "answerable": "[N] bool: the item has a right answer (false: declining is the right response)",
    "sequence_probability": "[N] float: the probability of the whole completion, exp(sum of token log-probs)",
    # what only the testbed knows
    "p_true": "[N] float: the true probability that the sample is right (testbed)",
    "reasoning_ok": "[N] bool: the completion's reasoning is right (testbed)",
    "prompt_tier": "[N] str: the prompt's tier, '' for none (testbed tasks with easy and hard prompts)",
    "p_yes": "[N] float: the model's probability of the decision Y, NaN where none (testbed decision task)",
    "p_true_yes": "[N] float: the true probability that Y is right (testbed decision task)",
    # derived
    "ranking": "calibrl.metrics.RankingFigures of score vs correct (AUROC, AURC, PRR, precision at coverage)",
    "confidence_ranking": "RankingFigures of confidence vs correct (of score when there is no confidence): what "
                          "answering above a confidence threshold achieves",
    "per_prompt": "calibrl.metrics.PerPromptAUROC of score vs correct within each prompt",
}
SETTINGS: dict[str, str] = {"n_bins": "bins of a binned ECE (calibrl eval --n-bins, the callback's n_bins; 10)"}


class MetricError(ValueError):
    """A metric's declaration or computation failed; the message names the metric and where it was declared."""


def _derive_ranking(inputs: MetricInputs):
    from calibrl.metrics.rejection import ranking_figures

    return ranking_figures(inputs["score"], inputs["correct"])


def _derive_confidence_ranking(inputs: MetricInputs):
    """The ranking of the confidence: the score's when the confidence splits and orders the samples as the score
    does (the exp of distinct log-probabilities can round to one value), else its own sort."""
    from calibrl.metrics.rejection import ranking_figures

    if not inputs.has("confidence"):
        return inputs["ranking"]
    conf = inputs["confidence"]
    if inputs.has("score") and _orders_like(inputs["score"], conf, inputs["ranking"].levels):
        return inputs["ranking"]
    return ranking_figures(conf, inputs["correct"])


def _orders_like(score: np.ndarray, conf: np.ndarray, levels: np.ndarray) -> bool:
    """Whether ``conf`` [N] splits and orders the samples exactly as ``score`` [N] (distinct values ``levels``,
    highest first) does: it equals the score, or is exp(score) with every level still distinct."""
    if np.array_equal(conf, score):
        return True
    return np.array_equal(conf, np.exp(score)) and bool(np.all(np.diff(np.exp(levels)) < 0))


def _derive_per_prompt(inputs: MetricInputs):
    from calibrl.metrics.calibration import per_prompt_auroc

    return per_prompt_auroc(inputs["score"], inputs["correct"], inputs["prompt_index"])


# derived input -> (what it is computed from: all of them, or any one of them with "|"; its function)
_DERIVED: dict[str, tuple[str, Callable[[MetricInputs], Any]]] = {
    "ranking": ("score correct", _derive_ranking),
    "confidence_ranking": ("confidence|score correct", _derive_confidence_ranking),
    "per_prompt": ("score correct prompt_index", _derive_per_prompt),
}


class MetricInputs:
    """The arrays of one computation (:data:`INPUTS`; None or absent: not available) and its settings; derived
    inputs are computed on first use and kept, so metrics sharing one (AUROC, PRR, AURC share ``ranking``) pay for
    it once."""

    def __init__(self, arrays: Mapping[str, Any], settings: Mapping[str, Any] | None = None):
        unknown = sorted(set(arrays) - set(INPUTS))
        if unknown:
            raise MetricError(f"unknown metric input(s) {unknown}; inputs are {sorted(INPUTS)}")
        self._given = {k: v for k, v in arrays.items() if v is not None and k not in _DERIVED}
        self._derived: dict[str, Any] = {}
        self.settings = dict(settings or {})

    def has(self, name: str) -> bool:
        if name in self._given or name in self._derived:
            return True
        if name not in _DERIVED:
            return False
        needs, _ = _DERIVED[name]
        return all(any(self.has(alt) for alt in group.split("|")) for group in needs.split())

    def __getitem__(self, name: str) -> Any:
        if name in self._given:
            return self._given[name]
        if name not in self._derived:
            if not self.has(name):
                raise KeyError(name)
            self._derived[name] = _DERIVED[name][1](self)
        return self._derived[name]


@dataclass(frozen=True)
class Metric:
    """One metric (module docstring).

    ``fn``: computes it from the arrays in ``needs`` (keyword arguments) and the settings its signature names;
    ``higher``: True when larger is better, False when smaller is, None when neither (a count, an entropy);
    ``label``: its row in ``calibrl eval``'s report; ``title`` and ``axis``: a figure's panel title and y label;
    ``short``: a compact table column's title; ``unit``: what a value is; ``contexts``: where it is computed
    (:data:`CONTEXTS`); ``aliases``: older names that resolve to it (records written under them)."""

    name: str
    fn: Callable[..., Any]
    needs: frozenset[str]
    higher: bool | None
    label: str
    title: str
    axis: str
    short: str
    unit: str = ""
    contexts: frozenset[str] = frozenset(CONTEXTS)
    aliases: tuple[str, ...] = ()
    settings: tuple[str, ...] = field(default=(), repr=False)

    def applies(self, inputs: MetricInputs) -> bool:
        """Whether ``inputs`` hold everything this metric needs."""
        return all(inputs.has(n) for n in self.needs)

    def compute(self, inputs: MetricInputs | Mapping[str, Any], **settings: Any) -> float | None:
        """The metric on ``inputs`` (a :class:`MetricInputs` or a mapping of arrays): a float (NaN when undefined;
        an int when the function counts) or None when it does not apply to them. A failure names the metric and the file that declared it."""
        if not isinstance(inputs, MetricInputs):
            inputs = MetricInputs(inputs, settings)
        missing = [n for n in sorted(self.needs) if not inputs.has(n)]
        if missing:
            raise MetricError(f"metric {self.name!r} needs {missing}, which these inputs do not have")
        kwargs = {n: inputs[n] for n in self.needs}
        kwargs.update({s: {**inputs.settings, **settings}[s] for s in self.settings
                       if s in inputs.settings or s in settings})
        try:
            value = self.fn(**kwargs)
        except Exception as exc:  # noqa: BLE001 - a user's metric may raise anything; say whose it is
            raise MetricError(f"metric {self.name!r} ({_where(self.fn)}) failed: {type(exc).__name__}: {exc}") from exc
        if value is None:
            return None
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise MetricError(f"metric {self.name!r} ({_where(self.fn)}) returned {type(value).__name__} "
                              f"{value!r}; a metric returns a float (NaN when undefined, None when it does not apply)")
        return int(value) if isinstance(value, (int, np.integer)) else float(value)  # a count stays a count


def _where(fn: Callable) -> str:
    code = getattr(fn, "__code__", None)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}" + (
        f", {code.co_filename}:{code.co_firstlineno}" if code else "")


METRICS: dict[str, Metric] = {}
_ALIASES: dict[str, str] = {}  # older name -> metric name


def register_metric(name: str, fn: Callable[..., Any] | None = None, *, higher: bool | None,
                    needs: Iterable[str], label: str | None = None, title: str | None = None,
                    axis: str | None = None, short: str | None = None, unit: str = "",
                    contexts: Iterable[str] | None = None, aliases: Iterable[str] = (),
                    overwrite: bool = False):
    """Declare metric ``name`` (module docstring): as a decorator over ``fn`` (``@register_metric(name,
    higher=..., needs={...})``) or called with ``fn``. Labels default to the name; ``contexts`` to all of
    :data:`CONTEXTS`. A taken name raises unless ``overwrite`` (the same function loaded twice is kept)."""
    needs = frozenset(needs)
    unknown = sorted(needs - set(INPUTS))
    if unknown:
        raise MetricError(f"metric {name!r} needs unknown input(s) {unknown}; inputs are {sorted(INPUTS)}")
    contexts = frozenset(CONTEXTS if contexts is None else contexts)
    if contexts - set(CONTEXTS):
        raise MetricError(f"metric {name!r}: unknown context(s) {sorted(contexts - set(CONTEXTS))}; contexts are "
                          f"{list(CONTEXTS)}")
    if higher not in (True, False, None):
        raise MetricError(f"metric {name!r}: higher must be True, False or None, got {higher!r}")

    def decorator(function: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(function):
            raise MetricError(f"metric {name!r}: its function must be callable, got {function!r}")
        params = inspect.signature(function).parameters
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        absent = sorted(n for n in needs if n not in params and not accepts_any)
        if absent:
            raise MetricError(f"metric {name!r} ({_where(function)}) needs {absent} but its function takes no "
                              f"such argument (it receives each input it needs by keyword)")
        settings = tuple(s for s in SETTINGS if s in params)
        current = METRICS.get(name)
        if already_registered(current.fn if current else None, function, kind="metric", name=name,
                              overwrite=overwrite):
            return function
        for alias in aliases:
            if alias in METRICS or _ALIASES.get(alias, name) != name:
                raise MetricError(f"metric {name!r}: alias {alias!r} already names another metric")
        METRICS[name] = Metric(name, function, needs, higher, label or name, title or label or name,
                               axis or name, short or name, unit, contexts, tuple(aliases), settings)
        _ALIASES.update(dict.fromkeys(aliases, name))
        return function

    return decorator if fn is None else decorator(fn)


def _resolve(key: str) -> Metric | None:
    for candidate in (key, key.rsplit("/", 1)[-1]):
        found = METRICS.get(candidate) or METRICS.get(_ALIASES.get(candidate, ""))
        if found is not None:
            return found
    return None


def metric(key: str) -> Metric:
    """The declaration of ``key``: a metric's name, one of its aliases, or a key logged with a prefix
    (``eval_calibration/ece``, ``calibration/auroc``); ``KeyError`` for anything else."""
    found = _resolve(key)
    if found is None:
        raise KeyError(f"{key!r} is not a declared metric (calibrl.metrics.METRICS: {', '.join(sorted(METRICS))})")
    return found


def higher_is_better(key: str) -> bool:
    """Whether a larger value of ``key`` (resolved by :func:`metric`) is better; ``KeyError`` for a key that is not
    a declared metric and ``ValueError`` for one that is neither better higher nor lower (a count, an entropy)."""
    found = metric(key)
    if found.higher is None:
        raise ValueError(f"metric {found.name!r} is neither better higher nor lower")
    return found.higher


def record_value(record: Mapping[str, Any], key: str) -> Any:
    """``record[key]``, or the value a record written before a rename holds under one of the metric's aliases
    (None when neither is there)."""
    if key in record:
        return record[key]
    found = _resolve(key)
    return next((record[a] for a in (found.name, *found.aliases) if a in record), None) if found else None


def metrics_for(context: str) -> list[Metric]:
    """The metrics computed in ``context`` (:data:`CONTEXTS`), in declaration order."""
    if context not in CONTEXTS:
        raise ValueError(f"unknown context {context!r}; contexts are {list(CONTEXTS)}")
    return [m for m in METRICS.values() if context in m.contexts]


def compute_metrics(context: str, inputs: MetricInputs | Mapping[str, Any], *,
                    settings: Mapping[str, Any] | None = None,
                    where: Callable[[Metric], bool] | None = None) -> dict[str, float]:
    """``{name: value}`` of every metric of ``context`` whose inputs ``inputs`` hold (and that ``where`` accepts),
    in declaration order (NaN: undefined; metrics that return None are left out)."""
    if not isinstance(inputs, MetricInputs):
        inputs = MetricInputs(inputs, settings)
    out: dict[str, float] = {}
    for m in metrics_for(context):
        if (where is None or where(m)) and m.applies(inputs):
            value = m.compute(inputs)
            if value is not None:
                out[m.name] = value
    return out


def finite_or_none(value: float | None) -> float | None:
    """JSON-friendly: NaN and infinities as None."""
    return None if value is None or not math.isfinite(value) else float(value)


@dataclass(frozen=True)
class ConfidenceSource:
    """A confidence a samples file can carry or calibrl derives. ``probability``: its values are probabilities
    of being right in [0, 1] (calibration metrics apply); otherwise it only ranks (higher = surer)."""

    name: str
    label: str
    probability: bool


CONFIDENCE_SOURCES: dict[str, ConfidenceSource] = {}


def register_confidence_source(name: str, label: str, *, probability: bool,
                               overwrite: bool = False) -> ConfidenceSource:
    """Add ``name`` to :data:`CONFIDENCE_SOURCES` (a ``ValueError`` if it is there, unless ``overwrite``)."""
    if name in CONFIDENCE_SOURCES and not overwrite:
        raise ValueError(f"confidence source {name!r} is already registered (pass overwrite=True to replace it)")
    CONFIDENCE_SOURCES[name] = ConfidenceSource(name, label, bool(probability))
    return CONFIDENCE_SOURCES[name]


for _name, _label, _prob in [
    ("logprob_mean", "exp(mean token log-probability)", True),
    ("decision_prob", "decision-token probability", True),
    ("class_probs", "top class probability", True),
    ("verbalized_confidence", "verbalized confidence", True),
    ("answer_consistency", "share of the prompt's samples giving the same answer", True),
    ("semantic_entropy", "minus the semantic entropy of the prompt's answers (ranks only)", False),
    # INTUITOR's mean KL(uniform || next-token distribution) (calibrl.self_certainty): >= 0, unbounded, ranks only
    ("self_certainty", "self-certainty, mean KL(uniform || next-token distribution) (ranks only)", False),
    # DeepConf's trace signals of token_confidence (calibrl.selection.deepconf): rankings, no probabilities
    ("deepconf_mean", "DeepConf mean token confidence (ranks only)", False),
    ("deepconf_tail", "DeepConf tail confidence (ranks only)", False),
    ("deepconf_bottom10", "DeepConf bottom-10% window confidence (ranks only)", False),
    ("deepconf_min", "DeepConf lowest window confidence (ranks only)", False),
]:
    register_confidence_source(_name, _label, probability=_prob)


def confidence_source(name: str) -> ConfidenceSource:
    """The registered source ``name``; an unknown name counts as a ranking-only score."""
    return CONFIDENCE_SOURCES.get(name) or ConfidenceSource(name, name, False)


from calibrl.metrics import declared as _declared  # noqa: E402,F401  (the built-in declarations)
