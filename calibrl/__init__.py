"""calibrl: calibration-aware reinforcement learning for reasoning LLMs.

Core API (framework-agnostic, pure torch):
    RolloutBatch          one row per sampled completion, validated on construction
    compute_advantages    run a registered advantage estimator (grpo, dr_grpo, rloo, capo, gcpo, seed_grpo, ...)
    register_estimator    add your own estimator to the registry every engine adapter reads
"""

from calibrl.advantages import available_estimators, compute_advantages, get_estimator, register_estimator
from calibrl.batch import RolloutBatch, RolloutBatchError

__version__ = "0.1.0"

__all__ = [
    "RolloutBatch",
    "RolloutBatchError",
    "available_estimators",
    "compute_advantages",
    "get_estimator",
    "register_estimator",
    "__version__",
]
