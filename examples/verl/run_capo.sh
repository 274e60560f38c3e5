#!/usr/bin/env bash
# CAPO (arXiv 2604.12632) with verl's PPO trainer: Qwen2.5-Math-1.5B on 20k DeepScaleR problems, the paper's
# hyper-parameters (lr 1e-6, batch 128, PPO mini-batch 64, n = 8, clip 0.2, no KL, no entropy bonus,
# temperature 1.0, tau 0.6, noise mask 2.5 / 1.05, 600 steps; evaluation mean@16).
#
# NOT RUN by calibrl's tests or CI (it needs GPUs, vLLM and the hub); tests/test_verl.py only checks that these
# overrides compose into a valid verl 0.9.1 config (DRY_RUN=1). See docs/verl.md.
#
#   pip install "verl[vllm]==0.9.1" && pip install -e /path/to/calibrl   # a GPU environment, not .venv-verl
#   python examples/verl/prepare_data.py --out ~/data/capo
#   bash examples/verl/run_capo.sh [extra hydra overrides...]
#
# Environment: MODEL, DATA_DIR, N_GPUS (8), NNODES (1), TAU (0.6), MASK (fixed | quantile | none),
# ESTIMATOR (capo; e.g. calibrl_grpo or verl's grpo for the baseline), LOSS_MODE (vanilla; calibrl_ppo for the
# exact objective the TRL trainer uses), LOGGER ('["console"]'), VAL_DIR (validation samples, <step>.jsonl with
# the plugin's logprob_mean: `calibrl eval --format verl $VAL_DIR/600.jsonl`), DRY_RUN=1 prints the overrides and exits.
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2.5-Math-1.5B}"
DATA_DIR="${DATA_DIR:-$HOME/data/capo}"
N_GPUS="${N_GPUS:-8}"
NNODES="${NNODES:-1}"
TAU="${TAU:-0.6}"            # 0.6 for 1.5B, 0.5 for 7B (paper); {0.4, 0.6, 1.0} differ by < 1 point
MASK="${MASK:-fixed}"        # fixed: PPL_ref thresholds below (quartiles of Qwen2.5-Math's PPL_ref); quantile: per batch
ESTIMATOR="${ESTIMATOR:-capo}"
LOSS_MODE="${LOSS_MODE:-vanilla}"
LOGGER="${LOGGER:-[\"console\"]}"
VAL_DIR="${VAL_DIR:-$PWD/runs/verl_${ESTIMATOR}_tau${TAU}/val}"

# calibrl's plugin: verl imports it in every process (driver, TaskRunner, workers). On a multi-node Ray cluster
# started separately, the variable must reach the workers too: the runtime_env override below forwards it.
export VERL_USE_EXTERNAL_MODULES=calibrl.verl

overrides=(
    # data: 1024-token prompts + 3072-token responses fill Qwen2.5-Math's 4096-token context (our choice; the
    # paper does not give lengths)
    "data.train_files=$DATA_DIR/train.parquet"
    "data.val_files=$DATA_DIR/val.parquet"
    "data.train_batch_size=128"
    "data.max_prompt_length=1024"
    "data.max_response_length=3072"
    "data.filter_overlong_prompts=True"
    "data.truncation=error"
    # policy
    "actor_rollout_ref.model.path=$MODEL"
    "actor_rollout_ref.model.use_remove_padding=True"
    "actor_rollout_ref.model.enable_gradient_checkpointing=True"
    "actor_rollout_ref.actor.optim.lr=1e-6"
    "actor_rollout_ref.actor.ppo_mini_batch_size=64"
    "actor_rollout_ref.actor.use_dynamic_bsz=True"
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384"
    "actor_rollout_ref.actor.clip_ratio=0.2"
    "actor_rollout_ref.actor.entropy_coeff=0"
    "actor_rollout_ref.actor.policy_loss.loss_mode=$LOSS_MODE"
    # the reference model runs only for CAPO's noise mask (ref_log_prob); its KL term has weight 0
    "actor_rollout_ref.actor.use_kl_loss=True"
    "actor_rollout_ref.actor.kl_loss_coef=0.0"
    "algorithm.use_kl_in_reward=False"
    # rollouts: vLLM, n = 8 at temperature 1.0; evaluation mean@16 at temperature 1.0
    "actor_rollout_ref.rollout.name=vllm"
    "actor_rollout_ref.rollout.n=8"
    "actor_rollout_ref.rollout.temperature=1.0"
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1"
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32"
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32"
    "actor_rollout_ref.rollout.val_kwargs.n=16"
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True"
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"
    # the calibrl estimator and its parameters (passed as keyword arguments to calibrl's capo)
    "algorithm.adv_estimator=$ESTIMATOR"
    "+algorithm.calibrl.tau=$TAU"
    "+algorithm.calibrl.normalize=group"
    "+algorithm.calibrl.mask=$MASK"
    "+algorithm.calibrl.ref_high=2.5"
    "+algorithm.calibrl.ref_low=1.05"
    # reward: math-verify on the last \boxed{} answer (calibrl.tasks.rewards). "pkg://" imports the module by
    # name; a file path would load a second copy that clashes with calibrl's reward registry.
    "reward.custom_reward_function.path=pkg://calibrl.tasks.rewards"
    "reward.custom_reward_function.name=verl_compute_score"
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=calibrl.verl"
    # trainer
    "trainer.logger=$LOGGER"
    "trainer.project_name=calibrl"
    "trainer.experiment_name=capo_qwen2.5-math-1.5b_deepscaler_tau${TAU}"
    "trainer.n_gpus_per_node=$N_GPUS"
    "trainer.nnodes=$NNODES"
    "trainer.total_training_steps=600"
    "trainer.save_freq=100"
    "trainer.test_freq=50"
    "trainer.val_before_train=True"
    "trainer.validation_data_dir=$VAL_DIR"
    "critic.enable=False"
)

if [ "${DRY_RUN:-0}" = "1" ]; then
    printf '%s\n' "${overrides[@]}" "$@"
    exit 0
fi
exec python -m verl.trainer.main_ppo "${overrides[@]}" "$@"
