"""``calibrl eval FILE... --out DIR``: calibration, abstention and answer-selection report for sampled completions.

Writes ``metrics.json``, ``report.md`` and PNG figures for the whole input ("overall") and per benchmark, with
several files compared side by side (each labelled by its file stem). Every input is read and validated before
anything is written; the report is built in a temporary folder beside DIR and renamed into place at the end, so an
error never leaves a half-written DIR. Only calibrl's own output is ever replaced: DIR must be absent, empty, or hold
exactly a previous report (its metrics.json, report.md and the figures metrics.json lists), and no input file may
lie inside it, and it must be renamable (not a mount point); otherwise the command exits with code 2 before
reading anything. Invalid input exits with code 2 and a ``file:line: field 'x': problem`` message. A failed write
(a full disk), Ctrl-C or SIGTERM while the report is built, and another eval's report landing in DIR first end in
one line and exit code 2, DIR as it was and the temporary folder removed.

This module parses the options, applies those rules and shows progress and the summary; the report itself is
computed and written by :func:`calibrl.evaluation.pipeline.write_eval_report`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from calibrl._files import recover_interrupted, replace_folder
from calibrl.cli.app import app, mark_ends_clean


# The choices below are the registries' (calibrl.posthoc, readers.GRADERS and FORMATS, calibrl.metrics.abstention,
# samples.CONFIDENCE_KINDS), spelled out so that `calibrl --help` imports neither numpy nor scipy;
# tests/test_cli.py checks each against its registry.


class Posthoc(str, Enum):
    """The calibrators of :func:`calibrl.posthoc.available_posthoc`."""

    isotonic = "isotonic"
    temperature = "temperature"
    platt = "platt"


class Grader(str, Enum):
    """The graders of :data:`calibrl.evaluation.readers.GRADERS`."""

    boxed = "boxed"
    math_verify = "math-verify"


class SampleFormat(str, Enum):
    """The input formats :func:`calibrl.evaluation.samples.load_samples` reads (its ``FORMATS``)."""

    calibrl = "calibrl"
    trl = "trl"
    verl = "verl"
    vllm = "vllm"
    openai = "openai"
    lm_eval = "lm-eval"


class AbstainMethod(str, Enum):
    """The procedures of :func:`calibrl.metrics.calibrated_abstention` (docs/metrics.md)."""

    betting = "betting"
    bonferroni = "bonferroni"


class Confidence(str, Enum):
    """The main confidence inputs of :data:`calibrl.evaluation.samples.CONFIDENCE_KINDS`."""

    logprob_mean = "logprob_mean"
    decision_prob = "decision_prob"
    class_probs = "class_probs"
    verbalized_confidence = "verbalized_confidence"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _labels(paths: list[Path]) -> list[str]:
    """File stems, made unique with the parent folder name, then the extension, then an index when two files
    share a stem."""
    stems = [p.stem for p in paths]
    labels = []
    for p, stem in zip(paths, stems):
        labels.append(f"{p.parent.name}/{stem}" if stems.count(stem) > 1 and p.parent.name else stem)
    # same stem and folder: x.jsonl vs x.parquet
    labels = [f"{lab}{p.suffix}" if labels.count(lab) > 1 else lab for p, lab in zip(paths, labels)]
    return [f"{lab}#{i + 1}" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels)]


def _step_inputs(path: Path, label: str, input_format: Optional[SampleFormat]
                 ) -> list[tuple[str, Path, tuple[str, str] | None]]:
    """The inputs ``path`` stands for, as ``(label, file, (format, note) or None)``: itself, or for a TRL / verl
    folder holding several training steps one input per step in step order, labelled ``<label> step N``, except the
    last step, the headline, which keeps the folder's ``label``; each noted as such (see
    :func:`calibrl.evaluation.readers.step_files`)."""
    from calibrl.evaluation.readers import detect_format, step_files

    if not path.is_dir():
        return [(label, path, None)]
    fmt = input_format.value if input_format is not None else detect_format(path)
    steps = step_files(path, fmt)
    if not steps:
        return [(label, path, None)]
    last = steps[-1][0]
    listed = ", ".join(str(step) for step, _ in steps)

    def note(step: int) -> str:
        return (f"{path.name}: step {step} of the {len(steps)} steps in the folder ({listed}); each step is scored "
                f"as its own input, in step order; the last (step {last}) is the headline, labelled {label!r}")

    return [(label if step == last else f"{label} step {step}", file, (fmt, note(step))) for step, file in steps]


def _own_files(out: Path) -> set[str] | None:
    """The files a previous ``calibrl eval`` wrote in ``out`` (metrics.json, report.md and the figures its
    metrics.json lists), or None when ``out`` has no readable calibrl metrics.json."""
    try:
        payload = json.loads((out / "metrics.json").read_text())
        figures = payload["figures"]
        names = {"metrics.json", "report.md"}
        for listed in figures.values():
            names.update(str(n) for n in listed)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return names if isinstance(payload.get("results"), dict) else None


def _check_inputs_resolve(files: list[Path]) -> None:
    """Refuse an input whose path cannot be followed (a symlink loop) before anything else touches it."""
    for path in files:
        try:
            path.resolve(strict=True)
        except FileNotFoundError:
            pass  # the reader names a missing file
        except (OSError, RuntimeError) as exc:
            reason = "a symlink loop" if "loop" in str(exc).lower() else (getattr(exc, "strerror", None) or exc)
            _fail(f"{path}: cannot be read ({reason})")


def _check_out_writable(out: Path) -> None:
    """Refuse an --out whose folder cannot hold the report (``/proc/x``, a read-only place), before reading any
    input: the report is built in a temporary folder beside ``out`` (:func:`calibrl._files.replace_folder`), tried here."""
    try:
        parent = out.resolve().parent
        parent = next((p for p in (parent, *parent.parents) if p.exists()), parent)  # nothing created here
        Path(tempfile.mkdtemp(prefix=f".{out.name}.check-", dir=parent)).rmdir()
    except (OSError, RuntimeError) as exc:
        _fail(f"--out {out}: cannot write there ({getattr(exc, 'strerror', None) or exc})")


def _check_out_dir(out: Path, files: list[Path]) -> None:
    """Refuse an --out that is a file, that contains an input file, or that holds anything a previous calibrl
    eval did not write: only calibrl's own report is ever replaced."""
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} exists and is not a folder")
    root = out.resolve()
    for path in files:
        if root in path.resolve().parents:
            _fail(f"input {path} lies inside --out {out}, which is replaced by the report; choose another --out")
    if not out.is_dir():
        return
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return
    own = _own_files(out)
    if own is None:
        _fail(f"--out {out} is a non-empty folder that is not a previous calibrl eval report; choose another")
    foreign = [n for n in present if n not in own or not (out / n).is_file() or (out / n).is_symlink()]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        _fail(f"--out {out} holds files a previous calibrl eval did not write ({shown}); move them or choose "
              "another --out")


