"""The ``calibrl eval`` report: the "What this shows" paragraph, one section for a single benchmark, readable
row names, one accuracy row, and the scaling plot's dodged series."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from calibrl import metrics as M
from calibrl.cli import app
from calibrl.evaluation import plots
from calibrl.evaluation.plots import dodge_step, plot_scaling_curves
from calibrl.evaluation.report import render_eval_report, what_this_shows

runner = CliRunner()
FAST = ["--bootstrap", "30", "--scaling-draws", "2", "--rpc-draws", "1", "--no-math-verify"]


def _rows(seed=0, n_prompts=24, n=6, benchmarks=("math500",)):
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        q = rng.uniform(0.1, 0.9)
        for j in range(n):
            correct = bool(rng.random() < q)
            answer = str(p) if correct else str(100 + int(rng.integers(0, 3)))
            rows.append({"prompt_id": f"q{p}", "benchmark": benchmarks[p % len(benchmarks)], "correct": correct,
                         "answer": answer, "completion": f"path {j} {answer}",
                         "logprob_mean": float(-rng.exponential(0.25 if correct else 0.5))})
    return rows


def _eval(tmp_path, rows, *extra):
    src = tmp_path / "model.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, *extra])
    assert res.exit_code == 0, res.output
    return out, json.loads((out / "metrics.json").read_text()), (out / "report.md").read_text()


def _section(report: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## ``."""
    start = report.index(f"## {heading}\n")
    end = report.find("\n## ", start + 1)
    return report[start:] if end < 0 else report[start:end]


def _ci(m, key):
    lo, hi = m["bootstrap"][key]
    return f"{m[key]:.3f} [{lo:.3f}, {hi:.3f}]"


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _eval(tmp_path_factory.mktemp("single"), _rows(), "--posthoc", "temperature", "--abstain-precision", "0.5")


def test_paragraph_numbers_are_the_metrics_json_numbers(single):
    _, data, report = single
    m = data["results"]["overall"]["model"]
    assert report.index("## What this shows") < report.index("## overall")
    text = _section(report, "What this shows")
    assert f"Accuracy {_ci(m, 'accuracy')}" in text
    assert f"AUROC {_ci(m, 'auroc')}" in text
    assert f"ECE {_ci(m, 'ece')}" in text
    right = m["precision_at_coverage"]["1.0"]
    assert right == pytest.approx(np.mean([r["correct"] for r in _rows()]))  # the fraction right, pooled
    gap = m["mean_confidence"] - right
    assert f"mean confidence {m['mean_confidence']:.3f} against {right:.3f} right" in text
    # the sign of mean confidence - fraction right decides the word (this model states exp(logprob) > accuracy)
    assert gap > 0 and f"over-confident by {gap:.3f}" in text
    assert f"ECE from {m['ece']:.3f} to {m['posthoc']['ece']:.3f}" in text
    best = max(m["selection"].values())
    assert f"{best:.3f}, against majority vote {m['selection']['majority']:.3f}" in text or \
        m["selection"]["majority"] == best
    assert "Abstention:" in text
    lo, hi = m["bootstrap"]["auroc"]
    if lo > 0.5:
        assert "ranks right answers above wrong ones" in text
    else:
        assert "distinguishably from chance" in text or "worse than chance" in text


def test_single_benchmark_is_written_once(single):
    out, data, report = single
    scopes = re.findall(r"^## (.*)$", report, flags=re.M)
    assert scopes == ["What this shows", "overall (= benchmark `math500`)"]
    assert report.count("\n| samples | ") == 1 and report.count("Precision when answering only") == 1
    # metrics.json keeps both scopes (consumers look a benchmark up by name): the same results and figures
    assert list(data["results"]) == ["overall", "math500"]
    assert data["results"]["math500"] == data["results"]["overall"]
    assert data["figures"]["math500"] == data["figures"]["overall"]
    assert not [p for p in out.iterdir() if p.name.startswith("math500_")]
    for name in data["figures"]["overall"]:
        assert (out / name).is_file()


def test_single_benchmark_results_equal_a_separate_scoring(tmp_path, single):
    """Scoring the one benchmark once changes no number: a file of the same samples without a benchmark field
    gives the same overall figures."""
    _, data, _ = single
    rows = [{k: v for k, v in r.items() if k != "benchmark"} for r in _rows()]
    _, plain, _ = _eval(tmp_path, rows, "--posthoc", "temperature", "--abstain-precision", "0.5")
    assert plain["results"]["overall"]["model"] == data["results"]["math500"]["model"]


