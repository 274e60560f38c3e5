"""Rebuild the tables and figures of docs/results/*.md and the README's results table from the committed data alone
(no training): ``python -m studies.reproduce [--check] [--only testbed,forms,...] [--no-figures]``.

Each study with committed data is rebuilt by the same code that wrote it, from its data file in docs/results/:

- ``testbed``: ``testbed_results.json`` -> the tables of ``testbed.md`` and ``headline.md`` (the README's table is
  ``headline.md``'s first one), ``testbed_curves_*.png``, ``testbed_tradeoff_*.png`` and, from the runs'
  per-sample files in ``testbed_samples/``, ``testbed_reliability_*.png`` (``studies/testbed.py --report-only``;
  per-sample files a local run left in runs/ are not read);
- ``abstention``: ``abstention_results.json`` -> ``abstention.md``'s tables and ``abstention.png``;
- ``forms``: ``forms_results.json`` -> ``forms.md``'s tables and ``forms_study.png``;
- ``gcpo``: ``gcpo_results.json`` (every prompt group's gradient noise, SNR and signals) -> ``gcpo.md``'s table
  (``studies/gcpo_gradients.py``'s ``rho_table``);
- ``protocol``: ``protocol_results.json`` (both pilots' curves and tier tables) -> ``protocol.md``'s tables,
  ``protocol_pilot.png`` and ``protocol_unfixable_pilot.png`` (``studies/protocol.py``);
- ``mask``: ``mask_results.json`` (every evaluation of the ablation's runs) -> ``mask.md``'s tables
  (``studies/mask_ablation.py``);
- ``downstream``: ``downstream_results.json.gz`` (the runs' final evaluation samples) -> ``downstream.md``'s
  tables (``studies/downstream.py``);
- ``decision``: ``decision_results.json.gz`` (every evaluation, and the test samples of the AURC and post-hoc
  readings) -> ``decision.md``'s tables (``studies/decision_study.py``);
- ``rlcr``: ``rlcr_results.json`` (every evaluation) -> ``rlcr.md``'s tables (``studies/rlcr.py``);
- ``realmodel_powered``: the folder ``realmodel_powered/`` (one raw-records file per run) ->
  ``realmodel_powered.md`` and ``realmodel_powered.png`` (``studies/realmodel_powered.py``, about 15 s);
- ``realmodel``: the folder ``realmodel_study/`` (one raw-records file per run of the equal-budget study) ->
  ``realmodel.md``'s tables of every seed and ``realmodel_study.png`` (``studies/realmodel_study.py``); the untrained
  baseline's samples ``realmodel_baseline/*.jsonl`` -> its tables (``calibrl eval``'s, about 10 s);
- ``newer_methods``: the folder ``newer_methods/`` (one record per run: every evaluation) -> ``newer_methods.md``,
  written whole (``studies/newer_methods.py``: DCPO and Clip-Cov against GRPO and RLCR on ``testbed/verbalized``);
- ``deepconf_realmodel``: the folder ``deepconf_realmodel/`` (the ``calibrl generate`` run's rows with their
  ``token_confidence``, and ``run.json``) -> ``deepconf_realmodel.md``, written whole
  (``studies/deepconf_realmodel.py``);
- ``abstention_realmodel``: the folder ``abstention_realmodel/`` (the ``calibrl generate`` run's rows on arithmetic
  with unanswerable items, and ``run.json``) -> ``abstention_realmodel.md``, written whole
  (``studies/abstention_realmodel.py``);
- ``abstention_testbed``: the folder ``abstention_testbed/`` (one record per run: every evaluation and the final
  samples) -> ``abstention_testbed.md`` and ``abstention_testbed.png``, written whole
  (``studies/abstention_testbed.py``: which training comes closest to the optimal "I don't know" on
  ``testbed/abstain``);
- ``warm_realmodel``: the folder ``warm_realmodel/`` (the warm start's adapter record, its ``calibrl generate``
  samples before RL and of the validation pilot, one record per RL run) -> ``warm_realmodel.md``, written whole
  (``studies/warm_realmodel.py``);
- ``abstention_recipe``: the folder ``abstention_recipe/`` (the shipped recipe ``smollm2_cpu_ternary`` run at its own
  length: its held-out evaluations, training log and run record) -> ``abstention_recipe.md``, written whole
  (``studies/abstention_recipe.py``).

Without ``--check`` the figures are redrawn into docs/results/ and every table row that is not in its document is
printed. With ``--check`` nothing is written and the exit status is 1 when a rebuilt table row is missing from its
document (any rebuilt line, for a page its script writes whole: ``WHOLE_PAGES``), or a copy of ``headline.md``'s
tables differs from it (README.md's results table, docs/results/README.md's tables), or a study's data file is
missing while its document is not listed as lacking data, or a decimal number in the prose of a results page (or
of README.md's Results section) is vouched for by nothing: neither the rebuilt text of a study the paragraph is
about (nor a figure :data:`FACTS` derives from its data), nor, on the pages written by hand, a value of the study's
raw data at the printed precision, nor the page's own declaration of it as not a result (:func:`unchecked_numbers`).
The documents whose raw data is not committed (yet) are listed with the command that makes it.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"

# documents whose data is not in the repository: the command that makes it (into the data file the rebuilder reads)
NOT_COMMITTED: dict[str, str] = {}


def _script(name: str):
    """The study ``studies.<name>`` as a module."""
    return importlib.import_module(f"studies.{name}")


def table_rows(text: str) -> list[str]:
    """The rows of every markdown table in ``text`` (header rows included, separator rows not)."""
    return [line.rstrip() for line in text.splitlines() if line.startswith("| ")]


@dataclass
class Rebuilt:
    """What a study's rebuild produced: ``{document: rebuilt markdown}`` and ``{figure file: rebuilt path}``."""

    texts: dict[str, str]
    figures: dict[str, Path]


