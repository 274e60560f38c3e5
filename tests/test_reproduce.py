"""studies/reproduce.py rebuilds the results documents' tables from the committed data, and --check catches a
number that no longer matches its data."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _reproduce():
    from studies import reproduce

    return reproduce


def test_check_passes_on_the_committed_data(capsys):
    # testbed's rebuild is checked in tests/test_testbed_report.py; these three are fast
    assert _reproduce().main(["--check", "--only", "abstention,forms,gcpo", "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert "same as abstention.md" in out and "same as forms.md" in out and "same as gcpo.md" in out
    assert "README.md copy of headline.md's tables: same" in out
    assert "docs/results/README.md copy of headline.md's tables: same" in out


def test_check_fails_when_a_copy_of_the_headline_tables_differs(tmp_path, monkeypatch, capsys):
    """docs/results/README.md repeats every table of headline.md: a stale row there is a difference."""
    reproduce = _reproduce()
    results = tmp_path / "docs" / "results"
    shutil.copytree(ROOT / "docs" / "results", results, ignore=shutil.ignore_patterns("*.png", "*samples*"))
    copy = results / "README.md"
    row = next(line for line in copy.read_text().splitlines() if line.startswith("| SEED-GRPO | "))
    copy.write_text(copy.read_text().replace(row, row.replace("±", "+-", 1)))
    monkeypatch.setattr(reproduce, "RESULTS", results)
    assert reproduce.main(["--check", "--only", "gcpo", "--no-figures"]) == 1
    out = capsys.readouterr().out
    assert "docs/results/README.md copy of headline.md's tables: 1 row(s) differ" in out
    assert "README.md copy of headline.md's tables: same" in out


def test_every_results_document_names_its_data():
    # a "Data:" line near the top of every docs/results/*.md: the committed file(s) it names exist, and a study
    # with a rebuilder names its data file; a document without one says so
    reproduce = _reproduce()
    results = ROOT / "docs" / "results"
    for doc in sorted(results.glob("*.md")):
        head = doc.read_text().splitlines()[:8]
        line = next((i for i, text in enumerate(head) if text.startswith("Data:")), None)
        assert line is not None, f"{doc.name}: no 'Data:' line in its first 8 lines"
        text = " ".join(head[line:line + 3])
        named = re.findall(r"`docs/results/([^`]+)`", text)
        for name in named:
            assert (results / name).exists(), f"{doc.name}: names docs/results/{name}, which does not exist"
        assert named or "no raw data" in text.lower() or doc.name == "README.md", (
            f"{doc.name}: its Data line names no data file and does not say why none is committed")
    for study, (data, doc, _) in reproduce.DATA_FILES.items():
        if doc in reproduce.NOT_COMMITTED and not (results / data).exists():
            continue  # listed as lacking its data, with the command that makes it
        assert (results / data).exists(), f"{study}: docs/results/{data} missing"
        assert (results / data).stat().st_size < 5_000_000, f"docs/results/{data}: over 5 MB"


def test_check_fails_when_a_document_disagrees_with_its_data(tmp_path, monkeypatch, capsys):
    reproduce = _reproduce()
    results = tmp_path / "docs" / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    forms = results / "forms.md"
    row = next(line for line in forms.read_text().splitlines() if line.startswith("| GCPO"))
    changed = row.replace("0.0", "0.9", 1)
    assert changed != row
    forms.write_text(forms.read_text().replace(row, changed))
    monkeypatch.setattr(reproduce, "RESULTS", results)
    assert reproduce.main(["--check", "--only", "forms", "--no-figures"]) == 1
    assert "forms.md lacks 1 rebuilt row" in capsys.readouterr().out


def test_decision_study_interpolates_grpo_between_the_bracketing_evaluations():
    decision = _reproduce()._script("decision_study")

    def evaluation(step, accuracy, ece):
        return {"step": step, "expected_accuracy": accuracy,
                "test": {k: ece if k == "dec_ece" else accuracy for k in decision.TEST_KEYS}}

    curve = [evaluation(0, 0.5, 0.4), evaluation(25, 0.7, 0.2), evaluation(50, 0.8, 0.1)]
    grpo = {0: curve, 1: curve, 2: curve}
    # seed 0: 0.6 lies halfway between steps 0 and 25 -> ECE 0.3; seed 1: 0.45 is below the start -> read there
    # (0.4); seed 2: 0.9 is above every evaluation -> left out
    got = decision.interpolated_grpo(grpo, {0: 0.6, 1: 0.45, 2: 0.9})
    assert got["brackets"] == ["0-25", "start", None] and got["n_seeds"] == 2 and got["below_start"] == 1
    assert got["dec_ece"] == pytest.approx((0.3 + 0.4) / 2)
    assert got["expected_accuracy"] == pytest.approx((0.6 + 0.5) / 2)
    # a target between steps 25 and 50: the first bracketing pair, not the start
    assert decision.interpolated_grpo({0: curve}, {0: 0.75})["dec_ece"] == pytest.approx(0.15)


def test_the_readme_quotes_the_powered_studys_primary_interval_from_its_rebuilt_report():
    """The phrase --check looks for in README.md is the primary row's difference cell of the rebuilt page (the
    secondary rows, which share the table, are not it), and the README holds the committed page's."""
    reproduce = _reproduce()
    page = ("| endpoint | question | difference [95% interval] | half-width |\n|---|---|---:|---:|\n"
            "| S1 | slow GRPO vs GRPO, AUROC | +0.003 [-0.027, +0.037] | 0.032 |\n"
            "| primary | CAPO + mask vs GRPO, AUROC at matched accuracy | -0.001 [-0.056, +0.052] | 0.054 |\n"
            "| primary | 0 | 60 | 0.227 |\n")
    sensitivity = ("\nPairing ... gives a mean difference of -0.027 (k = 12), +0.010 (k = 60): from -0.027 to "
                   "+0.010. The seed-level Student-t interval of the pre-registered pairs' differences (the seed as "
                   "the unit) is -0.001 [-0.072, +0.070].\nScope: ... every final AUROC is 0.46-0.56: ...\n")
    assert reproduce._powered_readme_phrases({"realmodel_powered.md": page + sensitivity}) == [
        "-0.001 [-0.056, +0.052]", "from -0.027 to +0.010", "[-0.072, +0.070]", "0.46-0.56"]
    # a page without the sensitivity sentence is a difference, not a silent pass
    assert len(reproduce._powered_readme_phrases({"realmodel_powered.md": page})) == 2
    committed = (ROOT / "docs" / "results" / "realmodel_powered.md").read_text()
    phrases = reproduce._powered_readme_phrases({"realmodel_powered.md": committed})
    for readme in (ROOT / "README.md", ROOT / "docs" / "results" / "README.md"):
        text = " ".join(readme.read_text().split())
        assert all(phrase in text for phrase in phrases), readme


