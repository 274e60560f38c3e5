"""Exploratory: do the confidences that need no model rank the built-in real model's answers better than its own
mean token log-probability? On the untrained baseline's committed samples (``docs/results/realmodel_baseline/``),
with the controls that rule out the boring explanation. No protocol preceded this analysis; it is labelled so on
the page, with the number of comparisons it is one of.

    python -m studies.realmodel_sources        # print the section of docs/results/realmodel.md it writes

The section is rebuilt and checked line by line by ``python -m studies.reproduce --only realmodel``.

What is computed, per task (arithmetic, multiple choice), every interval a 95% percentile interval over 2,000
paired prompt-bootstrap replicates (seed 0; :func:`calibrl.metrics.paired.paired_bootstrap_difference`) and its
Bonferroni interval from the same replicates over the family below:

- the AUROC of ``answer_consistency`` and of ``semantic_entropy`` (minus it) minus ``logprob_mean``'s;
- the controls for the samples with no extracted answer, which answer consistency scores 0 and which are always
  wrong: the AUROC of "has an answer" alone; answer consistency against ``logprob_mean`` with the no-answer samples
  ranked last (``logprob_mean`` told what answer consistency knows); the same difference on the answered samples
  only.

The family for the Bonferroni intervals is every comparison the page's "which confidence to trust" section could
report: all pairs of one task's sources on AUROC and on PRR, and the pairs of its probability sources on smooth
ECE (:func:`family_size`).
"""

from __future__ import annotations

import argparse
from itertools import combinations
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "docs" / "results" / "realmodel_baseline"
TASKS = {"arithmetic": "arithmetic.jsonl", "multiple choice": "multiple_choice_chat.jsonl"}
N_BOOT, SEED, ALPHA = 2000, 0, 0.05
BEGIN = "<!-- confidence sources, exploratory: written by python -m studies.realmodel_sources -->"
END = "<!-- end of the exploratory section -->"


def _sources(samples) -> tuple[list[str], list[str]]:
    """(every confidence source of the input, those that are probabilities), as ``calibrl eval`` lists them."""
    from calibrl.metrics.registry import confidence_source

    names = list(samples.confidence_sources()) + ["answer_consistency", "semantic_entropy"]
    return names, [n for n in names if confidence_source(n).probability]


def family_size(source_lists: list[tuple[list[str], list[str]]]) -> int:
    """Comparisons in the family: per task, every pair of sources on AUROC and on PRR, every pair of probability
    sources on smooth ECE."""
    return sum(2 * len(list(combinations(names, 2))) + len(list(combinations(probs, 2)))
               for names, probs in source_lists)


def load(name: str):
    """(Samples, answer ids, answered [N] bool) of one committed baseline file, answers clustered as ``calibrl eval``
    clusters them."""
    from calibrl.evaluation.samples import load_samples
    from calibrl.selection import answer_clusters

    samples = load_samples(BASELINE / name)
    answered = np.array([a is not None for a in samples.answers.tolist()], dtype=bool)
    return samples, answer_clusters(samples.answers, samples.prompt_index), answered


def _difference(a, b, correct, pidx, alpha_b: float, rows=None) -> dict:
    from calibrl.metrics.bootstrap import percentile_interval
    from calibrl.metrics.paired import paired_bootstrap_difference

    keep = slice(None) if rows is None else rows
    diff = paired_bootstrap_difference("auroc", {"confidence": a[keep], "correct": correct[keep]},
                                       {"confidence": b[keep], "correct": correct[keep]}, prompt_ids_a=pidx[keep],
                                       prompt_ids_b=pidx[keep], n_boot=N_BOOT, seed=SEED)
    low_b, high_b = percentile_interval(diff.replicates, alpha=alpha_b)
    return {"point": diff.point, "low": diff.low, "high": diff.high, "low_b": low_b, "high_b": high_b}


