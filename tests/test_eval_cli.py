"""End-to-end ``calibrl eval`` on synthetic JSONL and Parquet files."""

import json
import os
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from calibrl import metrics as M
from calibrl import selection as S
from calibrl.cli import app
from calibrl.evaluation.samples import load_samples
from calibrl.selection.voting import confidence_weighted_vote

runner = CliRunner()
# the tests that read the figures draw them; the others skip drawing (most of an eval's time at this size)
FIGURES = ["--bootstrap", "20", "--scaling-draws", "2", "--rpc-draws", "1", "--no-math-verify"]
FAST = [*FIGURES, "--no-figures"]


def _rows(seed, n_prompts=10, n=4):
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        for j in range(n):
            correct = bool(rng.random() < 0.5)
            answer = str(p) if correct else str(10 + int(rng.integers(0, 3)))
            rows.append({"prompt_id": f"q{p}", "benchmark": "easy" if p < n_prompts // 2 else "hard",
                         "correct": correct, "answer": answer, "completion": f"path {j % 3} {answer}",
                         "logprob_mean": float(-rng.exponential(0.2 if correct else 0.5))})
    return rows


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_end_to_end_jsonl_metrics_match_library(tmp_path):
    src = _jsonl(tmp_path / "model_a.jsonl", _rows(0))
    out = tmp_path / "report"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), "--posthoc", "isotonic", *FIGURES])
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    for scope in ("overall", "easy", "hard"):
        for kind in ("reliability", "roc", "precision_coverage", "scaling", "reliability_isotonic"):
            assert f"{scope}_{kind}.png" in names
    assert {"metrics.json", "report.md"} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report")]  # temp dir renamed away

    data = json.loads((out / "metrics.json").read_text())
    m = data["results"]["overall"]["model_a"]
    s = load_samples(src)
    conf, y, pid = np.exp(s.logprob_mean), s.correct, s.prompt_index
    assert m["accuracy"] == pytest.approx(M.mean_at_k(y, pid))
    assert m["pass@4"] == pytest.approx(M.pass_at_k(y, pid, 4))
    assert m["auroc"] == pytest.approx(M.auroc(s.logprob_mean, y))
    assert m["auroc_per_prompt"] == pytest.approx(M.per_prompt_auroc(s.logprob_mean, y, pid).mean)
    assert m["ece"] == pytest.approx(M.ece(conf, y, n_bins=10))
    assert m["ece_quantile"] == pytest.approx(M.ece(conf, y, n_bins=10, strategy="quantile"))
    assert m["brier"] == pytest.approx(M.brier(conf, y))
    assert m["aurc"] == pytest.approx(M.aurc(conf, y))
    low, high = m["bootstrap"]["auroc"]
    assert low <= m["auroc"] <= high
    ids = S.answer_clusters(s.answers, s.prompt_ids, use_math_verify=False)
    assert m["selection"]["majority"] == pytest.approx(S.majority_vote(ids, y, pid).accuracy)
    assert m["selection"]["pc"] == pytest.approx(
        S.perplexity_consistency(ids, y, pid, logprob_mean=s.logprob_mean, completions=s.completions).accuracy)
    assert m["scaling"]["pc"]["accuracy"][0] == pytest.approx(M.mean_at_k(y, pid))
    ph = M.ece(__import__("calibrl.posthoc", fromlist=["x"]).cross_validated_posthoc("isotonic", conf, y, pid), y)
    assert m["posthoc"]["ece"] == pytest.approx(ph)
    hard = data["results"]["hard"]["model_a"]
    assert hard["n_prompts"] == 5 and hard["n_samples"] == 20
    assert "model_a" in res.output and "accuracy" in res.output  # terminal summary

    # --no-figures: the same figures and intervals, no PNG, and metrics.json and the report list none
    bare = tmp_path / "bare"
    res = runner.invoke(app, ["eval", str(src), "--out", str(bare), "--posthoc", "isotonic", *FAST])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in bare.iterdir()) == ["metrics.json", "report.md"]
    bare_data = json.loads((bare / "metrics.json").read_text())
    assert bare_data["results"] == data["results"] and bare_data["settings"]["figures"] is False
    assert set(bare_data["figures"]) == set(data["figures"]) and not any(bare_data["figures"].values())
    assert ".png" not in (bare / "report.md").read_text()


