"""Load and validate sampled completions (JSONL or Parquet) for ``calibrl eval``.

One row per sampled completion. Fields (see docs/eval.md for the full table):

- ``prompt_id`` (str | int, required): completions of one prompt share it.
- ``correct`` (bool, or 0/1) or ``reward`` (number; ``correct = reward > 0.5``): one of them is required, except
  with ``class_probs`` + ``label``, where a missing ``correct`` is derived as ``argmax(class_probs) == label``.
- a confidence input, at least one of:
  ``logprob_mean`` (number <= 0, the completion's mean token log-probability; sequence confidence
  ``exp(logprob_mean)`` = 1/perplexity), ``decision_prob`` (number in [0, 1], probability of the decision token),
  ``class_probs`` (list of numbers in [0, 1] summing to 1 within 1e-3) with ``label`` (int class index, or a class
  string looked up in ``classes``), ``verbalized_confidence`` (number in [0, 1] or null: the confidence the
  completion states, RLCR's ``<confidence>x</confidence>``; when a row has no such field but a ``completion`` text,
  it is parsed from the text's last tag with :func:`calibrl.tasks.verbalized.parse_verbalized_confidence`).
- ``token_confidence`` (optional; list of numbers >= 0, float16 in Parquet; null entries skipped): DeepConf's
  token confidence C_i of each generated token. Each row's array is reduced to its four trace signals
  (:func:`calibrl.selection.deepconf.trace_signals`) as it is read and then dropped, so memory grows with the
  rows, not with their lengths; the signals are the confidence sources ``deepconf_mean``, ``deepconf_tail``,
  ``deepconf_bottom10`` and ``deepconf_min`` (:data:`DEEPCONF_SOURCES`: rankings, never the main confidence).
  ``deepconf_voted`` (bool, ``calibrl generate --deepconf-online``): the row counted in the online vote;
  ``deepconf_lowest`` (number >= 0 or null): the lowest window confidence that vote weighed it with.
- ``self_certainty`` (optional; number >= 0, null where absent): INTUITOR's self-certainty, the mean over the
  completion's tokens of KL(uniform || next-token distribution) (``calibrl generate``,
  :mod:`calibrl.self_certainty`). A confidence source that only ranks (:data:`RANKING_SOURCES`: AUROC, PRR, AURC;
  no ECE or Brier: it is no probability), never the main confidence.
- optional: ``answer`` (str, or a number stored as its string; null = no answer extracted), ``benchmark`` (str;
  on every row or on none: a row without one among rows that name one is refused), ``completion`` (str),
  ``n_tokens`` (int >= 0), ``truncated`` (bool: the completion hit the token limit), ``classes`` (list of
  str), ``sample_index`` (int: which sample of the prompt; a repeated (benchmark, prompt_id, sample_index) with
  the same completion, correctness, answer and confidences is dropped and counted, one that differs in any of
  them is refused naming both lines), ``abstained`` (bool: the model declined to answer; a row without it but with
  a ``completion`` is read from the text's final answer, :func:`calibrl.tasks.abstention.is_abstention`; an
  abstained sample is never counted right in the abstention figures), ``answerable`` (bool, default true: false
  marks an item with no right answer, where declining is the right response; ``calibrl generate --unanswerable``).

Which confidence to use is chosen per file (``confidence=`` or the first of logprob_mean, decision_prob,
class_probs, verbalized_confidence present in the first row); that field is then required on every row. Every
confidence field present on some rows is a *confidence source* (:meth:`Samples.confidence_sources`), compared
side by side by ``calibrl eval`` on the rows that have it. Other optional fields are
validated wherever they appear; a field present on only some rows is kept with NaN / None for the others.

Errors raise :class:`SamplesError` with ``"<file>:<line>: field '<name>': <problem>"``; for Parquet files the
number is the 1-based row. Other tools' files (TRL, verl, OpenAI-style APIs, vLLM, lm-eval) are converted to these
rows by :mod:`calibrl.evaluation.readers` first (``format=``, or detected from the first row's fields).
"""

from __future__ import annotations

import hashlib
import json
import math
import stat
import warnings
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from calibrl.evaluation.readers import FORMATS, Grading, SamplesError, Skips, detect_format, read_rows
from calibrl.selection.deepconf import DEFAULT_TAIL, DEFAULT_WINDOW, trace_signals
from calibrl.selection.voting import _NO_DIGEST, digest_ids, text_digest
from calibrl.tasks.abstention import is_abstention
from calibrl.tasks.verbalized import parse_verbalized_confidence

__all__ = ["CONFIDENCE_KINDS", "DEEPCONF_SOURCES", "FORMATS", "RANKING_SOURCES", "Samples", "SamplesError",
           "load_answers", "load_samples"]

# detection order: the first present is the main confidence; verbalized_confidence last, so files that have one of
# the others keep the meaning their reports had before it existed
CONFIDENCE_KINDS = ("logprob_mean", "decision_prob", "class_probs", "verbalized_confidence")
# DeepConf's trace signals of the token_confidence arrays, in calibrl.selection.deepconf.SIGNALS order: confidence
# sources that rank paths (AUROC, AURC) but are no probabilities (no ECE / Brier), so never the main confidence
DEEPCONF_SOURCES = ("deepconf_mean", "deepconf_tail", "deepconf_bottom10", "deepconf_min")
# per-row scores a file carries that rank paths but are no probabilities: confidence sources, never the main one
RANKING_SOURCES = ("self_certainty",)
_CLASS_PROBS_TOL = 1e-3
_LOGPROB_TOL = 1e-6  # float noise above 0 is clipped to 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _shown(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to its first ``limit`` characters (a bad value may be a whole completion)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _is_int(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer()


