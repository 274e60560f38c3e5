r"""``calibrl generate``: sample N completions per problem, with each completion's confidence, into the JSONL
that ``calibrl eval`` reads.

For every problem of a registered dataset (:mod:`calibrl.tasks.datasets`, hub name or local file) it samples ``n``
completions and writes one row per completion::

    prompt_id, benchmark, sample_index, completion, answer (the extracted final answer: last \boxed{} content or the
    decision letter; null if none), gold, correct, reward, logprob_mean, verbalized_confidence, n_tokens, truncated,
    self_certainty, token_confidence
    + for decision tasks: decision_prob, class_probs, class_mass, label, classes

* ``logprob_mean``: mean over the completion's tokens (EOS included when the completion ended) of the token's
  log-probability under the SAMPLING distribution, i.e. ``log_softmax(logits / T)`` at temperature ``T``, with
  no top-k / top-p truncation (both are switched off, whatever the model's generation_config says). At
  ``T = 1`` (the papers' setting and the default) this is the model's own mean token log-prob, ``-log PPL``, the
  confidence CAPO ranks; at other temperatures it is the confidence of the distribution the samples came from.
  ``T = 0`` means greedy decoding, and the log-probs are then the model's (``T = 1``) ones.
* ``token_confidence`` (unless ``token_confidence_k=0``): DeepConf's token confidence of each generated token as
  the authors compute it, minus the mean of the log-probs vLLM returns for ``logprobs=k``: the ``k`` most probable
  tokens at step i (``k = token_confidence_k``, ``--token-confidence-k``, default 20, the DeepConf paper's) and the
  sampled token when it is not among them (:func:`calibrl.logprobs.chunked_token_confidence` and
  :func:`calibrl.logprobs.confidence_with_sampled` on each step's logits; vLLM: its own maps). Read from the
  model's own distribution (``token_confidence_at="raw"``, the authors' reading) or the sampling one
  (``"sampling"``); written rounded to 4 decimals (at most 5e-5 off; about 7 bytes a token). ``calibrl eval``
  reduces it to DeepConf's trace signals (:mod:`calibrl.selection.deepconf`).
* ``self_certainty`` (transformers backend; ``self_certainty=False`` / ``--no-self-certainty`` leaves it out):
  INTUITOR's self-certainty (arXiv 2505.19590, :mod:`calibrl.self_certainty`), the mean over the completion's
  tokens (the same tokens as ``logprob_mean``) of ``KL(U || p_T) = logsumexp(z/T) - mean(z/T) - log V`` >= 0, read
  off each step's logits a chunk of rows at a time (:func:`calibrl.self_certainty.chunked_token_self_certainty`).
  At the sampling temperature ``T`` (1 when greedy), as ``logprob_mean``, and as the
  authors' verl trainer reads it (it divides the logits by the rollout temperature before every quantity, so the
  reward INTUITOR trains on is this number up to ``log V``); their open-r1 trainer reads raw logits, the same at
  ``T = 1`` (verl-intuitor's rollout temperature and the default here). ``- log V`` is kept (their code drops it, a
  constant that cancels in a group normalisation): values then mean the same for any vocabulary. vLLM returns only
  top-k log-probs, which do not give ``mean_j z_j``: ``self_certainty=True`` is refused there, ``None`` (the
  default) records it wherever the backend can.
* ``deepconf_online`` (``--deepconf-online``): DeepConf's early-stopped sampling on the transformers backend
  (:mod:`calibrl.evaluation.deepconf_online`); ``n`` is then each problem's budget, and rows add
  ``deepconf_phase``, ``stop_reason``, ``deepconf_voted``, ``deepconf_lowest``, ``deepconf_threshold``,
  ``deepconf_traces`` and ``deepconf_consensus``.
* ``class_probs`` (decision tasks): at the decision token (the last class letter of the completion, the same
  rule as the ``"decision"`` reward and the trainer's decision term), the probability of each class, summed over
  the class's single-token spellings (``"A"`` and ``" A"``), renormalised over the classes (``class_mass`` is the
  mass before renormalising). Same temperature convention as above. ``decision_prob`` is the entry of the
  decided class. A completion without a class letter is wrong (``answer`` null, ``correct = false``); its
  ``class_probs`` are read where the model put the most probability on the class tokens (its would-be decision)
  and ``decision_prob`` is their largest entry.
* ``verbalized_confidence``: the confidence the completion states in RLCR's format (arXiv 2507.16806), the LAST
  ``<confidence>x</confidence>`` with x in [0, 1] (:func:`calibrl.tasks.verbalized.parse_verbalized_confidence`);
  null when it states none or a malformed one. ``confidence_prompt=True`` (``--confidence-prompt``) asks for it:
  the instruction :data:`calibrl.tasks.verbalized.CONFIDENCE_INSTRUCTION` is added to every prompt
  (:func:`calibrl.tasks.verbalized.with_confidence_instruction`).
* ``correct`` / ``reward``: the registered reward (``"math"``: math-verify on the last ``\boxed{}``;
  ``"decision"``: decision letter vs label); ``correct = reward > 0.5``. With ``reward="rlcr"`` (whose value,
  correctness plus a Brier term, does not tell correctness by a threshold) ``reward`` is RLCR's value and
  ``correct`` the task's grading reward's (``"decision"`` or ``"math"``).

Sampling (vLLM when importable and a GPU is present, else batched transformers ``generate``) and the reading of
log-probs and class probabilities off each completion are in :mod:`calibrl.evaluation.backends`.

Precision: ``dtype`` (``--dtype``) loads the model in ``float32``, ``bfloat16`` or ``float16``; ``auto`` (the
default) is bfloat16 on a GPU that supports it and float32 on the CPU. ``bfloat16`` on a CPU with AVX512-BF16
samples 1.5-1.8x faster than float32 (``bench/bf16.py``); the log-probs are then the bf16 model's, each taken as
``log_softmax`` in float32 of its logits, within :data:`calibrl.models.BF16_LOGPROB_TOLERANCE` of float32's on a
sequence's ``logprob_mean`` (docs/realmodel.md). Any other string is refused before anything loads.

Resumable: rows are appended and flushed (``fsync``) after every batch of problems, and a batch only ever holds
whole problems. On restart the file is read back, a torn last line and the rows of any problem with fewer than
``n`` rows are dropped, and only the missing problems are generated; a killed run loses at most the batch in
flight. The settings are kept next to the output (``<out>.meta.json``, written with the first rows, so a run that
fails before writing any row leaves nothing behind). Resuming is refused (``GenerateError``; the CLI exits 2)
when the settings differ (the message lists each one, old -> new) and when ``out`` is a non-empty file without
its ``.meta.json`` (another tool's or run's output, whose rows resuming would drop); ``overwrite=True``
(``--overwrite``) replaces the file instead, truncating it only once the first new rows are ready. ``limit`` may
differ on resume: raising it appends the further problems, lowering it adds none and keeps every row. Problem
ids do not depend on ``limit`` (:mod:`calibrl.tasks.datasets` makes repeated ids unique over the whole dataset
before limiting), so no problem is ever written twice under two ids. A resumed run draws fresh randomness for the
remaining problems.

``dataset`` is a registered name (with ``path`` for a local copy in the hub format) or the path of a local
JSON / JSONL / Parquet file whose task is told by its fields (:func:`calibrl.tasks.datasets.load_file`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import os
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from calibrl._files import write_then_rename
from calibrl.evaluation.backends import DECISION_TOP_LOGPROBS, GenerateError, decision_fields, open_backend
from calibrl.evaluation.deepconf_online import OnlineSettings, sample_online

logger = logging.getLogger(__name__)

__all__ = ["DECISION_TOP_LOGPROBS", "GenerateConfig", "GenerateError", "batches", "call_reward", "generate",
           "load_problems", "problem_rows", "resolve_max_new_tokens", "scan_existing", "seed_for"]

_META_KEYS = ("model", "dataset", "path", "split", "n", "temperature", "max_new_tokens", "template", "reward", "limit",
              "confidence_prompt", "dtype", "token_confidence_k", "token_confidence_at", "deepconf_online",
              "self_certainty", "unanswerable")
# settings added after the first release: a .meta.json without them was written with these values
# (token_confidence_at None: files written before it read C_i of the top k alone, at the sampling temperature, so a
# run recording token confidences does not resume them)
_META_DEFAULTS = {"confidence_prompt": False, "dtype": "auto", "token_confidence_k": 0, "token_confidence_at": None,
                  "deepconf_online": None, "self_certainty": False, "unanswerable": None}
TOKEN_CONFIDENCE_AT = ("raw", "sampling")


@dataclass
class GenerateConfig:
    """Settings of one ``calibrl generate`` run (see the module docstring)."""

    model: str
    dataset: str
    out: str | Path
    n: int = 16
    path: str | None = None
    split: str | None = None
    max_new_tokens: int | None = None  # None: the dataset's registered budget (resume: the run's), else 1024
    temperature: float = 1.0
    batch_size: int = 8  # problems per batch; each batch samples batch_size * n completions
    limit: int | None = None
    backend: str = "auto"  # auto | vllm | transformers
    seed: int = 0
    dtype: str = "auto"
    device: str | None = None
    template: str | None = None
    reward: str | None = None  # default: "decision" for datasets with classes, else "math"
    # the share of unanswerable items the dataset's loader makes (arithmetic, multiple_choice); None: the loader's
    unanswerable: float | None = None
    confidence_prompt: bool = False  # ask for a stated confidence, <confidence>x</confidence>, after the answer
    token_confidence_k: int = 20  # top-k of DeepConf's token_confidence per row (0: not recorded)
    # the distribution DeepConf's C_i is read from: "raw", the model's own (T = 1, as the authors read vLLM's raw
    # log-probs), or "sampling", the sampling distribution at ``temperature`` (the same at T = 1)
    token_confidence_at: str = "raw"
    # INTUITOR's self_certainty per row: None records it where the backend can (transformers), True insists
    # (refused on vLLM, which returns only top-k log-probs), False never
    self_certainty: bool | None = None
    # DeepConf's online early stopping (calibrl.evaluation.deepconf_online); None: every problem gets n full samples
    deepconf_online: OnlineSettings | None = None
    overwrite: bool = False
    progress: bool = True
    vllm_kwargs: dict = field(default_factory=dict)

    def meta(self) -> dict:
        d = asdict(self)
        if not self.token_confidence_k:
            d["token_confidence_at"] = None  # nothing recorded: the setting says nothing of the file
        return {k: d[k] for k in _META_KEYS}


# --------------------------------------------------------------------------------------------------- resume


def scan_existing(out: Path, n: int) -> tuple[set[str], int]:
    """Read an existing samples file; keep only problems with ``n`` rows and drop a torn last line.

    Rewrites the file (atomically) when something had to be dropped. Returns (complete prompt ids, rows kept).
    """
    if not out.exists():
        return set(), 0
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    rows: list[tuple[str, str]] = []
    torn = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the write in flight when the run was killed
                torn = True
                continue
            raise GenerateError(f"{out}:{number}: not valid JSON; the file is not a calibrl samples file in progress")
        if "prompt_id" not in row:
            raise GenerateError(f"{out}:{number}: no prompt_id; the file is not a calibrl samples file")
        rows.append((str(row["prompt_id"]), line if line.endswith("\n") else line + "\n"))
    counts: dict[str, int] = {}
    needed: dict[str, int] = {}  # DeepConf online: a problem that reached consensus has fewer than n rows
    for pid, line in rows:
        counts[pid] = counts.get(pid, 0) + 1
        if '"deepconf_traces"' in line:
            needed[pid] = int(json.loads(line)["deepconf_traces"])
    complete = {pid for pid, c in counts.items() if c >= needed.get(pid, n)}
    kept = [line for pid, line in rows if pid in complete]
    if torn or len(kept) != len(rows) or any(not line.endswith("\n") for line in lines[-1:]):
        write_then_rename(out, "".join(kept))
        dropped = len(rows) - len(kept)
        if dropped or torn:
            logger.warning("%s: dropped %d rows of unfinished problems%s", out, dropped, " and a torn last line" if torn else "")
    return complete, len(kept)


def _meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def _check_resume(config: GenerateConfig, out: Path) -> None:
    """Refuse to resume ``out`` unless this command wrote it with the same settings: a non-empty ``out`` without
    its ``<out>.meta.json`` is another tool's or run's file (resuming would drop its rows), and a ``meta.json``
    whose settings differ (``limit`` aside: raising it appends problems, lowering it adds none) would mix two
    experiments in one file. ``overwrite`` starts afresh instead."""
    if not out.exists() or out.stat().st_size == 0:
        return
    meta_file = _meta_path(out)
    if not meta_file.exists():
        raise GenerateError(
            f"{out} exists but has no {meta_file.name}, so calibrl generate did not write it; refusing to resume "
            "into it (its rows would be dropped): pass --overwrite (overwrite=True) to replace it or choose another "
            "--out")
    try:
        old = json.loads(meta_file.read_text())
    except (OSError, ValueError) as exc:
        raise GenerateError(f"{meta_file}: unreadable settings ({exc}); pass --overwrite to start afresh") from None
    if not isinstance(old, dict):
        raise GenerateError(f"{meta_file}: settings are not a JSON object; pass --overwrite to start afresh")
    meta = config.meta()
    diff = {k: (old.get(k, _META_DEFAULTS.get(k)), meta[k]) for k in _META_KEYS
            if k != "limit" and old.get(k, _META_DEFAULTS.get(k)) != meta[k]}
    if diff:
        described = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
        raise GenerateError(
            f"{out} was started with other settings ({described}); pass overwrite=True (--overwrite) to start "
            "afresh or choose another output file"
        )


def _write_meta(config: GenerateConfig, out: Path) -> None:
    """Record the run's settings next to ``out``; called just before the first rows are appended, so a run that
    fails before writing any row leaves no ``.meta.json`` behind."""
    write_then_rename(_meta_path(out), json.dumps(config.meta(), indent=2) + "\n")


# --------------------------------------------------------------------------------------------------- main loop


def batches(items: list, size: int) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def seed_for(seed: int, prompt_ids: Sequence[str]) -> int:
    return (seed * 1_000_003 + zlib.crc32(",".join(prompt_ids).encode())) % (2**31 - 1)


DEFAULT_MAX_NEW_TOKENS = 1024  # a reasoning benchmark's budget, for datasets that register none


def resolve_max_new_tokens(config: GenerateConfig) -> GenerateConfig:
    """``config`` with ``max_new_tokens`` filled when it is None: the budget of the run being resumed (its
    ``.meta.json``, so a resume never needs the flag repeated), else the dataset's registered one
    (:func:`calibrl.tasks.registry.dataset_max_new_tokens`: 64 for ``arithmetic`` / ``multiple_choice``), else
    :data:`DEFAULT_MAX_NEW_TOKENS`."""
    import dataclasses

    from calibrl.tasks.registry import dataset_max_new_tokens

    if config.max_new_tokens is not None:
        return config
    value = None
    meta_file = _meta_path(Path(config.out))
    if not config.overwrite and meta_file.is_file():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            value = json.loads(meta_file.read_text()).get("max_new_tokens")
    if not isinstance(value, int) or isinstance(value, bool):
        value = dataset_max_new_tokens(config.dataset) or DEFAULT_MAX_NEW_TOKENS
    return dataclasses.replace(config, max_new_tokens=value)


def _check_model(name: str) -> None:
    """A ``--model`` that is neither an existing local folder or file nor a valid hub id (``./nomodel``,
    ``~/models/x``) is a missing local path: say so instead of the hub client's "Repo id must use alphanumeric
    chars"."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.startswith("builtin:") or Path(name).expanduser().exists():
        return
    if name.lower().endswith(".gguf"):
        raise GenerateError(f"--model {name}: the file does not exist")
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise GenerateError(f"--model {name}: no such local folder (nor a hub id such as Qwen/Qwen2.5-0.5B)") from None


