"""The estimator registry: name -> :class:`EstimatorSpec` (the function and what every layer needs to know of it).

Built-in estimators register themselves when :mod:`calibrl.advantages` is imported; users add their own with
:func:`register_estimator`. An estimator declares itself once, beside its function, and every layer reads that
declaration: the TRL trainer gathers exactly its ``inputs`` and hands it the correctness column when it ``ranks_by``
correctness; ``calibrl train`` checks a recipe's ``advantage_params`` against its ``params`` (names and types read
from the function's signature); the verl plugin registers every estimator of this table; docs/advantages.md's
table is :func:`estimators_table`. :func:`compute_advantages` is also where rows without tokens (``lengths == 0``)
are left out, once for every estimator.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Union

import torch

from calibrl._registry import already_registered
from calibrl.batch import RolloutBatch

EstimatorOutput = Union[torch.Tensor, "tuple[torch.Tensor, dict[str, Any]]"]
Estimator = Callable[..., EstimatorOutput]
RanksBy = Literal["reward", "correctness"]
NoiseMask = Literal["no", "optional", "required"]

# The RolloutBatch fields an estimator may ask for (rewards and group_ids always come; lengths is the adapters').
OPTIONAL_INPUTS: frozenset[str] = frozenset({"logprob_mean", "ref_logprob_mean", "embeddings", "answer_ids",
                                             "stated_confidence", "confidence_start", "self_certainty"})


@dataclass(frozen=True)
class Param:
    """One keyword parameter of an estimator: its annotation (``float``, ``str | None``; ``Any`` when it does not
    resolve), its default (``inspect.Parameter.empty`` when it has none) and the ``CalibratedGRPOConfig`` field
    that also sets it (``capo_tau`` for capo's ``tau``), if any."""

    annotation: Any
    default: Any
    field: str | None = None


@dataclass(frozen=True)
class EstimatorSpec:
    """What an estimator is, for every layer that uses one.

    * ``fn(batch: RolloutBatch, **params)`` -> advantages [N] (or [N, T]), or ``(advantages, info)``.
    * ``inputs``: the optional :class:`RolloutBatch` fields it reads (:data:`OPTIONAL_INPUTS`); engine adapters
      gather exactly these.
    * ``params``: its keyword parameters by name (from its signature), or None when it takes ``**kwargs`` (then
      any ``advantage_params`` pass unchecked).
    * ``ranks_by``: ``"correctness"`` when it uses the rewards only through correctness (reward > 0.5): the TRL
      trainer then passes the correctness reward's own column as ``rewards`` instead of the weighted total.
    * ``noise_mask``: whether it takes CAPO's reference-perplexity noise mask (``mask``, ``ref_*``):
      ``"optional"`` (capo), ``"required"`` (grpo_mask) or ``"no"``. With a mask it also reads
      ``ref_logprob_mean``, and ``mask="quantile"`` is frozen by the engine adapters.
    * ``annealed``: the parameter the TRL trainer's ``cde_omega_schedule`` anneals over training (cde's ``omega``).
    """

    name: str
    fn: Estimator
    inputs: frozenset[str]
    params: Mapping[str, Param] | None
    ranks_by: RanksBy = "reward"
    noise_mask: NoiseMask = "no"
    annealed: str | None = None

    def inputs_for(self, params: Mapping[str, Any]) -> frozenset[str]:
        """The optional fields it reads with ``params``: its ``inputs``, plus ``ref_logprob_mean`` with a mask."""
        if self.noise_mask != "no" and params.get("mask", "none") not in ("none", None):
            return self.inputs | {"ref_logprob_mean"}
        return self.inputs

    def config_fields(self) -> dict[str, str]:
        """``CalibratedGRPOConfig`` field -> parameter, for the parameters a config field sets."""
        return {p.field: name for name, p in (self.params or {}).items() if p.field}


_ESTIMATORS: dict[str, EstimatorSpec] = {}
_LISTENERS: list[Callable[[EstimatorSpec], None]] = []


def register_estimator(name: str, *, inputs: Iterable[str] = ("logprob_mean",), ranks_by: RanksBy = "reward",
                       noise_mask: NoiseMask = "no", fields: Mapping[str, str] | None = None,
                       annealed: str | None = None, overwrite: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator registering ``fn(batch: RolloutBatch, **params)`` under ``name``, with what it needs
    (:class:`EstimatorSpec`).

    The function returns the advantages as a float tensor [N] (or per-token [N, T]), or a tuple
    ``(advantages, info)`` where ``info`` is a dict of scalar diagnostics (e.g. the fraction of samples masked)
    that trainers log. Through :func:`compute_advantages` it only ever sees rows with tokens. Its keyword
    parameters (after ``batch``) are its ``params``: names, annotations and defaults are read from the signature,
    so a recipe's misspelt or ill-typed ``advantage_params`` entry is caught before training. ``inputs`` are the
    optional RolloutBatch fields it reads (default ``logprob_mean``; ``()`` for rewards and groups only);
    ``fields`` maps a parameter to the ``CalibratedGRPOConfig`` field that also sets it (built-ins only).

    >>> @register_estimator("my_est", inputs=())
    ... def my_est(batch, *, scale: float = 1.0):
    ...     return scale * (batch.rewards - batch.rewards.mean())
    """
    inputs = frozenset(inputs)
    if not inputs <= OPTIONAL_INPUTS:
        raise ValueError(f"estimator {name!r}: inputs {sorted(inputs - OPTIONAL_INPUTS)} are not RolloutBatch "
                         f"fields an estimator can ask for ({', '.join(sorted(OPTIONAL_INPUTS))})")
    if ranks_by not in typing.get_args(RanksBy):
        raise ValueError(f"estimator {name!r}: ranks_by must be one of {typing.get_args(RanksBy)}, got {ranks_by!r}")
    if noise_mask not in typing.get_args(NoiseMask):
        raise ValueError(f"estimator {name!r}: noise_mask must be one of {typing.get_args(NoiseMask)}, "
                         f"got {noise_mask!r}")

    def decorator(fn: Estimator) -> Estimator:
        params = _signature_params(fn, fields or {})
        for param in [*(fields or {}), *([annealed] if annealed else [])]:
            if params is not None and param not in params:
                raise ValueError(f"estimator {name!r}: {param!r} is not one of its parameters ({', '.join(params)})")
        current = _ESTIMATORS.get(name)
        if already_registered(current and current.fn, fn, kind="advantage estimator", name=name, overwrite=overwrite):
            return fn
        spec = _ESTIMATORS[name] = EstimatorSpec(name=name, fn=fn, inputs=inputs, params=params, ranks_by=ranks_by,
                                                 noise_mask=noise_mask, annealed=annealed)
        for listener in list(_LISTENERS):
            listener(spec)
        return fn

    return decorator


def _signature_params(fn: Estimator, fields: Mapping[str, str]) -> dict[str, Param] | None:
    """``fn``'s keyword parameters after the batch, as :class:`Param`; None when it takes ``**kwargs``."""
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: names and defaults still checked, types not
        hints = {}
    params: dict[str, Param] = {}
    for position, (name, p) in enumerate(signature.parameters.items()):
        if p.kind is p.VAR_KEYWORD:
            return None
        if position == 0 or p.kind is p.VAR_POSITIONAL:
            continue
        params[name] = Param(annotation=hints.get(name, Any), default=p.default, field=fields.get(name))
    return params


def on_register(listener: Callable[[EstimatorSpec], None]) -> None:
    """Call ``listener(spec)`` for every estimator registered from now on (the verl plugin registers each in verl,
    so an estimator registered after the plugin was imported reaches verl too)."""
    _LISTENERS.append(listener)


def estimator_spec(name: str) -> EstimatorSpec:
    """The :class:`EstimatorSpec` registered under ``name``; a KeyError lists the registered names."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; registered: {', '.join(sorted(_ESTIMATORS))}"
        ) from None


def get_estimator(name: str) -> Estimator:
    """The estimator function registered under ``name``; a KeyError lists the registered names."""
    return estimator_spec(name).fn


def available_estimators() -> list[str]:
    """Sorted names of every registered estimator."""
    return sorted(_ESTIMATORS)


def estimator_specs() -> list[EstimatorSpec]:
    """Every registered :class:`EstimatorSpec`, in registration order (built-ins first)."""
    return list(_ESTIMATORS.values())


def compute_advantages(
    batch: RolloutBatch, estimator: str | Estimator = "grpo", *, return_info: bool = False, **params: Any
) -> torch.Tensor | tuple[torch.Tensor, dict[str, Any]]:
    """Advantages [N] of ``batch`` under ``estimator`` (a registered name or a function).

    ``params`` are passed to the estimator as keyword arguments (e.g. ``tau=0.6, mask="quantile"`` for capo).
    With ``return_info=True`` returns ``(advantages, info)``, ``info`` being the estimator's diagnostics dict
    (empty for estimators that report none).

    Rows without tokens: when ``batch.lengths`` is given, the estimator runs on the rows with ``lengths > 0``
    only and its advantages are scattered back; rows with ``lengths == 0`` get 0 and enter no statistic of any
    estimator (group means and stds, CAPO's pairs and quantile mask, semantic clusters, dispersions, ...) nor
    its diagnostics. ``info["n_empty_rows"]`` then counts them (0 when there are none). A batch without any
    row with tokens gives zeros [N] without calling the estimator. Estimators may return per-token advantages
    [N, T]; they are scattered row for row.
    """
    fn = get_estimator(estimator) if isinstance(estimator, str) else estimator
    name = estimator if isinstance(estimator, str) else getattr(estimator, "__name__", "estimator")
    keep = None if batch.lengths is None else batch.lengths > 0
    if keep is None or bool(keep.all()):
        advantages, info = _run(fn, batch, name=name, params=params)
    elif not bool(keep.any()):
        advantages, info = torch.zeros_like(batch.rewards), {}
    else:
        kept, info = _run(fn, batch.select(keep), name=name, params=params)
        advantages = kept.new_zeros((len(batch), *kept.shape[1:]))
        advantages[keep] = kept
    if keep is not None:
        info = {**info, "n_empty_rows": int((~keep).sum())}
    return (advantages, dict(info)) if return_info else advantages


class EstimatorOutputError(ValueError):
    """An estimator returned something that cannot be trained on: not a tensor, a wrong shape, or a value that is
    not finite (the message names the estimator and what was wrong)."""


class EstimatorFailed(RuntimeError):
    """An engine's training step stopped because its estimator raised or returned an unusable value (the message
    names the estimator, the step and what was wrong; ``calibrl train`` prints it in one line)."""


def _run(fn: Estimator, batch: RolloutBatch, *, name: str,
         params: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """``fn(batch, **params)`` as (advantages [N] or [N, T], info), checked at every call: a float tensor [N] or
    [N, T] holding finite values, and a dict of diagnostics, else :class:`EstimatorOutputError`. A NaN or an
    infinite advantage would train its rows with a meaningless or unbounded weight (zeroing it would hide the fault),
    so it stops the caller instead."""
    out = fn(batch, **params)
    advantages, info = (out if isinstance(out, tuple) and len(out) == 2 else (out, {}))
    if not isinstance(advantages, torch.Tensor):
        raise EstimatorOutputError(f"estimator {name!r} returned {type(advantages).__name__}, not a torch tensor of "
                                   f"advantages ({len(batch)},) or ({len(batch)}, T)")
    if advantages.dim() not in (1, 2) or advantages.shape[0] != len(batch):
        raise EstimatorOutputError(f"estimator {name!r} returned shape {tuple(advantages.shape)}, expected "
                                   f"({len(batch)},) or ({len(batch)}, T)")
    if advantages.is_complex():
        raise EstimatorOutputError(f"estimator {name!r} returned a {advantages.dtype} tensor, not real numbers")
    if advantages.is_floating_point():
        bad = ~torch.isfinite(advantages)
        if bool(bad.any()):
            rows = torch.nonzero(bad.reshape(len(batch), -1).any(-1)).flatten().tolist()
            values = sorted({str(v) for v in advantages[bad].tolist()[:10]})
            raise EstimatorOutputError(
                f"estimator {name!r} returned {'/'.join(values)} for {len(rows)} of {len(batch)} rows (row "
                f"{rows[0]}{' and more' if len(rows) > 1 else ''}); advantages must be finite")
    if not isinstance(info, Mapping):
        raise EstimatorOutputError(f"estimator {name!r} returned info of type {type(info).__name__}, not a dict")
    return advantages, info


def estimator_inputs(name: str, params: Mapping[str, Any]) -> frozenset[str]:
    """Optional RolloutBatch fields the estimator ``name`` reads with ``params`` (:meth:`EstimatorSpec.inputs_for`)."""
    return estimator_spec(name).inputs_for(params)


def estimators_table() -> str:
    """docs/advantages.md's table of the estimators calibrl ships (those defined in :mod:`calibrl.advantages`), as
    markdown, from their registrations (a test keeps the page equal to it): what each reads besides ``rewards`` and
    ``group_ids``, whether its rewards are the correctness column, its noise-mask support, its parameters with
    their defaults, and its file."""
    rows = ["| name | reads | rewards | noise mask | parameters (default) | file |", "|---|---|---|---|---|---|"]
    for spec in estimator_specs():
        if not spec.fn.__module__.startswith("calibrl.advantages."):
            continue
        reads = ", ".join(sorted(spec.inputs)) or "rewards only"
        if spec.noise_mask != "no" and "ref_logprob_mean" not in spec.inputs:
            reads += " (+ ref_logprob_mean with a mask)"
        params = "any (`**kwargs`)" if spec.params is None else ", ".join(
            f"`{name}`" if p.default is inspect.Parameter.empty else f"`{name}={p.default!r}`"
            for name, p in spec.params.items()) or "none"
        file = spec.fn.__module__.replace("calibrl.", "", 1).replace(".", "/") + ".py"
        rewards = "correctness (0/1)" if spec.ranks_by == "correctness" else "weighted total"
        rows.append(f"| `{spec.name}` | {reads} | {rewards} | {spec.noise_mask} | {params} | `{file}` |")
    return "\n".join(rows)