def rebuild_testbed(scratch: Path) -> Rebuilt:
    testbed = _script("testbed")
    out = scratch / "testbed"
    # the committed data alone: every record's per-sample file is the committed one, so a run_dir pointing into
    # runs/ (a local run's) cannot feed the reliability diagrams
    summary = json.loads((RESULTS / "testbed_results.json").read_text())
    for record in summary["results"]:
        run = (record["task"], record["method"], f"seed{record['seed']}")
        record["run_dir"] = str(RESULTS.joinpath("testbed_samples", *run))
    scratch.mkdir(parents=True, exist_ok=True)
    data = scratch / "testbed_results.json"
    data.write_text(json.dumps(summary))
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):  # its report and its missing-samples note
        testbed.main(["--report-only", "--merge", str(data), "--out", str(out), "--runs", str(scratch / "testbed_runs")])
    figures = {p.name: p for p in out.glob("testbed_*.png")}
    return Rebuilt({"testbed.md": (out / "testbed.md").read_text(), "headline.md": (out / "headline.md").read_text()},
                   figures)


def rebuild_abstention(scratch: Path) -> Rebuilt:
    abstention = _script("abstention")
    summary = json.loads((RESULTS / "abstention_results.json").read_text())
    figure = scratch / "abstention.png"
    abstention.plot(summary, figure)
    return Rebuilt({"abstention.md": abstention.tables(summary)}, {"abstention.png": figure})


def rebuild_forms(scratch: Path) -> Rebuilt:
    forms = _script("forms_study")
    path = RESULTS / "forms_results.json"
    runs, labels = forms.load(path)
    weights = forms.tier_weights(int(json.loads(path.read_text())["config"]["eval_prompts"]))
    figure = scratch / "forms_study.png"
    forms.plot(runs, labels, weights, figure)
    return Rebuilt({"forms.md": forms.tables(runs, labels, weights)}, {"forms_study.png": figure})


def rebuild_gcpo(scratch: Path) -> Rebuilt:
    gcpo = _script("gcpo_gradients")
    data = json.loads((RESULTS / "gcpo_results.json").read_text())
    return Rebuilt({"gcpo.md": gcpo.rho_table(data["measures"])}, {})


def rebuild_protocol(scratch: Path) -> Rebuilt:
    protocol = _script("protocol")
    data = json.loads((RESULTS / "protocol_results.json").read_text())
    figures = {}
    pilots = (("scratchpad", "protocol_pilot.png"), ("scratchpad_unfixable", "protocol_unfixable_pilot.png"))
    for task, figure in pilots:
        if task in data:  # each pilot's --save merges it in
            figures[figure] = scratch / figure
            protocol._plot_pilot(data[task], figures[figure])
    return Rebuilt({"protocol.md": "\n\n".join(protocol.pilot_tables(data[t]) for t in data)}, figures)


