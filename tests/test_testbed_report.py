"""The testbed report: findings computed from the results, tables, curves; studies/testbed.py keeps hand-written
Findings when it rebuilds docs/results/testbed.md."""

import math
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _testbed_script():
    from studies import testbed

    return testbed


def test_kept_findings_takes_the_section_up_to_the_tuning_notes():
    tb = _testbed_script()
    tuning_heading = tb.TUNING_NOTES.splitlines()[0]
    old = "\n".join([
        "# Testbed study", "", "## Decisions", "", "| a | b |", "",
        "## Findings (3 seeds)", "", "- GRPO loses AUROC.", "", "Second paragraph.", "",
        tuning_heading, "", "- lr 1e-4", "", "Wall time: 10 s.", ""])
    assert tb.kept_findings(old) == "## Findings (3 seeds)\n\n- GRPO loses AUROC.\n\nSecond paragraph.\n"
    # stops at the next level-2 heading or the wall-time line when there are no tuning notes
    assert tb.kept_findings("## Findings\nx\n## Other\ny\n") == "## Findings\nx\n"
    assert tb.kept_findings("## Findings\nx\n\nWall time: 3 s.\n") == "## Findings\nx\n"
    assert tb.kept_findings("# Testbed study\n\n## Decisions\n") == ""


def test_report_only_rebuild_keeps_findings_and_tables(tmp_path, capsys, monkeypatch):
    tb = _testbed_script()
    # the results name their run folders relative to the working directory: from tmp_path none exists, whatever
    # runs this checkout holds
    monkeypatch.chdir(tmp_path)
    results = ROOT / "docs" / "results"
    original = (results / "testbed.md").read_text()
    findings = tb.kept_findings(original)
    assert findings.startswith("## Findings"), "docs/results/testbed.md lost its Findings section"
    (tmp_path / "testbed.md").write_text(original)
    assert tb.main(["--report-only", "--merge", str(results / "testbed_results.json"), "--out", str(tmp_path),
                    "--runs", str(tmp_path / "runs")]) == 0
    rebuilt = (tmp_path / "testbed.md").read_text()
    assert findings in rebuilt
    assert rebuilt.index("## Findings") > rebuilt.index("## Decisions")
    assert rebuilt.count(tb.TUNING_NOTES.splitlines()[0]) == 1
    # the same tables as the committed report (the rebuild adds only its own command line)
    table_rows = lambda text: [line for line in text.splitlines() if line.startswith("| ")]
    assert table_rows(rebuilt) == table_rows(original)
    # headline.md (the README's table) is regenerated with the same rows
    assert table_rows((tmp_path / "headline.md").read_text()) == table_rows((results / "headline.md").read_text())
    err = capsys.readouterr().err
    assert "kept the Findings section" in err
    # the run folders are not under tmp_path: the reliability diagrams cannot be drawn, and the script says so
    assert "no final_samples.npz" in err and "testbed_reliability" not in rebuilt


def _run(method: str, label: str, seed: int, final: dict, *, task: str = "stochastic_reasoning", steps: int = 200):
    start = {"step": 0, "expected_accuracy": 0.31, "accuracy": 0.33, "auroc": 0.89, "auroc_ceiling": 0.915,
             "seq_ece": 0.04}
    end = {**start, "step": steps, **final}
    return {"task": task, "method": method, "key": f"{task}/{method}", "label": label, "seed": seed,
            "history": [start, end] if steps else [start]}


def _summary(grpo: dict, capo: dict, *, seeds=(0,), spread: float = 0.0) -> dict:
    """GRPO and CAPO runs with the given final metrics; seed k shifts every final value by k * spread."""
    shift = lambda final, k: {key: value + k * spread for key, value in final.items()}  # noqa: E731
    results = [_run(m, label, k, shift(final, k)) for k in seeds
               for m, label, final in (("grpo", "GRPO", grpo), ("capo", "CAPO", capo))]
    return {"config": {"methods": ["stochastic_reasoning/grpo", "stochastic_reasoning/capo"], "seeds": list(seeds)},
            "results": results}