def test_posthoc_rows_have_readable_names(single):
    _, data, report = single
    post = report[report.index("Post-hoc `temperature`"):]
    table = post[:post.index("\n\n", post.index("| metric"))]
    names = [line.split("|")[1].strip() for line in table.splitlines()[4:]]
    assert names == ["AUROC (pooled)", "ECE (uniform bins)", "ECE (equal-count bins)", "Brier", "NLL",
                     "AURC (lower is better)"]
    ph = data["results"]["overall"]["model"]["posthoc"]
    assert f"| NLL | {ph['nll']:.4f} |" in table


def test_one_accuracy_row_and_pass_at_k_rows(single):
    _, data, report = single
    m = data["results"]["overall"]["model"]
    assert m["pass@1"] == pytest.approx(m["accuracy"], abs=1e-12)  # the same quantity, kept in metrics.json
    assert "| pass@1 |" not in report and "accuracy (mean@k)" not in report
    assert report.count("| accuracy (mean@k = pass@1) |") == 1
    assert f"| pass@6 | {m['pass@6']:.4f} |" in report


def test_several_benchmarks_keep_their_sections(tmp_path):
    _, data, report = _eval(tmp_path, _rows(benchmarks=("easy", "hard")))
    assert re.findall(r"^## (.*)$", report, flags=re.M) == ["What this shows", "overall", "easy", "hard"]
    acc = {s: data["results"][s]["model"]["accuracy"] for s in ("easy", "hard")}
    lo, hi = sorted(acc, key=acc.get)
    assert f"accuracy from {acc[lo]:.3f} ({lo}) to {acc[hi]:.3f} ({hi})" in _section(report, "What this shows")


def test_pass1_mean_at_k_agree_with_unequal_groups():
    rng = np.random.default_rng(3)
    pid = np.repeat(np.arange(40), rng.integers(1, 9, size=40))
    y = rng.random(pid.size) < 0.4
    assert M.pass_at_k(y, pid, 1) == pytest.approx(M.mean_at_k(y, pid), abs=1e-12)


def _metrics(**over):
    m = {"n_samples": 80, "n_prompts": 20, "samples_per_prompt": {"min": 4, "max": 4}, "confidence": "logprob_mean",
         "accuracy": 0.6, "pass@1": 0.6, "auroc": 0.7, "ece": 0.2, "mean_confidence": 0.8,
         "precision_at_coverage": {"1.0": 0.6},
         "bootstrap": {"n_boot": 100, "alpha": 0.05, "accuracy": [0.5, 0.7], "auroc": [0.6, 0.8], "ece": [0.1, 0.3]}}
    m.update(over)
    return m


def test_auroc_claims_no_more_than_its_interval():
    boot = {"n_boot": 100, "alpha": 0.05, "accuracy": [0.5, 0.7], "ece": [0.1, 0.3]}
    above = what_this_shows({"overall": {"x": _metrics()}})[0]
    assert "ranks right answers above wrong ones: AUROC 0.700 [0.600, 0.800]" in above
    chance = what_this_shows({"overall": {"x": _metrics(auroc=0.55, bootstrap={**boot, "auroc": [0.45, 0.65]})}})[0]
    assert "distinguishably from chance: AUROC 0.550 [0.450, 0.650]" in chance
    assert "ranks right answers above" not in chance
    below = what_this_shows({"overall": {"x": _metrics(auroc=0.3, bootstrap={**boot, "auroc": [0.2, 0.4]})}})[0]
    assert "worse than chance" in below
    no_ci = what_this_shows({"overall": {"x": _metrics(bootstrap={})}})[0]
    assert "AUROC 0.700 for how" in no_ci and "no interval to compare with chance" in no_ci
    assert "ranks right answers above wrong ones:" not in no_ci


def test_calibration_direction_follows_the_signed_gap():
    over = what_this_shows({"overall": {"x": _metrics()}})[0]
    assert "over-confident by 0.200" in over  # 0.8 - 0.6
    under = what_this_shows({"overall": {"x": _metrics(mean_confidence=0.35)}})[0]
    assert "under-confident by 0.250" in under  # 0.35 - 0.6
    mixed = what_this_shows({"overall": {"x": _metrics(mean_confidence=0.62)}})[0]  # |gap| 0.02 < ECE / 2
    assert "a mean gap of +0.020" in mixed and "over-confident by" not in mixed


