"""OpenAI-style API responses with token log-probabilities, saved as JSON Lines (one response per line).

Accepted lines:

- a Chat Completions response ``{"id", "choices": [{"message": {"content"}, "logprobs": {"content": [{"token",
  "logprob", ...}, ...]}, "finish_reason"}, ...], ...}`` (requested with ``logprobs=true``);
- a legacy Completions response ``{"id", "choices": [{"text", "logprobs": {"tokens", "token_logprobs": [...]}},
  ...]}`` (``logprobs=0`` or more; null entries, such as an echoed first token, are skipped);
- a Batch API output line ``{"custom_id", "response": {"status_code", "body": <one of the above>}, "error"}``.

Every choice is one sample; the choices of one line share a prompt id: ``prompt_id`` of the line or its
``metadata``, else ``custom_id``, else the response ``id``. The files carry no gold answer, so each line (or its
``metadata``, or the body's ``metadata``) must give ``gold`` / ``answer`` (math: graded on the last ``\\boxed{}``
with math-verify, or with ``Grading(grader="math-verify")`` math-verify's parse of the whole completion) or
``label`` with ``classes`` (decision: the last standalone class string), else ``Grading.answers`` (``--answers``)
by prompt id or ``custom_id``. Failed requests, responses without choices and choices without text are left out
and counted (:class:`calibrl.evaluation.readers.base.Skips`).

When the response carries each position's alternatives (``top_logprobs=k`` requested: chat
``logprobs.content[i].top_logprobs``, legacy ``logprobs.top_logprobs[i]``), the row gets DeepConf's
``token_confidence`` (minus the mean of each position's top-k log-probs,
:func:`calibrl.selection.deepconf.token_confidence_from_top_logprobs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from calibrl.evaluation.readers.base import (Grading, SamplesError, Skips, as_float, fail, hit_token_limit, need_object,
                                             rows_jsonl)
from calibrl.selection.deepconf import token_confidence_from_top_logprobs


class _Failed(SamplesError):
    """A request or choice that failed (left out and counted, not refused); ``cause`` names why."""

    def __init__(self, error: SamplesError, cause: str):
        super().__init__(str(error))
        self.error, self.cause = error, cause


def _body(raw: dict, where: str) -> tuple[dict, str]:
    """The response body of a line and the field path to it (``""`` or ``"response.body."`` for batch output)."""
    if "choices" in raw:
        return raw, ""
    if raw.get("error") is not None:
        raise _Failed(fail(where, "error", f"the request failed: {raw['error']!r}"), "failed request")
    response = raw.get("response")
    if not isinstance(response, dict):
        raise fail(where, "response", "missing (a Batch API output line has response.body)")
    status = response.get("status_code", 200)
    if status != 200:
        raise _Failed(fail(where, "response.status_code", f"the request failed with status {status!r}"),
                      "failed request")
    body = response.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise fail(where, "response.body.choices", "missing")
    return body, "response.body."


def _choice(choice: Any, where: str, field: str) -> tuple[str, list[float]]:
    """A choice's text and its sampled tokens' log-probs (chat ``logprobs.content`` or legacy
    ``logprobs.token_logprobs``)."""
    if not isinstance(choice, dict):
        raise fail(where, field, f"expected an object, got {type(choice).__name__}")
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    if text is None or text == "":  # a refusal, a content filter, a request cut before any token
        raise _Failed(fail(where, f"{field}.message.content", "missing (no text in the choice)"), "empty choice")
    if not isinstance(text, str):
        raise fail(where, f"{field}.message.content", f"expected a string, got {type(text).__name__}")
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise fail(where, f"{field}.logprobs", "missing (request the response with logprobs)")
    if isinstance(message, dict):
        tokens = logprobs.get("content")
        if not isinstance(tokens, list):
            raise fail(where, f"{field}.logprobs.content", "missing")
        values = [as_float(t.get("logprob") if isinstance(t, dict) else t, where,
                           f"{field}.logprobs.content[{j}].logprob") for j, t in enumerate(tokens)]
    else:
        tokens = logprobs.get("token_logprobs")
        if not isinstance(tokens, list):
            raise fail(where, f"{field}.logprobs.token_logprobs", "missing")
        values = [as_float(t, where, f"{field}.logprobs.token_logprobs[{j}]") for j, t in enumerate(tokens)
                  if t is not None]
    if not values:
        raise fail(where, f"{field}.logprobs", "no token log-probabilities (an empty completion has no confidence)")
    return text, values


def _token_confidence(choice: dict) -> Any:
    """DeepConf's token confidence of a choice from its positions' ``top_logprobs`` (None when it has none)."""
    logprobs = choice.get("logprobs") or {}
    if isinstance(choice.get("message"), dict):
        tops = [t.get("top_logprobs") if isinstance(t, dict) else None for t in logprobs.get("content") or []]
        tops = [[e.get("logprob") if isinstance(e, dict) else e for e in top] if isinstance(top, list) else None
                for top in tops]
    else:
        tops = [list(top.values()) if isinstance(top, dict) else None for top in logprobs.get("top_logprobs") or []]
    if not any(tops):
        return None
    return token_confidence_from_top_logprobs([[float(v) for v in top if v is not None] if top else []
                                               for top in tops])


def _prompt_id(places: list[Any], raw: dict, body: dict, where: str) -> str:
    """``prompt_id`` of the line or a metadata, else ``custom_id``, else the response ``id``."""
    for place in places:
        if isinstance(place, dict) and place.get("prompt_id") is not None:
            return str(place["prompt_id"])
    for value in (raw.get("custom_id"), body.get("id")):
        if value is not None:
            return str(value)
    raise fail(where, "prompt_id", "missing (give prompt_id, custom_id or the response id)")


def read(path: Path, notes: list[str], skips: Skips | None = None,
         grading: Grading | None = None) -> Iterator[tuple[str, dict]]:
    """calibrl rows (one per choice) of an OpenAI-style responses file, graded against each line's gold.

    Failed requests (an ``error`` object, a status other than 200), responses without choices and choices without
    text are left out and counted in ``skips`` (None: refused); each choice's ``index`` is its ``sample_index``."""
    skips = skips if skips is not None else Skips(strict=True)
    grading = grading if grading is not None else Grading()
    for lineno, raw in rows_jsonl(path):
        where = f"{path.name}:{lineno}"
        try:
            body, prefix = _body(need_object(raw, where), where)
        except _Failed as failed:
            skips.skip(failed.error, failed.cause)
            continue
        places = [raw, raw.get("metadata"), body.get("metadata")]
        prompt_id = _prompt_id(places, raw, body, where)
        gold = grading.gold(places, [prompt_id, raw.get("custom_id")], where)
        if not body["choices"]:
            skips.skip(fail(where, f"{prefix}choices", "empty"), "response without choices")
            continue
        for i, choice in enumerate(body["choices"]):
            try:
                text, values = _choice(choice, where, f"{prefix}choices[{i}]")
            except _Failed as failed:
                skips.skip(failed.error, failed.cause)
                continue
            answer, correct = grading.grade(text, gold)
            index = choice.get("index")
            row = {"prompt_id": prompt_id, "sample_index": index if isinstance(index, int) else i,
                   "completion": text, "answer": answer, "correct": correct,
                   "logprob_mean": sum(values) / len(values), "n_tokens": len(values),
                   "truncated": hit_token_limit(choice)}
            confidence = _token_confidence(choice)
            if confidence is not None:
                row["token_confidence"] = confidence
            yield where, row
    notes.extend(grading.note(path.name) + skips.note(path.name))