@dataclass
class Samples:
    """Validated samples of one file as numpy arrays, one entry per sampled completion.

    ``prompt_index`` is a dense 0..n_prompts-1 index of the prompts (pass it to :mod:`calibrl.metrics`): of
    ``prompt_ids``, or, when a ``benchmark`` field is present, of the pairs (benchmark, prompt_id), so prompt 0 of
    one benchmark and prompt 0 of another are different prompts everywhere (pass@k, maj@k, per-prompt AUROC,
    bootstrap, answer clustering, selection).
    Optional arrays are None when no row has the field. ``labels`` are class indices into ``classes``.
    Completion texts are not held: each was reduced to a digest as it was read (``completion_ids``, what PC and
    RPC need), so memory grows with the number of rows, not with the texts' length; ``completions`` reads the
    texts again from ``path``.
    """

    source: str
    prompt_ids: np.ndarray  # [N] str
    correct: np.ndarray  # [N] bool
    confidence_kind: str | None  # None: the file has no confidence input (lm-eval generation tasks)
    reward: np.ndarray | None = None  # [N] float (NaN where absent)
    logprob_mean: np.ndarray | None = None  # [N] float
    decision_prob: np.ndarray | None = None  # [N] float
    class_probs: np.ndarray | None = None  # [N, C] float
    verbalized_confidence: np.ndarray | None = None  # [N] float in [0, 1], NaN where the completion states none
    self_certainty: np.ndarray | None = None  # [N] float >= 0 (INTUITOR's self-certainty), NaN where absent
    labels: np.ndarray | None = None  # [N] int
    classes: list[str] | None = None
    answers: np.ndarray | None = None  # [N] object: str or None
    benchmarks: np.ndarray | None = None  # [N] str
    # [N] int64 id of the completion text: equal texts share one (from their digests), a row without one has its
    # own; what PC and RPC need. The texts themselves are not held (see `completions`).
    completion_ids: np.ndarray | None = None
    n_tokens: np.ndarray | None = None  # [N] float (NaN where absent)
    truncated: np.ndarray | None = None  # [N] bool: the completion hit the token limit (False where not said)
    # [N] bool: the sample declined to answer (field `abstained`, else "I don't know" read from its completion);
    # None when no row abstains and none says
    abstained: np.ndarray | None = None
    # [N] bool: the item can be answered (field `answerable`, true where absent); None when every item can
    answerable: np.ndarray | None = None
    # [N, 4] float: DeepConf's (mean, tail, bottom10, min) of each row's token_confidence (NaN rows where absent)
    deepconf_signals: np.ndarray | None = None
    # [N] float: 1 / 0 whether a row of a `calibrl generate --deepconf-online` file counted in its online vote
    # (deepconf_voted), NaN where the row does not say
    deepconf_voted: np.ndarray | None = None
    # [N] float: the lowest window confidence the online run weighed the row's vote with (deepconf_lowest), NaN
    # where the row does not say (a trace without tokens, or a file written before the field)
    deepconf_lowest: np.ndarray | None = None
    format: str = "calibrl"  # the format the file was read as (calibrl.evaluation.readers.FORMATS)
    notes: list[str] = field(default_factory=list)  # how a foreign format was read (which field gave correct, ...)
    # rows left out, by cause: failed requests / rewards (see readers.Skips) and repeated samples
    skipped: dict[str, int] = field(default_factory=dict)
    grading: Grading | None = field(default=None, repr=False)  # how the file was graded (read again by completions)
    path: Path | None = None  # the file (or folder) read, for `completions`
    rows: np.ndarray | None = None  # [N] int64: each row's position among the rows read from `path`
    prompt_index: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _, index = np.unique(self.prompt_ids, return_inverse=True)
        index = index.astype(np.int64).reshape(-1)
        if self.benchmarks is not None and len(index):
            _, bench = np.unique(self.benchmarks, return_inverse=True)
            key = bench.astype(np.int64).reshape(-1) * (int(index.max()) + 1) + index
            _, index = np.unique(key, return_inverse=True)
            index = index.astype(np.int64).reshape(-1)
        self.prompt_index = index

    def __len__(self) -> int:
        return int(self.correct.shape[0])

    @property
    def name(self) -> str:
        """The source file's stem: the label of this file in reports."""
        return Path(self.source).stem

    @property
    def n_prompts(self) -> int:
        return int(self.prompt_index.max()) + 1 if len(self) else 0

    def group_sizes(self) -> np.ndarray:
        """Number of completions per prompt, in ``prompt_index`` order."""
        return np.bincount(self.prompt_index, minlength=self.n_prompts)

    def confidence(self, kind: str | None = None) -> np.ndarray:
        """Confidence in [0, 1] per completion: exp(logprob_mean), decision_prob, the top class probability, or the
        verbalized confidence."""
        kind = kind or self.confidence_kind
        if kind is None:
            raise SamplesError(f"{self.source}: no confidence input (the file has none of "
                               f"{', '.join(CONFIDENCE_KINDS)}): accuracy and answer selection only")
        if kind == "logprob_mean":
            return np.exp(self._need("logprob_mean"))
        if kind == "decision_prob":
            return self._need("decision_prob").copy()
        if kind == "class_probs":
            return self._need("class_probs").max(axis=1)
        if kind == "verbalized_confidence":
            return self._need("verbalized_confidence").copy()
        raise ValueError(f"unknown confidence kind {kind!r}; choose one of {', '.join(CONFIDENCE_KINDS)}")

    def score(self, kind: str | None = None) -> np.ndarray:
        """The ranking score AUROC uses: logprob_mean itself (no exp underflow ties), else :meth:`confidence`."""
        kind = kind or self.confidence_kind
        return self._need("logprob_mean").copy() if kind == "logprob_mean" else self.confidence(kind)

    def confidence_target(self, kind: str | None = None) -> np.ndarray:
        """What the confidence predicts: ``correct``, or for class_probs whether the top class is the label."""
        kind = kind or self.confidence_kind
        if kind == "class_probs":
            return self._need("class_probs").argmax(axis=1) == self._need("labels")
        return self.correct

    def confidence_sources(self) -> list[str]:
        """The confidence kinds present on at least one row, in :data:`CONFIDENCE_KINDS`, :data:`RANKING_SOURCES`
        then :data:`DEEPCONF_SOURCES` order."""
        return [kind for kind in CONFIDENCE_KINDS + RANKING_SOURCES + DEEPCONF_SOURCES if self.source_mask(kind).any()]

    def deepconf_signal(self, kind: str) -> np.ndarray | None:
        """[N] DeepConf signal ``kind`` (one of :data:`DEEPCONF_SOURCES`; NaN where a row has no token_confidence),
        or None when no row has one."""
        if self.deepconf_signals is None:
            return None
        return self.deepconf_signals[:, DEEPCONF_SOURCES.index(kind)]

    def source_mask(self, kind: str) -> np.ndarray:
        """[N] bool: the rows that have confidence source ``kind``."""
        if kind in DEEPCONF_SOURCES:
            value = self.deepconf_signal(kind)
            return np.zeros(len(self), dtype=bool) if value is None else ~np.isnan(value)
        if kind not in CONFIDENCE_KINDS + RANKING_SOURCES:
            raise ValueError(f"unknown confidence kind {kind!r}; choose one of "
                             f"{', '.join(CONFIDENCE_KINDS + RANKING_SOURCES + DEEPCONF_SOURCES)}")
        value = getattr(self, kind)
        if value is None:
            return np.zeros(len(self), dtype=bool)
        return ~np.isnan(value).any(axis=1) if value.ndim == 2 else ~np.isnan(value)

    def _need(self, name: str) -> np.ndarray:
        value = getattr(self, name)
        if value is None or (value.dtype.kind == "f" and np.isnan(value).any()):
            raise SamplesError(f"{self.source}: field '{name}' is not present on every row")
        return value

    @property
    def completions(self) -> np.ndarray | None:
        """[N] object: each row's completion text (None where it has none); None when no row has one.

        Read again from :attr:`path` on each access: a Samples holds only the texts' ids (``completion_ids``), so
        its memory grows with the number of rows, not with the texts' length.
        """
        if self.completion_ids is None:
            return None
        if self.path is None or self.rows is None:
            raise SamplesError(f"{self.source}: the completion texts are not held and the file is not known")
        slot = np.full(int(self.rows.max(initial=-1)) + 1, -1, dtype=np.int64)  # [rows read] -> index here
        slot[self.rows] = np.arange(len(self))
        texts = np.full(len(self), None, dtype=object)
        for position, (_where, raw) in enumerate(read_rows(self.path, self.format, [], Skips(), self.grading)):
            if position >= len(slot):
                break
            if slot[position] >= 0:
                texts[slot[position]] = raw.get("completion")
        return texts

    def subset(self, mask: np.ndarray) -> "Samples":
        """The rows where ``mask`` is true (a new Samples with its own dense prompt index)."""
        mask = np.asarray(mask)
        kwargs = {}
        for name in ("prompt_ids", "correct", "reward", "logprob_mean", "decision_prob", "class_probs",
                     "verbalized_confidence", "self_certainty", "labels", "answers", "benchmarks", "completion_ids", "n_tokens",
                     "truncated", "abstained", "answerable", "rows", "deepconf_signals", "deepconf_voted", "deepconf_lowest"):
            value = getattr(self, name)
            kwargs[name] = None if value is None else value[mask]
        return replace(self, **kwargs)

    def by_benchmark(self) -> dict[str, "Samples"]:
        """Split by the ``benchmark`` field (sorted by name); empty when no row names a benchmark."""
        if self.benchmarks is None:
            return {}
        return {str(b): self.subset(self.benchmarks == b) for b in np.unique(self.benchmarks)}


