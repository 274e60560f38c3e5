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


# the variable's import of the plugin and what it patches: tests/test_verl_entry_point.py (one process for both)


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

    config = _run_capo_config(DATA_DIR=str(tmp_path), VAL_DIR=str(tmp_path / "val"))
    assert need_reference_policy(config) and not need_critic(config)  # ref_log_prob for the mask, no critic
    validate_config(config=config, use_reference_policy=True, use_critic=False)
    assert config.algorithm.adv_estimator == "capo"
    assert cverl.estimator_params(config.algorithm) == {"tau": 0.6, "normalize": "group", "mask": "fixed",
                                                        "ref_high": 2.5, "ref_low": 1.05}
    assert config.actor_rollout_ref.actor.kl_loss_coef == 0.0 and not config.algorithm.use_kl_in_reward
    # validation dumps (with the plugin's logprob_mean) for `calibrl eval --format verl`; rollout log-probs on
    assert config.trainer.validation_data_dir == str(tmp_path / "val")
    assert config.actor_rollout_ref.rollout.calculate_log_probs

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


def test_abstention_reward_through_verls_loader_with_its_reward_kwargs():
    """verl's own loader (get_custom_reward_fn) with the overrides docs/abstention.md gives: the risk threshold
    arrives through reward_kwargs, and the outcome rides beside the score."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    base = OmegaConf.create({"reward": {"custom_reward_function": {"path": None, "name": "compute_score"}}})
    overrides = ["reward.custom_reward_function.path=pkg://calibrl.tasks.rewards",
                 "reward.custom_reward_function.name=verl_abstention_score",
                 "+reward.custom_reward_function.reward_kwargs.threshold=0.75"]
    dotlist = [o.lstrip("+") for o in overrides]
    config = OmegaConf.merge(base, OmegaConf.from_dotlist(dotlist))
    score = get_custom_reward_fn(config)
    wrong = score(data_source="math", solution_str="\\boxed{3}", ground_truth="4", extra_info={})
    idk = score(data_source="math", solution_str="\\boxed{IDK}", ground_truth="4", extra_info={})
    right = score(data_source="math", solution_str="\\boxed{4}", ground_truth="4", extra_info={})
    assert wrong == {"score": -3.0, "acc": 0.0, "abstained": False}
    assert idk == {"score": 0.0, "acc": 0.0, "abstained": True}
    assert right == {"score": 1.0, "acc": 1.0, "abstained": False}


# --- verl's default (V1) trainer: its own advantage step and validation, on an in-memory TransferQueue ---------


class FakeTransferQueue:
    """The three TransferQueue calls verl 0.9.1's V1 trainer makes (kv_batch_put / kv_batch_get / kv_clear), on a
    dict. Rows are stored and returned exactly as the agent loop puts them (``list_of_dict_to_tensordict``), and,
    like the real queue, a requested field that a row does not have is left out."""

    def __init__(self):
        self.rows: dict[tuple[str, str], dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        for i, key in enumerate(keys):
            row = self.rows.setdefault((partition_id, key), {})
            if fields is not None:
                row.update({name: fields[name][i] for name in fields.keys()})

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        rows = [self.rows[(partition_id, key)] for key in keys]
        return list_of_dict_to_tensordict([{f: r[f] for f in select_fields if f in r} for r in rows])

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.rows.pop((partition_id, key), None)

    def install(self, monkeypatch):
        import transfer_queue

        for name in ("kv_batch_put", "kv_batch_get", "kv_clear"):
            monkeypatch.setattr(transfer_queue, name, getattr(self, name))
        return self


def agent_loop_rows(seed: int, *, n_prompts: int = 3, n: int = 4, answers: bool = True):
    """V1 agent-loop outputs as ``AgentLoopWorkerTQ._agent_loop_postprocess`` (verl 0.9.1) stores them: keys
    ``{uid}_{session}_0``, unpadded per-row tensors, the score on the last response token (``rm_scores``) and the
    reward function's extra info under ``extra_fields["reward_extra_info"]``."""
    gen = torch.Generator().manual_seed(seed)
    keys, rows = [], []
    for p in range(n_prompts):
        for s in range(n):
            length = int(torch.randint(2, T + 1, (1,), generator=gen))
            score = float(torch.randint(0, 2, (1,), generator=gen))
            rm = torch.zeros(length)
            rm[-1] = score
            old = -torch.rand(length, generator=gen) * 3
            info = {"acc": score, **({"answer": str(int(torch.randint(0, 3, (1,), generator=gen)))} if answers else {})}
            keys.append(f"prompt{p}_{s}_0")
            rows.append({"uid": f"prompt{p}", "response_mask": torch.ones(length, dtype=torch.int64), "rm_scores": rm,
                         "old_log_probs": old, "rollout_log_probs": old.clone(),
                         "ref_log_prob": -torch.rand(length, generator=gen) * 2,
                         "extra_fields": {"reward_extra_info": info}})
    return keys, rows