def _check_config(config: GenerateConfig) -> None:
    """Refuse settings that cannot run (or would silently run something else) before anything is loaded or
    written."""
    import math

    for name, low in (("n", 1), ("batch_size", 1), ("max_new_tokens", 1)):
        if getattr(config, name) < low:
            raise GenerateError(f"{name} must be >= {low} (got {getattr(config, name)})")
    if config.deepconf_online is not None:
        if config.backend == "vllm":
            raise GenerateError("--deepconf-online runs on the transformers backend only (vLLM cannot stop one "
                                "sequence on its own confidence without a patch; docs/eval.md)")
        if config.token_confidence_k < 1:
            raise GenerateError("--deepconf-online needs token confidences: token_confidence_k >= 1")
        try:
            config.deepconf_online.check(config.n)
        except ValueError as exc:
            raise GenerateError(str(exc)) from None
    if config.self_certainty and config.backend == "vllm":
        from calibrl.evaluation.backends import VLLM_NO_SELF_CERTAINTY

        raise GenerateError(VLLM_NO_SELF_CERTAINTY)
    if config.token_confidence_k < 0:
        raise GenerateError(f"token_confidence_k must be >= 0 (0: no token_confidence); got {config.token_confidence_k}")
    if config.token_confidence_at not in TOKEN_CONFIDENCE_AT:
        raise GenerateError(f"token_confidence_at must be one of {', '.join(TOKEN_CONFIDENCE_AT)}; got "
                            f"{config.token_confidence_at!r}")
    if config.limit is not None and config.limit < 1:
        raise GenerateError(f"limit must be >= 1 (got {config.limit}); leave it out for every problem")
    if not (math.isfinite(config.temperature) and config.temperature >= 0):
        raise GenerateError(f"temperature must be a finite number >= 0 (0 = greedy); got {config.temperature}")
    if config.backend not in ("auto", "vllm", "transformers"):
        raise GenerateError(f"unknown backend {config.backend!r} (auto, vllm or transformers)")
    from calibrl.models import check_dtype

    try:
        check_dtype(config.dtype)
    except ValueError as exc:
        raise GenerateError(str(exc)) from None
    out = Path(config.out)
    if out.is_dir():
        raise GenerateError(f"--out {out} is a folder; give the samples file to write, e.g. {out / 'samples.jsonl'}")
    _check_model(str(config.model))