def test_findings_name_the_best_and_worst_method_and_flip_with_the_numbers():
    from calibrl.testbed.report import findings

    grpo = {"expected_accuracy": 0.48, "auroc": 0.73, "auroc_ceiling": 0.84, "seq_ece": 0.31}
    capo = {"expected_accuracy": 0.46, "auroc": 0.79, "auroc_ceiling": 0.85, "seq_ece": 0.24}
    text = findings(_summary(grpo, capo), "stochastic_reasoning")
    assert "GRPO raised expected accuracy from 0.310 to 0.480 in 200 steps" in text[0]
    assert "AUROC of the sequence confidence fell from 0.890 to 0.730 (worse), 0.110 below the ceiling" in text[0]
    ranking = next(x for x in text if x.startswith("Most calibration kept"))
    assert ranking.startswith("Most calibration kept: CAPO, AUROC of the sequence confidence 0.790; least: GRPO, "
                              "0.730 (a difference of 0.060).")
    # unequal accuracy: said so, and the best calibrated is the least accurate
    unmatched = next(x for x in text if x.startswith("Not a comparison at matched accuracy"))
    assert "0.460 (CAPO) and 0.480 (GRPO)" in unmatched and "the best calibrated, CAPO, is also the least" in unmatched
    assert any(x.startswith("One seed") for x in text)
    # the numbers swapped: the sentences swap too
    flipped = findings(_summary(capo, grpo), "stochastic_reasoning")
    ranking = next(x for x in flipped if x.startswith("Most calibration kept"))
    assert ranking.startswith("Most calibration kept: GRPO, AUROC of the sequence confidence 0.790; least: CAPO, ")
    # a tiny difference is said to be one
    close = findings(_summary(grpo, {**capo, "auroc": 0.732}), "stochastic_reasoning")
    assert any("(a difference of 0.002, too small to tell the methods apart)" in x for x in close)
    # equal accuracy: no caveat, a matched comparison instead
    matched = findings(_summary(grpo, {**capo, "expected_accuracy": 0.475}), "stochastic_reasoning")
    assert not any(x.startswith("Not a comparison") for x in matched)
    assert any(x.startswith("The methods ended at matched expected accuracy") for x in matched)


def test_findings_compare_the_lead_with_the_seed_spread():
    from calibrl.testbed.report import findings

    grpo = {"expected_accuracy": 0.48, "auroc": 0.73, "auroc_ceiling": 0.84, "seq_ece": 0.31}
    capo = {"expected_accuracy": 0.47, "auroc": 0.79, "auroc_ceiling": 0.85, "seq_ece": 0.24}
    # seed k adds k * spread to every value: the std over seeds 0, 1, 2 is `spread`
    tight = findings(_summary(grpo, capo, seeds=(0, 1, 2), spread=0.005), "stochastic_reasoning")
    assert any("Over 3 seeds, CAPO's lead" in x and "0.060: it exceeds the seed spread" in x for x in tight)
    noisy = findings(_summary(grpo, capo, seeds=(0, 1, 2), spread=0.05), "stochastic_reasoning")
    assert any("0.060: it does not exceed the seed spread (sum of the two seed stds, 0.100)" in x for x in noisy)
    assert not any(x.startswith("One seed") for x in tight)


