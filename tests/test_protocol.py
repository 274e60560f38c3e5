"""The papers'-regime task (testbed/scratchpad) and the pre-registered study's reading (studies.protocol_analysis):
rule, targets, stopping points, endpoints against calibrl.metrics / scikit-learn, paired bootstrap intervals."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from calibrl import metrics as M
from studies import protocol_analysis as P
from calibrl.testbed import tasks as tb

# ---------------------------------------------------------------------------------------------------------- task


def test_scratchpad_parse_and_deterministic_reward():
    prompt = "3857#"  # 3+8+5+7 = 23, tier medium
    right = "3+8=11,11+5=16,16+7=23|23"
    assert tb.parse("scratchpad", prompt, right) == {"format_ok": True, "reasoning_ok": True, "choice": "23"}
    slipped = "3+8=12,12+5=17,17+7=24|24"  # one +1 slip carried to the end
    assert tb.parse("scratchpad", prompt, slipped)["reasoning_ok"] is False
    assert tb.true_success_probability("scratchpad", prompt, right) == 1.0
    assert tb.true_success_probability("scratchpad", prompt, slipped) == 0.0
    # the reward checks the answer only (a verifier): a wrong step with the right answer still scores 1
    lucky = "3+8=11,11+5=17,17+7=23|23"
    assert tb.parse("scratchpad", prompt, lucky)["reasoning_ok"] is False
    assert tb.true_success_probability("scratchpad", prompt, lucky) == 1.0
    assert tb.true_success_probability("scratchpad", prompt, "3+8=11|23") == 0.0  # broken format
    reward = tb.make_reward("scratchpad", seed=0)
    assert reward([prompt] * 3, [right, slipped, "junk"]) == [1.0, 0.0, 0.0]
    assert reward([prompt], [right]) == [1.0]  # deterministic: no fresh draw


def test_scratchpad_tiers_and_teacher_success_rate():
    rows = tb.build_rows("scratchpad", 3000, split="train", seed=0)
    assert {r["tier"] for r in rows} == {"easy", "medium", "hard"}
    for r in rows[:50]:
        tier, slip = tb.scratchpad_tier(r["prompt"])
        assert r["tier"] == tier and r["p_true"] == pytest.approx((1 - slip) ** 3)
        assert r["answer"] == f"{sum(int(c) for c in r['prompt'][:4]):02d}"
    rng = np.random.default_rng(0)
    for tier, _, slip in tb.SCRATCHPAD_TIERS:
        sel = [r for r in rows if r["tier"] == tier][:300]
        draws = [tb.true_success_probability("scratchpad", r["prompt"], tb.sample_true_completion("scratchpad", r, rng))
                 for r in sel for _ in range(10)]
        p = (1 - slip) ** 3
        assert abs(np.mean(draws) - p) < 4 * np.sqrt(p * (1 - p) / len(draws)) + 1e-9, tier
    # a slip always moves the answer UP by the number of slips (systematic, not random, errors)
    row = next(r for r in rows if r["tier"] == "hard")
    for _ in range(50):
        c = tb.sample_true_completion("scratchpad", row, rng)
        steps = tb.scratchpad_steps(row["prompt"], c)
        assert steps is not None and len(c) == 25
        assert int(c[-2:]) >= int(row["answer"])


def test_scratchpad_unfixable_is_never_right_on_hard_prompts_and_scratchpad_elsewhere():
    rows = tb.build_rows("scratchpad_unfixable", 600, split="train", seed=0)
    assert all(r["prompt"].endswith("%") for r in rows)
    rng = np.random.default_rng(0)
    for tier, _, slip in tb.SCRATCHPAD_UNFIXABLE_TIERS:
        sel = [r for r in rows if r["tier"] == tier][:100]
        assert all(r["p_true"] == pytest.approx((1 - slip) ** 3) for r in sel)
        draws = [tb.true_success_probability("scratchpad_unfixable", r["prompt"],
                                             tb.sample_true_completion("scratchpad_unfixable", r, rng))
                 for r in sel for _ in range(10)]
        if tier == "hard":  # a slip at every step: always the sum + 3, never right
            assert draws == [0.0] * len(draws)
            c = tb.sample_true_completion("scratchpad_unfixable", sel[0], rng)
            assert int(c[-2:]) == int(sel[0]["answer"]) + 3
        else:  # easy and medium: the scratchpad teacher's law
            p = (1 - slip) ** 3
            assert abs(np.mean(draws) - p) < 4 * np.sqrt(p * (1 - p) / len(draws)), tier
    assert [t[2] for t in tb.SCRATCHPAD_UNFIXABLE_TIERS[:2]] == [t[2] for t in tb.SCRATCHPAD_TIERS[:2]]
    assert tb.prompt_tier("scratchpad_unfixable", "8123%") == "hard"


def test_second_pilot_config_and_jobs(tmp_path):
    config = P.ProtocolConfig.for_task("scratchpad_unfixable")
    assert config.arms == P.SECOND_PILOT_ARMS and config.seeds == (0, 1, 2) and config.steps == 400
    assert P.ProtocolConfig.for_task("scratchpad").arms == tuple(a.name for a in P.PROTOCOL_ARMS)
    jobs = P.build_jobs(config, arms=["grpo"], seeds=[0], runs_dir=tmp_path, warm_path="w")
    assert jobs[0]["task"] == "scratchpad_unfixable" and jobs[0]["key"] == "scratchpad_unfixable/grpo"
    with pytest.raises(ValueError, match="no pre-registered protocol"):
        P.ProtocolConfig.for_task("forms")


def test_scratchpad_splits_disjoint_and_registered():
    from calibrl.tasks.registry import available_datasets, available_rewards

    assert "testbed/scratchpad" in available_datasets() and "testbed/scratchpad" in available_rewards()
    train = {r["prompt"] for r in tb.build_rows("scratchpad", 2000, split="train")}
    for split in ("eval", "test"):
        assert not train & {r["prompt"] for r in tb.build_rows("scratchpad", 256, split=split)}


# ---------------------------------------------------------------------------------------------------------- rule


def _rec(step, acc, auroc, ceiling=1.0):
    return {"step": step, "expected_accuracy": acc, "auroc": auroc, "auroc_ceiling": ceiling}


def test_pilot_verdict_needs_growth_in_every_seed():
    grows = [_rec(0, 0.4, 0.86), _rec(400, 0.7, 0.80)]  # gap 0.14 -> 0.20
    shrinks = [_rec(0, 0.4, 0.86), _rec(400, 0.7, 0.95)]
    barely = [_rec(0, 0.4, 0.86), _rec(400, 0.7, 0.845)]  # +0.015 < 0.02
    assert P.pilot_verdict([grows, grows])["reproduced"] is True
    v = P.pilot_verdict([grows, shrinks])
    assert v["reproduced"] is False and v["gap_growth"] == pytest.approx([0.06, -0.09])
    assert P.pilot_verdict([grows, barely])["reproduced"] is False
    # the ceiling moves too: a falling ceiling is not erosion
    assert P.pilot_verdict([[_rec(0, 0.4, 0.86, 0.95), _rec(400, 0.7, 0.80, 0.89)]] * 2)["reproduced"] is False


def test_targets_and_stopping_points():
    runs = [[_rec(0, 0.40, 0.9), _rec(25, 0.5, 0.9), _rec(400, 0.70, 0.9)],
            [_rec(0, 0.40, 0.9), _rec(25, 0.5, 0.9), _rec(400, 0.76, 0.9)]]
    low, high = P.accuracy_targets(runs)  # gain 0.33 -> 0.40 + 0.11, 0.40 + 0.22
    assert (low, high) == pytest.approx((0.51, 0.62))
    history = [_rec(0, 0.40, 0.9), _rec(25, 0.50, 0.9), _rec(50, 0.52, 0.9), _rec(75, 0.49, 0.9)]
    assert P.stopping_step(history, 0.51) == 50
    assert P.stopping_step(history, 0.62) is None  # never reached: reported as such, not interpolated
    assert P.stopping_step(history, 0.30) == 25  # step 0 (the warm start) never counts as a stopping point


# ---------------------------------------------------------------------------------------------------------- endpoints


def _samples(rng, n_prompts=40, k=8, signal=1.0):
    pid = np.repeat(np.arange(n_prompts), k)
    q = (rng.random(pid.size) < rng.random(n_prompts)[pid]).astype(float)  # deterministic-task correctness
    correct = q > 0.5
    lpm = -rng.random(pid.size) + signal * correct * rng.random(pid.size)
    return {"prompt_index": pid, "logprob_mean": lpm, "correct": correct, "q_true": q}


def test_endpoints_match_reference_metrics():
    rng = np.random.default_rng(0)
    s = _samples(rng)
    e = P.endpoints(s)
    assert e["auroc"] == pytest.approx(roc_auc_score(s["correct"], s["logprob_mean"]))
    assert e["auroc"] == pytest.approx(M.auroc(s["logprob_mean"], s["correct"]))
    assert e["auroc_per_prompt"] == pytest.approx(M.per_prompt_auroc(s["logprob_mean"], s["correct"],
                                                                     s["prompt_index"])[0])
    assert e["ceiling_gap"] == pytest.approx(1.0 - e["auroc"])  # deterministic task: the ceiling is 1
    assert e["accuracy"] == pytest.approx(s["correct"].mean())


def test_endpoint_weights_equal_duplicated_prompts():
    rng = np.random.default_rng(1)
    s = _samples(rng, n_prompts=12)
    weights = rng.integers(0, 3, size=12).astype(float)
    keep = np.repeat(np.arange(s["prompt_index"].size), weights[s["prompt_index"]].astype(int))
    dup = {k: v[keep] for k, v in s.items()}
    e = P.endpoints(s, weights)
    assert e["auroc"] == pytest.approx(roc_auc_score(dup["correct"], dup["logprob_mean"]))
    assert e["auroc"] == pytest.approx(roc_auc_score(s["correct"], s["logprob_mean"],
                                                     sample_weight=weights[s["prompt_index"]]))
    vals, ws = [], []  # the weighted mean of within-prompt AUROCs, worked out directly
    for p in range(12):
        sel = s["prompt_index"] == p
        if weights[p] and 0 < s["correct"][sel].sum() < sel.sum():
            vals.append(roc_auc_score(s["correct"][sel], s["logprob_mean"][sel]))
            ws.append(weights[p])
    assert e["auroc_per_prompt"] == pytest.approx(np.average(vals, weights=ws))


def test_paired_bootstrap_identical_arms_and_a_real_difference():
    rng = np.random.default_rng(2)
    ref = [_samples(rng, signal=0.3) for _ in range(3)]
    same = P.paired_bootstrap(ref, ref, metric="ceiling_gap", n_bootstrap=300)
    assert same["difference"] == 0 and same["low"] == 0 and same["high"] == 0
    better = [{**r, "logprob_mean": r["logprob_mean"] + 2.0 * r["correct"]} for r in ref]  # ranks right above wrong
    d = P.paired_bootstrap(better, ref, metric="ceiling_gap", n_bootstrap=300)
    assert d["difference"] < -0.1 and d["high"] < 0 and d["low"] <= d["difference"] <= d["high"]
    assert d["n_seeds"] == 3
    with pytest.raises(ValueError, match="same seeds"):
        P.paired_bootstrap(better[:2], ref, metric="auroc")


def test_success_rule():
    good = {"difference": -0.03, "low": -0.05, "high": -0.01}
    small = {"difference": -0.015, "low": -0.03, "high": -0.001}
    wide = {"difference": -0.03, "low": -0.06, "high": 0.004}
    assert P.success(good, [good, good]) is True
    assert P.success(small, [good, good]) is False  # margin 0.02 not met
    assert P.success(wide, [good, good]) is False  # interval includes 0
    assert P.success(good, [good, wide]) is False  # not better than a control


def test_build_jobs_uses_eval_split_and_keeps_test_samples(tmp_path):
    jobs = P.build_jobs(P.ProtocolConfig(), arms=["grpo", "grpo_kl"], seeds=[0, 1], runs_dir=tmp_path,
                        warm_path="w")
    assert len(jobs) == 4 and {j["eval_split"] for j in jobs} == {"eval"}
    assert jobs[0]["eval_sets"] == {"test": ("test", 256)}
    kl = next(j for j in jobs if j["method"] == "grpo_kl")
    assert kl["config"]["beta"] == 0.04 and kl["run_dir"].endswith("grpo_kl/seed0")
    with pytest.raises(ValueError, match="unknown arm"):
        P.build_jobs(P.ProtocolConfig(), arms=["nope"], seeds=[0], runs_dir=tmp_path, warm_path="w")


def _fake_run(folder, rng, *, accuracies, signal):
    """A run folder as the runner writes it: history.json (eval-set records) and eval_set_samples.npz."""
    import json

    folder.mkdir(parents=True)
    history, arrays = [], {}
    for i, acc in enumerate(accuracies):
        step = 25 * i
        history.append(_rec(step, acc, 0.9))
        s = _samples(rng, signal=signal)
        for field, values in s.items():
            arrays[f"test/step{step}/{field}"] = values
    (folder / "history.json").write_text(json.dumps({"history": history}))
    np.savez(folder / "eval_set_samples.npz", **arrays)
    return history


def test_analyze_reads_stopping_points_and_applies_the_rule(tmp_path):
    rng = np.random.default_rng(3)
    curves = {"grpo": ([0.4, 0.5, 0.6, 0.7], 0.2), "grpo_lr3e-5": ([0.4, 0.45, 0.5, 0.6], 0.2),
              "grpo_kl": ([0.4, 0.5, 0.55, 0.65], 0.2), "capo_tau0.6": ([0.4, 0.5, 0.6, 0.65], 3.0),
              "capo_tau0.2": ([0.4, 0.42, 0.44, 0.46], 3.0)}
    histories, folders = {}, {}
    for arm, (acc, signal) in curves.items():
        for seed in (0, 1):
            folder = tmp_path / arm / f"seed{seed}"
            histories.setdefault(arm, {})[seed] = _fake_run(folder, rng, accuracies=acc, signal=signal)
            folders.setdefault(arm, {})[seed] = folder
    result = P.analyze(histories, folders, config=P.ProtocolConfig(n_bootstrap=200))
    assert result["targets"] == pytest.approx([0.5, 0.6])
    assert result["stops"]["grpo"]["higher"] == {0: 50, 1: 50}
    assert result["stops"]["grpo_lr3e-5"]["higher"] == {0: 75, 1: 75}
    assert result["stops"]["capo_tau0.2"]["lower"] == {0: None, 1: None}  # never reached: no comparison
    assert result["comparisons"]["lower"]["capo_tau0.2"] is None
    capo = result["comparisons"]["higher"]["capo_tau0.6"]["ceiling_gap"]
    assert capo["difference"] < -0.02 and capo["high"] < 0 and capo["n_seeds"] == 2
    assert result["success"] == {"capo_tau0.6": True, "capo_tau0.2": None}


@pytest.mark.slow
def test_runner_evaluates_extra_sets_keeps_their_samples_and_lets_an_arm_set_its_lr(tmp_path):
    """Plumbing on an untrained tiny model (2 steps): the main curve on the eval split, the test set's samples
    saved at every evaluation, and an arm's own learning_rate reaching the optimizer."""
    import json

    from calibrl.models import build_tiny_model
    from calibrl.testbed.runner import run_method

    model, tokenizer = build_tiny_model(seed=0)
    model.save_pretrained(tmp_path / "warm")
    tokenizer.save_pretrained(tmp_path / "warm")
    config = P.ProtocolConfig(steps=2, eval_every=1, eval_prompts=8, test_prompts=6, prompts_per_step=2,
                              num_generations=4)
    job = P.build_jobs(config, arms=["grpo_lr3e-5"], seeds=[0], runs_dir=tmp_path / "runs",
                       warm_path=str(tmp_path / "warm"))[0]
    from datetime import datetime, timezone

    before = datetime.now(timezone.utc).replace(microsecond=0)
    record = run_method(job)
    after = datetime.now(timezone.utc)
    # the run's UTC start and end (issue: the order of runs against protocol commits must be readable)
    start, end = (datetime.strptime(record[k], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
                  for k in ("started_utc", "finished_utc"))
    assert before <= start <= end <= after
    saved_record = json.loads((tmp_path / "runs" / "grpo_lr3e-5" / "seed0" / "history.json").read_text())
    assert (saved_record["started_utc"], saved_record["finished_utc"]) == (record["started_utc"],
                                                                           record["finished_utc"])
    assert [h["step"] for h in record["history"]] == [0, 1, 2]
    assert all("entropy" in h and h["test"]["auroc_ceiling"] is not None for h in record["history"])
    assert {log["learning_rate"] for log in record["train_logs"] if "learning_rate" in log} == {3e-5}
    saved = np.load(tmp_path / "runs" / "grpo_lr3e-5" / "seed0" / "eval_set_samples.npz")
    for step in (0, 1, 2):
        assert saved[f"test/step{step}/prompt_index"].tolist() == sorted(list(range(6)) * 8)
        assert saved[f"test/step{step}/logprob_mean"].shape == (48,)
    assert json.loads((tmp_path / "runs" / "grpo_lr3e-5" / "seed0" / "history.json").read_text())["history"]
    eval_prompts = {r["prompt"] for r in tb.build_rows("scratchpad", 8, split="eval")}
    test_prompts = {r["prompt"] for r in tb.build_rows("scratchpad", 6, split="test")}
    assert not eval_prompts & test_prompts