_FILE_SUFFIXES = (".json", ".jsonl", ".parquet")


def _dataset_loader(config: GenerateConfig):
    """The loader ``--dataset`` names: a registered dataset, or a local file / folder (:func:`load_file`: its task
    told by its fields), called with the same keyword arguments."""
    from calibrl.tasks.datasets import load_file
    from calibrl.tasks.registry import available_datasets, get_dataset_loader

    name = config.dataset
    if name in available_datasets():
        return get_dataset_loader(name)
    candidate = Path(name)
    if candidate.suffix.lower() in _FILE_SUFFIXES or candidate.exists():
        if config.path is not None:
            raise GenerateError(f"--dataset {name} is a file; --path applies only to a registered dataset name")
        if not candidate.exists():
            raise GenerateError(f"--dataset {name}: the file does not exist")

        def from_file(*, path=None, **kwargs):
            """:func:`load_file` of ``--dataset``'s file (``path`` is None here: refused above otherwise)."""
            return load_file(candidate, **kwargs)

        return from_file
    raise GenerateError(
        f"unknown dataset {name!r}; registered: {', '.join(sorted(available_datasets()))}. For a local file pass "
        "--dataset FILE.jsonl (its task told by its fields) or --dataset NAME --path FILE (in NAME's hub format)")


