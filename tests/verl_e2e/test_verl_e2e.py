"""verl 0.9.1's own ``main_ppo`` on the CPU under Ray, 2 training steps per case, with calibrl's estimators.

Runs only with ``CALIBRL_VERL_E2E=1`` in the verl environment (``make verl-e2e``); each case is one
``tests/verl_e2e/run_e2e.py`` run (a Ray node, FSDP2 workers, agent-loop and reward-loop workers, the ``hf``
rollout). Every check reads what the run wrote: verl's own step metrics (its file logger) and the record of each
advantage computation (``e2e_record.py``), replayed here through calibrl's public API.

``CALIBRL_VERL_E2E_OUT`` (default: a temporary folder) keeps the runs; ``CALIBRL_VERL_E2E_CASES`` (comma separated,
default every case of ``run_e2e.CASES``) picks cases; ``CALIBRL_VERL_E2E_REUSE=1`` checks the runs already in
``CALIBRL_VERL_E2E_OUT`` instead of running them again.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

import pytest

if os.environ.get("CALIBRL_VERL_E2E") != "1":
    pytest.skip("verl end-to-end runs only with CALIBRL_VERL_E2E=1 (make verl-e2e)", allow_module_level=True)
pytest.importorskip("verl")
pytest.importorskip("ray")

import torch  # noqa: E402

import calibrl  # noqa: E402
from calibrl.advantages.capo import FrozenQuantileMask, frozen_quantile_params  # noqa: E402
from calibrl.verl.advantage import rollout_batch_from_verl  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_e2e  # noqa: E402

SELECTED = [c for c in os.environ.get("CALIBRL_VERL_E2E_CASES", ",".join(run_e2e.CASES)).split(",") if c]


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("CALIBRL_VERL_E2E_OUT")
    return Path(given).resolve() if given else tmp_path_factory.mktemp("verl_e2e")


@pytest.fixture(scope="module")
def runs(out_dir: Path) -> dict:
    """Each selected case run once (``run_e2e.run_case``); case -> (result, folder). With
    ``CALIBRL_VERL_E2E_REUSE=1``, a case whose folder already holds a ``result.json`` is checked without running."""
    reuse = os.environ.get("CALIBRL_VERL_E2E_REUSE") == "1"
    out = {}
    for name in SELECTED:
        done = out_dir / name / "result.json"
        result = json.loads(done.read_text()) if reuse and done.exists() else run_e2e.run_case(name, out=out_dir)
        out[name] = (result, out_dir / name)
    return out


def _metrics(folder: Path) -> dict[int, dict]:
    """verl's step metrics from its file logger: step -> {metric: value}."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {int(row["step"]): row["data"] for row in rows}


def _records(folder: Path) -> list[dict]:
    """The recorded advantage computations of a run, in the order they happened."""
    return [torch.load(path, weights_only=False) for path in sorted(glob.glob(str(folder / "record" / "adv_*.pt")))]


def _replay(records: list[dict]) -> list[torch.Tensor]:
    """calibrl's advantages [N] for each recorded step, recomputed from the recorded verl inputs with
    :func:`calibrl.compute_advantages` (CAPO's ``mask=quantile`` thresholds frozen on the first step, as in a run)."""
    state = None
    out = []
    for rec in records:
        batch = rollout_batch_from_verl(token_level_rewards=rec["token_level_rewards"],
                                        response_mask=rec["response_mask"], index=rec["index"],
                                        old_log_probs=rec["old_log_probs"], ref_log_prob=rec["ref_log_prob"],
                                        answers=rec["answers"])
        params = dict(rec["params"])
        if params.get("mask") == "quantile":
            state = state or FrozenQuantileMask.from_params(params)
            params = frozen_quantile_params(params, batch=batch, state=state)
        out.append(calibrl.compute_advantages(batch, rec["estimator"], **params))
    return out


