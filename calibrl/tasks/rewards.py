r"""Verifiable rewards for real workloads: math (``\boxed{}`` + math-verify), format, and multiple-choice decisions.

Every reward has TRL's signature ``fn(prompts, completions, **columns) -> list[float | None]``: ``completions`` are
strings, or conversational lists of ``{"role", "content"}`` messages (the assistant's text is read); dataset columns
(``answer``, ``classes``, ``label``) arrive as keyword lists aligned with the completions. ``None`` means "this reward
does not apply to this row" (TRL then ignores it in the weighted sum), used only where the row has no gold.

Registered names (:mod:`calibrl.tasks.registry`):

* ``"math"``: 1.0 when the LAST ``\boxed{...}`` (or ``\fbox{...}``) of the completion is mathematically equal to
  the ``answer`` column by :func:`calibrl.selection.answers.answers_equivalent` (exact-match forms, then
  math-verify's ``parse`` + ``verify``, each under a time limit), the same equivalence that answer clustering
  uses for votes; 0.0 when it differs, when there is no ``\boxed{}``, when it cannot be parsed, or when the check
  times out.
* ``"format"``: 1.0 when the completion contains a non-empty ``\boxed{}``, else 0.0 (optional shaping term).
* ``"decision"``: 1.0 when the decision (the LAST standalone class string of the completion, from the ``classes``
  column) equals ``label`` (index into ``classes`` or the class string), else 0.0. The decision's token and its
  class probability are read at the class's single-token spellings, :func:`class_token_variants` (``calibrl
  generate`` and the trainer's decision term share that rule).
* ``"rlcr"``: RLCR's correctness-plus-Brier reward (arXiv 2507.16806) for completions that state a confidence
  after their answer, ``... \boxed{42} <confidence>0.8</confidence>``: :func:`rlcr_reward` of the answer's
  correctness (graded exactly as ``"decision"`` when the row has a ``label``, else as ``"math"``, on the text with
  its confidence tags removed) and the confidence :func:`calibrl.tasks.verbalized.parse_verbalized_confidence`
  reads (the LAST ``<confidence>`` tag). Values in [-1, 1]; None where the row has no gold.
* ``"ternary"`` and ``"risk_threshold"``: abstention as a third outcome (:mod:`calibrl.tasks.abstention`): a right
  answer, "I don't know" (the final answer, ``\boxed{IDK}`` or the phrase), or a wrong answer; TruthRL's
  (+1, 0, -1) and behaviorally calibrated RL's (1, 0, -t / (1 - t)). verl: :func:`verl_abstention_score`.

verl: :func:`verl_compute_score` (and the per-task ``verl_math_score`` / ``verl_decision_score``) follow verl's
custom reward hook, ``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float``. In verl
0.9 the keys are ``reward.custom_reward_function.path`` and ``reward.custom_reward_function.name``::

    reward.custom_reward_function.path=pkg://calibrl.tasks.rewards
    reward.custom_reward_function.name=verl_compute_score

(older verl: the top-level ``custom_reward_function.path`` / ``.name``). ``pkg://`` imports this module by name;
a file path would execute a second copy of it, whose registrations clash with calibrl's reward registry. The
dispatcher reads the task from ``extra_info["task"]`` (``"math"`` or ``"decision"``) when present, else treats a
``data_source`` containing ``commonsense``/``openbookqa``/``decision`` as a decision task and everything else as
math. For decisions ``ground_truth`` is the label (class string or index) and ``extra_info["classes"]`` the class
list (default ``A``-``E``). :func:`calibrl.tasks.datasets.to_verl_rows` writes rows with exactly these fields.

Time limits: math-verify enforces them with ``signal.alarm``, which only works in a process's main thread. In the
main thread (TRL, ``calibrl generate``) each parse and each verify is limited to ``timeout`` seconds (default 5);
from another thread (e.g. a reward loop scoring in a thread pool) the limit cannot be enforced and is switched off
(math-verify would otherwise raise), so run rewards in the main thread or in processes when inputs may be
adversarial.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from calibrl.selection.answers import MATH_TIMEOUT_SECONDS, answers_equivalent
from calibrl.tasks.registry import register_reward
from calibrl.tasks.verbalized import parse_verbalized_confidence, strip_confidence_tags

DEFAULT_CLASSES = ("A", "B", "C", "D", "E")

__all__ = [
    "completion_text",
    "last_boxed",
    "math_equal",
    "check_math",
    "extract_decision",
    "class_token_variants",
    "label_to_class",
    "math_reward",
    "format_reward",
    "decision_reward",
    "rlcr_reward",
    "rlcr_completion_reward",
    "ternary_completion_reward",
    "risk_threshold_completion_reward",
    "verl_abstention_score",
    "verl_compute_score",
    "verl_math_score",
    "verl_decision_score",
]


# --------------------------------------------------------------------------------------------------- helpers


def completion_text(completion: Any) -> str:
    """The text of one completion: a string as is; for a conversational list of messages, the content of the
    assistant messages joined (TRL passes ``[{"role": "assistant", "content": ...}]``)."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)):
        parts = []
        for message in completion:
            if isinstance(message, dict):
                if message.get("role", "assistant") == "assistant":
                    content = message.get("content", "")
                    if isinstance(content, list):  # multimodal-style [{"type": "text", "text": ...}]
                        content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
                    parts.append(str(content))
            else:
                parts.append(str(message))
        return "\n".join(parts)
    return str(completion)


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def last_boxed(text: str) -> str | None:
    r"""The content of the LAST ``\boxed{...}`` / ``\fbox{...}`` in ``text`` (nested braces matched), or None.

    Also accepts the brace-less form ``\boxed 5`` (content up to the next whitespace or ``$``). An unclosed final
    ``\boxed{`` (a truncated completion) yields None for that occurrence and the previous one is used.
    """
    end = len(text)
    while True:  # from the last occurrence back (rfind: no regex scan of a long text that has none)
        at = max(text.rfind("\\boxed", 0, end), text.rfind("\\fbox", 0, end))
        if at < 0:
            return None
        end = at
        start = _BOXED.match(text, at).end()
        if start < len(text) and text[start] == "{":
            depth = 0
            for i in range(start, len(text)):
                ch = text[i]
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        return text[start + 1 : i].strip()
            continue  # unclosed: try an earlier one
        m = re.match(r"[^\s${}]+", text[start:])
        if m:
            return m.group(0).strip()


