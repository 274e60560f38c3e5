"""calibrl's own metrics, each one declaration (:func:`calibrl.metrics.registry.register_metric`): the function,
what it needs, its direction, its labels and where it is computed. Definitions (binning, ties) are in
docs/metrics.md; the functions they call live in this package's metric modules.

Declaration order is the order of ``calibrl eval``'s report rows and of ``metrics.json``.
"""

from __future__ import annotations

import numpy as np

from calibrl.metrics import abstention as _abstention
from calibrl.metrics import accuracy as _accuracy
from calibrl.metrics import calibration as _calibration
from calibrl.metrics import smooth as _smooth
from calibrl.metrics import stated_abstention as _stated
from calibrl.metrics.registry import register_metric

_EVAL = ("eval",)
_OWN_ABSTENTION = ("eval", "callback")  # the model's own "I don't know", read from its text
_ALL = ("eval", "sources", "callback", "telemetry", "testbed")


# ---------------------------------------------------------------------------------------------------- accuracy
@register_metric("accuracy", higher=True, needs={"correct", "prompt_index"}, contexts=("eval", "callback",
                 "telemetry", "testbed"), label="accuracy (mean@k = pass@1)", title="Accuracy (drawn outcomes)",
                 axis="accuracy", short="accuracy (drawn)", unit="share")
def accuracy(correct, prompt_index):
    """mean@k: the mean over prompts of each prompt's fraction of right samples (:func:`calibrl.metrics.mean_at_k`;
    with equal counts per prompt, the plain mean)."""
    return _accuracy.mean_at_k(correct, prompt_index)


@register_metric("expected_accuracy", higher=True, needs={"p_true"}, contexts=("testbed",),
                 title="Accuracy (expected)", axis="mean true success probability", short="accuracy (expected)",
                 unit="share")
def expected_accuracy(p_true):
    """Mean true success probability: the accuracy without the noise of drawing outcomes."""
    return float(np.mean(p_true))


def _tier_accuracy(tier: str):
    def tier_accuracy(p_true, prompt_tier):
        rows = np.asarray(prompt_tier) == tier
        return float(np.mean(np.asarray(p_true)[rows])) if rows.any() else None  # None: the task has no such tier

    tier_accuracy.__qualname__ = f"expected_accuracy_{tier}"
    return tier_accuracy


# the prompt tiers of the testbed's tasks (calibrl.testbed.tasks: SCRATCHPAD_TIERS, FORMS_TIERS)
TESTBED_TIERS = ("easy", "medium", "hard", "learnable", "noise")
for _tier in TESTBED_TIERS:
    register_metric(f"expected_accuracy_{_tier}", _tier_accuracy(_tier), higher=True, needs={"p_true", "prompt_tier"},
                    contexts=("testbed",), title=f"Accuracy on {_tier} prompts", axis="mean true success probability",
                    short=f"accuracy ({_tier})", unit="share")


@register_metric("reasoning_accuracy", higher=True, needs={"reasoning_ok"}, contexts=("testbed",),
                 title="Reasoning correct", axis="share of completions", short="reasoning ok", unit="share")
def reasoning_accuracy(reasoning_ok):
    return float(np.mean(reasoning_ok))


# ---------------------------------------------------------------------------------- the model's own abstentions
@register_metric("answer_rate", higher=None, needs={"correct", "abstained"}, contexts=_OWN_ABSTENTION,
                 label="answer rate (not \"I don't know\")", title="Answer rate", axis="share of samples answered",
                 short="answer rate", unit="share")
def answer_rate(correct, abstained):
    """The share of samples the model answers (:func:`calibrl.metrics.stated_abstention.stated_abstention`)."""
    return _stated.stated_abstention(correct, abstained).answer_rate


@register_metric("accuracy_answered", higher=True, needs={"correct", "abstained"}, contexts=_OWN_ABSTENTION,
                 label="accuracy among answered", title="Accuracy among answered", axis="share right of answered",
                 short="accuracy (answered)", unit="share")