class _Row:
    """Typed access to one row's fields with ``file:line: field 'x': problem`` errors."""

    def __init__(self, where: str, row: dict):
        self.where, self.row = where, row

    def fail(self, name: str, problem: str) -> SamplesError:
        return SamplesError(f"{self.where}: field '{name}': {problem}")

    def has(self, name: str) -> bool:
        return self.row.get(name) is not None

    def number(self, name: str, *, low: float = -math.inf, high: float = math.inf) -> float:
        value = self.row.get(name)
        if type(value) is float and low <= value <= high and value - value == 0.0:  # the common case, fast
            return value
        if value is None:
            raise self.fail(name, "missing")
        if not _is_number(value):
            raise self.fail(name, f"expected a number, got {type(value).__name__} {value!r}")
        try:
            value = float(value)
        except OverflowError:
            raise self.fail(name, "out of range: the number is too large") from None
        if not math.isfinite(value):
            raise self.fail(name, f"must be finite, got {value}")
        if not low <= value <= high:
            raise self.fail(name, f"out of range: {value} not in [{low}, {high}]")
        return value


_NO_CONFIDENCE = "none"  # the kind of a file whose format carries no confidence input
# formats that may carry no confidence input (lm-eval generation tasks; TRL / verl logs written without calibrl)
_CONFIDENCE_OPTIONAL = ("trl", "verl", "lm-eval")


def _detect_kind(where: str, row: dict, requested: str | None, *, optional: bool) -> str:
    """The confidence field: ``requested``, else the first of CONFIDENCE_KINDS in the first row."""
    if requested is not None:
        if requested not in CONFIDENCE_KINDS:
            why = (f" ({requested} only ranks: it is scored as a confidence source wherever rows carry it)"
                   if requested in RANKING_SOURCES + DEEPCONF_SOURCES else "")
            raise SamplesError(f"unknown confidence {requested!r}; choose one of {', '.join(CONFIDENCE_KINDS)}{why}")
        return requested
    for kind in CONFIDENCE_KINDS:
        if row.get(kind) is not None:
            return kind
    # a confidence stated only in the text is a source, not the main confidence unless asked for: the text of a
    # later row may state none, and files of other tools without a confidence field load as they did before
    if optional:
        return _NO_CONFIDENCE
    hint = ("; the completion states a confidence: pass --confidence verbalized_confidence to use it"
            if _stated_confidence(row) is not None else "")
    raise SamplesError(f"{where}: field 'logprob_mean': missing (need a confidence input: one of "
                       f"{', '.join(CONFIDENCE_KINDS)}){hint}")


def _stated_confidence(row: dict) -> float | None:
    """The completion text's verbalized confidence (None: no text, no tag, or a malformed one)."""
    text = row.get("completion")
    return parse_verbalized_confidence(text) if isinstance(text, str) else None


def _file_kind(path: Path) -> str:
    """What ``path`` is, in words, when it is neither a file nor a folder."""
    mode = path.stat().st_mode
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a file or folder")


