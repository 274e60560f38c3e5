"""DeepConf's trace signals and offline selections on the built-in real model (issue 42, item 6; protocol
docs/protocols/deepconf_realmodel.md, written before the run).

    python -m studies.deepconf_realmodel --pack runs/deepconf.jsonl   # pack a finished `calibrl generate` run
    python -m studies.deepconf_realmodel                               # write docs/results/deepconf_realmodel.md

Data: ``docs/results/deepconf_realmodel/samples.jsonl.gz`` (the run's rows as ``calibrl generate`` wrote them,
gzip with reproducible bytes) and ``run.json`` (its command, settings and UTC start and end). The page is written
whole from them by :func:`report` (``python -m studies.reproduce --only deepconf_realmodel --check`` rebuilds it).

What is computed (every interval a 95% percentile interval over 2,000 prompt-bootstrap replicates, seed 0; a
difference's two members share each replicate's prompt draw, :func:`calibrl.metrics.paired.paired_bootstrap_difference`):

- the pooled AUROC of each DeepConf signal (window and tail 16 tokens: these completions have at most 64) and of
  ``logprob_mean``, and each signal's AUROC minus ``logprob_mean``'s;
- the accuracy of majority vote, ``weighted`` and each DeepConf selection (:func:`calibrl.selection.select`), and
  each DeepConf selection's accuracy minus majority vote's.

A difference counts as a gain only when its 95% interval and its Bonferroni interval over the protocol's 12
primary differences (alpha 0.05 / 12, the same replicates) both lie above 0 (:func:`verdict`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "docs" / "results" / "deepconf_realmodel"
SAMPLES = DATA_DIR / "samples.jsonl.gz"
RUN = DATA_DIR / "run.json"
# the same command run again with the authors' token confidence (calibrl's default since): not an endpoint
RERUN_SAMPLES = DATA_DIR / "samples_authors_ci.jsonl.gz"
RERUN = DATA_DIR / "rerun.json"
PAGE = ROOT / "docs" / "results" / "deepconf_realmodel.md"

WINDOW = 16  # tokens: the protocol's deviation from the paper's 2,048 (completions of at most 64 tokens)
TAIL = 16
N_BOOT = 2000
SEED = 0
ALPHA = 0.05


def primary_counts() -> tuple[int, int]:
    """(signals, selections) of the protocol's primary differences: each DeepConf signal vs ``logprob_mean``, each
    DeepConf selection vs majority vote."""
    from calibrl.evaluation.samples import DEEPCONF_SOURCES
    from calibrl.selection import DEEPCONF_METHODS

    return len(DEEPCONF_SOURCES), len(DEEPCONF_METHODS)


def verdict(low: float, high: float, low_bonferroni: float, high_bonferroni: float, *, better: str,
            worse: str) -> str:
    """The words a difference's intervals allow: ``better`` / ``worse`` when both the 95% and the Bonferroni
    interval exclude 0 on that side, "<better> at 95% only (not after Bonferroni)" (or ``worse``) when only the
    95% interval does, else "not resolved"."""
    if low_bonferroni > 0:
        return better
    if high_bonferroni < 0:
        return worse
    if low > 0:
        return f"{better} at 95% only (not after Bonferroni)"
    if high < 0:
        return f"{worse} at 95% only (not after Bonferroni)"
    return "not resolved"


def load(path: Path = SAMPLES):
    """The committed samples as ``(Samples, answer_ids)``: read by :func:`calibrl.evaluation.samples.load_samples`
    with the study's window and tail (the gzip file decompressed to a temporary file first, since the reader
    takes plain JSONL), answers clustered as ``calibrl eval`` does."""
    from calibrl.selection import answer_clusters
    from studies.data_files import load_packed_samples

    samples = load_packed_samples(path, deepconf_window=WINDOW, deepconf_tail=TAIL)
    return samples, answer_clusters(samples.answers, samples.prompt_index)


def _interval(diff, alpha_bonferroni: float) -> dict:
    """A :class:`calibrl.metrics.paired.DifferenceCI` as numbers, with its Bonferroni interval from the same
    replicates."""
    from calibrl.metrics.bootstrap import percentile_interval

    low_b, high_b = percentile_interval(diff.replicates, alpha=alpha_bonferroni)
    return {"point": diff.point, "low": diff.low, "high": diff.high, "low_bonferroni": low_b,
            "high_bonferroni": high_b, "a": diff.a, "b": diff.b}


def _mean(correct):
    return float(np.mean(correct))


def analyse(samples, answer_ids, *, n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """Every number of the page: descriptives, the signals' AUROCs and their differences from ``logprob_mean``'s,
    the selections' accuracies and their differences from majority vote's."""
    from calibrl import metrics as M
    from calibrl.evaluation.samples import DEEPCONF_SOURCES
    from calibrl.metrics.paired import paired_bootstrap_difference
    from calibrl.selection import DEEPCONF_METHODS, select

    n_signals, n_selections = primary_counts()
    alpha_b = ALPHA / (n_signals + n_selections)
    pidx, correct = samples.prompt_index, samples.correct.astype(bool)
    per_prompt_right = np.bincount(pidx, weights=correct, minlength=samples.n_prompts)
    tokens = samples.n_tokens
    acc = M.bootstrap_ci(M.mean_at_k, {"correct": correct, "prompt_ids": pidx}, prompt_ids=pidx, n_boot=n_boot,
                         seed=seed)
    out: dict = {"descriptive": {
        "n_prompts": int(samples.n_prompts), "n_samples": int(len(samples)),
        "accuracy": [acc.point, acc.low, acc.high],
        "prompts_any_right": int((per_prompt_right > 0).sum()), "prompts_all_right": int(
            (per_prompt_right == np.bincount(pidx, minlength=samples.n_prompts)).sum()),
        "prompts_all_wrong": int((per_prompt_right == 0).sum()),
        "truncated": int(samples.truncated.sum()) if samples.truncated is not None else None,
        "no_answer": int(sum(a is None for a in samples.answers)),
        "tokens": [float(tokens.min()), float(np.median(tokens)), float(tokens.max())],
        "shorter_than_window": int((tokens < WINDOW).sum()),
        "alpha_bonferroni": alpha_b, "n_boot": n_boot, "seed": seed}}

    scores = {kind: samples.deepconf_signal(kind) for kind in DEEPCONF_SOURCES}
    scores["logprob_mean"] = samples.logprob_mean
    ranking = {}
    for kind, score in scores.items():
        ci = M.bootstrap_ci(M.auroc, {"confidence": score, "correct": correct}, prompt_ids=pidx, n_boot=n_boot,
                            seed=seed)
        within = M.per_prompt_auroc(score, correct, pidx)
        ranking[kind] = {"auroc": [ci.point, ci.low, ci.high], "within": [within.mean, within.n_prompts]}

    def auroc_difference(a: str, b: str) -> dict:
        diff = paired_bootstrap_difference("auroc", {"confidence": scores[a], "correct": correct},
                                           {"confidence": scores[b], "correct": correct}, prompt_ids_a=pidx,
                                           prompt_ids_b=pidx, n_boot=n_boot, seed=seed)
        return _interval(diff, alpha_b)

    out["ranking"] = ranking
    out["signal_vs_logprob"] = {kind: auroc_difference(kind, "logprob_mean") for kind in DEEPCONF_SOURCES}
    order = sorted(DEEPCONF_SOURCES, key=lambda k: -ranking[k]["auroc"][0])
    out["best_signal"] = {"best": order[0], "runner_up": order[1], **auroc_difference(order[0], order[1])}

    kwargs = {"logprob_mean": samples.logprob_mean, "deepconf_signals": samples.deepconf_signals}
    results = {m: select(m, answer_ids, correct, pidx, **kwargs) for m in ("majority", "weighted", *DEEPCONF_METHODS)}
    majority = results["majority"]
    selection = {}
    for method, res in results.items():
        entry = {"accuracy": res.accuracy, "prompts_differing": int((res.correct != majority.correct).sum())}
        if method != "majority":
            diff = paired_bootstrap_difference(_mean, {"correct": res.correct}, {"correct": majority.correct},
                                               prompt_ids_a=res.prompts, prompt_ids_b=majority.prompts,
                                               n_boot=n_boot, seed=seed)
            entry["vs_majority"] = _interval(diff, alpha_b)
        selection[method] = entry
    out["selection"] = selection
    out["dropping_no_answer"] = _dropping_no_answer(samples, answer_ids, n_boot=n_boot, seed=seed, alpha_b=alpha_b)
    return out


def _dropping_no_answer(samples, answer_ids, *, n_boot: int, seed: int, alpha_b: float) -> dict:
    """The selections as the authors vote (not an endpoint: the protocol's rule is calibrl's): paths without an
    extracted answer dropped before filtering and voting, a problem left with none counted wrong. {"majority"
    accuracy, every DeepConf selection's accuracy and its difference from majority's, the same replicates}."""
    from calibrl.metrics.paired import paired_bootstrap_difference
    from calibrl.selection import DEEPCONF_METHODS, select

    answered = np.array([a is not None for a in samples.answers.tolist()], dtype=bool)
    pidx, correct = samples.prompt_index, samples.correct.astype(bool)
    every = np.arange(samples.n_prompts)

    def per_prompt(method: str) -> np.ndarray:
        res = select(method, answer_ids[answered], correct[answered], pidx[answered],
                     logprob_mean=samples.logprob_mean[answered], deepconf_signals=samples.deepconf_signals[answered])
        full = np.zeros(samples.n_prompts)  # no answered path: the authors' vote returns no answer, wrong
        full[res.prompts] = res.correct
        return full

    majority = per_prompt("majority")
    out = {"majority": float(majority.mean()), "selections": {}}
    for method in DEEPCONF_METHODS:
        values = per_prompt(method)
        diff = paired_bootstrap_difference(_mean, {"correct": values}, {"correct": majority}, prompt_ids_a=every,
                                           prompt_ids_b=every, n_boot=n_boot, seed=seed)
        out["selections"][method] = {"accuracy": float(values.mean()), "vs_majority": _interval(diff, alpha_b)}
    return out


def _level_words(accuracy_high: float) -> str:
    """What the accuracy's upper end says of the model on this task: "near the floor" below 0.25."""
    return ": the model is near the floor on this task (the interval's upper end is below 0.25)." if (
        accuracy_high < 0.25) else "."