@app.command("eval", short_help="Calibration, abstention and answer-selection report of samples.")
def eval_command(
    files: list[Path] = typer.Argument(..., help="Samples files (.jsonl or .parquet), one row per completion."),
    out: Path = typer.Option(..., "--out", help="Output folder (replaced if it holds a previous eval report)."),
    posthoc: Optional[Posthoc] = typer.Option(
        None, "--posthoc", help="Also report cross-validated post-hoc calibration (folds split by prompt)."),
    n_bins: int = typer.Option(10, "--n-bins", min=2, max=1000, help="Bins for ECE / MCE / reliability diagrams (2-1000)."),
    bootstrap: int = typer.Option(
        1000, "--bootstrap", min=0, max=1_000_000, help="Prompt-level bootstrap resamples for intervals (0: none)."),
    no_math_verify: bool = typer.Option(
        False, "--no-math-verify", help="Cluster answers by normalised string only (no math-verify)."),
    input_format: Optional[SampleFormat] = typer.Option(
        None, "--format",
        help="Format of every FILE: calibrl, trl, verl, vllm, openai or lm-eval (default: detected from each file's "
             "fields)."),
    answers: Optional[str] = typer.Option(
        None, "--answers",
        help="Gold answers for files that carry none (OpenAI-style, vLLM): a dataset file (rows with prompt_id, "
             "custom_id, id or unique_id and answer) or a calibrl dataset name; a line's own gold comes first."),
    grader: Grader = typer.Option(
        Grader.boxed, "--grader",
        help="How completions of files without correctness are graded: boxed (the last \\boxed{}) or math-verify "
             "(math-verify's parse of the whole completion, as TRL's accuracy_reward)."),
    strict: bool = typer.Option(
        False, "--strict",
        help="Refuse a file with failed rows (a null reward, a failed API request, an empty choice) instead of "
             "leaving them out with a count in report.md and metrics.json."),
    confidence: Optional[Confidence] = typer.Option(
        None, "--confidence",
        help="Main confidence input (default: the first of logprob_mean, decision_prob, class_probs, "
             "verbalized_confidence in each file); every source present is also compared side by side."),
    methods: str = typer.Option(
        "majority,weighted,pc,rpc,best_of_n", "--methods",
        help="Answer-selection methods for the scaling curves ('' for none); also deepconf_mean, deepconf_tail, "
             "deepconf_bottom10, deepconf_min, deepconf_tail_top10, deepconf_bottom10_top10, deepconf_tail_top90, "
             "deepconf_bottom10_top90 (DeepConf's votes: need a token_confidence array on every row)."),
    deepconf_window: int = typer.Option(
        2048, "--deepconf-window", min=1,
        help="Tokens of DeepConf's sliding window (bottom-10% and lowest window confidence) of token_confidence."),
    deepconf_tail: int = typer.Option(
        2048, "--deepconf-tail", min=1, help="Tokens of DeepConf's tail confidence (the last this many)."),
    scaling_draws: int = typer.Option(
        10, "--scaling-draws", min=1, max=10_000, help="Random path subsets averaged per N on the scaling curves."),
    rpc_draws: int = typer.Option(
        2, "--rpc-draws", min=1, max=1000,
        help="Draws per N for RPC's curve (one Weibull fit per prompt per draw: slow)."),
    seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1,
                             help="Seed (0 to 2^32-1) for bootstrap, folds and scaling-curve draws."),
    abstain_precision: Optional[float] = typer.Option(
        None, "--abstain-precision",
        help="Choose a confidence threshold whose precision is >= P with probability >= 1 - D on calibration "
             "prompts (80% with --abstain-method betting, half with bonferroni), and report its coverage and "
             "precision on the other prompts."),
    abstain_delta: float = typer.Option(
        0.05, "--abstain-delta",
        help="Allowed probability D that the --abstain-precision guarantee fails (0 < D < 1)."),
    abstain_method: AbstainMethod = typer.Option(
        AbstainMethod.betting, "--abstain-method",
        help="How --abstain-precision certifies: betting (every sample, prompt-level betting test, fixed-sequence "
             "testing; the stronger) or bonferroni (one sample per prompt, Clopper-Pearson, Bonferroni over the "
             "grid)."),
    no_figures: bool = typer.Option(
        False, "--no-figures",
        help="Write metrics.json and report.md without the PNG figures (about 0.7 s a figure, up to 7 a benchmark)."),
    plugins: list[str] = typer.Option(
        [], "--plugins",
        help="A module (on PYTHONPATH) or .py file to import first, e.g. one declaring your own metrics with "
             "calibrl.metrics.register_metric (docs/custom-metric.md); repeat or separate with commas."),
) -> None:
    """Evaluate calibration (AUROC, ECE, Brier, reliability), abstention (precision-coverage, AURC), post-hoc
    calibration and inference-time answer selection (majority, weighted, PC, RPC, best-of-N) of sampled
    completions; several FILEs are compared side by side."""
    from calibrl._registry import PluginError, import_plugins
    from calibrl.evaluation.pipeline import write_eval_report
    from calibrl.evaluation.samples import SamplesError, load_answers, load_samples
    from calibrl.evaluation.settings import EvalSettings
    from calibrl.selection import ALL_METHODS

    for name, value in (("--abstain-precision", abstain_precision), ("--abstain-delta", abstain_delta)):
        if value is not None and not 0.0 < value < 1.0:
            _fail(f"{name} must lie strictly between 0 and 1, got {value}")
    method_list = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in method_list if m not in ALL_METHODS]
    if unknown:
        _fail(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(ALL_METHODS)}")
    plugin_list = [p.strip() for entry in plugins for p in entry.split(",") if p.strip()]
    try:  # before anything is read: a plugin's metrics are part of every figure
        import_plugins(plugin_list, "--plugins")
    except PluginError as exc:
        _fail(str(exc))
    _check_inputs_resolve(files)
    restored = recover_interrupted(out)
    if restored is not None:
        typer.echo(f"note: restored {out} from {restored.name}, left by an interrupted calibrl eval", err=True)
    _check_out_dir(out, files)
    _check_out_writable(out)
    _check_out_renamable(out)

    # 1. read and validate everything before writing anything
    reader_options = {"confidence": confidence.value if confidence else None, "strict": strict,
                      "grader": grader.value, "deepconf_window": deepconf_window, "deepconf_tail": deepconf_tail}
    if answers is not None:
        try:
            reader_options.update(answers=load_answers(answers), answers_source=answers)
        except SamplesError as exc:
            _fail(str(exc))
    if input_format is not None:
        reader_options["format"] = input_format.value
    loaded, labels, paths = [], [], []
    for path, label in zip(files, _labels(files)):
        try:
            for step_label, step_path, step_note in _step_inputs(path, label, input_format):
                options = dict(reader_options)
                if step_note:  # a file of a folder of steps: the folder's format
                    options["format"] = step_note[0]
                samples = load_samples(step_path, **options)
                if step_note:
                    samples.notes.append(step_note[1])
                loaded.append(samples)
                labels.append(step_label)
                paths.append(step_path)
        except SamplesError as exc:
            _fail(str(exc))
        except MemoryError:  # nothing is written yet; what was read is freed with the exception
            _fail(f"{path}: out of memory while reading it (with {sum(len(s) for s in loaded)} rows of earlier "
                  "inputs held, each about 400 bytes); free memory, or evaluate fewer or smaller files at once")

    # 2. build the report in a temporary folder, then swap it in
    settings = EvalSettings(n_bins=n_bins, bootstrap=bootstrap, posthoc=posthoc.value if posthoc else None,
                            math_verify=not no_math_verify, methods=tuple(method_list), scaling_draws=scaling_draws,
                            rpc_draws=rpc_draws, seed=seed, abstain_precision=abstain_precision,
                            abstain_delta=abstain_delta, abstain_method=abstain_method.value,
                            plugins=tuple(plugin_list), figures=not no_figures)
    results = _write_report(out, lambda folder, step, track: write_eval_report(
        folder, loaded, labels=labels, files=paths, settings=settings, step=step, track=track))
    _print_summary(results, out)
    mark_ends_clean()  # the report is in place and every file of it closed


