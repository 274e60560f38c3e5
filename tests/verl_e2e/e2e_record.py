"""Records every calibrl advantage computation of an end-to-end run (tests/verl_e2e), for the test to replay.

Loaded through ``VERL_USE_EXTERNAL_MODULES`` after ``calibrl.verl``; active only when ``CALIBRL_E2E_RECORD`` names a
folder. Each calibrl estimator in verl's ``ADV_ESTIMATOR_REGISTRY`` is wrapped: a call writes
``<folder>/adv_<pid>_<n>.pt`` with what verl passed (``token_level_rewards``, ``response_mask``, ``index``), the
log-probs and answers the plugin read from the batch of the wrapped advantage step
(:func:`calibrl.verl.hooks.current_data`), the estimator's parameters, its output and the diagnostics the plugin put in
``data.meta_info["calibrl/advantage"]``. The estimator's result is returned unchanged.
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any

import torch

RECORD_ENV = "CALIBRL_E2E_RECORD"
_COUNTER = itertools.count()


def _record(path: str, payload: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def wrap_estimator(fn: Any) -> Any:
    """``fn`` (a calibrl estimator registered in verl) that also writes its inputs and output to $CALIBRL_E2E_RECORD."""
    if getattr(fn, "_e2e_recorded", False):
        return fn

    @functools.wraps(fn)
    def recorded(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                 config: Any = None, **kwargs: Any) -> Any:
        from calibrl.verl.advantage import _from_current_data, estimator_params
        from calibrl.verl.hooks import current_data

        out = fn(token_level_rewards=token_level_rewards, response_mask=response_mask, index=index, config=config,
                 **kwargs)
        folder = os.environ.get(RECORD_ENV)
        if folder:
            extras = _from_current_data(token_level_rewards.shape[0])
            data = current_data()
            answers = extras.get("answers")
            _record(os.path.join(folder, f"adv_{os.getpid()}_{next(_COUNTER):03d}.pt"), {
                "estimator": fn.calibrl_estimator,
                "params": estimator_params(config),
                "token_level_rewards": token_level_rewards.detach().cpu(),
                "response_mask": response_mask.detach().cpu(),
                "index": None if index is None else [str(i) for i in index],
                "old_log_probs": None if extras.get("old_log_probs") is None else extras["old_log_probs"].cpu(),
                "ref_log_prob": None if extras.get("ref_log_prob") is None else extras["ref_log_prob"].cpu(),
                "answers": None if answers is None else [None if a is None else str(a) for a in answers],
                "advantages": out[0].detach().cpu(),
                "diagnostics": dict(data.meta_info.get("calibrl/advantage", {})) if data is not None else {},
            })
        return out

    recorded._e2e_recorded = True  # type: ignore[attr-defined]
    return recorded


def install() -> None:
    """Wrap every calibrl estimator in verl's registry (after ``calibrl.verl`` registered them)."""
    from verl.trainer.ppo import core_algos

    for name, fn in list(core_algos.ADV_ESTIMATOR_REGISTRY.items()):
        if getattr(fn, "calibrl_estimator", None) is not None:
            core_algos.ADV_ESTIMATOR_REGISTRY[name] = wrap_estimator(fn)


install()
