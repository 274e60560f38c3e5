"""calibrl.verl against a real verl 0.9 install (CPU). Runs in .venv-verl (scripts/setup_verl_env.sh); the main
.venv has no verl and skips this file."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import calibrl  # noqa: E402
import calibrl.verl as cverl  # noqa: E402
from calibrl import RolloutBatch, RolloutBatchError  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos, ray_trainer  # noqa: E402

N_GROUPS, G, T = 4, 6, 7


def make_data(seed: int = 0, *, with_ref: bool = True) -> DataProto:
    """A verl-shaped batch: right-padded responses of varying length, the 0/1 score on the last response token
    (as verl's reward managers write it), uid strings shuffled so groups are not contiguous."""
    gen = torch.Generator().manual_seed(seed)
    n = N_GROUPS * G
    lengths = torch.randint(2, T + 1, (n,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    scores = torch.randint(0, 2, (n,), generator=gen).float()
    scores[:G] = 1.0  # one all-correct group
    token_level_rewards = torch.zeros(n, T)
    token_level_rewards[torch.arange(n), lengths - 1] = scores
    old = -torch.rand(n, T, generator=gen) * 3
    old[mask == 0] = -1e4  # junk in the pads must not leak into means
    tensors = {"token_level_rewards": token_level_rewards, "response_mask": mask, "old_log_probs": old}
    if with_ref:
        ref = -torch.rand(n, T, generator=gen) * 2
        tensors["ref_log_prob"] = ref
    uids = np.array([f"prompt-{i // G}-{'abcd'[i // G]}" for i in range(n)], dtype=object)
    perm = torch.randperm(n, generator=gen)
    data = DataProto.from_dict(tensors={k: v[perm] for k, v in tensors.items()}, non_tensors={"uid": uids[perm.numpy()]})
    return data


def expected_rollout_batch(data: DataProto) -> RolloutBatch:
    """The RolloutBatch the plugin should build, computed here independently of calibrl.verl."""
    mask = data.batch["response_mask"]
    lpm = lambda lp: (lp * mask).sum(-1) / mask.sum(-1)  # noqa: E731
    uids = list(data.non_tensor_batch["uid"])
    ids = {u: i for i, u in enumerate(sorted(set(uids)))}
    return RolloutBatch(
        rewards=data.batch["token_level_rewards"].sum(-1),
        group_ids=torch.tensor([ids[u] for u in uids]),
        logprob_mean=lpm(data.batch["old_log_probs"]),
        ref_logprob_mean=lpm(data.batch["ref_log_prob"]) if "ref_log_prob" in data.batch.keys() else None,
    )


def algo_config(**calibrl_params):
    return OmegaConf.create({"adv_estimator": "x", "gamma": 1.0, "lam": 1.0, "calibrl": calibrl_params})


def test_every_calibrl_estimator_and_loss_is_registered():
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    for name in calibrl.available_estimators():
        assert registry["calibrl_" + name].calibrl_estimator == name
    for name in set(calibrl.available_estimators()) - {"grpo", "rloo"}:  # plain names where verl has none
        assert registry[name].calibrl_estimator == name
    assert "capo" in registry
    # verl keeps its own grpo and rloo
    assert registry["grpo"] is core_algos.compute_grpo_outcome_advantage
    assert not hasattr(registry["rloo"], "calibrl_estimator")
    assert {"calibrl_ppo", "calibrl_gspo"} <= set(core_algos.POLICY_LOSS_REGISTRY)
    assert cverl.is_wrapped() and ray_trainer.compute_advantage._calibrl_wrapped
    assert cverl.install() == cverl.registered_names()  # idempotent


@pytest.mark.parametrize("params", [{"tau": 0.6}, {"tau": 0.3, "mask": "quantile", "normalize": "pairs"}])
def test_wrapped_advantage_step_capo_equals_calibrl(params):
    data = make_data(1)
    expected = calibrl.compute_advantages(expected_rollout_batch(data), "capo", **params)
    out = ray_trainer.compute_advantage(data, adv_estimator="capo", config=algo_config(**params))
    mask = data.batch["response_mask"]
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * mask)
    torch.testing.assert_close(out.batch["returns"], out.batch["advantages"])
    assert expected.abs().sum() > 0 and (out.batch["advantages"][mask == 0] == 0).all()
    # diagnostics travel with the batch
    assert out.meta_info["calibrl/advantage"]["estimator"] == "capo"
    assert cverl.last_info() == {k: v for k, v in out.meta_info["calibrl/advantage"].items() if k != "estimator"}


def test_v1_trainer_path_reaches_the_wrapper():
    """verl 0.9's default (V1) trainer calls v1.utils.compute_advantage_for_multi_trajectories."""
    from verl.trainer.ppo.v1 import utils as v1_utils

    assert v1_utils.compute_advantage is ray_trainer.compute_advantage
    data = make_data(2)
    expected = calibrl.compute_advantages(expected_rollout_batch(data), "capo", tau=0.6)
    keys = [f"{u}_0_0" for u in data.non_tensor_batch["uid"]]
    out = v1_utils.compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="calibrl_capo",
                                                             config=algo_config(tau=0.6))
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * data.batch["response_mask"])