def test_selection_and_abstention_sentences():
    m = _metrics(selection={"majority": 0.7, "weighted": 0.75, "pc": 0.75, "best_of_n": 0.65},
                 abstention={"target_precision": 0.9, "delta": 0.05, "threshold": 0.85, "coverage": 0.3,
                             "precision_heldout": 0.93, "n_calibration_prompts": 16})
    text = what_this_shows({"overall": {"x": m}})[0]
    assert ("the best are probability-weighted vote and Perplexity Consistency (tied), 0.750, against majority "
            "vote 0.700 (+0.050) and one path 0.600") in text
    assert "confidence >= 0.850 (certified for precision >= 0.9 with probability >= 0.95) answers 0.300" in text
    no_vote = what_this_shows({"overall": {"x": _metrics(selection={"pc": 0.7, "rpc": 0.65})}})[0]
    assert "the best is Perplexity Consistency, 0.700, against one path 0.600" in no_vote  # --methods pc,rpc
    alone = what_this_shows({"overall": {"x": _metrics(selection={"majority": 0.7})}})[0]
    assert "per prompt: majority vote 0.700, against one path 0.600" in alone
    none = what_this_shows({"overall": {"x": _metrics(abstention={"target_precision": 0.9, "delta": 0.05,
                                                                  "threshold": None, "n_calibration_prompts": 16})}})
    assert "no confidence threshold is certified for precision >= 0.9 with probability >= 0.95 on these 16" in none[0]


def test_pass1_row_is_shown_only_if_it_differs():
    inputs = [{"label": "x", "file": "x.jsonl", "rows": 80, "prompts": 20, "confidence": "logprob_mean"}]
    same = render_eval_report({"overall": {"x": _metrics()}}, {}, inputs=inputs, settings={})
    assert "| pass@1 |" not in same
    odd = render_eval_report({"overall": {"x": _metrics(**{"pass@1": 0.5})}}, {}, inputs=inputs, settings={})
    assert "| pass@1 | 0.5000 |" in odd


def test_dodge_step_hand_worked():
    assert dodge_step(octaves=3.0, n_series=5) == pytest.approx(0.045)  # 1.5% of 3 octaves < 0.2 / 4
    assert dodge_step(octaves=3.0, n_series=15) == pytest.approx(0.2 / 14)  # all within 0.2 octave
    assert dodge_step(octaves=0.5, n_series=2) == pytest.approx(0.015)  # an axis of at least one octave
    assert dodge_step(octaves=3.0, n_series=1) == 0.0


def test_thinned_roc_curve_stays_within_its_step_of_every_vertex():
    rng = np.random.default_rng(3)
    score = rng.normal(size=50_000)
    correct = rng.random(50_000) < 1 / (1 + np.exp(-score))
    fpr, tpr, _ = M.roc_curve(score, correct)
    keep = plots.thin_curve(fpr, tpr, step=1e-3)
    assert keep[0] == 0 and keep[-1] == len(fpr) - 1 and np.all(np.diff(keep) > 0)
    assert len(keep) < len(fpr) / 5  # far fewer vertices to draw
    # every dropped vertex lies within the step (L1) of the kept vertex before it, so of the drawn line
    prev = keep[np.searchsorted(keep, np.arange(len(fpr)), side="right") - 1]
    assert np.max(np.abs(fpr - fpr[prev]) + np.abs(tpr - tpr[prev])) < 1e-3
    small = plots.thin_curve(np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.7, 1.0]), step=1e-3)
    assert small.tolist() == [0, 1, 2]  # vertices further apart than the step are all kept


def test_scaling_plot_coinciding_methods_stay_apart(tmp_path, monkeypatch):
    seen = {}
    save = plots._save

    def keep(fig, path):
        seen["fig"] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    ns = np.array([1, 2, 4, 8])
    same = {"ns": ns, "accuracy": np.array([0.4, 0.5, 0.6, 0.7]), "std": np.array([0.0, 0.05, 0.03, 0.0])}
    plot_scaling_curves({"majority": same, "weighted": same, "pc": same}, tmp_path / "s.png", title="t")
    ax = seen["fig"].axes[0]
    xs = np.array([line.get_xdata() for line in ax.get_lines()])  # [3 series, 4 N]
    assert xs.shape == (3, 4)
    assert np.all(np.diff(xs, axis=0) > 0)  # the same values, drawn side by side in method order
    assert np.all((xs / ns > 2 ** -0.1 - 1e-12) & (xs / ns < 2 ** 0.1 + 1e-12))  # within 0.2 octave of N
    assert "±1 std over random draws of N paths" in ax.get_title()


