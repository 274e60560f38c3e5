"""TRL engine adapter: ``CalibratedGRPOConfig`` and ``CalibratedGRPOTrainer`` (TRL 1.16).

``CalibratedGRPOTrainer`` is TRL's ``GRPOTrainer`` with the advantage step replaced by any estimator registered in
:mod:`calibrl.advantages` (``capo``, ``grpo_mask``, ``gcpo``, ``seed_grpo``, ``codapo``, ``cde``, ``grpo``, ``dr_grpo``,
``rloo``, or your own), an optional decision-token calibration term (arXiv 2601.13284), and calibration telemetry logged
through TRL's own metrics (TensorBoard / W&B / trackio, keys ``calibration/...``).

The package, in the order a generation batch goes through it:

* :mod:`~calibrl.trl.config`: ``CalibratedGRPOConfig``, every field documented and tied to its paper.
* :mod:`~calibrl.trl.reference`: the frozen reference model CAPO's noise mask reads (also at ``beta == 0``).
* :mod:`~calibrl.trl.generation`: the sampled tokens' log-probs, recorded during ``generate`` (no extra forward).
* :mod:`~calibrl.trl.rollout`: TRL's generation output -> :class:`calibrl.RolloutBatch` (rewards, correctness,
  log-prob sources, reference, embeddings, answers, unscorable rows, gathering, the process slice).
* :mod:`~calibrl.trl.decision`: decision-token plumbing (class spellings, positions, logits).
* :mod:`~calibrl.trl.telemetry`: ``calibration/...`` metrics of a RolloutBatch.
* :mod:`~calibrl.trl.trainer`: ``CalibratedGRPOTrainer``, only the overridden TRL methods.
* :mod:`~calibrl.trl.callbacks`: ``CalibrationEvalCallback``, held-out calibration every N steps, checkpoint
  choice (``metric_for_best_model``, a Pareto rule) and early stopping by calibration.
* :mod:`~calibrl.trl.recipes` and :mod:`~calibrl.trl.train`: YAML recipes and ``calibrl train``;
  :mod:`~calibrl.trl.progress`: its progress bar, ``log_history.jsonl`` and summary.
"""

from __future__ import annotations

TRL_TESTED = ("1.16", "1.17")  # the TRL range the trainer's overrides were written against: >= first, < second


def _check_trl_version() -> None:
    """Refuse a TRL older than the tested range (the trainer overrides private TRL 1.16 methods, e.g.
    ``_generate_single_turn(..., has_tool_images)``, that older releases lack or call differently) and warn on a
    newer one; pyproject.toml pins the same range."""
    import importlib.metadata
    import warnings

    from packaging.version import Version

    try:
        installed = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError("calibrl.trl needs TRL: install calibrl's [trl] extra (from a clone: "
                          "pip install '.[trl]')") from None
    low, high = (Version(v) for v in TRL_TESTED)
    if Version(installed) < low:
        raise ImportError(f"calibrl.trl needs TRL {TRL_TESTED[0]}.x, found TRL {installed}; install the tested "
                          f"range: pip install 'trl>={TRL_TESTED[0]},<{TRL_TESTED[1]}'")
    if Version(installed) >= high:
        warnings.warn(f"calibrl.trl was tested with TRL {TRL_TESTED[0]}.x, found TRL {installed}; the trainer "
                      f"overrides private TRL methods that may have changed (pip install "
                      f"'trl>={TRL_TESTED[0]},<{TRL_TESTED[1]}' for the tested range)", UserWarning, stacklevel=2)


_check_trl_version()

# The public names load on first use (PEP 562), so the light modules of this package (recipes, their field
# types, the calibration-eval settings) import without TRL, transformers or torch: ``calibrl train --list`` and
# a recipe's checks answer as fast as ``--help``.
_LAZY = {
    "CalibrationEvalCallback": "calibrl.trl.callbacks", "CalibrationEvalConfig": "calibrl.trl.calibration_config",
    "CalibratedGRPOConfig": "calibrl.trl.config", "CalibratedGRPOTrainer": "calibrl.trl.trainer",
    "estimator_inputs": "calibrl.advantages", "extract_answer": "calibrl.trl.rollout",
    "has_answer": "calibrl.trl.rollout",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'calibrl.trl' has no attribute {name!r}")


__all__ = [
    "TRL_TESTED", "CalibratedGRPOConfig", "CalibratedGRPOTrainer", "CalibrationEvalCallback", "CalibrationEvalConfig",
    "estimator_inputs", "extract_answer", "has_answer",
]