def test_decision_findings_rank_by_ece_and_keep_the_sft_row_out_of_the_ranking():
    from calibrl.testbed.report import findings, markdown_table, warm_start_sentence

    start = {"step": 0, "expected_accuracy": 0.52, "dec_ece": 0.12, "calib_err": 0.19,
             "greedy_decision_accuracy": 0.54}
    def run(method, label, final, steps=200):
        hist = [start] + ([{**start, **final, "step": steps}] if steps else [])
        return {"task": "decision", "method": method, "key": f"decision/{method}", "label": label, "seed": 0,
                "history": hist}
    summary = {"config": {"methods": ["decision/sft", "decision/grpo", "decision/decision"]}, "results": [
        run("sft", "SFT (warm start)", {}, steps=0),
        run("grpo", "GRPO", {"expected_accuracy": 0.68, "dec_ece": 0.19, "calib_err": 0.22,
                             "greedy_decision_accuracy": 0.70}),
        run("decision", "GRPO + decision CE", {"expected_accuracy": 0.62, "dec_ece": 0.06, "calib_err": 0.09,
                                               "greedy_decision_accuracy": 0.70})]}
    text = findings(summary, "decision")
    assert len([x for x in text if "expected accuracy from" in x]) == 2  # the SFT row is the warm start, not a run
    assert "decision ECE rose from 0.120 to 0.190 (worse)" in text[0]
    assert any(x.startswith("Most calibration kept: GRPO + decision CE, decision ECE 0.060; least: GRPO, 0.190") for x in text)
    assert any("SFT (warm start) 0.540, GRPO 0.700" in x for x in text)
    assert warm_start_sentence(summary, "decision").startswith("Warm start (SFT, step 0, shared by every method): "
                                                               "expected accuracy 0.520, decision ECE 0.120")
    # the SFT row is in the table already: no second warm-start row
    assert "warm start (SFT, step 0)" not in markdown_table(summary, "decision")


def test_sequence_table_has_a_warm_start_row():
    from calibrl.testbed.report import markdown_table

    grpo = {"expected_accuracy": 0.48, "auroc": 0.73, "auroc_ceiling": 0.84, "seq_ece": 0.31}
    rows = [r for r in markdown_table(_summary(grpo, grpo), "stochastic_reasoning").splitlines() if r.startswith("| ")]
    assert rows[1].startswith("| warm start (SFT, step 0) | 1 | 0 | 0.310 |")
    assert rows[2].startswith("| GRPO | 1 | 200 | 0.480 |")


def test_a_baseline_evaluated_once_is_drawn_across_the_curves_panel(tmp_path):
    """The warm-start row (one evaluation, at step 0) is a visible reference line, not a legend entry alone."""
    from matplotlib.image import imread

    from calibrl.evaluation.plots import plot_training_curves

    history = {"SFT (warm start)": [{"step": 0, "dec_ece": 0.5}],
               "GRPO": [{"step": 0, "dec_ece": 0.2}, {"step": 100, "dec_ece": 0.8}]}
    image = imread(plot_training_curves(history, ("dec_ece",), tmp_path / "curves.png"))[..., :3]
    panel = image[: int(image.shape[0] * 0.7)]  # above the legend row
    # matplotlib's C0 (the first series) is the only blue: its pixels, antialiased or not, are bluer than red
    bluish = panel[..., 2] - panel[..., 0] > 0.15
    columns = np.where(bluish.any(axis=0))[0]
    assert columns.size and columns.max() - columns.min() > 0.5 * image.shape[1]


def test_scratchpad_report_reads_the_gap_to_a_ceiling_of_one_and_says_which_regime(tmp_path):
    from calibrl.testbed.report import REGIME_NOTE, findings, write_demo_report

    final = {"expected_accuracy": 0.73, "auroc": 0.976, "auroc_ceiling": 1.0, "seq_ece": 0.2, "entropy": 0.05}
    runs = [_run(m, label, 0, f, task="scratchpad") for m, label, f in
            (("grpo", "GRPO", final), ("capo_tau0.6", "CAPO", {**final, "auroc": 0.972}))]
    for r in runs:
        r["history"][0].update(auroc_ceiling=1.0, auroc=0.836, expected_accuracy=0.403, entropy=0.093)
    summary = {"config": {"methods": ["scratchpad/grpo", "scratchpad/capo_tau0.6"], "seeds": [0]}, "results": runs}
    text = findings(summary, "scratchpad")
    assert "AUROC of the sequence confidence rose from 0.836 to 0.976 (better), 0.024 below the ceiling" in text[0]
    report = write_demo_report(summary, tmp_path).read_text()
    assert "testbed/scratchpad" in report and "ceiling − AUROC" in report and "entropy per token" in report
    assert REGIME_NOTE in report and "not reproduced" in REGIME_NOTE


