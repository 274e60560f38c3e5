"""GCPO (geometry-aware calibrated policy optimisation, arXiv 2605.21801) and SEED-GRPO (arXiv 2505.12346).

Both scale each prompt group's GRPO advantages by a function of how much the group's responses disagree.

SEED-GRPO, as written: A_i' = A_i * f(alpha * SE(q) / SE_max(q)), SE = semantic entropy of the group's responses
(clusters = equivalent final answers, p(c) = sum of the members' sequence probabilities, normalised over the
group), SE_max = log G. A public reimplementation uses f(x) = 1 / (1 + x), i.e. A_i / (1 + alpha/log G * SE).
The base advantage A_i is the Dr.GRPO one, r_i - mean_g(r) (paper and released code), and alpha (about 0.042
there) multiplies the raw SE before the division by SE_max = log G. What we implement, by default
(``base="dr_grpo"``, ``alpha=0.042``, ``f="inverse"``):
    A_i' = (r_i - mean_g(r)) * f(x),   x = alpha * SE(q) / log G
(SE <= log G, so x <= alpha and, with "inverse", the scale stays in [1/(1 + alpha), 1] = [0.96, 1]: a gentle
modulation of an unnormalised base). ``base="grpo"`` keeps the earlier std-normalised base (r_i - mean_g(r)) /
(std_g(r) + eps) (Bessel std, as :func:`calibrl.advantages.grpo.grpo_advantages`); with ``alpha=1.0`` that is
calibrl's earlier default.
Our readings:
- sequence probability = exp(lpm), lpm = mean token log-prob (``RolloutBatch.logprob_mean``): the only
  per-sequence score a RolloutBatch carries, and the length-normalised likelihood semantic entropy uses (Kuhn et
  al. 2023); exp(sum of token log-probs) would make every long response's mass vanish next to short ones. So
  p(c) = sum_{i in c} exp(lpm_i) / sum_{i in group} exp(lpm_i) (a softmax of lpm over the group).
- without ``logprob_mean`` every response counts 1 (p(c) = |c| / G: the "discrete semantic entropy" of Farquhar
  et al. 2024).
- ``f="inverse"`` (default, the reimplementation's 1/(1 + x)), ``"linear"`` (max(0, 1 - x)), ``"exp"`` (exp(-x)).
  (alpha = 1.0 would scale from 1 for unanimous groups down to 1/2 for maximal entropy with "inverse".)
- groups of size 1 have SE = SE_max = 0: scale 1.
- a negative answer id means "no extractable answer": such a response is a cluster of its own (two unanswered
  responses are not the same answer), as in SEED-GRPO, where a response without an answer is its own cluster.

GCPO, what is public: semantic entropy has an anisotropic gap (it ignores how far apart and in which directions
responses disagree) and a calibration gap (uncertainty is not aligned with how much learnable signal the rewards
carry); GCPO measures disagreement geometrically (Cosine Dispersion, Barycentric Transport over response
embeddings), calibrates it with Reward Dispersion, and modulates each group's update. The exact formulas are not
public to us; OUR READING, per group of G responses with embeddings e_i [D]:
- u_i = e_i / ||e_i|| (optionally after subtracting the batch-mean embedding, ``center="batch"`` (or True),
  which removes the common component mean-pooled hidden states share; only meaningful with many prompts per
  batch).
- CD = 1 - || (1/G) sum_i u_i ||                                              in [0, 1]
- BoT = sum_i w_i || u_i - b ||^2, b = sum_i w_i u_i, w = softmax over the group of lpm (uniform without
  ``logprob_mean``)                                                           in [0, 1] (= 1 - ||b||^2)
- RD = population std of the group's rewards, rd = clamp(RD / rd_scale, 0, 1); rd_scale = 0.5 is the largest
  std a {0, 1} reward can have, so rd = 1 for a half-right group.
- D = CD (``measure="cosine"``) or BoT (``measure="barycentric"``), clamped to [0, 1].
- scale = 1 - strength * D * (1 - rd) in [1 - strength, 1]: monotone non-increasing in D, non-decreasing in RD;
  high disagreement with high reward dispersion is informative and kept (scale -> 1), high disagreement with
  little reward signal is noise and damped (scale -> 1 - strength), low disagreement leaves GRPO unchanged.
- A_i' = scale_g * A_i(grpo).

That default reading is nearly inert in practice: D is close to 0 for un-centred mean-pooled hidden states (they
share a large common component, so their unit vectors nearly coincide), and for a group of 8 with {0, 1} rewards
every mixed group has rd >= 2 sqrt(7/64) = 0.66, so scale >= 1 - 0.5 * 0.34 = 0.83 whatever D is (groups that are
not mixed have A = 0 anyway). Two options make the modulation act, both off by default:
- ``center="batch"``: u_i from e_i - mean_batch(e). D is then invariant to a vector added to every embedding.
  (Whitening is not offered: with N <= dim + 1 samples, whitening the centred embeddings maps them onto a regular
  simplex, so every group would have the same dispersion.)
- ``standardize=True``: the damping evidence is compared across the groups of the batch instead of read on an
  absolute scale:
      u_g   = D_g * (1 - rd_g)                          (the default reading's damping evidence)
      z_g   = (u_g - mean_M(u)) / (std_M(u) + 1e-8)     M = the batch's mixed groups (rd > 1e-6), population std;
                                                        z = 0 outside M, or when M has fewer than 2 groups
      scale = 1 - strength * sigmoid(z_g)               in (1 - strength, 1)
  Groups with more RD-unexplained disagreement than the batch's other mixed groups are damped more (order
  preserved: scale is decreasing in u_g); a group at the batch average gets 1 - strength / 2. Only the mixed
  groups enter the statistics, since only their advantages are non-zero. The factor common to all groups (about
  1 - strength / 2) changes the step size as a learning-rate factor would; the ranking is the signal.

Shapes: rewards, group_index, logprob_mean, answer_ids [N]; embeddings [N, D]; outputs [N] in the rewards dtype.
Vectorised with segment sums (``_groups``) and, for gcpo, one batched matmul over a padded [groups, G_max, D]
layout of the embeddings; no Python loop over groups.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from calibrl.advantages._groups import dense_group_index, group_count, segment_sum
from calibrl.advantages.capo import group_layout, padded_layout
from calibrl.advantages.grpo import grpo_advantages
from calibrl.advantages.registry import register_estimator
from calibrl.batch import RolloutBatch

_SEED_F = ("inverse", "linear", "exp")
_SEED_BASES = ("dr_grpo", "grpo")
_MEASURES = ("cosine", "barycentric")
_CENTERS = ("none", "batch")


def group_softmax(scores: torch.Tensor, group_index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Softmax of ``scores`` [N] within each group -> [N] (sums to 1 per group); stable for scores of +-1e4."""
    gmax = torch.full((n_groups,), -math.inf, dtype=scores.dtype, device=scores.device)
    gmax = gmax.scatter_reduce(0, group_index, scores, reduce="amax", include_self=True)
    w = torch.exp(scores - gmax[group_index])
    return w / segment_sum(w, group_index, n_groups)[group_index]


