"""Post-hoc calibration: lowers ECE out of sample, keeps the arg-max, cross-validates by prompt."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import expit, logit, softmax

from calibrl.metrics import auroc, ece
from calibrl.posthoc import (
    IsotonicCalibration,
    PlattScaling,
    TemperatureScaling,
    available_posthoc,
    cross_validated_posthoc,
    get_posthoc,
)


def _overconfident(seed: int, n_prompts: int = 400, per_prompt: int = 8, sharpen: float = 3.0):
    """True correctness probability q per prompt; reported confidence sigmoid(sharpen * logit(q)): over-confident."""
    rng = np.random.default_rng(seed)
    q = np.repeat(rng.uniform(0.05, 0.95, n_prompts), per_prompt)
    q = np.clip(q + rng.normal(0, 0.03, q.shape), 0.01, 0.99)
    correct = rng.random(q.shape) < q
    conf = expit(sharpen * logit(q))
    pid = np.repeat(np.arange(n_prompts), per_prompt)
    return conf, correct, pid


@pytest.mark.parametrize("name", ["temperature", "platt", "isotonic"])
def test_posthoc_lowers_ece_out_of_sample(name):
    conf, correct, _ = _overconfident(0)
    conf_te, correct_te, _ = _overconfident(1)
    cal = get_posthoc(name).fit(conf, correct)
    before = ece(conf_te, correct_te)
    after = ece(cal.transform(conf_te), correct_te)
    assert before > 0.12
    assert after < 0.5 * before and after < 0.05
    out = cal.transform(conf_te)
    assert out.shape == conf_te.shape and out.min() >= 0 and out.max() <= 1


def test_temperature_recovers_sharpening_and_is_monotone():
    conf, correct, _ = _overconfident(0, n_prompts=2000, sharpen=3.0)
    ts = TemperatureScaling().fit(conf, correct)
    assert ts.temperature == pytest.approx(3.0, rel=0.15)
    # monotone maps keep the AUROC
    assert auroc(ts.transform(conf), correct) == pytest.approx(auroc(conf, correct), abs=1e-12)
    pl = PlattScaling().fit(conf, correct)
    assert pl.a == pytest.approx(1 / 3, rel=0.15) and abs(pl.b) < 0.1


def test_temperature_logits_keeps_argmax_and_fits_T():
    rng = np.random.default_rng(0)
    n, c, t_true = 4000, 5, 2.5
    true_logits = rng.normal(0, 2.0, (n, c))
    labels = np.array([rng.choice(c, p=p) for p in softmax(true_logits, axis=1)])
    model_logits = true_logits * t_true  # over-confident model
    ts = TemperatureScaling().fit_logits(model_logits, labels)
    assert ts.temperature == pytest.approx(t_true, rel=0.1)
    probs = ts.transform_logits(model_logits)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    np.testing.assert_array_equal(probs.argmax(axis=1), model_logits.argmax(axis=1))
    # torch input works too
    probs_t = ts.transform_logits(torch.tensor(model_logits))
    np.testing.assert_allclose(probs_t, probs)
    nll_before = -np.log(softmax(model_logits, axis=1)[np.arange(n), labels]).mean()
    nll_after = -np.log(probs[np.arange(n), labels]).mean()
    assert nll_after < nll_before


def test_isotonic_clips_out_of_bounds_and_registry():
    iso = IsotonicCalibration().fit([0.3, 0.4, 0.6, 0.7], [0, 0, 1, 1])
    out = iso.transform([0.0, 0.35, 0.65, 1.0])
    np.testing.assert_allclose(out, [0.0, 0.0, 1.0, 1.0])
    assert available_posthoc() == ["isotonic", "platt", "temperature"]
    assert isinstance(get_posthoc("platt"), PlattScaling)
    with pytest.raises(ValueError, match="unknown post-hoc"):
        get_posthoc("beta")
    with pytest.raises(RuntimeError, match="not fitted"):
        TemperatureScaling().transform([0.5])


@pytest.mark.parametrize("name", ["temperature", "platt", "isotonic"])
def test_cross_validated_posthoc_splits_by_prompt(name):
    conf, correct, pid = _overconfident(2, n_prompts=200)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(pid))  # prompts interleaved in the input
    conf, correct, pid = conf[perm], correct[perm], pid[perm] * 3 + 1
    out, folds = cross_validated_posthoc(name, conf, correct, pid, n_splits=5, seed=0, return_folds=True)
    assert out.shape == conf.shape and (folds >= 0).all() and len(np.unique(folds)) == 5
    # no prompt has samples in two folds
    for p in np.unique(pid):
        assert len(np.unique(folds[pid == p])) == 1
    # each fold is transformed by a map fit on the other folds only
    f0 = folds == 0
    expected = get_posthoc(name).fit(conf[~f0], correct[~f0]).transform(conf[f0])
    np.testing.assert_allclose(out[f0], expected)
    assert ece(out, correct) < ece(conf, correct)
    # deterministic with the seed
    np.testing.assert_array_equal(cross_validated_posthoc(name, conf, correct, pid, seed=0), out)


def test_cross_validated_posthoc_small_and_errors():
    out = cross_validated_posthoc("isotonic", [0.2, 0.8, 0.3, 0.9], [0, 1, 0, 1], ["a", "a", "b", "b"])
    assert out.shape == (4,)  # n_splits reduced to the 2 prompts
    with pytest.raises(ValueError, match="2 distinct prompts"):
        cross_validated_posthoc("isotonic", [0.2, 0.8], [0, 1], [0, 0])