def test_two_files_side_by_side_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    a = _jsonl(tmp_path / "grpo.jsonl", _rows(1))
    rows = _rows(2)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "capo.parquet")
    out = tmp_path / "cmp"
    res = runner.invoke(app, ["eval", str(a), str(tmp_path / "capo.parquet"), "--out", str(out), *FIGURES,
                              "--methods", "majority,pc"])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "metrics.json").read_text())
    assert list(data["results"]["overall"]) == ["grpo", "capo"]
    s = load_samples(tmp_path / "capo.parquet")
    assert data["results"]["overall"]["capo"]["auroc"] == pytest.approx(M.auroc(s.logprob_mean, s.correct))
    report = (out / "report.md").read_text()
    assert "| metric | grpo | capo |" in report and "![overall_scaling.png](overall_scaling.png)" in report
    assert set(data["results"]["overall"]["grpo"]["selection"]) == {"majority", "pc"}


def test_bad_input_exits_2_and_writes_nothing(tmp_path):
    good = _jsonl(tmp_path / "good.jsonl", _rows(0))
    rows = _rows(1)
    rows[5]["logprob_mean"] = "oops"
    bad = _jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "never"
    res = runner.invoke(app, ["eval", str(good), str(bad), "--out", str(out), *FAST])
    assert res.exit_code == 2
    assert "bad.jsonl:6: field 'logprob_mean': expected a number" in res.output
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl"]


def test_refuses_foreign_output_folder_but_replaces_previous_report(tmp_path):
    src = _jsonl(tmp_path / "s.jsonl", _rows(0))
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    res = runner.invoke(app, ["eval", str(src), "--out", str(foreign), *FAST, "--methods", ""])
    assert res.exit_code == 2 and (foreign / "notes.txt").read_text() == "keep me"
    out = tmp_path / "rep"
    for _ in range(2):
        res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, "--methods", "", "--bootstrap", "0"])
        assert res.exit_code == 0, res.output
    assert "selection" not in json.loads((out / "metrics.json").read_text())["results"]["overall"]["s"]


def test_plot_training_curves_writes_png(tmp_path):
    from matplotlib.image import imread

    from calibrl.evaluation.plots import plot_training_curves

    history = {
        "grpo": [{"step": 0, "auroc": 0.6, "ece": 0.1}, {"step": 0, "auroc": 0.7, "ece": 0.2},
                 {"step": 10, "auroc": 0.5, "ece": None}],
        "capo": [{"step": 0, "auroc": 0.6}, {"step": 10, "auroc": 0.8}],
    }
    path = plot_training_curves(history, ("auroc", "ece", "accuracy"), tmp_path / "sub" / "curves.png")
    assert path == tmp_path / "sub" / "curves.png" and imread(path).shape[1] > 600  # three panels
    with pytest.raises(TypeError, match="path"):
        plot_training_curves(history)


def test_plot_metric_paths_draws_each_methods_mean_path_in_step_order(tmp_path, monkeypatch):
    from calibrl.evaluation import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    history = {  # two seeds of one method, records out of step order; a record without the y metric is skipped
        "grpo": [{"step": 10, "acc": 0.5, "auroc": 0.7}, {"step": 0, "acc": 0.3, "auroc": 0.9},
                 {"step": 10, "acc": 0.6, "auroc": 0.6}, {"step": 0, "acc": 0.3, "auroc": 0.8},
                 {"step": 20, "acc": 0.7}],
    }
    plots.plot_metric_paths(history, x="acc", y=("auroc", "acc"), path=tmp_path / "p.png",
                            references={"auroc": ([0.2, 0.8], [0.95, 0.7], "frontier")})
    fig = drawn["fig"]
    left, right = fig.axes[:2]
    path_line = left.lines[0]
    assert path_line.get_xdata().tolist() == pytest.approx([0.3, 0.55])  # step 0 then step 10, seeds averaged
    assert path_line.get_ydata().tolist() == pytest.approx([0.85, 0.65])
    assert left.lines[1].get_xdata().tolist() == pytest.approx([0.55])  # the last evaluation, circled
    assert [line.get_label() for line in left.lines][-1] == "frontier" and len(right.lines) == 2  # no frontier
    assert right.lines[0].get_xdata().tolist() == pytest.approx([0.3, 0.55, 0.7])