def test_at_accuracy_reads_a_curve_where_it_first_reaches_the_accuracy():
    from calibrl.testbed.report import at_accuracy

    history = [{"expected_accuracy": 0.3, "auroc": 0.9}, {"expected_accuracy": 0.5, "auroc": 0.7},
               {"expected_accuracy": 0.4, "auroc": 0.6}, {"expected_accuracy": 0.6, "auroc": 0.5}]
    assert at_accuracy(history, "auroc", 0.35) == pytest.approx(0.85)  # a quarter of the way: 0.9 - 0.25 x 0.2
    assert at_accuracy(history, "auroc", 0.45) == pytest.approx(0.75)  # the FIRST crossing, not the later ones
    assert at_accuracy(history, "auroc", 0.3) == pytest.approx(0.9)
    assert math.isnan(at_accuracy(history, "auroc", 0.7))             # never reached
    assert at_accuracy([{"acc": 0.1, "x": 1.0}, {"acc": 0.3, "x": 3.0}], "x", 0.2, accuracy_key="acc") == pytest.approx(2.0)


def test_downstream_selection_is_scored_by_the_chosen_answers_true_success_probability():
    from studies import downstream as ds

    # prompt 0: answer 1 (q 0.2) three times at low probability, answer 2 (q 0.8) twice at high probability;
    # prompt 1: one answer (q 0.5). The drawn outcomes disagree with q on purpose: they must not be used.
    samples = {"prompt_index": np.array([0, 0, 0, 0, 0, 1, 1]),
               "answer_id": np.array([1, 1, 1, 2, 2, 3, 3]),
               "q_true": np.array([0.2, 0.2, 0.2, 0.8, 0.8, 0.5, 0.5]),
               "correct": np.array([True, True, True, False, False, True, False]),
               "logprob_mean": np.log(np.array([0.1, 0.1, 0.1, 0.9, 0.8, 0.5, 0.5])),
               "completion": np.array(["a", "b", "c", "d", "e", "f", "f"])}
    assert ds.selection_accuracy(samples, "majority") == pytest.approx((0.2 + 0.5) / 2)
    assert ds.selection_accuracy(samples, "weighted") == pytest.approx((0.8 + 0.5) / 2)  # 0.3 against 1.7
    assert ds.selection_accuracy(samples, "best_of_n") == pytest.approx((0.8 + 0.5) / 2)
    m = ds.run_metrics(samples)
    assert m["mean@8"] == pytest.approx(samples["q_true"].mean()) and m["oracle@8"] == pytest.approx(0.65)


def test_forms_study_endpoints_intervals_and_rule():
    from studies import forms_study as fs

    weights = {"learnable": 0.75, "hard": 0.25}

    def rec(learn, hard, entropy=0.5, step=0):
        return {"step": step, "expected_accuracy_learnable": learn, "expected_accuracy_hard": hard,
                "expected_accuracy_noise": 0.5, "entropy": entropy, "auroc": 0.8}

    # A = 0.75 learnable + 0.25 hard: 0.4, 0.7, 0.55 -> final 0.55, area 0.55, largest fall 0.15
    history = [rec(0.4, 0.4), rec(0.8, 0.1, step=75), rec(0.6, 0.4, entropy=0.3, step=150)]
    ends = fs.run_endpoints(history, weights)
    assert ends["hard_at_75"] == 0.1 and ends["hard_area"] == pytest.approx(0.3)
    history[1] = rec(0.8, 0.4, step=75)
    ends = fs.run_endpoints(history, weights)
    assert ends["final"] == pytest.approx(0.55) and ends["area"] == pytest.approx(1.65 / 3)
    assert ends["max_fall"] == pytest.approx(0.15) and ends["entropy"] == 0.3
    assert fs.run_endpoints([rec(0.1, 0.1), rec(0.2, 0.3)], weights)["max_fall"] == 0.0  # never falls
    # t-interval: differences 1, 2, 3 -> mean 2, sd 1, half-width t(0.975, 2) / sqrt(3) = 4.303 / 1.732
    mean, low, high = fs.paired_t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and high - mean == pytest.approx(4.302653 / 3 ** 0.5, rel=1e-5) and low < 0 < mean
    assert fs.verdict({"final": (0.02, 0.01, 0.03), "area": (0.0, -0.01, 0.01)}).startswith("claim reproduced")
    assert fs.verdict({"final": (0.02, 0.01, 0.03), "area": (-0.02, -0.03, -0.01)}).startswith("opposite")
    assert fs.verdict({"final": (0.0, -0.01, 0.01), "area": (0.0, -0.01, 0.01)}).startswith("not reproduced")
    # the learnable tiers' weights are their shares of the test prompts
    w = fs.tier_weights(128)
    assert set(w) == {"learnable", "hard"} and sum(w.values()) == pytest.approx(1.0) and w["learnable"] > w["hard"]