def analyse() -> dict:
    from calibrl import metrics as M

    loaded = {task: load(name) for task, name in TASKS.items()}
    n_family = family_size([_sources(s) for s, _, _ in loaded.values()])
    alpha_b = ALPHA / n_family
    out = {"n_family": n_family, "tasks": {}}
    for task, (samples, ids, answered) in loaded.items():
        pidx, correct = samples.prompt_index, samples.correct.astype(bool)
        lpm = samples.logprob_mean
        consistency = M.answer_consistency(ids, pidx, answered=answered)
        entropy = -M.semantic_entropy(ids, pidx, answered=answered)
        lpm_known = np.where(answered, lpm, -np.inf)  # logprob_mean told which samples have no answer
        out["tasks"][task] = {
            "n": int(len(samples)), "no_answer": int((~answered).sum()),
            "no_answer_right": int((correct & ~answered).sum()),
            "answered_auroc": float(M.auroc(answered.astype(float), correct)),
            "consistency_vs_lpm": _difference(consistency, lpm, correct, pidx, alpha_b),
            "entropy_vs_lpm": _difference(entropy, lpm, correct, pidx, alpha_b),
            "consistency_vs_lpm_known": _difference(consistency, lpm_known, correct, pidx, alpha_b),
            "consistency_vs_lpm_answered": _difference(consistency, lpm, correct, pidx, alpha_b, rows=answered),
        }
    return out


def _ci(d: dict) -> str:
    return f"{d['point']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def _words(d: dict) -> str:
    if d["low_b"] > 0 or d["high_b"] < 0:
        return "resolved after Bonferroni"
    if d["low"] > 0 or d["high"] < 0:
        return "resolved at 95% only, not after Bonferroni"
    return "not resolved"


def section(res: dict) -> str:
    """The markdown section of docs/results/realmodel.md, between :data:`BEGIN` and :data:`END`."""
    level = 100 * (1 - ALPHA / res["n_family"])
    lines = [BEGIN, "", "### Confidences that need no model (exploratory)", "",
             "Exploratory, added after the runs with no protocol before it: one of the "
             f"{res['n_family']} comparisons the \"which confidence to trust\" table above could report (every pair "
             "of a task's sources on AUROC and PRR, every pair of its probability sources on smooth ECE). "
             f"Intervals: 95% over {N_BOOT:,} paired prompt-bootstrap replicates (seed {SEED}); Bonferroni: the "
             f"same replicates at {level:.2f}%. Rebuilt by `python -m studies.reproduce --only realmodel` "
             "(`studies/realmodel_sources.py`).", "",
             "| AUROC difference | arithmetic | multiple choice |", "|---|---|---|"]
    tasks = list(res["tasks"].values())
    rows = (("answer consistency - logprob_mean", "consistency_vs_lpm"),
            ("semantic entropy - logprob_mean", "entropy_vs_lpm"),
            ("answer consistency - logprob_mean, no-answer samples ranked last by both",
             "consistency_vs_lpm_known"),
            ("answer consistency - logprob_mean, answered samples only", "consistency_vs_lpm_answered"))
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(f"{_ci(t[key])} ({_words(t[key])})" for t in tasks) + " |")
    lines.append("| AUROC of \"has an answer\" alone | " + " | ".join(
        f"{t['answered_auroc']:.3f} ({t['no_answer']} of {t['n']} samples have none, {t['no_answer_right']} of them "
        "right)" for t in tasks) + " |")
    mc = res["tasks"]["multiple choice"]
    ar = res["tasks"]["arithmetic"]
    lines += ["", "Reading: on arithmetic no difference is resolved (answer consistency - `logprob_mean` "
              f"{_ci(ar['consistency_vs_lpm'])}). On multiple choice answer consistency leads "
              f"({_ci(mc['consistency_vs_lpm'])}, {_words(mc['consistency_vs_lpm'])}), but the samples with no "
              "answer account for the lead: answer consistency scores them 0 and none of them is right, so \"has an "
              f"answer\" alone has an AUROC of {mc['answered_auroc']:.3f}. With `logprob_mean` told the same (its "
              f"no-answer samples ranked last) the difference is {_ci(mc['consistency_vs_lpm_known'])}, and on the "
              f"answered samples alone {_ci(mc['consistency_vs_lpm_answered'])} ({_words(mc['consistency_vs_lpm_known'])}"
              f" and {_words(mc['consistency_vs_lpm_answered'])}); semantic entropy - `logprob_mean` is "
              f"{_ci(mc['entropy_vs_lpm'])}. These samples do not show that the confidences needing no model rank "
              "answers better than the model's own once both know which samples gave no answer.", "", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    print(section(analyse()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