def _two_benchmark_rows(seed=3, n_prompts=20, n=4):
    # prompt ids 0..19 in BOTH aime and math500: 40 different prompts
    rng = np.random.default_rng(seed)
    rows = []
    for bench in ("aime", "math500"):
        for p in range(n_prompts):
            for _ in range(n):
                correct = bool(rng.random() < 0.5)
                answer = str(p) if correct else str(100 + int(rng.integers(0, 2)))
                rows.append({"prompt_id": p, "benchmark": bench, "correct": correct, "answer": answer,
                             "logprob_mean": float(-rng.exponential(0.2 if correct else 0.5))})
    return rows


def test_same_prompt_id_in_two_benchmarks_is_two_prompts(tmp_path):
    rows = _two_benchmark_rows()
    src = _jsonl(tmp_path / "two.jsonl", rows)
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FIGURES, "--methods", "majority,weighted"])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())["results"]["overall"]["two"]
    key = np.asarray([f"{r['benchmark']}/{r['prompt_id']}" for r in rows])
    y = np.asarray([r["correct"] for r in rows])
    lpm = np.asarray([r["logprob_mean"] for r in rows])
    ans = [r["answer"] for r in rows]
    assert m["n_prompts"] == 40 and m["samples_per_prompt"] == {"min": 4, "max": 4}
    assert m["pass@4"] == pytest.approx(M.pass_at_k(y, key, 4))
    ppa = M.per_prompt_auroc(lpm, y, key)
    assert m["auroc_n_prompts"] == ppa.n_prompts
    assert m["auroc_per_prompt"] == pytest.approx(ppa.mean)
    ids = S.answer_clusters(ans, key, use_math_verify=False)
    assert m["selection"]["majority"] == pytest.approx(S.majority_vote(ids, y, key).accuracy)
    assert m["selection"]["weighted"] == pytest.approx(S.weighted_vote(ids, y, key, logprob_mean=lpm).accuracy)
    # merged (wrong) keying gives different figures on this data
    assert M.pass_at_k(y, [r["prompt_id"] for r in rows], 4) != pytest.approx(m["pass@4"])
    assert load_samples(src).n_prompts == 40


def test_out_containing_the_input_is_refused_and_nothing_deleted(tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    src = _jsonl(rep / "my_samples.jsonl", _rows(0))
    (rep / "NOTES.txt").write_text("mine")
    res = runner.invoke(app, ["eval", str(src), "--out", str(rep), *FAST, "--methods", ""])
    assert res.exit_code == 2
    assert "lies inside --out" in res.output
    assert sorted(p.name for p in rep.iterdir()) == ["NOTES.txt", "my_samples.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # no temp folder left


def test_previous_report_plus_user_file_is_refused_then_clean_rerun_replaces(tmp_path):
    src = _jsonl(tmp_path / "s.jsonl", _rows(0))
    out = tmp_path / "rep"
    args = ["eval", str(src), "--out", str(out), *FIGURES, "--methods", "", "--bootstrap", "0"]
    assert runner.invoke(app, args).exit_code == 0
    first = sorted(p.name for p in out.iterdir())
    assert "metrics.json" in first and "overall_roc.png" in first
    # a normal rerun into the same --out replaces calibrl's own files
    (out / "overall_roc.png").write_bytes(b"stale")
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == first
    assert (out / "overall_roc.png").read_bytes()[:4] == b"\x89PNG"
    # a user's file beside a previous report: refused, nothing touched
    (out / "NOTES.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert "did not write (NOTES.txt)" in res.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # a sub-folder is not calibrl's either
    (out / "NOTES.txt").unlink()
    (out / "extra").mkdir()
    assert runner.invoke(app, args).exit_code == 2 and (out / "extra").is_dir()
    # a metrics.json that is not calibrl's (no figures/results) is refused too
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.json").write_text('{"loss": 1.0}')
    assert runner.invoke(app, ["eval", str(src), "--out", str(other), *FIGURES, "--methods", ""]).exit_code == 2
    assert (other / "metrics.json").read_text() == '{"loss": 1.0}'


def test_partial_logprob_mean_skips_logprob_methods_with_a_note(tmp_path):
    rows = _rows(4)
    for i, r in enumerate(rows):
        r["decision_prob"] = float(np.exp(r["logprob_mean"]))
        if i % 2:
            del r["logprob_mean"]
    src = _jsonl(tmp_path / "partial.jsonl", rows)
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, "--confidence", "decision_prob"])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())["results"]["overall"]["partial"]
    assert set(m["selection"]) == {"majority", "best_of_n"}
    assert m["selection_skipped"] == {k: "logprob_mean missing on 20 of 40 rows" for k in ("weighted", "pc", "rpc")}
    s = load_samples(src, confidence="decision_prob")
    ids = S.answer_clusters(s.answers, s.prompt_index, use_math_verify=False)
    assert m["selection"]["best_of_n"] == pytest.approx(
        S.best_of_n(ids, s.correct, s.prompt_index, confidence=s.decision_prob).accuracy)
    report = (out / "report.md").read_text()
    assert "Not run for partial: weighted, pc, rpc (logprob_mean missing on 20 of 40 rows" in report


