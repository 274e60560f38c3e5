"""The powered real-model study's analysis (studies/realmodel_powered.py) on synthetic records with a planted
difference: the matching rule on hand-made curves, the endpoint's value against sklearn, its sign and interval,
Holm's adjustment by hand, the checks that withhold a verdict, and the raw-records file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

import studies.realmodel_analysis as R
from studies import realmodel_powered as P

ROOT = Path(__file__).resolve().parents[1]

PROMPTS, K = 50, 4  # 200 samples per evaluation: accuracies in steps of 0.005
N_BOOT = 200


def _evaluation(step: int, accuracy: float, separation: float, rng: np.random.Generator) -> dict:
    """One evaluation with exactly ``accuracy`` x 200 right samples; the mean log-prob of a right sample is
    ``separation`` higher on average (0: an AUROC near 0.5)."""
    n = PROMPTS * K
    correct = np.zeros(n, dtype=int)
    correct[rng.choice(n, size=round(accuracy * n), replace=False)] = 1
    logprob = -1.5 + separation * correct + 0.5 * rng.standard_normal(n)
    logprob = np.minimum(logprob, -1e-3)
    decision = np.clip(0.5 + 0.2 * (correct - 0.5) * separation + 0.1 * rng.standard_normal(n), 0.01, 0.99)
    samples = {"prompt_id": [f"p{i // K}" for i in range(n)], "correct": correct.tolist(),
               "logprob_mean": logprob.tolist(), "decision_prob": [None if i % 50 == 0 else float(d)
                                                                    for i, d in enumerate(decision)]}
    return {"step": step, "n_samples": n, "accuracy": float(correct.mean()),
            "auroc": float(roc_auc_score(correct, logprob)),
            "ece": R.sequence_ece(np.exp(logprob), correct),
            "decision_ece": R.decision_letter_ece(R.EVALUATION_METRICS["decision_ece"][0](samples)["decision_prob"],
                                                  correct),
            "samples": samples}


CURVES = {  # accuracies at steps 0, 12, ..., 60
    "grpo": [0.20, 0.25, 0.30, 0.35, 0.40, 0.45],
    "capo_mask": [0.20, 0.22, 0.25, 0.28, 0.30, 0.33],   # final 0.33: nearest GRPO 0.35 (step 36)
    "slow_grpo": [0.20, 0.21, 0.22, 0.24, 0.26, 0.28],
    "grpo_decision": [0.20, 0.24, 0.29, 0.33, 0.38, 0.42],
}
FAST_CAPO = [0.20, 0.30, 0.40, 0.44, 0.47, 0.50]  # seed 4: beyond GRPO's 0.45 by 0.05 -> fallback


def synthetic_runs(*, planted: float = 1.2, seeds=P.SEEDS) -> dict:
    """Every arm and seed; CAPO + mask's evaluations after the start separate right from wrong by ``planted``
    more than the other arms' (0.3): a higher AUROC at any accuracy. Every step 0 is the same evaluation."""
    runs = {}
    for s in seeds:
        start = _evaluation(0, 0.20, 0.3, np.random.default_rng(1000))
        for i, arm in enumerate(P.ARMS):
            rng = np.random.default_rng([s, i])
            curve = FAST_CAPO if (arm == "capo_mask" and s == 4) else CURVES[arm]
            sep = 0.3 + (planted if arm == "capo_mask" else 0.0)
            evaluations = [start] + [_evaluation(step, acc, sep, rng) for step, acc in zip(P.EVAL_STEPS[1:],
                                                                                           curve[1:])]
            runs[(arm, s)] = {"arm": arm, "seed": s, "method": P.ARMS[arm][0], "lr": P.ARMS[arm][1],
                              "evaluations": evaluations}
    return runs


# -------------------------------------------------------------------------------------------- matching rule


def _curve(*pairs):
    return [{"step": s, "accuracy": a} for s, a in pairs]


