"""Answer equivalence: which sampled answers of a prompt count as the same answer in a vote.

:func:`answer_clusters` maps answers to integer cluster ids, merging answers that math-verify judges equal within a
prompt; missing answers (None) form one "no answer" cluster per prompt, which can win a vote (as ``[Invalid]`` does
in the reference code, WNJXYK/RPC) and then counts with its paths' correctness. :func:`normalize_answer` is the
cheap exact-match stage before math-verify.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["answer_clusters", "normalize_answer"]

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
    s = str(answer).strip()
    for _ in range(3):
        s = s.strip().strip("$").strip()
        m = _BOXED.match(s)
        if not m:
            break
        s = m.group(1)
    spaced_comma = re.search(r",\s", s) is not None
    s = _SPACES.sub(lambda m: "\\frac" if "frac" in m.group(0) else "", s).rstrip(".")
    if _THOUSANDS.match(s) and not spaced_comma:  # "1,000" -> 1000; "2, 3" stays a pair
        s = s.replace(",", "")
    try:
        return repr(float(s))
    except ValueError:
        return s.lower()


def _timeout_arg() -> int | None:
    # math-verify's timeouts use signal.alarm, which only works in the main thread
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=65536)
def _parse(answer: str):
    from math_verify import parse

    timeout = _timeout_arg()
    parsed = parse(answer, parsing_timeout=timeout)
    if not parsed and not answer.lstrip().startswith("$"):
        parsed = parse(f"${answer}$", parsing_timeout=timeout)
    return parsed


@functools.lru_cache(maxsize=262144)
def _math_equal(a: str, b: str) -> bool:
    """math-verify equivalence of two answers (cached; called with a <= b so the cache is symmetric)."""
    from math_verify import verify

    pa, pb = _parse(a), _parse(b)
    if not pa or not pb:
        return False
    try:
        return bool(verify(pa, pb, timeout_seconds=_timeout_arg()))
    except Exception:  # noqa: BLE001 - a failed comparison means "not shown equal"
        return False


def _math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


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
    joins the first earlier cluster whose representative math-verify judges equal (``verify(parse(a), parse(b))``,
    both cached with ``functools.lru_cache``), so ``0.5`` and ``\\frac{1}{2}`` share an id. Missing answers (None)
    form one cluster per prompt. ``progress``: True for a rich progress bar over prompts, or a callable wrapping an
    iterable like ``rich.progress.track(iterable, total=...)``.
    """
    answers = np.asarray(answers, dtype=object)
    _, pidx = np.unique(np.asarray(prompt_ids), return_inverse=True)
    pidx = pidx.reshape(-1)
    if answers.shape != pidx.shape:
        raise ValueError(f"answers has {answers.shape[0]} entries, prompt_ids {pidx.shape[0]}")
    norm = np.array(["\x00none" if a is None else "\x01" + normalize_answer(a) for a in answers], dtype=object)
    # first stage: (prompt, normalised string) -> id
    keys = np.array([f"{p}\x02{n}" for p, n in zip(pidx.tolist(), norm)], dtype=str)
    uniq, first, ids = np.unique(keys, return_index=True, return_inverse=True)
    ids = ids.reshape(-1)
    if not use_math_verify or not _math_verify_available():
        return ids.astype(np.int64)

    # second stage: merge distinct strings of a prompt that math-verify judges equal
    parent = np.arange(len(uniq))
    u_prompt = pidx[first]
    u_text = [answers[i] for i in first]
    order = np.argsort(u_prompt, kind="stable")
    bounds = np.flatnonzero(np.diff(u_prompt[order])) + 1
    groups = [g for g in np.split(order, bounds) if len(g) > 1]
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
                a, b = sorted((str(text), str(u_text[rep])))
                if _math_equal(a, b):
                    parent[u] = rep
                    break
            else:
                reps.append(u)
    return parent[ids].astype(np.int64)