def test_gzipped_input_exits_2_with_a_message(tmp_path):
    import gzip

    gz = tmp_path / "s.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in _rows(0)).encode()))
    res = runner.invoke(app, ["eval", str(gz), "--out", str(tmp_path / "rep"), *FAST])
    assert res.exit_code == 2 and "s.jsonl.gz:1: not UTF-8 text" in res.output
    assert not (tmp_path / "rep").exists()


def test_posthoc_section_says_pooled_out_of_fold_auroc_can_change(tmp_path):
    src = _jsonl(tmp_path / "s.jsonl", _rows(5, n_prompts=20))
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, "--methods", "", "--posthoc", "temperature"])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())["results"]["overall"]["s"]
    s = load_samples(src)
    from calibrl.posthoc import cross_validated_posthoc

    cal = cross_validated_posthoc("temperature", s.confidence(), s.correct, s.prompt_index, n_splits=5, seed=0)
    assert m["posthoc"]["auroc"] == pytest.approx(M.auroc(cal, s.correct))
    assert "pools out-of-fold values from maps fit on different folds" in (out / "report.md").read_text()


def test_labels_figure_names_and_short_prompt_note(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from calibrl.cli.eval import _labels

    assert _labels([tmp_path / "x.jsonl", tmp_path / "x.parquet"]) == [f"{tmp_path.name}/x.jsonl",
                                                                       f"{tmp_path.name}/x.parquet"]
    rows = _rows(6)
    for r in rows:
        r["benchmark"] = "a/b" if r["benchmark"] == "easy" else "a b"
    rows = [r for r in rows if not (r["prompt_id"] == "q0" and r["completion"] != "path 0 " + r["answer"])]
    rows = [r for i, r in enumerate(rows) if r["prompt_id"] != "q0" or i == 0]  # q0 keeps one path
    _jsonl(tmp_path / "x.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(tmp_path / "x.jsonl"), str(tmp_path / "x.parquet"), "--out", str(out),
                              *FIGURES, "--methods", "majority"])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "metrics.json").read_text())
    assert list(data["results"]["overall"]) == [f"{tmp_path.name}/x.jsonl", f"{tmp_path.name}/x.parquet"]
    figs = data["figures"]
    assert figs["a/b"][0] != figs["a b"][0]
    assert all((out / n).is_file() for names in figs.values() for n in names)
    m = data["results"]["overall"][f"{tmp_path.name}/x.jsonl"]
    assert m["scaling"]["majority"]["ns"] == [1]
    assert m["scaling_note"] == "the scaling curves stop at N = 1: 1 of 10 prompts have only 1 path(s) (others up to 4)"
    assert "Note for" in (out / "report.md").read_text() and "stop at N = 1" in (out / "report.md").read_text()


def test_long_benchmark_names_get_short_unique_figure_names(tmp_path):
    rows = _rows(7)
    long_a, long_b = "x" * 249 + "a", "x" * 249 + "b"  # differ only past any truncation
    for r in rows:
        r["benchmark"] = long_a if r["benchmark"] == "easy" else long_b
    src = _jsonl(tmp_path / "s.jsonl", rows)
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FIGURES, "--methods", "majority"])
    assert res.exit_code == 0, res.output
    figs = json.loads((out / "metrics.json").read_text())["figures"]
    assert figs[long_a][0] != figs[long_b][0]
    assert all(len(n) <= 120 and (out / n).is_file() for names in figs.values() for n in names)