def v1_config(estimator, *, params=None, rollout_correction=None, n=4):
    return OmegaConf.create({
        "algorithm": {"adv_estimator": estimator, "gamma": 1.0, "lam": 1.0, "use_kl_in_reward": False,
                      "norm_adv_by_std_in_grpo": True, "calibrl": params or {},
                      "rollout_correction": rollout_correction},
        "actor_rollout_ref": {"rollout": {"n": n}},
    })


def run_v1_advantage_step(monkeypatch, keys, rows, config):
    """verl 0.9.1's ``PPOTrainer._compute_advantage`` (V1) on ``rows``: it reads its fixed field list from the
    queue, builds the DataProto, applies rollout correction and writes advantages back. Returns the queue."""
    from types import SimpleNamespace

    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    tq = FakeTransferQueue().install(monkeypatch)
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows))
    PPOTrainer._compute_advantage(SimpleNamespace(config=config),
                                  KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train"), metrics={})
    return tq


def rollout_batch_of_rows(rows, keep=None):
    """The RolloutBatch of ``rows`` (only those where ``keep``), computed here independently of calibrl.verl."""
    keep = [True] * len(rows) if keep is None else keep
    rows = [r for r, k in zip(rows, keep) if k]
    uids = sorted({r["uid"] for r in rows})
    answers = [r["extra_fields"]["reward_extra_info"].get("answer") for r in rows]
    return RolloutBatch(
        rewards=torch.tensor([float(r["rm_scores"].sum()) for r in rows]),
        group_ids=torch.tensor([uids.index(r["uid"]) for r in rows]),
        logprob_mean=torch.stack([r["old_log_probs"].mean() for r in rows]),
        ref_logprob_mean=torch.stack([r["ref_log_prob"].mean() for r in rows]),
        answer_ids=None if None in answers else torch.tensor([int(a) for a in answers]),
        lengths=torch.tensor([len(r["response_mask"]) for r in rows]),
    )


def test_v1_advantage_step_gives_seed_grpo_the_reward_functions_answers(monkeypatch):
    """The V1 advantage step fetches only uid, masks, scores and log-probs; the ``answer`` of the reward's extra
    info (seed_grpo's semantic clusters) must still reach the estimator."""
    keys, rows = agent_loop_rows(7)
    tq = run_v1_advantage_step(monkeypatch, keys, rows, v1_config("seed_grpo"))
    expected = calibrl.compute_advantages(rollout_batch_of_rows(rows), "seed_grpo")
    got = torch.stack([tq.rows[("train", k)]["advantages"][0] for k in keys])
    torch.testing.assert_close(got, expected)
    assert expected.abs().sum() > 0
    for key, row in zip(keys, rows):  # broadcast over each response, written back unpadded
        assert tq.rows[("train", key)]["advantages"].shape == row["response_mask"].shape


def test_v1_advantage_step_without_answers_says_where_they_come_from(monkeypatch):
    keys, rows = agent_loop_rows(8, answers=False)
    with pytest.raises(RolloutBatchError, match="reward_extra_info"):
        run_v1_advantage_step(monkeypatch, keys, rows, v1_config("calibrl_seed_grpo"))


def test_v1_trainer_refuses_gcpo_at_construction():
    """verl computes no per-completion embeddings; the V1 trainer refuses gcpo before any rollout runs."""
    from verl.trainer.ppo.v1 import PPOTrainerSync

    for name in ("gcpo", "calibrl_gcpo"):
        with pytest.raises(ValueError, match=r"embeddings.*calibrl train.*trainer\.use_v1=False"):
            PPOTrainerSync(config=v1_config(name))


def test_rejected_rows_are_out_of_every_group_statistic(monkeypatch):
    """verl's rollout-correction rejection sampling zeroes response_mask before the advantage step: those rows
    get advantage 0 and the others get exactly what they would without the rejected rows."""
    keys, rows = agent_loop_rows(9)
    rejected = {1, 5, 6, 11}  # rollout log-probs far from the old policy: seq_max_k2 rejects them
    for i in rejected:
        rows[i]["rollout_log_probs"] = rows[i]["old_log_probs"] + 3.0
    rows[0]["rm_scores"][-1] = 1.0  # prompt0 keeps a correct and an incorrect answer
    rows[2]["rm_scores"][-1] = 0.0
    correction = {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": 1.0, "rollout_is": None, "bypass_mode": False}
    params = {"tau": 0.6}
    tq = run_v1_advantage_step(monkeypatch, keys, rows, v1_config("capo", params=params, rollout_correction=correction))
    for i in rejected:
        assert not tq.rows[("train", keys[i])]["response_mask"].any()  # verl's rejection really ran
        assert (tq.rows[("train", keys[i])]["advantages"] == 0).all()
    keep = [i not in rejected for i in range(len(rows))]
    expected, info = calibrl.compute_advantages(rollout_batch_of_rows(rows, keep), "capo", return_info=True, **params)
    got = torch.stack([tq.rows[("train", k)]["advantages"][0] for k, kept in zip(keys, keep) if kept])
    torch.testing.assert_close(got, expected)
    assert expected.abs().sum() > 0
    logged = cverl.last_info()
    assert logged.pop("n_empty_rows") == len(rejected)
    info.pop("n_empty_rows", None)
    assert logged == pytest.approx({k: float(v) for k, v in info.items()})


@pytest.mark.parametrize("calculate_log_probs", [True, False])
def test_v1_validation_dump_has_the_rollout_mean_token_log_prob(monkeypatch, tmp_path, calculate_log_probs):
    """verl 0.9.1's V1 ``_validate`` (rollout, reward, dump) on a fake queue: every row of
    ``validation_data_dir/<step>.jsonl`` gets ``logprob_mean``, the mean of the rollout's token log-probs (none
    when the rollout is told not to compute log-probs)."""
    import json
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    tq = FakeTransferQueue().install(monkeypatch)
    n = 3
    expected = {}

    class AgentLoop:
        def generate_sequences(self, batch):
            """Two prompts, ``n`` responses each, stored the way AgentLoopWorkerTQ stores them."""
            keys, rows = [], []
            gen = torch.Generator().manual_seed(10)
            for uid in batch["uid"]:
                for s in range(n):
                    length = int(torch.randint(1, T + 1, (1,), generator=gen))
                    logprobs = -torch.rand(length, generator=gen)
                    rm = torch.zeros(length)
                    rm[-1] = float(s % 2)
                    keys.append(f"{uid}_{s}_0")
                    expected[(f"{uid}_{s}_0")] = float(logprobs.mean())
                    rows.append({"uid": uid, "prompts": torch.arange(2 + s), "responses": torch.arange(length),
                                 "response_mask": torch.ones(length, dtype=torch.int64), "rm_scores": rm,
                                 "rollout_log_probs": logprobs, "num_turns": 2, "data_source": "toy",
                                 "reward_model": {"ground_truth": "1"},
                                 "extra_fields": {"reward_extra_info": {"acc": float(s % 2)}}})
            self.keys = keys
            tq.kv_batch_put(keys=keys, partition_id="val", fields=list_of_dict_to_tensordict(rows))

    agent_loop = AgentLoop()
    replay = SimpleNamespace(sample=lambda **kw: (KVBatchMeta(keys=agent_loop.keys, tags=[{}] * len(agent_loop.keys),
                                                              partition_id="val"), {}))
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"val_kwargs": {"n": n},
                                                                 "calculate_log_probs": calculate_log_probs}},
                               "trainer": {"validation_data_dir": str(tmp_path), "log_val_generations": 0}})
    trainer = SimpleNamespace(
        config=config, global_steps=3, agent_loop_manager=agent_loop, replay_buffer=replay,
        val_dataloader=[{"raw_prompt": np.array(["p", "q"], dtype=object),
                         "data_source": np.array(["toy", "toy"], dtype=object)}],
        reward_loop_manager=SimpleNamespace(reward_loop_worker_handles=["remote"]),
        tokenizer=SimpleNamespace(pad_token_id=0,
                                  decode=lambda ids, skip_special_tokens: " ".join(map(str, ids.tolist()))),
        _dump_executor=ThreadPoolExecutor(max_workers=1), _dump_futures=[],
    )
    for name in ("_maybe_log_val_generations", "_dump_generations", "_write_generations", "_val_metrics_update"):
        setattr(trainer, name, getattr(PPOTrainer, name).__get__(trainer))
    trainer._write_generations = PPOTrainer._write_generations
    metrics = PPOTrainer._validate(trainer)
    trainer._dump_executor.shutdown(wait=True)
    lines = [json.loads(line) for line in (tmp_path / "3.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * n and not set(expected) & {key for _, key in tq.rows}  # cleared as usual
    for line in lines:
        assert {"input", "output", "gts", "score", "step", "acc"} <= set(line)
        if calculate_log_probs:
            assert line["logprob_mean"] == pytest.approx(expected[line["uid"]], abs=1e-6)
        else:
            assert "logprob_mean" not in line
    assert not any("logprob_mean" in key for key in metrics)  # a dump column, not a validation metric


def test_legacy_validation_dump_has_the_rollout_mean_token_log_prob(tmp_path):
    """verl 0.9.1's legacy ``RayPPOTrainer._validate`` (trainer.use_v1=False): the same ``logprob_mean`` column,
    from the rollout's ``rollout_log_probs`` in the generated batch; verl's validation metrics stay as they were."""
    import json
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    n, n_prompts = 3, 2
    gen = torch.Generator().manual_seed(12)
    lengths = torch.randint(1, T + 1, (n * n_prompts,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    logprobs = -torch.rand(n * n_prompts, T, generator=gen)
    logprobs[mask == 0] = 0.0  # verl pads rollout log-probs with 0
    scores = torch.zeros(n * n_prompts, T)
    scores[torch.arange(n * n_prompts), lengths - 1] = (torch.arange(n * n_prompts) % 2).float()

    class Rollout:
        def generate_sequences(self, batch):
            """What verl's AgentLoopManager returns: padded responses, mask, rollout log-probs, scores."""
            assert len(batch) == n * n_prompts
            out = DataProto.from_dict(
                tensors={"prompts": torch.ones(len(batch), 2, dtype=torch.long), "responses": mask * 7,
                         "response_mask": mask, "rollout_log_probs": logprobs, "rm_scores": scores},
                non_tensors={"acc": scores.sum(-1).numpy()}, meta_info={"reward_extra_keys": ["acc"]})
            return out

    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"val_kwargs": {"n": n, "do_sample": True}, "agent": {"num_workers": 1}}},
        "trainer": {"validation_data_dir": str(tmp_path), "log_val_generations": 0}})
    trainer = SimpleNamespace(
        config=config, global_steps=5, async_rollout_manager=Rollout(), use_rm=False,
        val_dataloader=[{"input_ids": torch.ones(n_prompts, 2, dtype=torch.long),
                         "data_source": np.array(["toy"] * n_prompts, dtype=object),
                         "reward_model": np.array([{"ground_truth": "1"}] * n_prompts, dtype=object)}],
        tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=1,
                                  decode=lambda ids, skip_special_tokens: " ".join(map(str, ids.tolist()))),
        _dump_executor=ThreadPoolExecutor(max_workers=1), _dump_futures=[],
    )
    for name in ("_get_gen_batch", "_maybe_log_val_generations", "_dump_generations", "_val_metrics_update"):
        setattr(trainer, name, getattr(ray_trainer.RayPPOTrainer, name).__get__(trainer))
    trainer._write_generations = ray_trainer.RayPPOTrainer._write_generations
    metrics = ray_trainer.RayPPOTrainer._validate(trainer)
    trainer._dump_executor.shutdown(wait=True)
    lines = [json.loads(line) for line in (tmp_path / "5.jsonl").read_text().splitlines()]
    expected = ((logprobs * mask).sum(-1) / mask.sum(-1)).tolist()
    assert [line["logprob_mean"] for line in lines] == pytest.approx(expected, abs=1e-6)
    assert [line["score"] for line in lines] == scores.sum(-1).tolist() and "acc" in lines[0]
    assert metrics and not any("logprob_mean" in key for key in metrics)