def load_answers(spec: str) -> dict[str, dict]:
    """Gold answers by prompt id for ``--answers``: a dataset file (JSON / JSONL / Parquet rows with ``prompt_id``,
    ``custom_id``, ``id`` or ``unique_id`` and ``answer`` / ``gold``, or ``label`` with ``classes``), or the name of
    a registered calibrl dataset (its rows' ``prompt_id`` and gold)."""
    from calibrl.evaluation.readers import answers_table
    from calibrl.tasks.datasets import load_table
    from calibrl.tasks.registry import available_datasets, get_dataset_loader

    path = Path(spec)
    if path.exists():
        try:
            rows = load_table(path)
        except (OSError, ValueError) as exc:
            raise SamplesError(f"--answers {spec}: {exc}") from None
        return answers_table(rows, path.name)
    if spec in available_datasets():
        try:
            rows = list(get_dataset_loader(spec)())
        except Exception as exc:  # the loaders raise what their source raises (no network, a missing file)
            raise SamplesError(f"--answers {spec}: cannot load the dataset ({exc})") from None
        return answers_table(rows, spec)
    raise SamplesError(f"--answers {spec}: no such file, and not a dataset name (registered: "
                       f"{', '.join(available_datasets())})")


def load_samples(path: str | Path, *, confidence: str | None = None, format: str | None = None,
                 strict: bool = True, grader: str = "boxed", answers: dict[str, dict] | None = None,
                 answers_source: str | None = None, deepconf_window: int = DEFAULT_WINDOW,
                 deepconf_tail: int = DEFAULT_TAIL) -> Samples:
    """Read and validate a samples file: calibrl's ``.jsonl`` / ``.json`` (one object per line) or ``.parquet``,
    or another tool's output (``format``: one of FORMATS; None = detected from the first row's fields, see
    :mod:`calibrl.evaluation.readers`). TRL and verl logs may be given as their folder.

    ``confidence`` picks the main confidence field (``logprob_mean``, ``decision_prob``, ``class_probs`` or
    ``verbalized_confidence``); by default the first of these fields present in the first row. Raises
    :class:`SamplesError` naming the file, line and field. A confidence stated in a row's ``completion`` text (no
    ``verbalized_confidence`` field) is read as that row's ``verbalized_confidence``.
    How a foreign format was read (e.g. which column gave ``correct``) is in ``Samples.notes`` and a warning.

    ``strict=False`` leaves out the rows of failed requests or rewards (a null / NaN TRL reward, an API request
    that failed, an empty choice; see :class:`calibrl.evaluation.readers.Skips`) and counts them by cause in
    ``Samples.skipped`` and a note; ``strict=True`` (the default here; ``calibrl eval --strict``) refuses them.
    Malformed rows are refused either way, and a file whose every row failed is refused with the first failure.
    Repeated samples are dropped (the same completion and scores) or refused (any of them differs).

    Files without correctness (OpenAI-style, vLLM) are graded with ``grader`` (``"boxed"``: the last
    ``\\boxed{}``; ``"math-verify"``: math-verify's parse of the whole completion) against each line's gold, else
    ``answers`` (``{prompt id or custom_id: gold}``, :func:`calibrl.evaluation.readers.answers_table`; named
    ``answers_source`` in errors and notes).

    ``deepconf_window`` / ``deepconf_tail``: the tokens of DeepConf's sliding window and tail
    (:func:`calibrl.selection.deepconf.trace_signals`) each row's ``token_confidence`` is reduced with.
    """
    path = Path(path)
    if not path.exists():
        raise SamplesError(f"{path}: no such file")
    if not path.is_file() and not path.is_dir():  # opening a FIFO would wait for a writer
        raise SamplesError(f"{path}: not a regular file ({_file_kind(path)}); give a .jsonl or .parquet file")
    if format is not None and format not in FORMATS:
        raise SamplesError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    fmt = format or detect_format(path)
    if fmt == "calibrl" and not path.is_file():
        raise SamplesError(f"{path}: is a folder; a calibrl samples file is expected")
    notes: list[str] = []
    skips = Skips(strict=strict)
    grading = Grading(grader=grader, answers=answers, source=answers_source)
    try:
        samples = _validate(read_rows(path, fmt, notes, skips, grading), path.name, confidence=confidence,
                            optional=fmt in _CONFIDENCE_OPTIONAL, deepconf=(deepconf_window, deepconf_tail))
    except _NoRows:
        if skips.first is None:
            raise
        causes = ", ".join(f"{n} {cause}" for cause, n in skips.counts.items())
        raise SamplesError(f"{path.name}: every row failed ({causes}), so nothing is left to score; the first: "
                           f"{skips.first}") from None
    except _RepeatedSample as exc:  # name the two rows' lines and what differs between them
        found: dict[int, tuple[str, dict]] = {}
        for position, (where, raw) in enumerate(read_rows(path, fmt, [], Skips(), grading)):
            if position in (exc.first, exc.second):
                found[position] = (where, raw)
            if position >= exc.second:
                break
        (first_where, first), (where, second) = found[exc.first], found[exc.second]
        raise SamplesError(f"{where}: field 'sample_index': prompt_id {exc.prompt_id!r} sample_index "
                           f"{int(second['sample_index'])} repeats {first_where} with {_difference(first, second)} "
                           "(the samples of two runs mixed?)") from None
    samples.skipped = {**skips.counts, **samples.skipped}
    samples.grading = grading
    if samples.confidence_kind is None:
        ranking = [k for k in samples.confidence_sources() if k in RANKING_SOURCES + DEEPCONF_SOURCES]
        notes.append(f"{path.name}: no confidence input ({', '.join(CONFIDENCE_KINDS)}) in this {fmt} file: "
                     "accuracy and answer selection only" + (f", and the ranking sources {', '.join(ranking)}"
                                                             if ranking else ""))
    samples.format, samples.notes, samples.path = fmt, notes + samples.notes, path
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return samples