def math_equal(pred: str | None, gold: Any, *, timeout: int | None = MATH_TIMEOUT_SECONDS) -> bool:
    """True when answer string ``pred`` equals ``gold``: :func:`calibrl.selection.answers.answers_equivalent`,
    the one answer equivalence that answer clustering (majority votes, ``calibrl eval``) uses too.

    ``gold`` may be a string, a number, or a list of ALTERNATIVE answers (any one matching counts). Not for
    multi-part answers: OlympiadBench's list-valued ``final_answer`` needs every part, and the dataset loaders
    join it into one string (:mod:`calibrl.tasks.datasets`) before it reaches here. A gold given with its own
    ``\\boxed{}`` or ``$...$`` is unwrapped. Results are cached per (pred, gold).
    """
    if pred is None or gold is None:
        return False
    if isinstance(gold, (list, tuple)):
        return any(math_equal(pred, g, timeout=timeout) for g in gold)
    gold = str(gold)
    boxed = last_boxed(gold)
    if boxed is not None:
        gold = boxed
    return answers_equivalent(pred, gold, timeout=timeout)


def check_math(completion: Any, gold: Any, *, timeout: int | None = MATH_TIMEOUT_SECONDS) -> tuple[str | None, bool]:
    r"""``(extracted answer, correct)`` for one completion: the last ``\boxed{}`` content vs ``gold``."""
    pred = last_boxed(completion_text(completion))
    return pred, (pred is not None and math_equal(pred, gold, timeout=timeout))


def label_to_class(label: Any, classes: Sequence[str]) -> str | None:
    """The class string a ``label`` denotes: an index into ``classes`` or the class string itself (None if
    missing/invalid)."""
    if label is None:
        return None
    if isinstance(label, bool):
        raise TypeError("label must be a class index or class string, not a bool")
    if isinstance(label, int) or (isinstance(label, float) and float(label).is_integer()):
        index = int(label)
        return classes[index] if 0 <= index < len(classes) else None
    label = str(label).strip()
    if label in classes:
        return label
    if label.isdigit() and 0 <= int(label) < len(classes):
        return classes[int(label)]
    return None