def test_gcpo_without_embeddings_names_the_alternatives():
    """On the legacy trainer's path (ray_trainer.compute_advantage), gcpo stops at its first call without
    ``data.batch["embeddings"]``, saying where embeddings can come from."""
    with pytest.raises(RolloutBatchError, match=r"embeddings.*calibrl train.*trainer\.use_v1=False"):
        ray_trainer.compute_advantage(make_data(13), adv_estimator="gcpo", config=algo_config())


def test_intuitor_is_refused_in_verl_naming_the_trl_recipe():
    """verl computes no self-certainty: the legacy path stops at the advantage step, the V1 trainer before any
    rollout, both naming calibrl's TRL trainer."""
    from verl.trainer.ppo.v1 import PPOTrainerSync

    assert "calibrl_intuitor" in core_algos.ADV_ESTIMATOR_REGISTRY
    with pytest.raises(RolloutBatchError, match=r"self_certainty.*computes no self-certainty.*calibrl train"):
        ray_trainer.compute_advantage(make_data(13), adv_estimator="intuitor", config=algo_config())
    for name in ("intuitor", "calibrl_intuitor"):
        with pytest.raises(ValueError, match=r"self-certainty.*calibrl train intuitor_qwen2\.5-3b_deepscaler"):
            PPOTrainerSync(config=v1_config(name))


