"""CalibrationEvalCallback: held-out calibration every N steps, transformers' best-checkpoint bookkeeping on its
metrics, the Pareto rule and early stopping (the rules as pure functions on hand-made histories; the callback on
the tiny model, a few steps each)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_trl import _one_torch_thread, _registered  # noqa: F401 (fixtures: autouse / used by name)
from test_trl import _config, _dataset, _write_recipe, parity_reward

from calibrl import metrics as M
from calibrl.models import build_tiny_model
from calibrl.trl import CalibratedGRPOTrainer
from calibrl.trl.callbacks import (
    CALIBRATION_EVAL_FILE,
    CalibrationEvalConfig,
    attach_calibration_eval,
    calibration_record,
    record_keys,
    higher_is_better,
    pareto_best,
    should_stop_early,
)

pytestmark = pytest.mark.filterwarnings("ignore")


def _held_out():
    """Prompts the training set (``_dataset()``: the first 32) never shows."""
    return _dataset(40).select(range(32, 40))


def _run(tmp_path, *, settings: dict, train: bool = True, **config):
    model, tok = build_tiny_model(seed=0)
    trainer = CalibratedGRPOTrainer(model=model, reward_funcs=parity_reward,
                                    args=_config(tmp_path, advantage_estimator="grpo", **config),
                                    train_dataset=_dataset(), processing_class=tok)
    callback = attach_calibration_eval(trainer, config=CalibrationEvalConfig(**settings), dataset=_held_out())
    if train:
        trainer.train()
    return trainer, callback


def _eval_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "eval_calibration/accuracy" in h]


def _history(*rows) -> list[dict]:
    """Records from (step, accuracy, auroc) triples."""
    return [{"step": s, "accuracy": a, "auroc": c} for s, a, c in rows]


# ---------------------------------------------------------------------------------------------------- pure rules


def test_calibration_record_is_calibrl_metrics_of_the_rows():
    rng = np.random.default_rng(0)
    rows = [{"prompt_id": f"p{i // 4}", "correct": bool(rng.random() < 0.5), "logprob_mean": float(-rng.random()),
             "decision_prob": float(rng.random())} for i in range(40)]
    record = calibration_record(rows, n_bins=5)
    pid = np.array([int(r["prompt_id"][1:]) for r in rows])
    y = np.array([r["correct"] for r in rows])
    lpm = np.array([r["logprob_mean"] for r in rows])
    p = np.array([r["decision_prob"] for r in rows])
    assert record["accuracy"] == pytest.approx(y.mean())
    assert record["auroc"] == pytest.approx(M.auroc(lpm, y))
    assert record["auroc_per_prompt"] == pytest.approx(M.per_prompt_auroc(lpm, y, pid).mean)
    assert record["auroc_n_prompts"] == M.per_prompt_auroc(lpm, y, pid).n_prompts
    assert record["ece"] == pytest.approx(M.ece(np.exp(lpm), y, n_bins=5, strategy="uniform"))
    assert record["decision_ece"] == pytest.approx(M.ece(p, y, n_bins=5, strategy="quantile"))
    assert record["aurc"] == pytest.approx(M.aurc(lpm, y))
    assert record["smooth_ece"] == pytest.approx(M.smooth_ece(np.exp(lpm), y))
    assert record["prr"] == pytest.approx(M.prr(lpm, y))
    assert record["n_samples"] == 40
    assert not higher_is_better("aurc") and not higher_is_better("eval_calibration/aurc")
    assert higher_is_better("auroc") and not higher_is_better("decision_ece")
    assert not higher_is_better("eval_calibration/smooth_ece") and higher_is_better("eval_calibration/prr")
    one_class = calibration_record([{**r, "correct": True} for r in rows[:8]])
    assert one_class["accuracy"] == 1.0 and math.isnan(one_class["auroc"])


def test_calibration_record_counts_the_models_own_i_dont_know():
    # p0 has no right answer: one sample declines (graded right), one answers; p1: right, declined, wrong
    rows = [{"prompt_id": "p0", "correct": True, "logprob_mean": -0.1, "completion": "I don't know",
             "answerable": False},
            {"prompt_id": "p0", "correct": False, "logprob_mean": -0.2, "completion": "5", "answerable": False},
            {"prompt_id": "p1", "correct": True, "logprob_mean": -0.3, "completion": "7", "answerable": True},
            {"prompt_id": "p1", "correct": False, "logprob_mean": -0.4, "completion": r"\boxed{IDK}",
             "answerable": True},
            {"prompt_id": "p1", "correct": False, "logprob_mean": -0.5, "completion": "8", "answerable": True}]
    record = calibration_record(rows)
    # answered 3 of 5 (5, 7, 8), right 1 (7), wrong 2
    assert (record["answer_rate"], record["accuracy_answered"]) == (pytest.approx(3 / 5), pytest.approx(1 / 3))
    assert (record["hallucination_rate"], record["accuracy_hallucination_ratio"]) == (pytest.approx(2 / 5), 0.5)
    assert (record["declined_unanswerable"], record["declined_answerable"]) == (0.5, pytest.approx(1 / 3))
    # the same keys without completions that decline or an answerable column
    plain = calibration_record([{k: v for k, v in r.items() if k != "answerable"} for r in rows[2:3]])
    assert set(plain) == set(record) and set(record) <= set(record_keys())
    assert plain["answer_rate"] == 1.0 and math.isnan(plain["declined_unanswerable"])


def test_pareto_best_accuracy_within_a_margin_of_the_start_calibration():
    start = {"step": 0, "accuracy": 0.30, "auroc": 0.80}
    history = _history((10, 0.40, 0.79), (20, 0.55, 0.70), (30, 0.50, 0.785), (40, 0.60, float("nan")))
    # step 20 is the most accurate but lost 0.10 AUROC; step 40's AUROC is undefined; 30 beats 10 on accuracy
    assert pareto_best(history, rule="accuracy", margin=0.02, start=start)["step"] == 30
    assert pareto_best(history, rule="accuracy", margin=0.10, start=start)["step"] == 20
    assert pareto_best(history, rule="accuracy", margin=0.0, start=start) is None  # every one is below the start
    # without a start the first record is the reference
    assert pareto_best(history, rule="accuracy", margin=0.0)["step"] == 10


def test_pareto_best_calibration_within_a_margin_of_the_best_accuracy():
    history = _history((10, 0.40, 0.90), (20, 0.60, 0.70), (30, 0.58, 0.75), (40, 0.55, 0.85))
    assert pareto_best(history, rule="calibration", margin=0.02)["step"] == 30
    assert pareto_best(history, rule="calibration", margin=0.05)["step"] == 40
    assert pareto_best(history, rule="calibration", margin=0.0)["step"] == 20
    # an ECE is better when lower
    ece = [{"step": s, "accuracy": a, "ece": e} for s, a, e in ((10, 0.60, 0.20), (20, 0.59, 0.05), (30, 0.60, 0.10))]
    assert pareto_best(ece, metric="ece", rule="calibration", margin=0.01)["step"] == 20
    assert pareto_best(ece, metric="ece", rule="accuracy", margin=0.0)["step"] == 30
    # so is an AURC: the lowest risk-coverage area among the evaluations within 0.01 of the best accuracy
    aurc = [{"step": s, "accuracy": a, "aurc": r} for s, a, r in ((10, 0.60, 0.40), (20, 0.59, 0.30), (30, 0.50, 0.2))]
    assert pareto_best(aurc, metric="aurc", rule="calibration", margin=0.01)["step"] == 20
    assert CalibrationEvalConfig(metric="aurc").metric == "aurc"
    assert pareto_best([], rule="calibration") is None
    with pytest.raises(ValueError, match="rule"):
        pareto_best(history, rule="both")


def test_early_stop_when_calibration_falls_and_accuracy_stalls():
    falling = _history((0, 0.30, 0.80), (10, 0.50, 0.82), (20, 0.49, 0.78), (30, 0.50, 0.74))
    reason = should_stop_early(falling, margin=0.05, patience=2)
    assert reason is not None and "step 30" in reason and "0.8200" in reason
    # the same fall while accuracy still rises: go on
    rising = _history((0, 0.30, 0.80), (10, 0.50, 0.82), (20, 0.49, 0.78), (30, 0.52, 0.74))
    assert should_stop_early(rising, margin=0.05, patience=2) is None
    # a rise within accuracy_min_delta is no rise
    assert should_stop_early(rising, margin=0.05, patience=2, accuracy_min_delta=0.05) is not None
    # a fall within the margin: go on; from the start (0.80) the fall is 0.06, from the best 0.08
    assert should_stop_early(falling, margin=0.10, patience=2) is None
    assert should_stop_early(falling, margin=0.07, patience=2, reference="start") is None
    assert should_stop_early(falling, margin=0.05, patience=2, reference="start") is not None
    # too few evaluations for the patience; an undefined last value
    assert should_stop_early(falling, margin=0.05, patience=4) is None
    undefined = falling + _history((40, 0.40, float("nan")))
    assert should_stop_early(undefined, margin=0.05, patience=2) is None
    # ECE: a rise is a fall of calibration
    ece = [{"step": s, "accuracy": a, "ece": e} for s, a, e in ((0, 0.5, 0.05), (10, 0.5, 0.06), (20, 0.5, 0.20))]
    assert should_stop_early(ece, metric="ece", margin=0.1, patience=1) is not None
    assert should_stop_early(ece, metric="ece", margin=0.2, patience=1) is None


def test_settings_are_checked():
    with pytest.raises(ValueError, match="calibration_eval.every"):
        CalibrationEvalConfig(every=0)
    with pytest.raises(ValueError, match="calibration_eval.metric"):
        CalibrationEvalConfig(metric="accuracy")
    with pytest.raises(ValueError, match="calibration_eval.pareto"):
        CalibrationEvalConfig(pareto="both")


# ---------------------------------------------------------------------------------------------------- on the tiny model


def test_logs_metrics_at_its_steps_equal_to_calibrl_metrics(tmp_path):
    trainer, callback = _run(tmp_path, settings={"every": 2, "prompts": 6, "k": 4}, max_steps=5)
    logs = _eval_logs(trainer)
    assert [h["step"] for h in logs] == [0, 2, 4, 5]  # the start, every 2 steps, the last step
    assert [r["step"] for r in callback.records] == [0, 2, 4, 5]
    for h in logs:
        assert h["eval_calibration/n_samples"] == 24
        for key in ("accuracy", "auroc", "auroc_per_prompt", "ece", "confidence_mean"):
            value = h.get(f"eval_calibration/{key}")
            assert value is None or 0.0 <= value <= 1.0, (key, value)
    # the training log lines of the evaluated steps are still there
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [1, 2, 3, 4, 5]

    rows = callback.last_samples
    assert len(rows) == 24 and len({r["prompt_id"] for r in rows}) == 6
    texts = [r["completion"] for r in rows]
    assert [r["correct"] for r in rows] == [x > 0.5 for x in parity_reward(None, texts)]
    y = np.array([r["correct"] for r in rows])
    lpm = np.array([r["logprob_mean"] for r in rows])
    pid = np.unique([r["prompt_id"] for r in rows], return_inverse=True)[1]
    last = logs[-1]
    assert last["eval_calibration/accuracy"] == pytest.approx(y.mean())
    expected = {"auroc": M.auroc(lpm, y), "ece": M.ece(np.exp(lpm), y, n_bins=10),
                "auroc_per_prompt": M.per_prompt_auroc(lpm, y, pid).mean}
    for key, value in expected.items():
        if math.isnan(value):
            assert f"eval_calibration/{key}" not in last
        else:
            assert last[f"eval_calibration/{key}"] == pytest.approx(value)

    saved = json.loads((tmp_path / "out" / CALIBRATION_EVAL_FILE).read_text())
    assert [r["step"] for r in saved["records"]] == [0, 2, 4, 5]
    # the best checkpoint is the Pareto rule applied to the records after the start, whichever records training
    # produced (which one wins depends on the trajectory, so on the CPU's rounding: docs/testing.md)
    config = callback.config
    expected_best = pareto_best([r for r in callback.records if r["step"] > 0], metric=config.metric,
                                rule=config.pareto, margin=config.pareto_margin, start=callback.records[0])
    assert callback.best == expected_best
    if expected_best is None:
        assert saved["best_checkpoint"] is None and "eval_calibration/best_checkpoint_step" not in last
    else:
        assert saved["best_checkpoint"]["step"] == expected_best["step"] > 0
        assert saved["best_checkpoint"]["checkpoint"] is None  # save_strategy "no"
        assert last["eval_calibration/best_checkpoint_step"] == expected_best["step"]


def test_training_is_the_same_with_the_callback(tmp_path):
    """Sampling on a forked RNG leaves the training draw alone: same losses with and without evaluations."""
    with_eval, _ = _run(tmp_path / "a", settings={"every": 1, "prompts": 2, "k": 2}, max_steps=3)
    model, tok = build_tiny_model(seed=0)
    plain = CalibratedGRPOTrainer(model=model, reward_funcs=parity_reward,
                                  args=_config(tmp_path / "b", advantage_estimator="grpo", max_steps=3),
                                  train_dataset=_dataset(), processing_class=tok)
    plain.train()
    losses = lambda t: [h["loss"] for h in t.state.log_history if "loss" in h]  # noqa: E731
    assert losses(with_eval) == pytest.approx(losses(plain), abs=1e-6)


def test_metric_for_best_model_picks_the_checkpoint_with_the_best_logged_value(tmp_path):
    trainer, callback = _run(
        tmp_path, settings={"every": 1, "prompts": 6, "k": 4, "at_start": False}, max_steps=4,
        save_strategy="best", load_best_model_at_end=True, metric_for_best_model="calibration/auroc_per_prompt",
    )
    values = [(h["step"], h["eval_calibration/auroc_per_prompt"]) for h in _eval_logs(trainer)
              if "eval_calibration/auroc_per_prompt" in h]
    assert len(values) >= 2
    best_step, best_value, new_bests = None, -math.inf, []
    for step, value in values:  # transformers' rule: strictly greater
        if value > best_value:
            best_step, best_value = step, value
            new_bests.append(step)
    assert trainer.state.best_metric == pytest.approx(best_value)
    assert trainer.state.best_model_checkpoint == str(tmp_path / "out" / f"checkpoint-{best_step}")
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "out").glob("checkpoint-*"))
    assert saved == new_bests  # save_strategy "best": a checkpoint exactly at each new best
    # load_best_model_at_end: the final weights are the best checkpoint's
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "out" / f"checkpoint-{best_step}" / "model.safetensors"))
    for name, tensor in weights.items():
        torch.testing.assert_close(trainer.model.state_dict()[name], tensor)


def test_metric_for_best_model_refuses_the_trainers_own_evaluation(tmp_path):
    model, tok = build_tiny_model(seed=0)
    trainer = CalibratedGRPOTrainer(
        model=model, reward_funcs=parity_reward, train_dataset=_dataset(), eval_dataset=_held_out(),
        processing_class=tok, args=_config(tmp_path, eval_strategy="steps", eval_steps=1,
                                           metric_for_best_model="eval_calibration/auroc"))
    with pytest.raises(ValueError, match="eval_strategy"):
        attach_calibration_eval(trainer, config=CalibrationEvalConfig(), dataset=_held_out())
    trainer.args.eval_strategy = "no"
    trainer.args.metric_for_best_model = "eval_calibration/aurco"
    with pytest.raises(ValueError, match="aurco"):
        attach_calibration_eval(trainer, config=CalibrationEvalConfig(), dataset=_held_out())


def test_early_stop_stops_training_at_the_evaluation_that_triggers_it(tmp_path, monkeypatch):
    """Scripted metrics (calibration falls from step 2 while accuracy is flat) through the real callback."""
    import calibrl.trl.callbacks as callbacks

    script = {0: (0.5, 0.80), 1: (0.6, 0.82), 2: (0.6, 0.81), 3: (0.6, 0.70), 4: (0.6, 0.60)}
    steps = iter(sorted(script))

    def scripted(rows, *, n_bins):
        accuracy, auroc = script[next(steps)]
        return {"accuracy": accuracy, "auroc": auroc, "n_samples": float(len(rows))}

    monkeypatch.setattr(callbacks, "calibration_record", scripted)
    settings = {"every": 1, "prompts": 2, "k": 2, "early_stop": True, "stop_margin": 0.05, "patience": 2}
    trainer, callback = _run(tmp_path, settings=settings, max_steps=6)
    assert trainer.state.global_step == 3
    assert callback.stopped["step"] == 3 and "auroc" in callback.stopped["reason"]
    assert _eval_logs(trainer)[-1]["eval_calibration/early_stop"] == 1.0
    assert json.loads((tmp_path / "out" / CALIBRATION_EVAL_FILE).read_text())["early_stop"]["step"] == 3

    # the same fall while accuracy keeps rising: no stop
    script.update({2: (0.7, 0.81), 3: (0.8, 0.70), 4: (0.9, 0.60), 5: (1.0, 0.5), 6: (1.0, 0.5)})
    steps = iter(sorted(script))
    trainer, callback = _run(tmp_path / "rising", settings=settings, max_steps=4)
    assert trainer.state.global_step == 4 and callback.stopped is None


# ---------------------------------------------------------------------------------------------------- recipes


def test_recipe_key_switches_it_on(tmp_path, _registered):  # noqa: F811
    from calibrl.trl.recipes import RecipeError, load_recipe
    from calibrl.trl.train import train

    held_out = {"name": "test/trl_tiny", "limit": 4}
    path = _write_recipe(tmp_path, calibration_eval={"every": 1, "prompts": 3, "k": 2, "dataset": held_out})
    recipe = load_recipe(path)
    assert recipe.calibration_eval.every == 1 and recipe.calibration_eval_dataset.limit == 4
    result = train(recipe, overrides={"max_steps": 2}, progress=False)
    lines = [json.loads(line) for line in (tmp_path / "run" / "log_history.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "eval_calibration/accuracy" in line] == [0, 1, 2]
    assert result["global_step"] == 2 and (tmp_path / "run" / CALIBRATION_EVAL_FILE).exists()

    with pytest.raises(RecipeError, match=r"'evrey'.*'calibration_eval'.*every"):
        load_recipe(_write_recipe(tmp_path, calibration_eval={"evrey": 3, "dataset": held_out}))
    with pytest.raises(RecipeError, match=r"calibration_eval\.k: expected int"):
        load_recipe(_write_recipe(tmp_path, calibration_eval={"k": "four", "dataset": held_out}))
    with pytest.raises(RecipeError, match=r"calibration_eval\.prompts must be an integer >= 1"):
        load_recipe(_write_recipe(tmp_path, calibration_eval={"prompts": 0, "dataset": held_out}))
    with pytest.raises(RecipeError, match="held-out prompts"):
        load_recipe(_write_recipe(tmp_path, calibration_eval=True))
    assert load_recipe(_write_recipe(tmp_path, calibration_eval=True, eval_dataset=held_out)).calibration_eval.k == 4


def test_resumed_run_keeps_the_evaluations_up_to_its_checkpoint(tmp_path):
    settings = {"every": 2, "prompts": 2, "k": 2}
    _run(tmp_path, settings=settings, max_steps=3, save_strategy="steps", save_steps=2)
    first = json.loads((tmp_path / "out" / CALIBRATION_EVAL_FILE).read_text())["records"]
    assert [r["step"] for r in first] == [0, 2, 3]
    trainer, callback = _run(tmp_path, settings=settings, train=False, max_steps=4, save_strategy="steps",
                             save_steps=2)
    trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert [r["step"] for r in callback.records] == [0, 2, 4]  # step 3 of the first run is gone, no new start
    assert callback.records[:2] == first[:2]  # read back, not re-evaluated


# ---------------------------------------------------------------------------------------------------- TRL's rewards

def correctness(completions, answer, **kwargs):
    """A reward written the way TRL documents it: keyword arguments only, the dataset's column by name."""
    return [float(str(c).strip().startswith(a[:1])) for c, a in zip(completions, answer)]