@pytest.mark.parametrize("option,value", [("--seed", "-1"), ("--seed", str(2**32)), ("--n-bins", "1000000000"),
                                          ("--n-bins", "1"), ("--bootstrap", "-1"), ("--abstain-precision", "1"),
                                          ("--abstain-delta", "0")])
def test_out_of_range_options_exit_2_with_a_message(tmp_path, option, value):
    src = _jsonl(tmp_path / "s.jsonl", _rows(0))
    res = runner.invoke(app, ["eval", str(src), "--out", str(tmp_path / "rep"), *FAST, option, value])
    assert res.exit_code == 2 and option in res.output and isinstance(res.exception, SystemExit)
    assert not (tmp_path / "rep").exists()


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_run_is_recovered_on_the_next_run(tmp_path):
    src = _jsonl(tmp_path / "s.jsonl", _rows(0))
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, "--methods", ""])
    assert res.exit_code == 0, res.output
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    pid = _dead_pid()
    # killed between the two renames: the old report is only in .rep.old-PID, the new one in a temp folder
    out.rename(tmp_path / f".rep.old-{pid}")
    stale = tmp_path / f".rep.tmp-{pid}-abc123"
    stale.mkdir()
    (stale / "metrics.json").write_text("{}")
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt_id": "q", "correct": "maybe"}])
    res = runner.invoke(app, ["eval", str(bad), "--out", str(out), *FAST])
    assert res.exit_code == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old report is back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "rep", "s.jsonl"]
    # a live process's temp folder is left alone
    live = tmp_path / f".rep.tmp-{_live_pid()}-x"
    live.mkdir()
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, "--methods", ""])
    assert res.exit_code == 0 and live.is_dir()


def _live_pid() -> int:
    return os.getppid()


def test_format_option_is_passed_to_the_reader(tmp_path):
    from calibrl.cli.eval import SampleFormat
    from calibrl.evaluation.readers import FORMATS

    assert tuple(f.value for f in SampleFormat) == FORMATS
    help_text = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "200"}).output
    assert "--format" in help_text and "lm-eval" in help_text
    src = _jsonl(tmp_path / "s.jsonl", _rows(0))
    res = runner.invoke(app, ["eval", str(src), "--out", str(tmp_path / "a"), *FAST, "--format", "calibrl",
                              "--methods", ""])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["eval", str(src), "--out", str(tmp_path / "b"), *FAST, "--format", "vllm"])
    assert res.exit_code == 2 and "s.jsonl" in res.output and not (tmp_path / "b").exists()


def test_input_without_confidence_gets_accuracy_and_majority_only(tmp_path):
    """A TRL completions log written without calibrl's columns has correctness but no confidence: eval reports
    accuracy and majority vote for it (no confidence metric, figure or post-hoc), beside an input that has one."""
    from pathlib import Path

    formats = Path(__file__).parent / "fixtures" / "formats"
    out = tmp_path / "rep"
    result = runner.invoke(app, ["eval", str(formats / "trl_plain"), str(formats / "trl_completions"), "--out",
                                 str(out), "--posthoc", "temperature", "--bootstrap", "50"])
    assert result.exit_code == 0, result.output
    payload = json.loads((out / "metrics.json").read_text())
    plain = payload["results"]["overall"]["trl_plain"]
    full = payload["results"]["overall"]["trl_completions"]
    samples = load_samples(formats / "trl_plain")
    assert plain["accuracy"] == pytest.approx(M.mean_at_k(samples.correct, samples.prompt_index))
    assert "auroc" not in plain and "precision_at_coverage" not in plain
    assert set(plain["bootstrap"]) == {"n_boot", "alpha", "accuracy"}
    assert plain["posthoc"]["skipped"] == "no confidence in the input"
    assert list(plain["selection"]) == ["majority"]
    assert "best_of_n" in plain["selection_skipped"]
    assert "auroc" in full and "weighted" in full["selection"]
    assert (out / "overall_reliability.png").exists()  # drawn for the input that has a confidence
    assert payload["inputs"][0]["format"] == "trl" and payload["inputs"][0]["notes"]