def rebuild_decision(scratch: Path) -> Rebuilt:
    decision = _script("decision_study")
    data = decision.load_data(RESULTS / "decision_results.json.gz")
    return Rebuilt({"decision.md": decision.report(decision.analyze(data))}, {})


def rebuild_rlcr(scratch: Path) -> Rebuilt:
    rlcr = _script("rlcr")
    data = json.loads((RESULTS / "rlcr_results.json").read_text())
    return Rebuilt({"rlcr.md": rlcr.tables(data["results"])}, {})


def rebuild_realmodel_powered(scratch: Path) -> Rebuilt:
    powered = _script("realmodel_powered")
    runs = powered.load_records(RESULTS / "realmodel_powered")
    figure = scratch / "realmodel_powered.png"
    powered.plot_paths(runs, figure, powered.SEEDS)
    text = powered.report(powered.analyse(runs), runs, figure=figure.name)
    return Rebuilt({"realmodel_powered.md": text}, {figure.name: figure})


def rebuild_newer_methods(scratch: Path) -> Rebuilt:
    newer = _script("newer_methods")
    return Rebuilt({"newer_methods.md": newer.page(newer.load(RESULTS / "newer_methods"))}, {})


def _baseline_tables(scratch: Path) -> str:
    """The tables of ``calibrl eval``'s report section "overall" on the untrained baseline's committed samples
    (``realmodel_baseline/*.jsonl``, written by the ``calibrl generate`` commands of realmodel.md)."""
    files = sorted((RESULTS / "realmodel_baseline").glob("*.jsonl"))
    out = scratch / "realmodel_baseline_eval"
    done = subprocess.run([sys.executable, "-m", "calibrl", "eval", *map(str, files), "--out", str(out)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"calibrl eval on the baseline samples failed:\n{done.stderr[-2000:]}")
    return (out / "report.md").read_text().split("\n## overall\n", 1)[1].split("\n## ", 1)[0]


def rebuild_realmodel(scratch: Path) -> Rebuilt:
    study, sources = _script("realmodel_study"), _script("realmodel_sources")
    by_seed = study.load_packed(RESULTS / "realmodel_study")
    scratch.mkdir(parents=True, exist_ok=True)
    figure = study.plot_study(by_seed, scratch / "realmodel_study.png")
    return Rebuilt({"realmodel.md": _baseline_tables(scratch) + "\n\n" + study.study_text(by_seed),
                    "realmodel.md#sources": sources.section(sources.analyse())}, {figure.name: figure})


def rebuild_abstention_testbed(scratch: Path) -> Rebuilt:
    study = _script("abstention_testbed")
    records = study.load(RESULTS / "abstention_testbed")
    figure = study.plot(records, scratch / "abstention_testbed.png")
    return Rebuilt({"abstention_testbed.md": study.page(records, figure=figure.name)}, {figure.name: figure})


def rebuild_abstention_recipe(scratch: Path) -> Rebuilt:
    return Rebuilt({"abstention_recipe.md": _script("abstention_recipe").page(RESULTS / "abstention_recipe")}, {})


def rebuild_abstention_realmodel(scratch: Path) -> Rebuilt:
    return Rebuilt({"abstention_realmodel.md": _script("abstention_realmodel").rebuild()}, {})


def rebuild_warm_realmodel(scratch: Path) -> Rebuilt:
    return Rebuilt({"warm_realmodel.md": _script("warm_realmodel").rebuild()}, {})


def rebuild_deepconf_realmodel(scratch: Path) -> Rebuilt:
    return Rebuilt({"deepconf_realmodel.md": _script("deepconf_realmodel").rebuild()}, {})


def rebuild_mask(scratch: Path) -> Rebuilt:
    mask = _script("mask_ablation")
    runs, labels = mask.load(RESULTS / "mask_results.json")
    return Rebuilt({"mask.md": mask.final_table(runs, labels) + "\n\n" + "\n".join(mask.paired_rows(runs, labels))},
                   {})


def rebuild_downstream(scratch: Path) -> Rebuilt:
    downstream = _script("downstream")
    runs, labels = downstream.metrics_of(downstream.load_data(RESULTS / "downstream_results.json.gz"))
    return Rebuilt({"downstream.md": downstream.tables(runs, labels)}, {})


# study -> (its data file in docs/results/, its document, the command that makes the data file)
DATA_FILES: dict[str, tuple[str, str, str]] = {
    "testbed": ("testbed_results.json", "testbed.md", "see testbed.md's command"),
    "abstention": ("abstention_results.json", "abstention.md", "see abstention.md's command"),
    "forms": ("forms_results.json", "forms.md", "see forms.md's command"),
    "gcpo": ("gcpo_results.json", "gcpo.md", "python -m studies.gcpo_gradients --out docs/results/gcpo_results.json"),
    "protocol": ("protocol_results.json", "protocol.md",
                 "python -m studies.protocol pilot --out runs/protocol --save docs/results/protocol_results.json, then "
                 "the same with --task scratchpad_unfixable --out runs/protocol_unfixable"),
    "mask": ("mask_results.json", "mask.md", "see mask.md's commands (studies/mask_ablation.py --save)"),
    "downstream": ("downstream_results.json.gz", "downstream.md",
                   "see downstream.md's commands (studies/downstream.py --save)"),
    "decision": ("decision_results.json.gz", "decision.md",
                 "python -m studies.decision_study --out runs/decision_study --save docs/results/decision_results.json.gz"
                 " (26 training runs, about 25 minutes on one idle core)"),
    "rlcr": ("rlcr_results.json", "rlcr.md",
             "python -m studies.rlcr --seeds 3 --steps 800 --eval-every 100 --out docs/results/rlcr_results.json "
             "(about 20 minutes on 2 idle cores)"),
    "realmodel_powered": ("realmodel_powered", "realmodel_powered.md",
                          "scripts/realmodel_powered_gpu.sh on one GPU (docs/protocols/realmodel_powered.md)"),
    "realmodel": ("realmodel_study", "realmodel.md",
                  "see realmodel.md's commands (studies/realmodel_study.py --pack; about an hour per pair of methods per "
                  "seed on 2 cores)"),
    "newer_methods": ("newer_methods", "newer_methods.md",
                      "python -m studies.newer_methods run --workers 2 (15 runs of 800 steps, about 2-4 minutes each "
                      "two at a time on 2 cores; docs/protocols/newer_methods_testbed.md)"),
    "deepconf_realmodel": ("deepconf_realmodel", "deepconf_realmodel.md",
                           "the calibrl generate command of docs/protocols/deepconf_realmodel.md, then "
                           "python -m studies.deepconf_realmodel --pack (about 8 minutes on 2 cores)"),
    "abstention_realmodel": ("abstention_realmodel", "abstention_realmodel.md",
                             "the calibrl generate command of docs/protocols/abstention_realmodel.md, then "
                             "python -m studies.abstention_realmodel --pack (about 20 minutes on 2 cores)"),
    "abstention_testbed": ("abstention_testbed", "abstention_testbed.md",
                           "python -m studies.abstention_testbed run --workers 2 (25 runs of 400 steps, about 2.5 "
                           "minutes each two at a time on 2 cores; docs/protocols/abstention_testbed.md)"),
    "warm_realmodel": ("warm_realmodel", "warm_realmodel.md",
                       "python -m calibrl.testbed.warm_real, the calibrl generate command and the --run commands of "
                       "studies/warm_realmodel.py (docs/protocols/warm_realmodel.md)"),
    "abstention_recipe": ("abstention_recipe", "abstention_recipe.md",
                          "python -m studies.abstention_recipe run (calibrl train smollm2_cpu_ternary, 24 steps, "
                          "about 20-45 minutes on 2 cores)"),
}
DATA = {study: data for study, (data, _, _) in DATA_FILES.items()}


def _powered_readme_phrases(texts: dict[str, str]) -> list[str]:
    """The primary endpoint's "difference [interval]" as the rebuilt realmodel_powered.md gives it, and its
    sensitivity to the matching (the range of the mean over GRPO's matched step, the seed-level t-interval) and
    the final AUROCs' range: the README's real-model sentence quotes them."""
    import re

    text = texts["realmodel_powered.md"]
    out = ["(no primary row in the rebuilt realmodel_powered.md)"]
    for row in table_rows(text):
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[0] == "primary" and "matched accuracy" in cells[1]:
            out = [cells[2]]
    number = r"[+-]\d\.\d{3}"
    found = re.search(rf"from ({number}) to ({number})\. The seed-level Student-t interval .*? is {number} "
                      rf"(\[{number}, {number}\])", text)
    scope = re.search(r"every final AUROC is (\d\.\d\d-\d\.\d\d)", text)
    if found is None or scope is None:
        return out + ["(no sensitivity or scope sentence in the rebuilt realmodel_powered.md)"]
    return out + [f"from {found.group(1)} to {found.group(2)}", found.group(3), scope.group(1)]


# study -> the phrases of its rebuilt documents that README.md quotes (checked like the results table)
README_PHRASES: dict[str, Callable[[dict[str, str]], list[str]]] = {"realmodel_powered": _powered_readme_phrases}
STUDIES: dict[str, Callable[[Path], Rebuilt]] = {
    "testbed": rebuild_testbed, "abstention": rebuild_abstention, "forms": rebuild_forms, "gcpo": rebuild_gcpo,
    "protocol": rebuild_protocol, "mask": rebuild_mask, "downstream": rebuild_downstream,
    "decision": rebuild_decision, "rlcr": rebuild_rlcr, "realmodel_powered": rebuild_realmodel_powered,
    "realmodel": rebuild_realmodel, "deepconf_realmodel": rebuild_deepconf_realmodel,
    "newer_methods": rebuild_newer_methods, "abstention_realmodel": rebuild_abstention_realmodel,
    "abstention_testbed": rebuild_abstention_testbed, "abstention_recipe": rebuild_abstention_recipe,
    "warm_realmodel": rebuild_warm_realmodel,
}


# documents written whole by their script (no hand-written text): every line is checked, not only the tables
WHOLE_PAGES = {"realmodel_powered.md", "deepconf_realmodel.md", "newer_methods.md", "abstention_realmodel.md",
               "abstention_testbed.md", "abstention_recipe.md", "warm_realmodel.md"}


def missing_rows(rebuilt: Rebuilt) -> dict[str, list[str]]:
    """``{document: rebuilt table rows it lacks}`` (empty lists dropped); for the :data:`WHOLE_PAGES` and for a
    section a script writes whole (a key ``"<document>#<section>"``), every rebuilt line it lacks."""
    out = {}
    for doc, text in rebuilt.texts.items():
        committed = (RESULTS / doc.split("#")[0]).read_text()
        if doc in WHOLE_PAGES or "#" in doc:
            have = set(line.rstrip() for line in committed.splitlines())
            lacking = [line.rstrip() for line in text.splitlines() if line.strip() and line.rstrip() not in have]
        else:
            have = set(table_rows(committed))
            lacking = [row for row in table_rows(text) if row not in have]
        if lacking:
            out[doc] = lacking
    return out


# ---------------------------------------------------------------------------------------------- prose numbers
#
# Every decimal number in a results page's prose (and in README.md's Results section) must come from the data: it
# appears in the rebuilt text of a study the paragraph is about (its own page's study, and every study whose page
# the paragraph links), to its printed precision (0.22 for a rebuilt 0.2219, the sign aside); or, for the pages
# written by hand over rebuilt tables, it is one of the values of the study's raw data file at that precision (a
# weaker check: it catches a number copied from nowhere, not one copied from the wrong place); or the page declares
# it as not a result of this study (a paper's figure, a setting, a version) in a comment
# ``<!-- not from the data: 0.95 (the paper's tau), ... -->``. Numbers in tables are checked by the table rows.

_NUMBER = re.compile(r"(?<![\w.])[+-]?\d*\.\d+(?!\.\d)(?![\d\w])")  # not a version: 0.9.1 is none
_ARXIV = re.compile(r"\d{4}\.\d{4,5}")
_LINK = re.compile(r"\]\(((?:\.\./)?(?:docs/)?(?:results/)?([\w.-]+\.md))(?:#[^)]*)?\)")
_DECLARED = re.compile(r"<!-- not from the data: (.*?)-->", re.S)


def prose_paragraphs(text: str) -> list[str]:
    """The prose of a markdown text as paragraphs (blank-line or bullet separated), without tables, fenced code,
    inline code spans and HTML comments."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    out, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            continue
        if not line.strip() or line.lstrip().startswith(("- ", "* ")) or line.startswith("#"):
            if current:
                out.append(" ".join(current))
            current = [] if not line.strip() or line.startswith("#") else [line]
        else:
            current.append(line)
    if current:
        out.append(" ".join(current))
    return [re.sub(r"`[^`]*`", " ", p) for p in out]


def prose_numbers(paragraph: str) -> list[tuple[str, ...]]:
    """The decimal numbers of a prose paragraph, unsigned (arXiv ids left out), each as the forms it may take in
    the data: a percentage as printed and as its fraction (``99.6%``: ``99.6``, ``0.996``)."""
    out = []
    for m in _NUMBER.finditer(paragraph):
        number = m.group(0).lstrip("+-")
        if _ARXIV.fullmatch(number):
            continue
        if paragraph[m.end():m.end() + 1] == "%":
            decimals = number.split(".")[1]
            out.append((number, f"{float(number) / 100:.{len(decimals) + 2}f}"))
        else:
            out.append((number,))
    return out


def number_pool(text: str) -> set[str]:
    """Every decimal number of a text, unsigned, as printed."""
    return {m.group(0).lstrip("+-") for m in _NUMBER.finditer(text)}


def declared_numbers(text: str) -> set[str]:
    """The numbers a page declares as not from its data (:data:`_DECLARED`)."""
    return {item.strip().split()[0].lstrip("+-") for block in _DECLARED.findall(text)
            for item in block.split(",") if item.strip()}


def _printed_as(number: str, pool: set[str]) -> bool:
    """Whether ``number`` is a member of ``pool`` shown to its printed precision (``0.22`` for ``0.2219``)."""
    if number in pool:
        return True
    decimals = len(number.split(".")[1])
    target = float(number)
    return any(len(q.split(".")[1]) > decimals and abs(float(q) - target) <= 0.5 * 10 ** -decimals + 1e-12
               and f"{float(q):.{decimals}f}" == f"{target:.{decimals}f}" for q in pool)


@functools.lru_cache(maxsize=None)
def _data_pool(study: str) -> set[str]:
    """The numbers of a study's raw data (its JSON files, gzipped or not; every value at full precision)."""
    import gzip

    path = RESULTS / DATA[study]
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in (".json", ".gz", ".jsonl"))
    pool: set[str] = set()
    for f in files:
        raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
        pool |= number_pool(raw.decode("utf-8", "replace"))
    return pool


