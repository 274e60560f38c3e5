"""Post-hoc calibration of confidences: temperature scaling, Platt scaling, isotonic regression.

Common interface for binary confidences (probability that a sample is correct)::

    cal = get_posthoc("isotonic").fit(confidence, correct)   # fit on held-out data
    calibrated = cal.transform(new_confidence)

Temperature and Platt scaling act on ``z = logit(confidence)`` (confidences clipped to [eps, 1 - eps]):
temperature ``p = sigmoid(z / T)``, Platt ``p = sigmoid(a z + b)``; both are fit by minimising the binary NLL.
Isotonic regression fits a non-decreasing step map (``sklearn.isotonic.IsotonicRegression``,
``out_of_bounds="clip"``). :class:`TemperatureScaling` also calibrates multi-class logits
(:meth:`TemperatureScaling.fit_logits` / :meth:`~TemperatureScaling.transform_logits`; the arg-max never changes).

Never report calibration metrics of a map fit on the data it is evaluated on: use
:func:`cross_validated_posthoc`, which returns out-of-fold calibrated confidences with folds split by prompt.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import optimize, special

from calibrl.metrics._arrays import as_correct, as_prob, check_same_length, group_index, to_numpy

__all__ = [
    "IsotonicCalibration",
    "PlattScaling",
    "PosthocCalibrator",
    "register_posthoc",
    "TemperatureScaling",
    "available_posthoc",
    "cross_validated_posthoc",
    "get_posthoc",
]

_LOG_T_BOUNDS = (np.log(1e-3), np.log(1e3))


def _logit(p: np.ndarray, eps: float) -> np.ndarray:
    p = np.clip(p, eps, 1.0 - eps)
    return np.log(p) - np.log1p(-p)


def _binary_nll_from_logits(z: np.ndarray, y: np.ndarray) -> float:
    # -[y log sigmoid(z) + (1-y) log sigmoid(-z)] = softplus(-z) if y else softplus(z)
    return float(np.mean(np.logaddexp(0.0, np.where(y, -z, z))))


class PosthocCalibrator:
    """Base class: ``fit(confidence, correct) -> self``, ``transform(confidence) -> np.ndarray``."""

    name = "base"

    def fit(self, confidence: Any, correct: Any) -> "PosthocCalibrator":  # pragma: no cover - abstract
        raise NotImplementedError

    def transform(self, confidence: Any) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def fit_transform(self, confidence: Any, correct: Any) -> np.ndarray:
        return self.fit(confidence, correct).transform(confidence)

    def _check_fitted(self, attr: str) -> None:
        if getattr(self, attr, None) is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted: call .fit(...) first")

    @staticmethod
    def _inputs(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
        p = as_prob(confidence)
        y = as_correct(correct)
        check_same_length(confidence=p, correct=y)
        return p, y


class TemperatureScaling(PosthocCalibrator):
    """One temperature T > 0 fit by minimising NLL over log T (bounded scalar search, T in [1e-3, 1e3]).

    Binary: ``p' = sigmoid(logit(p) / T)``. Multi-class: ``softmax(logits / T)``.
    """

    name = "temperature"

    def __init__(self, eps: float = 1e-12):
        self.eps = eps
        self.temperature: float | None = None

    def fit(self, confidence: Any, correct: Any) -> "TemperatureScaling":
        p, y = self._inputs(confidence, correct)
        z = _logit(p, self.eps)
        res = optimize.minimize_scalar(
            lambda lt: _binary_nll_from_logits(z * np.exp(-lt), y), bounds=_LOG_T_BOUNDS, method="bounded"
        )
        self.temperature = float(np.exp(res.x))
        return self

    def transform(self, confidence: Any) -> np.ndarray:
        self._check_fitted("temperature")
        p = as_prob(confidence)
        return special.expit(_logit(p, self.eps) / self.temperature)

    def fit_logits(self, logits: Any, labels: Any) -> "TemperatureScaling":
        """Fit T on multi-class ``logits`` [N, C] and integer ``labels`` [N] (NLL of ``softmax(logits / T)``)."""
        x = to_numpy(logits).astype(np.float64, copy=False)
        lab = to_numpy(labels).reshape(-1).astype(np.int64)
        if x.ndim != 2 or x.shape[0] != lab.shape[0]:
            raise ValueError(f"logits must be [N, C] with N = len(labels); got {x.shape} and {lab.shape}")
        if lab.size and (lab.min() < 0 or lab.max() >= x.shape[1]):
            raise ValueError(f"labels must be in 0..{x.shape[1] - 1}")
        rows = np.arange(x.shape[0])

        def nll(lt: float) -> float:
            lp = special.log_softmax(x * np.exp(-lt), axis=1)
            return float(-lp[rows, lab].mean())

        res = optimize.minimize_scalar(nll, bounds=_LOG_T_BOUNDS, method="bounded")
        self.temperature = float(np.exp(res.x))
        return self

    def transform_logits(self, logits: Any) -> np.ndarray:
        """Calibrated class probabilities ``softmax(logits / T)`` [N, C]."""
        self._check_fitted("temperature")
        x = to_numpy(logits).astype(np.float64, copy=False)
        return special.softmax(x / self.temperature, axis=-1)


class PlattScaling(PosthocCalibrator):
    """``p' = sigmoid(a * logit(p) + b)`` fit by logistic regression on logit(p) (unregularised, L-BFGS).

    Platt's original target smoothing is not applied (the labels are hard 0/1).
    """

    name = "platt"

    def __init__(self, eps: float = 1e-12):
        self.eps = eps
        self.a: float | None = None
        self.b: float | None = None

    def fit(self, confidence: Any, correct: Any) -> "PlattScaling":
        p, y = self._inputs(confidence, correct)
        z = _logit(p, self.eps)
        yf = y.astype(np.float64)

        def fun(w: np.ndarray):
            u = w[0] * z + w[1]
            loss = np.mean(np.logaddexp(0.0, np.where(y, -u, u)))
            r = special.expit(u) - yf  # d loss / d u
            return loss, np.array([np.mean(r * z), np.mean(r)])

        res = optimize.minimize(fun, x0=np.array([1.0, 0.0]), jac=True, method="L-BFGS-B",
                                bounds=[(-1e3, 1e3), (-1e3, 1e3)])
        self.a, self.b = float(res.x[0]), float(res.x[1])
        return self

    def transform(self, confidence: Any) -> np.ndarray:
        self._check_fitted("a")
        p = as_prob(confidence)
        return special.expit(self.a * _logit(p, self.eps) + self.b)


class IsotonicCalibration(PosthocCalibrator):
    """Non-decreasing step map fit by ``sklearn.isotonic.IsotonicRegression(out_of_bounds="clip")``."""

    name = "isotonic"

    def __init__(self):
        self.model = None

    def fit(self, confidence: Any, correct: Any) -> "IsotonicCalibration":
        from sklearn.isotonic import IsotonicRegression

        p, y = self._inputs(confidence, correct)
        self.model = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
        self.model.fit(p, y.astype(np.float64))
        return self

    def transform(self, confidence: Any) -> np.ndarray:
        self._check_fitted("model")
        return np.asarray(self.model.predict(as_prob(confidence)), dtype=np.float64)


_REGISTRY: dict[str, type[PosthocCalibrator]] = {}


def register_posthoc(name: str, cls: type[PosthocCalibrator] | None = None, *, overwrite: bool = False):
    """Declare post-hoc calibrator ``name``: a :class:`PosthocCalibrator` subclass (``fit(confidence, correct)``,
    ``transform(confidence)``, both on probabilities in [0, 1], all it needs), as a class decorator or called with
    it; ``calibrl eval --posthoc`` and :func:`cross_validated_posthoc` then take the name."""
    from calibrl._registry import registering_decorator

    decorate = registering_decorator(_REGISTRY, "post-hoc calibrator", name, overwrite)
    return decorate if cls is None else decorate(cls)


register_posthoc("temperature", TemperatureScaling)
register_posthoc("platt", PlattScaling)
register_posthoc("isotonic", IsotonicCalibration)


def available_posthoc() -> list[str]:
    """The declared calibrators' names, sorted."""
    return sorted(_REGISTRY)


