"""TRL engine adapter: ``CalibratedGRPOConfig`` and ``CalibratedGRPOTrainer`` (TRL 1.16).

``CalibratedGRPOTrainer`` is TRL's ``GRPOTrainer`` with the advantage step replaced by any estimator registered in
:mod:`calibrl.advantages` (``capo``, ``gcpo``, ``seed_grpo``, ``codapo``, ``cde``, ``grpo``, ``dr_grpo``, ``rloo``,
or your own), an optional decision-token calibration term (arXiv 2601.13284), and calibration telemetry logged
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
* :mod:`~calibrl.trl.recipes` and :mod:`~calibrl.trl.train`: YAML recipes and ``calibrl train``.
"""

from calibrl.trl.config import CalibratedGRPOConfig
from calibrl.trl.rollout import estimator_inputs, extract_answer, has_answer
from calibrl.trl.trainer import CalibratedGRPOTrainer

__all__ = ["CalibratedGRPOConfig", "CalibratedGRPOTrainer", "estimator_inputs", "extract_answer", "has_answer"]
