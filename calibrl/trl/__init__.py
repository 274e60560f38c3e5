"""TRL engine adapter: ``CalibratedGRPOConfig`` and ``CalibratedGRPOTrainer``."""

from calibrl.trl.trainer import CalibratedGRPOConfig, CalibratedGRPOTrainer, estimator_inputs, extract_answer

__all__ = ["CalibratedGRPOConfig", "CalibratedGRPOTrainer", "extract_answer", "estimator_inputs"]