def test_capo_quantile_mask_freezes_first_batch_thresholds_in_verl():
    import math

    from calibrl.verl.advantage import reset_quantile_masks

    reset_quantile_masks()
    params = {"tau": 0.6, "mask": "quantile"}
    first, later = make_data(11), make_data(12)
    later.batch["ref_log_prob"] = later.batch["ref_log_prob"] * 0.5  # another perplexity distribution
    log_ppl = -expected_rollout_batch(first).ref_logprob_mean
    high, low = math.exp(float(torch.quantile(log_ppl, 0.75))), math.exp(float(torch.quantile(log_ppl, 0.25)))
    out = ray_trainer.compute_advantage(first, adv_estimator="capo", config=algo_config(**params))
    info = out.meta_info["calibrl/advantage"]
    assert (info["ref_high"], info["ref_low"]) == pytest.approx((high, low), rel=1e-6)
    # the next batch keeps the first batch's thresholds (calibrl_capo is the same estimator: same state)
    out = ray_trainer.compute_advantage(later, adv_estimator="calibrl_capo", config=algo_config(**params))
    info = out.meta_info["calibrl/advantage"]
    assert (info["ref_high"], info["ref_low"]) == pytest.approx((high, low), rel=1e-6)
    expected = calibrl.compute_advantages(expected_rollout_batch(later), "capo", tau=0.6, mask="fixed",
                                          ref_high=info["ref_high"], ref_low=info["ref_low"])
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * later.batch["response_mask"])
    # batch_quantile: the later batch's own quantiles
    out = ray_trainer.compute_advantage(make_data(12), adv_estimator="capo",
                                        config=algo_config(tau=0.6, mask="batch_quantile"))
    own = -expected_rollout_batch(make_data(12)).ref_logprob_mean
    assert out.meta_info["calibrl/advantage"]["ref_high"] == pytest.approx(math.exp(float(torch.quantile(own, 0.75))))
    # after a resume: the logged thresholds passed back freeze them from the start
    reset_quantile_masks()
    seeded = dict(params, ref_high=high, ref_low=low)
    out = ray_trainer.compute_advantage(later, adv_estimator="capo", config=algo_config(**seeded))
    assert out.meta_info["calibrl/advantage"]["ref_high"] == pytest.approx(high, rel=1e-12)
    reset_quantile_masks()