def extract_decision(text: str, classes: Sequence[str]) -> tuple[str | None, int]:
    """The decision in ``text``: the LAST occurrence of a class string that stands alone (not preceded or
    followed by a letter or digit), and its character offset; ``(None, -1)`` when there is none.

    "Answer: B" -> "B"; "Because A and B are wrong, C" -> "C"; "Bananas" -> no decision for classes A-E.
    """
    if not classes:
        return None, -1
    alternatives = "|".join(re.escape(c) for c in sorted(classes, key=len, reverse=True))
    pattern = re.compile(rf"(?<![A-Za-z0-9])({alternatives})(?![A-Za-z0-9])")
    last = None
    for last in pattern.finditer(text):
        pass
    if last is None:
        return None, -1
    return last.group(1), last.start(1)


def class_token_variants(tokenizer, classes: Sequence[str]) -> tuple[list[int], list[int]]:
    """Single-token spellings of each decision class ("A" and " A"): (token ids, class index of each).

    A class's probability at the decision token is the sum over its spellings (BPE tokenizers write "Answer: B"
    with the token " B"), so ``calibrl generate`` and the trainer's decision term read the same ids. A spelling
    whose token is already listed (for an earlier class) is skipped. Raises ``ValueError`` when a class has no
    single-token spelling: decision tasks need single-token class strings.
    """
    ids, owner = [], []
    for index, cls in enumerate(classes):
        found = False
        for spelling in (cls, " " + cls):
            enc = tokenizer.encode(spelling, add_special_tokens=False)
            if len(enc) == 1 and enc[0] not in ids:
                ids.append(enc[0])
                owner.append(index)
                found = True
        if not found:
            raise ValueError(
                f"class {cls!r} is not a single token for this tokenizer (neither {cls!r} nor {' ' + cls!r}); "
                "decision tasks need single-token class strings"
            )
    return ids, owner


def _column(columns: dict, name: str, n: int, default: Any = None) -> list:
    value = columns.get(name)
    if value is None:
        return [default] * n
    if len(value) != n:
        raise ValueError(f"reward column {name!r} has {len(value)} entries for {n} completions")
    return list(value)


def marks_unanswerable(answerable: Any) -> bool:
    """Whether an ``answerable`` value (a dataset column's entry, verl's ``extra_info["answerable"]``) marks an item
    that cannot be answered: false (or 0); None (not said) and true do not."""
    return answerable is not None and not isinstance(answerable, str) and answerable == 0


def unanswerable_rows(columns: dict, n: int) -> list[bool]:
    """Per completion: :func:`marks_unanswerable` of the row's ``answerable`` column
    (:func:`calibrl.tasks.synthetic.load_arithmetic`'s ``unanswerable=``, a user file's ``answerable`` field)."""
    return [marks_unanswerable(value) for value in _column(columns, "answerable", n)]


def declining_grade(completion: Any) -> float:
    """The grade of a completion to an unanswerable item: 1.0 when it declines (its final answer is "I don't know":
    :func:`calibrl.tasks.abstention.is_abstention`), else 0.0. Declining is the right response there (the reading
    of "The Hallucination Tax", arXiv 2505.13988, whose RL data rewards "I don't know" on unanswerable problems)."""
    from calibrl.tasks.abstention import is_abstention

    return 1.0 if is_abstention(completion) else 0.0


# --------------------------------------------------------------------------------------------------- rewards


@register_reward("math")
def math_reward(prompts, completions, answer=None, **columns) -> list[float | None]:
    r"""1.0 if the last ``\boxed{}`` of each completion equals its ``answer`` (math-verify), else 0.0; None where
    the row has no ``answer``. Extra keyword ``math_timeout`` (seconds per check) is honoured if given. A row
    marked unanswerable (``answerable`` False) is graded by :func:`declining_grade`."""
    n = len(completions)
    golds = _column({"answer": answer}, "answer", n)
    unanswerable = unanswerable_rows(columns, n)
    timeout = columns.get("math_timeout", MATH_TIMEOUT_SECONDS)
    if isinstance(timeout, list):  # a dataset column of that name would arrive as a list
        timeout = timeout[0] if timeout else MATH_TIMEOUT_SECONDS
    out: list[float | None] = []
    for completion, gold, declined in zip(completions, golds, unanswerable):
        if declined:
            out.append(declining_grade(completion))
        elif gold is None or (isinstance(gold, str) and not gold.strip()):
            out.append(None)
        else:
            out.append(1.0 if check_math(completion, gold, timeout=timeout)[1] else 0.0)
    return out