def accuracy_answered(correct, abstained):
    return _stated.stated_abstention(correct, abstained).accuracy_answered


@register_metric("hallucination_rate", higher=False, needs={"correct", "abstained"}, contexts=_OWN_ABSTENTION,
                 label="hallucination rate (wrong of all)", title="Hallucination rate",
                 axis="share of samples answered wrong", short="hallucination", unit="share")
def hallucination_rate(correct, abstained):
    return _stated.stated_abstention(correct, abstained).hallucination_rate


@register_metric("accuracy_hallucination_ratio", higher=True, needs={"correct", "abstained"}, contexts=_OWN_ABSTENTION,
                 label="right / wrong answers", title="Accuracy-to-hallucination ratio", axis="right / wrong answers",
                 short="right / wrong", unit="ratio")
def accuracy_hallucination_ratio(correct, abstained):
    """Right answers over wrong ones (behaviorally calibrated RL's ratio)."""
    return _stated.stated_abstention(correct, abstained).accuracy_hallucination_ratio


@register_metric("declined_unanswerable", higher=True, needs={"abstained", "answerable"}, contexts=_OWN_ABSTENTION,
                 label="declines unanswerable items", title="Declining the unanswerable",
                 axis="share of unanswerable items' samples declined", short="declines unanswerable", unit="share")
def declined_unanswerable(abstained, answerable):
    """The share of the samples of items with no right answer that say "I don't know" (the refusal rate of "The
    Hallucination Tax", arXiv 2505.13988)."""
    return _stated.declined_by_kind(abstained, answerable)[0]


@register_metric("declined_answerable", higher=False, needs={"abstained", "answerable"}, contexts=_OWN_ABSTENTION,
                 label="declines answerable items", title="Declining the answerable",
                 axis="share of answerable items' samples declined", short="declines answerable", unit="share")
def declined_answerable(abstained, answerable):
    """The share of the samples of items that have a right answer that say "I don't know" (answers lost)."""
    return _stated.declined_by_kind(abstained, answerable)[1]


# ---------------------------------------------------------------------------------------------------- ranking
@register_metric("auroc", higher=True, needs={"ranking"}, contexts=_ALL, label="AUROC (pooled)",
                 title="AUROC of sequence confidence", axis="AUROC (right vs wrong)", short="AUROC",
                 unit="probability")
def auroc(ranking):
    """Pooled AUROC of the score (:func:`calibrl.metrics.auroc`, ties counted half)."""
    return ranking.auroc


@register_metric("auroc_per_prompt", higher=True, needs={"per_prompt"}, contexts=("eval", "callback", "telemetry",
                 "testbed"), aliases=("per_prompt_auroc",), label="AUROC (mean per prompt)",
                 title="AUROC per prompt", axis="AUROC within a prompt", short="AUROC per prompt",
                 unit="probability")
def auroc_per_prompt(per_prompt):
    """Mean within-prompt AUROC over the prompts with both outcomes (:func:`calibrl.metrics.per_prompt_auroc`)."""
    return per_prompt.mean


@register_metric("auroc_n_prompts", higher=None, needs={"per_prompt"}, contexts=("eval", "callback", "telemetry"),
                 label="prompts in the per-prompt AUROC", title="Prompts with both outcomes", axis="prompts",
                 short="prompts (per-prompt AUROC)", unit="prompts")
def auroc_n_prompts(per_prompt):
    """The prompts with both right and wrong samples, the ones ``auroc_per_prompt`` averages."""
    return per_prompt.n_prompts


@register_metric("auroc_ceiling", higher=None, needs={"p_true", "correct"}, contexts=("testbed",),
                 title="AUROC ceiling (true probability)", axis="AUROC", short="AUROC ceiling", unit="probability")
def auroc_ceiling(p_true, correct):
    """AUROC of the true success probability on the same drawn outcomes: no confidence can beat it."""
    return _calibration.auroc(p_true, correct)