def test_capo_quantile_thresholds_travel_with_verl_checkpoints(tmp_path, monkeypatch):
    import json

    from verl.trainer.ppo.v1 import trainer_base

    from calibrl.verl.advantage import QUANTILE_MASK_FILE, reset_quantile_masks
    from calibrl.verl.hooks import wrap_checkpointing

    # both of verl's trainers are wrapped
    assert ray_trainer.RayPPOTrainer._calibrl_checkpointing and trainer_base.PPOTrainer._calibrl_checkpointing

    class Trainer:
        """verl's checkpoint methods reduced to what the wrappers read: config.trainer and global_steps."""

        def __init__(self, resume_mode="auto", resume_from_path=None):
            self.config = OmegaConf.create({"trainer": {"default_local_dir": "ckpts", "resume_mode": resume_mode,
                                                        "resume_from_path": resume_from_path}})
            self.global_steps = 0

        def _save_checkpoint(self):
            os.makedirs(os.path.join("ckpts", f"global_step_{self.global_steps}"), exist_ok=True)

        def _load_checkpoint(self):  # resume_mode=auto: the newest global_step_N
            if self.config.trainer.resume_mode == "resume_path":
                self.global_steps = int(self.config.trainer.resume_from_path.split("global_step_")[-1])
            else:
                self.global_steps = max(int(p.split("_")[-1]) for p in os.listdir("ckpts"))

    wrap_checkpointing(Trainer)
    monkeypatch.chdir(tmp_path)
    reset_quantile_masks()
    params = {"tau": 0.6, "mask": "quantile"}
    out = ray_trainer.compute_advantage(make_data(11), adv_estimator="capo", config=algo_config(**params))
    frozen = (out.meta_info["calibrl/advantage"]["ref_high"], out.meta_info["calibrl/advantage"]["ref_low"])
    run = Trainer()
    run.global_steps = 5
    run._save_checkpoint()
    saved = json.loads((tmp_path / "ckpts" / "global_step_5" / QUANTILE_MASK_FILE).read_text())
    assert saved[0]["estimator"] == "capo" and saved[0]["state"]["ref_ppl_high_low"] == pytest.approx(list(frozen))

    later = make_data(12)
    later.batch["ref_log_prob"] = later.batch["ref_log_prob"] * 0.5
    for resumed in (Trainer(), Trainer("resume_path", "ckpts/global_step_5")):
        reset_quantile_masks()  # a new process
        resumed._load_checkpoint()
        out = ray_trainer.compute_advantage(later, adv_estimator="capo", config=algo_config(**params))
        info = out.meta_info["calibrl/advantage"]
        assert (info["ref_high"], info["ref_low"]) == pytest.approx(frozen, rel=1e-12)
    # without the file: the first batch after the resume sets them
    (tmp_path / "ckpts" / "global_step_5" / QUANTILE_MASK_FILE).unlink()
    reset_quantile_masks()
    Trainer()._load_checkpoint()
    out = ray_trainer.compute_advantage(later, adv_estimator="capo", config=algo_config(**params))
    assert out.meta_info["calibrl/advantage"]["ref_high"] != pytest.approx(frozen[0], rel=1e-6)
    reset_quantile_masks()