@register_reward("format")
def format_reward(prompts, completions, **columns) -> list[float]:
    r"""1.0 when the completion contains a non-empty ``\boxed{}`` answer, else 0.0."""
    return [1.0 if last_boxed(completion_text(c)) else 0.0 for c in completions]


@register_reward("decision")
def decision_reward(prompts, completions, classes=None, label=None, **columns) -> list[float | None]:
    """1.0 when the completion's decision (last standalone class string) equals ``label``, else 0.0; None where
    the row has no label. ``classes`` defaults to A-E when the dataset has no such column. A row marked unanswerable
    (``answerable`` False: no option is right) is graded by :func:`declining_grade`."""
    n = len(completions)
    all_classes = _column({"classes": classes}, "classes", n, DEFAULT_CLASSES)
    labels = _column({"label": label}, "label", n)
    out: list[float | None] = []
    for completion, cls, lab, declined in zip(completions, all_classes, labels, unanswerable_rows(columns, n)):
        if declined:
            out.append(declining_grade(completion))
            continue
        cls = tuple(cls or DEFAULT_CLASSES)
        gold = label_to_class(lab, cls)
        if gold is None:
            out.append(None)
            continue
        decision, _ = extract_decision(completion_text(completion), cls)
        out.append(1.0 if decision == gold else 0.0)
    return out


# --------------------------------------------------------------------------------------------------- RLCR


def rlcr_reward(*, correct, confidence):
    """RLCR's reward (arXiv 2507.16806, eq. 1): correctness plus the Brier score of the stated confidence,

        R(y, q) = 1[y correct] - (q - 1[y correct])^2,        q in [0, 1] the confidence stated after the answer.

    Correct answers earn 1 - (1 - q)^2 in [0, 1], wrong ones -q^2 in [-1, 0]. The Brier term is a bounded proper
    scoring rule, so for an answer that is right with probability p the expected reward
    p - p (1 - q)^2 - (1 - p) q^2 is maximised exactly at q = p (its derivative in q is 2 (p - q)); the paper
    proves the sum then rewards the most likely answer stated with a calibrated confidence.

    A MISSING confidence (``None``, or NaN in an array) scores as the worst stated one for the row's correctness,
    our choice (the paper leaves format failures to the prompt): ``1[correct] - 1``, i.e. 0 when correct (= q = 0)
    and -1 when wrong (= q = 1). So omitting the confidence never scores more than stating any value, while the
    answer's correctness still counts (a model that has not learnt the format yet is still rewarded for right
    answers).

    Shapes: ``correct`` (bool or 0/1) and ``confidence`` are scalars (a float comes back) or arrays / torch tensors
    of one shape (an array or tensor of float rewards comes back, on the confidence's device for tensors).
    Raises ``ValueError`` naming the value for a confidence outside [0, 1].
    """
    torch = _torch_if_tensor(correct, confidence)
    if torch is not None:
        q = confidence if isinstance(confidence, torch.Tensor) else torch.as_tensor(confidence, dtype=torch.float64)
        if not q.is_floating_point():
            q = q.double()
        target = torch.as_tensor(correct, device=q.device).to(q.dtype)
        out_of_range = (q < 0) | (q > 1)  # NaN compares False: a missing confidence is not out of range
        if bool(out_of_range.any()):
            bad = q[out_of_range][0].item()
            raise ValueError(f"rlcr_reward: confidence must be in [0, 1] (NaN: none stated), got {bad}")
        brier = torch.where(torch.isnan(q), torch.ones_like(q), (torch.nan_to_num(q) - target) ** 2)
        return target - brier
    scalar = np.ndim(confidence) == 0 and np.ndim(correct) == 0
    q = np.asarray(np.nan if confidence is None else confidence, dtype=np.float64)  # None inside a list -> NaN
    target = np.asarray(correct, dtype=np.float64)
    out_of_range = (q < 0) | (q > 1)
    if np.any(out_of_range):
        bad = q[out_of_range].reshape(-1)[0]
        raise ValueError(f"rlcr_reward: confidence must be in [0, 1] (None: none stated), got {bad}")
    brier = np.where(np.isnan(q), 1.0, (np.nan_to_num(q) - target) ** 2)
    reward = target - brier
    return float(reward) if scalar else reward