def load_problems(config: GenerateConfig):
    """(the problems as dicts, each with a prompt_id; whether they are a decision task; the reward function; the
    function whose value > 0.5 makes a completion correct: the reward itself, or for ``rlcr`` the task's grading
    reward)."""
    from calibrl.tasks.registry import dataset_reward, get_reward
    from calibrl.tasks.verbalized import with_confidence_instruction

    loader_kwargs: dict[str, Any] = {"path": config.path, "limit": config.limit}
    if config.split is not None:
        loader_kwargs["split"] = config.split
    if config.template is not None:
        loader_kwargs["template"] = config.template
    loader = _dataset_loader(config)
    if config.unanswerable is not None:
        if "unanswerable" not in inspect.signature(loader).parameters:
            raise GenerateError(f"dataset {config.dataset!r} cannot make unanswerable items (--unanswerable); the "
                                "generated arithmetic and multiple_choice can, and a file can mark its own with a "
                                "field answerable: false")
        loader_kwargs["unanswerable"] = config.unanswerable
    dataset = loader(**loader_kwargs)
    columns = set(dataset.column_names)
    if "prompt" not in columns:
        raise GenerateError(f"dataset {config.dataset!r} has no 'prompt' column")
    decision_task = "classes" in columns
    grading_name = dataset_reward(config.dataset) or ("decision" if decision_task else "math")
    reward_name = config.reward or grading_name
    reward_fn = get_reward(reward_name)
    correctness_fn = get_reward(grading_name) if reward_name == "rlcr" else reward_fn
    if "prompt_id" not in columns:
        dataset = dataset.add_column("prompt_id", [f"{config.dataset}-{i}" for i in range(len(dataset))])
    problems = dataset.to_list()
    if config.confidence_prompt:
        for problem in problems:
            problem["prompt"] = with_confidence_instruction(problem["prompt"])
    return problems, decision_task, reward_fn, correctness_fn


