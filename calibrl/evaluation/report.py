"""Markdown report for ``calibrl eval``: inputs, a "What this shows" paragraph per input computed from its overall
numbers, then per scope (overall, each benchmark) tables with one column per input file (side by side) and the
figures. When every input is one and the same benchmark, its scope is "overall" itself and is written once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from calibrl.evaluation.styles import SELECTION_NAMES
from calibrl.evaluation.scoring import SOURCE_INTERVALS
from calibrl.metrics.registry import metric, metrics_for

__all__ = ["markdown_table", "render_eval_report", "repeated_scopes", "what_this_shows"]

_OVERALL = "overall"

# (key in the metrics dict, row label): what the input is, then every declared ``eval`` metric in declaration
# order (calibrl.metrics.registry; accuracy first), with the counts of what the accuracy is made of after it


def _rows() -> list[tuple[str, str]]:
    declared = [(m.name, m.label) for m in metrics_for("eval")]
    head = [("n_samples", "samples"), ("n_prompts", "prompts"), ("confidence", "confidence input")]
    counts = [("n_truncated", "samples cut at the token limit"), ("n_no_answer", "samples with no extracted answer")]
    return head + declared[:1] + counts + declared[1:]


_COUNT_ROWS = ("n_truncated", "n_no_answer")  # shown "k of n" where some input's rows say it
_POSTHOC_ROWS = ["auroc", "ece", "ece_quantile", "brier", "nll", "aurc"]
_SAME_FLOAT = 1e-9  # pass@1 and mean@k agree to float rounding (both are the mean over prompts of c / n)
_SELECTION_TIE = 1e-12


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; cells are formatted with 4 decimals for floats."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c if isinstance(c, str) else _fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _with_ci(metrics: Mapping[str, Any], key: str) -> str:
    text = _fmt(metrics.get(key))
    ci = metrics.get("bootstrap", {}).get(key)
    if ci and None not in ci:
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


def _pass1_differs(metrics: Mapping[str, Any]) -> bool:
    """Whether pass@1 differs from mean@k beyond float rounding (it cannot: both are the mean over prompts of
    c / n, pass@1 through the product form of 1 - C(n-c, 1) / C(n, 1))."""
    acc, p1 = metrics.get("accuracy"), metrics.get("pass@1")
    return acc is not None and p1 is not None and abs(acc - p1) > _SAME_FLOAT


def repeated_scopes(results: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """The scopes other than "overall" whose results are overall's (every input is that one benchmark): the report
    writes them once, as "overall"."""
    overall = results.get(_OVERALL)
    return [s for s, by_label in results.items() if s != _OVERALL and overall and by_label == overall]


def _ci_cell(m: Mapping[str, Any], key: str) -> str:
    """``0.712 [0.685, 0.738]`` (3 decimals with an interval, else the table's 4), blank where the figure does not
    apply (a ranking-only source has no calibration figures), n/a where it is undefined."""
    if m.get(key) is None:
        return "" if m.get("probability") is False and "confidence" in metric(key).needs else "n/a"
    if key not in SOURCE_INTERVALS:
        return _fmt(m[key])
    ci = (m.get("intervals") or {}).get(key)  # read against their intervals: at the intervals' 3 decimals
    return _value(m[key], tuple(ci) if ci and None not in ci else None)


def _lead_sentence(ranking: Mapping[str, Any], key: str, what: str) -> str | None:
    """"X ranks best; its lead over Y is d [a, b]" as far as the paired interval allows."""
    lead = ranking.get(key)
    if not lead:
        return None
    best, over, d, ci = lead["best"], lead["over"], lead["difference"], lead.get("interval")
    if not ci or None in ci:
        return f"`{best}` has the best {what} ({d:+.3f} over `{over}`; without --bootstrap, not resolved)."
    if ci[0] > 0 or ci[1] < 0:
        return f"`{best}` has the best {what}; its lead over `{over}` is {d:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]."
    return (f"`{best}` and `{over}` are not resolved on {what}: the difference {d:+.3f} has the paired interval "
            f"[{ci[0]:+.3f}, {ci[1]:+.3f}], which contains 0.")


def _sources_section(by_label: Mapping[str, Mapping[str, Any]], labels: Sequence[str]) -> list[str]:
    """The confidence section's opening table: every confidence source of each input against AUROC, PRR and
    smooth ECE with their intervals, best AUROC first, and which to trust as far as the paired intervals allow."""
    if not any(by_label[l].get("confidence_sources") for l in labels):
        return []
    rows, sentences = [], []
    # the figures with bootstrap intervals first, then the other declared ones
    columns = sorted(metrics_for("sources"), key=lambda c: (SOURCE_INTERVALS + (c.name,)).index(c.name))
    for l in labels:
        srcs = by_label[l].get("confidence_sources") or {}
        ranking = by_label[l].get("confidence_ranking") or {}
        for kind in ranking.get("order") or list(srcs):
            m = srcs[kind]
            main = " (main)" if kind == by_label[l].get("confidence") else ""
            rows.append(([l] if len(labels) > 1 else []) + [f"`{kind}`{main}"]
                        + [_ci_cell(m, c.name) for c in columns] + [f"{m['n']} ({m['n_excluded']} excluded)"])
        said = [t for t in (_lead_sentence(ranking, "auroc", "AUROC"), _lead_sentence(ranking, "prr", "PRR"),
                            _lead_sentence(ranking, "smooth_ece", "smooth ECE (lowest)")) if t]
        if said:
            sentences.append(("" if len(labels) == 1 else f"{l}: ") + " ".join(said))
    header = (["input"] if len(labels) > 1 else []) + ["confidence source"] + [c.short for c in columns] + ["rows"]
    out = ["", "Which confidence to trust: every confidence source, each on the rows that have it, best AUROC "
           "first (AUROC and PRR: higher is better, PRR 0 = random rejection, 1 = the oracle; smooth ECE: lower is "
           "better, blank for a score that only ranks):", "", markdown_table(header, rows), ""]
    out += [t + "\n" for t in sentences]
    equal = [l for l in labels if by_label[l].get("deepconf_signals_equal")]
    if equal:
        out += [("" if len(labels) == 1 else f"{', '.join(equal)}: ") + "the four DeepConf signals are equal on "
                "every row, so their figures are too: no trace is longer than DeepConf's window and tail (2,048 "
                "tokens unless `--deepconf-window` / `--deepconf-tail` set them), so each signal is the trace's "
                "mean confidence.\n"]
    out += ["`logprob_mean` is scored as exp(logprob_mean) (AUROC and PRR rank logprob_mean itself); `class_probs` "
            "as the top class probability against whether the top class is the label; `answer_consistency` is the "
            "share of the prompt's samples giving the sample's answer, `semantic_entropy` ranks by minus the entropy "
            "of the prompt's answer clusters (a sample without an answer agrees with nobody); the others against "
            "`correct`. Leads are paired prompt-bootstrap intervals of the difference (the same prompt draws for "
            "every source)."]
    return out


def _abstention_section(by_label: Mapping[str, Mapping[str, Any]], labels: Sequence[str]) -> list[str]:
    """The certified abstention threshold of each input, and a plain sentence when none qualifies."""
    found = [l for l in labels if "abstention" in by_label[l]]
    if not found:
        return []
    first = by_label[found[0]]["abstention"]
    target, delta = first["target_precision"], first["delta"]
    keys = [("confidence", "confidence source"), ("threshold", "threshold (answer when confidence >= it)"),
            ("coverage", "coverage (held-out)"),
            ("precision_heldout", "precision (held-out)"),
            ("calibration_lower_bound", "precision lower bound (calibration)"),
            ("n_calibration_prompts", "calibration prompts"), ("n_heldout_prompts", "held-out prompts")]
    if first.get("method_name", "bonferroni") == "bonferroni":
        how = (f"Clopper-Pearson, Bonferroni over a fixed grid of {first.get('grid_size')} thresholds, one sample "
               "per calibration prompt; half of the prompts calibrate, the other half are held out")
    else:
        keys.insert(1, ("method_name", "method"))
        fraction = first.get("calibration_fraction")
        how = (f"every sample of {f'{100 * fraction:g}%' if fraction else 'part'} of the prompts, a prompt-level "
               f"betting test and fixed-sequence testing down a fixed grid of {first.get('grid_size')} thresholds "
               "from a start chosen on the other prompts, which are held out"
               + ("; the final capital also counts against a seeded uniform draw (randomized Ville)"
                  if first.get("randomized") else ""))
    goal = f"precision >= {target:g} with probability >= {1 - delta:g} ({how})"
    certified = [l for l in found if by_label[l]["abstention"].get("threshold") is not None]
    if certified:
        whose = "" if certified == found else f" for {', '.join(certified)}"
        out = ["", f"Abstention: answer only when confidence >= t, with t certified for {goal}:", "",
               f"Guaranteed{whose}: if prompts are exchangeable (calibration prompts and future ones drawn i.i.d. "
               f"from one distribution), then with probability >= {1 - delta:g} the precision of the answered "
               f"samples pooled over fresh prompts, E[answered and correct] / E[answered], is >= {target:g} at t (the "
               "held-out figures estimate it, with their own noise; the x on the precision-coverage plot marks t).",
               ""]
    else:  # no guarantee is stated for a threshold that does not exist
        out = ["", f"Abstention: no threshold t (answer only when confidence >= t) is certified for {goal}:", ""]
    out.append(markdown_table(["figure"] + found, [[name] + [_fmt(by_label[l]["abstention"].get(k)) for l in found]
                                                    for k, name in keys]))
    for l in found:
        a = by_label[l]["abstention"]
        if a.get("threshold") is None:
            out += ["", f"**{l}: no threshold satisfies the target.** {a.get('note') or ''}".rstrip()]
        elif a.get("note"):
            out += ["", f"{l}: {a['note']}."]
    return out


def _interval(metrics: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    """The bootstrap interval of ``key`` in ``metrics``, or None (no bootstrap, or an undefined bound)."""
    ci = (metrics.get("bootstrap") or {}).get(key)
    return (float(ci[0]), float(ci[1])) if ci and None not in ci else None


def _value(x: float, ci: tuple[float, float] | None) -> str:
    """``0.669 [0.612, 0.733]``: a figure with its interval, 3 decimals (the report's tables give 4)."""
    return f"{x:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _discrimination_sentence(m: Mapping[str, Any]) -> str:
    """What the pooled AUROC says, no more than its interval allows: above chance only when the whole interval is
    above 0.5, below chance only when it is below, otherwise not distinguishable from chance."""
    auroc, ci = m.get("auroc"), _interval(m, "auroc")
    source = f"the confidence (`{m.get('confidence')}`)"
    capital = source[0].upper() + source[1:]
    if auroc is None:
        return "AUROC is undefined: every answer scored is right, or every one is wrong."
    scale = "0.5 = chance, 1 = every right answer above every wrong one"
    if ci is None:
        return (f"AUROC {auroc:.3f} for how {source} ranks right answers above wrong ones ({scale}; without "
                "--bootstrap there is no interval to compare with chance).")
    if ci[0] > 0.5:
        return f"{capital} ranks right answers above wrong ones: AUROC {_value(auroc, ci)} ({scale})."
    if ci[1] < 0.5:
        return (f"{capital} ranks wrong answers above right ones, worse than chance: AUROC "
                f"{_value(auroc, ci)} ({scale}).")
    return (f"{capital} does not separate right from wrong answers distinguishably from "
            f"chance: AUROC {_value(auroc, ci)}, an interval that contains 0.5 (= chance).")


def _calibration_sentence(m: Mapping[str, Any]) -> str | None:
    """ECE with its interval, and the signed gap mean confidence - fraction right (over the same samples): over-
    confident when positive, under-confident when negative; a gap under half the ECE is reported as errors in
    both directions (the bins' gaps mostly cancel in the mean)."""
    ece, conf = m.get("ece"), m.get("mean_confidence")
    right = (m.get("precision_at_coverage") or {}).get("1.0")  # the fraction right over every scored sample
    if ece is None or conf is None or right is None:
        return None
    gap = conf - right
    text = (f"Calibration: ECE {_value(ece, _interval(m, 'ece'))} (0 = confidence matches the fraction right); "
            f"mean confidence {conf:.3f} against {right:.3f} right, ")
    if abs(gap) >= 0.5 * ece:
        return text + f"so the model is {'over' if gap > 0 else 'under'}-confident by {abs(gap):.3f} on average."
    return text + (f"a mean gap of {gap:+.3f}: it is over-confident at some confidence levels and under-confident "
                   "at others (see the reliability diagram).")


def _and(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _selection_sentence(m: Mapping[str, Any]) -> str | None:
    """The best answer-selection method over all paths against majority vote and one path (mean@k)."""
    sel = {k: v for k, v in (m.get("selection") or {}).items() if v is not None}
    if not sel:
        return None
    n = m.get("samples_per_prompt") or {}
    paths = f"{n.get('min')}" if n.get("min") == n.get("max") else f"{n.get('min')} to {n.get('max')}"
    top = max(sel.values())
    best = [k for k, v in sel.items() if v >= top - _SELECTION_TIE]
    names = _and([SELECTION_NAMES.get(k, k) for k in best]) + (" (tied)" if len(best) > 1 else "")
    one = f"one path {m['accuracy']:.3f}" if m.get("accuracy") is not None else ""
    rest = ([f"majority vote {sel['majority']:.3f} ({top - sel['majority']:+.3f})"]
            if "majority" in sel and "majority" not in best else [])
    rest += [one] if one else []
    which = f"the best {'are' if len(best) > 1 else 'is'} {names}," if len(sel) > 1 else f"{names}"
    return (f"Answer selection over all {paths} paths per prompt: {which} {top:.3f}"
            + (f", against {' and '.join(rest)}" if rest else "")
            + " (a single run over these prompts, without an interval: read small differences as noise).")


def _abstention_sentence(m: Mapping[str, Any]) -> str | None:
    """The certified abstention threshold's held-out coverage and precision, or that none is certified."""
    a = m.get("abstention")
    if not a:
        return None
    target = f"precision >= {a['target_precision']:g} with probability >= {1 - a['delta']:g}"
    if a.get("threshold") is None:
        n = a.get("n_calibration_prompts")
        on = f" on these {n} calibration prompts" if n else ""
        return f"Abstention: no confidence threshold is certified for {target}{on}."
    return (f"Abstention: answering only when confidence >= {a['threshold']:.3f} (certified for {target}) answers "
            f"{_fmt3(a.get('coverage'))} of the held-out samples, with precision {_fmt3(a.get('precision_heldout'))} "
            "there.")


def _selection_tokens_line(metrics: dict, label: str) -> list[str]:
    """What the selections of one input spend: the tokens of all paths of a prompt (DeepConf online's included)."""
    tokens = metrics.get("selection_tokens_per_prompt")
    if tokens is None:
        return []
    online = (" (a DeepConf online file: its early-stopped traces' tokens count, and `deepconf_online` is the "
              "answer its sampling voted for)") if "deepconf_online" in metrics.get("selection", {}) else ""
    return ["", f"Tokens spent per prompt by every selection of {label}: {tokens:,.0f}, all its paths{online}."]


def _fmt3(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _benchmark_sentence(results: Mapping[str, Mapping[str, Mapping[str, Any]]], label: str,
                        scopes: Sequence[str]) -> str | None:
    """The spread of accuracy (and AUROC) over the input's benchmarks, when it has several."""
    per = {s: results[s][label] for s in scopes if label in results[s]}
    if len(per) < 2:
        return None
    parts = []
    for key, name in (("accuracy", "accuracy"), ("auroc", "AUROC")):
        vals = {s: v[key] for s, v in per.items() if v.get(key) is not None}
        if len(vals) >= 2:
            lo, hi = min(vals, key=vals.get), max(vals, key=vals.get)
            parts.append(f"{name} from {vals[lo]:.3f} ({lo}) to {vals[hi]:.3f} ({hi})")
    return f"Over its {len(per)} benchmarks: " + "; ".join(parts) + "." if parts else None


def _made_of(m: Mapping[str, Any]) -> str:
    """What the accuracy is made of, when the rows say: ``; 87 of 160 samples were cut at the token limit and 17
    have no extracted answer`` (nothing when neither happened or the rows do not say)."""
    cut, unanswered, n = m.get("n_truncated"), m.get("n_no_answer"), m.get("n_samples")
    if cut and unanswered:
        return f"; {cut} of {n} samples were cut at the token limit and {unanswered} have no extracted answer"
    if cut:
        return f"; {cut} of {n} samples were cut at the token limit"
    return f"; {unanswered} of {n} samples have no extracted answer" if unanswered else ""


def _stated_abstention_sentence(m: Mapping[str, Any]) -> str | None:
    """The model's own "I don't know", in words: how often it answers, how often its answers are right, how many
    samples are wrong answers, and what its main confidence would do answering as often."""
    rate, right, wrong = m.get("answer_rate"), m.get("accuracy_answered"), m.get("hallucination_rate")
    if rate is None:
        return None
    text = (f"It answers {rate:.0%} of the time ({m.get('n_abstained')} of {m.get('n_samples')} samples say they do "
            "not know)" + (f"; of its answers, {right:.0%} are right" if right is not None else "")
            + f"; {wrong:.1%} of all samples are wrong answers.")
    versus = m.get("abstained_versus_threshold") or {}
    other = versus.get("threshold") or {}
    if other.get("accuracy_answered") is not None and 0 < versus.get("answered", 0) < m.get("n_samples", 0):
        text += (f" Answering as often by {versus['confidence']} instead (its {versus['answered']} most confident "
                 f"samples): {other['accuracy_answered']:.0%} right, {other['hallucination_rate']:.1%} wrong "
                 f"answers; {versus['declined_by_both']} samples are declined by both.")
    refused, lost = m.get("declined_unanswerable"), m.get("declined_answerable")
    if refused is not None:
        text += (f" Of the {m.get('n_unanswerable')} samples of items with no right answer it declines {refused:.0%}"
                 + (f", and {lost:.0%} of the others'." if lost is not None else "."))
    return text


def what_this_shows(results: Mapping[str, Mapping[str, Mapping[str, Any]]], *, benchmarks: Sequence[str] = ()
                    ) -> list[str]:
    """Plain sentences, one paragraph per input, on what the overall numbers show: accuracy with its interval,
    whether the confidence ranks right above wrong answers (AUROC against chance, as far as its interval allows),
    calibration (ECE and the signed gap mean confidence - fraction right), post-hoc calibration, the best answer
    selection against majority vote, abstention, and the spread over ``benchmarks`` (scopes of ``results``)."""
    overall = results.get(_OVERALL) or next(iter(results.values()), {})
    paragraphs = []
    for label, m in overall.items():
        acc = m.get("accuracy")
        n = m.get("samples_per_prompt") or {}
        per = f"{n.get('min')}" if n.get("min") == n.get("max") else f"{n.get('min')} to {n.get('max')}"
        out = [f"Accuracy {_value(acc, _interval(m, 'accuracy'))}: the mean over {m.get('n_prompts')} prompts of "
               f"the fraction right among their {per} samples{_made_of(m)}."] if acc is not None else []
        out.append(_stated_abstention_sentence(m))
        if m.get("confidence") is None:
            out.append("The input has no confidence: accuracy and majority vote only.")
        else:
            out.append(_discrimination_sentence(m))
            out.append(_calibration_sentence(m))
            post = m.get("posthoc") or {}
            if post.get("ece") is not None and m.get("ece") is not None:
                out.append(f"Post-hoc {post['method']} calibration (out-of-fold) moves ECE from {m['ece']:.3f} to "
                           f"{post['ece']:.3f}.")
        out += [_selection_sentence(m), _abstention_sentence(m), _benchmark_sentence(results, label, benchmarks)]
        text = " ".join(s for s in out if s)
        paragraphs.append(f"**{label}**: {text}" if len(overall) > 1 else text)
    return paragraphs


def render_eval_report(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]],
    figures: Mapping[str, Sequence[str]],
    *,
    inputs: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
) -> str:
    """Render the report.

    ``results``: ``{scope: {label: metrics dict}}`` (scope "overall" first, then benchmarks);
    ``figures``: ``{scope: [png file names]}``; ``inputs``: one dict per file (label, file, rows, prompts,
    confidence); ``settings``: the command's options, listed at the top.
    """
    out = ["# calibrl eval report", ""]
    out.append("Settings: " + ", ".join(f"`{k}={v}`" for k, v in settings.items()))
    out.append("")
    out.append(markdown_table(["label", "file", "samples", "prompts", "confidence"],
                              [[i["label"], f"`{i['file']}`", i["rows"], i["prompts"], i["confidence"]]
                               for i in inputs]))
    for i in inputs:  # how another tool's file was read (which field gave correctness, ...)
        fmt = i.get("format", "calibrl")
        for note in i.get("notes") or []:
            out += ["", f"{i['label']} ({fmt}): {note}"]
    out.append("")
    repeats = repeated_scopes(results)
    benchmarks = [s for s in results if s != _OVERALL and s not in repeats]
    paragraphs = what_this_shows(results, benchmarks=benchmarks)
    if paragraphs:
        out += ["## What this shows", ""]
        for text in paragraphs:
            out += [text, ""]
    for n_scope, (scope, by_label) in enumerate((s, b) for s, b in results.items() if s not in repeats):
        labels = list(by_label)
        if scope == _OVERALL and repeats:
            names = ", ".join(f"`{r}`" for r in repeats)
            out += [f"## {scope} (= benchmark {names})", "",
                    f"Every sample is from benchmark {names}, so this section is also that benchmark's "
                    "(metrics.json lists its results and figures under both names).", ""]
        else:
            out += [f"## {scope}", ""]
        rows = []
        # the model's own abstentions (answer rate and the rest): rows only where some input has them
        abstained_rows = {m.name for m in metrics_for("eval") if m.needs & {"abstained", "answerable"}}
        for key, name in _rows():
            if key in _COUNT_ROWS:
                if any(key in by_label[l] for l in labels):
                    rows.append([name] + [f"{by_label[l][key]} of {by_label[l]['n_samples']}" if key in by_label[l]
                                          else "n/a" for l in labels])
            elif key not in abstained_rows or any(key in by_label[l] for l in labels):
                rows.append([name] + [_with_ci(by_label[l], key) for l in labels])
        if any(_pass1_differs(by_label[l]) for l in labels):  # never beyond float rounding: shown if it did
            rows.insert(4, ["pass@1"] + [_fmt(by_label[l].get("pass@1")) for l in labels])
        passk = sorted({k for l in labels for k in by_label[l] if k.startswith("pass@") and k != "pass@1"},
                       key=lambda k: int(k[5:]) if k[5:].isdigit() else 0)
        rows += [[k] + [_fmt(by_label[l].get(k)) for l in labels] for k in passk]
        out.append(markdown_table(["metric"] + labels, rows))
        if n_scope == 0:
            out += ["", "Accuracy is mean@k, the mean over prompts of each prompt's fraction c / n of right samples; "
                    "it is also the unbiased pass@1 (1 - C(n-c, 1) / C(n, 1) = c / n), so one row shows both. "
                    "pass@k: the chance that k samples of a prompt, drawn without replacement, hold a right one."]
        if any("bootstrap" in by_label[l] for l in labels):
            b = next(by_label[l]["bootstrap"] for l in labels if "bootstrap" in by_label[l])
            out.append("")
            out.append(f"Brackets: {100 * (1 - b['alpha']):.0f}% prompt-level bootstrap intervals "
                       f"({b['n_boot']} resamples of prompts).")
        out += _sources_section(by_label, labels)
        if any("precision_at_coverage" in by_label[l] for l in labels):  # inputs with a confidence
            cov_rows = []
            for c in ("0.1", "0.2", "0.5", "0.8", "1.0"):
                cov_rows.append([c] + [_fmt(by_label[l].get("precision_at_coverage", {}).get(c)) for l in labels])
            out += ["", "Precision when answering only the most confident fraction (coverage):", ""]
            out.append(markdown_table(["coverage"] + labels, cov_rows))
        out += _abstention_section(by_label, labels)
        if any("posthoc" in by_label[l] for l in labels):
            method = next(by_label[l]["posthoc"]["method"] for l in labels if "posthoc" in by_label[l])
            out += ["", f"Post-hoc `{method}` calibration, cross-validated out-of-fold (folds split by prompt):", ""]
            out.append(markdown_table(["metric"] + labels, [
                [metric(k).label] + [_fmt(by_label[l].get("posthoc", {}).get(k)) for l in labels] for k in _POSTHOC_ROWS
            ]))
            out += ["", "The post-hoc AUROC pools out-of-fold values from maps fit on different folds, so it can differ "
                    "from the uncalibrated AUROC even for monotone maps (temperature, Platt); compare discrimination "
                    "with the AUROC above."]
        if any("selection" in by_label[l] for l in labels):
            methods = []
            for l in labels:
                methods += [m for m in by_label[l].get("selection", {}) if m not in methods]
            out += ["", "Answer selection with all N paths per prompt (accuracy; ties split evenly):", ""]
            if methods:
                out.append(markdown_table(["method"] + labels, [
                    [f"{SELECTION_NAMES[m]} (`{m}`)" if m in SELECTION_NAMES else m]
                    + [_fmt(by_label[l].get("selection", {}).get(m)) for l in labels] for m in methods
                ]))
            for l in labels:
                if by_label[l].get("scaling_note"):
                    out += ["", f"Note for {l}: {by_label[l]['scaling_note']}."]
                out += _selection_tokens_line(by_label[l], l)
                skipped = by_label[l].get("selection_skipped") or {}
                for why in dict.fromkeys(skipped.values()):
                    names = ", ".join(m for m, w in skipped.items() if w == why)
                    out += ["", f"Not run for {l}: {names} ({why}; these methods need it on every path)."]
        if figures.get(scope):
            out.append("")
            images = [f"![{name}]({name})" for name in figures[scope]]
            for i in range(len(images) - 1, 0, -1):  # the smoothed reliability diagram beside the binned one
                if figures[scope][i].endswith("_reliability_smooth.png"):
                    images[i - 1:i + 1] = [images[i - 1] + " " + images[i]]
            out += images
        out.append("")
    return "\n".join(out)