# ------------------------------------------------------------------------ confidence sources and abstention
def _rows_with_verbalized(seed=5, n_prompts=30, n=4):
    """_rows plus a verbalized confidence: a field on some rows, a <confidence> tag in the text on others, none
    on every fourth row."""
    rows = _rows(seed, n_prompts, n)
    rng = np.random.default_rng(seed)
    for i, r in enumerate(rows):
        value = round(float(np.clip((0.7 if r["correct"] else 0.4) + rng.normal(0, 0.15), 0, 1)), 2)
        if i % 4 == 0:
            r["completion"] += f" <confidence>{value}</confidence>"
        elif i % 4 != 3:
            r["verbalized_confidence"] = value
    return rows


def test_confidence_sources_side_by_side_and_weighted_verbalized(tmp_path):
    src = _jsonl(tmp_path / "rlcr.jsonl", _rows_with_verbalized())
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FIGURES, "--methods", "majority,weighted"])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "metrics.json").read_text())
    m = data["results"]["overall"]["rlcr"]
    s = load_samples(src)
    has = ~np.isnan(s.verbalized_confidence)
    assert has.sum() == 90  # 120 rows, every fourth states none
    verbal, y = s.verbalized_confidence[has], s.correct[has]
    sources = m["confidence_sources"]
    assert m["confidence"] == "logprob_mean" and m["auroc"] == pytest.approx(M.auroc(s.logprob_mean, s.correct))
    assert sources["logprob_mean"]["n"] == 120 and sources["logprob_mean"]["n_excluded"] == 0
    assert sources["logprob_mean"]["ece"] == pytest.approx(m["ece"])
    v = sources["verbalized_confidence"]
    assert v["n"] == 90 and v["n_excluded"] == 30
    assert v["auroc"] == pytest.approx(M.auroc(verbal, y)) and v["ece"] == pytest.approx(M.ece(verbal, y))
    assert v["brier"] == pytest.approx(M.brier(verbal, y)) and v["aurc"] == pytest.approx(M.aurc(verbal, y))
    # confidence-weighted vote with the stated confidence (rows without one add nothing)
    ids = S.answer_clusters(s.answers, s.prompt_ids, use_math_verify=False)
    expected = confidence_weighted_vote(ids, s.correct, s.prompt_index, confidence=s.verbalized_confidence)
    assert m["selection"]["weighted_verbalized"] == pytest.approx(expected.accuracy)
    assert m["scaling"]["weighted_verbalized"]["accuracy"][0] == pytest.approx(m["accuracy"])  # N = 1: mean@k
    assert "overall_reliability_sources.png" in data["figures"]["overall"]
    assert (out / "overall_reliability_sources.png").is_file()
    assert data["inputs"][0]["confidence_sources"] == ["logprob_mean", "verbalized_confidence"]
    report = (out / "report.md").read_text()
    # one input: the table of confidence sources has no input column; rows end with their row counts
    assert re.search(r"^\| `verbalized_confidence` \|.*\| 90 \(30 excluded\) \|$", report, re.M)
    assert re.search(r"^\| `logprob_mean` \(main\) \|.*\| 120 \(0 excluded\) \|$", report, re.M)
    assert {"answer_consistency", "semantic_entropy"} <= set(sources)  # the input has answers


def test_single_source_input_has_no_per_source_reliability_figure(tmp_path):
    # without answers the only source is the confidence field (no answer-agreement sources)
    src = _jsonl(tmp_path / "s.jsonl", [{k: v for k, v in r.items() if k != "answer"} for r in _rows(0)])
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FIGURES, "--methods", ""])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "metrics.json").read_text())
    assert list(data["results"]["overall"]["s"]["confidence_sources"]) == ["logprob_mean"]
    assert "reliability_sources" not in " ".join(data["figures"]["overall"])
    # with answers and no selection method, the answers are still clustered for the answer-agreement sources
    src = _jsonl(tmp_path / "a.jsonl", _rows(0))
    res = runner.invoke(app, ["eval", str(src), "--out", str(tmp_path / "rep2"), *FIGURES, "--methods", ""])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "rep2" / "metrics.json").read_text())
    assert list(data["results"]["overall"]["a"]["confidence_sources"]) == [
        "logprob_mean", "answer_consistency", "semantic_entropy"]


