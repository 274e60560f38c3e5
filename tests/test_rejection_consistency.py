"""PRR against LM-Polygraph's definition and hand-worked values; answer consistency and semantic entropy worked by
hand; the metric table's directions; the eval report's table of confidence sources."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from calibrl import metrics as M
from calibrl.metrics.registry import METRICS, confidence_source, higher_is_better, metric, register_confidence_source


def _polygraph_area(uncertainty, target, max_rejection=1.0):
    """LM-Polygraph's PredictionRejectionArea.__call__ (src/lm_polygraph/ue_metrics/pred_rej_area.py), binary
    target (its normalize() leaves 0/1 targets with both values as they are)."""
    n = len(uncertainty)
    n_rej = int(max_rejection * n)
    cumsum = np.cumsum(np.asarray(target, dtype=float)[np.argsort(uncertainty)])[-n_rej:]
    return np.sum((cumsum / np.arange(n - n_rej + 1, n + 1))[::-1]) / n_rej


def _polygraph_prr(confidence, correct, max_rejection=1.0):
    """Their normalisation: (area - random) / (oracle - random), oracle = the target itself as the ranking, random
    = the expected area of a random order (the accuracy; they average 1000 shuffles)."""
    y = np.asarray(correct, dtype=float)
    area = _polygraph_area(-np.asarray(confidence), y, max_rejection)
    oracle = _polygraph_area(-y, y, max_rejection)
    return (area - y.mean()) / (oracle - y.mean())


def test_prr_hand_worked():
    conf, y = [0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0]
    # kept k = 4..1: C(k) = 2, 2, 1, 1 -> area (1 + 1/2 + 2/3 + 1/2) / 4 = 2/3; oracle 19/24; random 1/2
    assert M.prr(conf, y) == pytest.approx((2 / 3 - 1 / 2) / (19 / 24 - 1 / 2))  # = 4/7
    # rejecting at most half: levels k = 4, 3, both optimal here -> 1
    assert M.prr(conf, y, max_rejection=0.5) == pytest.approx(1.0)
    assert M.prr([0.1, 0.2, 0.3, 0.4], y) < 0  # rejects the right answers first
    assert M.prr([0.5, 0.5], [1, 0]) == pytest.approx(0.0)  # a tie is a random order, in expectation
    assert math.isnan(M.prr([0.1, 0.9], [1, 1]))  # one class: oracle = random
    with pytest.raises(ValueError, match="max_rejection"):
        M.prr(conf, y, max_rejection=0)


@pytest.mark.parametrize("max_rejection", [1.0, 0.5, 0.25])
def test_prr_equals_lm_polygraph_without_ties(max_rejection):
    rng = np.random.default_rng(7)
    for n in (9, 120, 3001):
        score = rng.normal(size=n)
        y = rng.random(n) < 1 / (1 + np.exp(-2 * score))
        assert M.prr(score, y, max_rejection=max_rejection) == pytest.approx(
            _polygraph_prr(score, y, max_rejection), rel=1e-9)


def test_prr_replicates_equal_gathered_rows():
    rng = np.random.default_rng(11)
    n_groups = 30
    group = rng.integers(0, n_groups, 400)
    score = np.round(rng.normal(size=400), 1)  # ties
    y = rng.random(400) < 0.5
    counts = np.stack([np.bincount(rng.integers(0, n_groups, n_groups), minlength=n_groups)
                       for _ in range(5)]).astype(np.float64)
    reps = M.prr_replicates(score, y, group, counts, max_rejection=0.7)
    for r in range(5):
        idx = np.concatenate([np.flatnonzero(group == g) for g in range(n_groups) for _ in range(int(counts[r, g]))])
        assert reps[r] == pytest.approx(M.prr(score[idx], y[idx], max_rejection=0.7), rel=1e-9)


def test_answer_consistency_and_semantic_entropy_hand_worked():
    # prompt 0: answers a, a, b, (none); prompt 1: four equal answers; prompt 2: all differ
    ids = [5, 5, 6, 9, 1, 1, 1, 1, 2, 3, 4]
    prompts = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    answered = [True, True, True, False] + [True] * 7
    assert M.answer_consistency(ids, prompts, answered=answered).tolist() == pytest.approx(
        [0.5, 0.5, 0.25, 0.0, 1, 1, 1, 1, 1 / 3, 1 / 3, 1 / 3])
    # the missing answer is a cluster of its own: shares 1/2, 1/4, 1/4
    h0 = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert M.semantic_entropy(ids, prompts, answered=answered).tolist() == pytest.approx(
        [h0] * 4 + [0.0] * 4 + [math.log(3)] * 3)
    # two missing answers do not agree with each other (clustering them together would lower the entropy)
    assert M.semantic_entropy([1, 1, 7, 7], [0] * 4, answered=[True, True, False, False])[0] == pytest.approx(
        -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    assert M.answer_consistency([1, 1, 7, 7], [0] * 4)[2] == 0.5  # all answered: shares as given


def test_metric_table_directions():
    assert not higher_is_better("smooth_ece") and higher_is_better("prr")
    assert not higher_is_better("eval_calibration/ece") and not higher_is_better("decision_ece")
    assert not higher_is_better("brier") and not higher_is_better("nll")
    assert higher_is_better("accuracy") and not higher_is_better("eval_calibration/mce")
    # older names resolve to the metric they were renamed to, in its direction
    assert not higher_is_better("frac_conf_99") and not higher_is_better("eval_calibration/decision_frac_above_099")
    assert metric("per_prompt_auroc").name == "auroc_per_prompt" and metric("dec_ece").name == "decision_ece"
    with pytest.raises(KeyError, match="unknown_key"):  # never a guess
        higher_is_better("unknown_key")
    with pytest.raises(ValueError, match="neither"):  # a count has no direction
        higher_is_better("auroc_n_prompts")
    assert METRICS["prr"].higher and METRICS["smooth_ece"].higher is False
    assert confidence_source("answer_consistency").probability
    assert not confidence_source("semantic_entropy").probability
    assert not confidence_source("a_new_score").probability  # unknown: ranks only
    with pytest.raises(ValueError, match="already registered"):
        register_confidence_source("logprob_mean", "x", probability=True)


def test_eval_report_opens_the_confidence_section_with_the_sources_table(tmp_path):
    from typer.testing import CliRunner

    from calibrl.cli import app

    rng = np.random.default_rng(0)
    rows = []
    for p in range(30):
        q = rng.uniform(0.1, 0.9)
        for j in range(6):
            correct = bool(rng.random() < q)
            answer = None if (not correct and j == 0) else (str(p) if correct else str(100 + int(rng.integers(3))))
            rows.append({"prompt_id": f"q{p}", "correct": correct, "answer": answer,
                         "logprob_mean": float(-rng.exponential(0.25 if correct else 0.5))})
    src = tmp_path / "m.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = CliRunner().invoke(app, ["eval", str(src), "--out", str(tmp_path / "rep"), "--bootstrap", "40",
                                   "--methods", "majority", "--scaling-draws", "1", "--no-math-verify"])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "rep" / "metrics.json").read_text())["results"]["overall"]["m"]
    srcs = m["confidence_sources"]
    assert set(srcs) == {"logprob_mean", "answer_consistency", "semantic_entropy"}
    pidx = np.unique([r["prompt_id"] for r in rows], return_inverse=True)[1]
    ids = np.unique([f"{r['prompt_id']}|{r['answer']}" for r in rows], return_inverse=True)[1]
    answered = np.array([r["answer"] is not None for r in rows])
    y = np.array([r["correct"] for r in rows])
    cons = M.answer_consistency(ids, pidx, answered=answered)
    assert srcs["answer_consistency"]["auroc"] == pytest.approx(M.auroc(cons, y))
    assert srcs["answer_consistency"]["smooth_ece"] == pytest.approx(M.smooth_ece(cons, y))
    assert srcs["semantic_entropy"]["prr"] == pytest.approx(
        M.prr(-M.semantic_entropy(ids, pidx, answered=answered), y))
    assert srcs["semantic_entropy"]["smooth_ece"] is None  # ranks only
    assert m["smooth_ece"] == pytest.approx(M.smooth_ece(np.exp([r["logprob_mean"] for r in rows]), y))
    for kind, s in srcs.items():
        for key, (lo, hi) in s["intervals"].items():
            assert lo <= hi and (key != "auroc" or lo <= s[key] <= hi)
    ranking = m["confidence_ranking"]
    aurocs = [srcs[k]["auroc"] for k in ranking["order"]]
    assert aurocs == sorted(aurocs, reverse=True)
    report = (tmp_path / "rep" / "report.md").read_text()
    table_at = report.index("| confidence source | AUROC | PRR | smooth ECE |")
    assert table_at < report.index("Precision when answering only the most confident")
    lead = ranking["auroc"]
    assert f"`{lead['best']}`" in report[table_at:]
    assert "_reliability.png) ![" in report  # the smoothed diagram beside the binned one


@pytest.mark.parametrize("fixture", ["trl_completions", "verl_val"])
def test_trl_and_verl_files_get_the_answer_confidences(fixture):
    from pathlib import Path

    from calibrl.evaluation.samples import load_samples
    from calibrl.evaluation.scoring import evaluate_samples
    from calibrl.evaluation.settings import EvalSettings
    from calibrl.selection import answer_clusters

    samples = load_samples(Path(__file__).parent / "fixtures" / "formats" / fixture)
    assert samples.answers is not None
    ids = answer_clusters(samples.answers, samples.prompt_index, use_math_verify=False)
    result = evaluate_samples(samples, label="x", answer_ids=ids, settings=EvalSettings(methods=(), bootstrap=0))
    srcs = result.metrics["confidence_sources"]
    answered = np.array([a is not None for a in samples.answers.tolist()])
    expected = M.answer_consistency(ids, samples.prompt_index, answered=answered)
    assert srcs["answer_consistency"]["n"] == len(samples)
    assert srcs["answer_consistency"]["mean_confidence"] == pytest.approx(expected.mean())
    assert srcs["semantic_entropy"]["probability"] is False


def test_auroc_replicates_from_tie_runs_equal_gathered_rows():
    from calibrl.metrics.rejection import PRRReplicates

    rng = np.random.default_rng(12)
    n_groups = 25
    group = rng.integers(0, n_groups, 300)
    score = np.round(rng.normal(size=300), 1)
    y = rng.random(300) < 1 / (1 + np.exp(-score))
    counts = np.stack([np.bincount(rng.integers(0, n_groups, n_groups), minlength=n_groups)
                       for _ in range(4)]).astype(np.float64)
    prr, auc = PRRReplicates(score, y, group, n_groups).with_auroc(counts)
    for r in range(4):
        idx = np.concatenate([np.flatnonzero(group == g) for g in range(n_groups) for _ in range(int(counts[r, g]))])
        assert auc[r] == M.auroc(score[idx], y[idx])  # integer counts: exact
        assert prr[r] == pytest.approx(M.prr(score[idx], y[idx]), rel=1e-9)


def test_replicates_of_mixed_ties_equal_gathered_rows():
    """Mostly distinct scores with some tied runs (one-sample runs take their accuracy from the sample, tied runs
    divide), runs of one prompt's tied samples only (one pair of several samples), prompts a replicate leaves out
    (runs it does not hold), many runs and few: AUROC exactly, PRR to rounding, for every rejection window (the
    whole one, which the pass walks without its window checks, and shorter ones), a window's start inside a tied
    run included."""
    from calibrl.metrics.rejection import PRRReplicates

    rng = np.random.default_rng(13)
    for n, n_groups in ((40_000, 5_000), (600, 40)):
        group = rng.integers(0, n_groups, n)
        score = rng.normal(size=n)
        score[: n // 5] = np.round(score[: n // 5], 1)  # a fifth of the samples in tied runs
        own = np.isin(group, np.arange(n_groups // 10)) & (np.arange(n) >= n // 5)
        score[own] = 10.0 + group[own] / n_groups  # a tenth of the prompts: their other samples tied to each other
        y = rng.random(n) < 1 / (1 + np.exp(-score))
        counts = np.stack([np.bincount(rng.integers(0, n_groups, n_groups), minlength=n_groups)
                           for _ in range(3)]).astype(np.float64)
        assert (counts == 0).any()
        for max_rejection in (1.0, 0.6, 0.37):
            prr, auc = PRRReplicates(score, y, group, n_groups, max_rejection=max_rejection).with_auroc(counts)
            for r in range(3):
                idx = np.repeat(np.arange(n), counts[r, group].astype(int))
                assert auc[r] == M.auroc(score[idx], y[idx])
                assert prr[r] == pytest.approx(M.prr(score[idx], y[idx], max_rejection=max_rejection), rel=1e-9)


def test_replicates_in_blocks_with_counts_of_every_width_equal_gathered_rows():
    """The pass walks replicates in blocks of eight with their counts narrowed to the smallest dtype that holds
    them: 11 replicates (a partial last block), counts below 256 (uint8), up to 300 (uint16) and up to 70,000
    (int32), each replicate's figures those of its gathered rows, whatever the other replicates of its block hold;
    and the same replicates one at a time give the same bits."""
    from calibrl.metrics.rejection import PRRReplicates

    rng = np.random.default_rng(14)
    n_groups = 6
    group = rng.integers(0, n_groups, 40)
    score = np.round(rng.normal(size=40), 1)
    y = rng.random(40) < 1 / (1 + np.exp(-score))
    small = rng.integers(0, 4, (11, n_groups))
    for top in (3, 300, 70_000):
        counts = small.copy()
        counts[4, 2] = top  # one replicate in the first block, its neighbours small
        prr, auc = PRRReplicates(score, y, group, n_groups).with_auroc(counts)
        for r in range(11):
            idx = np.repeat(np.arange(40), counts[r, group])
            assert auc[r] == M.auroc(score[idx], y[idx])
            assert prr[r] == pytest.approx(M.prr(score[idx], y[idx]), rel=1e-9)
            one = PRRReplicates(score, y, group, n_groups).with_auroc(counts[r:r + 1])
            assert one[0][0] == prr[r] and one[1][0] == auc[r]


def test_replicates_where_the_figures_are_undefined_are_nan_as_the_gathered_rows():
    """A replicate holding only right samples (one class: AUROC and PRR undefined), one with no rejection level
    (max_rejection x n < 1), and an all-zero replicate, beside a defined one; and a by-hand value: scores
    0.9 > 0.5 = 0.5 > 0.1 with correctness 1, 1, 0, 0 (the tie holds one right and one wrong sample): AUROC
    (1 x 2 + 1 x (1 + 1/2)) / 4 = 0.875."""
    from calibrl.metrics.rejection import PRRReplicates

    score = np.array([0.9, 0.5, 0.5, 0.1])
    y = np.array([True, True, False, False])
    group = np.array([0, 1, 2, 3])
    counts = np.array([[1, 1, 1, 1], [2, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]])
    prr, auc = PRRReplicates(score, y, group, 4).with_auroc(counts)
    assert auc[0] == 0.875 == M.auroc(score, y)
    assert prr[0] == pytest.approx(M.prr(score, y), rel=1e-12)
    assert np.isnan(auc[1]) and np.isnan(prr[1]) and np.isnan(auc[2]) and np.isnan(prr[2])
    assert auc[3] == 1.0 and prr[3] == pytest.approx(1.0)  # right above wrong: the oracle's order
    few, _ = PRRReplicates(score, y, group, 4, max_rejection=0.2).with_auroc(counts[:1])  # 0.2 x 4 < 1 level
    assert np.isnan(few[0]) and np.isnan(M.prr(score, y, max_rejection=0.2))


def test_semantic_entropy_ties_prompts_with_the_same_cluster_sizes_exactly():
    """Prompts whose answers split alike (sizes 3, 2, 1, 1 in any order of first appearance) get bit-for-bit
    the same entropy, so a ranking ties them (summing in the order clusters appear gave values a few ulps apart,
    13 distinct values where the multiple-choice baseline has 11 structures)."""
    from itertools import permutations

    sizes = [3, 2, 1, 1, 1]
    answers, prompts = [], []
    for p, order in enumerate(set(permutations(range(len(sizes))))):
        for j, cluster in enumerate(order):  # answer ids in this prompt's order: clusters numbered by it
            answers += [10 * p + j] * sizes[cluster]
            prompts += [p] * sizes[cluster]
    se = M.semantic_entropy(answers, prompts)
    assert np.unique(se).size == 1
    want = -sum(s / 8 * math.log(s / 8) for s in sizes)
    assert se[0] == pytest.approx(want, rel=1e-15)
    # and its AUROC and PRR treat them as ties: one distinct score level
    assert M.ranking_figures(-se, np.arange(se.size) % 2 == 0).levels.size == 1


def test_a_compiled_loop_without_a_writable_cache_is_compiled_in_the_process(monkeypatch):
    """Where numba can write no cache (it refuses ``cache=True`` when the function is defined), calibrl's compiled
    loops are compiled without one instead of failing the import, and compute the same."""
    import numba

    import calibrl._compiled as C

    calls = []

    def njit_without_cache_folder(**options):
        calls.append(options.get("cache", False))
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file 'f.py'")
        return numba.njit(**options)

    monkeypatch.setattr(C, "njit", njit_without_cache_folder)

    @C.compiled(nogil=True)
    def total(x):
        s = 0.0
        for v in x:
            s += v
        return s

    assert calls == [True, False]  # asked with the cache, then without
    assert total(np.arange(5.0)) == 10.0
    assert isinstance(total, numba.core.registry.CPUDispatcher)  # compiled, not the Python function
