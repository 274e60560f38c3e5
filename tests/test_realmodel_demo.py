"""`calibrl demo --model`: its pure pieces (the AUROC resolution it states, its sentences, its table) and its
argument errors. The run itself needs the real model for minutes: `calibrl demo --model ... --quick` by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from calibrl.cli import app
from calibrl.testbed.realmodel import (REAL_MODEL_METHODS, RealModelRunConfig, auroc_standard_error,
                                       demo_sentences, evaluation_auroc_standard_error, records_table)
from studies.realmodel_analysis import matched_accuracy_rows, matched_accuracy_table, training_table


def test_hanley_mcneil_standard_error_by_hand_and_by_simulation():
    # A = 0.5: Q1 = Q2 = 1/3, var = (1/4 + 9/12 + 9/12) / 100 for 10 positives and 10 negatives
    assert auroc_standard_error(0.5, 10, 10) == pytest.approx(math.sqrt(0.0175))
    assert auroc_standard_error(0.8, 40, 88) < auroc_standard_error(0.8, 10, 22)
    assert math.isnan(auroc_standard_error(0.7, 0, 10))
    # of an evaluation record: accuracy x n_samples right answers
    record = {"auroc": 0.61, "accuracy": 40 / 128, "n_samples": 128}
    assert evaluation_auroc_standard_error(record) == auroc_standard_error(0.61, 40, 88)
    assert math.isnan(evaluation_auroc_standard_error({**record, "accuracy": float("nan")}))
    assert math.isnan(evaluation_auroc_standard_error({"auroc": 0.61, "accuracy": 0.3}))
    # close to the spread of AUROCs of binormal scores with that true AUROC (0.76 for a shift of 1 sd)
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    values = [roc_auc_score(np.r_[np.ones(30), np.zeros(70)], np.r_[rng.normal(1, 1, 30), rng.normal(0, 1, 70)])
              for _ in range(2000)]
    assert auroc_standard_error(float(np.mean(values)), 30, 70) == pytest.approx(np.std(values), rel=0.15)


def test_matched_accuracy_reads_each_evaluation_at_the_reference_evaluation_of_nearest_accuracy():
    grpo = [{"step": 0, "accuracy": 0.20, "auroc": 0.60, "n_samples": 100},
            {"step": 6, "accuracy": 0.30, "auroc": 0.70, "n_samples": 100},
            {"step": 12, "accuracy": 0.40, "auroc": 0.65, "n_samples": 100},
            {"step": 18, "accuracy": 0.40, "auroc": 0.62, "n_samples": 100}]
    capo = [{"step": 0, "accuracy": 0.20, "auroc": 0.60, "n_samples": 100},   # the shared start: not read
            {"step": 6, "accuracy": 0.22, "auroc": 0.75, "n_samples": 100},   # nearest: GRPO's start (0.02 away)
            {"step": 12, "accuracy": 0.41, "auroc": 0.80, "n_samples": 100},  # ties 0.40 twice: the later step
            {"step": 18, "accuracy": 0.55, "auroc": 0.90, "n_samples": 100}]  # 0.15 from any: no match
    rows = matched_accuracy_rows({"GRPO": grpo, "CAPO": capo}, reference="GRPO", tolerance=0.03)
    assert [(r["step"], r["reference_step"]) for r in rows] == [(6, 0), (12, 18)]
    assert rows[0]["difference"] == pytest.approx(0.15) and rows[1]["difference"] == pytest.approx(0.18)
    se_capo, se_grpo = auroc_standard_error(0.80, 41, 59), auroc_standard_error(0.62, 40, 60)
    assert rows[1]["half_width"] == pytest.approx(1.96 * math.hypot(se_capo, se_grpo))
    assert matched_accuracy_rows({"GRPO": grpo, "CAPO": capo}, reference="GRPO", tolerance=0.005) == []
    table = matched_accuracy_table({"GRPO": grpo, "CAPO": capo}, reference="GRPO").splitlines()
    assert table[2].startswith("| CAPO | 6 | 0.220 | 0 | 0.200 | 0.750 | 0.600 | +0.150 (±")
    assert "no matched-accuracy comparison" in matched_accuracy_table({"GRPO": grpo}, reference="GRPO")


def test_training_table_averages_the_first_and_last_steps():
    history = [{"step": s, "reward": r, "entropy": e} for s, r, e in
               zip(range(1, 9), [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], [1.0] * 4 + [2.0] * 4)]
    history.append({"step": 8, "train_runtime": 10.0})  # the closing log: not a step
    row = training_table({"GRPO": history}, window=2).splitlines()[2]
    assert row.startswith("| GRPO | 8 | 0.050 -> 0.650 | ")
    assert "| 1.000 -> 2.000 |" in row and row.endswith("|  |  |")


def test_demo_sentences_and_table_come_from_the_records():
    records = [{"step": 0, "accuracy": 0.25, "auroc": 0.578, "ece": 0.21, "n_samples": 128},
               {"step": 6, "accuracy": 0.3125, "auroc": 0.61, "ece": 0.25, "n_samples": 128}]
    text = demo_sentences(records, label="GRPO", steps=6)
    assert text[0] == "held-out accuracy: 0.250 at the start, 0.312 after GRPO's 6 steps (+0.062)."
    assert "AUROC of the mean token log-prob: 0.578 at the start, 0.610" in text[1] and "(+0.032)" in text[1]
    se = auroc_standard_error(0.61, 40, 88)
    assert f"128 held-out samples (40 right)" in text[3] and f"+-{1.96 * se:.2f}" in text[3]
    assert demo_sentences(records[:1], label="GRPO", steps=6) == ["Only the start was evaluated."]
    rows = records_table({"GRPO": records}).splitlines()
    assert rows[2].startswith("| GRPO | 0 | 0.250 | 0.578 |") and rows[3].startswith("| GRPO | 6 | 0.312 | 0.610 |")


def test_methods_are_checked_before_anything_loads():
    with pytest.raises(ValueError, match="unknown method 'foo'"):
        RealModelRunConfig(method="foo")
    assert set(REAL_MODEL_METHODS) == {"grpo", "capo", "capo_mask", "grpo_decision"}
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda', not 'gpu'"):
        RealModelRunConfig(device="gpu")
    runner = CliRunner()
    bad = runner.invoke(app, ["demo", "--model", "builtin:smollm2-135m-instruct", "--methods", "foo"])
    assert bad.exit_code == 2 and "grpo_decision" in bad.output
    missing = runner.invoke(app, ["demo", "--model", "/nonexistent/model.gguf", "--quick"])
    assert missing.exit_code == 2 and "/nonexistent/model.gguf" in missing.output


def test_a_missing_model_leaves_no_output_folder(tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--model", str(tmp_path / "none.gguf"), "--out", str(out)])
    assert result.exit_code == 2 and not out.exists()


def test_plot_runs_draws_every_run_with_error_bars(tmp_path):
    from calibrl.testbed.realmodel import plot_runs

    records = [{"step": 0, "accuracy": 0.25, "auroc": 0.58, "n_samples": 128},
               {"step": 6, "accuracy": 0.31, "auroc": 0.61, "n_samples": 128}]
    path = plot_runs({"GRPO": records, "CAPO": records[:1]}, tmp_path / "t.png")
    assert path.exists() and path.stat().st_size > 10_000


def test_plot_runs_draws_a_run_whose_first_auroc_is_undefined(tmp_path):
    from calibrl.testbed.realmodel import plot_runs

    records = [{"step": 0, "accuracy": 0.0, "auroc": None, "n_samples": 32},
               {"step": 2, "accuracy": 0.25, "auroc": 0.6, "n_samples": 32}]
    assert plot_runs({"GRPO": records}, tmp_path / "t.png").exists()


def test_demo_prints_each_evaluation_after_its_steps_line(tmp_path, monkeypatch):
    """The callback evaluates step 2 before TRL logs step 2's training line; the demo prints them in step order."""
    import calibrl.models
    from calibrl.testbed import realmodel

    def fake_train(config, out, *, on_log):
        on_log(0, {"eval_calibration/accuracy": 0.2, "eval_calibration/auroc": 0.6, "eval_calibration/ece": 0.1})
        on_log(1, {"reward": 0.25, "loss": 0.0})
        on_log(2, {"eval_calibration/accuracy": 0.3, "eval_calibration/auroc": 0.65, "eval_calibration/ece": 0.1})
        on_log(2, {"reward": 0.5, "loss": 0.0})
        records = [{"step": 0, "accuracy": 0.2, "auroc": 0.6, "n_samples": 32},
                   {"step": 2, "accuracy": 0.3, "auroc": 0.65, "n_samples": 32}]
        return {"records": records, "log_history": []}

    monkeypatch.setattr(realmodel, "train_real_model", fake_train)
    monkeypatch.setattr(calibrl.models, "resolve_model", lambda name: name)
    printed = []
    realmodel.run_real_model_demo(tmp_path / "demo", model="stand-in", steps=2, eval_prompts=8, eval_k=4,
                                  print_fn=printed.append)
    order = [line.split(":")[0] for line in printed if line.startswith(("step", "held-out"))]
    assert order == ["held-out evaluation at step 0", "step 1/2", "step 2/2", "held-out evaluation at step 2"]
    # the figure in the report has its caption under it
    report = (tmp_path / "demo" / "report.md").read_text()
    assert "![trajectories](trajectories.png)\n\n*Left: held-out accuracy at each evaluation" in report