def _validate(rows: Iterable[tuple[str, Any]], source: str, *, confidence: str | None, optional: bool,
              deepconf: tuple[int, int] = (DEFAULT_WINDOW, DEFAULT_TAIL)) -> Samples:
    """Samples from calibrl rows ``(file:line, row)``; ``optional``: a file without confidence input is read;
    ``deepconf``: (window, tail) of the token_confidence signals."""
    prompt_ids: list[str] = []
    correct: list[bool] = []
    # floats in compact arrays (8 bytes a row, not a Python float each)
    cols: dict[str, array] = {k: array("d") for k in ("reward", "logprob_mean", "decision_prob",
                                                      "verbalized_confidence", "self_certainty", "n_tokens",
                                                      "truncated", "deepconf_voted", "deepconf_lowest")}
    n_parsed = 0  # rows whose verbalized confidence was read from the completion text
    abstained = bytearray()  # [N] 1 where the row declined to answer (its field, else its completion's final answer)
    abstained_named = False  # a row has the field `abstained`
    answerable = bytearray()  # [N] 0 where the row's item has no right answer (field `answerable`), else 1
    class_probs: list[list[float] | None] = []
    labels: list[int] = []
    texts: dict[str, list] = {"answer": [], "benchmark": []}
    # each completion is reduced to its digest as it is read: PC / RPC only ask which texts are identical
    digests = bytearray()  # [N x 16] text_digest of each row's completion (zeros where none)
    no_text = bytearray()  # [N] 1 where the row has no completion
    classes: list[str] | None = None
    kind: str | None = None
    n_classes: int | None = None
    # repeated samples are found after the loop from 32 bytes a row: the digest of (benchmark, prompt_id,
    # sample_index) and of the row's content (zeros for a row without sample_index)
    key_digests = bytearray()  # [N x 16]
    content_digests = bytearray()  # [N x 16]
    positions = array("q")  # [N] each row's position among the rows read
    benchmark_named: tuple[str, str] | None = None  # (file:line, benchmark) of the first row naming one
    no_benchmark: str | None = None  # file:line of the first row naming none
    signals = array("d")  # [N x 4] DeepConf signals of each row's token_confidence (NaN where none)

    # the columns' appends bound once (a row's loop below runs a million times at users' sizes)
    add_reward, add_n_tokens, add_truncated = cols["reward"].append, cols["n_tokens"].append, cols["truncated"].append
    add_logprob, add_decision, add_stated = (cols["logprob_mean"].append, cols["decision_prob"].append,
                                             cols["verbalized_confidence"].append)
    add_certainty, add_voted, add_lowest = (cols["self_certainty"].append, cols["deepconf_voted"].append,
                                            cols["deepconf_lowest"].append)
    nan = math.nan

    def main_logprob(r: _Row) -> float:
        return min(r.number("logprob_mean", high=_LOGPROB_TOL), 0.0)

    def main_decision(r: _Row) -> float:
        return r.number("decision_prob", low=0.0, high=1.0)

    def fill_plain(count: int) -> None:
        """The columns of ``count`` rows of the short path, each lacking every field but _PLAIN_FIELDS."""
        nonlocal key_digests, digests, content_digests, signals, no_text, abstained, answerable
        key_digests += _NO_DIGEST * count
        digests += _NO_DIGEST * count
        content_digests += _NO_DIGEST * count
        signals += _NO_SIGNALS_ROW * count
        nans = array("d", [nan]) * count
        for name in ("deepconf_voted", "deepconf_lowest", "reward", "n_tokens", "truncated", "self_certainty",
                     "verbalized_confidence"):
            cols[name] += nans
        class_probs.extend([None] * count)
        labels.extend([-1] * count)
        texts["benchmark"].extend([None] * count)
        no_text += b"\x01" * count
        abstained += b"\x00" * count
        answerable += b"\x01" * count

    plain = False  # rows of only _PLAIN_FIELDS take the short path (set with the main confidence)
    unfilled = 0  # rows of the short path whose other columns are not filled yet
    for position, (where, raw) in enumerate(rows):
        if not isinstance(raw, dict):
            raise SamplesError(f"{where}: expected a JSON object per line, got {type(raw).__name__}")
        r = _Row(where, raw)
        if kind is None:
            kind = _detect_kind(where, raw, confidence, optional=optional)
            plain = kind in _PLAIN_FIELDS  # the main confidence is one of the plain path's fields

        pid = raw.get("prompt_id")
        pid_text = pid if type(pid) is str else _prompt_id_text(r, pid)
        if plain and raw.keys() <= _PLAIN_FIELDS:
            # a row of only these fields (most files' rows): what the rest of the loop does with it, in the same
            # order of checks, without looking up the fields it lacks, whose columns take their "none" values for
            # a run of such rows at once (fill_plain, before the next other row or at the end). A million such
            # rows: 3.1-3.2 s against 5.3-6.2 s (with orjson's parse, 2026-11-30);
            # tests/test_samples_plain_rows.py checks that both paths give the same samples and the same errors
            prompt_ids.append(pid_text)
            positions.append(position)
            add_logprob(main_logprob(r) if kind == "logprob_mean" or raw.get("logprob_mean") is not None else nan)
            add_decision(main_decision(r) if kind == "decision_prob" or raw.get("decision_prob") is not None else nan)
            value = raw.get("correct")
            if value is None:
                raise r.fail("correct", _NO_OUTCOME)
            correct.append(_correct_flag(r, value))
            answer = raw.get("answer")
            if answer is not None and type(answer) is not str:
                answer = _text_field(r, "answer", answer)
            texts["answer"].append(answer)
            no_benchmark = no_benchmark or where
            unfilled += 1
            continue
        if unfilled:
            fill_plain(unfilled)
            unfilled = 0
        index = raw.get("sample_index")
        if index is not None:
            if not _is_int(index) or int(index) < 0:
                raise r.fail("sample_index", f"expected an integer >= 0, got {_shown(index)}")
            # unambiguous: repr has no raw NUL and the index is digits
            key_digests += hashlib.blake2b(f"{raw.get('benchmark')!r}\0{pid_text}\0{int(index)}".encode(
                "utf-8", "surrogatepass"), digest_size=16).digest()
        else:
            key_digests += _NO_DIGEST
        prompt_ids.append(pid_text)
        positions.append(position)
        signals += _deepconf_signals(r, *deepconf)
        voted = raw.get("deepconf_voted")
        if voted is not None and not isinstance(voted, (bool, np.bool_)):
            raise r.fail("deepconf_voted", f"expected a bool, got {_shown(voted)}")
        add_voted(nan if voted is None else float(voted))
        add_lowest(r.number("deepconf_lowest", low=0) if raw.get("deepconf_lowest") is not None else nan)

        add_reward(r.number("reward") if raw.get("reward") is not None else nan)
        n_tokens = raw.get("n_tokens")
        add_n_tokens(r.number("n_tokens", low=0) if n_tokens is not None else nan)
        cut = raw.get("truncated")
        if cut is not None and not isinstance(cut, (bool, np.bool_)) and not (_is_int(cut) and int(cut) in (0, 1)):
            raise r.fail("truncated", f"expected a bool, got {type(cut).__name__} {_shown(cut)}")
        add_truncated(nan if cut is None else float(cut))
        if n_tokens is not None and type(n_tokens) is not int and not _is_int(n_tokens):
            raise r.fail("n_tokens", f"expected an integer, got {n_tokens!r}")
        add_logprob(main_logprob(r) if kind == "logprob_mean" or raw.get("logprob_mean") is not None else nan)
        add_decision(main_decision(r) if kind == "decision_prob" or raw.get("decision_prob") is not None else nan)
        add_certainty(_self_certainty(r) if raw.get("self_certainty") is not None else nan)
        if "verbalized_confidence" in raw:  # null: the completion stated none
            stated = (r.number("verbalized_confidence", low=0.0, high=1.0)
                      if raw["verbalized_confidence"] is not None else None)
        else:
            stated = _stated_confidence(raw)
            n_parsed += stated is not None
        if stated is None and kind == "verbalized_confidence":
            raise r.fail("verbalized_confidence", "missing (no value, and no <confidence>x</confidence> with x in "
                         "[0, 1] at the end of the completion); it is the main confidence, needed on every row: "
                         "choose another --confidence to compare it on the rows that have it")
        add_stated(nan if stated is None else stated)

        # class_probs + label (+ classes)
        row_classes = raw.get("classes")
        if row_classes is not None:
            if not isinstance(row_classes, (list, tuple)) or not all(isinstance(c, str) for c in row_classes):
                raise r.fail("classes", f"expected a list of strings, got {row_classes!r}")
            if classes is None:
                classes = list(row_classes)
        probs = raw.get("class_probs")
        if probs is None and kind == "class_probs":
            raise r.fail("class_probs", "missing")
        if probs is not None:
            if not isinstance(probs, (list, tuple, np.ndarray)) or not all(_is_number(p) for p in probs):
                raise r.fail("class_probs", f"expected a list of numbers, got {type(probs).__name__} {probs!r}")
            try:
                probs = [float(p) for p in probs]
            except OverflowError:
                raise r.fail("class_probs", "out of range: a number is too large") from None
            if len(probs) < 2:
                raise r.fail("class_probs", f"needs at least 2 classes, got {len(probs)}")
            if not all(math.isfinite(p) for p in probs):
                raise r.fail("class_probs", f"must be finite, got {probs}")
            if not all(0.0 <= p <= 1.0 for p in probs):
                raise r.fail("class_probs", f"out of range: values must lie in [0, 1], got {probs}")
            if abs(sum(probs) - 1.0) > _CLASS_PROBS_TOL:
                raise r.fail("class_probs", f"out of range: must sum to 1 (within {_CLASS_PROBS_TOL}), sums to {sum(probs):.6g} "
                             "(renormalise the class tokens' probabilities over the classes)")
            if n_classes is None:
                n_classes = len(probs)
            elif len(probs) != n_classes:
                raise r.fail("class_probs", f"has {len(probs)} classes, earlier rows have {n_classes}")
            named = row_classes if row_classes is not None else classes
            if named is not None and len(named) != len(probs):
                raise r.fail("classes", f"has {len(named)} classes but 'class_probs' has {len(probs)} (one "
                             "probability per class is needed)")
        class_probs.append(probs)
        label = raw.get("label")
        if label is None:
            if kind == "class_probs":
                raise r.fail("label", "missing (class_probs needs the true class)")
            labels.append(-1)
        else:
            choices = row_classes if row_classes is not None else classes
            if isinstance(label, str):
                if choices is None:
                    raise r.fail("label", f"is the string {label!r} but no 'classes' list says which index it is")
                if label not in choices:
                    raise r.fail("label", f"out of range: {label!r} is not one of classes {list(choices)}")
                labels.append(list(choices).index(label))
            elif _is_int(label):
                size = n_classes if probs is not None else (len(choices) if choices is not None else None)
                if int(label) < 0 or (size is not None and int(label) >= size):
                    raise r.fail("label", f"out of range: {int(label)} not in [0, {size})")
                labels.append(int(label))
            else:
                raise r.fail("label", f"expected an int index or a class string, got {type(label).__name__} {label!r}")

        if raw.get("correct") is not None:
            correct.append(_correct_flag(r, raw["correct"]))
        elif r.has("reward"):
            correct.append(cols["reward"][-1] > 0.5)
        elif kind == "class_probs":
            correct.append(int(np.argmax(probs)) == labels[-1])
        else:
            raise r.fail("correct", _NO_OUTCOME)

        answer, bench, value = raw.get("answer"), raw.get("benchmark"), raw.get("completion")
        if answer is not None and type(answer) is not str:
            answer = _text_field(r, "answer", answer)
        if bench is not None and type(bench) is not str:
            bench = _text_field(r, "benchmark", bench)
        if value is not None and type(value) is not str:
            value = _text_field(r, "completion", value)
        texts["answer"].append(answer)
        texts["benchmark"].append(bench)
        digests += _NO_DIGEST if value is None else text_digest(value)
        no_text.append(value is None)
        said = raw.get("abstained")
        if said is not None:
            if not isinstance(said, (bool, np.bool_)) and not (_is_int(said) and int(said) in (0, 1)):
                raise r.fail("abstained", f"expected a bool, got {type(said).__name__} {_shown(said)}")
            abstained_named = True
            abstained.append(bool(said))
        else:
            abstained.append(value is not None and is_abstention(value))
        can = raw.get("answerable")
        if can is not None and not isinstance(can, (bool, np.bool_)) and not (
                _is_int(can) and int(can) in (0, 1)):
            raise r.fail("answerable", f"expected a bool, got {type(can).__name__} {_shown(can)}")
        answerable.append(can is None or bool(can))
        if bench is None:
            no_benchmark = no_benchmark or where
        elif benchmark_named is None:
            benchmark_named = (where, bench)
        if index is None:
            content_digests += _NO_DIGEST
        elif no_text[-1]:  # a row without a completion is compared whole
            content_digests += _row_digest(raw)
        else:  # the completion and every value read from the row that a figure uses
            scored = (correct[-1], labels[-1], texts["answer"][-1], class_probs[-1], abstained[-1], answerable[-1],
                      *(cols[k][-1] for k in ("reward", "logprob_mean", "decision_prob", "verbalized_confidence",
                                              "self_certainty")),
                      *signals[-len(DEEPCONF_SOURCES):])
            content_digests += hashlib.blake2b(digests[-16:] + repr(scored).encode("utf-8", "surrogatepass"),
                                               digest_size=16).digest()

    if unfilled:
        fill_plain(unfilled)
    if kind is None:
        raise _NoRows(f"{source}: no samples (the file is empty)")
    if benchmark_named is not None and no_benchmark is not None:  # else a scope of its own, unnoticed
        raise SamplesError(f"{no_benchmark}: field 'benchmark': missing, while other rows name one "
                           f"({benchmark_named[0]}: {_shown(benchmark_named[1])}); give every row its benchmark, or no row one to score the file as "
                           "one scope")

    def opt_float(values: array) -> np.ndarray | None:
        arr = np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)
        return None if np.isnan(arr).all() else arr

    has_probs = [p is not None for p in class_probs]
    probs_arr = None
    if any(has_probs):
        probs_arr = np.full((len(class_probs), n_classes), np.nan)
        probs_arr[np.asarray(has_probs)] = np.asarray([p for p in class_probs if p is not None], dtype=np.float64)
    labels_arr = np.asarray(labels, dtype=np.int64)
    any_label = bool((labels_arr >= 0).any())

    def opt_text(values: list, *, fill: Any = None) -> np.ndarray | None:
        if all(v is None for v in values):
            return None
        arr = np.empty(len(values), dtype=object)
        arr[:] = [fill if v is None else v for v in values]
        return arr

    benchmarks = opt_text(texts["benchmark"])
    keep = _unrepeated(key_digests, content_digests, positions, prompt_ids)
    samples = Samples(
        source=source,
        prompt_ids=np.asarray(prompt_ids, dtype=str),
        correct=np.asarray(correct, dtype=bool),
        confidence_kind=None if kind == _NO_CONFIDENCE else kind,
        reward=opt_float(cols["reward"]),
        logprob_mean=opt_float(cols["logprob_mean"]),
        decision_prob=opt_float(cols["decision_prob"]),
        verbalized_confidence=opt_float(cols["verbalized_confidence"]),
        self_certainty=opt_float(cols["self_certainty"]),
        class_probs=probs_arr,
        labels=labels_arr if any_label else None,
        classes=classes,
        answers=opt_text(texts["answer"]),
        benchmarks=None if benchmarks is None else benchmarks.astype(str),
        completion_ids=None if 0 not in no_text else digest_ids(digests, np.frombuffer(no_text, dtype=np.uint8) == 1),
        rows=np.frombuffer(positions, dtype=np.int64).copy() if len(positions) else np.zeros(0, dtype=np.int64),
        n_tokens=opt_float(cols["n_tokens"]),
        truncated=None if opt_float(cols["truncated"]) is None else opt_float(cols["truncated"]) == 1.0,
        # with unanswerable items, no abstention is a figure too (declining none of them)
        abstained=np.frombuffer(abstained, dtype=np.uint8) == 1 if abstained_named or 1 in abstained or 0 in answerable
        else None,
        answerable=np.frombuffer(answerable, dtype=np.uint8) == 1 if 0 in answerable else None,
        deepconf_voted=opt_float(cols["deepconf_voted"]),
        deepconf_lowest=opt_float(cols["deepconf_lowest"]),
        deepconf_signals=None if np.isnan(np.frombuffer(signals, dtype=np.float64)).all()
        else np.frombuffer(signals, dtype=np.float64).reshape(-1, len(DEEPCONF_SOURCES)),
        notes=[f"{source}: verbalized_confidence read from the completion's <confidence> tag on {n_parsed} rows"]
        if n_parsed else [],
    )
    if keep is None:
        return samples
    n_repeated = int((~keep).sum())
    samples = samples.subset(keep)
    samples.notes.append(f"{source}: {n_repeated} repeated rows dropped (the same prompt_id, sample_index, "
                         "completion, correctness and confidence as an earlier row)")
    samples.skipped = {"repeated sample": n_repeated}
    return samples