def call_reward(fn, *, prompt: Any, completions: list[str], completion_ids: list[list[int]], columns: dict,
                trainer_state=None) -> list:
    """``fn``'s rewards for one prompt's ``completions``, called exactly as TRL 1.16's ``GRPOTrainer._calculate_
    rewards`` calls a reward function: every argument by keyword (``prompts=``, ``completions=``,
    ``completion_ids=``, each dataset column but ``prompt`` / ``completion`` / ``completion_ids`` repeated per
    completion, ``trainer_state``, ``log_extra`` and ``log_metric``), and conversational completions
    (``[{"role": "assistant", "content": text}]``) when the prompt is a list of messages. So a reward written for
    TRL (``def correctness(completions, solution, **kwargs)``, ``trl.rewards.accuracy_reward``) grades here too."""
    n = len(completions)
    conversational = isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)
    shaped = [[{"role": "assistant", "content": text}] for text in completions] if conversational else completions
    kwargs = {k: [v] * n for k, v in columns.items() if k not in ("prompt", "completion", "completion_ids")}
    return fn(prompts=[prompt] * n, completions=shaped, completion_ids=completion_ids, trainer_state=trainer_state,
              log_extra=lambda *_args, **_kw: None, log_metric=lambda *_args, **_kw: None, **kwargs)


