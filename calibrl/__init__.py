"""calibrl: calibration-aware reinforcement learning for reasoning LLMs.

Core API (framework-agnostic, pure torch):
    RolloutBatch          one row per sampled completion, validated on construction
    compute_advantages    run a registered advantage estimator (grpo, dr_grpo, rloo, capo, gcpo, seed_grpo, ...)
    register_estimator    add your own estimator to the registry every engine adapter reads

The package, by layer:
    math          batch, advantages/, losses/, metrics/, selection/, posthoc: pure functions on tensors/arrays
    engines       trl/ (CalibratedGRPOTrainer, recipes), verl/ (plugin): gather inputs, call the math
    evaluation    evaluation/: model -> generate -> samples -> scoring -> report
    data          tasks/: dataset and reward registries, math-verify and decision rewards
    testbed       testbed/: tiny model, tasks, warm starts, the demo and the study
    interface     cli/: calibrl train | generate | eval | demo
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