# the fields of a row that the reading loop's short path handles (with the main confidence one of the two numbers):
# every other field is absent from such a row, so its checks cannot fail and its columns take their "none" value
_PLAIN_FIELDS = frozenset({"prompt_id", "correct", "answer", "logprob_mean", "decision_prob"})
_NO_OUTCOME = "missing (give 'correct' (bool) or 'reward' (number))"


def _prompt_id_text(r: _Row, pid: Any) -> str:
    """A row's ``prompt_id`` as text (an integer as its digits), or the error naming it."""
    if pid is None:
        raise r.fail("prompt_id", "missing")
    if isinstance(pid, str):
        return pid
    if _is_int(pid):
        return str(int(pid))
    raise r.fail("prompt_id", f"expected str or int, got {type(pid).__name__} {pid!r}")


def _correct_flag(r: _Row, value: Any) -> bool:
    """A row's ``correct`` (a bool, or 0 / 1)."""
    if isinstance(value, (bool, np.bool_)) or (_is_int(value) and int(value) in (0, 1)):
        return bool(value)
    raise r.fail("correct", f"expected a bool, got {type(value).__name__} {value!r}")


def _text_field(r: _Row, name: str, value: Any) -> str:
    """A row's text field ``name`` that is not a plain ``str``: a str subclass as it is, a number given as the
    ``answer`` as its text; anything else refused."""
    if isinstance(value, str):
        return value
    if name == "answer" and _is_number(value):
        return str(value)
    raise r.fail(name, f"expected a string, got {type(value).__name__} {_shown(value)}")


