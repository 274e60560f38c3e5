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


def analyse(samples, *, n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """Every number of the page: counts, and each figure with its interval over prompt draws within each kind."""
    from calibrl.metrics.bootstrap import percentile_interval

    pidx = samples.prompt_index
    correct, abstained = samples.correct.astype(bool), samples.abstained.astype(bool)
    answerable = samples.answerable.astype(bool)
    rows_of = [np.flatnonzero(pidx == p) for p in range(samples.n_prompts)]
    kind = np.array([bool(answerable[r[0]]) for r in rows_of])
    if any(len(set(answerable[r].tolist())) != 1 for r in rows_of):
        raise ValueError("a prompt's samples disagree on answerable")
    point = figures(correct, abstained, answerable)
    strata = [np.flatnonzero(~kind), np.flatnonzero(kind)]
    rng = np.random.default_rng(seed)
    replicates: dict[str, list[float]] = {name: [] for name in point}
    for _ in range(n_boot):
        drawn = np.concatenate([rng.choice(stratum, size=stratum.size, replace=True) for stratum in strata])
        rows = np.concatenate([rows_of[p] for p in drawn])
        for name, value in figures(correct[rows], abstained[rows], answerable[rows]).items():
            replicates[name].append(value)
    out = {name: [point[name], *percentile_interval(np.asarray(values), alpha=0.05)]
           for name, values in replicates.items()}
    per_prompt = samples.group_sizes()
    out["counts"] = {"n_prompts": int(samples.n_prompts), "n_samples": int(len(samples)),
                     "unanswerable_prompts": int((~kind).sum()), "answerable_prompts": int(kind.sum()),
                     "samples_per_prompt": int(per_prompt.min()), "declined": int(abstained.sum()),
                     "declined_unanswerable": int((abstained & ~answerable).sum()),
                     "declined_answerable": int((abstained & answerable).sum()),
                     "truncated": int(samples.truncated.sum()) if samples.truncated is not None else None,
                     "n_boot": n_boot, "seed": seed}
    return out


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
    rows = [("declines, unanswerable items", "declined_unanswerable", False),
            ("declines, answerable items", "declined_answerable", False),
            ("answer rate (all completions)", "answer_rate", False),
            ("accuracy among answered", "accuracy_answered", False),
            ("hallucination rate (wrong answers of all completions)", "hallucination_rate", False),
            ("accuracy on the answerable items", "accuracy_answerable", False)]
    lines = [
        "# Does the untrained built-in model decline what cannot be answered? (SmolLM2-135M-Instruct, arithmetic)",
        "",
        "Protocol, committed before the run: "
        "[../protocols/abstention_realmodel.md](../protocols/abstention_realmodel.md). Data: "
        "`docs/results/abstention_realmodel/samples.jsonl.gz` (every row `calibrl generate` wrote) and `run.json` "
        "(command and times). This page is written whole by `python -m studies.abstention_realmodel` and rebuilt "
        "by `python -m studies.reproduce --only abstention_realmodel`.",
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
    lines += [f"| {label} | {_ci(res[key])} |" for label, key, _ in rows]
    lines += [
        "",
        "The figures are those `calibrl eval` reports for this file (`declined_unanswerable`, "
        "`declined_answerable`, `answer_rate`, `accuracy_answered`, `hallucination_rate`). A decline counts as no "
        "answer in all of them: the accuracy among answered and the hallucination rate are over the answers alone "
        "and over all completions. These are one untrained model's starting point, not an effect of training.",
        "",
    ]
    return "\n".join(lines)


def rebuild() -> str:
    """The page from the committed data."""
    from studies.data_files import load_packed_samples

    return report(analyse(load_packed_samples(SAMPLES)), json.loads(RUN.read_text()))


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