def test_matched_accuracy_differences_read_each_method_on_the_references_path():
    from calibrl.testbed.report import matched_accuracy_differences, paired_t_interval

    def run(method, seed, points):
        return {"task": "stochastic_reasoning", "method": method, "label": method.upper(), "seed": seed,
                "history": [{"step": 25 * i, "expected_accuracy": a, "auroc": u, "auroc_ceiling": 0.9,
                             "seq_ece": 0.1} for i, (a, u) in enumerate(points)]}

    summary = {"config": {"methods": []}, "results": [
        run("grpo", 0, [(0.3, 0.9), (0.5, 0.7)]), run("grpo", 1, [(0.3, 0.9), (0.5, 0.6)]),
        # seed 0: GRPO at 0.4 has 0.8 -> +0.05; seed 1: GRPO at 0.4 has 0.75 -> +0.07
        run("capo", 0, [(0.3, 0.9), (0.4, 0.85)]), run("capo", 1, [(0.3, 0.9), (0.4, 0.82)]),
        # beyond GRPO's reach in seed 1: read on its own curve at GRPO's final accuracy 0.5 (0.9 - 0.2 * 2/3)
        # against GRPO's final evaluation (0.6): +0.1667, not dropped
        run("fast", 0, [(0.3, 0.9), (0.45, 0.7)]), run("fast", 1, [(0.3, 0.9), (0.6, 0.7)]),
    ]}
    out = matched_accuracy_differences(summary, "stochastic_reasoning")
    assert set(out) == {"capo", "fast"}
    mean, low, high = out["capo"]["auroc"]
    assert mean == pytest.approx(0.06) and low < 0.06 < high and out["capo"]["reached"] == 2
    assert out["capo"]["auroc_gap"][0] == pytest.approx(-0.06)  # the gap moves opposite to the AUROC
    assert out["fast"]["reached"] == 1 and out["fast"]["at_reference_end"] == 1
    assert out["fast"]["auroc"][0] == pytest.approx(((0.7 - 0.75) + (0.9 - 0.2 * 2 / 3 - 0.6)) / 2)
    assert out["fast"]["accuracy"] == pytest.approx((0.45 + 0.5) / 2)  # the accuracies read at
    assert out["capo"]["at_reference_end"] == 0
    from calibrl.testbed.report import matched_note

    assert matched_note(out["fast"]) == " (1 of 2 seeds read at GRPO's final accuracy)"
    assert matched_note(out["capo"]) == ""
    assert all(np.isnan(paired_t_interval([])))


def test_write_figures_adds_the_tradeoff_plane_where_the_frontier_is_known(tmp_path):
    from calibrl.testbed.report import write_figures

    summary = _summary({"expected_accuracy": 0.48, "auroc": 0.73}, {"expected_accuracy": 0.46, "auroc": 0.79})
    names = [p.name for p in write_figures(summary, tmp_path, "stochastic_reasoning")]
    assert names == ["curves_stochastic_reasoning.png", "tradeoff_stochastic_reasoning.png"]  # no samples: no diagram
    addition = {**summary, "results": [{**r, "task": "addition"} for r in summary["results"]]}
    assert [p.name for p in write_figures(addition, tmp_path, "addition")] == ["curves_addition.png"]