def test_grpo_mask_reads_the_reference_and_freezes_the_first_batch_thresholds_in_verl():
    """GRPO + CAPO's mask (the paper's ablation): registered under its plain name, the reference log-probs read from
    ``ref_log_prob`` as for capo, the quantile thresholds frozen in their own state."""
    from calibrl.verl.advantage import reset_quantile_masks

    reset_quantile_masks()
    assert core_algos.ADV_ESTIMATOR_REGISTRY["grpo_mask"].calibrl_estimator == "grpo_mask"
    params = {"mask": "quantile"}
    first, later = make_data(11), make_data(12)
    later.batch["ref_log_prob"] = later.batch["ref_log_prob"] * 0.5
    expected = calibrl.compute_advantages(expected_rollout_batch(first), "grpo_mask", mask="quantile")
    out = ray_trainer.compute_advantage(first, adv_estimator="grpo_mask", config=algo_config(**params))
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * first.batch["response_mask"])
    frozen = (out.meta_info["calibrl/advantage"]["ref_high"], out.meta_info["calibrl/advantage"]["ref_low"])
    out = ray_trainer.compute_advantage(later, adv_estimator="calibrl_grpo_mask", config=algo_config(**params))
    info = out.meta_info["calibrl/advantage"]
    assert (info["ref_high"], info["ref_low"]) == frozen
    expected = calibrl.compute_advantages(expected_rollout_batch(later), "grpo_mask", mask="fixed",
                                          ref_high=frozen[0], ref_low=frozen[1])
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * later.batch["response_mask"])
    with pytest.raises(RolloutBatchError, match="ref_logprob_mean"):
        ray_trainer.compute_advantage(make_data(13, with_ref=False), adv_estimator="grpo_mask",
                                      config=algo_config(**params))
    reset_quantile_masks()


def test_seed_grpo_clusters_the_reward_functions_answers_by_equivalence():
    """``12`` and ``12.0`` are one meaning for SEED-GRPO's semantic entropy (the grader's equivalence, not string
    equality); a missing answer (None, or NaN from an object array) is a cluster of its own."""
    from calibrl.verl.advantage import rollout_batch_from_verl

    mask = torch.ones(6, 3)
    batch = rollout_batch_from_verl(token_level_rewards=torch.zeros(6, 3), response_mask=mask,
                                    index=np.array(["u0"] * 4 + ["u1"] * 2, dtype=object),
                                    answers=np.array(["12", "12.0", "13", None, "12", float("nan")], dtype=object))
    assert batch.answer_ids.tolist() == [0, 0, 1, -1, 2, -1]


