"""The README's testbed table is the first table that ``studies/testbed.py`` generates into
``docs/results/headline.md`` (the matched-accuracy one): keep them equal; and the README stays one page."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


def _first_table(text: str) -> list[str]:
    rows: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return [row for row in rows if row.startswith("| ")]  # without the |---| line


def test_readme_holds_every_row_of_the_generated_matched_accuracy_table():
    headline = _first_table((ROOT / "docs" / "results" / "headline.md").read_text())
    assert len(headline) > 2, "docs/results/headline.md's first table has no rows"
    readme = set(_table_rows((ROOT / "README.md").read_text()))
    assert headline, "docs/results/headline.md has no table"
    missing = [row for row in headline if row not in readme]
    assert not missing, f"README.md lacks these rows of docs/results/headline.md: {missing}"


def test_readme_links_resolve():
    import re

    text = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert targets
    broken = [t for t in targets if not (ROOT / t).exists()]
    assert not broken, f"README.md links to missing files: {broken}"


def test_readme_is_one_page():
    assert len((ROOT / "README.md").read_text()) <= 12_000


def test_moved_pages_links_resolve():
    import re

    for page in ("docs/tour.md", "docs/results/README.md", "docs/benchmarks.md", "docs/layout.md"):
        path = ROOT / page
        targets = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()) if "://" not in t]
        broken = [t for t in targets if not (path.parent / t).exists()]
        assert not broken, f"{page} links to missing files: {broken}"