class _Terminated(BaseException):
    """SIGTERM while the report is built, raised as Ctrl-C raises KeyboardInterrupt so the build folder is removed
    on the way out."""


def _write_report(out: Path, build: Callable[[Path, Callable, Callable], Any]) -> Any:
    """``build(folder, step, track)`` into a temporary folder swapped in as ``out`` (:func:`calibrl._files.replace_folder`), with
    progress shown; returns what ``build`` returned. A full disk or another failure to write, a failed swap and
    an interrupt (Ctrl-C, SIGTERM) end in one line and exit code 2, with ``out`` left as it was and the temporary
    folder removed."""
    def terminate(signum, frame):
        raise _Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread: SIGTERM keeps its handler
        previous = None
    try:
        with _progress() as (step, track):
            return replace_folder(out, lambda folder: build(folder, step, track))
    except (KeyboardInterrupt, _Terminated) as exc:
        why = "SIGTERM" if isinstance(exc, _Terminated) else "Ctrl-C (SIGINT)"
        _fail(f"interrupted by {why}; " + (f"the report was already in place in {out}" if getattr(
            exc, "report_placed", False) else f"--out {out} is left as it was, nothing written"))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and out.is_dir():
            _fail(f"--out {out} was written by another calibrl eval while this one ran; its report is kept and "
                  "this one is not written")
        _fail(f"--out {out}: cannot write the report ({reason}); {out} is left as it was, nothing written")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _check_out_renamable(out: Path) -> None:
    """Refuse an existing --out that cannot be renamed (a mount point, a folder in a sticky folder of another
    user), before reading any input: the report replaces it by renaming (:func:`calibrl._files.check_renamable`)."""
    from calibrl._files import FolderError, check_renamable

    try:
        check_renamable(out)
    except FolderError as exc:
        _fail(f"--out {exc}")


