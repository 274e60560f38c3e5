"""Per-token log-probabilities without whole-vocabulary logits for a whole batch, under a memory budget.

A causal LM's forward over B sequences of L tokens returns logits [B, L, V]. At Qwen2.5's vocabulary
(V = 151,936) the float32 logits of ONE 4,096-token sequence take 2.5 GB, and ``log_softmax`` of them as much
again. The no-grad forwards calibrl runs beside TRL's loss pass (the rollout policy's log-probs when they were not
recorded during generation, the frozen reference of CAPO's noise mask: :mod:`calibrl.trl.rollout`) therefore take
the backbone's last hidden states [r, L, D] instead and project them through the LM head a chunk of positions at
a time, gathering the sampled token's log-probability in each chunk with TRL's ``selective_log_softmax``
(``log p(x_t) = z_t[x_t] - logsumexp(z_t)``, the logits ``z_t`` at the sampling temperature). Two numbers bound
the memory, both read off one budget (:data:`FORWARD_BUDGET_BYTES`, 256 MiB):

* :func:`positions_per_chunk`: positions whose logits are projected at once,
  ``floor(budget / (V * bytes * LOGIT_COPIES))``;
* :func:`rows_per_forward`: sequences per forward, ``floor(budget / (V * L * bytes))``: the rows whose whole
  logits WOULD fit the budget. The forward never builds them; the bound keeps what it does build (the hidden states
  [r, L, D] with D << V, the layers' activations) well inside the budget, and one row is the least.

TRL's own loss pass needs no such care on a GPU: its fused LM head (``add_fused_lm_head``) projects
[4,096 positions x 32,768 vocabulary entries] tiles and folds each into running log-sum-exp statistics in a Triton
kernel. Without Triton (the CPU) the fold is torch operations that hold about :data:`FUSED_FOLD_COPIES` tile-sized
temporaries at once (the backward's more than the forward's): 4.3 GB at float32 for a full tile.
:func:`fused_head_tile_tokens` is the number of positions per tile that keeps them inside the budget, and
:func:`fused_head_tile` sets it while a block runs (``CalibratedGRPOTrainer.training_step`` on such devices).
The tile changes which positions share a matrix product, not what is computed for each.

Attention over L positions is the model's business: an implementation that materialises the [heads, L, L] scores
(eager attention) costs heads * L^2 * 4 bytes per row whatever the budget says.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

__all__ = [
    "FORWARD_BUDGET_BYTES",
    "FUSED_FOLD_COPIES",
    "LOGIT_COPIES",
    "chunked_token_confidence",
    "chunked_token_logps",
    "confidence_with_sampled",
    "fused_head_tile",
    "fused_head_tile_tokens",
    "positions_per_chunk",
    "rows_per_forward",
]

FORWARD_BUDGET_BYTES = 256 * 2**20  # the default memory budget of one chunk of logits / one forward's rows
LOGIT_COPIES = 3  # [n, V] tensors alive at once per chunk: the projection, its post-processed / scaled copy, one temp
FUSED_FOLD_COPIES = 8  # tile-sized tensors alive at once in TRL 1.16's torch fold of a fused-head tile (backward)


def positions_per_chunk(*, vocab_size: int, budget_bytes: int = FORWARD_BUDGET_BYTES, bytes_per_value: int = 4,
                        copies: int = LOGIT_COPIES) -> int:
    """Positions whose logits are projected at once: ``max(1, floor(budget / (V * bytes * copies)))``.

    Args:
        vocab_size: V, the LM head's output width.
        budget_bytes: the memory the chunk's ``copies`` [n, V] tensors may take.
        bytes_per_value: 4 (float32: the log-softmax runs in float32 whatever the model's dtype).
        copies: [n, V] tensors alive at once (:data:`LOGIT_COPIES`).
    """
    _check_positive(vocab_size=vocab_size, budget_bytes=budget_bytes, bytes_per_value=bytes_per_value, copies=copies)
    return max(1, budget_bytes // (vocab_size * bytes_per_value * copies))


def rows_per_forward(*, vocab_size: int, seq_len: int, budget_bytes: int = FORWARD_BUDGET_BYTES,
                     bytes_per_value: int = 4, limit: int | None = None) -> int:
    """Sequences per forward: ``max(1, floor(budget / (V * L * bytes)))``, at most ``limit`` (the caller's own
    batch size) when given: the rows whose whole-vocabulary logits [r, L, V] would fit the budget.

    Example: SmolLM2 (V = 49,152), 100-token sequences, float32, 256 MiB: 13 rows; Qwen2.5 (V = 151,936) and
    4,112-token sequences: 1 row.
    """
    _check_positive(vocab_size=vocab_size, seq_len=seq_len, budget_bytes=budget_bytes,
                    bytes_per_value=bytes_per_value)
    rows = max(1, budget_bytes // (vocab_size * seq_len * bytes_per_value))
    return rows if limit is None else max(1, min(rows, int(limit)))


def fused_head_tile_tokens(*, vocab_chunk: int, budget_bytes: int = FORWARD_BUDGET_BYTES,
                           bytes_per_value: int = 4, copies: int = FUSED_FOLD_COPIES) -> int:
    """Positions per tile of TRL's fused LM head whose torch fold fits the budget:
    ``max(1, floor(budget / (vocab_chunk * bytes * copies)))`` (``vocab_chunk``: the tile's vocabulary width,
    32,768 in TRL 1.16). Example: 256 MiB, float32: 256 positions (TRL's own tile: 4,096)."""
    return positions_per_chunk(vocab_size=vocab_chunk, budget_bytes=budget_bytes, bytes_per_value=bytes_per_value,
                               copies=copies)


HEAP_RETURN_THRESHOLD_BYTES = 128 * 2**10  # glibc's default M_MMAP_THRESHOLD / M_TRIM_THRESHOLD, held fixed
_HEAP_BOUNDED = False


def bound_heap_cache(*, threshold_bytes: int = HEAP_RETURN_THRESHOLD_BYTES) -> bool:
    """Hold glibc's malloc to returning freed memory to the system (process-wide; once per process).

    glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes by ``mmap`` (given back on free), but after the first
    such block is freed it raises the threshold to that block's size (up to 32 MiB), so the next ones come from the
    heap, whose freed space it keeps (``M_TRIM_THRESHOLD`` rises with it). A CPU training step allocates and frees
    many megabyte-sized temporaries, and the heap kept them: one step of the real-model demo peaked at 3.7 GB of
    resident memory, 1.6 GB with both thresholds fixed at 128 KiB (docs/realmodel.md). The numbers computed do not
    change. Setting them (``mallopt``) also stops glibc from raising them. Left alone when ``MALLOC_MMAP_THRESHOLD_``
    or ``MALLOC_TRIM_THRESHOLD_`` is set, or on a C library without ``mallopt``. Returns whether it set them.
    """
    global _HEAP_BOUNDED
    import ctypes
    import ctypes.util
    import os

    if _HEAP_BOUNDED or "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mmap_set = bool(mallopt(m_mmap_threshold, threshold_bytes))
    _HEAP_BOUNDED = mmap_set and bool(mallopt(m_trim_threshold, threshold_bytes))
    return _HEAP_BOUNDED


@contextmanager
def fused_head_tile(device: torch.device, *, budget_bytes: int = FORWARD_BUDGET_BYTES) -> Iterator[int | None]:
    """While active, TRL's fused LM head projects :func:`fused_head_tile_tokens` positions per tile on ``device``
    when that device has no Triton kernel (the CPU), and keeps its own tile otherwise (the GPU: nothing changes).
    Yields the tile's positions, or None when it was left alone. Restores TRL's value on exit."""
    import trl.trainer.utils as trl_utils
    from trl.kernels import chunked_logprob

    vocab_chunk = getattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", None)
    before = getattr(chunked_logprob, "TOKEN_CHUNK_SIZE", None)
    if vocab_chunk is None or before is None or chunked_logprob._use_triton(torch.device(device)):
        yield None
        return
    bound_heap_cache()  # the CPU step's freed temporaries go back to the system (no number changes)
    tokens = min(before, fused_head_tile_tokens(vocab_chunk=vocab_chunk, budget_bytes=budget_bytes))
    chunked_logprob.TOKEN_CHUNK_SIZE = tokens
    try:
        yield tokens
    finally:
        chunked_logprob.TOKEN_CHUNK_SIZE = before


def chunked_token_logps(hidden: torch.Tensor, targets: torch.Tensor, *,
                        project: Callable[[torch.Tensor], torch.Tensor], temperature: float = 1.0,
                        chunk: int) -> torch.Tensor:
    """``log softmax(project(hidden) / T)[targets]``, ``chunk`` positions at a time.

    Args:
        hidden: [N, D] hidden states, each predicting one token.
        targets: [N] the token ids whose log-probabilities are read.
        project: [n, D] -> [n, V] the model's logits (LM head and its post-processing) of a chunk.
        temperature: T > 0 (TRL's ``selective_log_softmax`` divides by it).
        chunk: positions per projection (:func:`positions_per_chunk`).

    Returns:
        [N] float32 log-probabilities; equal, to float rounding, to ``log_softmax(logits / T, -1).gather(...)`` of
        the whole [N, V] logits, which are never built.
    """
    from trl.trainer.utils import selective_log_softmax

    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"chunked_token_logps: hidden must be [N, D] and targets [N]; got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    if chunk < 1:
        raise ValueError(f"chunked_token_logps: chunk must be >= 1, got {chunk}")
    out = torch.empty(hidden.size(0), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.size(0), chunk):
        end = min(start + chunk, hidden.size(0))
        logits = project(hidden[start:end]).float()  # [n, V]
        out[start:end] = selective_log_softmax(logits, targets[start:end].to(logits.device), temperature=temperature)
    return out


def chunked_token_confidence(hidden: torch.Tensor, *, project: Callable[[torch.Tensor], torch.Tensor], k: int,
                             temperature: float = 1.0, chunk: int, return_parts: bool = False):
    """DeepConf's token confidence ``C_i = -(1/k) sum_{j<=k} log p_i(j)`` over each position's k most probable
    tokens, ``chunk`` positions at a time (:mod:`calibrl.selection.deepconf` reads the trace signals off it).

    ``log p_i(j) = z_i(j) - logsumexp(z_i)`` with ``z_i = project(hidden_i) / T``, so
    ``C_i = logsumexp(z_i) - mean_j z_i(j)``: a top-k of the logits and one log-sum-exp per chunk; no
    log-softmax copy of the chunk is made and no [N, V] tensor is built.

    Args:
        hidden: [N, D] what ``project`` maps to logits (hidden states; or, with ``project`` the identity, the
            [N, V] logits of one generation step, which the model has already built).
        project: [n, D] -> [n, V] logits of a chunk.
        k: 1 <= k <= V, top log-probs averaged (DeepConf: 20).
        temperature: T > 0 (the distribution the confidence is read from; DeepConf's authors read it at 1, before
            their sampling temperature).
        chunk: positions per projection (:func:`positions_per_chunk`).
        return_parts: also return, per position, the ids of its k most probable tokens and ``logsumexp(z_i)``,
            with which :func:`confidence_with_sampled` adds the sampled token once it is known.

    Returns:
        [N] float32 C_i >= 0 (0 only for a one-hot distribution with k = 1); with ``return_parts``,
        ``(C [N], top-k token ids [N, k] long, logsumexp(z) [N])``.
    """
    if hidden.dim() != 2:
        raise ValueError(f"chunked_token_confidence: hidden must be [N, D]; got {tuple(hidden.shape)}")
    _check_positive(k=k, chunk=chunk)
    if not temperature > 0:
        raise ValueError(f"chunked_token_confidence: temperature must be > 0, got {temperature}")
    out = torch.empty(hidden.size(0), dtype=torch.float32, device=hidden.device)
    top_ids = torch.empty((hidden.size(0), k), dtype=torch.long, device=hidden.device) if return_parts else None
    lse_all = torch.empty_like(out) if return_parts else None
    for start in range(0, hidden.size(0), chunk):
        end = min(start + chunk, hidden.size(0))
        logits = project(hidden[start:end]).float()  # [n, V]
        if temperature != 1.0:
            logits = logits / temperature
        if k > logits.size(-1):
            raise ValueError(f"chunked_token_confidence: k = {k} exceeds the vocabulary ({logits.size(-1)})")
        top = logits.topk(k, dim=-1)  # [n, k], largest first
        lse = torch.logsumexp(logits, dim=-1)
        out[start:end] = lse - top.values.mean(dim=-1)
        if return_parts:
            top_ids[start:end] = top.indices
            lse_all[start:end] = lse
    return (out, top_ids, lse_all) if return_parts else out


def confidence_with_sampled(confidence: torch.Tensor, top_ids: torch.Tensor, sampled: torch.Tensor,
                            sampled_logp: torch.Tensor, *, k: int) -> torch.Tensor:
    """DeepConf's C_i as the authors compute it from vLLM's returned log-probs (``deepconf/utils.py``
    ``compute_confidence``: minus the mean of EVERY returned entry), where vLLM returns the top k and, when the
    sampled token is not among them, the sampled token as well: ``C`` (top-k only, :func:`chunked_token_confidence`)
    where the sampled token is one of ``top_ids``, else ``(k C - sampled_logp) / (k + 1)``.

    ``confidence`` [N] C_i of the top k, ``top_ids`` [N, k] their token ids, ``sampled`` [N] the sampled token ids,
    ``sampled_logp`` [N] its log-probability under the same distribution. Membership is decided by token id, not
    by comparing log-probabilities (two roundings of one value could disagree)."""
    inside = (top_ids == sampled.reshape(-1, 1).to(top_ids.device)).any(dim=-1)
    return torch.where(inside, confidence, (k * confidence - sampled_logp) / (k + 1))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
