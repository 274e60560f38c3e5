"""Answer equivalence: which sampled answers of a prompt count as the same answer in a vote.

:func:`answers_equivalent` is calibrl's one answer equivalence: grading (:func:`calibrl.tasks.rewards.math_equal`)
and clustering both call it, so a vote never merges answers the grader tells apart (``3\\sqrt{2}``, ``3`` and
``2, 3`` are three answers) nor splits answers it counts as one. :func:`answer_clusters` maps answers to integer
cluster ids, merging answers of a prompt that :func:`answers_equivalent` judges equal; missing answers (None) form
one "no answer" cluster per prompt, which can win a vote (as ``[Invalid]`` does in the reference code, WNJXYK/RPC)
and then counts with its paths' correctness. :func:`normalize_answer` is the cheap exact-match stage (equal
normalised forms are equivalent answers).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = ["MATH_TIMEOUT_SECONDS", "answer_clusters", "answers_equivalent", "group_answer_ids", "normalize_answer"]

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{(.*)\}\s*$", re.S)
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")
_SPACES = re.compile(r"\s+|\\[ ,;:!]|\\(?:left|right)(?![a-zA-Z])|\\(?:dfrac|tfrac)")


def normalize_answer(answer: str | None) -> str | None:
    """Cheap canonical form used for exact matching: strip $...$ and \\boxed{}, spaces, \\left/\\right, spacing
    commands, a trailing period; \\dfrac/\\tfrac -> \\frac; numbers as Python floats print them (``0.50`` -> ``0.5``,
    ``1,000`` -> ``1000.0``, ``3`` -> ``3.0``); commas are dropped only as thousands separators
    (``-?\\d{1,3}(,\\d{3})+(\\.\\d+)?`` with no space after a comma), so ``2,3``, ``2, 3`` and ``2, 300`` stay
    distinct from ``23`` and ``2300``."""
    if answer is None:
        return None
    s = _unwrap(answer)
    spaced_comma = re.search(r",\s", s) is not None
    s = _SPACES.sub(lambda m: "\\frac" if "frac" in m.group(0) else "", s).rstrip(".")
    if _THOUSANDS.match(s) and not spaced_comma:  # "1,000" -> 1000; "2, 3" stays a pair
        s = s.replace(",", "")
    try:
        return repr(float(s))
    except ValueError:
        return s.lower()


MATH_TIMEOUT_SECONDS = 5
# a plain integer literal: math-verify parses it to a sympy Integer, and two different Integers are unequal under
# every comparison it makes (numeric, symbolic, string), so such pairs are decided without parsing them
_INTEGER = re.compile(r"-?[0-9]+")
# a plain rational or radical literal: an integer, \frac{p}{q} (also \dfrac, \tfrac) or a\sqrt{b}, with an optional
# leading minus sign and no spaces; each integer at most 4 digits, without leading zeros (a coefficient not 0)
_NAT = r"(0|[1-9][0-9]{0,3})"
_LITERAL = re.compile(rf"(-?)(?:{_NAT}|\\[dt]?frac\{{{_NAT}\}}\{{{_NAT}\}}|([1-9][0-9]{{0,3}})?\\sqrt\{{{_NAT}\}})")
_LATEX_NOISE = re.compile(r"\\(?:left|right|displaystyle|!|,|;|:)")
_TEXT = re.compile(r"\\text\{\s*([^{}]*)\}")


def _unwrap(answer: str) -> str:
    """``answer`` without surrounding spaces, ``$...$`` and whole-answer ``\\boxed{}`` / ``\\fbox{}`` wrappers."""
    s = str(answer).strip()
    for _ in range(3):
        s = s.strip().strip("$").strip()
        m = _BOXED.match(s)
        if not m:
            break
        s = m.group(1)
    return s


def _latex_key(s: str) -> str:
    """Second exact-match form: \\left/\\right, \\displaystyle and spacing commands dropped, \\text{...} unwrapped,
    \\dfrac/\\tfrac -> \\frac, no whitespace, no trailing period (case kept)."""
    s = _TEXT.sub(r"\1", _LATEX_NOISE.sub("", s))
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return re.sub(r"\s+", "", s).rstrip(".")


@functools.lru_cache(maxsize=1 << 18)
def _literal_square(s: str) -> Fraction | None:
    """The signed square ``sign(x) x^2`` of the exact value ``x`` of a plain literal ``s`` (``_LITERAL``: ``-?n``,
    ``-?\\frac{p}{q}``, ``-?a\\sqrt{b}``), or None when ``s`` is not one (or has a zero denominator). Two real
    numbers are equal iff their signed squares are; ``x = +-(p/q) sqrt(b)`` gives ``sign(x) x^2 = +-p^2 b / q^2``."""
    m = _LITERAL.fullmatch(s)
    if m is None:
        return None
    minus, integer, num, den, coef, radicand = m.groups()
    if integer is not None:
        square = Fraction(int(integer) ** 2)
    elif num is not None:
        if int(den) == 0:
            return None
        square = Fraction(int(num) ** 2, int(den) ** 2)
    else:
        square = Fraction(int(coef or 1) ** 2 * int(radicand))
    return -square if minus else square


def _literals_equal(a: str, b: str) -> bool | None:
    """math-verify's verdict on ``a`` and ``b`` when both are plain literals (:func:`_literal_square`), decided
    without parsing them: True when their exact values are equal (math-verify parses both to the same sympy number:
    integers and fractions to one Rational, ``2\\sqrt{2}`` and ``\\sqrt{8}`` to one radical), False when they differ
    (their sympy values differ exactly; integers and fractions compare as exact Rationals; with a radical,
    ``simplify(a - b)`` is not 0 and ``(a - b).evalf()`` is at least ``1e-13`` of the values with integers under
    10^4); None when either is not such a literal."""
    x = _literal_square(a)
    if x is None:
        return None
    y = _literal_square(b)
    return None if y is None else x == y


@functools.lru_cache(maxsize=1 << 18)
def _exact_forms(answer: str) -> tuple[str, str | None, str, int | None]:
    """``answer`` unwrapped (:func:`_unwrap`), that string's two exact-match forms (:func:`normalize_answer`,
    :func:`_latex_key`) and its value when it is an integer literal (``_INTEGER``), computed once per distinct
    string."""
    s = _unwrap(answer)
    try:
        value = int(s) if _INTEGER.fullmatch(s) else None
    except ValueError:  # more digits than int() converts (4,300): no value kept
        value = None
    return s, normalize_answer(s), _latex_key(s), value


def _effective_timeout(timeout: int | None) -> int | None:
    """math-verify's time limits use signal.alarm, which only works in the main thread: elsewhere none."""
    return timeout if (timeout and threading.current_thread() is threading.main_thread()) else None