def unchecked_numbers(doc: str, text: str, rebuilt: dict[str, set[str]], *, own: list[str],
                      by_hand: bool) -> list[str]:
    """The prose numbers of ``text`` (document ``doc``) that nothing vouches for (module comment above):
    ``rebuilt`` {study: numbers of its rebuilt texts}; ``own``: the studies the document is about; ``by_hand``:
    the page's prose is written by hand, so the study's raw data may vouch too."""
    page_of = {DATA_FILES[s][1]: s for s in DATA_FILES}
    declared = declared_numbers(text)
    out = []
    for paragraph in prose_paragraphs(text):
        studies = set(own) | {page_of[m.group(2)] for m in _LINK.finditer(paragraph) if m.group(2) in page_of}
        if "headline.md" in paragraph:
            studies.add("testbed")
        pool = set().union(*(rebuilt.get(s, set()) for s in studies)) if studies else set().union(*rebuilt.values())
        for forms in prose_numbers(paragraph):
            if any(f in declared or _printed_as(f, pool) for f in forms):
                continue
            if by_hand and any(_printed_as(f, _data_pool(s)) for s in studies if s in DATA for f in forms):
                continue
            out.append(f"{forms[0]} in: {paragraph[:160]}")
    return out


def _testbed_facts() -> list[float]:
    """Figures testbed.md and docs/results/README.md derive from the data by hand: the addition control's AUROC and
    expected accuracy averaged over the evaluations at steps 100-200 and over seeds, GRPO's and CAPO's."""
    import numpy as np

    data = json.loads((RESULTS / "testbed_results.json").read_text())["results"]
    out = []
    for method in ("grpo", "capo"):
        runs = [[h for h in r["history"] if 100 <= h["step"] <= 200] for r in data
                if r["task"] == "addition" and r["method"] == method]
        for key in ("auroc", "expected_accuracy"):
            out.append(float(np.mean([np.mean([h[key] for h in run]) for run in runs])))
    return out


