r"""Tasks generated on the spot, so real models can be trained and evaluated with no download: ``arithmetic``
(integer expressions, answered with a number) and ``multiple_choice`` (the same expressions as a four-option
question answered with a letter).

Both loaders have the signature ``loader(split="test", *, size=None, limit=None, seed=0, levels=(1, 2, 3, 4),
template=<default>)`` and return a ``datasets.Dataset`` in the row format of :mod:`calibrl.tasks.datasets`
(``prompt``, ``benchmark``, ``prompt_id``, plus ``answer`` for arithmetic or ``classes`` / ``label`` for
multiple choice) with a ``level`` column (1-4) and the ``expression`` the problem asks about.

Levels (how hard the expression is):

====== ===================================================================== ========================
level  expression                                                            distinct problems
====== ===================================================================== ========================
1      one ``+`` or ``-`` on whole numbers 0-20 (no negative result)          672
2      one ``+`` or ``-`` on two-digit numbers, or ``*`` on numbers 2-12       about 16,000
3      two operations among ``+ - *`` on numbers 1-20                         about 72,000
4      three operations among ``+ - *`` on numbers 1-20                       about 4.3 million
====== ===================================================================== ========================

The usual precedence holds (``*`` before ``+`` and ``-``, then left to right).

Splits: ``train``, ``validation`` (alias ``eval``) and ``test``. Which split a problem belongs to is decided by a
hash of its expression, never by the seed, so the splits are disjoint whatever seeds and sizes are used (about
70% / 15% / 15% of every level's problems), and the two tasks agree: an expression in ``arithmetic``'s test
split is in ``multiple_choice``'s test split too. ``seed`` picks which problems of the split are drawn and in
what order; the same arguments always give the same rows. Levels take turns (1, 2, 3, 4, 1, ...); a level
whose problems in the split run out (level 1 has about 100 per evaluation split) leaves its turns to the others.
``size`` is how many problems are drawn (default: 5,000 train, 400 validation, 400 test); ``limit`` keeps the
first ``limit`` rows (the same rows as a larger size would start with).

Answer formats and grading:

* arithmetic: "Answer with just the number."; graded by the ``"number"`` reward, registered here and used by
  ``calibrl generate`` by default for this dataset: the completion's final answer (the last ``\boxed{}``, else
  the last ``Answer: ...`` line, else the last number in the text: :func:`final_answer`) compared with the gold
  by :func:`calibrl.selection.answers.answers_equivalent`, the project's one answer equivalence. Templates:
  ``"chat"`` (default: one user message, rendered with the tokenizer's chat template) and ``"text"`` (plain).
* multiple_choice: options A-D, the right value among three plausible wrong ones (off by one, off by ten, the
  result of a different operation, the digits swapped, ...), graded by letter with the ``"decision"`` reward.
  Templates as the other decision datasets' (:data:`calibrl.tasks.datasets.DECISION_TEMPLATES`): ``"direct"``
  (default: the prompt ends in ``"Answer: "`` so the next token is the letter), ``"reasoning"``, ``"chat"``, and
  ``"chat-direct"``: the direct prompt's question, options and "Reply with the letter ..." as a user message, for
  instruct models, which answer a plain-text prompt with anything but a letter.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any, Sequence

from calibrl.tasks.registry import register_dataset, register_reward

__all__ = [
    "ARITHMETIC_TEMPLATES", "LEVELS", "SPLITS", "arithmetic_problem", "evaluate_expression", "final_answer",
    "load_arithmetic", "load_multiple_choice", "number_reward", "split_of",
]

LEVELS = (1, 2, 3, 4)
SPLITS = ("train", "validation", "test")
_SPLIT_ALIASES = {"eval": "validation", "valid": "validation", "val": "validation"}
_DEFAULT_SIZE = {"train": 5000, "validation": 400, "test": 400}
ARITHMETIC_TEMPLATES = ("chat", "text")
ARITHMETIC_INSTRUCTION = "Answer with just the number."
# the instruction of every row of a draw that holds unanswerable items, answerable or not, so the prompt's wording
# does not give away which is which
DECLINE_INSTRUCTION = "Answer with just the number, or \"I don't know\" if it cannot be determined."
UNKNOWN_OPERAND = "x"  # what stands in the missing operand's place in an unanswerable arithmetic question
# ``calibrl generate``'s completion budget for both generated tasks when --max-new-tokens is not given: an answer is
# a number or a letter. SmolLM2-135M-Instruct's 4 x 8 arithmetic samples that were right had 11-34 tokens; half
# of all ran past 64 (rambling, never right). 1,024 (the reasoning benchmarks' default) took 14 minutes for 32.
ARITHMETIC_MAX_NEW_TOKENS = 64
_QUESTIONS = ("What is {expr}?", "Compute {expr}.", "Calculate {expr}.", "What is the value of {expr}?")
_CLASSES = ["A", "B", "C", "D"]
_MAX_MISSES = 2000  # consecutive draws that find no new problem of a level in the split: the level is used up


# --------------------------------------------------------------------------------------------------- problems


def evaluate_expression(tokens: Sequence[Any]) -> int:
    """The value of ``[n0, op1, n1, op2, n2, ...]`` (ints and ``"+" "-" "*"``) with ``*`` before ``+``/``-``."""
    terms: list[int] = [int(tokens[0])]  # sums of products: each + or - starts a new signed term
    for op, number in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            terms[-1] *= int(number)
        elif op == "+":
            terms.append(int(number))
        elif op == "-":
            terms.append(-int(number))
        else:
            raise ValueError(f"unknown operation {op!r}")
    return sum(terms)


def arithmetic_problem(rng: random.Random, level: int) -> list:
    """One expression of ``level`` as tokens ``[n0, op1, n1, ...]`` (see the module docstring's table)."""
    if level == 1:
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        op = rng.choice("+-")
        return [max(a, b), "-", min(a, b)] if op == "-" else [a, "+", b]
    if level == 2:
        op = rng.choice("+-*")
        if op == "*":
            return [rng.randint(2, 12), "*", rng.randint(2, 12)]
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return [max(a, b), "-", min(a, b)] if op == "-" else [a, "+", b]
    if level in (3, 4):
        tokens: list = [rng.randint(1, 20)]
        for _ in range(level - 1):
            tokens += [rng.choice("+-*"), rng.randint(1, 20)]
        return tokens
    raise ValueError(f"unknown level {level!r}; levels are {LEVELS}")


def expression_text(tokens: Sequence[Any]) -> str:
    return " ".join(str(t) for t in tokens)


def split_of(expression: str) -> str:
    """The split ``expression`` belongs to: a hash of its text, so it never depends on seeds or sizes."""
    bucket = int.from_bytes(hashlib.sha256(expression.encode()).digest()[:8], "big") % 100
    return "test" if bucket < 15 else "validation" if bucket < 30 else "train"


def _split_name(split: str | None) -> str:
    split = _SPLIT_ALIASES.get(split or "test", split or "test")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)} (or eval)")
    return split