@pytest.mark.parametrize("case", SELECTED)
def test_main_ppo_trains_two_steps_on_the_cpu(runs: dict, case: str) -> None:
    result, folder = runs[case]
    log_tail = (folder / "log.txt").read_text()[-3000:] if (folder / "log.txt").exists() else ""
    assert result["returncode"] == 0, f"{case}: main_ppo exited with {result['returncode']}\n{log_tail}"
    metrics = _metrics(folder)
    assert sorted(metrics) == [1, 2], f"{case}: verl logged steps {sorted(metrics)}"
    for step, row in metrics.items():
        assert row["training/global_step"] == step
        assert row["actor/grad_norm"] > 0, f"{case} step {step}: the actor was not updated"
        # the rollout samples from the actor's current weights: the actor's recomputed log-probs of the sampled
        # tokens agree with the ones the rollout returned (a stale or unsynced rollout model would not)
        assert row["training/rollout_probs_diff_max"] < 1e-2, row["training/rollout_probs_diff_max"]


@pytest.mark.parametrize("case", SELECTED)
def test_verl_used_calibrls_advantages(runs: dict, case: str) -> None:
    """The advantages verl trained on (its logged critic/advantages statistics) are calibrl's estimator's, recomputed
    from the same rollout with calibrl.compute_advantages."""
    result, folder = runs[case]
    assert result["returncode"] == 0, f"{case}: the run failed (see the first test)"
    metrics, records = _metrics(folder), _records(folder)
    estimator = run_e2e.CASES[case][1]
    assert len(records) == 2, f"{case}: {len(records)} advantage computations recorded, expected one per step"
    for step, (rec, advantages) in enumerate(zip(records, _replay(records)), start=1):
        assert rec["estimator"] == estimator
        mask = rec["response_mask"].bool()
        assert advantages.shape == (mask.shape[0],)
        # what the estimator returned to verl: the replayed advantage on every response token
        expected = advantages[:, None].expand_as(mask)
        torch.testing.assert_close(rec["advantages"][mask], expected[mask].to(rec["advantages"].dtype))
        # what verl logged for the step it trained on (masked over response tokens, as verl computes it)
        valid = expected[mask].double()
        row = metrics[step]
        for stat, value in (("mean", valid.mean()), ("max", valid.max()), ("min", valid.min())):
            assert row[f"critic/advantages/{stat}"] == pytest.approx(float(value), abs=1e-5), (case, step, stat)
        assert valid.abs().max() > 0, f"{case} step {step}: every advantage is 0 (no mixed group)"


@pytest.mark.parametrize("case", [c for c in SELECTED if run_e2e.CASES[c][2].get("mask") == "quantile"])
def test_quantile_mask_is_frozen_by_the_first_step_with_the_reference(runs: dict, case: str) -> None:
    """CAPO's noise mask used the reference worker's log-probs, and its thresholds were frozen on step 1."""
    _, folder = runs[case]
    records = _records(folder)
    assert all(rec["ref_log_prob"] is not None for rec in records), "no reference log-probs reached the estimator"
    first, second = (rec["diagnostics"] for rec in records)
    assert first["ref_high"] > first["ref_low"] > 0
    assert (second["ref_high"], second["ref_low"]) == (first["ref_high"], first["ref_low"])
    assert 0 < first["mask_fraction"] < 1


@pytest.mark.parametrize("case", [c for c in SELECTED if run_e2e.CASES[c][1] == "seed_grpo"])
def test_seed_grpo_clustered_the_reward_functions_answers(runs: dict, case: str) -> None:
    """seed_grpo received the answers the rule reward returned (the first digit of each response)."""
    _, folder = runs[case]
    for rec in _records(folder):
        answers = rec["answers"]
        assert answers is not None and len(answers) == rec["response_mask"].shape[0]
        assert any(a is not None for a in answers)
        assert all(a is None or (len(a) == 1 and a.isdigit()) for a in answers)
