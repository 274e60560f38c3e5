"""Paired and hierarchical prompt-level bootstrap of a metric's difference (calibrl/metrics/paired.py)."""

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from calibrl import metrics as M
from calibrl.metrics.paired import (auroc_table, hierarchical_bootstrap_difference, paired_bootstrap_difference,
                                    prompt_weighted_auroc)


def auroc_loop(confidence, correct):
    return M.auroc(confidence, correct)


def clustered(rng, *, n_prompts, k, spread=1.5, shared=None):
    """One evaluation: prompt difficulty u_p (given as ``shared``, or fresh), correctness ~ Bernoulli(sigmoid(u_p -
    1)), confidence = u_p + correct + noise: pooled AUROC driven by prompt difficulty, which is shared by the samples
    of a prompt (and, with ``shared``, by two evaluations of the same prompts)."""
    u = rng.normal(scale=spread, size=n_prompts) if shared is None else shared
    g = np.repeat(np.arange(n_prompts), k)
    correct = rng.random(g.size) < 1.0 / (1.0 + np.exp(-(u[g] - 1.0)))
    confidence = u[g] + correct + rng.normal(size=g.size)
    return {"confidence": confidence, "correct": correct}, g


def test_two_prompt_case_by_hand():
    # a: prompt 0 alone ranks perfectly (AUROC 1), prompt 1 alone backwards (0), both pooled 0.5 (2 of 4 pairs);
    # b: all scores tied, AUROC 0.5 whatever is drawn. A replicate draws {0,0} (p = 1/4): 1 - 0.5 = +0.5;
    # {1,1} (1/4): -0.5; one of each (1/2): 0.
    a = {"confidence": np.array([2.0, 1.0, 3.0, 4.0]), "correct": np.array([1, 0, 1, 0])}
    b = {"confidence": np.zeros(4), "correct": np.array([1, 0, 1, 0])}
    pids = np.array(["p0", "p0", "p1", "p1"])
    out = paired_bootstrap_difference("auroc", a, b, prompt_ids_a=pids, prompt_ids_b=pids, n_boot=4000, seed=3)
    assert out.point == 0.0 and out.a == 0.5 and out.b == 0.5
    assert set(np.unique(out.replicates)) == {-0.5, 0.0, 0.5}
    assert np.mean(out.replicates == 0.5) == pytest.approx(0.25, abs=0.025)
    assert np.mean(out.replicates == 0.0) == pytest.approx(0.5, abs=0.025)
    assert (out.low, out.high) == (-0.5, 0.5)


def test_one_prompt_gives_a_point_interval_and_sign_is_a_minus_b():
    a = {"confidence": np.array([0.9, 0.1, 0.8]), "correct": np.array([1, 0, 0])}
    b = {"confidence": np.array([0.1, 0.9, 0.8]), "correct": np.array([1, 0, 0])}
    pids = np.zeros(3, dtype=int)
    out = paired_bootstrap_difference("auroc", a, b, prompt_ids_a=pids, prompt_ids_b=pids, n_boot=50)
    assert out.point == pytest.approx(1.0 - 0.0)  # a ranks its right answer first, b last
    assert out.low == out.high == pytest.approx(1.0)


def test_weighted_auroc_equals_sklearn_with_prompt_counts():
    rng = np.random.default_rng(0)
    g = rng.integers(0, 7, size=60)
    y = rng.random(60) < 0.4
    s = np.round(rng.normal(size=60), 1)  # ties
    w = rng.integers(0, 4, size=(5, 7)).astype(float)
    got = prompt_weighted_auroc(auroc_table(s, y, g, 7), w)
    for r in range(5):
        want = roc_auc_score(y, s, sample_weight=w[r, g]) if (w[r, g] * y).sum() and (w[r, g] * ~y).sum() else np.nan
        np.testing.assert_allclose(got[r], want, rtol=1e-12)


def brute_force(a, b, g, *, n_boot, seed):
    """Replicates by hand: each replicate's prompt draw (the documented random numbers), the rows of every drawn
    prompt gathered for both evaluations, sklearn's AUROC."""
    rng = np.random.default_rng(seed)
    prompts = np.unique(g)
    out = []
    for _ in range(n_boot):
        drawn = prompts[rng.integers(0, prompts.size, size=prompts.size)]
        rows = np.concatenate([np.flatnonzero(g == p) for p in drawn])
        out.append(roc_auc_score(a["correct"][rows], a["confidence"][rows])
                   - roc_auc_score(b["correct"][rows], b["confidence"][rows]))
    return np.array(out)


