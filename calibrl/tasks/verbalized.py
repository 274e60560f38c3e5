"""Verbalized confidence: the number a completion states about its own answer, ``<confidence>0.8</confidence>``.

* :func:`parse_verbalized_confidence`: the stated confidence of a completion, or None.
* Confidence readers (``CalibratedGRPOConfig.stated_confidence_reader``, what DCPO's split reads):
  :func:`confidence_reader` turns a name (``"tag"``, :func:`stated_confidence_span`) or a ``"module:function"``
  path into a function ``text -> (confidence or None, character offset where the statement starts or None)``.
* RLCR's prompt format (arXiv 2507.16806): :data:`CONFIDENCE_INSTRUCTION` and :func:`with_confidence_instruction`,
  which ask the model for that tag after its answer (``calibrl generate --confidence-prompt``). The reward that
  trains the model to state calibrated values is :func:`calibrl.tasks.rewards.rlcr_reward` (registered ``"rlcr"``).
"""

from __future__ import annotations

import re
import importlib
from typing import Any, Callable

__all__ = ["parse_verbalized_confidence", "CONFIDENCE_INSTRUCTION", "CONFIDENCE_READERS", "ConfidenceReader",
           "confidence_reader", "stated_confidence_span", "strip_confidence_tags", "with_confidence_instruction"]

_TAG = re.compile(r"<confidence>(.*?)</confidence>", re.IGNORECASE | re.DOTALL)
_DECIMAL = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)")


def parse_verbalized_confidence(text: str) -> float | None:
    """The confidence stated in the LAST ``<confidence>x</confidence>`` tag of ``text``, x a decimal in [0, 1]
    (``0.8``, ``.8``, ``1``, ``1.0``; spaces around it allowed); None when there is no tag or the last one is
    malformed (``80%``, ``high``, ``1e-1``, empty) or out of range (``1.2``). Only the last tag counts: a
    completion that revises its confidence is held to the final value, and a malformed final tag is not
    replaced by an earlier one."""
    if not text:
        return None
    matches = _TAG.findall(text)
    if not matches:
        return None
    value = matches[-1].strip()
    if not _DECIMAL.fullmatch(value):
        return None
    confidence = float(value)
    return confidence if 0.0 <= confidence <= 1.0 else None


def stated_confidence_span(text: str) -> tuple[float | None, int | None]:
    """(the confidence :func:`parse_verbalized_confidence` reads, the character offset where its tag, the LAST
    ``<confidence>`` tag, starts); the offset is None when there is no tag, the confidence None when it is
    malformed (DCPO splits the completion's tokens there, calibrl.advantages.dcpo)."""
    if not text:
        return None, None
    last = None
    for last in _TAG.finditer(text):
        pass
    return parse_verbalized_confidence(text), (None if last is None else last.start())


# (confidence in [0, 1] or None when none or malformed, character offset where the statement starts or None)
ConfidenceReader = Callable[[str], tuple["float | None", "int | None"]]
CONFIDENCE_READERS: dict[str, ConfidenceReader] = {"tag": stated_confidence_span}


def confidence_reader(name: str) -> ConfidenceReader:
    """The reader ``name`` names: a key of :data:`CONFIDENCE_READERS` (``"tag"``: the last ``<confidence>`` tag) or
    ``"package.module:function"``, a function of the completion's text returning (the confidence it states, in
    [0, 1], or None; the character offset where that statement starts, or None when there is none), as
    :func:`stated_confidence_span` does. A ValueError names a reader that cannot be found."""
    if name in CONFIDENCE_READERS:
        return CONFIDENCE_READERS[name]
    module, sep, attribute = str(name).partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"stated_confidence_reader: {name!r} is neither a known reader "
                         f"({', '.join(CONFIDENCE_READERS)}) nor 'package.module:function'")
    try:
        reader = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"stated_confidence_reader: cannot load {name!r} ({exc})") from None
    if not callable(reader):
        raise ValueError(f"stated_confidence_reader: {name!r} is not a function")
    return reader


# --------------------------------------------------------------------------------------------------- RLCR

CONFIDENCE_INSTRUCTION = "After your answer, state your confidence between 0 and 1 as <confidence>0.8</confidence>."

_CHAT_ASSISTANT_HEADER = "<|im_start|>assistant"
_ANY_TAG = re.compile(r"<confidence>.*?(?:</confidence>|$)", re.IGNORECASE | re.DOTALL)


def strip_confidence_tags(text: str) -> str:
    """``text`` with every ``<confidence>...</confidence>`` (and an unclosed last ``<confidence>...``, a
    truncated completion's) replaced by a space: what graders read, so a stated "0.8" is never taken for the
    answer."""
    return _ANY_TAG.sub(" ", text) if text and "<" in text else text
_DECISION_ANSWER_CUE = "Answer: "


def with_confidence_instruction(prompt: Any, *, instruction: str = CONFIDENCE_INSTRUCTION) -> Any:
    """``prompt`` asking also for a stated confidence (RLCR's format): ``instruction`` added to the request.

    Where it goes, so the prompt still ends where the model should start writing:

    * a conversational prompt (list of ``{"role", "content"}`` messages): appended to the last user message
      (a new list; the messages are copied);
    * a prompt in Qwen's chat markup ending with ``<|im_start|>assistant``: put at the end of the last user
      turn, before its ``<|im_end|>``;
    * a prompt ending with ``"Answer: "`` (the ``direct`` decision template, whose next token is the decision):
      put on its own line before that cue;
    * any other text: on its own line after the text (trailing whitespace kept at the end).
    """
    if isinstance(prompt, (list, tuple)):
        messages = [dict(m) for m in prompt]
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise ValueError("with_confidence_instruction: the conversational prompt has no user message")
        last = messages[users[-1]]
        last["content"] = f"{str(last.get('content', '')).rstrip()}\n{instruction}"
        return messages
    if not isinstance(prompt, str):
        raise TypeError(f"with_confidence_instruction: prompt must be a string or a list of messages, got "
                        f"{type(prompt).__name__}")
    body = prompt.rstrip()
    if body.endswith(_CHAT_ASSISTANT_HEADER):
        user_end = prompt.rfind("<|im_end|>", 0, len(body) - len(_CHAT_ASSISTANT_HEADER))
        if user_end >= 0:
            return f"{prompt[:user_end].rstrip()}\n{instruction}{prompt[user_end:]}"
    if prompt.endswith(_DECISION_ANSWER_CUE):
        head = prompt[: -len(_DECISION_ANSWER_CUE)].rstrip("\n")
        return f"{head}\n{instruction}\n{_DECISION_ANSWER_CUE}"
    trailing = prompt[len(body):]
    return f"{body}\n{instruction}{trailing}"