def _row_digest(raw: dict) -> bytes:
    """16-byte digest of a whole row (a row without a completion, compared whole for repeats): its JSON, and a
    ``token_confidence`` array by its float64 bytes (its JSON text would cost more than reading the row)."""
    confs = raw.get("token_confidence")
    if confs is None:
        return text_digest(json.dumps(raw, sort_keys=True, default=str))
    rest = json.dumps({k: v for k, v in raw.items() if k != "token_confidence"}, sort_keys=True, default=str)
    try:
        values = np.asarray(confs, dtype=np.float64).tobytes()
    except (TypeError, ValueError):  # nulls or bad entries: validated (and refused) later
        values = json.dumps(confs, default=str).encode()
    return hashlib.blake2b(rest.encode("utf-8", "surrogatepass") + b"\0" + values, digest_size=16).digest()


def _self_certainty(r: _Row) -> float:
    """The row's ``self_certainty``: a finite number >= 0 (a mean of KL divergences from the uniform distribution;
    the authors' values without ``- log V`` are >= 0 too)."""
    value = r.number("self_certainty")
    if value < 0:
        raise r.fail("self_certainty", f"out of range: {value} < 0 (self-certainty is a mean of KL divergences "
                                       "KL(uniform || p), never negative)")
    return value


# the signals of a row without token_confidence, as an array("d"): appended to the column by a copy of its bytes,
# 6x faster than extending it by a tuple
_NO_SIGNALS_ROW = array("d", [math.nan] * len(DEEPCONF_SOURCES))


