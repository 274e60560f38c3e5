"""CAPO: Calibration-Aware Policy Optimization (ACL 2026, arXiv 2604.12632).

The paper's argument: GRPO's reward-only advantage is the gradient of the pairwise ranking surrogate phi(t) = -t,
which is not AUC-consistent, so RL raises accuracy while the AUROC of the model's own confidence (perplexity)
against correctness falls. CAPO swaps in the logistic surrogate phi_tau(t) = log(1 + exp(-t / tau)), whose
derivative phi_tau'(t) = -(1/tau) * sigmoid(-t / tau) weights every (correct, incorrect) pair of a group by how
badly the pair is ranked. As written (per group of G samples with binary reward, lpm = mean token log-prob):

    correct i:    A_i = (1/tau) * sum_{incorrect j} sigmoid((lpm_j - lpm_i) / tau)
    incorrect j:  A_j = -(1/tau) * sum_{correct i} sigmoid((lpm_j - lpm_i) / tau)
    all-correct or all-wrong group: A = 0 (no pairs)

then multiplied by a noise mask m from the frozen reference model, PPL_ref(o) = exp(-mean token log-prob under
the reference): m = 1[PPL_ref <= ref_high] for correct samples ("lucky guesses" dropped) and m = 1[PPL_ref >=
ref_low] for incorrect ones ("near misses" dropped); ref_high = 2.5, ref_low = 1.05 for Qwen2.5-Math, described as
the quartiles of the reference perplexity distribution.

Our readings (documented, configurable):
- lpm is the token-MEAN log-probability under the rollout (old) policy, detached (``RolloutBatch.logprob_mean``);
  -lpm is the log-perplexity. This is the definition under which the GRPO pairwise identity below holds.
- The normaliser is not published. ``normalize="group"`` (default) divides by tau * G (G = that group's size),
  so that replacing sigmoid(.) by 1/2 (tau -> infinity) gives exactly A_i * 2 * tau = r_i - mean_g(r), i.e.
  Dr.GRPO; ``"pairs"`` divides by tau * n_correct * n_wrong; ``"none"`` by tau only.
- "Correct" means reward > ``threshold`` (0.5), so 0/1 rewards and rewards in [0, 1] both work.
- Masked samples get advantage 0 but still count as the opponents of the other samples in their group (the mask
  multiplies the final advantage, as in the paper: m(o_i) * A_i).
- ``mask="quantile"`` (the paper's thresholds, made portable): ref_high / ref_low are the PPL_ref quantiles
  (``ref_high_quantile`` = 0.75, ``ref_low_quantile`` = 0.25) of the FIRST rollouts, estimated once and then
  frozen, so the dropped fraction varies from batch to batch as in the paper (fixed 2.5 / 1.05). The freezing
  state is not in this pure function: :class:`FrozenQuantileMask`, owned by the engine adapter (the TRL trainer,
  which saves it in its checkpoints; the verl plugin), estimates the quantiles from the first
  ``ref_quantile_batches`` batches (default 1: the first batch; more are pooled) and passes the frozen values as
  ``ref_high`` / ``ref_low``. A direct call without ``ref_high`` / ``ref_low`` has no earlier batch: it is that
  first batch, and uses its own quantiles.
- ``mask="batch_quantile"``: ref_high / ref_low are recomputed on every batch from its own PPL_ref quantiles
  (calibrl's earlier ``"quantile"``), so about a quarter of the correct and of the wrong samples is always
  dropped.
- Quantiles (both quantile masks) are taken over all samples of the batch with tokens, on log-PPL_ref = -ref_lpm
  (torch.quantile's linear interpolation, computed by selection) and exponentiated, so they equal the PPL
  quantiles exactly at sample points and interpolate geometrically between neighbouring samples; all
  comparisons are done in log space, so no exp() can overflow.

``grpo_mask`` (the paper's ablation "the mask alone on GRPO"): GRPO's advantage times the same mask,
m(o_i) * A_i(grpo), with the same threshold options and the same frozen-quantile state
(:func:`grpo_mask_advantages`); masked samples still count in their group's mean and std (our reading).

Shapes: rewards, logprob_mean, ref_logprob_mean, group_index [N]; output [N] in the rewards dtype.
Vectorised: samples are scattered into a padded [n_groups, G_max] layout (groups of any size, in any order) and
the pairwise sigmoids are a [n_groups, G_max, G_max] tensor, processed in blocks of groups so memory stays below
``_MAX_PAIR_ELEMENTS``; there is no Python loop over groups. (One group of G samples still needs a G x G block:
fine for the G <= a few hundred of RL practice.)
Numerics: computed in the promoted dtype of logprob_mean and float32 (float64 inputs stay float64);
the sigmoid's argument is formed as (lpm_j - lpm_i) / tau (difference first, so a tiny tau gives +-inf, never
inf - inf = NaN) and torch.sigmoid saturates cleanly, so log-probs of +-1e4 and any tau down to the dtype's
bound give finite advantages. |A| <= 1 / tau ((G - 1) / tau with "none"), so a tau below bound / finfo.max (or
below the smallest normal number of the working dtype) raises a ValueError naming the smallest usable tau
(about 1.2e-38 in float32).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from calibrl.advantages._groups import dense_group_index
from calibrl.advantages.grpo import grpo_advantages
from calibrl.advantages.registry import register_estimator
from calibrl.batch import RolloutBatch, RolloutBatchError

_NORMALIZE = ("group", "pairs", "none")
_MASKS = ("none", "fixed", "quantile", "batch_quantile")
PAPER_REF_HIGH, PAPER_REF_LOW = 2.5, 1.05  # CAPO's fixed thresholds for Qwen2.5-Math (mask="fixed" default)
_MAX_PAIR_ELEMENTS = 1 << 24  # per block of the [groups, G_max, G_max] pairwise tensor
# The noise mask's parameters and the CalibratedGRPOConfig fields that set them, for every estimator registered
# with noise_mask= (capo, grpo_mask): the engine adapters hold a FrozenQuantileMask for it when mask="quantile".
NOISE_MASK_FIELDS: dict[str, str] = {
    "mask": "capo_mask", "ref_high": "capo_ref_high", "ref_low": "capo_ref_low",
    "ref_high_quantile": "capo_ref_high_quantile", "ref_low_quantile": "capo_ref_low_quantile",
    "ref_quantile_batches": "capo_ref_quantile_batches",
}
# The mask parameters read with one mask value only (the others are read with every mask).
MASK_ONLY_PARAMS: dict[str, tuple[str, ...]] = {
    "none": (), "fixed": ("ref_high", "ref_low"), "quantile": ("ref_quantile_batches",), "batch_quantile": (),
}
QUANTILE_MASK_FILE = "calibrl_capo_mask.json"  # FrozenQuantileMask states in each checkpoint folder (TRL and verl)


def group_layout(group_ids: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor, int]:
    """Dense group index AND padded-grid layout from raw group ids, with a single sort.

    Returns (group_index, n_groups, slot, counts, g_max): ``group_index`` [N] is the dense id 0..n_groups-1 (the
    same as ``dense_group_index``); sample i sits at ``grid.view(-1)[slot[i]]`` of a [n_groups, G_max] grid
    (row = its group, column = some rank within the group); ``counts`` [n_groups] are the group sizes.
    Scatter with ``grid.view(-1)[slot] = x``, gather back with ``grid.view(-1)[slot]``.
    """
    n = group_ids.numel()
    already_sorted = n < 2 or bool((group_ids[1:] >= group_ids[:-1]).all())  # TRL / verl: groups contiguous
    if already_sorted:
        sorted_ids, order = group_ids, None
    else:
        sorted_ids, order = torch.sort(group_ids)
    starts_mask = torch.ones(n, dtype=torch.bool, device=group_ids.device)
    starts_mask[1:] = sorted_ids[1:] != sorted_ids[:-1]
    rows = torch.cumsum(starts_mask, 0) - 1  # dense group of each sorted sample
    n_groups = int(rows[-1].item()) + 1 if n else 0
    counts = torch.bincount(rows, minlength=n_groups)
    g_max = int(counts.max().item()) if n else 0
    starts = torch.cumsum(counts, 0) - counts
    cols = torch.arange(n, device=group_ids.device) - starts[rows]
    sorted_slot = rows * g_max + cols
    if order is None:
        return rows, n_groups, sorted_slot, counts, g_max
    group_index = torch.empty_like(rows)
    group_index[order] = rows
    slot = torch.empty_like(rows)
    slot[order] = sorted_slot
    return group_index, n_groups, slot, counts, g_max


def padded_layout(group_index: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(slot, counts, g_max) of :func:`group_layout` for an already dense ``group_index``."""
    _, _, slot, counts, g_max = group_layout(group_index)
    if counts.numel() != n_groups:  # empty groups in a caller-provided index: keep their rows (all padding)
        counts = torch.bincount(group_index, minlength=n_groups)
        g_max = int(counts.max().item())
        order = torch.argsort(group_index)
        rows = group_index[order]
        cols = torch.arange(group_index.numel(), device=group_index.device) - (torch.cumsum(counts, 0) - counts)[rows]
        slot = torch.empty_like(group_index)
        slot[order] = rows * g_max + cols
    return slot, counts, g_max


