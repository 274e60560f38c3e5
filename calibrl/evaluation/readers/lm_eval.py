"""lm-evaluation-harness per-sample logs: ``samples_<task>_<date>.jsonl`` written with ``--log_samples``
(``EvaluationTracker.save_results_samples``, lm-eval 0.4).

One line per document and filter: ``doc_id``, ``doc``, ``target`` (written as a string), ``arguments``
(``{"gen_args_<i>": {"arg_0": context, "arg_1": continuation or generation kwargs}}``; a list of argument lists
in older versions), ``resps`` (one list per request; numbers written as strings), ``filtered_resps``, ``filter``,
``metrics`` (the metric names) and each metric's value (``acc``, ``acc_norm``, ``exact_match``, ...).

- Multiple choice (loglikelihood requests, one per choice: ``resps = [[[loglik, is_greedy]], ...]``): one row per
  document, ``class_probs`` = softmax of the choices' log-likelihoods (padded with zeros to the file's largest
  number of choices), ``label`` = ``target`` (an index, or a choice's text), ``decision_prob`` = the top choice's
  probability, ``correct`` = the top choice is the target (lm-eval's ``acc``).
- Generation (``generate_until``: ``resps = [[text, ...]]``): no token log-probabilities, so no confidence input
  (accuracy and answer selection only). One row per document with ``correct`` from ``exact_match`` (else
  ``acc``); with repeated sampling whose filter keeps every answer (``filtered_resps = [[a1, a2, ...]]``), one row
  per sample, each answer graded against ``target`` with calibrl's math grader.

A file holding several filters (e.g. gsm8k's strict-match and flexible-extract) is read for its first filter;
the others are noted.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterator

from calibrl.evaluation.readers.base import as_float, fail, need_fields, need_object, rows_jsonl

REQUIRED = ("doc_id", "target", "resps")
_INVALID = "[invalid]"  # lm-eval's regex filters' fallback when nothing matched: no answer extracted


def _arguments(raw: dict) -> list[list[Any]]:
    """Each request's arguments as a list: from ``{"gen_args_i": {"arg_j": ...}}`` or a list of lists."""
    args = raw.get("arguments")
    if isinstance(args, dict):
        keys = sorted(args, key=lambda k: int(k.rsplit("_", 1)[-1]) if k.rsplit("_", 1)[-1].isdigit() else 0)
        return [list(args[k].values()) if isinstance(args[k], dict) else [args[k]] for k in keys]
    if isinstance(args, list):
        return [list(a) if isinstance(a, (list, tuple)) else [a] for a in args]
    return []


def _is_loglikelihood(resps: list) -> bool:
    """Loglikelihood responses: each request's first response is a ``[loglik, is_greedy]`` pair."""
    return all(isinstance(r, list) and r and isinstance(r[0], list) and len(r[0]) == 2 for r in resps)


def _label(target: Any, choices: list[str], n: int, where: str) -> int:
    """The target's choice index: an integer (or its string), or a choice's text."""
    text = str(target).strip()
    if text.lstrip("-").isdigit():
        index = int(text)
    elif text in choices:
        index = choices.index(text)
    else:
        raise fail(where, "target", f"{target!r} is neither a choice index nor one of the choices {choices}")
    if not 0 <= index < n:
        raise fail(where, "target", f"out of range: {index} not in [0, {n})")
    return index


def option_probabilities(lls: list[float]) -> list[float]:
    """The options' probabilities normalised over the options: the softmax of their summed log-likelihoods (the
    normalisation lm-eval's ``brier_score`` reads; no length normalisation). :mod:`calibrl.lm_eval` computes its
    confidence with this function too, so its figures equal ``calibrl eval``'s on the samples file."""
    top = max(lls)
    weights = [math.exp(v - top) for v in lls]
    total = sum(weights)
    return [w / total for w in weights]


def _multiple_choice(raw: dict, where: str) -> dict:
    """A calibrl row (before padding) from one multiple-choice document."""
    lls = []
    for i, resp in enumerate(raw["resps"]):
        lls.append(as_float(resp[0][0], where, f"resps[{i}][0][0]"))
    if "acc_mutual_info" in raw and len(lls) % 2 == 0:  # the second half are unconditional log-likelihoods
        lls = lls[: len(lls) // 2]
    if len(lls) < 2:
        raise fail(where, "resps", f"needs at least 2 choices, got {len(lls)}")
    choices = [str(a[1]).strip() for a in _arguments(raw)[: len(lls)] if len(a) > 1]
    probs = option_probabilities(lls)
    label = _label(raw["target"], choices, len(lls), where)
    best = max(range(len(probs)), key=probs.__getitem__)
    return {"prompt_id": str(raw["doc_id"]), "class_probs": probs, "label": label, "decision_prob": probs[best],
            "correct": best == label, "answer": choices[best] if len(choices) == len(lls) else str(best)}


def _metric(raw: dict, where: str) -> bool:
    """Whether lm-eval scored the document correct: ``exact_match``, else ``acc``."""
    for name in ("exact_match", "acc"):
        if raw.get(name) is not None:
            return as_float(raw[name], where, name) > 0.5
    raise fail(where, "exact_match", "missing (a generation task's line needs exact_match or acc)")


def _generative(raw: dict, where: str) -> list[dict]:
    """calibrl rows (no confidence) from one generation document."""
    from calibrl.tasks.rewards import math_equal

    texts = raw["resps"][0] if raw["resps"] and isinstance(raw["resps"][0], list) else raw["resps"]
    texts = [str(t) for t in texts]
    filtered = (raw.get("filtered_resps") or [None])[0]
    pid = str(raw["doc_id"])
    if isinstance(filtered, list) and len(filtered) == len(texts) > 1:
        gold = str(raw["target"]).split("####")[-1].strip()  # gsm8k-style targets end with "#### <answer>"
        return [{"prompt_id": pid, "completion": t, "answer": None if a == _INVALID else str(a),
                 "correct": a != _INVALID and math_equal(str(a), gold)} for t, a in zip(texts, filtered)]
    answer = filtered[0] if isinstance(filtered, list) and filtered else filtered
    answer = None if answer in (None, _INVALID) else answer
    return [{"prompt_id": pid, "completion": texts[0] if texts else None,
             "answer": None if answer is None else str(answer), "correct": _metric(raw, where)}]


def read(path: Path, notes: list[str]) -> Iterator[tuple[str, dict]]:
    """calibrl rows of an lm-eval ``--log_samples`` file."""
    rows: list[tuple[str, dict]] = []
    first_filter, skipped = None, set()
    for lineno, raw in rows_jsonl(path):
        where = f"{path.name}:{lineno}"
        need_object(raw, where)
        need_fields(raw, REQUIRED, where, what="an lm-eval samples line")
        if not isinstance(raw["resps"], list) or not raw["resps"]:
            raise fail(where, "resps", f"expected a non-empty list, got {raw['resps']!r}")
        first_filter = raw.get("filter") if first_filter is None else first_filter
        if raw.get("filter") != first_filter:
            skipped.add(str(raw.get("filter")))
            continue
        if _is_loglikelihood(raw["resps"]):
            rows.append((where, _multiple_choice(raw, where)))
        else:
            rows.extend((where, row) for row in _generative(raw, where))
    if skipped:
        notes.append(f"{path.name}: read filter '{first_filter}'; skipped filter(s) {', '.join(sorted(skipped))}")
    width = max((len(r["class_probs"]) for _, r in rows if "class_probs" in r), default=0)
    for where, row in rows:
        if "class_probs" in row:
            row["class_probs"] = row["class_probs"] + [0.0] * (width - len(row["class_probs"]))
        yield where, row