def test_match_pair_nearest_accuracy_ties_to_the_later_step_and_the_fallback():
    grpo = _curve((0, 0.20), (12, 0.30), (24, 0.30), (36, 0.40))
    # final 0.31: GRPO's 0.30 at steps 12 and 24 tie -> the later step (24)
    mine, ref, fallback = P.match_pair(_curve((0, 0.20), (12, 0.25), (24, 0.31)), grpo)
    assert (mine["step"], ref["step"], fallback) == (24, 24, False)
    # final 0.43: within 0.03 of GRPO's best (0.40) -> no fallback, nearest is step 36
    mine, ref, fallback = P.match_pair(_curve((0, 0.20), (24, 0.43)), grpo)
    assert (mine["step"], ref["step"], fallback) == (24, 36, False)
    # final 0.44: beyond every GRPO evaluation by 0.04 -> GRPO's final (0.40) against the method's evaluation of
    # nearest accuracy to 0.40: 0.38 (0.02 away) beats 0.44 (0.04 away)
    mine, ref, fallback = P.match_pair(_curve((0, 0.20), (12, 0.38), (24, 0.44)), grpo)
    assert (mine["step"], ref["step"], fallback) == (12, 36, True)
    # final below GRPO's start: read against the start (the nearest), no tolerance drops it
    mine, ref, fallback = P.match_pair(_curve((0, 0.20), (12, 0.10)), grpo)
    assert (mine["step"], ref["step"], fallback) == (12, 0, False)


# -------------------------------------------------------------------------------------------- p-values, Holm


def test_bootstrap_p_value_by_hand():
    assert P.bootstrap_p_value(np.array([-1.0, 1.0, 2.0, 3.0])) == pytest.approx(0.5)  # 2 x min(1/4, 3/4)
    assert P.bootstrap_p_value(np.array([0.0, 0.0, 1.0, 1.0])) == 1.0  # 2 x min(1/2, 1) capped
    assert P.bootstrap_p_value(np.array([np.nan, 1.0, 2.0])) == 0.0
    assert math.isnan(P.bootstrap_p_value(np.array([np.nan])))