def unanswered_as_singletons(answer_ids: torch.Tensor) -> torch.Tensor:
    """answer_ids [N] with every negative id ("no extractable answer") replaced by an id of its own -> [N] long.

    Non-negative ids keep their equalities (all ids are made dense, 0..K-1, when some id is negative); each
    negative row gets K + its row number, so no two unanswered responses share a cluster, nor one with an answer.
    """
    missing = answer_ids < 0
    if not bool(missing.any()):
        return answer_ids
    _, dense = torch.unique(answer_ids, return_inverse=True)  # dense ids of all values, negatives included
    fresh = int(dense.max()) + 1 + torch.arange(answer_ids.numel(), device=answer_ids.device)
    return torch.where(missing, fresh, dense)


def semantic_entropy(*, group_index: torch.Tensor, n_groups: int, answer_ids: torch.Tensor,
                     logprob_mean: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Semantic entropy per group -> [n_groups]: SE = -sum_c p(c) log p(c), clusters = equal answer_ids within
    a group, p(c) = softmax-of-lpm mass of the cluster (count share without logprob_mean). A negative answer id
    (no answer) is a cluster of its own (:func:`unanswered_as_singletons`)."""
    if logprob_mean is not None:
        w = group_softmax(logprob_mean.to(dtype), group_index, n_groups)
    else:
        count = group_count(group_index, n_groups, dtype)
        w = 1.0 / count[group_index]
    answer_ids = unanswered_as_singletons(answer_ids)
    lo, hi = int(answer_ids.min()), int(answer_ids.max())
    if (hi - lo + 1) * max(n_groups, 1) < 2**62:  # offset the ids: one sort instead of two
        answer_dense, n_answers = answer_ids - lo, hi - lo + 1
    else:  # ids spread too wide (e.g. hashes): make them dense first
        _, answer_dense = torch.unique(answer_ids, return_inverse=True)
        n_answers = int(answer_dense.max().item()) + 1
    keys, cluster = torch.unique(group_index * n_answers + answer_dense, return_inverse=True)
    cluster_group = torch.div(keys, n_answers, rounding_mode="floor")
    p = segment_sum(w, cluster, keys.numel())  # [n_clusters], sums to 1 per group
    return -segment_sum(torch.special.xlogy(p, p), cluster_group, n_groups)


def seed_grpo_advantages(*, rewards: torch.Tensor, group_index: torch.Tensor, n_groups: int,
                         answer_ids: torch.Tensor, logprob_mean: torch.Tensor | None = None, alpha: float = 0.042,
                         f: str = "inverse", base: str = "dr_grpo",
                         eps: float = 1e-4) -> tuple[torch.Tensor, dict[str, Any]]:
    """SEED-GRPO: A_i' = A_i * f(alpha * SE / log G) (see the module docstring).

    ``base="dr_grpo"`` (default, the paper's and its code's): A_i = r_i - mean_g(r); ``base="grpo"``:
    A_i = (r_i - mean_g(r)) / (std_g(r) + eps) (``eps`` is read only there). alpha = 0.042 multiplies the raw
    SE, before the division by log G. Negative ``answer_ids`` = no answer = a cluster of its own.
    rewards, group_index, answer_ids, logprob_mean [N] -> (advantages [N] in the rewards dtype, info).
    """
    if f not in _SEED_F:
        raise ValueError(f"seed_grpo: f must be one of {_SEED_F}, got {f!r}")
    if base not in _SEED_BASES:
        raise ValueError(f"seed_grpo: base must be one of {_SEED_BASES}, got {base!r}")
    if not (alpha >= 0 and math.isfinite(alpha)):
        raise ValueError(f"seed_grpo: alpha must be a non-negative finite number, got {alpha!r}")
    work = torch.promote_types(rewards.dtype, torch.float32)
    se = semantic_entropy(group_index=group_index, n_groups=n_groups, answer_ids=answer_ids,
                          logprob_mean=logprob_mean, dtype=work)  # [n_groups]
    se_max = torch.log(group_count(group_index, n_groups, work))  # log G; 0 for singletons
    x = alpha * torch.where(se_max > 0, se / se_max.clamp_min(1e-12), torch.zeros_like(se))
    if f == "inverse":
        scale = 1.0 / (1.0 + x)
    elif f == "linear":
        scale = (1.0 - x).clamp_min(0.0)
    else:
        scale = torch.exp(-x)
    base_adv = grpo_advantages(rewards=rewards.to(work), group_index=group_index, n_groups=n_groups,
                               scale=base == "grpo", eps=eps)
    advantages = (base_adv * scale[group_index]).to(rewards.dtype)
    present = se_max >= 0  # log(count) is -inf for empty groups
    info = {"semantic_entropy_mean": float(se[present].mean()), "scale_mean": float(scale[present].mean())}
    return advantages, info


def standardized_damping(*, evidence: torch.Tensor, members: torch.Tensor, strength: float) -> torch.Tensor:
    """GCPO ``standardize=True`` (our reading): scale_g = 1 - strength * sigmoid(z_g), z_g = (u_g - mean_M(u)) /
    (std_M(u) + 1e-8) with u = ``evidence`` [n_groups] (D * (1 - rd)) and M = ``members`` [n_groups] bool (the
    mixed groups), population std; z = 0 outside M and when M has fewer than 2 groups. -> scale [n_groups] in
    (1 - strength, 1), decreasing in u within M."""
    m = members.to(evidence.dtype)
    n = m.sum()
    if float(n) < 2:
        z = torch.zeros_like(evidence)
    else:
        mean = (evidence * m).sum() / n
        std = (((evidence - mean) ** 2) * m).sum().div(n).sqrt()
        z = torch.where(members, (evidence - mean) / (std + 1e-8), torch.zeros_like(evidence))
    return 1.0 - strength * torch.sigmoid(z)


def gcpo_advantages(*, rewards: torch.Tensor, group_index: torch.Tensor, n_groups: int, embeddings: torch.Tensor,
                    logprob_mean: torch.Tensor | None = None, measure: str = "cosine", strength: float = 0.5,
                    rd_scale: float = 0.5, center: bool | str = False, standardize: bool = False, eps: float = 1e-4,
                    layout: tuple[torch.Tensor, torch.Tensor, int] | None = None, group_values: bool = False
                    ) -> tuple[torch.Tensor, dict[str, Any]]:
    """GCPO (our reading, see the module docstring): GRPO advantage * (1 - strength * D * (1 - rd)), or with
    ``standardize=True`` * (1 - strength * sigmoid(z-score over the batch's mixed groups of D * (1 - rd))).

    ``group_values=True`` adds ``info["groups"]``: the per-group tensors ``cd``, ``bot``, ``rd`` (population
    std of the rewards) and ``scale``, each [n_groups] (``studies/gcpo_gradients.py`` correlates them with the
    groups' gradient variance).

    ``center``: False / "none" (default: raw embeddings) or True / "batch" (subtract the batch-mean embedding).
    ``layout`` = (slot, counts, g_max) from :func:`calibrl.advantages.capo.group_layout` (saves a sort).

    rewards, group_index, logprob_mean [N]; embeddings [N, D]
    -> (advantages [N] in the rewards dtype, info with mean CD, BoT, RD and scale over groups).
    """
    if measure not in _MEASURES:
        raise ValueError(f"gcpo: measure must be one of {_MEASURES}, got {measure!r}")
    if isinstance(center, bool):
        center = "batch" if center else "none"
    if center not in _CENTERS:
        raise ValueError(f"gcpo: center must be one of {_CENTERS} (or a bool), got {center!r}")
    if not isinstance(standardize, bool):
        raise ValueError(f"gcpo: standardize must be a bool, got {standardize!r}")
    if not (0.0 <= strength <= 1.0):
        raise ValueError(f"gcpo: strength must lie in [0, 1] (the scale stays in [1 - strength, 1]), got {strength!r}")
    if not rd_scale > 0:
        raise ValueError(f"gcpo: rd_scale must be > 0, got {rd_scale!r}")
    work = torch.promote_types(torch.promote_types(rewards.dtype, embeddings.dtype), torch.float32)
    emb = embeddings.to(work)
    if center == "batch":
        emb = emb - emb.mean(0, keepdim=True)
    norm = torch.linalg.vector_norm(emb, dim=1)  # [N]
    nonzero = norm > 0
    inv_norm = torch.where(nonzero, 1.0 / norm.clamp_min(torch.finfo(work).tiny), torch.zeros_like(norm))
    slot, counts, g_max = layout if layout is not None else padded_layout(group_index, n_groups)
    count = counts.to(work)  # [n_groups]
    n, dim = emb.shape
    contiguous = n == n_groups * g_max and torch.equal(slot, torch.arange(n, device=slot.device))
    if logprob_mean is not None:
        if contiguous:  # the batch is the grid: a plain row softmax
            w = torch.softmax(logprob_mean.to(work).view(n_groups, g_max), dim=1).view(-1)
        else:
            w = group_softmax(logprob_mean.to(work), group_index, n_groups)
    else:
        w = 1.0 / count[group_index]

    # Both per-group sums of unit vectors, sum_i u_i / G and b = sum_i w_i u_i, in one batched matmul over the
    # embeddings laid out as a padded [n_groups, G_max, D] grid (a view, no copy, when the batch already holds
    # its groups contiguously with equal sizes, as TRL and verl do).
    coef = torch.stack([inv_norm / count[group_index], w * inv_norm], 1)  # [N, 2]
    if contiguous:
        grid, coef_grid = emb.view(n_groups, g_max, dim), coef.view(n_groups, g_max, 2)
    elif n == n_groups * g_max:  # equal sizes, rows shuffled: slot is a permutation; a row gather beats a scatter
        order = torch.empty_like(slot)
        order[slot] = torch.arange(n, device=slot.device)
        grid = emb.index_select(0, order).view(n_groups, g_max, dim)
        coef_grid = coef.index_select(0, order).view(n_groups, g_max, 2)
    else:
        grid = emb.new_zeros(n_groups * g_max, dim).index_copy_(0, slot, emb).view(n_groups, g_max, dim)
        coef_grid = coef.new_zeros(n_groups * g_max, 2).index_copy_(0, slot, coef).view(n_groups, g_max, 2)
    sums = torch.bmm(coef_grid.transpose(1, 2).contiguous(), grid)  # [n_groups, 2, D]
    mean_unit, bary = sums[:, 0], sums[:, 1]
    cd = (1.0 - torch.linalg.vector_norm(mean_unit, dim=1)).clamp(0.0, 1.0)
    # sum_i w_i ||u_i - b||^2 = sum_i w_i ||u_i||^2 - ||b||^2 (weights sum to 1); ||u_i||^2 is 1, or 0 for e_i = 0
    bot = (segment_sum(w * nonzero.to(work), group_index, n_groups) - (bary * bary).sum(1)).clamp(0.0, 1.0)

    # GRPO advantage and RD share one pass: same arithmetic as grpo_advantages (Bessel std, + eps)
    r = rewards.to(work)
    mean = segment_sum(r, group_index, n_groups) / count
    centred = r - mean[group_index]
    sq = segment_sum(centred * centred, group_index, n_groups)
    rd = (sq / count).clamp_min(0.0).sqrt()  # population std
    std = (sq / (count - 1.0).clamp_min(1.0)).clamp_min(0.0).sqrt()
    base = centred / (std[group_index] + eps)
    rd_n = (rd / rd_scale).clamp(0.0, 1.0)
    disagreement = cd if measure == "cosine" else bot
    present = count > 0  # a caller-provided n_groups may include empty groups
    if standardize:
        scale = standardized_damping(evidence=disagreement * (1.0 - rd_n), members=present & (rd_n > 1e-6),
                                     strength=strength)
    else:
        scale = 1.0 - strength * disagreement * (1.0 - rd_n)

    advantages = (base * scale[group_index]).to(rewards.dtype)
    info = {"cd_mean": float(cd[present].mean()), "bot_mean": float(bot[present].mean()),
            "rd_mean": float(rd[present].mean()), "scale_mean": float(scale[present].mean())}
    if group_values:
        info["groups"] = {"cd": cd, "bot": bot, "rd": rd, "scale": scale}
    return advantages, info


@register_estimator("seed_grpo", inputs={"logprob_mean", "answer_ids"})
def seed_grpo(batch: RolloutBatch, *, alpha: float = 0.042, f: str = "inverse", base: str = "dr_grpo",
              eps: float = 1e-4) -> tuple[torch.Tensor, dict[str, Any]]:
    """Registered ``seed_grpo`` (see :func:`seed_grpo_advantages`). Needs ``answer_ids`` (-1: no answer, a
    cluster of its own); uses ``logprob_mean`` when present (count-based otherwise)."""
    batch.require("answer_ids", estimator="seed_grpo")
    index, n_groups = dense_group_index(batch.group_ids)
    return seed_grpo_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups,
                                answer_ids=batch.answer_ids, logprob_mean=batch.logprob_mean, alpha=alpha, f=f,
                                base=base, eps=eps)


@register_estimator("gcpo", inputs={"logprob_mean", "embeddings"}, fields={"measure": "gcpo_measure"})
def gcpo(batch: RolloutBatch, *, measure: str = "cosine", strength: float = 0.5, rd_scale: float = 0.5,
         center: bool | str = False, standardize: bool = False,
         eps: float = 1e-4) -> tuple[torch.Tensor, dict[str, Any]]:
    """Registered ``gcpo`` (see :func:`gcpo_advantages`). Needs ``embeddings``; uses ``logprob_mean`` for the
    barycentre weights when present. ``center="batch"`` and ``standardize=True`` are the options that make the
    modulation act on real hidden states (module docstring); the defaults keep the first reading."""
    batch.require("embeddings", estimator="gcpo")
    index, n_groups, slot, counts, g_max = group_layout(batch.group_ids)
    return gcpo_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups, embeddings=batch.embeddings,
                           logprob_mean=batch.logprob_mean, measure=measure, strength=strength, rd_scale=rd_scale,
                           center=center, standardize=standardize, eps=eps, layout=(slot, counts, g_max))