@contextlib.contextmanager
def _progress() -> Iterator[tuple[Callable[[str], None], Callable[[Iterable, int], Iterator]]]:
    """A transient progress display on stderr: yields ``step(description)``, which relabels the running stage, and
    ``track(iterable, total)``, which shows a bar for answer clustering's loop over prompts."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("evaluating", total=None)

        def step(description: str) -> None:
            progress.update(task, description=description)

        def track(iterable, total):
            sub = progress.add_task("math-verify answer clustering", total=total)
            for item in iterable:
                yield item
                progress.advance(sub)
            progress.remove_task(sub)

        yield step, track


def _print_summary(metrics: dict[str, dict[str, Any]], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    def num(x):
        return "n/a" if x is None else f"{x:.3f}"

    def text(name: str) -> str:  # a lone surrogate (an undecodable file name byte) as its escape, as in report.md
        return name.encode("utf-8", "backslashreplace").decode("utf-8")

    table = Table(title=f"calibrl eval -> {text(str(out))}")
    for col in ("scope", "input", "samples", "accuracy", "AUROC", "ECE", "Brier", "best selection"):
        table.add_column(col, justify="left" if col in ("scope", "input", "best selection") else "right")

    from calibrl.evaluation.report import repeated_scopes

    repeated = repeated_scopes(metrics)  # a single benchmark's scope is "overall": printed once
    metrics = {scope: by_label for scope, by_label in metrics.items() if scope not in repeated}
    for scope, by_label in metrics.items():
        for label, m in by_label.items():
            sel = m.get("selection") or {}
            best = max(sel.items(), key=lambda kv: -1 if kv[1] is None else kv[1], default=None)
            table.add_row(text(scope), text(label), str(m["n_samples"]), num(m["accuracy"]), num(m.get("auroc")), num(m.get("ece")),
                          num(m.get("brier")), f"{best[0]} {num(best[1])}" if best else "-")
    Console(file=sys.stdout).print(table)
    skipped: dict[tuple[str, str], list[str]] = {}  # (input, reason) -> selection methods asked for but not run
    for by_label in metrics.values():
        for label, m in by_label.items():
            for method, reason in (m.get("selection_skipped") or {}).items():
                names = skipped.setdefault((text(label), reason), [])
                if method not in names:
                    names.append(method)
    for (label, reason), names in skipped.items():
        typer.echo(f"note: {label}: not run: {', '.join(names)} ({reason})", err=True)
    for scope, by_label in metrics.items():  # the certified abstention threshold, or plainly that there is none
        for label, m in by_label.items():
            a = m.get("abstention")
            if a is None:
                continue
            scope, label = text(scope), text(label)
            goal = (f"precision >= {a['target_precision']:g} with probability >= {1 - a['delta']:g}"
                    + (f", method {a['method_name']}" if a.get("method_name") else ""))
            if a.get("threshold") is None:
                typer.echo(f"abstention {scope}/{label}: NO threshold satisfies {goal}"
                           + (f" ({a['note']})" if a.get("note") else ""))
            else:
                typer.echo(f"abstention {scope}/{label}: answer when confidence >= {a['threshold']:g} ({goal}): "
                           f"held-out coverage {num(a['coverage'])}, precision {num(a['precision_heldout'])}")