def test_the_custom_estimator_page_runs_in_verl(tmp_path, monkeypatch):
    """docs/custom-estimator.md's file, as written on the page: verl resolves it through its own
    VERL_USE_EXTERNAL_MODULES in a fresh process (listed after calibrl.verl: registered in verl when registered in
    calibrl), and verl's advantage step gives calibrl's numbers with its parameters from algorithm.calibrl."""
    import re

    page = open(os.path.join(ROOT, "docs", "custom-estimator.md")).read()
    (tmp_path / "my_estimators.py").write_text(re.findall(r"```python\n(.*?)```", page, re.S)[0])
    code = ("import verl\n"
            "from verl.trainer.ppo import core_algos\n"
            "for name in ('overconfidence_grpo', 'calibrl_overconfidence_grpo'):\n"
            "    assert core_algos.get_adv_estimator_fn(name).calibrl_estimator == 'overconfidence_grpo'\n"
            "print('plugin-ok')\n")
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "calibrl.verl,my_estimators",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plugin-ok" in result.stdout

    assert "overconfidence_grpo" not in core_algos.ADV_ESTIMATOR_REGISTRY
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_estimators  # noqa: F401  (registered after calibrl.verl: reaches verl's registry at once)

    data = make_data(2)
    expected = calibrl.compute_advantages(expected_rollout_batch(data), "overconfidence_grpo", beta=0.7)
    out = ray_trainer.compute_advantage(data, adv_estimator="overconfidence_grpo", config=algo_config(beta=0.7))
    mask = data.batch["response_mask"]
    torch.testing.assert_close(out.batch["advantages"], expected[:, None] * mask)
    grpo = calibrl.compute_advantages(expected_rollout_batch(data), "grpo")
    assert not torch.allclose(expected, grpo)  # the penalty acted
    assert out.meta_info["calibrl/advantage"]["penalty_abs_mean"] > 0


def _cov_config(**policy_loss):
    """An actor config with verl's Clip-Cov / KL-Cov parameters (clip range 0.2 / 0.28)."""
    from verl.workers.config.actor import FSDPActorConfig, PolicyLossConfig

    return FSDPActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=4, use_dynamic_bsz=False,
                           ppo_mini_batch_size=4, clip_ratio=0.2, clip_ratio_high=0.28,
                           policy_loss=PolicyLossConfig(**policy_loss))


def _cov_tensors(seed: int, per_token: bool):
    """16 completions of up to 40 tokens (no empty row: verl's seq-mean skips those, calibrl's counts them as 0),
    ratios within (0.4, 2.5) so the PPO clip acts on some tokens; advantages per row or per token."""
    gen = torch.Generator().manual_seed(seed)
    n, t = 16, 40
    mask = (torch.arange(t)[None, :] < torch.randint(5, t + 1, (n,), generator=gen)[:, None]).float()
    old = -3 * torch.rand(n, t, generator=gen)
    logp = (old + 0.3 * torch.randn(n, t, generator=gen)).requires_grad_()
    adv = torch.randn(n, t, generator=gen) if per_token else torch.randn(n, generator=gen)[:, None].expand(n, t)
    return old, logp, adv * mask, mask


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_clip_cov_and_kl_cov_match_verl(mode, per_token, seed):
    """calibrl.losses.covariance equals verl 0.9.1's compute_policy_loss_clip_cov / _kl_cov on the same tensors:
    loss and gradient to assert_close's float32 tolerance (1.3e-6 relative), the same tokens selected. Clip-Cov's
    random draw is made equal by seeding torch's global generator before each call (both draw with
    torch.randperm over the candidates in the same order); the window (0.2, 2) and ratio 5% leave more candidates
    than are drawn, so a different draw would change the loss."""
    from calibrl.losses.covariance import clip_cov_policy_loss, kl_cov_policy_loss

    old, logp, adv, mask = _cov_tensors(seed, per_token)
    cases = [
        ("clip_cov", dict(clip_cov_ratio=0.05, clip_cov_lb=0.2, clip_cov_ub=2.0),
         lambda: clip_cov_policy_loss(logprobs=logp, old_logprobs=old, advantages=adv, completion_mask=mask,
                                      eps_low=0.2, eps_high=0.28, clip_cov_ratio=0.05, clip_cov_lb=0.2,
                                      clip_cov_ub=2.0, aggregation=mode)),
        ("kl_cov", dict(kl_cov_ratio=0.05, ppo_kl_coef=0.5),
         lambda: kl_cov_policy_loss(logprobs=logp, old_logprobs=old, advantages=adv, completion_mask=mask,
                                    kl_cov_ratio=0.05, ppo_kl_coef=0.5, aggregation=mode)),
    ]
    for name, params, ours in cases:
        torch.manual_seed(123)
        ref_loss, ref_metrics = core_algos.get_policy_loss_fn(name)(
            old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode=mode,
            config=_cov_config(loss_mode=name, **params))
        (ref_grad,) = torch.autograd.grad(ref_loss, logp)
        torch.manual_seed(123)
        loss, metrics = ours()
        (grad,) = torch.autograd.grad(loss, logp)
        torch.testing.assert_close(loss, ref_loss)
        torch.testing.assert_close(grad, ref_grad)
        assert metrics[f"{name}_fraction"] > 0
        if name == "clip_cov":
            assert metrics["clip_cov_fraction"] == pytest.approx(ref_metrics["actor/pg_clipfrac"], abs=1e-6)
            assert metrics["ppo_kl"] == pytest.approx(ref_metrics["actor/ppo_kl"], abs=1e-6)
        else:
            assert metrics["ppo_kl_abs"] == pytest.approx(ref_metrics["actor/ppo_kl"], abs=1e-6)