def problem_rows(problem: dict, group: list, texts: list[str], reward_fn, *, dataset: str, variants,
                  correctness_fn=None, trainer_state=None) -> list[dict]:
    """The output rows (module docstring) of one problem's sampled completions ``group`` and their decoded
    ``texts``; ``variants``: the class token variants of a decision task, None otherwise; ``correctness_fn``: the
    reward whose value > 0.5 makes a row correct (default ``reward_fn``).

    Rewards and answers are read from the text without its ``<confidence>`` tags, so a stated "0.8" is never
    graded as the answer (a final-number grader would read it). With the ``rlcr`` reward a row's reward is
    :func:`calibrl.tasks.rewards.rlcr_reward` of ``correctness_fn``'s grade and the stated confidence, for
    whatever grader the dataset has (the registered ``rlcr`` reward itself grades math or decisions only)."""
    from calibrl.tasks.rewards import completion_text, last_boxed, rlcr_completion_reward, rlcr_reward
    from calibrl.tasks.verbalized import parse_verbalized_confidence, strip_confidence_tags

    graded = [strip_confidence_tags(completion_text(text)) for text in texts]
    stated = [parse_verbalized_confidence(completion_text(text)) for text in texts]

    def rewards_of(fn) -> list:
        return call_reward(fn, prompt=problem["prompt"], completions=graded, columns=problem,
                           completion_ids=[list(sample.ids) for sample in group], trainer_state=trainer_state)

    if reward_fn is rlcr_completion_reward and correctness_fn not in (None, reward_fn):
        grades = rewards_of(correctness_fn)
        rewards = [None if grade is None else rlcr_reward(correct=float(grade) > 0.5, confidence=confidence)
                   for grade, confidence in zip(grades, stated)]
    else:
        rewards = rewards_of(reward_fn)
        grades = rewards if correctness_fn in (None, reward_fn) else rewards_of(correctness_fn)
    rows = []
    for index, (sample, text, reward, grade, confidence, graded_text) in enumerate(
            zip(group, texts, rewards, grades, stated, graded)):
        reward = 0.0 if reward is None else float(reward)
        row = {
            "prompt_id": str(problem["prompt_id"]),
            "benchmark": problem.get("benchmark", dataset),
            "sample_index": index,
            "completion": text,
            "correct": grade is not None and float(grade) > 0.5,
            "reward": reward,
            "logprob_mean": (sum(sample.logps) / len(sample.logps)) if sample.logps else 0.0,
            "verbalized_confidence": confidence,
            "n_tokens": len(sample.ids),
            "truncated": not sample.ended,
        }
        if "answerable" in problem:  # an item with no right answer: the right response is to decline
            row["answerable"] = bool(problem["answerable"])
        if sample.self_certainty is not None:
            row["self_certainty"] = sample.self_certainty
        if sample.token_confidence is not None:
            row["token_confidence"] = [round(c, 4) for c in sample.token_confidence]
        if variants is not None:
            classes = list(problem["classes"])
            decision, probs, decision_prob, mass = decision_fields(sample, completion_text(text), classes, variants)
            row.update(answer=decision, gold=problem.get("label"), decision_prob=decision_prob, class_probs=probs,
                       class_mass=mass, label=problem.get("label"), classes=classes)
        else:
            extract = getattr(correctness_fn or reward_fn, "extract_answer", last_boxed)  # "number": final_answer
            row.update(answer=extract(graded_text), gold=problem.get("answer"))
        rows.append(row)
    return rows