def get_posthoc(name: str, **kwargs: Any) -> PosthocCalibrator:
    """A new, unfitted calibrator of :func:`available_posthoc`: ``"temperature"``, ``"platt"``, ``"isotonic"``."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown post-hoc calibrator {name!r}; choose one of {available_posthoc()}") from None
    return cls(**kwargs)


def cross_validated_posthoc(
    name: str,
    confidence: Any,
    correct: Any,
    prompt_ids: Any,
    *,
    n_splits: int = 5,
    seed: int = 0,
    return_folds: bool = False,
):
    """Out-of-fold calibrated confidences [N]: each sample is transformed by a map fit on the OTHER folds.

    Folds are split by prompt (``sklearn.model_selection.GroupKFold``, groups shuffled with ``seed``), so no
    prompt has samples on both sides of a fit. ``n_splits`` is reduced to the number of distinct prompts when
    there are fewer (at least 2 prompts are needed). With ``return_folds=True`` returns
    ``(calibrated, fold_of_sample)``.
    """
    from sklearn.model_selection import GroupKFold

    p = as_prob(confidence)
    y = as_correct(correct)
    g, n_groups = group_index(prompt_ids)
    check_same_length(confidence=p, correct=y, prompt_ids=g)
    if n_groups < 2:
        raise ValueError("cross_validated_posthoc needs at least 2 distinct prompts to split by prompt")
    k = int(min(n_splits, n_groups))
    if k < 2:
        raise ValueError(f"n_splits must be >= 2, got {n_splits}")
    try:
        splitter = GroupKFold(n_splits=k, shuffle=True, random_state=seed)
    except TypeError:  # scikit-learn < 1.6: no shuffle; permute the group labels instead
        splitter = GroupKFold(n_splits=k)
        g = np.random.default_rng(seed).permutation(n_groups)[g]
    out = np.empty_like(p)
    folds = np.full(p.shape[0], -1, dtype=np.int64)
    for f, (train, test) in enumerate(splitter.split(p, y, groups=g)):
        out[test] = get_posthoc(name).fit(p[train], y[train]).transform(p[test])
        folds[test] = f
    return (out, folds) if return_folds else out