# study -> figures its pages derive from its data by hand (a mean over steps, say): computed here, so they are
# checked like the rebuilt text's numbers
FACTS: dict[str, Callable[[], list[float]]] = {"testbed": _testbed_facts}


def _check_prose(pools: dict[str, set[str]], *, complete: bool) -> int:
    """Print and count the prose numbers nothing vouches for (:func:`unchecked_numbers`) in the pages of the
    rebuilt studies, and, when every study was rebuilt, in docs/results/README.md and README.md's Results."""
    pages: list[tuple[str, str, list[str], bool]] = []
    for study in pools:
        docs = {DATA_FILES[study][1]} | ({"headline.md"} if study == "testbed" else set())
        for doc in sorted(docs):
            pages.append((f"docs/results/{doc}", (RESULTS / doc).read_text(), [study], doc not in WHOLE_PAGES))
    if complete:
        pages.append(("docs/results/README.md", (RESULTS / "README.md").read_text(), [], True))
        readme = (ROOT / "README.md").read_text()
        results = readme.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
        pages.append(("README.md (Results)", results, [], False))
    count = 0
    for name, text, own, by_hand in pages:
        unchecked = unchecked_numbers(name, text, pools, own=own, by_hand=by_hand)
        count += len(unchecked)
        if unchecked:
            print(f"{name}: {len(unchecked)} number(s) in its prose that no rebuilt text or data vouches for, e.g.\n  "
                  + "\n  ".join(unchecked[:5]))
    if not count:
        print(f"prose numbers: every one of {len(pages)} page(s) checked against the rebuilt data")
    return count


