"""Advantage estimators, one file per method family, all registered by name.

    from calibrl import RolloutBatch, compute_advantages
    adv = compute_advantages(batch, "capo", tau=0.6, mask="quantile")
"""

from calibrl.advantages.registry import (
    available_estimators,
    compute_advantages,
    get_estimator,
    register_estimator,
)
from calibrl.advantages import grpo as _grpo  # noqa: F401  (registers grpo, dr_grpo, rloo)

__all__ = ["available_estimators", "compute_advantages", "get_estimator", "register_estimator"]