def test_holm_adjustment_by_hand():
    # sorted: 0.005 (x5 = 0.025), 0.01 (x4 = 0.04), 0.03 (x3 = 0.09), 0.04 (x2 = 0.08 -> 0.09 monotone), 0.2 (x1)
    adjusted = P.holm_adjust([0.01, 0.04, 0.03, 0.005, 0.2])
    assert adjusted == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.2])
    # the same decisions as the step-down rule: 0.005 <= 0.05/5, 0.01 <= 0.05/4, 0.03 > 0.05/3 stops
    assert [p <= 0.05 for p in adjusted] == [True, False, False, True, False]
    assert P.holm_adjust([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
    out = P.holm_adjust([0.02, math.nan, 0.03])  # nan does not count: m = 2
    assert out[0] == pytest.approx(0.04) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    try:
        from statsmodels.stats.multitest import multipletests
    except ImportError:
        return
    p = [0.012, 0.3, 0.001, 0.04, 0.02]
    assert P.holm_adjust(p) == pytest.approx(list(multipletests(p, method="holm")[1]))


# -------------------------------------------------------------------------------------------- endpoints


def test_primary_endpoint_recovers_the_planted_difference():
    runs = synthetic_runs()
    e = P.endpoint(runs, arm="capo_mask", reference="grpo", metric="auroc", seeds=P.SEEDS, n_boot=N_BOOT)
    # the pairs by construction: CAPO's step 60 against GRPO's step 36 (0.33 vs 0.35), seed 4 by the fallback
    pairs = [(r["step"], r["reference_step"], r["fallback"]) for r in e["seeds"]]
    assert pairs == [(60, 36, False)] * 4 + [(36, 60, True)]
    by_step = lambda run, step: next(x for x in run["evaluations"] if x["step"] == step)
    expected = [by_step(runs[("capo_mask", s)], a)["auroc"] - by_step(runs[("grpo", s)], b)["auroc"]
                for s, (a, b, _) in zip(P.SEEDS, pairs)]
    assert e["difference"] == pytest.approx(np.mean(expected))  # the pooled AUROC, as sklearn computes it
    for r, d in zip(e["seeds"], expected):
        assert r["difference"] == pytest.approx(d) and r["low"] < d < r["high"]
    assert e["difference"] > 0.2 and 0 < e["low"] < e["difference"] < e["high"]
    assert e["p_value"] == 0.0 and e["half_width"] == pytest.approx((e["high"] - e["low"]) / 2)
    assert e["between_seed_sd"] == pytest.approx(np.std(expected, ddof=1))
    # the sign follows the planted direction: CAPO's separation removed and given to GRPO instead
    flipped = synthetic_runs(planted=0.0)
    for s in P.SEEDS:
        flipped[("grpo", s)]["evaluations"] = flipped[("grpo", s)]["evaluations"][:1] + [
            _evaluation(step, acc, 1.5, np.random.default_rng([s, 9]))
            for step, acc in zip(P.EVAL_STEPS[1:], CURVES["grpo"][1:])]
    e = P.endpoint(flipped, arm="capo_mask", reference="grpo", metric="auroc", seeds=P.SEEDS, n_boot=N_BOOT)
    assert e["high"] < 0


def test_an_arm_identical_to_its_reference_differs_by_exactly_zero():
    runs = synthetic_runs()
    for s in P.SEEDS:
        runs[("slow_grpo", s)] = {**runs[("grpo", s)], "arm": "slow_grpo"}
    for metric in ("auroc", "ece", "decision_ece"):
        e = P.endpoint(runs, arm="slow_grpo", reference="grpo", metric=metric, seeds=P.SEEDS, n_boot=50)
        assert [r["reference_step"] for r in e["seeds"]] == [60] * 5  # equal accuracy: its own final
        assert (e["difference"], e["low"], e["high"], e["p_value"]) == (0.0, 0.0, 0.0, 1.0)


def test_ece_endpoints_read_the_records_metrics():
    runs = synthetic_runs()
    for metric, key in (("ece", "ece"), ("decision_ece", "decision_ece")):
        e = P.endpoint(runs, arm="capo_mask", reference="grpo", metric=metric, seeds=(0,), n_boot=20)
        r = e["seeds"][0]
        by_step = lambda run, step: next(x for x in run["evaluations"] if x["step"] == step)
        assert r["value"] == pytest.approx(by_step(runs[("capo_mask", 0)], r["step"])[key])
        assert r["reference_value"] == pytest.approx(by_step(runs[("grpo", 0)], r["reference_step"])[key])


def test_analysis_verdict_holm_and_report():
    result = P.analyse(synthetic_runs(), n_boot=N_BOOT)
    assert result["complete"] and not result["step0"] and result["seeds"] == list(P.SEEDS)
    ends = result["endpoints"]
    assert ends["S2"]["difference"] > 0  # CAPO's planted separation also beats slow GRPO's
    assert [ends[n]["p_holm"] for n in P.SECONDARY] == pytest.approx(
        P.holm_adjust([ends[n]["p_value"] for n in P.SECONDARY]))
    assert result["slow"]["slower"] and not result["grpo_moved"]["not_moved"]
    assert result["verdict"][0].startswith("On this model and task, CAPO + mask keeps the confidence ranking better")
    assert "more than slowness" in result["verdict"][1]
    text = P.report(result, synthetic_runs(), figure="x.png")
    assert "## Verdict" in text and "No verdict" not in text
    # CAPO's seed 4 beyond GRPO; every CAPO final (>= 0.33) beyond slow GRPO's curve (<= 0.28) by more than 0.03
    assert ("Seeds read by the fallback rule: S2 seed 0, S2 seed 1, S2 seed 2, S2 seed 3, S2 seed 4, S4 seed 4, "
            "primary seed 4.") in text
    assert f"({N_BOOT:,} replicates" in text
    assert "| primary | 4 (fallback) | 36 |" in text


def test_partial_data_and_a_step0_mismatch_give_no_verdict():
    runs = synthetic_runs()
    del runs[("capo_mask", 3)]
    result = P.analyse(runs, n_boot=20)
    assert result["verdict"] is None and result["missing"] == ["CAPO + frozen mask (tau 0.6) seed 3"]
    assert result["seeds"] == [0, 1, 2, 4]
    assert "No verdict: the study is not complete" in P.report(result, runs, figure=None)
    # seed 3 left out under the two-attempts rule: the verdict comes from the other four
    result = P.analyse(runs, left_out=[3], n_boot=20)
    assert result["complete"] and result["verdict"] and "Seeds left out" in P.report(result, runs, figure=None)
    runs = synthetic_runs()
    start = runs[("grpo_decision", 2)]["evaluations"][0]
    changed = {**start["samples"], "logprob_mean": [start["samples"]["logprob_mean"][0] + 1e-6,
                                                    *start["samples"]["logprob_mean"][1:]]}
    runs[("grpo_decision", 2)]["evaluations"][0] = {**start, "samples": changed}
    result = P.analyse(runs, n_boot=20)
    assert result["verdict"] is None and len(result["step0"]) == 1 and "grpo_decision seed 2" in result["step0"][0]


def test_verdict_rows_of_the_protocols_table():
    s2 = {"difference": 0.02}
    v = lambda low, high, **kw: P.verdict({"difference": (low + high) / 2, "low": low, "high": high,
                                           "half_width": (high - low) / 2, "between_seed_sd": 0.04}, s2,
                                          kw.get("holm", 0.5), slower=kw.get("slower", True))
    assert "not separable from moving slowly" in v(0.01, 0.09)[1]
    assert "does not answer" in v(0.01, 0.09, slower=False)[1]
    assert v(-0.09, -0.01)[0].startswith("CAPO + mask ranks worse than GRPO")
    assert "gains of 0.1 or more" in v(-0.08, 0.06)[0] and len(v(-0.08, 0.06)) == 1
    assert "with the pairs as pre-registered" in v(-0.08, 0.06)[0] and "at 95%" in v(-0.08, 0.06)[0]
    assert "inside (-0.05, +0.05)" in v(-0.04, 0.045)[1]
    assert v(-0.12, 0.05)[0].startswith("Inconclusive") and "0.085 against the planned 0.05" in v(-0.12, 0.05)[0]


def test_grpo_that_did_not_move_is_said():
    runs = synthetic_runs()
    for s in (0, 1, 2):
        evaluations = runs[("grpo", s)]["evaluations"]
        evaluations[-1] = {**evaluations[-1], "accuracy": evaluations[0]["accuracy"] + 0.02}
    moved = P.grpo_movement(runs, P.SEEDS)
    assert moved["within"] == 3 and moved["not_moved"]
    result = P.analyse(runs, n_boot=20)
    assert result["verdict"][0].startswith("GRPO's final accuracy is within 0.03 of its start in 3 of 5 seeds")
    assert "no statement about calibration under training" in P.report(result, runs, figure=None)


# -------------------------------------------------------------------------------------------- raw records


def _write_run(folder: Path, run: dict, **config) -> None:
    folder.mkdir(parents=True)
    settings = {**P.PROTOCOL_SETTINGS, "method": run["method"], "learning_rate": run["lr"], "seed": run["seed"],
                **config}
    (folder / "trainer_log.json").write_text(json.dumps({"finished": True, "config": settings, "seconds": 1.0}))
    records = [{k: v for k, v in e.items() if k != "samples"} for e in run["evaluations"]]
    (folder / "calibration_eval.json").write_text(json.dumps({"records": records}))
    (folder / "evaluation_samples.json").write_text(json.dumps(
        {"evaluations": [{"step": e["step"], **e["samples"]} for e in run["evaluations"]]}))


def test_gather_writes_every_finished_run_and_the_analysis_reads_it(tmp_path):
    runs = synthetic_runs(seeds=(0, 1))
    root = tmp_path / "runs"
    for (arm, s), run in runs.items():
        folder = root / "slow" / f"seed{s}" / "grpo" if arm == "slow_grpo" else root / f"seed{s}" / run["method"]
        _write_run(folder, run)
    (root / "seed2" / "grpo").mkdir(parents=True)  # started, not finished: not gathered
    (root / "seed2" / "grpo" / "trainer_log.json").write_text(json.dumps({"finished": False}))
    out = tmp_path / "records"
    assert P.main(["--gather", "--runs", str(root), "--records", str(out)]) == 0
    first = {f.name: f.read_bytes() for f in out.iterdir()}
    assert sorted(first) == sorted(f"{arm}_seed{s}.json.gz" for arm, s in runs)  # one file per run
    back = P.load_records(out)
    assert set(back) == set(runs)
    for key, run in runs.items():
        assert back[key]["evaluations"] == json.loads(json.dumps(run["evaluations"]))
    P.main(["--gather", "--runs", str(root), "--records", str(out)])
    assert {f.name: f.read_bytes() for f in out.iterdir()} == first  # no timestamp: the same runs, the same bytes
    report = tmp_path / "report.md"
    assert P.main(["--records", str(out), "--out", str(report), "--n-boot", "20"]) == 0
    text = report.read_text()
    assert "No verdict: the study is not complete" in text and "GRPO seed 4" in text
    assert (tmp_path / "report.png").stat().st_size > 0


def test_gather_refuses_a_run_with_other_settings(tmp_path):
    run = synthetic_runs(seeds=(0,))[("grpo", 0)]
    _write_run(tmp_path / "runs" / "seed0" / "grpo", run, eval_prompts=48)
    with pytest.raises(ValueError, match=r"seed0/grpo/trainer_log.json: config.eval_prompts is 48"):
        P.gather(tmp_path / "runs", tmp_path / "records")


# -------------------------------------------------------------------------------------------- the queue


QUEUE = ROOT / "scripts" / "realmodel_powered_queue.sh"


def test_the_queue_runs_the_protocols_commands():
    import re
    import shlex
    import subprocess

    protocol = (ROOT / "docs" / "protocols" / "realmodel_powered.md").read_text()
    common = shlex.split(re.search(r'COMMON="(.*?)"', protocol, re.S).group(1).replace("\\\n", " "))
    lines = subprocess.run(["bash", str(QUEUE), "--dry-run"], capture_output=True, text=True, check=True,
                           env={"PATH": "/usr/bin:/bin", "PYTHON": "python"}).stdout.splitlines()
    runs = [shlex.split(line) for line in lines if not line.startswith("#")]
    expected = [[*common, "--seed", str(s), "--lr", "3e-4", "--out", f"runs/realmodel_powered/seed{s}",
                 "--methods", "grpo,capo_mask"] for s in P.SEEDS]
    for s in P.SEEDS:
        expected += [[*common, "--seed", str(s), "--lr", "3e-4", "--out", f"runs/realmodel_powered/seed{s}",
                      "--methods", "grpo_decision"],
                     [*common, "--seed", str(s), "--lr", "1e-4", "--out", f"runs/realmodel_powered/slow/seed{s}",
                      "--methods", "grpo"]]
    assert [r[:3] for r in runs] == [["python", "-m", "studies.realmodel_study"]] * 15  # 20 runs, 15 commands
    assert [r[3:-2] for r in runs] == expected  # the pre-registered arguments, then only the commit hook
    assert all(r[-2:] == ["--on-finish", "scripts/realmodel_powered_queue.sh --publish"] for r in runs)


def test_the_gpu_pool_runs_the_protocols_commands_on_the_gpu_primary_runs_first(tmp_path):
    """scripts/realmodel_powered_gpu.sh (amendment 5): the same 20 runs, each the pre-registered arguments plus
    ``--device cuda``, GRPO and CAPO + mask of every seed before the other arms; a run that fails is logged as
    stopped and the pool goes on; the records are gathered at the end. The interpreter is a stand-in that writes
    down its arguments (one process at a time, so the order is the script's)."""
    import re
    import shlex
    import subprocess

    protocol = (ROOT / "docs" / "protocols" / "realmodel_powered.md").read_text()
    common = shlex.split(re.search(r'COMMON="(.*?)"', protocol, re.S).group(1).replace("\\\n", " "))
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\nprintf "%s\\t" "$@" >> {calls}\necho >> {calls}\n'
                    '[[ "$*" == *"--methods capo_mask"*"--seed 3"* || "$*" == *"--seed 3"*"capo_mask"* ]] && exit 3\n'
                    'exit 0\n')
    fake.chmod(0o755)
    runs = tmp_path / "runs"
    subprocess.run(["bash", str(ROOT / "scripts" / "realmodel_powered_gpu.sh")], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "RUNS": str(runs), "SLOTS": "1",
                        "RECORDS": str(tmp_path / "records")})
    lines = [line.rstrip("\t").split("\t") for line in calls.read_text().splitlines()]
    assert lines[0][0] == "-c" and "resolve_model" in lines[0][1]  # the model converted once, first
    assert lines[-1] == ["-m", "studies.realmodel_powered", "--gather", "--runs", str(runs), "--records",
                         str(tmp_path / "records")]
    study = lines[1:-1]
    expected = []
    for s in P.SEEDS:
        for method in ("grpo", "capo_mask"):
            expected.append([*common, "--device", "cuda", "--seed", str(s), "--lr", "3e-4", "--out",
                             f"{runs}/seed{s}", "--methods", method])
    for s in P.SEEDS:
        expected += [[*common, "--device", "cuda", "--seed", str(s), "--lr", "3e-4", "--out", f"{runs}/seed{s}",
                      "--methods", "grpo_decision"],
                     [*common, "--device", "cuda", "--seed", str(s), "--lr", "1e-4", "--out",
                      f"{runs}/slow/seed{s}", "--methods", "grpo"]]
    assert [r[:2] for r in study] == [["-m", "studies.realmodel_study"]] * 20
    assert [r[2:] for r in study] == expected
    pool = (runs / "logs" / "gpu_pool.log").read_text()
    assert pool.count(": finished") == 19 and "capo_mask_seed3: stopped, exit 3" in pool