def _torch_if_tensor(*values):
    """The torch module when one of ``values`` is a torch tensor, else None (the float path needs no torch)."""
    import sys

    torch = sys.modules.get("torch")
    return torch if torch is not None and any(isinstance(v, torch.Tensor) for v in values) else None


@register_reward("rlcr")
def rlcr_completion_reward(prompts, completions, answer=None, classes=None, label=None,
                           **columns) -> list[float | None]:
    """RLCR's reward (:func:`rlcr_reward`) of each completion: its answer's correctness and its stated confidence.

    Correctness is the ``"decision"`` reward's when the rows carry a ``label`` column, else the ``"math"``
    reward's (last ``\\boxed{}`` vs ``answer``, math-verify), computed on the text with its ``<confidence>``
    tags (and an unclosed last one) removed, so the stated number is never read as the answer. The confidence is
    :func:`calibrl.tasks.verbalized.parse_verbalized_confidence` of the whole text: the LAST
    ``<confidence>x</confidence>``; a missing or malformed one scores ``1[correct] - 1`` (never above any stated
    confidence). None where the row has no gold, as the grading reward says.

    With TRL, a completion counts as correct when the correctness reward's value exceeds 0.5 (docs/trl.md), and an
    RLCR value does not say that (a right answer stated with q < 0.29 earns < 0.5): list the grading reward first
    with weight 0, ``rewards: [{name: math, weight: 0.0}, rlcr]``, so telemetry and ``capo`` read correctness
    from it while the policy is trained on RLCR's value.
    """
    texts = [completion_text(c) for c in completions]
    graded = [strip_confidence_tags(text) for text in texts]
    correctness = _graded(prompts, graded, answer, classes, label, columns)
    out: list[float | None] = []
    for text, value in zip(texts, correctness):
        if value is None:
            out.append(None)
            continue
        confidence = parse_verbalized_confidence(text)
        out.append(rlcr_reward(correct=value > 0.5, confidence=confidence))
    return out


# --------------------------------------------------------------------------------------------- abstention


def _graded(prompts, completions, answer, classes, label, columns) -> list[float | None]:
    """Each completion's correctness (1.0 / 0.0; None without a gold): ``"decision"``'s when the rows carry a
    ``label``, else ``"math"``'s."""
    if label is not None:
        return decision_reward(prompts, completions, classes=classes, label=label, **columns)
    return math_reward(prompts, completions, answer=answer, **columns)


def _with_abstention(prompts, completions, answer, classes, label, columns, patterns, reward) -> list[float | None]:
    """``reward(right, abstained)`` per completion; on an unanswerable row no answer is right, so declining earns
    the abstention's value and answering the wrong answer's."""
    from calibrl.tasks.abstention import is_abstention

    out: list[float | None] = []
    graded = _graded(prompts, completions, answer, classes, label, columns)
    for completion, value, declined in zip(completions, graded, unanswerable_rows(columns, len(completions))):
        abstained = is_abstention(completion, patterns=patterns)
        out.append(None if value is None else reward(value > 0.5 and not declined, abstained))
    return out


@register_reward("ternary")
def ternary_completion_reward(prompts, completions, answer=None, classes=None, label=None, *, right: float = 1.0,
                              abstain: float = 0.0, wrong: float = -1.0,
                              abstention_patterns: Sequence[str] | None = None, **columns) -> list[float | None]:
    """Abstention's ternary reward (:func:`calibrl.tasks.abstention.ternary_reward`): ``right`` for a right answer,
    ``abstain`` when the completion's final answer says "I don't know" (:func:`calibrl.tasks.abstention.is_abstention`,
    ``abstention_patterns`` to replace its phrases), ``wrong`` otherwise; TruthRL's (+1, 0, -1) by default. Graded as
    ``"decision"`` when the rows carry a ``label``, else as ``"math"``; None where the row has no gold. With TRL a
    value above 0.5 counts as correct (CAPO, telemetry), so an abstention counts as not correct, with the wrong
    answers, unless ``abstain`` > 0.5."""
    from calibrl.tasks.abstention import ternary_reward

    return _with_abstention(prompts, completions, answer, classes, label, columns, abstention_patterns,
                            lambda c, a: ternary_reward(c, a, right=right, abstain=abstain, wrong=wrong))