@register_metric("auroc_gap", higher=False, needs={"p_true", "correct", "ranking"}, contexts=(),
                 title="AUROC ceiling - AUROC", axis="AUROC gap", short="ceiling − AUROC", unit="probability")
def auroc_gap(p_true, correct, ranking):
    """How far the confidence is from the best possible ranking (the testbed's report derives it from its records'
    ``auroc_ceiling`` and ``auroc``)."""
    return _calibration.auroc(p_true, correct) - ranking.auroc


# ---------------------------------------------------------------------------------------------------- calibration
@register_metric("ece", higher=False, needs={"confidence", "correct"}, contexts=("eval", "sources", "callback"),
                 label="ECE (uniform bins)", title="Expected calibration error", axis="ECE", short="ECE",
                 unit="probability")
def ece(confidence, correct, n_bins=10):
    """ECE with ``n_bins`` equal-width bins (:func:`calibrl.metrics.ece`)."""
    return _calibration.ece(confidence, correct, n_bins=n_bins, strategy="uniform")


@register_metric("ece_quantile", higher=False, needs={"confidence", "correct"}, contexts=_EVAL,
                 label="ECE (equal-count bins)", title="ECE (equal-count bins)", axis="ECE (equal-count bins)",
                 short="ECE (eq.-count)", unit="probability")
def ece_quantile(confidence, correct, n_bins=10):
    return _calibration.ece(confidence, correct, n_bins=n_bins, strategy="quantile")


@register_metric("smooth_ece", higher=False, needs={"confidence", "correct"}, contexts=("eval", "sources",
                 "callback"), label="smooth ECE (kernel, no bins)", title="Smooth ECE (kernel, no bins)",
                 axis="smooth ECE", short="smooth ECE", unit="probability")
def smooth_ece(confidence, correct):
    """Smooth ECE (Blasiok and Nakkiran 2023; :func:`calibrl.metrics.smooth_ece`)."""
    return _smooth.smooth_ece(confidence, correct)


@register_metric("prr", higher=True, needs={"ranking"}, contexts=("eval", "sources", "callback"),
                 label="PRR (0 = random, 1 = oracle)", title="Prediction-rejection ratio",
                 axis="PRR (0 = random, 1 = oracle)", short="PRR", unit="ratio")
def prr(ranking):
    """Prediction-rejection ratio of the score (:func:`calibrl.metrics.prr`)."""
    return ranking.prr


@register_metric("mce", higher=False, needs={"confidence", "correct"}, contexts=_EVAL, label="MCE",
                 title="Maximum calibration error", axis="MCE", short="MCE", unit="probability")
def mce(confidence, correct, n_bins=10):
    return _calibration.mce(confidence, correct, n_bins=n_bins, strategy="uniform")


@register_metric("brier", higher=False, needs={"confidence", "correct"}, contexts=("eval", "sources"), label="Brier",
                 title="Brier score", axis="Brier", short="Brier", unit="squared probability")
def brier(confidence, correct):
    return _calibration.brier(confidence, correct)


@register_metric("nll", higher=False, needs={"confidence", "correct"}, contexts=_EVAL, label="NLL",
                 title="Negative log-likelihood", axis="NLL", short="NLL", unit="nats")
def nll(confidence, correct):
    return _calibration.nll(confidence, correct)


@register_metric("aurc", higher=False, needs={"confidence_ranking"}, contexts=("eval", "sources", "callback",
                 "testbed"), label="AURC (lower is better)", title="Area under the risk-coverage curve", axis="AURC",
                 short="AURC", unit="risk")
def aurc(confidence_ranking):
    """Area under the risk-coverage curve of answering above a confidence threshold (:func:`calibrl.metrics.aurc`)."""
    return confidence_ranking.aurc


@register_metric("mean_confidence", higher=None, needs={"confidence"}, contexts=("eval", "sources", "callback",
                 "testbed"),
                 aliases=("confidence_mean",), label="mean confidence", title="Mean confidence",
                 axis="mean confidence", short="mean confidence", unit="probability")