def readme_differences() -> dict[str, list[str]]:
    """``{copy: rows of headline.md it lacks}`` for the two documents that copy headline.md's tables: README.md
    (its results table is headline.md's first table) and docs/results/README.md (every table of headline.md)."""
    headline = (RESULTS / "headline.md").read_text()
    first: list[str] = []
    for line in headline.splitlines():
        if line.startswith("|"):
            first.append(line)
        elif first:
            break
    out = {}
    for name, copy, wanted in (("README.md", ROOT / "README.md", table_rows("\n".join(first))),
                               ("docs/results/README.md", RESULTS / "README.md", table_rows(headline))):
        have = set(table_rows(copy.read_text()))
        out[name] = [row for row in wanted if row not in have]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on any difference")
    parser.add_argument("--only", default=",".join(STUDIES), help=f"studies to rebuild (default: {','.join(STUDIES)})")
    parser.add_argument("--no-figures", action="store_true", help="rebuild the tables only")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        parser.error(f"unknown study {unknown[0]!r}; choose from {', '.join(STUDIES)}")
    failures = 0
    pools: dict[str, set[str]] = {}  # study -> the numbers of its rebuilt texts
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            data, doc, how = DATA_FILES[name]
            if not (RESULTS / data).exists():
                if doc not in NOT_COMMITTED:
                    failures += 1
                print(f"{name}: docs/results/{data} is missing; make it with: {how}")
                continue
            rebuilt = STUDIES[name](Path(tmp))
            pools[name] = set().union(*(number_pool(t) for t in rebuilt.texts.values()))
            pools[name] |= {repr(float(v)) for v in FACTS.get(name, lambda: [])()}
            lacking = missing_rows(rebuilt)
            for doc, rows in lacking.items():
                failures += len(rows)
                print(f"{name}: docs/results/{doc} lacks {len(rows)} rebuilt row(s), e.g.\n  {rows[0]}")
            for readme in ("README.md", "docs/results/README.md"):
                readme_text = " ".join((ROOT / readme).read_text().split())  # phrases may wrap across lines
                for phrase in README_PHRASES.get(name, lambda texts: [])(rebuilt.texts):
                    if phrase not in readme_text:
                        failures += 1
                        print(f"{name}: {readme} does not quote {phrase!r} from the rebuilt data")
            rows = sum(len(table_rows(t)) for t in rebuilt.texts.values())
            print(f"{name}: {rows} table rows rebuilt from docs/results/{DATA[name]}: "
                  f"{'differs' if lacking else 'same as ' + ', '.join(sorted(rebuilt.texts))}")
            if not args.check and not args.no_figures:
                for figure, path in rebuilt.figures.items():
                    shutil.copyfile(path, RESULTS / figure)
                print(f"{name}: redrew {', '.join(sorted(rebuilt.figures))}")
    failures += _check_prose(pools, complete=set(names) == set(STUDIES))
    for copy, lacking in readme_differences().items():
        failures += len(lacking)
        print(f"{copy} copy of headline.md's tables: "
              f"{'same as headline.md' if not lacking else f'{len(lacking)} row(s) differ, e.g. {lacking[0]}'}")
    pending = {DATA_FILES[name][1] for name in names if not (RESULTS / DATA_FILES[name][0]).exists()}
    for doc, how in NOT_COMMITTED.items():
        if doc not in pending:  # those were named above with their command
            print(f"not rebuildable ({doc}: raw data not committed): {how}")
    if failures and args.check:
        print(f"{failures} difference(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
