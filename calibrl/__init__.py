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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from calibrl.tasks import registry as _tasks_registry  # light: no torch

if TYPE_CHECKING:
    from calibrl.advantages import available_estimators, compute_advantages, get_estimator, register_estimator
    from calibrl.batch import RolloutBatch, RolloutBatchError

__version__ = "0.1.0"

# The core API imports torch; it loads on first use (PEP 562) so that `import calibrl.cli`, and with it
# `calibrl --help` and argument errors, do not wait seconds for torch.
_LAZY_ATTRIBUTES = {
    "RolloutBatch": "calibrl.batch",
    "RolloutBatchError": "calibrl.batch",
    "available_estimators": "calibrl.advantages",
    "compute_advantages": "calibrl.advantages",
    "get_estimator": "calibrl.advantages",
    "register_estimator": "calibrl.advantages",
}


def _testbed_tasks() -> None:
    import calibrl.testbed.tasks  # noqa: F401  (registers the testbed/<task> datasets and rewards)


# The package root wires the layers: the testbed's tasks are looked up by name like any dataset, while the task
# registry (a lower layer) knows nothing of the testbed.
_tasks_registry.add_provider(_testbed_tasks)


def __getattr__(name: str):
    module = _LAZY_ATTRIBUTES.get(name)
    if module is None:
        raise AttributeError(f"module 'calibrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_ATTRIBUTES))


__all__ = [
    "RolloutBatch",
    "RolloutBatchError",
    "available_estimators",
    "compute_advantages",
    "get_estimator",
    "register_estimator",
    "__version__",
]
