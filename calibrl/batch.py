"""RolloutBatch: one row per sampled completion, the single input every advantage estimator reads.

Framework adapters (TRL, verl, the testbed) fill it; estimators in :mod:`calibrl.advantages` and the training
telemetry in :mod:`calibrl.metrics` read it. It is validated once, on construction, so an estimator can trust its
shapes and values.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

_INT_FIELDS = ("group_ids", "answer_ids", "lengths", "confidence_start")
_REQUIRED_FIELDS = ("rewards", "group_ids")


class RolloutBatchError(ValueError):
    """A RolloutBatch field has the wrong shape, dtype or values; the message names the field."""


def _to_tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
    else:
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise RolloutBatchError(f"RolloutBatch.{name}: cannot convert {type(value).__name__} to a tensor ({exc})") from exc
    if name in _INT_FIELDS:
        if tensor.is_floating_point():
            if not torch.equal(tensor, tensor.round()):
                raise RolloutBatchError(f"RolloutBatch.{name}: must hold integers, got non-integral floats")
            tensor = tensor.long()
        elif tensor.dtype == torch.bool:
            raise RolloutBatchError(f"RolloutBatch.{name}: must hold integers, got booleans")
        else:
            tensor = tensor.long()
    elif not tensor.is_floating_point():
        tensor = tensor.to(torch.get_default_dtype())
    return tensor


@dataclass
class RolloutBatch:
    """A batch of sampled completions, one row per completion. All tensors share the leading length N.

    Fields:
        rewards: [N] float. Scalar reward of each completion (binary 0/1 for verifiable tasks).
        group_ids: [N] int. The prompt each completion answers; completions of one prompt form a group.
            Ids need not be contiguous or sorted, and groups may differ in size.
        logprob_mean: [N] float, optional. Mean token log-probability of the completion under the rollout (old)
            policy, detached; ``-logprob_mean`` is the log-perplexity. Needed by confidence-aware estimators
            (capo, codapo, cde, seed_grpo) and by calibration telemetry.
        ref_logprob_mean: [N] float, optional. The same under the frozen reference model (CAPO's noise mask).
        embeddings: [N, D] float, optional. One embedding per completion (GCPO's geometry).
        answer_ids: [N] int, optional. Equal ids mean equivalent final answers (semantic clusters, voting).
        lengths: [N] int, optional. Number of completion tokens the loss trains on. A row with 0 (e.g. TRL's
            ``mask_truncated_completions``, verl's rejection sampling) has nothing to train on:
            :func:`calibrl.compute_advantages` gives it advantage 0 and leaves it out of every group statistic.

        stated_confidence: [N] float, optional. The confidence each completion states after its answer (RLCR's /
            DCPO's verbalised confidence), -1 where it states none (DCPO's convention).
        confidence_start: [N] int, optional. DCPO's split position: the token before the one where the stated
            confidence begins (at least 0), or the second-last token when none is stated.
        self_certainty: [N] float, optional. INTUITOR's self-certainty (arXiv 2505.19590): the mean over the
            completion's tokens of KL(uniform || next-token distribution) under the rollout policy
            (:mod:`calibrl.self_certainty`).

    ``rewards`` and ``group_ids`` are required; the other fields may be None.

    Construction converts lists and arrays to tensors, checks shapes, dtypes and finiteness, and raises
    :class:`RolloutBatchError` naming the field and the problem.
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    logprob_mean: torch.Tensor | None = None
    ref_logprob_mean: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None
    answer_ids: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    stated_confidence: torch.Tensor | None = None
    confidence_start: torch.Tensor | None = None
    self_certainty: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                if f.name in _REQUIRED_FIELDS:
                    raise RolloutBatchError(f"RolloutBatch.{f.name}: is required (one value per completion), got None")
                continue
            setattr(self, f.name, _to_tensor(f.name, value))
        self._validate()

    def _validate(self) -> None:
        n = None
        for f in fields(self):
            tensor = getattr(self, f.name)
            if tensor is None:
                continue
            expected_dim = 2 if f.name == "embeddings" else 1
            if tensor.dim() != expected_dim:
                shape = "[N, D]" if expected_dim == 2 else "[N]"
                raise RolloutBatchError(
                    f"RolloutBatch.{f.name}: expected shape {shape}, got {tuple(tensor.shape)}"
                )
            if n is None:
                n = tensor.shape[0]
            elif tensor.shape[0] != n:
                raise RolloutBatchError(
                    f"RolloutBatch.{f.name}: has {tensor.shape[0]} rows but rewards has {n}; every field needs one "
                    "row per completion"
                )
            if tensor.is_floating_point():
                bad = ~torch.isfinite(tensor)
                if bad.any():
                    row = int(bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()[0, 0])
                    raise RolloutBatchError(
                        f"RolloutBatch.{f.name}: {int(bad.sum())} non-finite value(s), first at row {row} "
                        f"({tensor.reshape(tensor.shape[0], -1)[row].tolist()})"
                    )
        if self.lengths is not None and (self.lengths < 0).any():
            raise RolloutBatchError("RolloutBatch.lengths: must be non-negative")
        if n == 0:
            raise RolloutBatchError("RolloutBatch.rewards: the batch is empty")

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def device(self) -> torch.device:
        return self.rewards.device

    def require(self, *names: str, estimator: str) -> None:
        """Raise a clear error if any of the optional fields ``names`` is missing for ``estimator``."""
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            hints = {
                "logprob_mean": "the mean token log-prob of each completion under the rollout policy",
                "ref_logprob_mean": "the mean token log-prob of each completion under the frozen reference model",
                "embeddings": "one embedding per completion, e.g. mean-pooled last hidden states",
                "answer_ids": "an integer id per completion, equal for equivalent final answers",
                "lengths": "the number of completion tokens",
                "stated_confidence": "the confidence each completion states, -1 where none",
                "confidence_start": "the token position where each completion's stated confidence begins",
                "self_certainty": "the mean over each completion's tokens of KL(uniform || next-token distribution)",
            }
            detail = "; ".join(f"{name} ({hints.get(name, '')})" for name in missing)
            raise RolloutBatchError(f"estimator {estimator!r} needs RolloutBatch field(s): {detail}")

    def to(self, device: torch.device | str) -> "RolloutBatch":
        """A copy with every tensor on ``device``."""
        kwargs = {f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device)) for f in fields(self)}
        return RolloutBatch(**kwargs)

    def select(self, keep: torch.Tensor) -> "RolloutBatch":
        """The rows where ``keep`` [N] bool is True, every field alike (e.g. the rows with ``lengths > 0``).

        Rows of a validated batch are valid, so the copy is not validated again (that would re-scan every
        embedding); keeping no row raises, as an empty batch does.
        """
        if not (isinstance(keep, torch.Tensor) and keep.dtype == torch.bool and keep.shape == (len(self),)):
            shape = tuple(keep.shape) if isinstance(keep, torch.Tensor) else type(keep).__name__
            raise RolloutBatchError(f"RolloutBatch.select: keep must be a bool mask of {len(self)} rows, got {shape}")
        rows = keep.to(self.device).nonzero().squeeze(1)
        if rows.numel() == 0:
            raise RolloutBatchError("RolloutBatch.select: keeps no row; the batch would be empty")
        out = object.__new__(RolloutBatch)
        for f in fields(self):
            value = getattr(self, f.name)
            setattr(out, f.name, None if value is None else value.index_select(0, rows))
        return out


def masked_row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` [N, T] over ``mask`` [N, T] per row -> [N] float32: how every engine adapter turns
    per-token log-probs into ``logprob_mean`` / ``ref_logprob_mean``. Masked-out entries are never read (a -inf
    or NaN pad is harmless); a row without tokens gives 0."""
    mask = mask.bool()
    summed = torch.where(mask, values.float(), torch.zeros((), dtype=torch.float32, device=values.device)).sum(-1)
    return summed / mask.sum(-1).clamp(min=1).to(summed.dtype)