def test_the_gpu_pool_names_its_amendment_and_its_process_count():
    """scripts/realmodel_powered_gpu.sh is the protocol's amendment 5 and defaults to its "up to N at a time"."""
    import re

    protocol = (ROOT / "docs" / "protocols" / "realmodel_powered.md").read_text()
    amendment = re.search(r"^(\d+)\. \*Executed on one GPU", protocol, re.M).group(1)
    at_a_time = re.search(r"up to (\d+) at a time", protocol).group(1)
    script = (ROOT / "scripts" / "realmodel_powered_gpu.sh").read_text()
    assert f"realmodel_powered.md, amendment {amendment})" in script
    assert f"SLOTS=${{SLOTS:-{at_a_time}}}" in script


def test_publishing_commits_the_records_file_and_nothing_else(tmp_path):
    import shutil
    import subprocess
    import sys

    (tmp_path / "scripts").mkdir()
    shutil.copy(QUEUE, tmp_path / "scripts")  # it runs `python -m studies.realmodel_powered`: this tree's, below
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path,
                                    check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    (tmp_path / "other.txt").write_text("x\n")
    git("add", "other.txt"), git("commit", "-qm", "start")
    (tmp_path / "other.txt").write_text("y\n")
    git("add", "other.txt")  # someone else's staged change: must stay out of the commit
    for (arm, s), run in synthetic_runs(seeds=(0,)).items():
        if arm in ("grpo", "capo_mask"):
            _write_run(tmp_path / "runs" / "realmodel_powered" / f"seed{s}" / run["method"], run)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(tmp_path),
           "PYTHONPATH": str(ROOT)}  # this tree's studies and calibrl, whatever the interpreter has installed
    for _ in range(2):  # the second finds nothing new: no second commit
        subprocess.run(["bash", "scripts/realmodel_powered_queue.sh", "--publish"], cwd=tmp_path, env=env,
                       check=True, capture_output=True)
    assert git("log", "--format=%s").splitlines() == ["Powered real-model study: raw records, 2 finished run(s)",
                                                      "start"]
    assert git("show", "--name-only", "--format=", "HEAD").split() == [
        "docs/results/realmodel_powered/capo_mask_seed0.json.gz", "docs/results/realmodel_powered/grpo_seed0.json.gz"]
    assert git("diff", "--cached", "--name-only").split() == ["other.txt"]
    assert set(P.load_records(tmp_path / "docs" / "results" / "realmodel_powered")) == {("grpo", 0),
                                                                                      ("capo_mask", 0)}


