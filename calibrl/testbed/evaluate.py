"""The demo's evaluation: sample held-out completions, score them exactly, compute the calibration metrics.

Evaluation (before training and every ``eval_every`` steps) samples ``eval_samples`` completions at T = 1 for
``eval_prompts`` held-out prompts, scores them exactly (:func:`calibrl.testbed.warmstart.sample_completions`) and draws
their outcomes from the true distribution with a FIXED stream (common random numbers across methods and steps).
``auroc_ceiling`` is the AUROC of the true success probability on the same samples: no confidence can beat it.
"""

from __future__ import annotations

import numpy as np


def evaluate(model, tokenizer, task: str, prompts: list[str], p_true: list[float] | None = None, *,
             n: int = 8, seed: int = 1234) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Sample ``n`` completions per prompt and compute the demo's metrics.

    Returns ``(metrics, samples)``; ``samples`` holds per-completion arrays (confidences, drawn outcomes, true
    success probabilities) for reliability diagrams. Outcomes are drawn from the true distribution with a stream
    seeded by ``seed`` (common random numbers: the same uniforms for every method and step).
    """
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
    tiers = np.array([tb.prompt_tier(task, p) or "" for p in res["prompt"]])  # scratchpad, forms: easy and hard
    inputs = {"correct": correct, "prompt_index": pid, "p_true": q, "reasoning_ok": reasoning_ok,
              "score": lpm, "confidence": np.exp(lpm), "logprob_mean": lpm, "n_tokens": res["n_tokens"],
              "sequence_probability": seq_prob, "prompt_tier": tiers if (tiers != "").any() else None}
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
        p_y = np.array([tb.DECISION_P[tb._digit_sum(p) % 8] for p in res["prompt"]])
        inputs.update(decision_prob=conf, p_yes=cp[:, 0], p_true_yes=p_y)
        samples.update({"dec_conf": conf, "p_yes": cp[:, 0], "p_true_yes": p_y})
    from calibrl.metrics.registry import compute_metrics

    out = {_RECORD_KEYS.get(k, k): v for k, v in compute_metrics("testbed", inputs).items()}
    # the task's headline ECE: the decision's (equal-count bins) on decision tasks, else the sequence probability's
    out["ece"] = out["dec_ece"] if spec.classes else out["seq_ece"]
    return out, samples


# The testbed's records (and its studies' committed data) name these declared metrics by their older names
_RECORD_KEYS = {"decision_ece": "dec_ece", "decision_ece_uniform": "dec_ece_uniform", "decision_auroc": "dec_auroc",
                "decision_frac_above_099": "frac_conf_99", "decision_prob_mean": "dec_conf_mean"}

# tasks whose reward needs the reasoning (the digit sum) right as well as the choice
_REASONING_GATED = ("decision", "decision_copy", "stochastic_reasoning", "verbalized", "abstain", "abstain_verbalized")


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


def eval_prompts_for(task: str, n: int, *, split: str = "test") -> list[str]:
    """The ``n`` held-out prompts of ``task`` (``split``: test by default) every method is evaluated on (fixed
    seed: the same for all)."""
    from calibrl.testbed import tasks as tb

    return [r["prompt"] for r in tb.build_rows(task, n, split=split, seed=0)]


__all__ = ["answer_keys", "eval_prompts_for", "evaluate"]