def _separable_rows(n_prompts=400, n=4, seed=0):
    """Right answers at confidence ~0.95, wrong ones at ~0.3: a threshold certifies precision 0.9."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        for _ in range(n):
            correct = bool(rng.random() < 0.6)
            conf = (0.95 if correct else 0.3) + rng.uniform(-0.04, 0.04)
            rows.append({"prompt_id": p, "correct": correct, "logprob_mean": float(np.log(conf))})
    return rows


def test_abstention_threshold_in_metrics_report_and_terminal(tmp_path):
    src = _jsonl(tmp_path / "s.jsonl", _separable_rows())
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, "--methods", "",
                              "--abstain-precision", "0.9", "--abstain-delta", "0.1", "--seed", "4",
                              "--abstain-method", "bonferroni"])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "metrics.json").read_text())
    a = data["results"]["overall"]["s"]["abstention"]
    s = load_samples(src)
    ref = M.calibrated_abstention(np.exp(s.logprob_mean), s.correct, s.prompt_index, target_precision=0.9,
                                  delta=0.1, seed=4, method="bonferroni")
    assert ref.threshold is not None and 0.34 <= ref.threshold <= 0.91  # between the two clusters
    assert a["threshold"] == pytest.approx(ref.threshold) and a["coverage"] == pytest.approx(ref.coverage)
    assert a["precision_heldout"] == 1.0 and a["target_precision"] == 0.9 and a["delta"] == 0.1
    assert a["n_calibration_prompts"] == 200 and a["confidence"] == "logprob_mean"
    assert data["settings"]["abstain_precision"] == 0.9
    assert f"answer when confidence >= {ref.threshold:g}" in res.output
    assert "Abstention: answer only when confidence >= t" in (out / "report.md").read_text()


def test_abstention_betting_is_the_default_and_marked_on_the_plot(tmp_path):
    src = _jsonl(tmp_path / "s.jsonl", _separable_rows())
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FIGURES, "--methods", "",
                              "--abstain-precision", "0.9", "--abstain-delta", "0.1", "--seed", "4"])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "metrics.json").read_text())
    a = data["results"]["overall"]["s"]["abstention"]
    s = load_samples(src)
    ref = M.calibrated_abstention(np.exp(s.logprob_mean), s.correct, s.prompt_index, target_precision=0.9,
                                  delta=0.1, seed=4)
    assert ref.method_name == "betting" and a["method_name"] == "betting" and a["method"] == ref.method
    assert ref.threshold is not None and a["threshold"] == pytest.approx(ref.threshold)
    assert a["n_calibration_prompts"] == 320 and a["n_calibration_samples"] == 1280
    assert a["coverage"] == pytest.approx(ref.coverage) and a["calibration_p_value"] <= 0.1
    assert data["settings"]["abstain_method"] == "betting"
    assert f"answer when confidence >= {ref.threshold:g}" in res.output and "method betting" in res.output
    report = (out / "report.md").read_text()
    assert "Guaranteed: if prompts are exchangeable" in report and "prompt-level betting test" in report
    assert "overall_precision_coverage.png" in data["figures"]["overall"]


def test_abstention_says_plainly_when_no_threshold_qualifies(tmp_path):
    src = _jsonl(tmp_path / "s.jsonl", _rows(0))  # 10 prompts: far too few to certify precision 0.99
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, "--methods", "",
                              "--abstain-precision", "0.99"])
    assert res.exit_code == 0, res.output
    a = json.loads((out / "metrics.json").read_text())["results"]["overall"]["s"]["abstention"]
    assert a["threshold"] is None and a["coverage"] == 0.0 and a["precision_heldout"] is None
    assert "NO threshold satisfies precision >= 0.99" in res.output
    report = (out / "report.md").read_text()
    assert "**s: no threshold satisfies the target.**" in report
    # nothing is certified, so no guarantee is stated
    assert "Guaranteed" not in report and "Abstention: no threshold t (answer only when confidence >= t) is " \
        "certified for precision >= 0.99" in report


def test_report_counts_truncated_and_unanswered_samples_beside_the_accuracy(tmp_path):
    # 3 prompts x 4 samples; as calibrl generate writes them: truncated rows stopped at the token limit
    rows = [{"prompt_id": p, "sample_index": j, "correct": j == 0, "logprob_mean": -0.2 * (j + 1),
             "truncated": j >= 2, "answer": None if j == 3 or (p == 0 and j == 1) else str(j)}
            for p in range(3) for j in range(4)]
    rows[0]["truncated"] = None  # a row that does not say counts as not truncated
    src = _jsonl(tmp_path / "g.jsonl", rows)
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, "--methods", ""])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())["results"]["overall"]["g"]
    assert m["n_truncated"] == 6 and m["n_no_answer"] == 4 and m["n_samples"] == 12
    report = (out / "report.md").read_text()
    assert "the fraction right among their 4 samples; 6 of 12 samples were cut at the token limit and 4 have no " \
        "extracted answer." in report
    assert "| samples cut at the token limit | 6 of 12 |" in report
    assert "| samples with no extracted answer | 4 of 12 |" in report
    bad = runner.invoke(app, ["eval", str(_jsonl(tmp_path / "b.jsonl", [dict(rows[1], truncated="yes")])),
                              "--out", str(tmp_path / "b"), *FAST])
    assert bad.exit_code == 2 and "b.jsonl:1: field 'truncated': expected a bool, got str 'yes'" in bad.output


def test_a_row_over_the_size_limit_exits_2_with_its_line_and_leaves_nothing(tmp_path, monkeypatch):
    from calibrl.evaluation.readers import base

    monkeypatch.setattr(base, "MAX_ROW_BYTES", 2000)
    rows = _rows(0)
    rows[6]["completion"] = "x" * 5000
    src = _jsonl(tmp_path / "big.jsonl", rows)
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST])
    assert res.exit_code == 2, res.output
    assert "big.jsonl:7: the row is too large" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]  # no report, no .rep.tmp-* folder


def test_running_out_of_memory_while_reading_exits_2_and_leaves_nothing(tmp_path, monkeypatch):
    import calibrl.evaluation.samples as samples_module

    def exhausted(path, **_options):
        raise MemoryError

    monkeypatch.setattr(samples_module, "load_samples", exhausted)
    src = _jsonl(tmp_path / "s.jsonl", _rows(0))
    res = runner.invoke(app, ["eval", str(src), "--out", str(tmp_path / "rep"), *FAST])
    assert res.exit_code == 2 and "s.jsonl: out of memory while reading it" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


def test_pc_and_rpc_in_the_report_match_the_texts_read_again(tmp_path):
    """The report's PC / RPC (from the rows' text ids) equal the selection on the completion texts themselves."""
    rows = _rows(4, n_prompts=6, n=8)
    src = _jsonl(tmp_path / "s.jsonl", rows)
    out = tmp_path / "rep"
    res = runner.invoke(app, ["eval", str(src), "--out", str(out), *FAST, "--methods", "pc,rpc"])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())["results"]["overall"]["s"]
    s = load_samples(src)
    ids = S.answer_clusters(s.answers, s.prompt_index, use_math_verify=False)
    texts = [r["completion"] for r in rows]
    assert s.completions.tolist() == texts
    for method in ("pc", "rpc"):
        expected = S.select(method, ids, s.correct, s.prompt_index, logprob_mean=s.logprob_mean, completions=texts)
        assert m["selection"][method] == pytest.approx(expected.accuracy)


def test_an_eval_that_wrote_its_report_ends_without_the_collectors_passes(tmp_path, monkeypatch):
    """``calibrl eval`` marks the process as holding nothing unwritten once its report is in place, and the
    command's entry (``main``) then freezes the objects left (gc.freeze, here recorded instead) so Python's exit
    skips its collections; an eval that fails marks nothing and the exit is Python's usual one."""
    import gc
    import importlib
    import sys

    from calibrl import cli

    app_module = importlib.import_module("calibrl.cli.app")  # the module (calibrl.cli.app is the Typer app)

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    src = _jsonl(tmp_path / "model_a.jsonl", _rows(0))
    for argv, code, marked in ((["calibrl", "eval", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "r")],
                                2, False),
                               (["calibrl", "eval", str(src), "--out", str(tmp_path / "r"), *FAST], 0, True)):
        monkeypatch.setattr(app_module, "_ends_clean", False)
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as exited:
            cli.main()
        assert exited.value.code == code
        assert app_module.ends_clean() is marked and frozen == ([True] if marked else [])
    assert (tmp_path / "r" / "report.md").is_file()
