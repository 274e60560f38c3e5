"""Advantage estimators, one file per method family, all registered by name.

    from calibrl import RolloutBatch, compute_advantages
    adv = compute_advantages(batch, "capo", tau=0.6, mask="quantile")
"""

from calibrl.advantages.registry import (
    EstimatorFailed,
    EstimatorOutputError,
    EstimatorSpec,
    Param,
    available_estimators,
    compute_advantages,
    estimator_inputs,
    estimator_spec,
    estimator_specs,
    estimators_table,
    get_estimator,
    register_estimator,
)
from calibrl.advantages import grpo as _grpo  # noqa: F401  (registers grpo, dr_grpo, rloo)
from calibrl.advantages import capo as _capo  # noqa: F401  (registers capo, grpo_mask)
from calibrl.advantages import gcpo as _gcpo  # noqa: F401  (registers gcpo, seed_grpo)
from calibrl.advantages import baselines as _baselines  # noqa: F401  (registers codapo, cde)
from calibrl.advantages import dcpo as _dcpo  # noqa: F401  (registers dcpo)
from calibrl.advantages import intuitor as _intuitor  # noqa: F401  (registers intuitor)

__all__ = [
    "EstimatorFailed", "EstimatorOutputError", "EstimatorSpec", "Param", "available_estimators", "compute_advantages", "estimator_inputs", "estimator_spec",
    "estimator_specs", "estimators_table", "get_estimator", "register_estimator",
]