def _levels(levels: Sequence[int] | int) -> tuple[int, ...]:
    levels = (levels,) if isinstance(levels, int) else tuple(int(x) for x in levels)
    bad = [x for x in levels if x not in LEVELS]
    if bad or not levels:
        raise ValueError(f"levels must be among {LEVELS}, got {levels!r}")
    return levels


def draw_problems(*, split: str, size: int, seed: int, levels: Sequence[int], stream: str) -> list[dict]:
    """``size`` distinct problems of ``split`` (fewer only when every level runs out), levels taking turns.

    Each: ``{"tokens", "expression", "value", "level", "rng"}``, ``rng`` being a generator seeded by the problem
    (for the phrasing and the options), so a problem's row does not depend on which problems came before it.
    ``stream`` names the task, so the two tasks draw different problems from the same split.
    """
    rng = random.Random(f"{stream}|{split}|{seed}")
    seen: set[str] = set()
    active = list(levels)
    problems: list[dict] = []
    turn = 0
    while len(problems) < size and active:
        level = active[turn % len(active)]
        for _ in range(_MAX_MISSES):
            tokens = arithmetic_problem(rng, level)
            expression = expression_text(tokens)
            if expression not in seen and split_of(expression) == split:
                break
        else:
            active.remove(level)  # used up in this split: its turns go to the others
            continue
        seen.add(expression)
        problems.append({"tokens": tokens, "expression": expression, "value": evaluate_expression(tokens),
                         "level": level, "rng": random.Random(f"{stream}|{expression}|{seed}")})
        turn += 1
    return problems


def _unanswerable_share(share: float) -> float:
    share = float(share)
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"unanswerable must be a share in [0, 1], got {share!r}")
    return share


def _is_unanswerable(problem: dict, share: float, *, stream: str, seed: int) -> bool:
    """Whether a drawn problem becomes unanswerable: each with probability ``share``, decided by a generator of its
    own (the problem, the task, the seed), so a row's fate does not depend on the size or on the other rows."""
    return share > 0 and random.Random(f"{stream}|unanswerable|{problem['expression']}|{seed}").random() < share


