"""The untrained built-in model's declines on arithmetic with unanswerable items (protocol
docs/protocols/abstention_realmodel.md, written before the run).

    python -m studies.abstention_realmodel --pack /tmp/abstention_samples.jsonl --started-utc ... \\
        --finished-utc ... --command "..."             # pack a finished `calibrl generate` run
    python -m studies.abstention_realmodel          # write docs/results/abstention_realmodel.md

Data: ``docs/results/abstention_realmodel/samples.jsonl.gz`` (the run's rows as ``calibrl generate`` wrote them,
gzip with reproducible bytes) and ``run.json`` (its command, settings and UTC start and end). The page is written
whole from them by :func:`report` (``python -m studies.reproduce --only abstention_realmodel --check``).

Every figure is calibrl's own (:func:`calibrl.metrics.stated_abstention.stated_abstention` and
:func:`~calibrl.metrics.stated_abstention.declined_by_kind`, as ``calibrl eval`` reports them), on the samples and on
each of 2,000 bootstrap replicates (seed 0) that redraw the prompts within each kind (unanswerable, answerable),
keeping each kind's number of prompts and each prompt's completions together; 95% percentile intervals.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "docs" / "results" / "abstention_realmodel"
SAMPLES = DATA_DIR / "samples.jsonl.gz"
RUN = DATA_DIR / "run.json"
PAGE = ROOT / "docs" / "results" / "abstention_realmodel.md"
N_BOOT = 2000
SEED = 0


def figures(correct: np.ndarray, abstained: np.ndarray, answerable: np.ndarray) -> dict[str, float]:
    """The protocol's figures of one set of samples ([N] bools each)."""
    from calibrl.metrics.stated_abstention import declined_by_kind, stated_abstention

    declined_u, declined_a = declined_by_kind(abstained, answerable)
    overall = stated_abstention(correct, abstained)
    right_on_answerable = correct & ~abstained & answerable
    return {"difference": declined_u - declined_a, "declined_unanswerable": declined_u,
            "declined_answerable": declined_a, "answer_rate": overall.answer_rate,
            "accuracy_answered": overall.accuracy_answered, "hallucination_rate": overall.hallucination_rate,
            "accuracy_answerable": float(right_on_answerable.sum() / answerable.sum())}


def _stratified(samples, figures_of, *, n_boot: int, seed: int) -> dict[str, list[float]]:
    """``{name: [point, low, high]}`` of ``figures_of(rows)`` (rows: sample indices, repeats allowed) on the samples
    and on ``n_boot`` replicates that redraw the prompts within each kind, keeping each kind's number of prompts and
    each prompt's completions together; 95% percentile intervals."""
    from calibrl.metrics.bootstrap import percentile_interval

    pidx, answerable = samples.prompt_index, samples.answerable.astype(bool)
    rows_of = [np.flatnonzero(pidx == p) for p in range(samples.n_prompts)]
    if any(len(set(answerable[r].tolist())) != 1 for r in rows_of):
        raise ValueError("a prompt's samples disagree on answerable")
    kind = np.array([bool(answerable[r[0]]) for r in rows_of])
    strata = [np.flatnonzero(~kind), np.flatnonzero(kind)]
    point = figures_of(np.arange(len(samples)))
    rng = np.random.default_rng(seed)
    replicates: dict[str, list[float]] = {name: [] for name in point}
    for _ in range(n_boot):
        drawn = np.concatenate([rng.choice(stratum, size=stratum.size, replace=True) for stratum in strata])
        for name, value in figures_of(np.concatenate([rows_of[p] for p in drawn])).items():
            replicates[name].append(value)
    return {name: [point[name], *percentile_interval(np.asarray(values), alpha=0.05)]
            for name, values in replicates.items()}