def _pairwise_sums(lpm_grid: torch.Tensor, correct_grid: torch.Tensor, wrong_grid: torch.Tensor, *,
                   tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """For each padded group: pos[g, a] = sum_b wrong[g, b] * s(g, a, b), neg[g, b] = sum_a correct[g, a] * s(g, a, b),
    with s(g, a, b) = sigmoid((lpm[g, b] - lpm[g, a]) / tau). Blocks over groups to bound memory.

    The difference is taken before the division by tau: lpm / tau alone overflows for a tiny tau (then
    inf - inf = NaN), while a finite difference divided by tau is at worst +-inf, where sigmoid saturates to 1 or
    0 (and 0 / tau = 0 gives 1/2 for equal log-probs)."""
    n_groups, g_max = lpm_grid.shape
    pos = torch.zeros_like(lpm_grid)
    neg = torch.zeros_like(lpm_grid)
    block = max(1, _MAX_PAIR_ELEMENTS // max(1, g_max * g_max))
    for start in range(0, n_groups, block):  # one iteration unless the batch is huge: blocks of groups, not groups
        sl = slice(start, start + block)
        x = lpm_grid[sl]
        s = (x.unsqueeze(1) - x.unsqueeze(2)).div_(tau).sigmoid_()  # [g, a, b]: sigmoid((lpm_b - lpm_a) / tau)
        pos[sl] = (s * wrong_grid[sl].unsqueeze(1)).sum(-1)  # multiply-and-sum beats thousands of tiny bmm's
        neg[sl] = (s * correct_grid[sl].unsqueeze(2)).sum(1)
    return pos, neg


def capo_noise_mask(*, correct: torch.Tensor, ref_logprob_mean: torch.Tensor, mask: str = "fixed",
                    ref_high: float | None = None, ref_low: float | None = None, ref_high_quantile: float = 0.75,
                    ref_low_quantile: float = 0.25) -> tuple[torch.Tensor, float, float]:
    """CAPO's reference-perplexity noise mask: True where the sample's advantage is zeroed.

    Zeroed: correct samples with PPL_ref > ref_high (lucky guesses), incorrect samples with PPL_ref < ref_low
    (near misses). Thresholds by ``mask``: ``"fixed"``: ref_high / ref_low (None: the paper's 2.5 / 1.05);
    ``"quantile"``: ref_high / ref_low as given (the frozen thresholds of a :class:`FrozenQuantileMask`), or, when
    None, this batch's quantiles (a batch with no earlier one is the first batch); ``"batch_quantile"``: this
    batch's quantiles, always (ref_high / ref_low ignored).
    correct [N] bool, ref_logprob_mean [N] -> (masked [N] bool, ref_high used, ref_low used).
    """
    log_ppl = -ref_logprob_mean.to(torch.promote_types(ref_logprob_mean.dtype, torch.float32))
    if mask == "batch_quantile" or (mask == "quantile" and (ref_high is None or ref_low is None)):
        log_hi, log_lo = _quantiles(log_ppl, (ref_high_quantile, ref_low_quantile))
    elif mask in ("fixed", "quantile"):
        log_hi = math.log(PAPER_REF_HIGH if ref_high is None else ref_high)
        log_lo = math.log(PAPER_REF_LOW if ref_low is None else ref_low)
    else:
        raise ValueError(f"capo_noise_mask: mask must be 'fixed', 'quantile' or 'batch_quantile', got {mask!r}")
    masked = (correct & (log_ppl > log_hi)) | (~correct & (log_ppl < log_lo))
    return masked, _safe_exp(log_hi), _safe_exp(log_lo)


@dataclass
class FrozenQuantileMask:
    """CAPO's quantile thresholds, estimated from the first rollouts and then frozen (``mask="quantile"``).

    The paper masks with FIXED thresholds, ref_high = 2.5 and ref_low = 1.05 for Qwen2.5-Math, described as the
    quartiles of the reference model's perplexity distribution. To carry that to any model we estimate those
    quartiles once: from the log-PPL_ref = -ref_lpm of the first ``warmup_batches`` batches :meth:`update` sees,
    pooled (default 1: the first batch alone), with :func:`capo_noise_mask`'s quantile rule (linear interpolation
    on log-PPL, exponentiated). Batch k <= warmup_batches uses the quantiles of batches 1..k pooled; from batch
    ``warmup_batches`` on, the thresholds are frozen and returned unchanged, whatever later batches look like.

    The estimator stays a pure function: the engine adapter owns one of these, calls :meth:`update` with each
    training batch's log-PPL_ref (rows with tokens only, as the estimator's statistics) and passes the result as
    ``ref_high`` / ``ref_low`` (:func:`frozen_quantile_params`). :meth:`state_dict` / :meth:`load_state_dict`
    carry the thresholds (and a pool not yet complete) across a checkpoint.

    Fields: ``high_quantile`` / ``low_quantile`` (0.75 / 0.25), ``warmup_batches`` (K >= 1),
    ``log_thresholds`` ((log ref_high, log ref_low) once frozen, else None), ``batches_seen``.
    """

    high_quantile: float = 0.75
    low_quantile: float = 0.25
    warmup_batches: int = 1
    log_thresholds: tuple[float, float] | None = None
    batches_seen: int = 0
    _pool: list[torch.Tensor] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not (0.0 <= self.low_quantile <= self.high_quantile <= 1.0):
            raise ValueError("FrozenQuantileMask: need 0 <= low_quantile <= high_quantile <= 1, got "
                             f"{self.low_quantile!r}, {self.high_quantile!r}")
        if isinstance(self.warmup_batches, bool) or not isinstance(self.warmup_batches, int) or self.warmup_batches < 1:
            raise ValueError(f"FrozenQuantileMask: warmup_batches must be an integer >= 1, got {self.warmup_batches!r}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "FrozenQuantileMask":
        """The state for capo estimator ``params`` (``ref_high_quantile``, ``ref_low_quantile``,
        ``ref_quantile_batches``); ``ref_high`` and ``ref_low`` both given = thresholds frozen from the start (e.g.
        the values logged by an earlier run)."""
        def given(key: str, default: Any) -> Any:  # a key present with None (e.g. from a config) = not given
            value = params.get(key)
            return default if value is None else value

        state = cls(high_quantile=float(given("ref_high_quantile", 0.75)),
                    low_quantile=float(given("ref_low_quantile", 0.25)),
                    warmup_batches=given("ref_quantile_batches", 1))
        if params.get("ref_high") is not None and params.get("ref_low") is not None:
            high, low = float(params["ref_high"]), float(params["ref_low"])
            if not (high > 0 and low > 0):
                raise ValueError(f"capo: ref_high and ref_low are perplexities and must be > 0, got {high!r}, {low!r}")
            state.log_thresholds = (math.log(high), math.log(low))
        return state

    @property
    def frozen(self) -> bool:
        return self.log_thresholds is not None

    @property
    def thresholds(self) -> tuple[float, float] | None:
        """(ref_high, ref_low) perplexities once frozen, else None."""
        if self.log_thresholds is None:
            return None
        return _safe_exp(self.log_thresholds[0]), _safe_exp(self.log_thresholds[1])

    def peek(self, ref_log_ppl: torch.Tensor) -> tuple[float, float]:
        """(ref_high, ref_low) for a batch that must not change the state (evaluation): the frozen thresholds, else
        the quantiles of the pool so far and this batch. ref_log_ppl [n] = -ref_logprob_mean of the rows with tokens."""
        if self.log_thresholds is not None:
            return self.thresholds  # type: ignore[return-value]
        pooled = self._pooled(ref_log_ppl)
        if pooled.numel() == 0:
            raise ValueError("FrozenQuantileMask: no reference perplexity seen yet, so there are no thresholds")
        hi, lo = _quantiles(pooled, (self.high_quantile, self.low_quantile))
        return _safe_exp(hi), _safe_exp(lo)

    def update(self, ref_log_ppl: torch.Tensor) -> tuple[float, float]:
        """(ref_high, ref_low) for this training batch; freezes them at the ``warmup_batches``-th batch.
        ref_log_ppl [n] = -ref_logprob_mean of the batch's rows with tokens (a batch with none changes nothing)."""
        if self.log_thresholds is not None or ref_log_ppl.numel() == 0:
            return self.peek(ref_log_ppl)
        pooled = self._pooled(ref_log_ppl)
        hi, lo = _quantiles(pooled, (self.high_quantile, self.low_quantile))
        self.batches_seen += 1
        if self.batches_seen >= self.warmup_batches:
            self.log_thresholds, self._pool = (hi, lo), []
        else:
            self._pool = [pooled]
        return _safe_exp(hi), _safe_exp(lo)

    def _pooled(self, ref_log_ppl: torch.Tensor) -> torch.Tensor:
        x = ref_log_ppl.detach().to(torch.promote_types(ref_log_ppl.dtype, torch.float32))
        if not self._pool:
            return x
        pool = self._pool[0]
        return torch.cat([pool.to(device=x.device, dtype=torch.promote_types(pool.dtype, x.dtype)), x.to(pool.dtype)])

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: quantile levels, K, batches seen, log thresholds (and their perplexities, for
        reading), and the pooled log-PPL values while not yet frozen."""
        return {
            "high_quantile": self.high_quantile, "low_quantile": self.low_quantile,
            "warmup_batches": self.warmup_batches, "batches_seen": self.batches_seen,
            "log_thresholds": None if self.log_thresholds is None else list(self.log_thresholds),
            "ref_ppl_high_low": None if self.thresholds is None else list(self.thresholds),
            "pool": self._pool[0].cpu().tolist() if self._pool else [],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`. Quantile levels or K that differ from this object's raise a ValueError (the
        saved thresholds would not be the configured ones)."""
        saved = (float(state["high_quantile"]), float(state["low_quantile"]), int(state["warmup_batches"]))
        if saved != (self.high_quantile, self.low_quantile, self.warmup_batches):
            raise ValueError(
                "capo quantile mask: the checkpoint froze thresholds for (high_quantile, low_quantile, "
                f"warmup_batches) = {saved}, this run is configured with "
                f"{(self.high_quantile, self.low_quantile, self.warmup_batches)}")
        logs = state.get("log_thresholds")
        self.log_thresholds = None if logs is None else (float(logs[0]), float(logs[1]))
        self.batches_seen = int(state.get("batches_seen", 0))
        pool = state.get("pool") or []
        self._pool = [torch.tensor(pool, dtype=torch.float64)] if pool else []


# the estimator parameters that set a quantile mask: one state per estimator and distinct values of these
MASK_SETTING_KEYS = ("ref_high_quantile", "ref_low_quantile", "ref_quantile_batches", "ref_high", "ref_low")


def mask_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The quantile-mask settings of estimator ``params`` (:data:`MASK_SETTING_KEYS`), as a checkpoint records them."""
    return {k: params.get(k) for k in MASK_SETTING_KEYS}


def write_mask_states(folder: str, states: list[tuple[str, dict[str, Any], FrozenQuantileMask]]) -> None:
    """Write ``states`` ((estimator name, :func:`mask_settings`, state) each) to ``folder/QUANTILE_MASK_FILE`` as a
    list of ``{"estimator", "settings", "state"}``: the one format of TRL's and verl's checkpoints. Written whole
    (a temporary file renamed), so a crash leaves the old file or none, never half of one."""
    import json
    import os

    from calibrl._files import write_then_rename

    os.makedirs(folder, exist_ok=True)
    entries = [{"estimator": name, "settings": settings, "state": state.state_dict()}
               for name, settings, state in states]
    write_then_rename(os.path.join(folder, QUANTILE_MASK_FILE), json.dumps(entries, default=str))


def read_mask_states(folder: str) -> list[dict[str, Any]] | None:
    """The entries :func:`write_mask_states` wrote in ``folder`` (None when there is no file). A file of an earlier
    calibrl's TRL checkpoint, one bare state, reads as one entry whose ``estimator`` and ``settings`` are None."""
    import json
    import os

    path = os.path.join(folder, QUANTILE_MASK_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        content = json.load(f)
    if isinstance(content, dict):  # written before the two engines shared this format: TRL's bare state
        return [{"estimator": None, "settings": None, "state": content}]
    return content


def frozen_quantile_params(params: dict[str, Any], *, batch: RolloutBatch, state: FrozenQuantileMask,
                           update: bool = True) -> dict[str, Any]:
    """capo / grpo_mask estimator ``params`` with ``mask="quantile"``'s thresholds taken from ``state``: ``ref_high`` /
    ``ref_low`` set to ``state.update(log-PPL_ref of the batch's rows with tokens)`` (``state.peek`` when
    ``update`` is False: evaluation batches read the thresholds but never set them). Other masks: ``params``
    unchanged. A batch without ``ref_logprob_mean`` is passed through, so the estimator raises its explanatory
    error."""
    out = dict(params)
    if out.get("mask") != "quantile" or batch.ref_logprob_mean is None:
        return out
    ref = batch.ref_logprob_mean if batch.lengths is None else batch.ref_logprob_mean[batch.lengths > 0]
    if ref.numel() == 0 and not state.frozen:
        return out  # no row with tokens: compute_advantages does not call the estimator
    log_ppl = -ref.to(torch.promote_types(ref.dtype, torch.float32))
    high, low = state.update(log_ppl) if update else state.peek(log_ppl)
    out.update(ref_high=high, ref_low=low)
    return out


def _quantiles(x: torch.Tensor, qs: tuple[float, ...]) -> list[float]:
    """Exactly torch.quantile(x, q) (linear interpolation) for each q, by selection instead of a full sort (a float
    sort costs far more): one numpy partition on CPU, torch.kthvalue elsewhere."""
    n = x.numel()
    positions = [q * (n - 1) for q in qs]
    ks = sorted({k for p in positions for k in (int(math.floor(p)), min(int(math.floor(p)) + 1, n - 1))})
    if x.device.type == "cpu":
        part = np.partition(x.detach().numpy(), ks)
        order_stat = {k: float(part[k]) for k in ks}
    else:
        order_stat = {k: float(torch.kthvalue(x, k + 1).values) for k in ks}
    out = []
    for p in positions:
        k = int(math.floor(p))
        low, high = order_stat[k], order_stat[min(k + 1, n - 1)]
        out.append(low + (p - k) * (high - low))
    return out


def _safe_exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def check_capo_params(params: dict[str, Any], *, estimator: str = "capo", masks: tuple[str, ...] = _MASKS,
                      config_field: Callable[[str], str] | None = None) -> None:
    """The one check of CAPO's parameters, for whichever of them ``params`` holds: ``tau`` (> 0, finite),
    ``normalize`` (:data:`_NORMALIZE`), ``mask`` (one of ``masks``), ``ref_high`` / ``ref_low`` (perplexities > 0;
    with ``mask="quantile"`` both or neither), ``ref_high_quantile`` / ``ref_low_quantile`` (in [0, 1], low <=
    high), ``ref_quantile_batches`` (an integer >= 1). The estimators call it on every batch; the TRL config
    (``config_field``: a parameter's config field, ``capo_<name>``) calls it before a model loads.
    Raises ``ValueError`` naming the estimator (or the config field)."""
    def name(param: str) -> str:
        return config_field(param) if config_field is not None else f"{estimator}: {param}"

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if "tau" in params and not (number(params["tau"]) and params["tau"] > 0):
        raise ValueError(f"{name('tau')} must be a positive finite number, got {params['tau']!r}")
    if "normalize" in params and params["normalize"] not in _NORMALIZE:
        raise ValueError(f"{name('normalize')} must be one of {_NORMALIZE}, got {params['normalize']!r}")
    mask = params.get("mask")
    if "mask" in params and mask not in masks:
        raise ValueError(f"{name('mask')} must be one of {masks}, got {mask!r}")
    high, low = params.get("ref_high"), params.get("ref_low")
    for key in ("ref_high", "ref_low"):
        value = params.get(key)
        if value is not None and not (number(value) and value > 0):
            raise ValueError(f"{name(key)} is a perplexity and must be > 0 (and finite), got {value!r}")
    if mask == "quantile" and config_field is None and (high is None) != (low is None):
        raise ValueError(f"{estimator}: mask='quantile' takes both frozen thresholds ref_high and ref_low (from a "
                         f"FrozenQuantileMask) or neither, got ref_high={high!r}, ref_low={low!r}")
    for key in ("ref_high_quantile", "ref_low_quantile"):
        value = params.get(key)
        if value is not None and not (number(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"{name(key)} must be a number in [0, 1], got {value!r}")
    hq, lq = params.get("ref_high_quantile"), params.get("ref_low_quantile")
    if hq is not None and lq is not None and lq > hq:
        other = config_field("ref_high_quantile") if config_field is not None else "ref_high_quantile"
        raise ValueError(f"{name('ref_low_quantile')} ({lq}) must not exceed {other} ({hq})")
    batches = params.get("ref_quantile_batches")
    if batches is not None and (isinstance(batches, bool) or not isinstance(batches, int) or batches < 1):
        raise ValueError(f"{name('ref_quantile_batches')} must be an integer >= 1, got {batches!r}")


def _apply_noise_mask(advantages: torch.Tensor, *, correct: torch.Tensor, ref_logprob_mean: torch.Tensor, mask: str,
                      ref_high: float | None, ref_low: float | None, ref_high_quantile: float,
                      ref_low_quantile: float) -> tuple[torch.Tensor, dict[str, float]]:
    """m(o_i) * A_i: ``advantages`` [N] with the samples :func:`capo_noise_mask` flags set to 0, and the info
    {"mask_fraction" (of all N samples), "ref_high", "ref_low" (the perplexity thresholds used)}."""
    masked, used_high, used_low = capo_noise_mask(
        correct=correct, ref_logprob_mean=ref_logprob_mean, mask=mask, ref_high=ref_high, ref_low=ref_low,
        ref_high_quantile=ref_high_quantile, ref_low_quantile=ref_low_quantile)
    out = torch.where(masked, torch.zeros_like(advantages), advantages)
    return out, {"mask_fraction": float(masked.to(advantages.dtype).mean()), "ref_high": used_high,
                 "ref_low": used_low}


def _check_tau_range(*, tau: float, bound: float, dtypes: tuple[torch.dtype, ...]) -> None:
    """Reject a tau so small that the advantages cannot be represented: |A| <= ``bound`` / tau (1 / tau with the
    "group" and "pairs" normalisers, (G_max - 1) / tau with "none") must fit every dtype of ``dtypes`` (the
    working dtype first, then the output's), and tau must be a normal number of the working dtype. Below that the
    exact advantages overflow to inf; above it they are finite for any finite log-probs (the sigmoid saturates)."""
    for k, dtype in enumerate(dtypes):
        info = torch.finfo(dtype)
        smallest = max(info.tiny if k == 0 else 0.0, bound / info.max)
        if tau < smallest:
            raise ValueError(
                f"capo: tau = {tau!r} is too small: the advantages reach {bound:g} / tau, beyond the range of "
                f"{str(dtype).removeprefix('torch.')}; use tau >= {smallest:.3g} (or float64 log-probs and rewards)")


def capo_advantages(*, rewards: torch.Tensor, group_index: torch.Tensor, n_groups: int, logprob_mean: torch.Tensor,
                    ref_logprob_mean: torch.Tensor | None = None, tau: float = 0.6, normalize: str = "group",
                    mask: str = "none", ref_high: float | None = None, ref_low: float | None = None,
                    ref_high_quantile: float = 0.75, ref_low_quantile: float = 0.25, threshold: float = 0.5,
                    layout: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """CAPO advantage (see the module docstring for the formula and our readings).

    ``layout`` = (slot, counts, g_max) from :func:`group_layout` / :func:`padded_layout`, when the caller has it
    (saves a sort); computed from ``group_index`` otherwise.

    Thresholds (:func:`capo_noise_mask`): ``mask="fixed"``: ref_high / ref_low (None: the paper's 2.5 / 1.05);
    ``"quantile"``: ref_high / ref_low are the thresholds frozen by a :class:`FrozenQuantileMask` (None: this
    batch's quantiles, as for a first batch); ``"batch_quantile"``: this batch's quantiles.

    rewards, logprob_mean, group_index [N]; ref_logprob_mean [N] (needed when mask != "none").
    Returns (advantages [N] in the rewards dtype, info) with info = {"mask_fraction", "mixed_group_fraction",
    and, when masking, "ref_high", "ref_low"} (ref_* are the perplexity thresholds actually used).
    """
    check_capo_params({"tau": tau, "normalize": normalize, "mask": mask, "ref_high": ref_high, "ref_low": ref_low,
                       "ref_high_quantile": ref_high_quantile, "ref_low_quantile": ref_low_quantile})
    if mask != "none" and ref_logprob_mean is None:
        raise _missing_reference("capo", mask)
    work = torch.promote_types(logprob_mean.dtype, torch.float32)
    correct = rewards > threshold  # [N] bool

    slot, counts, g_max = layout if layout is not None else padded_layout(group_index, n_groups)
    n = rewards.numel()
    # a batch that already holds its groups contiguously with equal sizes (TRL, verl) IS the grid: views, no copies
    contiguous = n == n_groups * g_max and torch.equal(slot, torch.arange(n, device=slot.device))

    order = None
    if not contiguous and n == n_groups * g_max:  # equal sizes, rows shuffled: gather by the inverse permutation
        order = torch.empty_like(slot)
        order[slot] = torch.arange(n, device=slot.device)

    def to_grid(x: torch.Tensor) -> torch.Tensor:
        if contiguous:
            return x.reshape(n_groups, g_max)
        if order is not None:
            return x.index_select(0, order).view(n_groups, g_max)
        grid = torch.zeros(n_groups * g_max, dtype=work, device=x.device)
        grid[slot] = x
        return grid.view(n_groups, g_max)

    def from_grid(grid: torch.Tensor) -> torch.Tensor:
        return grid.reshape(-1) if contiguous else grid.reshape(-1).index_select(0, slot)

    _check_tau_range(tau=tau, bound=float(max(1, g_max - 1)) if normalize == "none" else 1.0,
                     dtypes=(work, rewards.dtype))
    lpm_grid = to_grid(logprob_mean.to(work))
    correct_grid = to_grid(correct.to(work))
    wrong_grid = (1.0 - correct_grid) if (contiguous or order is not None) else to_grid(1.0 - correct.to(work))

    pos, neg = _pairwise_sums(lpm_grid, correct_grid, wrong_grid, tau=tau)
    raw = torch.where(correct, from_grid(pos), -from_grid(neg))  # [N]

    n_correct = correct_grid.sum(1)  # [n_groups]
    n_wrong = wrong_grid.sum(1)
    if normalize == "group":
        denom = tau * counts.to(work)
    elif normalize == "pairs":
        denom = tau * (n_correct * n_wrong).clamp_min(1.0)
    else:
        denom = torch.full((n_groups,), tau, dtype=work, device=rewards.device)
    advantages = raw / denom[group_index]

    info: dict[str, Any] = {
        "mixed_group_fraction": float(((n_correct > 0) & (n_wrong > 0)).sum() / (counts > 0).sum()),
        "mask_fraction": 0.0,
    }
    if mask != "none":
        assert ref_logprob_mean is not None
        advantages, mask_info = _apply_noise_mask(
            advantages, correct=correct, ref_logprob_mean=ref_logprob_mean, mask=mask, ref_high=ref_high,
            ref_low=ref_low, ref_high_quantile=ref_high_quantile, ref_low_quantile=ref_low_quantile)
        info.update(mask_info)
    return advantages.to(rewards.dtype), info


_MISSING_REF_MESSAGE = (
    "estimator {estimator!r} with mask={mask!r} needs RolloutBatch.ref_logprob_mean (the mean token log-prob of each "
    "completion under the frozen reference model), to compute the reference perplexity PPL_ref = "
    "exp(-ref_logprob_mean). Pass ref_logprob_mean when building the RolloutBatch: with TRL, set beta > 0 (TRL "
    "then loads the reference model) or set capo_mask on CalibratedGRPOConfig (the trainer loads the reference "
    "for the mask); with verl, enable the reference policy (ref_log_prob). {alternative}"
)
_WITHOUT_MASK = {"capo": "Or use mask='none'.", "grpo_mask": "Or use the estimator 'grpo' (GRPO without the mask)."}


def _missing_reference(estimator: str, mask: str) -> RolloutBatchError:
    """The error of a noise mask without ``ref_logprob_mean``: what the field is and how each engine provides it."""
    return RolloutBatchError(_MISSING_REF_MESSAGE.format(estimator=estimator, mask=mask,
                                                         alternative=_WITHOUT_MASK.get(estimator, "")))


@register_estimator("capo", inputs={"logprob_mean"}, ranks_by="correctness", noise_mask="optional",
                    fields={**NOISE_MASK_FIELDS, "tau": "capo_tau", "normalize": "capo_normalize"})
def capo(batch: RolloutBatch, *, tau: float = 0.6, normalize: str = "group", mask: str = "none",
         ref_high: float | None = None, ref_low: float | None = None, ref_high_quantile: float = 0.75,
         ref_low_quantile: float = 0.25, threshold: float = 0.5,
         ref_quantile_batches: int = 1) -> tuple[torch.Tensor, dict[str, Any]]:
    """Registered ``capo``: logistic pairwise advantage + optional reference-perplexity noise mask.

    Needs ``logprob_mean``; a mask (``"fixed"``, ``"quantile"``, ``"batch_quantile"``) also needs
    ``ref_logprob_mean``. ``mask="quantile"`` is stateless here: pass the frozen ``ref_high`` / ``ref_low`` of a
    :class:`FrozenQuantileMask` (:func:`frozen_quantile_params`; the TRL trainer and the verl plugin do), else
    this batch's quantiles are used. ``ref_quantile_batches`` (K, the batches pooled before freezing) is read by
    :class:`FrozenQuantileMask` only; accepted here so that one parameter dict serves adapter and estimator.
    """
    batch.require("logprob_mean", estimator="capo")
    if mask != "none" and mask in _MASKS and batch.ref_logprob_mean is None:
        raise _missing_reference("capo", mask)
    index, n_groups, slot, counts, g_max = group_layout(batch.group_ids)
    return capo_advantages(
        rewards=batch.rewards, group_index=index, n_groups=n_groups, logprob_mean=batch.logprob_mean,
        layout=(slot, counts, g_max),
        ref_logprob_mean=batch.ref_logprob_mean, tau=tau, normalize=normalize, mask=mask, ref_high=ref_high,
        ref_low=ref_low, ref_high_quantile=ref_high_quantile, ref_low_quantile=ref_low_quantile, threshold=threshold)


# ---------------------------------------------------------------------------------------------------- GRPO + mask

_GRPO_MASKS = ("fixed", "quantile", "batch_quantile")  # grpo_mask without a mask would be grpo


def grpo_mask_advantages(*, rewards: torch.Tensor, group_index: torch.Tensor, n_groups: int,
                         ref_logprob_mean: torch.Tensor, mask: str, ref_high: float | None = None,
                         ref_low: float | None = None, ref_high_quantile: float = 0.75, ref_low_quantile: float = 0.25,
                         threshold: float = 0.5, eps: float = 1e-4) -> tuple[torch.Tensor, dict[str, Any]]:
    """GRPO advantage times CAPO's reference-perplexity noise mask: the CAPO paper's ablation "the mask alone on GRPO
    (does not improve AUC)".

        A_i = m(o_i) * (r_i - mean_g(r)) / (std_g(r) + eps)
        m(o_i) = 1[PPL_ref(o_i) <= ref_high] for a correct sample, 1[PPL_ref(o_i) >= ref_low] for an incorrect one
        PPL_ref(o) = exp(-ref_logprob_mean(o)),  correct = reward > ``threshold``

    The GRPO part is exactly :func:`calibrl.advantages.grpo.grpo_advantages` (Bessel std, TRL's eps = 1e-4), the
    mask exactly :func:`capo_noise_mask` with CAPO's threshold options (``mask`` = ``"fixed"``, ``"quantile"`` with
    the thresholds of a :class:`FrozenQuantileMask`, or ``"batch_quantile"``; see :func:`capo_advantages`).

    Our reading (the paper is silent on it): masked samples still count in their group's mean and std. The paper
    writes the final advantage as m(o_i) * A_i, so A_i is GRPO's advantage computed as usual over the whole group,
    and the masked samples are zeroed afterwards; an unmasked sample's advantage equals plain GRPO's exactly. (The
    same reading as CAPO's, where masked samples stay the opponents of the others.)

    rewards, group_index, ref_logprob_mean [N] -> (advantages [N] in the rewards dtype, info) with info =
    {"mask_fraction" (of all N samples), "ref_high", "ref_low" (the perplexity thresholds actually used)}.
    """
    check_capo_params({"mask": mask, "ref_high": ref_high, "ref_low": ref_low, "ref_high_quantile": ref_high_quantile,
                       "ref_low_quantile": ref_low_quantile}, estimator="grpo_mask", masks=_GRPO_MASKS)
    base = grpo_advantages(rewards=rewards, group_index=group_index, n_groups=n_groups, eps=eps)
    advantages, info = _apply_noise_mask(
        base.to(torch.promote_types(rewards.dtype, torch.float32)), correct=rewards > threshold,
        ref_logprob_mean=ref_logprob_mean, mask=mask, ref_high=ref_high, ref_low=ref_low,
        ref_high_quantile=ref_high_quantile, ref_low_quantile=ref_low_quantile)
    return advantages.to(rewards.dtype), info


# grpo_mask ranks by correctness too: its mask splits correct from incorrect, and the CAPO ablation it serves
# compares it with capo on the same rewards (with one 0/1 reward function, the correctness column IS the total).
@register_estimator("grpo_mask", inputs={"ref_logprob_mean"}, ranks_by="correctness", noise_mask="required",
                    fields=NOISE_MASK_FIELDS)
def grpo_mask(batch: RolloutBatch, *, mask: str | None = None, ref_high: float | None = None,
              ref_low: float | None = None, ref_high_quantile: float = 0.75, ref_low_quantile: float = 0.25,
              threshold: float = 0.5, eps: float = 1e-4, ref_quantile_batches: int = 1) -> tuple[torch.Tensor, dict]:
    """Registered ``grpo_mask``: GRPO with CAPO's reference-perplexity noise mask (:func:`grpo_mask_advantages`).

    Needs ``ref_logprob_mean``. ``mask`` has no default and must be ``"fixed"``, ``"quantile"`` or
    ``"batch_quantile"`` (without a mask this is ``grpo``); the parameters are capo's mask parameters, and
    ``mask="quantile"`` is frozen by the engine adapters exactly as for capo (:func:`frozen_quantile_params`).
    """
    check_capo_params({"mask": mask, "ref_high": ref_high, "ref_low": ref_low, "ref_high_quantile": ref_high_quantile,
                       "ref_low_quantile": ref_low_quantile}, estimator="grpo_mask", masks=_GRPO_MASKS)
    if batch.ref_logprob_mean is None:
        raise _missing_reference("grpo_mask", mask)  # type: ignore[arg-type]
    index, n_groups = dense_group_index(batch.group_ids)
    return grpo_mask_advantages(
        rewards=batch.rewards, group_index=index, n_groups=n_groups, ref_logprob_mean=batch.ref_logprob_mean,
        mask=mask, ref_high=ref_high, ref_low=ref_low, ref_high_quantile=ref_high_quantile,
        ref_low_quantile=ref_low_quantile, threshold=threshold, eps=eps)  # type: ignore[arg-type]