def token_progress(bar, max_new_tokens: int, *, every: float = 0.5):
    """``on_token(step)`` for a batch's token steps: the bar shows ``batch token step/max`` between its sample
    counts, redrawn at most every ``every`` seconds. It only redraws (``bar.refresh()``): ``bar.update(0)`` would
    also restart tqdm's rate clock, so the next batch's samples would seem to take the time since the last token
    (an ETA of seconds with minutes left)."""
    last = [0.0]

    def on_token(step: int) -> None:
        bar.set_postfix_str(f"batch token {step}/{max_new_tokens}", refresh=False)
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            bar.refresh()

    return on_token


def _append_batches(out: Path, pending: list[dict], backend, reward_fn, config: GenerateConfig, *, variants,
                    total: int, done: int, correctness_fn=None) -> tuple[int, list[float], dict]:
    """Sample ``pending`` batch by batch, appending each batch's rows to ``out`` and syncing them to disk (so a
    killed run loses at most one batch); returns (rows written, each problem's share of right rows, DeepConf
    online's counts: traces, stopped early, voted). ``total`` / ``done``: samples of the
    whole run / already on disk, for the progress bar. ``out`` (and its ``.meta.json``) is only opened once the
    first batch's rows are ready, truncated then under ``overwrite``: a run that fails earlier changes nothing."""
    from tqdm.auto import tqdm

    generated = 0
    shares: list[float] = []  # each new problem's share of right completions
    online = {"traces": 0, "stopped": 0, "voted": 0}  # DeepConf online: what happened to the traces
    bar = tqdm(total=total, initial=done, unit="sample", dynamic_ncols=True, disable=not config.progress,
               desc=f"generate {config.dataset}")

    on_token = token_progress(bar, config.max_new_tokens)
    with contextlib.ExitStack() as stack:
        handle = None
        for batch in batches(pending, config.batch_size):
            pids = [str(p["prompt_id"]) for p in batch]

            def rows_of(problem, group):
                return problem_rows(problem, group, [backend.decode(s.ids) for s in group], reward_fn,
                                     dataset=config.dataset, variants=variants, correctness_fn=correctness_fn)

            if config.deepconf_online is not None:  # the bar moves by the traces each sampling call ends
                batch_rows = sample_online(backend, batch, n=config.n, seed=seed_for(config.seed, pids),
                                           settings=config.deepconf_online, rows_of=rows_of,
                                           **({"on_token": on_token} if config.progress else {}),
                                           on_traces=lambda m: bar.update(m) if config.progress else None)
                traced = sum(len(r) for r in batch_rows)
                online["traces"] += traced
                online["stopped"] += sum(row["stop_reason"] == "deepconf_confidence" for r in batch_rows for row in r)
                online["voted"] += sum(row["deepconf_voted"] for r in batch_rows for row in r)
            else:
                groups = backend.generate([p["prompt"] for p in batch], config.n, seed_for(config.seed, pids),
                                          **({"on_token": on_token} if config.progress else {}))
                batch_rows = [rows_of(problem, group) for problem, group in zip(batch, groups)]
            lines = []
            for rows_of_problem in batch_rows:
                if rows_of_problem:  # the problem's share right: calibrl eval's accuracy is their mean (mean@k)
                    shares.append(sum(row["correct"] for row in rows_of_problem) / len(rows_of_problem))
                for row in rows_of_problem:
                    lines.append(json.dumps(row, ensure_ascii=False) + "\n")
            if handle is None:
                _write_meta(config, out)
                handle = stack.enter_context(out.open("w" if config.overwrite else "a", encoding="utf-8"))
            handle.write("".join(lines))
            handle.flush()
            os.fsync(handle.fileno())
            generated += len(lines)
            if config.deepconf_online is None or not config.progress:
                bar.update(len(lines))
    bar.close()
    return generated, shares, online