def mean_confidence(confidence):
    return float(np.mean(confidence))


@register_metric("precision_at_25", higher=True, needs={"score", "correct"}, contexts=("testbed",),
                 title="Precision at 25% coverage", axis="precision of the most confident quarter",
                 short="precision at 25%", unit="share")
def precision_at_25(score, correct):
    return _abstention.precision_at_coverage(score, correct, (0.25,))[0.25]


@register_metric("precision_at_50", higher=True, needs={"score", "correct"}, contexts=("testbed",),
                 title="Precision at 50% coverage", axis="precision of the most confident half",
                 short="precision at 50%", unit="share")
def precision_at_50(score, correct):
    return _abstention.precision_at_coverage(score, correct, (0.5,))[0.5]


# ------------------------------------------------------------------------------------------ the training batch
@register_metric("confidence_correct", higher=None, needs={"confidence", "correct"}, contexts=("telemetry",),
                 title="Confidence of right completions", axis="mean confidence", unit="probability")
def confidence_correct(confidence, correct):
    """Mean confidence of the right samples (NaN when none)."""
    return float(confidence[correct].mean()) if correct.any() else float("nan")


@register_metric("confidence_wrong", higher=None, needs={"confidence", "correct"}, contexts=("telemetry",),
                 title="Confidence of wrong completions", axis="mean confidence", unit="probability")
def confidence_wrong(confidence, correct):
    return float(confidence[~correct].mean()) if (~correct).any() else float("nan")


@register_metric("confidence_gap", higher=True, needs={"confidence", "correct"}, contexts=("telemetry",),
                 title="Confidence gap (right - wrong)", axis="mean confidence, right - wrong", unit="probability")
def confidence_gap(confidence, correct):
    """Mean confidence of the right samples minus that of the wrong ones."""
    return confidence_correct(confidence, correct) - confidence_wrong(confidence, correct)


@register_metric("mixed_group_fraction", higher=None, needs={"correct", "prompt_index"}, contexts=("telemetry",),
                 title="Prompts with both outcomes", axis="share of prompts", unit="share")
def mixed_group_fraction(correct, prompt_index):
    """The share of prompts whose samples are neither all right nor all wrong (the ones group advantages learn
    from)."""
    n, c = _accuracy.per_prompt_counts(correct, prompt_index)
    return float(((c > 0) & (c < n)).mean())


# ---------------------------------------------------------------------------------------------------- decisions
def _decided(decision_prob, correct):
    keep = np.isfinite(decision_prob)
    return decision_prob[keep], np.asarray(correct, dtype=bool)[keep]


@register_metric("decision_ece", higher=False, needs={"decision_prob", "correct"}, contexts=("callback", "telemetry",
                 "testbed"), aliases=("dec_ece",), title="ECE of decision token", axis="ECE (10 equal-count bins)",
                 short="decision ECE (eq.-count)", unit="probability")
def decision_ece(decision_prob, correct, n_bins=10):
    """ECE of the decided class's probability, equal-count bins (as arXiv 2601.13284 reports); rows without a
    decision are left out (NaN when none has one)."""
    p, y = _decided(decision_prob, correct)
    return _calibration.ece(p, y, n_bins=min(n_bins, p.size), strategy="quantile") if p.size else float("nan")


@register_metric("decision_ece_uniform", higher=False, needs={"decision_prob", "correct"}, contexts=("testbed",),
                 aliases=("dec_ece_uniform",), title="ECE of decision token (equal-width bins)",
                 axis="ECE (10 equal-width bins)", short="decision ECE (uniform)", unit="probability")
def decision_ece_uniform(decision_prob, correct, n_bins=10):
    p, y = _decided(decision_prob, correct)
    return _calibration.ece(p, y, n_bins=n_bins, strategy="uniform") if p.size else float("nan")