@register_reward("risk_threshold")
def risk_threshold_completion_reward(prompts, completions, answer=None, classes=None, label=None, *,
                                     threshold: float | None = None, abstention_patterns: Sequence[str] | None = None,
                                     **columns) -> list[float | None]:
    """Behaviorally calibrated RL's reward for the risk threshold ``threshold`` = t
    (:func:`calibrl.tasks.abstention.risk_threshold_reward`): right 1, wrong -t / (1 - t), "I don't know" 0, so
    answering pays exactly when P(correct) > t. Graded and read as ``"ternary"``. ``threshold`` is required: in a
    recipe, ``rewards: [{name: risk_threshold, params: {threshold: 0.75}}]``."""
    from calibrl.tasks.abstention import risk_threshold_reward

    if threshold is None:
        raise ValueError("reward 'risk_threshold' needs its threshold t in (0, 1): in a recipe "
                         "rewards: [{name: risk_threshold, params: {threshold: 0.75}}]")
    risk_threshold_reward(False, False, threshold=threshold)  # a threshold outside (0, 1) fails before grading
    return _with_abstention(prompts, completions, answer, classes, label, columns, abstention_patterns,
                            lambda c, a: risk_threshold_reward(c, a, threshold=threshold))


# --------------------------------------------------------------------------------------------------- verl


def verl_abstention_score(data_source, solution_str, ground_truth, extra_info=None, *, threshold: float | None = None,
                          right: float = 1.0, abstain: float = 0.0, wrong: float = -1.0,
                          patterns: Sequence[str] | None = None) -> dict[str, Any]:
    """verl ``compute_score`` with abstention: ``{"score", "acc", "abstained"}``. The answer is graded by
    :func:`verl_compute_score`; ``score`` is the risk-threshold reward when ``threshold`` is given, else the ternary
    reward (``right``, ``abstain``, ``wrong``; TruthRL's by default). The parameters come from verl's
    ``reward.custom_reward_function.reward_kwargs``; ``acc`` and ``abstained`` land in verl's reward extra info.
    verl's CAPO split (score > 0.5) counts an abstention with the wrong answers."""
    from calibrl.tasks.abstention import is_abstention, risk_threshold_reward, ternary_reward

    declined = isinstance(extra_info, dict) and marks_unanswerable(extra_info.get("answerable"))
    correct = not declined and verl_compute_score(data_source, solution_str, ground_truth, extra_info) > 0.5
    abstained = is_abstention(solution_str, patterns=patterns)
    if threshold is not None:
        score = risk_threshold_reward(correct, abstained, threshold=threshold)
    else:
        score = ternary_reward(correct, abstained, right=right, abstain=abstain, wrong=wrong)
    return {"score": score, "acc": float(correct and not abstained), "abstained": bool(abstained)}


def verl_math_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl ``compute_score`` for math: 1.0 / 0.0 as the ``"math"`` reward."""
    info = extra_info if isinstance(extra_info, dict) else {}
    timeout = info.get("math_timeout", MATH_TIMEOUT_SECONDS)
    return 1.0 if check_math(solution_str, ground_truth, timeout=timeout)[1] else 0.0


def verl_decision_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl ``compute_score`` for decisions: ``ground_truth`` is the label, ``extra_info["classes"]`` the
    classes (default A-E)."""
    info = extra_info if isinstance(extra_info, dict) else {}
    classes = info.get("classes")
    classes = tuple(str(c) for c in classes) if classes is not None and len(classes) else DEFAULT_CLASSES
    gold = label_to_class(ground_truth, classes)
    decision, _ = extract_decision(completion_text(solution_str), classes)
    return 1.0 if gold is not None and decision == gold else 0.0


_DECISION_SOURCES = ("commonsense", "openbookqa", "decision")


def verl_compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl ``custom_reward_function`` entry point dispatching on ``extra_info["task"]`` or ``data_source``; an item
    with ``extra_info["answerable"]`` False is graded by :func:`declining_grade`."""
    if isinstance(extra_info, dict) and marks_unanswerable(extra_info.get("answerable")):
        return declining_grade(solution_str)
    task = extra_info.get("task") if isinstance(extra_info, dict) else None
    if task is None:
        source = str(data_source or "").lower()
        task = "decision" if any(s in source for s in _DECISION_SOURCES) else "math"
    if task == "decision":
        return verl_decision_score(data_source, solution_str, ground_truth, extra_info)
    if task == "math":
        return verl_math_score(data_source, solution_str, ground_truth, extra_info)
    raise ValueError(f"verl_compute_score: unknown task {task!r} (expected 'math' or 'decision')")