def _ci(point: float, low: float, high: float, *, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(point)} [{f.format(low)}, {f.format(high)}]"


def _diff_cells(d: dict) -> str:
    return (f"{_ci(d['point'], d['low'], d['high'], signed=True)} | "
            f"[{d['low_bonferroni']:+.3f}, {d['high_bonferroni']:+.3f}]")


def _summary(res: dict) -> str:
    """One paragraph counting the primary differences by what their intervals allow."""
    from calibrl.selection import DEEPCONF_METHODS

    def side(d: dict) -> tuple[str, str]:  # (after Bonferroni, at 95% only): "+", "-" or ""
        full = "+" if d["low_bonferroni"] > 0 else "-" if d["high_bonferroni"] < 0 else ""
        only = "" if full else "+" if d["low"] > 0 else "-" if d["high"] < 0 else ""
        return full, only

    signals = {k: side(d) for k, d in res["signal_vs_logprob"].items()}
    selections = {m: side(res["selection"][m]["vs_majority"]) for m in DEEPCONF_METHODS}

    def names(table: dict, which: int, sign: str) -> str:
        found = [k for k, v in table.items() if v[which] == sign]
        return f"{len(found)} ({', '.join(found)})" if found else "none"

    return (f"Of DeepConf's {len(signals)} signals, ranking right over wrong: worse than `logprob_mean` after "
            f"Bonferroni {names(signals, 0, '-')}, better after Bonferroni {names(signals, 0, '+')}; at 95% only, "
            f"worse {names(signals, 1, '-')}, better {names(signals, 1, '+')}. Of its {len(selections)} "
            f"selections, against majority vote: a gain after Bonferroni {names(selections, 0, '+')}, a loss "
            f"{names(selections, 0, '-')}; a gain at 95% only {names(selections, 1, '+')}, a loss at 95% only "
            f"{names(selections, 1, '-')}; every other difference is not resolved.")


