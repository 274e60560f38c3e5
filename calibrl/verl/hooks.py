"""The wrapped advantage step: how calibrl's estimators get hold of the batch verl is computing advantages for.

verl calls a registered estimator with ``token_level_rewards``, ``response_mask``, ``index`` and ``config`` only,
no log-probs. We wrap ``verl.trainer.ppo.ray_trainer.compute_advantage`` (verl 0.9.1), the function both the
legacy and the V1 trainer call, so that while it runs the ``DataProto`` it was given is visible to calibrl's
estimators through a context variable (:func:`current_data`). The wrapper changes nothing else.

The default (V1) trainer, ``verl.trainer.ppo.v1.trainer_base``, also gets the wrappers of
:mod:`calibrl.verl.v1` (the inputs its fixed-field batch drops; the validation dump's ``logprob_mean``), and the
legacy ``RayPPOTrainer`` those of :mod:`calibrl.verl.legacy` (its validation dump's ``logprob_mean``).

Both trainers' ``_save_checkpoint`` / ``_load_checkpoint`` also save and restore CAPO's frozen quantile-mask
thresholds (:func:`wrap_checkpointing`).

verl imports the plugin from its own ``__init__`` (``VERL_USE_EXTERNAL_MODULES``), before the trainer modules
exist, so :func:`wrap_advantage_step` either patches each loaded module at once or installs an import hook
(:class:`_RayTrainerHook`) that patches it the moment it loads; the hook answers for :data:`PATCHED_MODULES` only.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import os
import sys
from typing import Any, Callable

RAY_TRAINER = "verl.trainer.ppo.ray_trainer"
V1_TRAINER = "verl.trainer.ppo.v1.trainer_base"
# Modules that bind ``compute_advantage`` by ``from verl.trainer.ppo.ray_trainer import compute_advantage``.
_DEPENDENTS = ("verl.trainer.ppo.v1.utils", "verl.experimental.separation.ray_trainer")

_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("calibrl_verl_data", default=None)


def current_data() -> Any:
    """The ``DataProto`` the wrapped ``compute_advantage`` is running on in this context, else None."""
    return _CURRENT.get()


def wrap_compute_advantage(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` made to expose its ``data`` to calibrl's estimators (via :func:`current_data`) while it runs.

    Wraps ``verl.trainer.ppo.ray_trainer.compute_advantage(data, adv_estimator, gamma, lam, num_repeat,
    norm_adv_by_std_in_grpo, config)`` as of verl 0.9.1: every argument is passed through unchanged, and the
    result is the wrapped function's. Wrapping twice returns ``fn`` itself.
    """
    if getattr(fn, "_calibrl_wrapped", False):
        return fn

    @functools.wraps(fn)
    def compute_advantage(data: Any, *args: Any, **kwargs: Any) -> Any:
        token = _CURRENT.set(data)
        try:
            return fn(data, *args, **kwargs)
        finally:
            _CURRENT.reset(token)

    compute_advantage._calibrl_wrapped = True  # type: ignore[attr-defined]
    return compute_advantage


def checkpoint_folder_loaded(trainer: Any) -> str | None:
    """The ``global_step_N`` folder verl 0.9.1's ``_load_checkpoint`` just resumed ``trainer`` from, else None:
    ``trainer.resume_from_path`` with ``resume_mode=resume_path``, else ``default_local_dir/global_step_N``
    (relative paths against the working directory, as verl reads them)."""
    cfg = trainer.config.trainer
    steps = int(getattr(trainer, "global_steps", 0) or 0)
    if cfg.resume_mode == "disable" or steps <= 0:
        return None
    folder = cfg.resume_from_path if cfg.resume_mode == "resume_path" else os.path.join(
        cfg.default_local_dir, f"global_step_{steps}")
    return os.path.abspath(folder)


