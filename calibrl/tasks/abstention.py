r"""Abstention as a third outcome: reading "I don't know" from a completion, and the rewards that pay for it.

A completion is right, wrong, or ABSTAINED. :func:`is_abstention` reads the last of these from the text:

* the last ``\boxed{...}`` holds an abstention token: ``IDK``, ``[IDK]`` (NeMo Gym's ``\boxed{[IDK]}``) or one of
  the phrases below; or
* there is no ``\boxed{}``, and the last non-empty line, once an ``Answer:`` / ``Final answer:`` prefix, Markdown
  emphasis and final punctuation are removed, IS one of the phrases: ``I don't know`` (straight or curly
  apostrophe), ``I do not know``, ``I dont know``, ``IDK``, ``I cannot answer (this)``, ``I can't answer (this)``,
  ``unanswerable``, ``cannot be determined``, ``not enough information``.

Our reading, where the papers leave it to their prompts: only the FINAL answer counts, and a phrase must be the
whole of it, so reasoning that says "I don't know the second number yet" before answering is not an abstention.
``patterns`` (regular expressions, matched against that final answer in full, case-insensitively) replace the
phrases.

Rewards (every one is a function of (correct, abstained) per completion; an abstention is never also correct):

* :func:`ternary_reward`: right ``right``, abstained ``abstain``, wrong ``wrong``. TruthRL (arXiv 2509.25760):
  (+1, 0, -1), the defaults. "Rewarding Intellectual Humility" (arXiv 2601.20126): (+1, r_abs, -1) with r_abs in
  about [-0.25, 0.3] working in their runs (pass ``abstain=``). NeMo Gym's abstention environment: (1, lambda, 0).
* :func:`risk_threshold_reward`: behaviorally calibrated RL's reward for a risk threshold t (arXiv 2512.19920):
  right 1, wrong -t / (1 - t), abstained 0. A completion right with probability p then expects
  p - (1 - p) t / (1 - t) from answering and 0 from abstaining, so answering pays exactly when p > t. At t = 1/2
  it is TruthRL's (+1, 0, -1).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Sequence

import numpy as np

__all__ = [
    "ABSTENTION_PHRASES",
    "TERNARY_PRESETS",
    "abstention_search",
    "final_answer_text",
    "is_abstention",
    "risk_threshold_reward",
    "ternary_reward",
]

# each matched against the whole final answer, case-insensitively
ABSTENTION_PHRASES: tuple[str, ...] = (
    r"\[?\s*idk\s*\]?",
    r"i\s+(?:don['’]?t|do\s+not)\s+know",
    r"i\s+(?:cannot|can['’]?t|can\s+not)\s+answer(?:\s+this(?:\s+question)?)?",
    r"unanswerable",
    r"(?:it\s+)?cannot\s+be\s+determined",
    r"not\s+enough\s+information",
)

TERNARY_PRESETS: dict[str, tuple[float, float, float]] = {
    "truthrl": (1.0, 0.0, -1.0),  # (right, abstain, wrong): TruthRL's ternary reward
}

_ANSWER_PREFIX = re.compile(r"^\s*(?:\*\*|__)?\s*(?:final\s+)?answer\s*(?:\*\*|__)?\s*[:：]\s*", re.IGNORECASE)
_EDGES = " \t*_`\"'.!?;:。"


_WHITESPACE = re.compile(r"\s+")
_TEXT_HELPERS: tuple = ()  # (completion_text, last_boxed), imported on first use: this runs once per row read


def _text_helpers() -> tuple:
    global _TEXT_HELPERS
    if not _TEXT_HELPERS:
        from calibrl.tasks.rewards import completion_text, last_boxed

        _TEXT_HELPERS = (completion_text, last_boxed)
    return _TEXT_HELPERS


def final_answer_text(text: str) -> str:
    r"""The final answer of a completion as :func:`is_abstention` reads it: the last ``\boxed{}`` content when there
    is one, else the last non-empty line without an ``Answer:`` prefix, emphasis or final punctuation."""
    boxed = _text_helpers()[1](text)
    if boxed is not None:
        return boxed.strip().strip(_EDGES).strip()
    for line in reversed(text.splitlines()):  # from the end: a long text's earlier lines are never looked at
        if line.strip():
            return _ANSWER_PREFIX.sub("", line.strip()).strip(_EDGES).strip()
    return ""


@functools.lru_cache(maxsize=32)
def _compiled(patterns: tuple[str, ...] | None) -> re.Pattern:
    chosen = ABSTENTION_PHRASES if patterns is None else patterns
    return re.compile("|".join(f"(?:{p})" for p in chosen) or r"(?!)", re.IGNORECASE)


def abstention_search(text: Any, *, patterns: Sequence[str] | None = None) -> bool:
    """Whether one of ``patterns`` (default :data:`ABSTENTION_PHRASES`) occurs anywhere in the completion,
    case-insensitively. Not an abstention by itself ("I don't know the second number yet" mentions one)."""
    return _compiled(None if patterns is None else tuple(patterns)).search(_text_helpers()[0](text)) is not None


# A necessary condition for the default phrases, cheaper than finding the final answer on a short text: each phrase
# holds one of these words (case aside), or "cannot answer" and its variants.
_PHRASE_WORDS = ("idk", "know", "unanswerable", "determined", "information")
_CANNOT_ANSWER = re.compile(r"can(?:not|['’]?t|\s+not)\s+answer")
_WORDS_CHECKED_UP_TO = 2048  # characters: on a longer text lowering it costs more than finding the final answer


def _holds_a_phrase_word(raw: str) -> bool:
    low = raw.lower()
    return any(word in low for word in _PHRASE_WORDS) or ("answer" in low and _CANNOT_ANSWER.search(low) is not None)


def is_abstention(text: Any, *, patterns: Sequence[str] | None = None) -> bool:
    """True when the completion's final answer (:func:`final_answer_text`) is, in full, one of ``patterns``
    (default :data:`ABSTENTION_PHRASES`). ``text``: a string or a conversational completion."""
    raw = _text_helpers()[0](text)
    # this runs once per row of calibrl eval (bench/abstention.py): a short text without any of the default phrases'
    # words is no abstention; otherwise the final answer alone is matched, anchored (a search of the whole text
    # cost 120 us on 300 characters and 4.4 ms on 9,000, finding the final answer a few us at any length)
    if patterns is None and len(raw) <= _WORDS_CHECKED_UP_TO and not _holds_a_phrase_word(raw):
        return False
    phrases = _compiled(None if patterns is None else tuple(patterns))
    answer = _WHITESPACE.sub(" ", final_answer_text(raw))
    return bool(answer) and phrases.fullmatch(answer) is not None


def _outcomes(correct: Any, abstained: Any) -> tuple[np.ndarray, np.ndarray, bool]:
    c = np.asarray(correct, dtype=bool)
    a = np.asarray(abstained, dtype=bool)
    if c.shape != a.shape:
        raise ValueError(f"correct {c.shape} and abstained {a.shape} must have one shape")
    return c & ~a, a, c.ndim == 0  # an abstention is never also right


def ternary_reward(correct: Any, abstained: Any, *, right: float = 1.0, abstain: float = 0.0,
                   wrong: float = -1.0) -> Any:
    """``right`` / ``abstain`` / ``wrong`` per completion (module docstring); ``correct`` and ``abstained`` bools
    (scalars: a float comes back; arrays of one shape: a float array)."""
    c, a, scalar = _outcomes(correct, abstained)
    out = np.where(a, float(abstain), np.where(c, float(right), float(wrong)))
    return float(out) if scalar else out


def risk_threshold_reward(correct: Any, abstained: Any, *, threshold: float) -> Any:
    """Right 1, wrong -t / (1 - t), abstained 0, t = ``threshold`` in (0, 1): answering is worth it exactly when
    P(correct) > t (module docstring). Shapes as :func:`ternary_reward`."""
    t = float(threshold)
    if not 0.0 < t < 1.0:
        raise ValueError(f"risk_threshold_reward: threshold must be in (0, 1), got {threshold!r}")
    return ternary_reward(correct, abstained, right=1.0, abstain=0.0, wrong=-t / (1.0 - t))
