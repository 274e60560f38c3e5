"""vLLM ``RequestOutput`` objects serialised as JSON Lines (one request per line), e.g. with
``dataclasses.asdict``-style dumps of ``LLM.generate``'s results.

Accepted line: ``{"request_id", "prompt", "outputs": [{"text", "token_ids", "cumulative_logprob", "logprobs",
"finish_reason"}, ...]}``. The mean token log-prob of an output is ``cumulative_logprob / len(token_ids)``; when
``cumulative_logprob`` is null it is read from ``logprobs`` (one entry per generated token: a map from token id,
as JSON writes it a string, to ``{"logprob", "rank", "decoded_token"}`` or to the log-prob itself; the sampled
token's entry is taken). Sampling parameters need ``logprobs=0`` or more.

The outputs of one line share a prompt id: ``prompt_id`` of the line or its ``metadata``, else a hash of
``prompt``, else ``request_id``. As with API responses, the gold answer must be in the line or its ``metadata``
(``gold`` / ``answer``, or ``label`` with ``classes``).

With ``SamplingParams(logprobs=k)``, k >= 1, each position's map holds the top k tokens (and the sampled one when it
is not among them); the row then gets DeepConf's ``token_confidence``: minus the mean of the map's log-probs, all
of its entries, as the authors' ``compute_confidence`` averages them. Maps of one entry (``logprobs=0``) give none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from calibrl.evaluation.readers.base import (Grading, Skips, as_float, fail, hit_token_limit, need_object, prompt_key,
                                             rows_jsonl)
from calibrl.selection.deepconf import token_confidence_from_top_logprobs


def _token_logprob(entry: Any, token: Any, where: str, field: str) -> float:
    """The sampled token's log-prob in one position's map ``{token id: Logprob or float}``."""
    if not isinstance(entry, dict) or str(token) not in {str(k) for k in entry}:
        raise fail(where, field, f"has no entry for the sampled token {token!r}")
    value = next(v for k, v in entry.items() if str(k) == str(token))
    return as_float(value.get("logprob") if isinstance(value, dict) else value, where, f"{field}.logprob")


def _logprob_mean(output: dict, where: str, field: str) -> tuple[float, int]:
    """(mean token log-prob, number of tokens) of one output."""
    token_ids = output.get("token_ids")
    if not isinstance(token_ids, list) or not token_ids:
        raise fail(where, f"{field}.token_ids", "missing or empty (the mean log-prob needs the token count)")
    if output.get("cumulative_logprob") is not None:
        total = as_float(output["cumulative_logprob"], where, f"{field}.cumulative_logprob")
        return total / len(token_ids), len(token_ids)
    logprobs = output.get("logprobs")
    if not isinstance(logprobs, list) or len(logprobs) != len(token_ids):
        raise fail(where, f"{field}.cumulative_logprob", "missing, and no logprobs entry per token (sample with "
                                                         "SamplingParams(logprobs=0))")
    values = [_token_logprob(entry, token, where, f"{field}.logprobs[{j}]")
              for j, (entry, token) in enumerate(zip(logprobs, token_ids))]
    return sum(values) / len(values), len(values)


def _token_confidence(output: dict, where: str, field: str) -> Any:
    """DeepConf's token confidence from each position's top-k map (None: no maps, or one entry each)."""
    logprobs = output.get("logprobs")
    if not isinstance(logprobs, list) or not any(isinstance(e, dict) and len(e) > 1 for e in logprobs):
        return None
    return token_confidence_from_top_logprobs(
        [[as_float(v.get("logprob") if isinstance(v, dict) else v, where, f"{field}.logprobs[{j}].logprob")
          for v in entry.values()] if isinstance(entry, dict) else [] for j, entry in enumerate(logprobs)])


def _prompt_id(raw: dict, where: str) -> str:
    """``prompt_id`` of the line or its metadata, else a hash of the prompt text, else ``request_id``."""
    for place in (raw, raw.get("metadata")):
        if isinstance(place, dict) and place.get("prompt_id") is not None:
            return str(place["prompt_id"])
    if raw.get("prompt") is not None:
        return prompt_key("vllm", raw["prompt"])
    if raw.get("request_id") is not None:
        return str(raw["request_id"])
    raise fail(where, "prompt_id", "missing (give prompt_id, prompt or request_id)")


def read(path: Path, notes: list[str], skips: Skips | None = None,
         grading: Grading | None = None) -> Iterator[tuple[str, dict]]:
    """calibrl rows (one per output) of serialised vLLM request outputs, graded against each line's gold; a request
    with an empty ``outputs`` list (it failed or was aborted) is left out and counted in ``skips`` (None: refused).
    Each output's ``index`` is its ``sample_index``."""
    skips = skips if skips is not None else Skips(strict=True)
    grading = grading if grading is not None else Grading()
    for lineno, raw in rows_jsonl(path):
        where = f"{path.name}:{lineno}"
        need_object(raw, where)
        outputs = raw.get("outputs")
        if isinstance(outputs, list) and not outputs:
            skips.skip(fail(where, "outputs", "missing or empty"), "request without outputs")
            continue
        if not isinstance(outputs, list):
            raise fail(where, "outputs", "missing or empty")
        prompt_id = _prompt_id(raw, where)
        gold = grading.gold([raw, raw.get("metadata")], [prompt_id, raw.get("request_id")], where)
        for i, output in enumerate(outputs):
            field = f"outputs[{i}]"
            if not isinstance(output, dict) or not isinstance(output.get("text"), str):
                raise fail(where, f"{field}.text", "missing")
            mean, n_tokens = _logprob_mean(output, where, field)
            answer, correct = grading.grade(output["text"], gold)
            index = output.get("index")
            row = {"prompt_id": prompt_id, "sample_index": index if isinstance(index, int) else i,
                   "completion": output["text"], "answer": answer,
                   "correct": correct, "logprob_mean": mean, "n_tokens": n_tokens,
                   "truncated": hit_token_limit(output)}
            confidence = _token_confidence(output, where, field)
            if confidence is not None:
                row["token_confidence"] = confidence
            yield where, row
    notes.extend(grading.note(path.name) + skips.note(path.name))