def report(res: dict, run: dict, again: tuple[dict, dict] | None = None) -> str:
    """The page docs/results/deepconf_realmodel.md, whole, from :func:`analyse`'s numbers and the run's record
    (``again``: the rerun's analysis and record, :func:`rerun_section`)."""
    d = res["descriptive"]
    level = 100 * (1 - d["alpha_bonferroni"])
    acc = d["accuracy"]
    lines = [
        "# DeepConf on the built-in real model (SmolLM2-135M-Instruct, arithmetic)",
        "",
        "Protocol, committed before the run: [../protocols/deepconf_realmodel.md](../protocols/deepconf_realmodel.md).",
        "Data: `docs/results/deepconf_realmodel/samples.jsonl.gz` (every row `calibrl generate` wrote, with its",
        "`token_confidence`) and `run.json` (command and times). This page is written whole by",
        "`python -m studies.deepconf_realmodel` and rebuilt by `python -m studies.reproduce --only deepconf_realmodel`.",
        "",
        "Run (2 shared CPU cores, `nice -n 10`), from "
        f"{run['started_utc']} to {run['finished_utc']} (UTC):",
        "",
        "```bash",
        run["command"],
        "```",
        "",
        f"{d['n_prompts']} problems x {d['n_samples'] // d['n_prompts']} completions = {d['n_samples']}; "
        f"window and tail {WINDOW} tokens (the paper's 2,048 exceed every completion; the protocol's deviation). "
        f"Every interval: 95% percentile, {d['n_boot']:,} prompt-bootstrap replicates (seed {d['seed']}), prompts "
        "as the unit; a difference's two members share each replicate's prompt draw. Bonferroni: the same "
        f"replicates at {level:.2f}% (alpha 0.05 / 12 primary differences).",
        "",
        "## In short",
        "",
        _summary(res),
        "",
        "## The samples",
        "",
        f"Accuracy {_ci(*acc)}{_level_words(acc[2])} {d['prompts_any_right']} of "
        f"{d['n_prompts']} problems have at least one right completion, {d['prompts_all_wrong']} have every "
        f"completion wrong and {d['prompts_all_right']} have all {d['n_samples'] // d['n_prompts']} right; "
        f"{d['truncated']} completions were cut at the token limit and "
        f"{d['no_answer']} have no extracted answer. Completion lengths: {d['tokens'][0]:.0f} to "
        f"{d['tokens'][2]:.0f} tokens (median {d['tokens'][1]:.0f}); {d['shorter_than_window']} completions are "
        f"shorter than the {WINDOW}-token window, so their four signals are one (their mean).",
        "",
        "## Which signal ranks right over wrong",
        "",
        "| signal | pooled AUROC | within prompts (prompts with both outcomes) | AUROC - logprob_mean's | "
        "Bonferroni interval | reading |",
        "|---|---:|---:|---:|---:|---|",
    ]
    ranking = res["ranking"]
    for kind, r in ranking.items():
        within = f"{r['within'][0]:.3f} ({r['within'][1]})"
        if kind == "logprob_mean":
            lines.append(f"| {kind} (reference) | {_ci(*r['auroc'])} | {within} | | | |")
            continue
        diff = res["signal_vs_logprob"][kind]
        words = verdict(diff["low"], diff["high"], diff["low_bonferroni"], diff["high_bonferroni"],
                        better="ranks better than logprob_mean", worse="ranks worse than logprob_mean")
        lines.append(f"| {kind} | {_ci(*r['auroc'])} | {within} | {_diff_cells(diff)} | {words} |")
    best = res["best_signal"]
    best_words = ("its lead is resolved at 95%" if best["low"] > 0 else "its lead is not resolved: no signal is "
                  "established as the best")
    chance = [k for k, r in ranking.items() if r["auroc"][1] <= 0.5 <= r["auroc"][2]]
    below = [k for k, r in ranking.items() if r["auroc"][2] < 0.5]
    if chance or below:
        chance_words = (f"Not distinguishable from chance (interval contains 0.5): {', '.join(chance) or 'none'}; "
                        f"below chance: {', '.join(below) or 'none'}. ")
    else:
        chance_words = "Every AUROC interval in the table lies above 0.5 (better than chance). "
    lines += [
        "",
        f"Highest pooled AUROC among DeepConf's signals: {best['best']}; its difference from the runner-up "
        f"({best['runner_up']}) is {_ci(best['point'], best['low'], best['high'], signed=True)}, so {best_words}. "
        + chance_words
        + "The pooled AUROC also credits a signal for telling easy problems from hard ones; the within-prompt "
        "column averages only the problems that have both outcomes, few here, and is not an endpoint (no "
        "interval): there the signals read "
        + ", ".join(f"{k} {r['within'][0]:.3f}" for k, r in ranking.items() if k != "logprob_mean")
        + f" against logprob_mean's {ranking['logprob_mean']['within'][0]:.3f}, so part of the pooled gap may "
        "come from telling problems apart rather than right from wrong completions of one problem.",
        "",
        "## What each selection gains over majority vote",
        "",
        "| selection | accuracy | problems where its expected correctness differs from majority's | accuracy - majority's | "
        "Bonferroni interval | reading |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for method, s in res["selection"].items():
        if method == "majority":
            lines.append(f"| majority (reference) | {s['accuracy']:.3f} | | | | |")
            continue
        diff = s["vs_majority"]
        words = verdict(diff["low"], diff["high"], diff["low_bonferroni"], diff["high_bonferroni"],
                        better="gains over majority", worse="loses to majority")
        label = f"{method} (not an endpoint)" if method == "weighted" else method
        lines.append(f"| {label} | {s['accuracy']:.3f} | {s['prompts_differing']} | {_diff_cells(diff)} | "
                     f"{words} |")
    widest = max(max(abs(s["vs_majority"]["low"]), abs(s["vs_majority"]["high"]))
                 for m, s in res["selection"].items() if m != "majority")
    lines += [
        "",
        "A selection can differ from majority vote only on a problem whose completions disagree and include a "
        f"right one; with {d['prompts_any_right']} such problems at most, each difference rests on few problems "
        f"and the intervals reach as far as {widest:.3f} from 0. An unresolved difference is not evidence of no "
        "difference: the data are compatible with any value inside its interval.",
        "",
        "Here a path without an extracted answer votes for its problem's no-answer cluster (calibrl's rule for "
        "every vote); the authors drop such paths before filtering and voting. Voting as they do (not an endpoint, "
        f"the same replicates): majority {res['dropping_no_answer']['majority']:.3f}, and each selection minus it "
        + ", ".join(f"{m} {_ci(e['vs_majority']['point'], e['vs_majority']['low'], e['vs_majority']['high'], signed=True)}"
                    for m, e in res["dropping_no_answer"]["selections"].items()) + ".",
        "",
        "## Scope",
        "",
        f"One untrained 135M model on one synthetic task, at accuracy {acc[0]:.3f}, completions of at most 64 tokens "
        f"and windows of {WINDOW} tokens: not the paper's setting (reasoning models of 8B-120B parameters, traces of "
        "thousands of tokens, 2,048-token windows, competition mathematics). These numbers say how "
        "DeepConf's signals behave on this model; they do not test the paper's claims.",
        "",
    ]
    if again is not None:
        lines += [rerun_section(res, *again), ""]
    return "\n".join(lines)


def rebuild() -> str:
    """The page from the committed data: the first run, and the rerun when it is committed."""
    samples, answer_ids = load()
    again = None
    if RERUN_SAMPLES.is_file():
        rerun_samples, rerun_ids = load(RERUN_SAMPLES)
        again = (analyse(rerun_samples, rerun_ids), json.loads(RERUN.read_text()))
    return report(analyse(samples, answer_ids), json.loads(RUN.read_text()), again)


def rerun_section(res: dict, again: dict, rerun: dict) -> str:
    """What the authors' reading of C_i changes (the rerun of the same command after calibrl's default became the
    authors' ``compute_confidence``: the sampled token averaged in when outside the top 20), every figure of both
    analyses side by side. Not an endpoint: the protocol's data are the first run's."""
    verdicts = []
    for kind, d in res["signal_vs_logprob"].items():
        e = again["signal_vs_logprob"][kind]
        words = [verdict(x["low"], x["high"], x["low_bonferroni"], x["high_bonferroni"], better="better",
                         worse="worse") for x in (d, e)]
        verdicts.append(words[0] == words[1])
    for method, sel in res["selection"].items():
        if method not in ("majority", "weighted"):  # the protocol's primary selections
            d, e = sel["vs_majority"], again["selection"][method]["vs_majority"]
            verdicts.append(verdict(d["low"], d["high"], d["low_bonferroni"], d["high_bonferroni"], better="g",
                                    worse="l") == verdict(e["low"], e["high"], e["low_bonferroni"],
                                                           e["high_bonferroni"], better="g", worse="l"))
    lines = ["## The authors' token confidence: the same command run again", "",
             "calibrl's `token_confidence` was at first minus the mean of the top 20 log-probabilities; the authors' "
             "code (`deepconf/utils.py` `compute_confidence`) averages every entry vLLM returns, the sampled token "
             "included when it is outside the top 20, and calibrl now does too ([../fidelity.md](../fidelity.md)). "
             f"The protocol's command was run again from {rerun['started_utc']} to {rerun['finished_utc']} (UTC) "
             "with that default (data: `docs/results/deepconf_realmodel/samples_authors_ci.jsonl.gz`, `rerun.json`); "
             f"{again['descriptive']['n_samples']} completions, {rerun['same_completions']} of them the same text as "
             "the first run's (the rest differ by this machine's float rounding). Not an endpoint: the tables above "
             "are the protocol's data. The same figures on the rerun:", "",
             "| figure | first run | rerun (authors' C_i) |", "|---|---:|---:|"]
    for kind, r in res["ranking"].items():
        lines.append(f"| {kind} pooled AUROC | {_ci(*r['auroc'])} | {_ci(*again['ranking'][kind]['auroc'])} |")
    for kind, d in res["signal_vs_logprob"].items():
        e = again["signal_vs_logprob"][kind]
        lines.append(f"| {kind} - logprob_mean | {_ci(d['point'], d['low'], d['high'], signed=True)} | "
                     f"{_ci(e['point'], e['low'], e['high'], signed=True)} |")
    for method, sel in res["selection"].items():
        lines.append(f"| {method} accuracy | {sel['accuracy']:.3f} | {again['selection'][method]['accuracy']:.3f} |")
    same = sum(verdicts)
    lines += ["", f"The reading of {same} of {len(verdicts)} primary differences is the same on the rerun"
              + (": every reading holds." if same == len(verdicts) else ".")]
    return "\n".join(lines)


def pack(generated: Path, times: dict[str, str], command: str, *, samples: Path = SAMPLES, run: Path = RUN,
         extra: dict | None = None) -> None:
    """Commit-ready data from a finished run (:func:`studies.data_files.pack_generate_run`; ``samples`` / ``run``:
    the rerun's ``samples_authors_ci.jsonl.gz`` / ``rerun.json``; ``extra``: more fields for it)."""
    from studies.data_files import pack_generate_run

    pack_generate_run(generated, samples, run, times=times, command=command, extra=extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", type=Path, help="a finished calibrl generate JSONL to pack into the data folder")
    parser.add_argument("--started-utc", help="--pack: the run's UTC start")
    parser.add_argument("--finished-utc", help="--pack: the run's UTC end")
    parser.add_argument("--command", help="--pack: the run's command as given in the protocol")
    args = parser.parse_args(argv)
    if args.pack:
        if not (args.started_utc and args.finished_utc and args.command):
            parser.error("--pack needs --started-utc, --finished-utc and --command")
        pack(args.pack, {"started_utc": args.started_utc, "finished_utc": args.finished_utc}, args.command)
        print(f"wrote {SAMPLES} and {RUN}")
        return 0
    PAGE.write_text(rebuild())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