def test_a_page_written_whole_by_its_script_is_checked_line_by_line(tmp_path, monkeypatch):
    """For WHOLE_PAGES a changed sentence is a difference too; elsewhere only table rows are compared."""
    reproduce = _reproduce()
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    page = "# Title\n\nComputed on: one GPU (20 runs).\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    for doc in ("realmodel_powered.md", "other.md"):
        (tmp_path / doc).write_text(page.replace("one GPU", "the CPU"))
    rebuilt = reproduce.Rebuilt({"realmodel_powered.md": page, "other.md": page}, {})
    assert "realmodel_powered.md" in reproduce.WHOLE_PAGES
    assert reproduce.missing_rows(rebuilt) == {"realmodel_powered.md": ["Computed on: one GPU (20 runs)."]}


def test_the_testbed_rebuild_draws_its_reliability_diagrams_from_the_committed_samples_only(tmp_path, monkeypatch):
    """The records name their per-sample files by a path relative to the checkout; a file a local run left at that
    path elsewhere (here: under the working directory) must not feed the rebuilt diagrams, which equal the
    committed ones to the byte."""
    import json

    import numpy as np

    record = json.loads((ROOT / "docs" / "results" / "testbed_results.json").read_text())["results"][0]
    local = tmp_path / record["run_dir"]
    local.mkdir(parents=True)
    # a local run's file, as the testbed writes it (the fields the reliability diagram reads)
    np.savez(local / "final_samples.npz", prompt_index=np.array([0, 0, 1, 1]), logprob_mean=np.log([0.9, 0.2, 0.6, 0.4]),
             seq_prob=np.array([0.9, 0.2, 0.6, 0.4]), correct=np.array([True, False, True, False]),
             q_true=np.array([0.8, 0.3, 0.5, 0.5]), answer_id=np.array([0, 1, 0, 1]),
             completion=np.array(["a", "b", "a", "b"]))
    monkeypatch.chdir(tmp_path)
    rebuilt = _reproduce().rebuild_testbed(tmp_path / "scratch")
    reliability = sorted(f for f in rebuilt.figures if "reliability" in f)
    assert reliability == [f"testbed_reliability_{t}.png" for t in ("addition", "decision", "stochastic_reasoning")]
    for figure in reliability:
        assert rebuilt.figures[figure].read_bytes() == (ROOT / "docs" / "results" / figure).read_bytes(), figure


