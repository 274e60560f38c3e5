"""The one table of metrics (name, title, axis label, short column title, direction, unit) and of confidence
sources (name, label, whether it is a probability), read by the eval report and figures, the training callback
and the testbed's reports.

Add a metric with :func:`register_metric`; look one up with :func:`metric` or :func:`higher_is_better` (which also
reads prefixed or derived keys such as ``eval_calibration/ece`` or ``decision_ece``). Add a confidence source with
:func:`register_confidence_source`: ``probability=False`` for a score that only ranks (a log-probability, an
entropy's negative, a DeepConf group confidence): it then gets AUROC and PRR but no ECE, smooth ECE or Brier, and
a blank in those columns of the report's table of confidence sources.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CONFIDENCE_SOURCES", "METRICS", "ConfidenceSource", "Metric", "confidence_source", "higher_is_better",
    "metric", "register_confidence_source", "register_metric",
]


@dataclass(frozen=True)
class Metric:
    """``title``: a figure's panel title; ``axis``: its y-axis label; ``short``: a table column's title;
    ``higher``: True when larger is better, False when smaller is, None when neither; ``unit``: what a value is."""

    name: str
    title: str
    axis: str
    short: str
    higher: bool | None
    unit: str = ""


METRICS: dict[str, Metric] = {}


def register_metric(name: str, title: str, axis: str, *, short: str | None = None, higher: bool | None,
                    unit: str = "", overwrite: bool = False) -> Metric:
    """Add ``name`` to :data:`METRICS` (a ``ValueError`` if it is there, unless ``overwrite``)."""
    if name in METRICS and not overwrite:
        raise ValueError(f"metric {name!r} is already registered (pass overwrite=True to replace it)")
    METRICS[name] = Metric(name, title, axis, short or name, higher, unit)
    return METRICS[name]


for _name, _title, _axis, _short, _higher, _unit in [
    ("accuracy", "Accuracy (drawn outcomes)", "accuracy", "accuracy (drawn)", True, "share"),
    ("expected_accuracy", "Accuracy (expected)", "mean true success probability", "accuracy (expected)", True,
     "share"),
    ("reasoning_accuracy", "Reasoning correct", "share of completions", "reasoning ok", True, "share"),
    ("auroc", "AUROC of sequence confidence", "AUROC (right vs wrong)", "AUROC seq. conf.", True, "probability"),
    ("auroc_per_prompt", "AUROC per prompt", "AUROC within a prompt", "AUROC per prompt", True, "probability"),
    ("auroc_ceiling", "AUROC ceiling (true probability)", "AUROC", "AUROC ceiling", None, "probability"),
    ("auroc_gap", "AUROC ceiling - AUROC", "AUROC gap", "ceiling − AUROC", False, "probability"),
    ("ece", "Expected calibration error", "ECE", "ECE", False, "probability"),
    ("smooth_ece", "Smooth ECE (kernel, no bins)", "smooth ECE", "smooth ECE", False, "probability"),
    ("prr", "Prediction-rejection ratio", "PRR (0 = random, 1 = oracle)", "PRR", True, "ratio"),
    ("brier", "Brier score", "Brier", "Brier", False, "squared probability"),
    ("nll", "Negative log-likelihood", "NLL", "NLL", False, "nats"),
    ("seq_ece", "ECE of sequence probability", "ECE (10 equal-width bins)", "ECE seq. prob.", False, "probability"),
    ("dec_ece", "ECE of decision token", "ECE (10 equal-count bins)", "decision ECE (eq.-count)", False,
     "probability"),
    ("calib_err", "Decision calibration error", "mean gap: decision probability vs true probability",
     "mean abs(q - p)", False, "probability"),
    ("dec_auroc", "AUROC of decision confidence", "AUROC (right vs wrong)", "AUROC decision conf.", True,
     "probability"),
    ("frac_conf_99", "Decisions above p = 0.99", "share of decisions", "frac. conf > 0.99", False, "share"),
    ("greedy_decision_accuracy", "Accuracy, argmax decision", "expected accuracy", "accuracy, argmax decision",
     True, "share"),
    ("aurc", "Area under the risk-coverage curve", "AURC", "AURC", False, "risk"),
    ("precision_at_50", "Precision at 50% coverage", "precision of the most confident half", "precision at 50%",
     True, "share"),
    ("entropy", "Entropy per token", "entropy (nats per token)", "entropy per token", None, "nats"),
    # prompt tiers of testbed tasks that have them (calibrl.testbed.tasks.prompt_tier)
    ("expected_accuracy_hard", "Accuracy on hard prompts", "mean true success probability", "accuracy (hard)", True,
     "share"),
    ("expected_accuracy_learnable", "Accuracy on learnable prompts", "mean true success probability",
     "accuracy (learnable)", True, "share"),
]:
    register_metric(_name, _title, _axis, short=_short, higher=_higher, unit=_unit)


def metric(name: str) -> Metric | None:
    """The registered metric ``name``, or None."""
    return METRICS.get(name)


def higher_is_better(key: str) -> bool:
    """Whether a larger value of ``key`` is better: the registered direction of ``key``, of its last ``/`` part,
    else of the longest registered name it contains (``decision_ece`` -> ``ece``: lower); True for other keys and
    for metrics that are neither."""
    base = key.rsplit("/", 1)[-1]
    found = METRICS.get(key) or METRICS.get(base)
    if found is None:
        inside = [m for name, m in METRICS.items() if name in base]
        found = max(inside, key=lambda m: len(m.name), default=None)
    return found is None or found.higher is not False


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