@register_metric("decision_auroc", higher=True, needs={"decision_prob", "correct"}, contexts=("testbed",),
                 aliases=("dec_auroc",), title="AUROC of decision confidence", axis="AUROC (right vs wrong)",
                 short="AUROC decision conf.", unit="probability")
def decision_auroc(decision_prob, correct):
    p, y = _decided(decision_prob, correct)
    return _calibration.auroc(p, y) if p.size else float("nan")


@register_metric("decision_prob_mean", higher=None, needs={"decision_prob"}, contexts=("callback", "telemetry",
                 "testbed"), aliases=("dec_conf_mean",), title="Mean decision probability",
                 axis="mean probability of the decided class", short="mean decision prob.", unit="probability")
def decision_prob_mean(decision_prob):
    p = decision_prob[np.isfinite(decision_prob)]
    return float(p.mean()) if p.size else float("nan")


@register_metric("decision_frac_above_099", higher=False, needs={"decision_prob"}, contexts=("callback",
                 "telemetry", "testbed"), aliases=("frac_conf_99",), title="Decisions above p = 0.99",
                 axis="share of decisions", short="frac. conf > 0.99", unit="share")
def decision_frac_above_099(decision_prob):
    """The share of decisions made with probability above 0.99 (RLVR's overconfidence symptom)."""
    p = decision_prob[np.isfinite(decision_prob)]
    return float((p > 0.99).mean()) if p.size else float("nan")


@register_metric("calib_err", higher=False, needs={"p_yes", "p_true_yes", "reasoning_ok"}, contexts=("testbed",),
                 title="Decision calibration error", axis="mean gap: decision probability vs true probability",
                 short="mean abs(q - p)", unit="probability")
def calib_err(p_yes, p_true_yes, reasoning_ok):
    """Mean |q(Y) - p(Y)| over completions with a decision and right reasoning (NaN when none)."""
    ok = np.isfinite(p_yes) & np.asarray(reasoning_ok, dtype=bool)
    return float(np.abs(p_yes[ok] - p_true_yes[ok]).mean()) if ok.any() else float("nan")


@register_metric("greedy_decision_accuracy", higher=True, needs={"p_yes", "p_true_yes", "p_true"},
                 contexts=("testbed",), title="Accuracy, argmax decision", axis="expected accuracy",
                 short="accuracy, argmax decision", unit="share")
def greedy_decision_accuracy(p_yes, p_true_yes, p_true):
    """Expected accuracy when each completion's decision is replaced by argmax q (Y iff q(Y) >= 0.5): completions
    with a wrong sum or no decision (``p_true`` 0) count as wrong."""
    ok = (p_true > 0) & np.isfinite(p_yes)
    acc = np.where(p_yes >= 0.5, p_true_yes, 1.0 - p_true_yes)
    return float(np.where(ok, acc, 0.0).mean())


# ---------------------------------------------------------------------------------------------------- testbed
@register_metric("seq_ece", higher=False, needs={"sequence_probability", "correct"}, contexts=("testbed",),
                 title="ECE of sequence probability", axis="ECE (10 equal-width bins)", short="ECE seq. prob.",
                 unit="probability")
def seq_ece(sequence_probability, correct):
    return _calibration.ece(sequence_probability, correct, n_bins=10, strategy="uniform")


@register_metric("entropy", higher=None, needs={"logprob_mean", "n_tokens"}, contexts=("testbed",),
                 title="Entropy per token", axis="entropy (nats per token)", short="entropy per token", unit="nats")
def entropy(logprob_mean, n_tokens):
    """The policy's per-token entropy on its own samples, estimated by their mean negative log-prob over all sampled
    tokens: -sum_i n_i lpm_i / sum_i n_i (0 tokens in all: 0)."""
    n = np.asarray(n_tokens, dtype=np.float64)
    return float(-(np.asarray(logprob_mean, dtype=np.float64) * n).sum() / max(1.0, n.sum()))
