"""The demo's evaluation: sample held-out completions, score them exactly, compute the calibration metrics.

Evaluation (before training and every ``eval_every`` steps) samples ``eval_samples`` completions at T = 1 for
``eval_prompts`` held-out prompts, scores them exactly (:func:`calibrl.testbed.warmstart.sample_completions`) and draws
their outcomes from the true distribution with a FIXED stream (common random numbers across methods and steps).
``auroc_ceiling`` is the AUROC of the true success probability on the same samples: no confidence can beat it.
"""

from __future__ import annotations

import math

import numpy as np


def evaluate(model, tokenizer, task: str, prompts: list[str], p_true: list[float] | None = None, *,
             n: int = 8, seed: int = 1234) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Sample ``n`` completions per prompt and compute the demo's metrics.

    Returns ``(metrics, samples)``; ``samples`` holds per-completion arrays (confidences, drawn outcomes, true
    success probabilities) for reliability diagrams. Outcomes are drawn from the true distribution with a stream
    seeded by ``seed`` (common random numbers: the same uniforms for every method and step).
    """
    from calibrl import metrics as M
    from calibrl.testbed import tasks as tb
    from calibrl.testbed.warmstart import sample_completions

    spec = tb.get_task(task)
    class_ids = None
    if spec.classes:
        class_ids = [tokenizer.convert_tokens_to_ids(c) for c in spec.classes]
    res = sample_completions(model, tokenizer, prompts, n=n, max_new_tokens=spec.max_completion_length,
                             class_token_ids=class_ids, seed=seed)
    q = np.array([tb.true_success_probability(task, p, c) for p, c in zip(res["prompt"], res["completion"])])
    parsed = [tb.parse(task, p, c) for p, c in zip(res["prompt"], res["completion"])]
    reasoning_ok = np.array([x["reasoning_ok"] for x in parsed], dtype=bool)
    u = np.random.default_rng(seed).random(len(q))
    correct = u < q
    lpm = res["logprob_mean"]
    seq_prob = np.exp(lpm * res["n_tokens"])  # probability of the whole completion
    pid = res["prompt_index"]
    pp = M.per_prompt_auroc(lpm, correct, pid)
    out: dict[str, float] = {
        "accuracy": float(correct.mean()),
        "expected_accuracy": float(q.mean()),
        "reasoning_accuracy": float(reasoning_ok.mean()),
        "auroc": float(M.auroc(lpm, correct)),
        "auroc_per_prompt": float(pp[0]),
        "auroc_ceiling": float(M.auroc(q, correct)),
        "seq_ece": float(M.ece(seq_prob, correct, n_bins=10, strategy="uniform")),
        "mean_confidence": float(np.exp(lpm).mean()),
        # selective answering by the same confidence (the CAPO paper's precision-coverage claim): area under the
        # risk-coverage curve and the precision of the most confident half / quarter, on the drawn outcomes
        "aurc": float(M.aurc(lpm, correct)),
        **{f"precision_at_{int(c * 100)}": v for c, v in M.precision_at_coverage(lpm, correct, (0.25, 0.5)).items()},
        "entropy": token_entropy_estimate(lpm, res["n_tokens"]),
    }
    # tasks with prompt tiers (scratchpad, forms): the expected accuracy of each tier
    tiers = np.array([tb.prompt_tier(task, p) or "" for p in res["prompt"]])
    for tier in sorted(set(tiers.tolist()) - {""}):
        out[f"expected_accuracy_{tier}"] = float(q[tiers == tier].mean())
    # answers for answer selection (majority, PC, RPC): one id per distinct answer_key within the evaluation
    answer_id = np.unique(np.array(answer_keys(task, parsed), dtype=str), return_inverse=True)[1].reshape(-1)
    samples = {"prompt_index": pid, "logprob_mean": lpm, "seq_prob": seq_prob, "correct": correct, "q_true": q,
               "answer_id": answer_id.astype(np.int64), "completion": np.array(
                   [tb._completion(c) for c in res["completion"]], dtype=str)}
    if spec.classes:
        cp = res["class_probs"]  # [M, 2]: (Y, N)
        has = ~np.isnan(cp[:, 0])
        choice = np.array([x["choice"] for x in parsed], dtype=object)
        chosen = np.where(choice == spec.classes[0], 0, 1)
        conf = np.where(has, cp[np.arange(len(cp)), chosen], np.nan)
        ok = has & reasoning_ok
        p_y = np.array([tb.DECISION_P[tb._digit_sum(p) % 8] for p in res["prompt"]])
        d_conf, d_corr = conf[has], correct[has]
        out.update({
            "dec_ece": float(M.ece(d_conf, d_corr, n_bins=10, strategy="quantile")) if has.any() else math.nan,
            "dec_ece_uniform": float(M.ece(d_conf, d_corr, n_bins=10, strategy="uniform")) if has.any() else math.nan,
            "dec_auroc": float(M.auroc(d_conf, d_corr)) if has.any() else math.nan,
            "calib_err": float(np.abs(cp[ok, 0] - p_y[ok]).mean()) if ok.any() else math.nan,
            "frac_conf_99": float((d_conf > 0.99).mean()) if has.any() else math.nan,
            "dec_conf_mean": float(d_conf.mean()) if has.any() else math.nan,
            # accuracy of deciding by argmax q instead of sampling (sampling a calibrated decision costs accuracy)
            "greedy_decision_accuracy": greedy_decision_accuracy(cp[:, 0], p_y, q),
        })
        samples.update({"dec_conf": conf, "p_yes": cp[:, 0], "p_true_yes": p_y})
        out["ece"] = out["dec_ece"]
    else:
        out["ece"] = out["seq_ece"]
    return out, samples


# tasks whose reward needs the reasoning (the digit sum) right as well as the choice
_REASONING_GATED = ("decision", "decision_copy", "stochastic_reasoning", "verbalized")


def answer_keys(task: str, parsed: list[dict]) -> list[str]:
    """The answer of each parsed completion of ``task`` (:func:`calibrl.testbed.tasks.parse`), as a string that two
    completions share when the world treats them alike: ``"<choice>"``; on the tasks that also need the reasoning
    right, ``"x<choice>"`` when it is wrong (never rewarded, whatever it chose); ``"-"`` when nothing could be
    parsed. Completions with equal keys have equal true success probabilities, so the drawn outcomes of a voted
    answer's paths estimate that answer's success probability without bias."""
    from calibrl.testbed import tasks as tb

    gated = tb.get_task(task).name in _REASONING_GATED
    keys = []
    for x in parsed:
        if not x.get("format_ok") or x.get("choice") is None:
            keys.append("-")
        else:
            keys.append(("x" if gated and not x.get("reasoning_ok") else "") + str(x["choice"]))
    return keys


def greedy_decision_accuracy(p_yes: np.ndarray, p_true_yes: np.ndarray, q_true: np.ndarray) -> float:
    """Expected accuracy when each sampled completion's decision is replaced by argmax q (Y iff q(Y) >= 0.5):
    samples with a wrong sum or no decision (q_true == 0) count as wrong."""
    ok = (q_true > 0) & np.isfinite(p_yes)
    acc = np.where(p_yes >= 0.5, p_true_yes, 1.0 - p_true_yes)
    return float(np.where(ok, acc, 0.0).mean())


def token_entropy_estimate(logprob_mean, n_tokens) -> float:
    """Per-token entropy of the policy on its own samples, estimated by their mean negative log-prob over all
    sampled tokens: -sum_i n_i lpm_i / sum_i n_i (``logprob_mean`` [M] each completion's mean token log-prob,
    ``n_tokens`` [M] its tokens; 0 tokens in all: 0)."""
    n = np.asarray(n_tokens, dtype=np.float64)
    return float(-(np.asarray(logprob_mean, dtype=np.float64) * n).sum() / max(1.0, n.sum()))


def eval_prompts_for(task: str, n: int, *, split: str = "test") -> list[str]:
    """The ``n`` held-out prompts of ``task`` (``split``: test by default) every method is evaluated on (fixed
    seed: the same for all)."""
    from calibrl.testbed import tasks as tb

    return [r["prompt"] for r in tb.build_rows(task, n, split=split, seed=0)]


__all__ = ["answer_keys", "eval_prompts_for", "evaluate", "greedy_decision_accuracy", "token_entropy_estimate"]