def _deepconf_signals(r: _Row, window: int, tail: int) -> array:
    """DeepConf's four signals of the row's ``token_confidence`` (NaN when it has none); the array itself is not
    kept. Entries must be finite numbers >= 0 (C_i is minus a mean of log-probabilities); nulls are skipped."""
    values = r.row.get("token_confidence")
    if values is None:
        return _NO_SIGNALS_ROW
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise r.fail("token_confidence", f"expected a list of numbers, got {type(values).__name__} {_shown(values)}")
    try:
        confs = np.asarray(values)  # one C-level pass for a list of JSON numbers (or an Arrow list's floats)
    except ValueError:  # ragged nesting
        raise r.fail("token_confidence", "expected a flat list of numbers (one per token)") from None
    if confs.dtype.kind not in "fiu" and confs.ndim == 1:  # nulls or non-numbers among the entries: the slow path
        bad = next((j for j, v in enumerate(values) if v is not None and not _is_number(v)), None)
        if bad is not None:
            raise r.fail("token_confidence", f"entry {bad}: expected a number, got {_shown(values[bad])}")
        confs = np.array([math.nan if v is None else v for v in values], dtype=np.float64)
    elif confs.dtype.kind not in "fiu" or confs.ndim != 1:
        raise r.fail("token_confidence", f"expected a flat list of numbers (one per token), got {_shown(values)}")
    elif confs.dtype.kind in "fiu" and isinstance(values, list):  # a JSON true / false among numbers reads as 1 / 0
        for j in np.flatnonzero((confs == 1.0) | (confs == 0.0)):  # only those two can be one: a cheap look
            if isinstance(values[j], bool):
                raise r.fail("token_confidence", f"entry {int(j)}: expected a number, got {_shown(values[j])}")
    confs = confs.astype(np.float64, copy=False)
    bad = np.flatnonzero(np.isinf(confs) | (confs < 0))
    if bad.size:
        raise r.fail("token_confidence", f"entry {int(bad[0])}: {confs[bad[0]]} is not a finite number >= 0 (C_i is "
                                         "minus the mean of a position's top-k log-probabilities)")
    return array("d", trace_signals(confs, window=window, tail=tail))


class _NoRows(SamplesError):
    """A file that gave no row (``load_samples`` says so, or that every row failed)."""


class _RepeatedSample(SamplesError):
    """A (prompt_id, sample_index) read twice with different contents: the rows' positions among the rows read
    (``load_samples`` names their lines)."""

    def __init__(self, second: int, first: int, prompt_id: str):
        super().__init__(f"row {second + 1}: field 'sample_index': prompt_id {prompt_id!r} repeats row {first + 1} "
                         "with different content")
        self.second, self.first, self.prompt_id = second, first, prompt_id


# the fields of a repeated row compared by value, in the order an error names them
_COMPARED = ("completion", "correct", "reward", "answer", "label", "class_probs", "logprob_mean", "decision_prob",
             "verbalized_confidence", "self_certainty")


def _difference(first: dict, second: dict) -> str:
    """What differs between two rows with one (prompt_id, sample_index): "a different completion", "a different
    correct (True, then False)", ...; for rows compared whole, the names of the fields that differ."""
    names = [n for n in _COMPARED if first.get(n) != second.get(n)]
    if not names:
        names = sorted(n for n in set(first) | set(second) if first.get(n) != second.get(n))
        return f"different fields {', '.join(names)}" if names else "different content"
    return "a different " + " and ".join(
        n if n == "completion" else f"{n} ({_shown(first.get(n), 40)}, then {_shown(second.get(n), 40)})"
        for n in names)


def _unrepeated(keys: bytearray, contents: bytearray, positions: array, prompt_ids: list[str]
                ) -> np.ndarray | None:
    """[N] bool: the rows to keep, False on a repeat of an earlier row's (benchmark, prompt_id, sample_index) with
    the same content digest; None when there is no repeat. Raises :class:`_RepeatedSample` on the first repeat (in
    row order) whose content differs from the first occurrence's.

    ``keys``: N x 16 digest bytes (zeros: the row has no sample_index); ``contents``: N x 16 digest bytes of what
    is compared (the completion with the row's correctness, reward, answer, label and confidences; the whole row
    for a row without a completion)."""
    if not keys:
        return None
    key = np.frombuffer(bytes(keys), dtype="V16")  # [N]
    has = key != np.frombuffer(_NO_DIGEST, dtype="V16")[0]
    rows = np.flatnonzero(has)  # [M]
    if len(rows) < 2:
        return None
    _, first, inverse = np.unique(key[rows], return_index=True, return_inverse=True)  # first occurrences
    first_of = rows[first][inverse.reshape(-1)]  # [M] the first row with each row's key
    repeat = first_of != rows
    if not repeat.any():
        return None
    content = np.frombuffer(bytes(contents), dtype="V16")  # [N]
    differ = repeat & (content[rows] != content[first_of])
    if differ.any():
        j = int(np.flatnonzero(differ)[0])
        raise _RepeatedSample(int(positions[rows[j]]), int(positions[first_of[j]]), prompt_ids[rows[j]])
    keep = np.ones(len(key), dtype=bool)
    keep[rows[repeat]] = False
    return keep

