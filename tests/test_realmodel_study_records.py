"""studies/realmodel_study.py's committed data: --pack writes each finished run's settings, evaluations (with their
per-sample arrays) and trainer log into one file per run, and the tables and figure are rebuilt from those files
alone, equal to the tables of the run folders they came from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _study():
    from studies import realmodel_study

    return realmodel_study


def _write_run(folder: Path, method: str, seed: int, *, finished: bool = True, shift: float = 0.0) -> None:
    """A run folder as train_real_model leaves it: 3 evaluations of 12 prompts x 4 samples, a 6-step log."""
    rng = np.random.default_rng(seed * 10 + len(method))
    folder.mkdir(parents=True)
    config = {"model": "builtin:smollm2-135m-instruct", "method": method, "steps": 12, "seed": seed,
              "eval_prompts": 12, "eval_k": 4, "eval_every": 6}
    (folder / "run_config.json").write_text(json.dumps(config))
    records, samples = [], []
    for step in (0, 6, 12):
        ids = [f"p{i}" for i in range(12) for _ in range(4)]
        logprob = -np.abs(rng.normal(1.0, 0.5, size=48))  # log-probabilities: at most 0
        correct = (rng.random(48) < 1 / (1 + np.exp(-(logprob + 1 + shift * step)))).astype(int)
        records.append({"step": step, "accuracy": float(correct.mean()), "auroc": 0.5 + step / 100,
                        "ece": 0.1, "confidence_mean": float(np.exp(logprob).mean()), "n_samples": 48.0})
        samples.append({"step": step, "prompt_id": ids, "correct": correct.tolist(), "logprob_mean": logprob.tolist(),
                        "decision_prob": [None] + rng.random(47).tolist()})
    (folder / "calibration_eval.json").write_text(json.dumps({"config": config, "records": records}))
    (folder / "evaluation_samples.json").write_text(json.dumps({"evaluations": samples}))
    history = [{"step": s, "reward": 0.2 + s / 100, "entropy": 1.0 - s / 20} for s in range(1, 7)]
    (folder / "trainer_log.json").write_text(json.dumps({"finished": finished, "log_history": history}))


def test_pack_then_rebuild_gives_the_run_folders_tables(tmp_path):
    study = _study()
    out, dest = tmp_path / "runs", tmp_path / "records"
    for method in ("grpo", "capo_mask"):
        _write_run(out / method, method, seed=0, shift=0.01 if method == "grpo" else 0.0)
    _write_run(out / "capo", "capo", seed=0, finished=False)  # interrupted: not packed
    written = study.pack(out, ["grpo", "capo", "capo_mask"], dest)
    assert sorted(p.name for p in written) == ["capo_mask_seed0.json.gz", "grpo_seed0.json.gz"]
    first = {p.name: p.read_bytes() for p in dest.iterdir()}
    assert study.pack(out, ["grpo", "capo", "capo_mask"], dest) == []  # the same runs: nothing rewritten
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == first

    by_seed = study.load_packed(dest)
    assert list(by_seed) == [0]
    runs, logs = by_seed[0]
    assert list(runs) == ["GRPO", "CAPO + frozen mask (tau 0.6)"]  # REAL_MODEL_METHODS order, not file order
    folder_runs, folder_logs = study.load_run_folders(out, ["grpo", "capo_mask"])
    assert runs == json.loads(json.dumps(folder_runs)) and logs == folder_logs
    assert runs["GRPO"][1]["samples"]["decision_prob"][0] is None  # a completion that named no letter stays so
    text = study.study_text(by_seed)
    assert text.startswith("### Seed 0\n\n#### Held-out evaluations")
    assert study.tables(folder_runs, folder_logs) in text.replace("#### ", "## ")
    assert "paired prompt bootstrap" in text or "No evaluation of another method" in text
    figure = study.plot_study(by_seed, tmp_path / "study.png")
    assert figure.stat().st_size > 10_000


def test_a_second_seed_gets_its_own_section_and_panel(tmp_path):
    study = _study()
    for seed in (0, 1):
        out = tmp_path / f"runs{seed}"
        _write_run(out / "grpo", "grpo", seed=seed)
        study.pack(out, ["grpo"], tmp_path / "records")
    by_seed = study.load_packed(tmp_path / "records")
    assert sorted(by_seed) == [0, 1]
    text = study.study_text(by_seed)
    assert text.index("### Seed 0") < text.index("### Seed 1")
    assert study.plot_study(by_seed, tmp_path / "study.png").exists()


def test_paired_changes_equal_the_metrics_of_the_samples(tmp_path):
    """Each cell of the change tables is metric(a) - metric(b) on the per-sample arrays (accuracy, scikit-learn's
    AUROC, mean exp(logprob)) with an interval around it."""
    from sklearn.metrics import roc_auc_score

    study = _study()
    _write_run(tmp_path / "runs" / "grpo", "grpo", seed=0, shift=0.02)
    runs, _ = study.load_run_folders(tmp_path / "runs", ["grpo"])
    last, first = runs["GRPO"][-1]["samples"], runs["GRPO"][0]["samples"]
    table = study.difference_table([("GRPO", runs["GRPO"][-1], runs["GRPO"][0])], n_boot=200)
    row = [line for line in table.splitlines() if line.startswith("| GRPO |")][0]
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    points = [float(c.split(" [")[0]) for c in cells]
    lows_highs = [tuple(float(x) for x in c.split(" [")[1].rstrip("]").split(", ")) for c in cells]

    def auroc(s):
        return roc_auc_score(s["correct"], s["logprob_mean"])

    expected = [np.mean(last["correct"]) - np.mean(first["correct"]), auroc(last) - auroc(first), None,
                np.exp(last["logprob_mean"]).mean() - np.exp(first["logprob_mean"]).mean(), None]
    for name, point, want, (low, high) in zip(("accuracy", "auroc", "ece", "confidence", "decision"), points,
                                              expected, lows_highs):
        assert low <= point <= high, name
        if want is not None:
            assert point == pytest.approx(want, abs=6e-4), name  # the table prints 3 decimals
    assert "| GRPO |" in table and "Δ decision-letter ECE" in table.splitlines()[0]
