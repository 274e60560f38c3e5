"""What a training run shows and keeps: the progress bar, ``log_history.jsonl`` and the end-of-run summary.

:func:`log_history_writer` drops undefined metrics (None / NaN) from every log and appends each to
``<output_dir>/log_history.jsonl``, so the per-step history survives with ``report_to: none``;
:func:`progress_callback` is the rich progress bar with the latest reward and AUROC plus one line per logging step
(step, loss, reward, accuracy, calibration); :func:`summarize` and :func:`print_summary` give the last steps'
means at the end. :mod:`calibrl.trl.train` installs them.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["LOG_HISTORY", "format_step_line", "log_history_writer", "print_summary", "progress_callback",
           "quiet_transformers_bars", "summarize"]


LOG_HISTORY = "log_history.jsonl"


@contextmanager
def quiet_transformers_bars():
    """Within it, transformers shows none of its tqdm bars ("Loading weights", "Writing model shards"); on exit
    they are as they were. For output that has its own progress display (calibrl's bar, or one line per step)."""
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()


def _defined(value: Any) -> bool:
    """False for a metric with no value this step (None, NaN: e.g. AUROC of a batch with one class)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def log_history_writer():
    from transformers import TrainerCallback

    class LogHistoryWriter(TrainerCallback):
        """Drops undefined metrics (None / NaN) from every logged dict, so no logger records them and averages
        stay honest, and appends each log to ``<output_dir>/log_history.jsonl`` (one JSON line with ``step``,
        ``epoch`` and every metric, main process only) so the per-step history survives with ``report_to:
        none``. Put first in the callback list so the printer and the trackers see the filtered dict."""

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                _truncate_log_history(Path(args.output_dir) / LOG_HISTORY, after_step=state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            for record in (logs, state.log_history[-1] if state.log_history else None):
                if isinstance(record, dict):
                    for key in [k for k, v in record.items() if not _defined(v)]:
                        del record[key]
            if not state.is_world_process_zero or not logs:
                return
            path = Path(args.output_dir) / LOG_HISTORY
            path.parent.mkdir(parents=True, exist_ok=True)
            line = {"step": state.global_step, "epoch": state.epoch, **logs}
            with path.open("a") as handle:
                handle.write(json.dumps(line, default=float) + "\n")

    return LogHistoryWriter()


def _truncate_log_history(path: Path, *, after_step: int) -> None:
    """Keep only the lines of steps up to ``after_step`` but the end-of-training line (a resumed run rewrites the
    steps after its checkpoint and its own end line; a fresh run starts an empty history)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            # the end-of-training line (train_runtime, train_loss) is written again when the resumed run ends
            if record.get("step", 0) <= after_step and after_step > 0 and "train_runtime" not in record:
                kept.append(line)
        except json.JSONDecodeError:
            continue
    path.write_text("".join(f"{line}\n" for line in kept))


_SUMMARY_KEYS = (
    ("loss", "loss"),
    ("reward", "reward"),
    ("accuracy", "calibration/accuracy"),
    ("AUROC (pooled)", "calibration/auroc"),
    ("AUROC (per prompt)", "calibration/auroc_per_prompt"),
    ("confidence right", "calibration/confidence_correct"),
    ("confidence wrong", "calibration/confidence_wrong"),
    ("masked fraction", "calibration/estimator/mask_fraction"),
    # a decision recipe: the decision term logs decision/* at every step; calibration/decision_* exist only at
    # steps where some completion had a decision token, so the share that had one says why they may be missing
    # (decision/decision_ce is left out: it reads 0, not undefined, at a step without a decision token)
    ("share with a decision token", "decision/frac_with_decision"),
    ("decision ECE", "calibration/decision_ece"),
    ("decision p>0.99", "calibration/decision_frac_above_099"),
    ("decision prob (chosen)", "calibration/decision_prob_mean"),
    ("entropy", "entropy"),
)


# (label, key, format) of the per-step line, in order; a metric the step did not log is left out
_STEP_LINE_KEYS = (
    ("loss", "loss", ".4f"),
    ("reward", "reward", ".3f"),
    ("accuracy", "calibration/accuracy", ".3f"),
    ("auroc", "calibration/auroc", ".3f"),
    ("auroc/prompt", "calibration/auroc_per_prompt", ".3f"),
    ("decision ece", "calibration/decision_ece", ".3f"),
    ("masked", "calibration/estimator/mask_fraction", ".2f"),
)


_HELDOUT_PREFIX = "eval_calibration/"  # calibrl.trl.callbacks.LOG_PREFIX, kept here without its imports


def is_heldout_log(logs: dict) -> bool:
    """Whether a log is the held-out calibration callback's (only ``eval_calibration/*`` keys), not TRL's own
    evaluation (``eval_loss``, ``eval_runtime``, ... beside its ``eval_calibration/*`` telemetry)."""
    keys = [k for k in logs if k.startswith("eval_")]
    return bool(keys) and all(k.startswith(_HELDOUT_PREFIX) for k in keys)


def format_step_line(logs: dict, step: int, max_steps: int) -> str | None:
    """One line for a training log (``step 3/10  loss 0.0123  reward 0.500  accuracy 0.500  auroc 0.625``), for
    TRL's evaluation (``eval at step 4: ...``) or for the held-out calibration callback (``held-out calibration at
    step 4: ...``, sampled on the callback's own prompts); None for other logs (the end-of-training totals)."""
    evaluation = any(k.startswith("eval_") for k in logs)
    prefix = "eval_" if evaluation else ""
    parts = [f"{label} {logs[prefix + key]:{fmt}}" for label, key, fmt in _STEP_LINE_KEYS
             if isinstance(logs.get(prefix + key), (int, float)) and _defined(logs[prefix + key])]
    if evaluation:
        if isinstance(logs.get("eval_loss"), (int, float)) and not any(p.startswith("loss ") for p in parts):
            parts.insert(0, f"loss {logs['eval_loss']:.4f}")
        name = "held-out calibration" if is_heldout_log(logs) else "eval"
        return f"{name} at step {step}: " + "  ".join(parts) if parts else None
    if "loss" not in logs and "reward" not in logs:
        return None
    width = len(str(max_steps)) if max_steps and max_steps > 0 else 1
    total = f"/{max_steps}" if max_steps and max_steps > 0 else ""
    return f"step {step:>{width}}{total}  " + "  ".join(parts)


def progress_callback(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from transformers import TrainerCallback

    class RichProgress(TrainerCallback):
        """Rich progress bar with the latest reward and AUROC, and one printed line per logging step, above the bar
        in a terminal and plain when the output is a file or a pipe (main process only)."""

        def __init__(self):
            self.progress = None
            self.task = None
            self.last: dict[str, float] = {}

        def on_train_begin(self, args, state, control, **kwargs):
            if not state.is_world_process_zero:
                return
            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console, transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task("train", total=state.max_steps, completed=state.global_step, info="")

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                self.last.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
                line = format_step_line(logs, state.global_step, state.max_steps) if state.is_world_process_zero \
                    else None
                if line:
                    console.print(line, markup=False, highlight=False, soft_wrap=True)
            if self.progress is not None:
                parts = []
                for label, key in (("reward", "reward"), ("auroc", "calibration/auroc")):
                    value = self.last.get(key)
                    if value is not None and not (isinstance(value, float) and math.isnan(value)):
                        parts.append(f"{label} {value:.3f}")
                self.progress.update(self.task, info="  ".join(parts))

        def on_step_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update(self.task, completed=state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update(self.task, completed=state.global_step)
                self.progress.stop()
                self.progress = None

    return RichProgress()


def summarize(log_history: list[dict], *, last_n: int = 5) -> dict[str, dict[str, float]]:
    """First and last (mean of the last ``last_n`` logged values, ``last_count`` of them) of the summary metrics,
    the last value of TRL's evaluation (``eval``) and of the held-out calibration callback (``held-out``)."""

    def last_value(key: str, heldout: bool) -> float | None:
        found = [h[key] for h in log_history if isinstance(h.get(key), (int, float)) and not math.isnan(h[key])
                 and is_heldout_log(h) == heldout]
        return float(found[-1]) if found else None

    out: dict[str, dict[str, float]] = {}
    for label, key in _SUMMARY_KEYS:
        values = [h[key] for h in log_history if isinstance(h.get(key), (int, float)) and not math.isnan(h[key])]
        finals = {"eval": last_value(f"eval_{key}", False), "held-out": last_value(f"eval_{key}", True)}
        if not values and all(v is None for v in finals.values()):
            continue
        row = {}
        if values:
            row["first"] = float(values[0])
            tail = values[-last_n:]
            row["last"] = float(sum(tail) / len(tail))
            row["last_count"] = len(tail)  # how many logged values "last" averages (fewer than last_n in short runs)
        row.update({name: value for name, value in finals.items() if value is not None})
        out[label] = row
    return out


def print_summary(console, summary: dict, trainer) -> None:
    from rich.table import Table

    table = Table(title=f"calibrl train: {trainer.args.advantage_estimator} ({trainer.state.global_step} steps)")
    table.add_column("metric")
    table.add_column("first", justify="right")
    table.add_column(_last_column_label(summary), justify="right")
    finals = [name for name in ("eval", "held-out") if any(name in row for row in summary.values())]
    for name in finals:  # TRL's evaluation; the held-out calibration callback's last evaluation
        table.add_column(name, justify="right")
    widest = max((row.get("last_count", 0) for row in summary.values()), default=0)
    fmt = lambda row, k: f"{row[k]:.4f}" if k in row else "-"  # noqa: E731
    for label, row in summary.items():
        last = fmt(row, "last")
        if "last_count" in row and row["last_count"] < widest:  # a metric some steps did not log (AUROC)
            last += f" ({row['last_count']})"
        table.add_row(label, fmt(row, "first"), last, *(fmt(row, name) for name in finals))
    if any(row.get("last_count", widest) < widest for row in summary.values()):
        table.caption = (f"(k): the metric was defined at only k of those {widest} steps; the cell is the mean of "
                         "those k")
    console.print(table)
    _print_no_signal_note(console, trainer.state.log_history)
    _print_no_decision_note(console, trainer.state.log_history, getattr(trainer.args, "decision_classes", None))
    console.print(f"output: {trainer.args.output_dir}")
    console.print(f"log history (one JSON line per logged step): {Path(trainer.args.output_dir) / LOG_HISTORY}")


def _last_column_label(summary: dict) -> str:
    """What the "last" column averages: the last logged value, or the mean of the last N logged ones."""
    n = max((row.get("last_count", 0) for row in summary.values()), default=0)
    return "last" if n <= 1 else f"last (mean of {n} logged steps)"


def _print_no_signal_note(console, log_history: list[dict]) -> None:
    """Says so when no step had a group whose completions scored differently and no advantage was other than zero
    (calibrl's telemetry ``calibration/advantage_abs_mean``, when logged): the policy gradient was zero and the run
    did not learn (e.g. a model that never gets a reward). An estimator that reads more than the rewards (a
    confidence, say) can give non-zero advantages to equal rewards: then nothing is said."""
    fractions = [h["frac_reward_zero_std"] for h in log_history if isinstance(h.get("frac_reward_zero_std"), (int, float))]
    moved = any(isinstance(h.get("calibration/advantage_abs_mean"), (int, float))
                and h["calibration/advantage_abs_mean"] > 0 for h in log_history)
    if fractions and all(f >= 1.0 for f in fractions) and not moved:
        rewards = {h["reward"] for h in log_history if isinstance(h.get("reward"), (int, float))}
        same = f" (every completion's reward was {rewards.pop():g})" if len(rewards) == 1 else ""
        console.print(f"note: in none of the {len(fractions)} logged step(s) did a group's completions score "
                      f"differently{same}: every advantage was zero, so the rewards taught the model nothing",
                      markup=False, highlight=False, soft_wrap=True)


def _print_no_decision_note(console, log_history: list[dict], classes: list[str] | None) -> None:
    """Says so when a decision run's completions never held a decision token: the decision metrics are then
    undefined at every step (absent from the table) and the decision term had no row to act on."""
    fractions = [h["decision/frac_with_decision"] for h in log_history
                 if isinstance(h.get("decision/frac_with_decision"), (int, float))]  # training steps' (eval_: TRL's)
    if fractions and all(f == 0 for f in fractions):
        named = f" ({', '.join(map(str, classes))})" if classes else ""
        console.print(f"note: in none of the {len(fractions)} logged step(s) did a completion hold a decision "
                      f"token{named}, so the decision ECE and probabilities are undefined and the decision term "
                      "had nothing to train", markup=False, highlight=False, soft_wrap=True)