# -------------------------------------------------------------------------------------------- matching sensitivity


def test_matched_step_sensitivity_pairs_every_grpo_step_and_the_seed_t_interval():
    """Each trained GRPO step k paired with CAPO + mask's final evaluation in every seed: the mean of the per-seed
    sklearn AUROC differences; the t-interval over seeds of the pre-registered pairs' differences, by hand."""
    from scipy import stats

    runs = synthetic_runs()
    seeds = P.SEEDS
    auc = lambda e: roc_auc_score(e["samples"]["correct"], e["samples"]["logprob_mean"])
    got = P.matched_step_sensitivity(runs, seeds)
    assert sorted(got["by_step"]) == [12, 24, 36, 48, 60]
    for i, k in enumerate(P.EVAL_STEPS[1:], start=1):
        want = np.mean([auc(runs[("capo_mask", s)]["evaluations"][-1]) - auc(runs[("grpo", s)]["evaluations"][i])
                        for s in seeds])
        assert got["by_step"][k] == pytest.approx(want, abs=1e-12)
    assert got["low"] == min(got["by_step"].values()) and got["high"] == max(got["by_step"].values())
    # the pre-registered pairs: the endpoint's own per-seed differences (seed 4 by the fallback)
    per_seed = [r["difference"] for r in P.endpoint(runs, arm="capo_mask", reference="grpo", metric="auroc",
                                                     seeds=seeds, n_boot=N_BOOT)["seeds"]]
    half = stats.t.ppf(0.975, len(seeds) - 1) * np.std(per_seed, ddof=1) / math.sqrt(len(seeds))
    mean, low, high = got["t_interval"]
    assert mean == pytest.approx(np.mean(per_seed), abs=1e-12)
    assert (low, high) == pytest.approx((np.mean(per_seed) - half, np.mean(per_seed) + half), abs=1e-12)
    sentence = P.sensitivity_sentence(got)
    assert f"{got['low']:+.3f} to {got['high']:+.3f}" in sentence and f"[{low:+.3f}, {high:+.3f}]" in sentence


def test_accuracy_standard_error_takes_prompts_as_clusters():
    # prompt a: 2 of 2 right, b: 0 of 2, c: 1 of 2 -> shares 1, 0, 0.5: sd 0.5, / sqrt(3)
    samples = {"prompt_id": ["a", "a", "b", "b", "c", "c"], "correct": [1, 1, 0, 0, 1, 0]}
    assert P.accuracy_standard_error(samples) == pytest.approx(0.5 / math.sqrt(3))


def test_the_report_states_the_sensitivity_and_the_scope():
    runs = synthetic_runs()
    result = P.analyse(runs, n_boot=20)
    text = P.report(result, runs, figure=None)
    assert P.sensitivity_sentence(result["sensitivity"]) in text
    finals = [run["evaluations"][-1]["auroc"] for run in runs.values()]
    assert f"every final AUROC is {min(finals):.2f}-{max(finals):.2f}" in text
    assert "carry no UTC start and end" in text  # the synthetic records, like the study's, have none
    for run in runs.values():
        run.update(started_utc="2026-11-28T03:00:00Z", finished_utc="2026-11-28T04:00:00Z")
    assert "carry no UTC start and end" not in P.report(result, runs, figure=None)
