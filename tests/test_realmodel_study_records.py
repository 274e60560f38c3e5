"""bench/realmodel_study.py's committed data: --pack writes each finished run's settings, evaluations (with their
per-sample arrays) and trainer log into one file per run, and the tables and figure are rebuilt from those files
alone, equal to the tables of the run folders they came from."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _study():
    spec = importlib.util.spec_from_file_location("bench_realmodel_study", ROOT / "bench" / "realmodel_study.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
        logprob = rng.normal(-1.0, 0.5, size=48)
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
