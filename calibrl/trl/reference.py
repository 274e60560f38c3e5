"""The frozen reference model that CAPO's noise mask reads, loaded even when ``beta == 0`` (no KL term).

TRL 1.16's ``GRPOTrainer.__init__`` builds a reference only when ``beta > 0``: from the model's path, or, with PEFT,
the adapter-disabled base (or a "ref" adapter). calibrl needs one whenever the estimator reads
``ref_logprob_mean`` (CAPO with a mask), so :func:`plan_reference` decides, before TRL's ``__init__`` runs, either
to copy the initial model itself (a plain model instance: TRL would reload it from a path an in-memory model does
not have) or to let TRL build its own by showing it ``beta = 1`` during ``__init__`` (then set back to 0).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from calibrl.trl.trainer import CalibratedGRPOTrainer

__all__ = ["ReferencePlan", "install_reference", "plan_reference"]


@dataclass
class ReferencePlan:
    own_ref: Any = None  # a copy of the initial model, installed after TRL's __init__
    beta_during_init: float | None = None  # args.beta shown to TRL's __init__ (None: the real one)


def plan_reference(model: Any, args: Any, *, needs_ref: bool, peft_config: Any = None) -> ReferencePlan:
    """How the reference is obtained (see the module docstring); ``needs_ref`` is the estimator's need, and
    ``beta > 0`` (TRL's KL term) needs one too."""
    needs_ref = needs_ref or args.beta != 0.0
    if not needs_ref:
        return ReferencePlan()
    from accelerate.utils import is_peft_model
    from transformers import PreTrainedModel

    plain_instance = isinstance(model, PreTrainedModel) and not is_peft_model(model) and peft_config is None
    in_memory = plain_instance and not getattr(model.config, "_name_or_path", "")
    if plain_instance and (args.beta == 0.0 or (in_memory and not args.sync_ref_model)):
        # Copy of the initial model, taken before TRL patches the policy's forward. (TRL itself reloads the
        # reference from the model's path, which a model built in memory does not have.)
        return ReferencePlan(own_ref=copy.deepcopy(model), beta_during_init=0.0 if args.beta != 0.0 else None)
    if args.beta == 0.0:
        # Let TRL build its reference (from the model path, or the PEFT adapter-disabled base / "ref" adapter)
        # exactly as it does for beta > 0, then set beta back to 0 (no KL term).
        return ReferencePlan(beta_during_init=1.0)
    return ReferencePlan()


def install_reference(trainer: CalibratedGRPOTrainer, ref: Any) -> None:
    """Freeze ``ref`` and prepare it as TRL 1.16's ``GRPOTrainer.__init__`` prepares its own ``ref_model``
    (dropout off, fused LM head at the sampling temperature, DeepSpeed / FSDP / accelerate wrapping)."""
    from trl.models import prepare_deepspeed, prepare_fsdp
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    if trainer.args.disable_dropout:
        disable_dropout_in_model(ref)
    add_fused_lm_head(ref, temperature=trainer.temperature)
    if trainer.is_deepspeed_enabled:
        ref = prepare_deepspeed(ref, trainer.accelerator)
    elif trainer.is_fsdp_enabled:
        ref = prepare_fsdp(ref, trainer.accelerator)
    else:
        ref = trainer.accelerator.prepare_model(ref, evaluation_mode=True)
    trainer.ref_model = ref