def test_call_reward_calls_a_reward_as_trl_does():
    from trl.rewards import accuracy_reward

    from calibrl.evaluation.generate import call_reward

    seen = {}

    def spy(*, prompts, completions, completion_ids, trainer_state, log_extra, log_metric, answer, prompt_id):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, state=trainer_state)
        return [1.0] * len(completions)

    state = object()
    call_reward(spy, prompt="1+1=", completions=["2", "3"], completion_ids=[[5], [6]],
                columns={"prompt": "1+1=", "answer": "2", "prompt_id": "p0"}, trainer_state=state)
    assert seen == {"prompts": ["1+1=", "1+1="], "completions": ["2", "3"], "ids": [[5], [6]], "state": state}
    assert call_reward(correctness, prompt="1+1=", completions=["2", "3"], completion_ids=[[5], [6]],
                       columns={"answer": "2"}) == [1.0, 0.0]
    # TRL's shipped reward reads conversational completions: a chat prompt gets them in that shape
    chat = [{"role": "user", "content": "What is 1/2 + 1/4?"}]
    rewards = call_reward(accuracy_reward, prompt=chat, completions=[r"\boxed{\frac{3}{4}}", r"\boxed{0.5}"],
                          completion_ids=[[1], [2]], columns={"solution": r"$\frac{3}{4}$"})
    assert rewards == [1.0, 0.0]


@pytest.mark.parametrize("stock", [True, False])
def test_the_callback_grades_with_a_keyword_only_reward_on_either_trainer(tmp_path, stock):
    from trl import GRPOTrainer

    model, tok = build_tiny_model(seed=0)
    cls = GRPOTrainer if stock else CalibratedGRPOTrainer
    args = _config(tmp_path, advantage_estimator="grpo", max_steps=1)
    trainer = cls(model=model, reward_funcs=correctness, args=args, train_dataset=_dataset(), processing_class=tok)
    callback = attach_calibration_eval(trainer, config=CalibrationEvalConfig(every=1, prompts=4, k=2),
                                       dataset=_held_out())
    trainer.train()  # used to fail at on_train_begin: correctness() got multiple values for argument 'answer'
    rows = callback.last_samples
    assert len(rows) == 8
    from calibrl.trl.callbacks import heldout_problems

    answers = {str(p["prompt_id"]): p["answer"] for p in heldout_problems(_held_out(), n=4)}
    assert [r["correct"] for r in rows] == [
        correctness([r["completion"]], [answers[r["prompt_id"]]]) == [1.0] for r in rows]
