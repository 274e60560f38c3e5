"""RolloutBatch validation: every error names the field and the problem."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from calibrl import RolloutBatch, RolloutBatchError, compute_advantages


def test_valid_batch_converts_lists_and_arrays():
    b = RolloutBatch(rewards=[1, 0, 1], group_ids=np.array([3, 3, 9]), logprob_mean=[-0.1, -0.2, -0.3],
                     embeddings=np.zeros((3, 4)), answer_ids=[1.0, 2.0, 1.0])
    assert len(b) == 3
    assert b.rewards.is_floating_point()
    assert b.group_ids.dtype == torch.long and b.answer_ids.dtype == torch.long
    assert b.embeddings.shape == (3, 4)


@pytest.mark.parametrize("field,value", [("logprob_mean", [-0.1, -0.2]), ("group_ids", [0, 0, 1, 1]),
                                         ("embeddings", np.zeros((2, 4))), ("answer_ids", [1, 2])])
def test_length_mismatch_names_field(field, value):
    kwargs = {"rewards": [1.0, 0.0, 1.0], "group_ids": [0, 0, 1], field: value}
    with pytest.raises(RolloutBatchError, match=rf"RolloutBatch\.{field}: has \d+ rows but rewards has 3"):
        RolloutBatch(**kwargs)


@pytest.mark.parametrize("field", ["rewards", "logprob_mean", "ref_logprob_mean"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_names_field_and_row(field, bad):
    values = [0.5, -0.5, bad, 0.0]
    kwargs = {"rewards": [1.0, 0.0, 1.0, 0.0], "group_ids": [0, 0, 1, 1], field: values}
    with pytest.raises(RolloutBatchError, match=rf"RolloutBatch\.{field}: 1 non-finite value\(s\), first at row 2"):
        RolloutBatch(**kwargs)


def test_non_finite_embeddings_names_field():
    emb = np.zeros((2, 3))
    emb[1, 2] = np.nan
    with pytest.raises(RolloutBatchError, match=r"RolloutBatch\.embeddings: .*non-finite.*row 1"):
        RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0], embeddings=emb)


@pytest.mark.parametrize("field,value,shape", [("rewards", [[1.0, 0.0]], r"\[N\]"), ("group_ids", [[0], [0]], r"\[N\]"),
                                               ("embeddings", [1.0, 2.0], r"\[N, D\]"),
                                               ("logprob_mean", 0.5, r"\[N\]")])
def test_wrong_dim_names_field(field, value, shape):
    kwargs = {"rewards": [1.0, 0.0], "group_ids": [0, 0], field: value}
    with pytest.raises(RolloutBatchError, match=rf"RolloutBatch\.{field}: expected shape {shape}"):
        RolloutBatch(**kwargs)


@pytest.mark.parametrize("field", ["group_ids", "answer_ids"])
def test_non_integer_ids_name_field(field):
    kwargs = {"rewards": [1.0, 0.0], "group_ids": [0, 0], field: [0.0, 0.5]}
    with pytest.raises(RolloutBatchError, match=rf"RolloutBatch\.{field}: must hold integers"):
        RolloutBatch(**kwargs)
    kwargs[field] = [True, False]
    with pytest.raises(RolloutBatchError, match=rf"RolloutBatch\.{field}: must hold integers, got booleans"):
        RolloutBatch(**kwargs)


def test_unconvertible_value_names_field():
    with pytest.raises(RolloutBatchError, match=r"RolloutBatch\.logprob_mean: cannot convert"):
        RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0], logprob_mean=["a", "b"])


def test_empty_batch_and_negative_lengths():
    with pytest.raises(RolloutBatchError, match="empty"):
        RolloutBatch(rewards=[], group_ids=[])
    with pytest.raises(RolloutBatchError, match=r"RolloutBatch\.lengths: must be non-negative"):
        RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0], lengths=[3, -1])


@pytest.mark.parametrize("estimator,field", [("capo", "logprob_mean"), ("cde", "logprob_mean"),
                                             ("codapo", "logprob_mean"), ("gcpo", "embeddings"),
                                             ("seed_grpo", "answer_ids")])
def test_missing_field_for_estimator_names_estimator_and_field(estimator, field):
    b = RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0])
    with pytest.raises(RolloutBatchError, match=rf"estimator '{estimator}' needs RolloutBatch field\(s\): {field}"):
        compute_advantages(b, estimator)


def test_to_device_round_trip():
    b = RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0], logprob_mean=[-0.1, -0.2])
    c = b.to("cpu")
    assert torch.equal(c.rewards, b.rewards) and c.embeddings is None


def test_registry_accepts_same_definition_loaded_twice_but_rejects_a_different_one():
    # verl loads a reward module by file path although calibrl already imported it by name: the same
    # definitions must not clash, while a genuinely different function under a taken name must. Loading by path
    # is the point of this test (it is what verl's custom_reward_function.path does), not a way to reach the code.
    import importlib.util

    import calibrl.tasks.rewards as rewards
    from calibrl.tasks.registry import get_reward, register_reward

    spec = importlib.util.spec_from_file_location("calibrl_rewards_by_path", rewards.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.math_reward is not rewards.math_reward
    assert get_reward("math") is rewards.math_reward  # the first registration stays

    with pytest.raises(ValueError, match="already registered"):
        @register_reward("math")
        def other_math(prompts, completions, **kw):  # pragma: no cover - never called
            return [0.0] * len(completions)


@pytest.mark.parametrize("field", ["rewards", "group_ids"])
def test_required_field_missing_names_field(field):
    kwargs = {"rewards": [1.0, 0.0], "group_ids": [0, 0], field: None}
    with pytest.raises(RolloutBatchError, match=rf"RolloutBatch\.{field}: is required"):
        RolloutBatch(**kwargs)


def test_select_keeps_every_field_row_for_row():
    b = RolloutBatch(rewards=[1.0, 0.0, 1.0], group_ids=[4, 4, 9], logprob_mean=[-0.1, -0.2, -0.3],
                     embeddings=np.arange(6.0).reshape(3, 2), answer_ids=[7, 8, 7], lengths=[3, 0, 5])
    keep = b.lengths > 0
    s = b.select(keep)
    assert len(s) == 2 and s.ref_logprob_mean is None
    assert s.group_ids.tolist() == [4, 9] and s.answer_ids.tolist() == [7, 7] and s.lengths.tolist() == [3, 5]
    assert s.logprob_mean.tolist() == pytest.approx([-0.1, -0.3]) and s.embeddings.tolist() == [[0.0, 1.0], [4.0, 5.0]]
    with pytest.raises(RolloutBatchError, match=r"RolloutBatch\.select: keep must be a bool mask of 3 rows"):
        b.select(torch.tensor([True, False]))
    with pytest.raises(RolloutBatchError, match=r"RolloutBatch\.select: keeps no row"):
        b.select(torch.zeros(3, dtype=torch.bool))
