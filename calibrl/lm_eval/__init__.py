"""calibrl's calibration figures in lm-evaluation-harness's own results table, for multiple-choice tasks
(``pip install "calibrl[lm-eval]"``; tested with lm_eval 0.4.13; docs/lm-eval.md).

Any multiple-choice task becomes a calibrated one with one command, which writes a task file that includes the
original and changes only its class::

    python -m calibrl.lm_eval hellaswag arc_easy --out calibrated/
    lm_eval --model hf --model_args pretrained=... --include_path calibrated/ --tasks hellaswag_calibrl,arc_easy_calibrl

and from Python, :func:`calibrated` turns a task lm-eval built into one::

    tasks = lm_eval.tasks.TaskManager().load(["hellaswag"])["tasks"]
    lm_eval.simple_evaluate(model=..., tasks=[calibrated(t) for t in tasks.values()])

Each document's confidence is the probability of the option the model chooses (lm-eval's ``acc`` prediction, the
highest summed log-likelihood), normalised over the options: the softmax of the options' summed log-likelihoods,
as lm-eval's own ``brier_score`` reads them (no length normalisation;
:func:`calibrl.evaluation.readers.lm_eval.option_probabilities`). It is right when that option is the target (so
the task's ``acc`` is its accuracy). Beside the task's own metrics the results table then has ``ece``,
``smooth_ece``, ``auroc``, ``brier``, ``prr`` and ``aurc``, each computed by
:func:`calibrl.evaluation.scoring.confidence_figures` (the function of ``calibrl eval``'s table of confidence
sources, 10 bins): ``calibrl eval`` on the same run's ``--log_samples`` file gives the same numbers.

``brier`` is calibrl's: the squared error of that one confidence against right / wrong. lm-eval's ``brier_score``
(which a task may also list) is the multi-class Brier over every option's probability; the two differ.
lm-eval gives these figures no standard error (it bootstraps only its own list of aggregations): N/A in its table.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

try:
    from lm_eval.api.task import ConfigurableTask
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("calibrl.lm_eval needs lm-evaluation-harness: pip install \"calibrl[lm-eval]\"") from exc

from calibrl._files import write_then_rename
from calibrl.evaluation.readers.lm_eval import option_probabilities

__all__ = ["FIGURES", "SUFFIX", "CalibratedTask", "calibrated", "write_task_files"]

FIGURES = ("ece", "smooth_ece", "auroc", "brier", "prr", "aurc")  # each declared in calibrl.metrics.declared
SUFFIX = "_calibrl"  # the calibrated task's name: the original's plus this
_LIKELIHOOD = "likelihood"  # lm-eval's per-document (gold, option log-likelihoods) item


def _passthrough(items: Any) -> Any:
    return items


def _aggregation(name: str):
    def aggregate(items: list[tuple[float, bool]]) -> float:
        """calibrl's figure over the documents' (confidence, right) items."""
        from calibrl.evaluation.scoring import confidence_figures

        if not items:
            return float("nan")
        confidence, correct = zip(*items)
        value = confidence_figures(confidence, correct, only=(name,))[name]
        return float("nan") if value is None else float(value)

    aggregate.__name__ = aggregate.__qualname__ = f"calibrl_{name}"
    return aggregate


class CalibratedTask(ConfigurableTask):
    """A multiple-choice :class:`lm_eval.api.task.ConfigurableTask` that also reports calibrl's figures of the
    chosen option's confidence (module docstring). Built from the same config as the task it calibrates; a task
    file selects it with ``class: !function calibrl.lm_eval.CalibratedTask``."""

    def __init__(self, *args: Any, config: dict | None = None, **kwargs: Any) -> None:
        if config is not None:
            config = {k: v for k, v in dict(config).items() if k != "class"}
        super().__init__(*args, config=config, **kwargs)
        name = self.config.task
        if self.OUTPUT_TYPE != "multiple_choice":
            raise ValueError(f"calibrl.lm_eval: task {name!r} has output_type {self.OUTPUT_TYPE!r}; its calibration "
                             f"is read from the options' log-likelihoods, so it must be a multiple_choice task")
        if callable(self.config.process_results):
            raise ValueError(f"calibrl.lm_eval: task {name!r} scores its documents with its own process_results, "
                             f"so calibrl cannot tell which option it counts as chosen")
        self._keeps_likelihood = _LIKELIHOOD in self._metric_fn_list
        # lm-eval's process_results returns (gold, log-likelihoods) when "likelihood" is one of the task's metrics:
        # calibrl reads the target the task itself resolved (an index, a choice's text, several targets)
        self._metric_fn_list.setdefault(_LIKELIHOOD, _passthrough)
        from calibrl.metrics.registry import higher_is_better

        for figure in FIGURES:
            self._metric_fn_list[figure] = _passthrough
            self._metric_fn_kwargs[figure] = {}
            self._aggregation_list[figure] = _aggregation(figure)
            self._higher_is_better[figure] = higher_is_better(figure)  # the metric's own declaration

    def process_results(self, doc: dict, results: Iterable) -> dict:
        out = super().process_results(doc, results)
        gold, lls = out[_LIKELIHOOD] if self._keeps_likelihood else out.pop(_LIKELIHOOD)
        probs = option_probabilities([float(v) for v in lls])
        chosen = max(range(len(probs)), key=probs.__getitem__)  # the first of equal maxima, as numpy's argmax
        right = chosen in gold if isinstance(gold, list) else chosen == gold
        item = (probs[chosen], bool(right))
        out.update(dict.fromkeys(FIGURES, item))
        return out


def calibrated(task: ConfigurableTask) -> CalibratedTask:
    """The calibrated twin of a multiple-choice task lm-eval built (same config and name)."""
    if isinstance(task, CalibratedTask):
        return task
    if not isinstance(task, ConfigurableTask):
        raise TypeError(f"calibrl.lm_eval.calibrated: expected an lm-eval ConfigurableTask, got {type(task).__name__}")
    from dataclasses import fields

    config = {f.name: getattr(task.config, f.name) for f in fields(task.config)}
    return CalibratedTask(config=config)


def write_task_files(tasks: Iterable[str], out: str | Path, *, include_path: str | Path | None = None,
                     task_manager: Any = None) -> list[Path]:
    """For each task (a name lm-eval knows, with ``include_path`` for the user's own folder, or a task YAML file)
    write ``<out>/<name>_calibrl.yaml``: the original included, the class :class:`CalibratedTask`, the name
    suffixed. Names are looked up in ``task_manager`` (default: a ``TaskManager`` of lm-eval's tasks and
    ``include_path``). Returns the files written; an existing file of that name is left as it is when identical
    and refused otherwise."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    manager = task_manager
    out = Path(out)
    planned: list[tuple[Path, str]] = []
    for spec in tasks:
        path = Path(spec)
        if path.suffix in (".yaml", ".yml") and path.is_file():
            import yaml

            source = path.resolve()
            name = _task_name(source, yaml)
        else:
            if manager is None:
                manager = TaskManager(include_path=str(include_path) if include_path else None)
            entry = manager._index.get(spec)  # noqa: SLF001 - the index is the one place that knows a task's file
            if entry is None:
                raise SystemExit(f"calibrl.lm_eval: lm-eval knows no task {spec!r}"
                                 + ("" if include_path else " (a task of your own: pass --include-path)"))
            if entry.kind != Kind.TASK or entry.yaml_path is None:
                raise SystemExit(f"calibrl.lm_eval: {spec!r} is a {entry.kind.name.lower()}, not one task defined "
                                 f"in a YAML file; name its tasks one by one")
            source, name = Path(entry.yaml_path).resolve(), spec
        text = (f"# {name} with calibrl's calibration figures (python -m calibrl.lm_eval; docs/lm-eval.md)\n"
                f"include: {source}\n"
                f"task: {name}{SUFFIX}\n"
                f"class: !function calibrl.lm_eval.CalibratedTask\n")
        planned.append((out / f"{name}{SUFFIX}.yaml", text))
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for target, text in planned:
        if target.exists() and target.read_text() != text:
            raise SystemExit(f"calibrl.lm_eval: {target} exists with other content; remove it or choose another --out")
        if not target.exists():
            write_then_rename(target, text)
        written.append(target)
    return written


def _task_name(source: Path, yaml_module: Any) -> str:
    """The ``task:`` name of a task YAML file (its own, not an included file's)."""
    class _Loader(yaml_module.SafeLoader):
        pass

    _Loader.add_constructor("!function", lambda loader, node: None)
    data = yaml_module.load(source.read_text(), Loader=_Loader) or {}
    name = data.get("task")
    if not isinstance(name, str):
        raise SystemExit(f"calibrl.lm_eval: {source} has no 'task: <name>' of its own")
    return name


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m calibrl.lm_eval",
        description="Write, for each multiple-choice task, a task file <name>_calibrl.yaml that lm-eval runs with "
                    "calibrl's calibration figures (ece, smooth_ece, auroc, brier, prr, aurc) in its results.")
    parser.add_argument("tasks", nargs="+", help="task names lm-eval knows, or task YAML files")
    parser.add_argument("--out", required=True, help="folder for the task files (pass it to lm_eval --include_path)")
    parser.add_argument("--include-path", help="your own task folder, when a task named is defined there")
    args = parser.parse_args(argv)
    written = write_task_files(args.tasks, args.out, include_path=args.include_path)
    for path in written:
        print(path)
    print(f"run: lm_eval ... --include_path {args.out} --tasks {','.join(p.stem for p in written)}")
    return 0