@pytest.mark.parametrize("name", ["downstream_results.json.gz", "decision_results.json.gz"])
def test_a_study_data_file_read_and_written_again_gives_the_same_bytes(tmp_path, name):
    """studies.data_files (the decision and downstream studies' one writer): the committed file read and written
    again is the same bytes (mtime 0, no file name), so rewriting unchanged records changes nothing in git."""
    from studies.data_files import load_data, save_data

    committed = ROOT / "docs" / "results" / name
    save_data(load_data(committed), tmp_path / name)
    assert (tmp_path / name).read_bytes() == committed.read_bytes()


def test_prose_numbers_are_vouched_for_by_the_rebuilt_text_the_data_or_a_declaration(monkeypatch):
    """A prose number passes when a study its paragraph is about prints it (to its printed precision: 0.22 for a
    rebuilt 0.2219), when the page is written by hand and the study's raw data holds it, or when the page declares
    it as not a result; a percentage is also read as its fraction. Any other number is named with its paragraph,
    and a number in a table or a code span is not prose."""
    reproduce = _reproduce()
    monkeypatch.setattr(reproduce, "_data_pool", lambda study: {"0.4321"})
    pools = {"rlcr": {"0.2219", "0.513"}, "decision": {"0.996"}}
    page = ("<!-- not from the data: 25.3 (the paper's figure) -->\n\n# Page\n\n"
            "Accuracy 0.22 and 0.513; the paper's 25.3; 99.6% of decisions ([decision.md](decision.md)).\n\n"
            "- A number from the raw data, 0.432, and one from nowhere, 0.777.\n\n"
            "| a | 0.999 |\n|---|---|\n\n`--lr 0.0003` and arXiv 2604.12632.\n")
    found = reproduce.unchecked_numbers("rlcr.md", page, pools, own=["rlcr"], by_hand=True)
    assert [f.split(" in: ")[0] for f in found] == ["0.777"]
    assert "one from nowhere" in found[0]
    # a page its script writes whole: the raw data does not vouch, only the rebuilt text
    found = reproduce.unchecked_numbers("rlcr.md", page, pools, own=["rlcr"], by_hand=False)
    assert [f.split(" in: ")[0] for f in found] == ["0.432", "0.777"]
    # 99.6% is vouched for only by the study the paragraph links (decision's 0.996), not by rlcr's own numbers
    unlinked = page.replace(" ([decision.md](decision.md))", "")
    assert "99.6" in [f.split(" in: ")[0] for f in
                      reproduce.unchecked_numbers("rlcr.md", unlinked, pools, own=["rlcr"], by_hand=True)]
