"""bench/testbed.py rebuilds docs/results/testbed.md from saved results: the hand-written Findings must survive."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _testbed_script():
    spec = importlib.util.spec_from_file_location("calibrl_bench_testbed", ROOT / "bench" / "testbed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_report_only_rebuild_keeps_findings_and_tables(tmp_path, capsys):
    tb = _testbed_script()
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