@functools.lru_cache(maxsize=1 << 18)
def _parse(expr: str, timeout: int | None):
    """math-verify's parse of one bare answer, read as the content of a ``\\boxed{}`` (LaTeX first, then a plain
    expression), the way a completion's final answer is read."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse("\\boxed{" + expr + "}",
                 extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
                 parsing_timeout=timeout)


@functools.lru_cache(maxsize=1 << 20)
def _verify_pair(a: str, b: str, timeout: int | None) -> bool:
    """math-verify equivalence in either direction (verify is not symmetric: an interval gold accepts the
    inequality, not the reverse); called with ``a <= b`` so the cache is symmetric."""
    try:  # a math-verify that fails to import shows nothing equal, as one missing
        from math_verify import verify

        pa, pb = _parse(a, timeout), _parse(b, timeout)
        if not pa or not pb:
            return False
        return bool(verify(pa, pb, timeout_seconds=timeout) or verify(pb, pa, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - a failed parse or comparison means "not shown equal"
        return False


@functools.lru_cache(maxsize=1)
def _math_verify_available() -> bool:
    """Whether math-verify is installed, without importing it: its import (sympy, the LaTeX parser) takes about a
    second, paid only when a pair of answers needs its parse (:func:`_verify_pair`)."""
    import importlib.util

    try:
        return importlib.util.find_spec("math_verify") is not None
    except (ImportError, ValueError):  # a module entry of None (imports of it blocked) or without a spec
        return False


def answers_equivalent(a: str | None, b: str | None, *, timeout: int | None = MATH_TIMEOUT_SECONDS) -> bool:
    """Whether two final answers are the same answer: THE equivalence of calibrl, used by grading
    (:func:`calibrl.tasks.rewards.math_equal`) and by answer clustering (:func:`answer_clusters`), so a vote never
    merges answers the grader tells apart, nor splits answers it counts as one.

    Symmetric. ``$...$`` and ``\\boxed{}`` wrappers are removed; equal :func:`normalize_answer` forms or equal
    LaTeX-stripped forms are equal; otherwise math-verify decides (each answer parsed as the content of a
    ``\\boxed{}``; ``verify`` in either order), each step limited to ``timeout`` seconds in the main thread (no
    limit elsewhere). None, empty answers and answers math-verify cannot parse are equal to nothing but their own
    normalised form. Without math-verify installed only the exact-match stages apply.
    """
    if a is None or b is None:
        return False
    (a, norm_a, key_a, int_a), (b, norm_b, key_b, int_b) = _exact_forms(str(a)), _exact_forms(str(b))
    if not a or not b:
        return False
    if norm_a == norm_b or key_a == key_b:
        return True
    if not _math_verify_available():
        return False
    if int_a is not None and int_b is not None and int_a != int_b:
        return False  # math-verify's verdict on two different integer literals, without parsing them
    literal = _literals_equal(a, b)
    if literal is not None:
        return literal  # math-verify's verdict on two literals, without parsing them
    x, y = sorted((a, b))
    return _verify_pair(x, y, _effective_timeout(timeout))


def answer_clusters(
    answers: Sequence[str | None] | np.ndarray,
    prompt_ids: Sequence[Any] | np.ndarray,
    *,
    use_math_verify: bool = True,
    progress: bool | Callable[[Any, int], Any] = False,
) -> np.ndarray:
    """Integer cluster id per answer; equal ids <=> same prompt and equivalent answers.

    Answers are first grouped by :func:`normalize_answer` (exact match after normalisation). With math-verify
    installed and ``use_math_verify``, each prompt's distinct normalised answers are then merged greedily: an answer
    joins the first earlier cluster whose representative :func:`answers_equivalent` judges equal (the grader's
    equivalence, cached), so ``0.5`` and ``\\frac{1}{2}`` share an id and ``3\\sqrt{2}`` and ``3`` do not. Missing answers (None)
    form one cluster per prompt. ``progress``: True for a rich progress bar over prompts, or a callable wrapping an
    iterable like ``rich.progress.track(iterable, total=...)``.
    """
    answers = np.asarray(answers, dtype=object)
    _, pidx = np.unique(np.asarray(prompt_ids), return_inverse=True)
    pidx = pidx.reshape(-1)
    if answers.shape != pidx.shape:
        raise ValueError(f"answers has {answers.shape[0]} entries, prompt_ids {pidx.shape[0]}")
    values = answers.tolist()
    forms = {a: "\x00none" if a is None else "\x01" + normalize_answer(a) for a in set(values)}  # once per answer
    # first stage: (prompt, normalised string) -> id, the ids numbered in the order of the strings
    # f"{prompt}\x02{form}" (the prompt's digits as text, then the form): one sort of the distinct prompts' digits
    # and one of the distinct forms give each pair an integer of that order, so a million answers are numbered by
    # one integer sort rather than one of a million strings (3x faster)
    form_rank = {f: i for i, f in enumerate(sorted(set(forms.values())))}
    answer_rank = {a: form_rank[f] for a, f in forms.items()}
    n_prompts = int(pidx.max(initial=-1)) + 1
    prompt_rank = np.empty(n_prompts, dtype=np.int64)
    prompt_rank[sorted(range(n_prompts), key=str)] = np.arange(n_prompts)
    code = prompt_rank[pidx] * len(form_rank) + np.array([answer_rank[a] for a in values], dtype=np.int64)
    _, first, ids = np.unique(code, return_index=True, return_inverse=True)
    ids = ids.reshape(-1)
    if not use_math_verify or not _math_verify_available():
        return ids.astype(np.int64)

    # second stage: merge distinct strings of a prompt that math-verify judges equal
    parent = np.arange(len(first))
    u_prompt = pidx[first]
    u_text = [values[i] for i in first.tolist()]
    order = np.argsort(u_prompt, kind="stable")
    bounds = np.flatnonzero(np.diff(u_prompt[order])) + 1
    order_list = order.tolist()
    groups = [order_list[a:b] for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(order_list)]) if b - a > 1]
    if progress is True:
        from rich.progress import track

        def progress(it, total):
            return track(it, total=total, description="math-verify answer clustering", transient=True)

    iterable = progress(groups, len(groups)) if callable(progress) else groups
    for group in iterable:
        reps: list[int] = []
        for u in group:
            text = u_text[u]
            if text is None:
                continue
            for rep in reps:
                if answers_equivalent(str(text), str(u_text[rep])):
                    parent[u] = rep
                    break
            else:
                reps.append(u)
    return parent[ids].astype(np.int64)


def group_answer_ids(answers: Sequence[str | None], group_ids: Sequence[Any]) -> list[int]:
    """Semantic clusters for training-time estimators (SEED-GRPO's semantic entropy): one id per answer [N], equal
    ids <=> same group and equivalent answers (:func:`answer_clusters`, the grader's equivalence, so ``12`` and
    ``12.0`` or ``0.5`` and ``\\frac{1}{2}`` are one meaning); -1 where the answer is None (no extractable answer:
    the estimator makes each such row a cluster of its own). Ids are dense, numbered in order of first appearance
    (0, 1, ...); the same answer in two groups gets two ids."""
    answers = [None if a is None else str(a) for a in answers]
    if len(answers) != len(group_ids):
        raise ValueError(f"answers has {len(answers)} entries, group_ids {len(group_ids)}")
    if not answers:
        return []
    clusters = answer_clusters(np.array(answers, dtype=object), np.asarray(group_ids))
    dense: dict[int, int] = {}
    return [-1 if a is None else dense.setdefault(int(c), len(dense)) for a, c in zip(answers, clusters.tolist())]