def _finish(rows: list[dict], limit: int | None):
    import datasets

    if limit is not None:
        rows = rows[: int(limit)]
    if not rows:
        raise ValueError("no problems: check size, limit and levels")
    return datasets.Dataset.from_list(rows)


# --------------------------------------------------------------------------------------------------- arithmetic


def arithmetic_prompt(question: str, template: str = "chat", *, decline: bool = False):
    """The prompt for one arithmetic question: a chat message or plain text, asking for the number alone
    (``decline``: or "I don't know" when it cannot be determined, :data:`DECLINE_INSTRUCTION`)."""
    text = f"{question} {DECLINE_INSTRUCTION if decline else ARITHMETIC_INSTRUCTION}"
    if template == "chat":
        return [{"role": "user", "content": text}]
    if template == "text":
        return text + "\n"
    raise ValueError(f"unknown arithmetic template {template!r}; choose one of {', '.join(ARITHMETIC_TEMPLATES)}")


@register_dataset("arithmetic", reward="number", max_new_tokens=ARITHMETIC_MAX_NEW_TOKENS)
def load_arithmetic(split: str = "test", *, size: int | None = None, limit: int | None = None, seed: int = 0,
                    levels: Sequence[int] | int = LEVELS, template: str = "chat", path: str | None = None,
                    unanswerable: float = 0.0):
    """Arithmetic problems of ``split`` (module docstring); columns prompt, answer, level, expression,
    benchmark, prompt_id. ``path`` is accepted for the common loader signature and must be None.

    ``unanswerable`` (a share in [0, 1]): each problem is made unanswerable with that probability: one operand,
    chosen by the problem's own generator, becomes :data:`UNKNOWN_OPERAND` ("What is 7 + x?"), ``answer`` is None
    and the extra column ``answerable`` is false (true elsewhere); every prompt of the draw then offers "I don't
    know" (:data:`DECLINE_INSTRUCTION`). The ``"number"`` reward grades declining right there and any number wrong.
    """
    if path is not None:
        raise ValueError("arithmetic is generated, not read from a file: drop --path")
    split = _split_name(split)
    share = _unanswerable_share(unanswerable)
    arithmetic_prompt("", template)  # an unknown template fails before any drawing
    rows = []
    for index, p in enumerate(draw_problems(split=split, size=_size(size, split), seed=seed,
                                            levels=_levels(levels), stream="arithmetic")):
        template_of_question = p["rng"].choice(_QUESTIONS)
        row = {"answer": str(p["value"]), "level": p["level"], "expression": p["expression"]}
        if share > 0:
            row["answerable"] = not _is_unanswerable(p, share, stream="arithmetic", seed=seed)
            if not row["answerable"]:
                tokens = list(p["tokens"])
                tokens[2 * p["rng"].randrange(len(tokens) // 2 + 1)] = UNKNOWN_OPERAND
                row.update(answer=None, expression=expression_text(tokens))
        question = template_of_question.format(expr=row["expression"])
        rows.append({"prompt": arithmetic_prompt(question, template, decline=share > 0), **row,
                     "benchmark": "arithmetic", "prompt_id": f"arithmetic-{split}-{seed}-{index}"})
    return _finish(rows, limit)


def _size(size: int | None, split: str) -> int:
    size = _DEFAULT_SIZE[split] if size is None else int(size)
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    return size


# --------------------------------------------------------------------------------------------------- multiple choice


def distractors(tokens: Sequence[Any], value: int, rng: random.Random, *, k: int = 3) -> list[int]:
    """``k`` distinct wrong values a solver plausibly reaches: off by one or two, off by ten, one operation
    swapped for another, the digits reversed; random nearby values fill in when those coincide."""
    candidates = [value + 1, value - 1, value + 2, value - 2, value + 10, value - 10]
    swap = {"+": "-", "-": "+", "*": "+"}
    for position in range(1, len(tokens), 2):
        changed = list(tokens)
        changed[position] = swap[tokens[position]]
        candidates.append(evaluate_expression(changed))
    if abs(value) >= 10:
        candidates.append(int(str(abs(value))[::-1]) * (1 if value >= 0 else -1))
    candidates = [c for c in dict.fromkeys(candidates) if c != value]
    rng.shuffle(candidates)
    chosen = candidates[:k]
    while len(chosen) < k:  # only when the plausible ones coincide (small values)
        c = value + rng.randint(-20, 20)
        if c != value and c not in chosen:
            chosen.append(c)
    return chosen


@register_dataset("multiple_choice", max_new_tokens=ARITHMETIC_MAX_NEW_TOKENS)
def load_multiple_choice(split: str = "test", *, size: int | None = None, limit: int | None = None, seed: int = 0,
                         levels: Sequence[int] | int = LEVELS, template: str = "direct", path: str | None = None,
                         unanswerable: float = 0.0):
    """Four-option questions on the value of an expression (module docstring); columns prompt, classes, label,
    level, expression, benchmark, prompt_id. ``path`` must be None (generated task).

    ``unanswerable`` (a share in [0, 1]): each question is made unanswerable with that probability: its four
    options are all wrong values (:func:`distractors`), ``label`` is None and the extra column ``answerable`` is
    false (true elsewhere); every prompt of the draw then offers "I don't know" when no option is right. The
    ``"decision"`` reward grades declining right there and any letter wrong."""
    from calibrl.tasks.datasets import DECISION_TEMPLATES, decision_prompt

    if path is not None:
        raise ValueError("multiple_choice is generated, not read from a file: drop --path")
    templates = (*DECISION_TEMPLATES, "chat-direct")
    if template not in templates:
        raise ValueError(f"unknown decision template {template!r}; choose one of {', '.join(templates)}")
    split = _split_name(split)
    share = _unanswerable_share(unanswerable)
    rows = []
    for index, p in enumerate(draw_problems(split=split, size=_size(size, split), seed=seed,
                                            levels=_levels(levels), stream="multiple_choice")):
        rng = p["rng"]
        answerable = not _is_unanswerable(p, share, stream="multiple_choice", seed=seed)
        if answerable:
            options = [p["value"], *distractors(p["tokens"], p["value"], rng)]
        else:  # no option is right
            options = distractors(p["tokens"], p["value"], rng, k=len(_CLASSES))
        rng.shuffle(options)
        label = _CLASSES[options.index(p["value"])] if answerable else None
        question = f"What is {p['expression']}?"
        shown = [str(o) for o in options]
        if template == "chat-direct":  # the direct instruction as a user message, for chat models
            text = decision_prompt(question, shown, _CLASSES, "direct", decline=share > 0)
            prompt = [{"role": "user", "content": text.removesuffix("\nAnswer: ")}]
        else:
            prompt = decision_prompt(question, shown, _CLASSES, template, decline=share > 0)
        row = {"prompt": prompt,
               "classes": list(_CLASSES), "label": label, "level": p["level"], "expression": p["expression"],
               "benchmark": "multiple_choice", "prompt_id": f"multiple_choice-{split}-{seed}-{index}"}
        if share > 0:
            row["answerable"] = answerable
        rows.append(row)
    return _finish(rows, limit)


# --------------------------------------------------------------------------------------------------- grading

_NUMBER = re.compile(r"(?:(?<![\w)])-)?\d+(?:,\d{3})*(?:\.\d+)?")  # a minus is a sign only after no operand
_ANSWER_LINE = re.compile(r"answer\s*(?:is)?\s*[:=]?\s*\**\s*([^\n]*)", re.IGNORECASE)


def final_answer(text: str) -> str | None:
    r"""The final answer of a completion asked for a number: the last ``\boxed{}``'s content, else the last number
    on the last ``Answer: ...`` line, else the last number in the text (thousands commas dropped); None when the
    text has no number. "6 + 6 = 12" -> "12"; "The answer is -3." -> "-3"; "Answer: 7\nBecause ..." -> "7".
    """
    from calibrl.tasks.rewards import completion_text, last_boxed

    text = completion_text(text)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    lines = _ANSWER_LINE.findall(text)
    for scope in ([lines[-1]] if lines else []) + [text]:
        numbers = _NUMBER.findall(scope)
        if numbers:
            return numbers[-1].replace(",", "")
    return None


@register_reward("number")
def number_reward(prompts, completions, answer=None, **columns) -> list[float | None]:
    """1.0 when each completion's :func:`final_answer` equals its ``answer`` (the project's answer equivalence),
    else 0.0; None where the row has no ``answer``. TRL's reward signature, as the ``"math"`` reward's. A row
    marked unanswerable (``answerable`` false) is graded by :func:`calibrl.tasks.rewards.declining_grade`."""
    from calibrl.tasks.rewards import declining_grade, math_equal, unanswerable_rows

    golds = answer if isinstance(answer, (list, tuple)) else [answer] * len(completions)
    out: list[float | None] = []
    for completion, gold, declined in zip(completions, golds, unanswerable_rows(columns, len(completions))):
        if declined:
            out.append(declining_grade(completion))
        elif gold is None or (isinstance(gold, str) and not gold.strip()):
            out.append(None)
        else:
            out.append(1.0 if math_equal(final_answer(completion), gold) else 0.0)
    return out


number_reward.extract_answer = final_answer  # what calibrl generate records as a row's answer (for voting)
