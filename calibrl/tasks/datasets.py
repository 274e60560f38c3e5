r"""Real benchmarks as calibrl datasets: math reasoning (DeepScaleR, MATH500, AIME24/25, AMC23, Minerva math,
OlympiadBench) and multiple-choice decisions (CommonsenseQA, OpenBookQA).

Each loader is registered with :func:`calibrl.tasks.registry.register_dataset` and has the signature
``loader(split=<default>, *, path=None, limit=None, template=<default>, hub_id=None, **load_kwargs)``:

* without ``path`` it calls ``datasets.load_dataset(<hub id>, ...)`` (needs the network or a warm HF cache);
* with ``path`` it reads a local JSON / JSONL / Parquet file (or a directory of them) holding the SAME columns as
  the hub dataset (e.g. a file saved with ``ds.to_json(...)`` on a machine that has the network), so air-gapped
  clusters work;
* ``limit`` keeps the first ``limit`` usable rows (after dropping rows without a gold answer).

Every loader returns a ``datasets.Dataset`` with calibrl's columns:

* ``prompt``: the problem in the papers' template (below);
* math: ``answer`` (gold answer string; read by the ``"math"`` reward);
* decisions: ``classes`` (option letters, e.g. ``["A", ..., "E"]``) and ``label`` (the gold letter), read by the
  ``"decision"`` reward and by ``calibrl generate``'s class probabilities;
* ``benchmark`` (short name, e.g. ``"aime24"``) and ``prompt_id`` (string, unique within the benchmark: the
  dataset's own id where it has one, else ``"<benchmark>-<row index>"``).

Math templates (``template=``):

* ``"qwen-math"`` (default): ``"{problem}\nPlease reason step by step, and put your final answer within
  \boxed{}."``, the instruction of Qwen2.5-Math's chain-of-thought evaluation, as plain text (for base models such
  as Qwen2.5-Math-1.5B, the CAPO setting);
* ``"qwen-math-chat"``: the same instruction as the system message of Qwen's chat markup
  (``<|im_start|>system ... <|im_start|>assistant\n``), the exact Qwen2.5-Math "qwen25-math-cot" prompt;
* ``"chat"``: a conversational prompt ``[{"role": "user", "content": "{problem}\nPlease reason ..."}]`` that TRL
  and ``calibrl generate`` render with the tokenizer's own chat template;
* ``"chat-confidence"``: ``"chat"`` asking also for a stated confidence after the answer,
  ``<confidence>0.8</confidence>`` (:func:`calibrl.tasks.verbalized.with_confidence_instruction`; DCPO, RLCR);
* ``"none"``: the bare problem.

Decision templates:

* ``"direct"`` (default): the question, the lettered options, the instruction to answer with the letter, and
  ``"Answer: "`` last, so the NEXT token is the decision letter (the trailing space keeps the letter a token of
  its own: ``"A"``, not ``" A"``, for BPE and char tokenizers alike);
* ``"reasoning"``: the same, asking the model to think step by step first and to end with ``"Answer: <letter>"``;
  the decision token is then the last class letter of the completion (arXiv 2601.13284's setting);
* ``"chat"``: the ``"reasoning"`` text as a conversational user message.

Hub ids and columns (checked against the dataset cards; ``hub_id=`` overrides the id, e.g. for a mirror):

=============  =========================================  =======  ============================================
name           hub id                                     split    columns used
=============  =========================================  =======  ============================================
deepscaler     agentica-org/DeepScaleR-Preview-Dataset    train    problem, answer (, solution); 40.3k rows, a
                                                                   few with an empty answer (dropped)
math500        HuggingFaceH4/MATH-500                     test     problem, answer, unique_id (, solution,
                                                                   subject, level)
aime24         HuggingFaceH4/aime_2024                    train    id, problem, answer (, solution, url, year);
                                                                   30 rows
aime25         math-ai/aime25                             test     id, problem, answer; 30 rows
amc23          math-ai/amc23                              test     id, question, answer (, url); 40 rows
minerva        math-ai/minervamath                        test     question, answer; 272 rows
olympiadbench  math-ai/olympiadbench                      test     id, question, final_answer (list of
                                                                   strings, ``$``-wrapped) (, solution, ...)
commonsenseqa  tau/commonsense_qa                         train,   id, question, choices {label: [A..E],
                                                          valid.,  text: [...]}, answerKey (empty on the
                                                          test     unlabelled test split: rows dropped)
openbookqa     allenai/openbookqa (config "main")         train,   id, question_stem, choices {text, label:
                                                          valid.,  [A..D]}, answerKey
                                                          test
=============  =========================================  =======  ============================================

Loaders accept the common variants of these columns (``problem`` or ``question``; ``answer``, ``final_answer``
or ``gt``; ``answerKey`` or ``label``), so files from other mirrors of the same benchmark load too.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Callable

from calibrl.tasks.registry import register_dataset

logger = logging.getLogger(__name__)

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
MATH_TEMPLATES = ("qwen-math", "qwen-math-chat", "chat", "chat-confidence", "none")
DECISION_TEMPLATES = ("direct", "reasoning", "chat")

__all__ = [
    "MATH_INSTRUCTION",
    "math_prompt",
    "decision_prompt",
    "load_table",
    "load_file",
    "HUB",
    "to_verl_rows",
    "to_verl_parquet",
]

# name -> (hub id, hub config, default split)
HUB: dict[str, tuple[str, str | None, str]] = {
    "deepscaler": ("agentica-org/DeepScaleR-Preview-Dataset", None, "train"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
    "aime24": ("HuggingFaceH4/aime_2024", None, "train"),
    "aime25": ("math-ai/aime25", None, "test"),
    "amc23": ("math-ai/amc23", None, "test"),
    "minerva": ("math-ai/minervamath", None, "test"),
    "olympiadbench": ("math-ai/olympiadbench", None, "test"),
    "commonsenseqa": ("tau/commonsense_qa", None, "validation"),
    "openbookqa": ("allenai/openbookqa", "main", "test"),
}


# --------------------------------------------------------------------------------------------------- templates


def math_prompt(problem: str, template: str = "qwen-math"):
    """The prompt for one math problem in ``template`` (see the module docstring)."""
    problem = problem.strip()
    if template == "qwen-math":
        return f"{problem}\n{MATH_INSTRUCTION}"
    if template == "qwen-math-chat":
        return (
            f"<|im_start|>system\n{MATH_INSTRUCTION}<|im_end|>\n"
            f"<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n"
        )
    if template == "chat":
        return [{"role": "user", "content": f"{problem}\n{MATH_INSTRUCTION}"}]
    if template == "chat-confidence":
        from calibrl.tasks.verbalized import with_confidence_instruction

        return with_confidence_instruction(math_prompt(problem, "chat"))
    if template == "none":
        return problem
    raise ValueError(f"unknown math template {template!r}; choose one of {', '.join(MATH_TEMPLATES)}")


def decision_prompt(question: str, options: list[str], classes: list[str], template: str = "direct", *,
                    decline: bool = False):
    """The multiple-choice prompt: question, lettered options, instruction; see the module docstring. ``decline``:
    the instruction also offers "I don't know" when no option is right (a dataset with unanswerable items)."""
    lines = [f"Question: {question.strip()}", "Options:"]
    lines += [f"{c}. {o.strip()}" for c, o in zip(classes, options)]
    letters = ", ".join(classes[:-1]) + f" or {classes[-1]}" if len(classes) > 1 else classes[0]
    if template == "direct":
        offer = ", or \"I don't know\" if no option is right" if decline else ""
        lines.append(f"Reply with the letter of the correct option ({letters}){offer}.")
        return "\n".join(lines) + "\nAnswer: "
    offer = ", or \"Answer: I don't know\" if no option is right" if decline else ""
    text = "\n".join(
        lines
        + [
            "Think step by step, then give the letter of the correct option "
            f"({letters}) on the last line as \"Answer: <letter>\"{offer}."
        ]
    )
    if template == "reasoning":
        return text + "\n"
    if template == "chat":
        return [{"role": "user", "content": text}]
    raise ValueError(f"unknown decision template {template!r}; choose one of {', '.join(DECISION_TEMPLATES)}")


# --------------------------------------------------------------------------------------------------- loading


def _read_rows(file: Path) -> list[dict]:
    import json

    suffix = file.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(file).to_pylist()
    text = file.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if suffix == ".json" and stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # JSON lines saved with a .json suffix (datasets' to_json default)
        if isinstance(data, list):
            return data
        if isinstance(data, dict):
            for key in ("data", "rows", "examples"):
                if isinstance(data.get(key), list):
                    return data[key]
            return [data]
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{file}:{number}: not valid JSON ({exc.msg})") from None
    return rows


def load_table(path: str | Path) -> list[dict]:
    """The rows of a local JSON / JSONL / Parquet file, or of every such file in a directory (sorted by name).

    JSON may be a list of records, ``{"data": [...]}``, or JSON lines (what ``Dataset.to_json`` writes).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    files = [p for p in files if p.suffix.lower() in {".json", ".jsonl", ".parquet"}]
    if not files:
        raise ValueError(f"{path}: expected .json, .jsonl or .parquet files")
    rows: list[dict] = []
    for file in files:
        rows.extend(_read_rows(file))
    return rows