def test_clip_cov_draw_differs_from_verl_under_another_seed():
    """The seeded comparison above is not vacuous: with another seed verl detaches other tokens and the gradients
    differ (there are more candidates than tokens drawn)."""
    from calibrl.losses.covariance import clip_cov_policy_loss

    old, logp, adv, mask = _cov_tensors(0, False)
    torch.manual_seed(1)
    ref_loss, _ = core_algos.get_policy_loss_fn("clip_cov")(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
        config=_cov_config(loss_mode="clip_cov", clip_cov_ratio=0.05, clip_cov_lb=0.2, clip_cov_ub=2.0))
    (ref_grad,) = torch.autograd.grad(ref_loss, logp)
    torch.manual_seed(2)
    loss, _ = clip_cov_policy_loss(logprobs=logp, old_logprobs=old, advantages=adv, completion_mask=mask, eps_low=0.2,
                                   eps_high=0.28, clip_cov_ratio=0.05, clip_cov_lb=0.2, clip_cov_ub=2.0)
    (grad,) = torch.autograd.grad(loss, logp)
    assert not torch.allclose(grad, ref_grad)


@pytest.mark.parametrize("names", [("stated_confidence", "confidence_start"), ("confidence", "confidence_pos")])
def test_dcpo_per_token_advantages_through_the_wrapped_step(names):
    """dcpo in verl: the stated confidences and split positions come from the batch's non-tensor fields (calibrl's
    names, or those DCPO's own reward managers write); verl gets calibrl's per-token advantages at its width."""
    from calibrl.advantages.dcpo import NO_CONFIDENCE

    data = make_data(4, with_ref=False)
    n = len(data)
    gen = np.random.default_rng(4)
    stated = np.where(gen.random(n) < 0.7, gen.random(n).round(2), NO_CONFIDENCE).astype(object)
    lengths = data.batch["response_mask"].sum(-1).long()
    starts = np.array([int(gen.integers(0, int(length))) for length in lengths], dtype=object)
    data.non_tensor_batch[names[0]], data.non_tensor_batch[names[1]] = stated, starts
    base = expected_rollout_batch(data)
    batch = RolloutBatch(rewards=base.rewards, group_ids=base.group_ids, lengths=lengths,
                         stated_confidence=stated.astype(float), confidence_start=starts.astype(int))
    expected = calibrl.compute_advantages(batch, "dcpo")
    out = ray_trainer.compute_advantage(data, adv_estimator="dcpo", config=algo_config())
    mask = data.batch["response_mask"]
    assert out.batch["advantages"].shape == mask.shape
    torch.testing.assert_close(out.batch["advantages"][:, : expected.shape[1]], expected * mask[:, : expected.shape[1]])
    assert (out.batch["advantages"][mask == 0] == 0).all() and expected.abs().sum() > 0