def test_plot_runs_labels_overlap_no_title(tmp_path, monkeypatch):
    """The AUROC panel's y label once ran up into the figure's title: every title and axis label of the written
    figure has its own space, and each y label is no taller than its panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from calibrl.testbed.realmodel import plot_runs

    saved = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), savefig(fig, *a, **k))[1])
    records = [{"step": 0, "accuracy": 0.31, "auroc": 0.55, "n_samples": 128},
               {"step": 6, "accuracy": 0.36, "auroc": 0.58, "n_samples": 128}]
    plot_runs({"GRPO": records}, tmp_path / "t.png",
              title="builtin:smollm2-135m-instruct: multiple-choice (held-out 32 prompts x 4 samples)")
    (fig,) = saved
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    texts = {"suptitle": fig._suptitle}  # matplotlib keeps the suptitle Text here (no public getter)
    for i, ax in enumerate(fig.axes):
        texts.update({f"title {i}": ax.title, f"ylabel {i}": ax.yaxis.label, f"xlabel {i}": ax.xaxis.label})
        label, panel = ax.yaxis.label.get_window_extent(renderer), ax.get_window_extent(renderer)
        assert panel.y0 - 1 <= label.y0 and label.y1 <= panel.y1 + 1, f"axes {i}'s y label is taller than its panel"
    boxes = {name: text.get_window_extent(renderer) for name, text in texts.items()}
    for a, b in itertools.combinations(boxes, 2):
        assert not boxes[a].overlaps(boxes[b]), f"{a} overlaps {b}"