def _load_raw(name: str, split: str | None, path, hub_id: str | None, load_kwargs: dict):
    if path is not None:
        return load_table(path)
    import datasets

    default_id, config, default_split = HUB[name]
    hub_id = hub_id or default_id
    split = split or default_split
    args = (hub_id, config) if (config and hub_id == default_id) else (hub_id,)
    try:
        return datasets.load_dataset(*args, split=split, **load_kwargs)
    except Exception as exc:  # no network, unknown split, gated dataset...
        raise RuntimeError(
            f"could not load {name} from the Hugging Face hub ({hub_id}, split {split!r}): {exc}\n"
            f"Download it where the network is available (datasets.load_dataset({hub_id!r}, split={split!r})"
            f".to_json('{name}.jsonl')) and pass path='{name}.jsonl' (CLI: --path)."
        ) from exc


def _first(row: dict, names: tuple[str, ...]) -> Any:
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
    return None


def _gold_text(value: Any) -> str | None:
    """Gold answers as text: lists (OlympiadBench final_answer) joined, ``$`` wrappers removed, numbers kept
    exact (``5.0`` -> ``"5"``)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        parts = [p for p in (_gold_text(v) for v in value) if p]
        return ", ".join(parts) if parts else None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    text = re.sub(r"(?<!\\)\$", "", text).strip()  # "$2$, $-2$" -> "2, -2"; an escaped \$ stays
    return text or None


def _unique_ids(rows: list[dict]) -> None:
    """Make ``prompt_id`` unique in place: when any id repeats (hub ids are unique; a hand-made file may repeat
    them), every row's id becomes ``<id>#<position among the usable rows>``. Decided over ALL usable rows, never a
    ``limit``'s prefix, so a problem keeps its id whatever the limit and a resumed ``calibrl generate`` never writes
    one problem twice under two ids."""
    ids = [r["prompt_id"] for r in rows]
    if len(set(ids)) != len(ids):
        for i, r in enumerate(rows):
            r["prompt_id"] = f"{r['prompt_id']}#{i}"


def _finish(rows: list[dict], name: str, n_total: int, dropped: int, limit: int | None):
    """The dataset of the usable ``rows``: ids made unique over all of them, then the first ``limit`` kept."""
    import datasets

    if dropped:
        logger.warning("%s: dropped %d of %d rows without a gold answer", name, dropped, n_total)
    _unique_ids(rows)
    if limit is not None:
        rows = rows[: int(limit)]
    if not rows:
        raise ValueError(f"{name}: no usable rows (every row lacks a problem or a gold answer)")
    return datasets.Dataset.from_list(rows)


def _loader(name: str, kind: str, templates: tuple[str, ...], columns: str, make_row: Callable) -> Callable:
    """A registered-style loader for benchmark ``name``: ``make_row(raw_row, index, template)`` returns calibrl's
    row, or None for a row without a problem or a gold answer (dropped, counted in a warning)."""
    default_split = HUB[name][2]

    def loader(split: str | None = default_split, *, path=None, limit: int | None = None,
               template: str = templates[0], hub_id: str | None = None, **load_kwargs):
        if template not in templates:
            raise ValueError(f"unknown {kind} template {template!r}; choose one of {', '.join(templates)}")
        raw = _load_raw(name, split, path, hub_id, load_kwargs)
        rows = [r for r in (make_row(row, i, template) for i, row in enumerate(raw)) if r is not None]
        return _finish(rows, name, len(raw), len(raw) - len(rows), limit)

    loader.__name__ = f"load_{name}"
    loader.__doc__ = (
        f"{name}: {HUB[name][0]} (default split {default_split!r}) or a local file in its format; columns "
        f"{columns}. See calibrl.tasks.datasets."
    )
    return loader


def _math_row(name: str, id_columns: tuple[str, ...] = ("unique_id", "id")) -> Callable:
    def make_row(row: dict, index: int, template: str) -> dict | None:
        problem = _first(row, ("problem", "question", "Problem", "Question"))
        gold = _gold_text(_first(row, ("answer", "final_answer", "gt", "Answer")))
        if not problem or gold is None:
            return None
        pid = _first(row, id_columns)
        return {
            "prompt": math_prompt(str(problem), template),
            "answer": gold,
            "benchmark": name,
            "prompt_id": str(pid) if pid is not None else f"{name}-{index}",
        }

    return make_row


def _answerable(row: dict) -> bool:
    """A file row's ``answerable`` field (default true): false marks an item with no right answer, where the right
    response is to decline (:func:`calibrl.tasks.rewards.declining_grade`); it needs no gold."""
    value = row.get("answerable", True)
    if not isinstance(value, bool):
        raise ValueError(f"field 'answerable': expected true or false, got {value!r}")
    return value


def _choices(row: dict) -> tuple[list[str], list[str]]:
    choices = row.get("choices")
    if isinstance(choices, dict):
        return [str(x) for x in choices.get("label", [])], [str(x) for x in choices.get("text", [])]
    if isinstance(choices, list):  # list of {"label", "text"} records or of plain option texts
        if choices and isinstance(choices[0], dict):
            return [str(c["label"]) for c in choices], [str(c["text"]) for c in choices]
        return [chr(ord("A") + i) for i in range(len(choices))], [str(c) for c in choices]
    where = f"row {row['id']!r}: " if row.get("id") is not None else ""
    raise ValueError(f"{where}'choices' is {type(choices).__name__}, not a list of options or a {{label, text}} "
                     "record")


def _decision_row(name: str, question_columns: tuple[str, ...]) -> Callable:
    def make_row(row: dict, index: int, template: str) -> dict | None:
        question = _first(row, question_columns)
        labels, texts = _choices(row)
        raw_key = _first(row, ("answerKey", "label"))
        if isinstance(raw_key, int) and not isinstance(raw_key, bool):  # label given as an option index
            key = labels[raw_key] if 0 <= raw_key < len(labels) else ""
        else:
            key = str(raw_key).strip() if raw_key is not None else ""
        if not question or (key not in labels and _answerable(row)):
            return None
        pid = row.get("id")
        return {
            "prompt": decision_prompt(str(question), texts, labels, template),
            "classes": labels,
            "label": key if key in labels else None,
            "benchmark": name,
            "prompt_id": str(pid) if pid is not None else f"{name}-{index}",
        }

    return make_row


def _register_all() -> None:
    for name in ("deepscaler", "math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench"):
        register_dataset(name)(_loader(name, "math", MATH_TEMPLATES, "prompt, answer, benchmark, prompt_id",
                                       _math_row(name)))
    for name, question_columns in (("commonsenseqa", ("question",)), ("openbookqa", ("question_stem", "question"))):
        register_dataset(name)(_loader(name, "decision", DECISION_TEMPLATES, "prompt, classes, label, benchmark, prompt_id",
                                       _decision_row(name, question_columns)))


_FILE_PROBLEM = ("problem", "question", "Problem", "Question")
_FILE_GOLD = ("answer", "final_answer", "gt", "Answer", "solution")


def _file_math_row(name: str, *, verbatim: bool) -> Callable:
    """``make_row`` for a math file: problem from problem/question (or, when ``verbatim``, the ready-made
    ``prompt``), gold from answer/final_answer/gt, else the last ``\\boxed{}`` of ``solution``."""
    from calibrl.tasks.rewards import last_boxed

    def make_row(row: dict, index: int, template: str) -> dict | None:
        problem = _first(row, ("prompt",) if verbatim else _FILE_PROBLEM)
        gold = _gold_text(_first(row, _FILE_GOLD[:-1]))
        if gold is None and isinstance(row.get("solution"), str):
            gold = _gold_text(last_boxed(row["solution"]))
        if not problem or (gold is None and _answerable(row)):
            return None
        pid = _first(row, ("unique_id", "id", "prompt_id"))
        return {"prompt": math_prompt(str(problem), template), "answer": gold,
                "benchmark": str(row.get("benchmark") or name),
                "prompt_id": str(pid) if pid is not None else f"{name}-{index}"}

    return make_row


def load_file(path: str | Path, *, limit: int | None = None, template: str | None = None, **_ignored):
    """A benchmark given as a local JSON / JSONL / Parquet file (or folder of them) rather than by name, its kind
    told by its fields: ``choices`` with ``label`` / ``answerKey`` is a multiple-choice decision task (as
    CommonsenseQA's rows); ``problem`` / ``question`` (or a ready-made ``prompt``) with ``answer`` /
    ``final_answer`` / ``gt`` / ``solution`` (its last ``\\boxed{}``) is math. The benchmark is the row's
    ``benchmark`` field or the file's stem; ids as the named loaders' (``unique_id`` / ``id`` / ``prompt_id``, else
    ``<stem>-<row>``). The template defaults as for named datasets, except that a ``prompt`` column is used as
    written (``"none"``) unless ``template`` says otherwise. Split and hub options do not apply and are ignored.
    A field ``answerable`` (true / false) marks items that cannot be answered: such a row needs no gold, keeps the
    column ``answerable`` false, and is graded right when the completion declines ("I don't know")."""
    rows_in = load_table(path)
    name = Path(path).stem or "dataset"
    for number, row in enumerate(rows_in, 1):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {number} is a {type(row).__name__}, not a record of fields")
    fields = set().union(*(r.keys() for r in rows_in if isinstance(r, dict)))
    if "choices" in fields and fields & {"answerKey", "label"}:
        template = template or DECISION_TEMPLATES[0]
        if template not in DECISION_TEMPLATES:
            raise ValueError(f"unknown decision template {template!r}; choose one of {', '.join(DECISION_TEMPLATES)}")
        make_row = _decision_row(name, ("question", "question_stem", "prompt"))
    elif (fields & set(_FILE_PROBLEM) or "prompt" in fields) and fields & set(_FILE_GOLD):
        verbatim = not fields & set(_FILE_PROBLEM)
        template = template or ("none" if verbatim else MATH_TEMPLATES[0])
        if template not in MATH_TEMPLATES:
            raise ValueError(f"unknown math template {template!r}; choose one of {', '.join(MATH_TEMPLATES)}")
        make_row = _file_math_row(name, verbatim=verbatim)
    else:
        raise ValueError(
            f"{path}: cannot tell the task from the fields ({', '.join(sorted(fields)) or 'none'}): expected "
            "problem/question/prompt with answer/solution (math) or choices with label/answerKey (decisions)")
    rows = []
    for index, row in enumerate(rows_in):
        try:
            made = make_row(row, index, template)
            if made is not None and "answerable" in fields:  # on every row: a dataset's columns are its first row's
                made["answerable"] = _answerable(row)
                if not made["answerable"]:
                    made["label" if "label" in made else "answer"] = None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a malformed field: say where it is
            raise ValueError(f"{path}: row {index + 1}: {exc}") from None
        if made is not None:
            rows.append(made)
    return _finish(rows, name, len(rows_in), len(rows_in) - len(rows), limit)


if __name__ != "__main__":  # run as a script, the registry imports (and registers) the package module itself
    _register_all()


# --------------------------------------------------------------------------------------------------- verl export


def to_verl_rows(dataset) -> list[dict]:
    """Rows in verl's RL-dataset format for a calibrl dataset (math or decision), to be saved as Parquet.

    Each row: ``data_source`` (the benchmark), ``prompt`` (chat messages; a text prompt becomes one user
    message, which verl renders with the tokenizer's chat template), ``ability`` (``"math"`` or ``"decision"``),
    ``reward_model`` ``{"style": "rule", "ground_truth": answer or label}`` and ``extra_info`` ``{"task",
    "prompt_id", "index"[, "classes"][, "answerable": false]}``, the keys
    :func:`calibrl.tasks.rewards.verl_compute_score` reads (an item with no right answer: an empty ground truth).
    """
    from calibrl.tasks.rewards import marks_unanswerable

    rows = []
    for index, row in enumerate(dataset):
        decision = "classes" in row and row.get("classes") is not None
        prompt = row["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        extra = {"task": "decision" if decision else "math", "prompt_id": str(row.get("prompt_id", index)),
                 "index": index}
        if decision:
            extra["classes"] = list(row["classes"])
        answerable = not marks_unanswerable(row.get("answerable"))
        if not answerable:  # no gold: the right response is to decline (calibrl.tasks.rewards.declining_grade)
            extra["answerable"] = False
        gold = (row["label"] if decision else row["answer"]) if answerable else ""
        rows.append({
            "data_source": row.get("benchmark", "calibrl"),
            "prompt": messages,
            "ability": "decision" if decision else "math",
            "reward_model": {"style": "rule", "ground_truth": str(gold)},
            "extra_info": extra,
        })
    return rows


def to_verl_parquet(dataset, path: str | Path) -> Path:
    """Write :func:`to_verl_rows` of ``dataset`` to a Parquet file (``data.train_files`` / ``data.val_files``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(to_verl_rows(dataset)), path)
    return path


def _main(argv: list[str] | None = None) -> None:
    """``python -m calibrl.tasks.datasets NAME OUT.parquet [--split S] [--path FILE] [--limit N] [--template T]``:
    export a registered dataset in verl's format. A dataset that cannot be loaded (offline, a missing file) is one
    ``error:`` line and exit status 2."""
    import argparse

    from calibrl.tasks.registry import get_dataset_loader

    parser = argparse.ArgumentParser(
        prog="python -m calibrl.tasks.datasets",
        description="Export a registered dataset (deepscaler, math500, aime24, ..., or a local file with --path) "
                    "as a parquet file in verl's format.")
    parser.add_argument("name")
    parser.add_argument("out")
    parser.add_argument("--split")
    parser.add_argument("--path")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--template")
    args = parser.parse_args(argv)
    kwargs = {k: v for k, v in (("split", args.split), ("path", args.path), ("limit", args.limit),
                                ("template", args.template)) if v is not None}
    try:
        dataset = get_dataset_loader(args.name)(**kwargs)
        out = to_verl_parquet(dataset, args.out)
    except (RuntimeError, ValueError, KeyError, OSError) as exc:  # the loaders' messages say what to do
        parser.exit(2, f"error: {exc.args[0] if isinstance(exc, KeyError) and exc.args else exc}\n")
    print(f"wrote {len(dataset)} rows to {out}")


if __name__ == "__main__":
    from calibrl.tasks.datasets import _main as _registered_main

    _registered_main()