def wrap_checkpointing(cls: Any) -> None:
    """Wrap ``cls._save_checkpoint`` / ``cls._load_checkpoint`` (verl 0.9.1's ``RayPPOTrainer`` and V1
    ``PPOTrainer``): after a save, :func:`calibrl.verl.advantage.save_quantile_masks` into the new
    ``default_local_dir/global_step_N``; after a load, :func:`~calibrl.verl.advantage.load_quantile_masks` from the
    folder resumed (:func:`checkpoint_folder_loaded`). Both run in the trainer's process, which is the one that
    computes the advantages. Idempotent; a class without the methods is left alone."""
    if cls is None or getattr(cls, "_calibrl_checkpointing", False):
        return
    save, load = getattr(cls, "_save_checkpoint", None), getattr(cls, "_load_checkpoint", None)
    if save is None or load is None:
        return

    @functools.wraps(save)
    def _save_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = save(self, *args, **kwargs)
        from calibrl.verl.advantage import save_quantile_masks

        save_quantile_masks(os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}"))
        return out

    @functools.wraps(load)
    def _load_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = load(self, *args, **kwargs)
        folder = checkpoint_folder_loaded(self)
        if folder is not None:
            from calibrl.verl.advantage import load_quantile_masks

            load_quantile_masks(folder)
        return out

    cls._save_checkpoint, cls._load_checkpoint = _save_checkpoint, _load_checkpoint
    cls._calibrl_checkpointing = True


def _patch_ray_trainer(module: Any) -> None:
    """Replace ``compute_advantage`` in ``verl.trainer.ppo.ray_trainer`` (verl 0.9.1) by its wrapped version.

    Also rebinds the copies that ``verl.trainer.ppo.v1.utils`` (the V1 trainer's
    ``compute_advantage_for_multi_trajectories``) and ``verl.experimental.separation.ray_trainer`` took with
    ``from verl.trainer.ppo.ray_trainer import compute_advantage`` if they were imported before we got here, and
    adds the legacy trainer's validation-dump wrappers (:func:`calibrl.verl.legacy.patch_legacy_trainer`).
    """
    original = getattr(module, "compute_advantage", None)
    if original is None:
        return
    wrapped = wrap_compute_advantage(original)
    module.compute_advantage = wrapped
    for name in _DEPENDENTS:
        dependent = sys.modules.get(name)
        if dependent is not None and getattr(dependent, "compute_advantage", None) is original:
            dependent.compute_advantage = wrapped
    from calibrl.verl.legacy import patch_legacy_trainer

    patch_legacy_trainer(module)
    wrap_checkpointing(getattr(module, "RayPPOTrainer", None))


def _patch_v1_trainer(module: Any) -> None:
    """Apply :func:`calibrl.verl.v1.patch_v1_trainer` to ``verl.trainer.ppo.v1.trainer_base`` (verl 0.9.1)."""
    from calibrl.verl.v1 import patch_v1_trainer

    patch_v1_trainer(module)
    wrap_checkpointing(getattr(module, "PPOTrainer", None))


# module name -> what to do to it once loaded
PATCHED_MODULES: dict[str, Callable[[Any], None]] = {RAY_TRAINER: _patch_ray_trainer, V1_TRAINER: _patch_v1_trainer}


class _PatchingLoader(importlib.abc.Loader):
    """Wraps the real loader of a module of :data:`PATCHED_MODULES` (verl 0.9.1): executes the module with it, then
    patches it, so e.g. ``compute_advantage`` is wrapped before anyone can import it."""

    def __init__(self, loader: Any, patch: Callable[[Any], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)


class _RayTrainerHook(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`PATCHED_MODULES` (verl 0.9.1) with the other finders and hands each a patching
    loader; every other module name is left to the other finders."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = PATCHED_MODULES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def _hook_installed() -> bool:
    """Whether a :class:`_RayTrainerHook` is on ``sys.meta_path``."""
    return any(isinstance(finder, _RayTrainerHook) for finder in sys.meta_path)


def wrap_advantage_step() -> None:
    """Patch each module of :data:`PATCHED_MODULES` now if it is loaded, and the others when they load (the V1
    trainer imports ``ray_trainer`` first, so the hook stays until both are in). Idempotent."""
    for name, patch in PATCHED_MODULES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
    if not all(name in sys.modules for name in PATCHED_MODULES) and not _hook_installed():
        sys.meta_path.insert(0, _RayTrainerHook())


def is_wrapped() -> bool:
    """Whether verl's compute_advantage (if imported) is wrapped, or will be when it is imported."""
    module = sys.modules.get(RAY_TRAINER)
    if module is None:
        return _hook_installed()
    return bool(getattr(module.compute_advantage, "_calibrl_wrapped", False))