def test_wall_time_says_what_a_merged_study_timed(tmp_path):
    import json

    from calibrl.testbed.report import wall_time_sentence
    from studies.testbed_study import merge_results

    assert wall_time_sentence({"seconds": 12.4, "command": "python -m studies.testbed --seeds 1"}) == "Wall time: 12 s."
    old = {"seconds": 100.0, "command": "python -m studies.testbed --seeds 1\npython -m studies.testbed --seeds 2\n"
                                        "python -m studies.testbed --report-only --merge a b"}
    assert wall_time_sentence(old) == ("Wall time: 100 s for one of the 2 training invocations above (the others' "
                                       "times were not recorded).")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"seconds": 50.0, "command": "python -m studies.testbed --first-seed 3",
                                 "results": [], "config": {}}))
    summary = {"seconds": 100.0, "command": "python -m studies.testbed --seeds 1", "results": [], "config": {}}
    merge_results(summary, [other])
    assert wall_time_sentence(summary) == "Wall time: 150 s over 2 training invocations."


def test_recorded_commands_are_shown_as_they_run_today():
    """The results files keep the commands as run (``python bench/testbed.py``, before the studies moved to the
    studies package); the pages show the command that runs today, and leave the cost benchmarks' alone."""
    from studies.testbed_study import runnable_command

    recorded = ("python bench/testbed.py --seeds 1 --runs runs/bench_testbed\n"
                "python bench/testbed.py --report-only --merge a.json\npython bench/advantages.py")
    assert runnable_command(recorded) == ("python -m studies.testbed --seeds 1 --runs runs/bench_testbed\n"
                                          "python -m studies.testbed --report-only --merge a.json\n"
                                          "python bench/advantages.py")


def test_every_figure_of_the_demo_report_has_a_caption_that_fits_it(tmp_path):
    """Under each figure, one sentence in italics saying what it shows and how to read it; the reliability
    caption follows what was drawn (points for several methods, bars for one) and the spread band is mentioned
    only where there are several seeds."""
    import re

    from calibrl.testbed.report import write_demo_report

    final = {"expected_accuracy": 0.48, "auroc": 0.73, "auroc_ceiling": 0.84, "seq_ece": 0.31}

    def report(summary, out):
        rng = np.random.default_rng(0)
        for r in summary["results"]:
            folder = out / "runs" / r["task"] / r["method"] / f"seed{r['seed']}"
            folder.mkdir(parents=True)
            np.savez(folder / "final_samples.npz", seq_prob=rng.random(200), correct=rng.random(200) < 0.5)
        text = write_demo_report(summary, out).read_text()
        figures = re.findall(r"^!\[(\w+)\]\(\1\.png\)\n\n(.*)$", text, flags=re.MULTILINE)
        assert len(figures) == text.count("![") == 3
        assert all(caption.startswith("*") and caption.endswith(".*") for _, caption in figures), figures
        assert not any(". " in caption for _, caption in figures), figures  # one sentence each
        return dict(figures)

    two = report(_summary(final, final), tmp_path / "two")
    assert "one panel per metric over the RL steps" in two["curves_stochastic_reasoning"]
    assert "band" not in two["curves_stochastic_reasoning"]
    assert "beside the dashed ideal sampler" in two["tradeoff_stochastic_reasoning"]
    reliability = two["reliability_stochastic_reasoning"]
    assert "sequence probability in equal-width bins" in reliability and "each point is a bin's share" in reliability
    assert "below it over-confident" in reliability

    one = _summary(final, final, seeds=(0, 1))
    one["results"] = [r for r in one["results"] if r["method"] == "grpo"]
    captions = report(one, tmp_path / "one")
    assert "the bars are the share right in each bin" in captions["reliability_stochastic_reasoning"]
    assert "the band their range" in captions["curves_stochastic_reasoning"]