def analyse(samples, mentions: np.ndarray, *, n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """Every number of the page: counts, each figure with its interval over prompt draws within each kind, and
    (exploratory, added after the run) the shares of completions that hold an abstention phrase anywhere
    (``mentions`` [N] bool, aligned with the samples)."""
    from calibrl.metrics.stated_abstention import declined_by_kind

    correct, abstained = samples.correct.astype(bool), samples.abstained.astype(bool)
    answerable = samples.answerable.astype(bool)
    out = _stratified(samples, lambda rows: figures(correct[rows], abstained[rows], answerable[rows]),
                      n_boot=n_boot, seed=seed)

    def mention_figures(rows):
        in_unanswerable, in_answerable = declined_by_kind(mentions[rows], answerable[rows])
        return {"mentions_unanswerable": in_unanswerable, "mentions_answerable": in_answerable,
                "mentions_difference": in_unanswerable - in_answerable}

    out["exploratory"] = _stratified(samples, mention_figures, n_boot=n_boot, seed=seed)
    out["counts"] = {"n_prompts": int(samples.n_prompts), "n_samples": int(len(samples)),
                     "unanswerable_prompts": int(len(set(samples.prompt_index[~answerable].tolist()))),
                     "answerable_prompts": int(len(set(samples.prompt_index[answerable].tolist()))),
                     "samples_per_prompt": int(samples.group_sizes().min()), "declined": int(abstained.sum()),
                     "declined_unanswerable": int((abstained & ~answerable).sum()),
                     "declined_answerable": int((abstained & answerable).sum()),
                     "mentions_unanswerable": int((mentions & ~answerable).sum()),
                     "mentions_answerable": int((mentions & answerable).sum()),
                     "unanswerable_samples": int((~answerable).sum()), "answerable_samples": int(answerable.sum()),
                     "truncated": int(samples.truncated.sum()) if samples.truncated is not None else None,
                     "n_boot": n_boot, "seed": seed}
    return out


def phrase_anywhere(path: Path, samples) -> np.ndarray:
    """[N] bool aligned with ``samples``: the completion holds one of calibrl's abstention phrases anywhere in its
    text (the case-insensitive search :func:`calibrl.tasks.abstention.is_abstention` starts with), final answer or
    not."""
    import gzip

    from calibrl.tasks.abstention import abstention_search

    with gzip.open(path, "rt", encoding="utf-8") as f:
        found = [abstention_search(json.loads(line).get("completion") or "") for line in f if line.strip()]
    return np.asarray(found, dtype=bool)[samples.rows]


def _ci(values: list[float], *, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(values[0])} [{f.format(values[1])}, {f.format(values[2])}]"


def _reading(d: list[float]) -> str:
    if d[1] > 0:
        return ("its interval lies above 0: the untrained model already declines the questions that cannot be "
                "answered more often than the others")
    if d[2] < 0:
        return "its interval lies below 0: the untrained model declines the answerable questions more often"
    return "its interval contains 0: no evidence that the untrained model tells the two kinds apart when declining"


def report(res: dict, run: dict) -> str:
    """The page docs/results/abstention_realmodel.md, whole."""
    c = res["counts"]
    rows = [("declines, unanswerable items", "declined_unanswerable"),
            ("declines, answerable items", "declined_answerable"),
            ("answer rate (all completions)", "answer_rate"),
            ("accuracy among answered", "accuracy_answered"),
            ("hallucination rate (wrong answers of all completions)", "hallucination_rate"),
            ("accuracy on the answerable items", "accuracy_answerable")]
    lines = [
        "# Does the untrained built-in model decline what cannot be answered? (SmolLM2-135M-Instruct, arithmetic)",
        "",
        "Protocol, committed before the run: "
        "[../protocols/abstention_realmodel.md](../protocols/abstention_realmodel.md).",
        "Data: `docs/results/abstention_realmodel/samples.jsonl.gz` (every row `calibrl generate` wrote) and "
        "`docs/results/abstention_realmodel/run.json` (command and times). This page is written whole by "
        "`python -m studies.abstention_realmodel` and rebuilt by `python -m studies.reproduce --only "
        "abstention_realmodel`.",
        "",
        f"Run (2 shared CPU cores, `nice -n 10`), from {run['started_utc']} to {run['finished_utc']} (UTC):",
        "",
        "```bash",
        run["command"],
        "```",
        "",
        f"{c['n_prompts']} problems ({c['unanswerable_prompts']} unanswerable: an operand missing; "
        f"{c['answerable_prompts']} answerable) x {c['samples_per_prompt']} completions = {c['n_samples']}. Every "
        "prompt offers \"I don't know\". A completion declines when its final answer is one of calibrl's "
        "abstention phrases (`calibrl.tasks.abstention.is_abstention`). Every interval: 95% percentile, "
        f"{c['n_boot']:,} bootstrap replicates (seed {c['seed']}) redrawing the prompts within each kind, a "
        "prompt's completions together.",
        "",
        "## Primary endpoint",
        "",
        f"Decline rate on the unanswerable items minus on the answerable ones: D = {_ci(res['difference'], signed=True)}; "
        f"{_reading(res['difference'])}.",
        "",
        f"Of the {c['n_samples']} completions, {c['declined']} decline: {c['declined_unanswerable']} on unanswerable "
        f"items, {c['declined_answerable']} on answerable ones"
        + (f"; {c['truncated']} were cut at the token limit "
           f"({(run.get('generate_settings') or {}).get('max_new_tokens')} new tokens)."
           if c["truncated"] is not None else "."),
        "",
        "## The figures",
        "",
        "| figure | value [95% interval] |",
        "|---|---:|",
    ]
    lines += [f"| {label} | {_ci(res[key])} |" for label, key in rows]
    lines += [
        "",
        "The figures are those `calibrl eval` reports for this file (`declined_unanswerable`, "
        "`declined_answerable`, `answer_rate`, `accuracy_answered`, `hallucination_rate`). A decline counts as no "
        "answer in all of them: the accuracy among answered and the hallucination rate are over the answers alone "
        "and over all completions. These are one untrained model's starting point, not an effect of training.",
        "",
    ]
    e = res["exploratory"]
    lines += [
        "## Exploratory: the phrase anywhere in the text (added after the run; not an endpoint)",
        "",
        "Reading the completions showed many that talk about not knowing without giving it as their final answer "
        "(\"I don't know the answer to a certain question. ...\"). Counting a completion that holds one of the "
        "abstention phrases anywhere (the prompt itself quotes \"I don't know\"): "
        f"{c['mentions_unanswerable']} of the {c['unanswerable_samples']} completions of unanswerable items, "
        f"{_ci(e['mentions_unanswerable'])}, and {c['mentions_answerable']} of the {c['answerable_samples']} of "
        f"answerable ones, {_ci(e['mentions_answerable'])}; difference "
        f"{_ci(e['mentions_difference'], signed=True)}. Protocol amendment of 2026-11-29 (dated there).",
        "",
    ]
    return "\n".join(lines)


def rebuild() -> str:
    """The page from the committed data."""
    from studies.data_files import load_packed_samples

    samples = load_packed_samples(SAMPLES)
    return report(analyse(samples, phrase_anywhere(SAMPLES, samples)), json.loads(RUN.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, help="a finished calibrl generate JSONL to pack into the data folder")
    parser.add_argument("--started-utc", help="--pack: the run's UTC start")
    parser.add_argument("--finished-utc", help="--pack: the run's UTC end")
    parser.add_argument("--command", help="--pack: the run's command as given in the protocol")
    args = parser.parse_args(argv)
    if args.pack:
        from studies.data_files import pack_generate_run

        if not (args.started_utc and args.finished_utc and args.command):
            parser.error("--pack needs --started-utc, --finished-utc and --command")
        pack_generate_run(args.pack, SAMPLES, RUN, times={"started_utc": args.started_utc,
                                                          "finished_utc": args.finished_utc},
                          command=args.command)
        print(f"wrote {SAMPLES} and {RUN}")
        return 0
    PAGE.write_text(rebuild())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