@pytest.mark.parametrize("norm_by_std, ours", [(True, "calibrl_grpo"), (False, "calibrl_dr_grpo")])
def test_grpo_through_calibrl_equals_verl_grpo(norm_by_std, ours):
    data = make_data(3, with_ref=False)
    verl_out = ray_trainer.compute_advantage(data, adv_estimator="grpo", norm_adv_by_std_in_grpo=norm_by_std,
                                             config=algo_config()).batch["advantages"].clone()
    params = {"eps": 1e-6} if norm_by_std else {}  # verl's epsilon; calibrl's default is TRL's 1e-4
    ours_out = ray_trainer.compute_advantage(make_data(3, with_ref=False), adv_estimator=ours,
                                             config=algo_config(**params)).batch["advantages"]
    torch.testing.assert_close(ours_out, verl_out)


def test_params_from_environment_when_config_has_none(monkeypatch):
    data = make_data(4)
    monkeypatch.setenv(cverl.PARAMS_ENV, '{"tau": 2.0}')
    expected = calibrl.compute_advantages(expected_rollout_batch(data), "capo", tau=2.0)
    out = ray_trainer.compute_advantage(data, adv_estimator="capo", config=OmegaConf.create({"gamma": 1.0}))
    torch.testing.assert_close(out.batch["advantages"][:, 0], expected * data.batch["response_mask"][:, 0])


def test_unwrapped_call_explains_how_to_get_log_probs():
    data = make_data(5)
    fn = core_algos.get_adv_estimator_fn("capo")
    kwargs = dict(token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
                  index=data.non_tensor_batch["uid"], config=algo_config())
    with pytest.raises(RolloutBatchError, match="VERL_USE_EXTERNAL_MODULES=calibrl.verl"):
        fn(**kwargs)
    adv, _ = core_algos.get_adv_estimator_fn("calibrl_dr_grpo")(**kwargs)  # reward-only: fine without the wrapper
    assert adv.shape == data.batch["response_mask"].shape


def _actor_config(global_batch_info=None):
    from verl.workers.config.actor import FSDPActorConfig

    config = FSDPActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=4, use_dynamic_bsz=False,
                             ppo_mini_batch_size=4, clip_ratio=0.2)
    config.global_batch_info.update(global_batch_info or {})
    return config


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("info", [None, {"dp_size": 2, "batch_num_tokens": 50, "global_batch_size": 12,
                                         "loss_scale_factor": 9}])
