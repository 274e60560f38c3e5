"""Policy losses: PPO-clip / GSPO with verl's aggregations (ppo), decision-token calibration (decision), SimKO,
Clip-Cov and KL-Cov (covariance).

Pure torch functions of per-token tensors; the engine adapters (calibrl.trl, verl) call them.
"""

from calibrl.losses.covariance import clip_cov_policy_loss, kl_cov_policy_loss
from calibrl.losses.decision import (
    chosen_classes,
    decision_token_loss,
    find_decision_positions,
    gather_decision_logits,
    zero_decision_advantages,
)
from calibrl.losses.ppo import AGGREGATIONS, aggregate_loss, kl_k3, policy_loss
from calibrl.losses.simko import simko_policy_loss

__all__ = [
    "AGGREGATIONS",
    "aggregate_loss",
    "chosen_classes",
    "clip_cov_policy_loss",
    "decision_token_loss",
    "find_decision_positions",
    "gather_decision_logits",
    "kl_cov_policy_loss",
    "kl_k3",
    "policy_loss",
    "simko_policy_loss",
    "zero_decision_advantages",
]
