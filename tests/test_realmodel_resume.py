"""A real-model run (calibrl.testbed.realmodel.train_real_model) that is interrupted after a checkpoint and run
again resumes there and gives the records of an uninterrupted run: every evaluation's metrics and per-sample
arrays, and the training logs of the steps after the checkpoint. On the tiny char-level model (with a chat template
added, as the task's prompts are conversational), CAPO + frozen mask (the most state: the mask's thresholds), a
few steps; the uninterrupted run keeps no checkpoints, as every run did before resuming existed, so the test also
says checkpointing changes no number."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from calibrl.testbed.realmodel import RUN_CONFIG_FILE, RealModelRunConfig, train_real_model

pytestmark = pytest.mark.slow

LOG_KEYS = ("reward", "loss", "grad_norm", "entropy", "calibration/auroc")


class Interrupted(Exception):
    pass


def _config(model: str, method: str = "capo_mask", **kw) -> RealModelRunConfig:
    return RealModelRunConfig(model=model, method=method, steps=4, prompts_per_step=4, num_generations=4,
                              max_completion_length=8, train_prompts=40, eval_prompts=8, eval_k=4, eval_every=2,
                              threads=1, learning_rate=1e-2, **kw)


def _logs(result: dict) -> dict[int, dict]:
    return {h["step"]: {k: h.get(k) for k in LOG_KEYS} for h in result["log_history"] if "reward" in h}


@pytest.mark.parametrize("method", ["capo_mask", "grpo_decision"])
def test_an_interrupted_run_resumes_from_its_checkpoint_with_the_uninterrupted_records(tiny_chat_model, tmp_path,
                                                                                        method):
    """CAPO + frozen mask (the most state) and the decision-CE arm the powered study resumed (its amendment 6)."""
    config = _config(tiny_chat_model, method)
    whole = train_real_model(config, tmp_path / "whole")  # no checkpoints: the path every earlier run took
    assert not list((tmp_path / "whole").glob("checkpoint-*")) and whole["resumed_from"] is None

    def crash(step: int, logs: dict) -> None:
        if step == 3 and "reward" in logs:  # step 3's log: after checkpoint-2 was saved, before step 4
            raise Interrupted

    with pytest.raises(Interrupted):
        train_real_model(config, tmp_path / "cut", on_log=crash, checkpoints=True)
    assert [p.name for p in (tmp_path / "cut").glob("checkpoint-*")] == ["checkpoint-2"]
    assert not (tmp_path / "cut" / "trainer_log.json").exists()
    said = []
    resumed = train_real_model(config, tmp_path / "cut", checkpoints=True, print_fn=said.append)
    assert resumed["resumed_from"] == 2 and "resuming from checkpoint-2" in said[0]
    assert [r["step"] for r in resumed["records"]] == [0, 2, 4]
    assert resumed["records"] == whole["records"]  # metrics and per-sample arrays, exactly
    # each call's UTC start and end, the resumed call's after the whole run's
    assert whole["started_utc"] <= whole["finished_utc"] <= resumed["started_utc"] <= resumed["finished_utc"]
    assert json.loads((tmp_path / "cut" / "trainer_log.json").read_text())["started_utc"] == resumed["started_utc"]
    assert _logs(resumed)[4] == _logs(whole)[4]
    assert _logs(whole)[4]["grad_norm"] > 0  # the step after the resume moved the adapter: not a vacuous match
    # the finished run saved after its last evaluation too; rerunning it is the study's job (skipped as finished)
    assert [p.name for p in (tmp_path / "cut").glob("checkpoint-*")] == ["checkpoint-4"]
    assert json.loads((tmp_path / "cut" / "trainer_log.json").read_text())["finished"]


def test_resuming_under_other_settings_is_refused(tiny_chat_model, tmp_path):
    def crash(step: int, logs: dict) -> None:
        if step == 3 and "reward" in logs:
            raise Interrupted

    with pytest.raises(Interrupted):
        train_real_model(_config(tiny_chat_model), tmp_path, on_log=crash, checkpoints=True)
    with pytest.raises(ValueError, match=rf"{RUN_CONFIG_FILE}: learning_rate is 0.01 in the checkpointed run, "
                                         r"0.001 now"):
        train_real_model(replace(_config(tiny_chat_model), learning_rate=1e-3), tmp_path, checkpoints=True)


def test_a_checkpointed_run_from_before_the_device_field_resumes_on_the_cpu(tmp_path, monkeypatch):
    """run_config.json written before ``device`` existed reads as device "cpu": such a run resumes under the same
    settings, and is refused on the GPU (naming the field)."""
    from dataclasses import asdict

    import calibrl.trl.checkpoints as checkpoints
    from calibrl.testbed.realmodel import _resume_point

    config = RealModelRunConfig(model="m", steps=4)
    saved = json.loads(json.dumps(asdict(config), default=str))
    del saved["device"]
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps(saved))
    checkpoint = tmp_path / "checkpoint-2"
    monkeypatch.setattr(checkpoints, "last_complete_checkpoint", lambda out: (str(checkpoint), []))
    assert _resume_point(config, tmp_path) == checkpoint
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"device is 'cpu' in the checkpointed run, 'cuda' now"):
        _resume_point(RealModelRunConfig(model="m", steps=4, device="cuda"), tmp_path)