def test_calibrl_policy_losses_match_verl(mode, info):
    gen = torch.Generator().manual_seed(6)
    n = 8
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (n,), generator=gen)[:, None])
    mask[-1] = False  # an all-masked row (e.g. TRL's mask_truncated_completions): verl's seq-mean skips it
    old = -torch.rand(n, T, generator=gen)
    logp = (old + 0.3 * torch.randn(n, T, generator=gen)).requires_grad_()  # ratios within (0.3, 3): no dual clip
    adv = torch.randn(n, generator=gen)[:, None] * mask
    config = _actor_config(info)
    for ours, theirs in (("calibrl_ppo", "vanilla"), ("calibrl_gspo", "gspo")):
        args = dict(old_log_prob=old, advantages=adv, response_mask=mask, loss_agg_mode=mode, config=config)
        ref_loss, ref_metrics = core_algos.get_policy_loss_fn(theirs)(log_prob=logp, **args)
        (ref_grad,) = torch.autograd.grad(ref_loss, logp)
        loss, metrics = core_algos.get_policy_loss_fn(ours)(log_prob=logp, **args)
        (grad,) = torch.autograd.grad(loss, logp)
        torch.testing.assert_close(loss, ref_loss)
        torch.testing.assert_close(grad, ref_grad)
        assert metrics["actor/pg_clipfrac"] == pytest.approx(ref_metrics["actor/pg_clipfrac"], abs=1e-6)
        assert metrics["actor/ppo_kl"] == pytest.approx(ref_metrics["actor/ppo_kl"], abs=1e-6)


def test_verl_imports_the_plugin_from_the_environment_variable():
    code = (
        "import sys, verl\n"
        "assert 'calibrl.verl' in sys.modules\n"
        "from verl.trainer.ppo import core_algos, ray_trainer\n"
        "from verl.trainer.ppo.v1 import utils\n"
        "assert core_algos.get_adv_estimator_fn('capo').calibrl_estimator == 'capo'\n"
        "assert ray_trainer.compute_advantage._calibrl_wrapped\n"
        "assert utils.compute_advantage is ray_trainer.compute_advantage\n"
        "print('plugin-ok')\n"
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "calibrl.verl"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plugin-ok" in result.stdout


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_capo_config(**env):
    """The hydra config examples/verl/run_capo.sh would launch (its DRY_RUN overrides, composed by verl's hydra)."""
    from hydra import compose, initialize_config_dir

    import verl

    script = os.path.join(ROOT, "examples", "verl", "run_capo.sh")
    overrides = subprocess.run(["bash", script], env={**os.environ, "DRY_RUN": "1", **env}, capture_output=True,
                               text=True, check=True).stdout.splitlines()
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_run_capo_example_is_a_valid_verl_config(tmp_path):
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = _run_capo_config(DATA_DIR=str(tmp_path))
    assert need_reference_policy(config) and not need_critic(config)  # ref_log_prob for the mask, no critic
    validate_config(config=config, use_reference_policy=True, use_critic=False)
    assert config.algorithm.adv_estimator == "capo"
    assert cverl.estimator_params(config.algorithm) == {"tau": 0.6, "normalize": "group", "mask": "fixed",
                                                        "ref_high": 2.5, "ref_low": 1.05}
    assert config.actor_rollout_ref.actor.kl_loss_coef == 0.0 and not config.algorithm.use_kl_in_reward

    # the data the script reads, written by prepare_data.py from calibrl's loaders (local fixture files here)
    sys.path.insert(0, os.path.join(ROOT, "examples", "verl"))
    try:
        import prepare_data
    finally:
        sys.path.pop(0)
    fixtures = os.path.join(ROOT, "tests", "fixtures")
    prepare_data.main(["--out", str(tmp_path), "--val", "aime24",
                       "--path", f"deepscaler={fixtures}/deepscaler.jsonl", "--path", f"aime24={fixtures}/aime24.jsonl"])
    import pandas as pd

    train = pd.read_parquet(tmp_path / "train.parquet")
    assert set(train.columns) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    row = train.iloc[0]
    assert row.prompt[0]["role"] == "user" and "\\boxed{}" in row.prompt[0]["content"]
    # verl loads the configured reward function exactly like this
    score = get_custom_reward_fn(config)
    gold = row.reward_model["ground_truth"]
    assert score(data_source=row.data_source, solution_str=f"so \\boxed{{{gold}}}", ground_truth=gold,
                 extra_info=row.extra_info) == 1.0
    assert score(data_source=row.data_source, solution_str="\\boxed{-7}", ground_truth=gold,
                 extra_info=row.extra_info) == 0.0