def test_every_figure_of_an_eval_draws_its_texts_as_words(tmp_path, monkeypatch):
    """Every figure `calibrl eval` writes, drawn: no text on it, tick labels included, is raw TeX ("$" or
    "\\mathdefault", which plain-text drawing would show as such), and the scaling plot's x ticks are the Ns."""
    from typer.testing import CliRunner

    from calibrl.cli import app

    drawn = []
    save = plots._save

    def keep(fig, path):
        out = save(fig, path)  # drawn: the tick labels exist now
        drawn.append((Path(path).name, [t.get_text() for t in fig.findobj(plots.Text) if t.get_visible()],
                      [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes]))
        return out

    monkeypatch.setattr(plots, "_save", keep)
    rng = np.random.default_rng(0)
    rows = [{"prompt_id": p, "correct": bool(rng.random() < 0.5), "answer": str(rng.integers(0, 3)),
             "logprob_mean": float(-rng.random())} for p in range(12) for _ in range(8)]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["eval", str(tmp_path / "s.jsonl"), "--out", str(tmp_path / "e"),
                                      "--bootstrap", "30"])
    assert result.exit_code == 0, result.output
    names = {name for name, _, _ in drawn}
    assert any(name.endswith("scaling.png") for name in names), names
    for name, texts, ticks in drawn:
        bad = [t for t in texts if "$" in t or "mathdefault" in t]
        assert not bad, (name, bad)
        if name.endswith("scaling.png"):
            assert ticks[0] == ["1", "2", "4", "8"], ticks


def test_training_curves_that_lie_on_another_are_drawn_beside_it_and_say_so(tmp_path, monkeypatch):
    """GCPO whose scale stays near 1 draws GRPO's curves to within a marker: it would hide them. It is moved a
    little to the side and its legend names whose curves it lies on; a distinct curve is left where it is."""
    from calibrl.evaluation.plots import plot_training_curves

    seen = {}
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: seen.setdefault("fig", fig) and save(fig, path))
    steps = [0, 25, 50]
    grpo = [{"step": s, "auroc": 0.8 - 0.001 * s, "ece": 0.05 + 0.002 * s} for s in steps]
    gcpo = [{**r, "auroc": r["auroc"] + 1e-4} for r in grpo]  # within 1.5% of the panel's range
    capo = [{**r, "auroc": r["auroc"] + 0.02} for r in grpo]
    plot_training_curves({"GRPO": grpo, "GCPO": gcpo, "CAPO": capo}, metrics=("auroc", "ece"), path=tmp_path / "c.png")
    ax = seen["fig"].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert "GCPO (on GRPO's curves: drawn beside them)" in lines and "CAPO" in lines
    assert np.all(lines["GCPO (on GRPO's curves: drawn beside them)"].get_xdata() > np.array(steps))
    np.testing.assert_array_equal(lines["CAPO"].get_xdata(), steps)


def test_scoring_runs_with_one_blas_thread_and_gives_the_threads_back(tmp_path, monkeypatch):
    """The eval's matrix products are small: scoring runs with one BLAS thread (OpenBLAS's others only spin and
    slow the eval beside other work), and the caller's setting is as it was afterwards."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from calibrl.evaluation import pipeline
    from calibrl.evaluation.samples import load_samples
    from calibrl.evaluation.settings import EvalSettings

    def blas_threads() -> dict[str, int]:  # the BLAS libraries loaded so far (scoring may load another)
        return {pool["filepath"]: pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    seen = []
    real = pipeline._score_inputs
    monkeypatch.setattr(pipeline, "_score_inputs", lambda *a, **k: seen.append(blas_threads()) or real(*a, **k))
    rng = np.random.default_rng(0)
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps({"prompt_id": i // 4, "correct": bool(rng.random() < 0.6),
                                        "logprob_mean": -float(rng.exponential(0.4))}) + "\n" for i in range(80)))
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        pipeline.write_eval_report(tmp_path, [load_samples(path)], labels=["s"], files=[path],
                                   settings=EvalSettings(bootstrap=20, figures=False))
        after = blas_threads()
        assert {path: after[path] for path in before} == before
    assert before and len(seen) == 1 and set(seen[0]) >= set(before) and set(seen[0].values()) == {1}