def generate(config: GenerateConfig | None = None, *, hf_model=None, hf_tokenizer=None, **kwargs) -> dict:
    """Run ``calibrl generate``; returns a summary dict (problems, samples, accuracy, seconds, samples_per_s, out).

    ``hf_model`` / ``hf_tokenizer``: an already loaded transformers model and tokenizer (forces the transformers
    backend; ``config.model`` then only labels the run). Keyword arguments build a :class:`GenerateConfig` when
    ``config`` is None.
    """
    config = resolve_max_new_tokens(config or GenerateConfig(**kwargs))
    if hf_model is None:
        _check_config(config)
    else:  # the model is passed in: config.model only labels the run
        _check_config(dataclasses.replace(config, model="builtin:passed-in"))
    out = Path(config.out)
    problems, decision_task, reward_fn, correctness_fn = load_problems(config)
    if not config.overwrite:
        _check_resume(config, out)
    out.parent.mkdir(parents=True, exist_ok=True)

    complete, kept_rows = (set(), 0) if config.overwrite else scan_existing(out, config.n)
    pending = [p for p in problems if str(p["prompt_id"]) not in complete]

    backend = None
    started = time.perf_counter()
    generated = 0
    shares: list[float] = []
    online = None
    if pending and config.deepconf_online is not None and config.deepconf_online.window > config.max_new_tokens:
        logger.warning("DeepConf online: the window (%d tokens) is longer than max_new_tokens (%d): no trace can be "
                       "stopped early, and each trace votes by its mean confidence; --deepconf-window of about a "
                       "quarter of the budget lets the early stop act", config.deepconf_online.window,
                       config.max_new_tokens)
    if pending:
        classes0 = list(problems[0]["classes"]) if decision_task else None
        if decision_task and any(list(p["classes"]) != classes0 for p in pending):
            raise GenerateError("all problems of a decision dataset must share one class list (classes column)")
        backend, variants = open_backend(config, model=hf_model, tokenizer=hf_tokenizer, classes=classes0)
        started = time.perf_counter()  # throughput counts sampling and scoring, not model loading
        generated, shares, online = _append_batches(out, pending, backend, reward_fn, config, variants=variants,
                                                       total=len(problems) * config.n, done=kept_rows,
                                                       correctness_fn=correctness_fn)
    seconds = time.perf_counter() - started
    return {
        "out": str(out),
        "problems": len(problems),
        "problems_skipped": len(problems) - len(pending),
        "samples_written": generated,
        # the mean over this run's problems of each one's share of right completions: calibrl eval's accuracy
        # (mean@k), the same as the share of right rows when every problem has n rows
        "accuracy_new": sum(shares) / len(shares) if shares else float("nan"),
        "seconds": seconds,  # since the model was loaded
        "samples_per_s": generated / seconds if generated and seconds > 0 else float("nan"),
        "backend": backend.name if backend is not None else None,
        # DeepConf online: {"traces", "stopped" (early, by the window rule), "voted"} of this run's new rows
        "deepconf_online": online if config.deepconf_online is not None else None,
    }