def test_vectorised_and_loop_agree_with_brute_force():
    rng = np.random.default_rng(1)
    a, g = clustered(rng, n_prompts=12, k=5)
    b = {"confidence": np.round(a["confidence"] + rng.normal(size=g.size), 1), "correct": a["correct"]}
    want = brute_force(a, b, g, n_boot=120, seed=7)
    fast = paired_bootstrap_difference("auroc", a, b, prompt_ids_a=g, prompt_ids_b=g, n_boot=120, seed=7)
    loop = paired_bootstrap_difference(auroc_loop, a, b, prompt_ids_a=g, prompt_ids_b=g, n_boot=120, seed=7)
    np.testing.assert_allclose(fast.replicates, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(loop.replicates, want, rtol=0, atol=1e-12)
    assert fast.point == pytest.approx(M.auroc(**a) - M.auroc(**b))


def test_same_draws_as_bootstrap_ci_of_one_evaluation():
    rng = np.random.default_rng(2)
    a, g = clustered(rng, n_prompts=20, k=4)
    constant = {"confidence": np.zeros(g.size), "correct": a["correct"]}  # AUROC 0.5 in every replicate
    diff = paired_bootstrap_difference("auroc", a, constant, prompt_ids_a=g, prompt_ids_b=g, n_boot=300, seed=5)
    ci = M.bootstrap_ci(M.auroc, a, prompt_ids=g, n_boot=300, seed=5)
    assert (diff.low + 0.5, diff.high + 0.5) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_prompts_matched_by_id_not_position_and_sets_must_agree():
    rng = np.random.default_rng(3)
    a, g = clustered(rng, n_prompts=10, k=3)
    b = {k: v[::-1].copy() for k, v in a.items()}  # the same rows in reverse order
    out = paired_bootstrap_difference("auroc", a, b, prompt_ids_a=g, prompt_ids_b=g[::-1], n_boot=100)
    np.testing.assert_allclose(out.replicates, 0.0, atol=1e-12)  # the same samples per prompt: difference 0
    with pytest.raises(ValueError, match="same prompts"):
        paired_bootstrap_difference("auroc", a, b, prompt_ids_a=g, prompt_ids_b=g + 1, n_boot=10)
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap_difference("auroc", {"score": a["confidence"]}, b, prompt_ids_a=g, prompt_ids_b=g)


def coverage(draw, *, reps, truth):
    """Fraction of ``reps`` simulated intervals (``draw(rng) -> (low, high)``) holding ``truth``, mean width."""
    hits, widths = [], []
    for r in range(reps):
        low, high = draw(np.random.default_rng(100 + r))
        hits.append(low <= truth <= high)
        widths.append(high - low)
    return float(np.mean(hits)), float(np.mean(widths))


def test_paired_interval_is_narrower_and_still_covers_when_prompts_share_difficulty():
    # two evaluations of the same model on the same prompts: the same law, so the true difference is 0; both see
    # the prompts' difficulty, which dominates the pooled AUROC
    def evaluations(rng):
        u = rng.normal(scale=1.5, size=40)
        a, g = clustered(rng, n_prompts=40, k=16, shared=u)
        b, _ = clustered(rng, n_prompts=40, k=16, shared=u)
        return a, b, g

    def interval(paired):
        def draw(rng):
            a, b, g = evaluations(rng)
            out = paired_bootstrap_difference("auroc", a, b, prompt_ids_a=g, prompt_ids_b=g, n_boot=200,
                                              paired=paired)
            return out.low, out.high
        return draw

    cover_paired, width_paired = coverage(interval(True), reps=150, truth=0.0)
    cover_unpaired, width_unpaired = coverage(interval(False), reps=150, truth=0.0)
    assert width_paired < 0.8 * width_unpaired
    assert cover_paired >= 0.88
    assert cover_unpaired >= 0.88


def test_samples_treated_as_independent_undercover_under_prompt_clustering():
    rng = np.random.default_rng(9)
    big, _ = clustered(rng, n_prompts=50_000, k=16)
    truth = M.auroc(**big)  # the population AUROC, to about 1e-3

    def draw(prompt_level):
        def one(rng):
            a, g = clustered(rng, n_prompts=40, k=16)
            ids = g if prompt_level else np.arange(g.size)
            ci = M.bootstrap_ci(M.auroc, a, prompt_ids=ids, n_boot=200)
            return ci.low, ci.high
        return one

    cover_prompts, width_prompts = coverage(draw(True), reps=150, truth=truth)
    cover_samples, width_samples = coverage(draw(False), reps=150, truth=truth)
    assert cover_prompts >= 0.88
    assert cover_samples <= cover_prompts - 0.08
    assert width_samples < width_prompts


def test_hierarchical_matches_brute_force_and_crossed_is_wider_than_nested():
    rng = np.random.default_rng(4)
    u = rng.normal(scale=1.5, size=15)
    a_seeds, b_seeds, ids = [], [], []
    for s in range(3):
        a, g = clustered(rng, n_prompts=15, k=4, shared=u + 0.3 * s)
        b, _ = clustered(rng, n_prompts=15, k=4, shared=u)
        a_seeds.append(a), b_seeds.append(b), ids.append(g)
    out = hierarchical_bootstrap_difference("auroc", a_seeds, b_seeds, prompt_ids_a=ids, prompt_ids_b=ids,
                                            n_boot=200, seed=1)
    loop = hierarchical_bootstrap_difference(auroc_loop, a_seeds, b_seeds, prompt_ids_a=ids, prompt_ids_b=ids,
                                             n_boot=200, seed=1)
    np.testing.assert_allclose(out.replicates, loop.replicates, atol=1e-12)
    diffs = [M.auroc(**a) - M.auroc(**b) for a, b in zip(a_seeds, b_seeds)]
    assert out.point == pytest.approx(np.mean(diffs))

    # by hand: seeds drawn, then one prompt draw shared by every drawn seed (crossed: every seed, same prompts)
    r = np.random.default_rng(1)
    want = []
    for _ in range(200):
        seeds = r.integers(0, 3, size=3)
        prompts = r.integers(0, 15, size=15)
        rows = np.concatenate([np.flatnonzero(ids[0] == p) for p in prompts])
        want.append(np.mean([roc_auc_score(a_seeds[s]["correct"][rows], a_seeds[s]["confidence"][rows])
                             - roc_auc_score(b_seeds[s]["correct"][rows], b_seeds[s]["confidence"][rows])
                             for s in seeds]))
    np.testing.assert_allclose(out.replicates, want, atol=1e-12)

    nested = hierarchical_bootstrap_difference("auroc", a_seeds, b_seeds, prompt_ids_a=ids, prompt_ids_b=ids,
                                               n_boot=400, seed=1, crossed=False)
    crossed = hierarchical_bootstrap_difference("auroc", a_seeds, b_seeds, prompt_ids_a=ids, prompt_ids_b=ids,
                                                n_boot=400, seed=1)
    # the seeds share the prompts' difficulty: fresh prompt draws per seed average it away
    assert np.nanstd(crossed.replicates) > np.nanstd(nested.replicates)


def test_hierarchical_one_seed_equals_paired():
    rng = np.random.default_rng(5)
    a, g = clustered(rng, n_prompts=12, k=4)
    b, _ = clustered(rng, n_prompts=12, k=4)
    one = hierarchical_bootstrap_difference("auroc", [a], [b], prompt_ids_a=[g], prompt_ids_b=[g], n_boot=100,
                                            seed=2)
    # one seed: the seed draw consumes random numbers first, so compare the distributions' point and support
    assert one.point == pytest.approx(M.auroc(**a) - M.auroc(**b))
    paired = paired_bootstrap_difference("auroc", a, b, prompt_ids_a=g, prompt_ids_b=g, n_boot=2000, seed=2)
    one_many = hierarchical_bootstrap_difference("auroc", [a], [b], prompt_ids_a=[g], prompt_ids_b=[g],
                                                 n_boot=2000, seed=2)
    assert np.nanstd(one_many.replicates) == pytest.approx(np.nanstd(paired.replicates), rel=0.1)
    with pytest.raises(ValueError, match="one entry per seed"):
        hierarchical_bootstrap_difference("auroc", [a, a], [b], prompt_ids_a=[g], prompt_ids_b=[g])


def _record(step, samples):
    from calibrl.trl.callbacks import calibration_record

    rows = [{"prompt_id": p, "correct": c, "logprob_mean": s} for p, c, s in
            zip(samples["prompt_id"], samples["correct"], samples["logprob_mean"])]
    return {"step": step, **calibration_record(rows), "samples": samples}


def test_real_model_matched_accuracy_uses_the_paired_interval_when_records_keep_samples(tmp_path):
    import json

    from calibrl.testbed.realmodel import evaluation_error_bars, with_samples
    from studies.realmodel_analysis import (HANLEY_MCNEIL_INTERVAL, PAIRED_INTERVAL, matched_accuracy_rows,
                                            matched_accuracy_table)

    rng = np.random.default_rng(6)
    u = rng.normal(scale=1.5, size=48)

    def samples():
        a, g = clustered(rng, n_prompts=48, k=4, shared=u)
        return {"prompt_id": [f"q{i}" for i in g], "correct": a["correct"].astype(int).tolist(),
                "logprob_mean": (-np.logaddexp(0.0, -a["confidence"])).tolist()}  # log sigmoid: <= 0

    grpo = [_record(0, samples()), _record(6, samples())]
    capo = [_record(0, grpo[0]["samples"]), {**_record(6, samples())}]
    capo[1]["accuracy"] = grpo[1]["accuracy"]  # matched by construction
    rows = matched_accuracy_rows({"GRPO": grpo, "CAPO": capo}, reference="GRPO")
    match = [r for r in rows if r["step"] == 6][0]
    from calibrl.metrics.paired import paired_bootstrap_difference

    want = paired_bootstrap_difference(
        "auroc", {"confidence": capo[1]["samples"]["logprob_mean"], "correct": capo[1]["samples"]["correct"]},
        {"confidence": grpo[match["reference_step"] // 6]["samples"]["logprob_mean"],
         "correct": grpo[match["reference_step"] // 6]["samples"]["correct"]},
        prompt_ids_a=capo[1]["samples"]["prompt_id"],
        prompt_ids_b=grpo[match["reference_step"] // 6]["samples"]["prompt_id"], n_boot=2000, seed=0)
    assert match["interval"] == PAIRED_INTERVAL
    assert (match["difference"], match["low"], match["high"]) == pytest.approx((want.point, want.low, want.high))
    assert match["difference"] == pytest.approx(match["auroc"] - match["reference_auroc"])
    assert PAIRED_INTERVAL in matched_accuracy_table({"GRPO": grpo, "CAPO": capo}, reference="GRPO")

    # records of older runs (no samples): the Hanley-McNeil figure, labelled as such
    old = {k: [{x: v for x, v in r.items() if x != "samples"} for r in runs] for k, runs in
           {"GRPO": grpo, "CAPO": capo}.items()}
    old_row = [r for r in matched_accuracy_rows(old, reference="GRPO") if r["step"] == 6][0]
    assert old_row["interval"] == HANLEY_MCNEIL_INTERVAL
    assert old_row["high"] - old_row["low"] == pytest.approx(2 * old_row["half_width"])
    assert HANLEY_MCNEIL_INTERVAL in matched_accuracy_table(old, reference="GRPO")

    # the run folder's per-sample file merges into the records by step; a folder without it changes nothing
    (tmp_path / "evaluation_samples.json").write_text(json.dumps(
        {"evaluations": [{"step": 6, **capo[1]["samples"]}]}))
    merged = with_samples(old["CAPO"], tmp_path)
    assert "samples" not in merged[0] and merged[1]["samples"]["prompt_id"] == capo[1]["samples"]["prompt_id"]
    assert with_samples(old["CAPO"], tmp_path / "none") == old["CAPO"]
    (acc_lo, acc_hi), (auc_lo, auc_hi) = evaluation_error_bars(capo[1])
    assert min(acc_lo, acc_hi, auc_lo, auc_hi) >= 0 and auc_lo + auc_hi > 0
    assert evaluation_error_bars(old["CAPO"][1]) is None


def test_real_model_runs_keep_each_evaluations_samples(tmp_path):
    import json
    from types import SimpleNamespace

    from calibrl.testbed.realmodel import EVALUATION_SAMPLES_FILE, _keep_samples_callback

    path = tmp_path / EVALUATION_SAMPLES_FILE
    path.write_text(json.dumps({"evaluations": [{"step": 0, "prompt_id": ["stale"], "correct": [1],
                                                 "logprob_mean": [-1.0]}]}))
    rows = [{"prompt_id": "p0", "correct": True, "logprob_mean": -0.5, "decision_prob": 0.7},
            {"prompt_id": "p0", "correct": False, "logprob_mean": -1.5, "decision_prob": None}]
    evaluation = SimpleNamespace(records=[{"step": 0}], last_samples=rows)
    keep = _keep_samples_callback()(evaluation, path)
    keep.on_train_begin(None, SimpleNamespace(global_step=0), None)  # a fresh run: the stale file is replaced
    keep.on_step_end(None, SimpleNamespace(global_step=1), None)  # no new evaluation: nothing added
    evaluation.records.append({"step": 6})
    evaluation.last_samples = rows[:1]
    keep.on_step_end(None, SimpleNamespace(global_step=6), None)
    saved = json.loads(path.read_text())["evaluations"]
    assert [e["step"] for e in saved] == [0, 6]
    assert saved[0] == {"step": 0, "prompt_id": ["p0", "p0"], "correct": [1, 0], "logprob_mean": [-0.5, -1.5],
                        "decision_prob": [0.7, None]}
    # resumed at step 6 of another run: the evaluations up to the checkpoint are kept, later ones are not
    resumed = _keep_samples_callback()(SimpleNamespace(records=[{"step": 0}], last_samples=[]), path)
    resumed.on_train_begin(None, SimpleNamespace(global_step=3), None)
    assert sorted(resumed.kept) == [0]
