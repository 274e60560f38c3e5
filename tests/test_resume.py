"""Kill a training run with SIGKILL after a checkpoint exists, resume it, and compare with an uninterrupted run.

Both runs go through calibrl.trl.train.train (the ``calibrl train`` code path) in subprocesses. With the same seed,
a resumed run that restores the optimizer state, the LR schedule, the data position and the RNG state ends with
exactly the weights of the uninterrupted run; losing any of them would change the weights. Work lost to the kill
is at most one checkpoint interval: the resumed run starts at the last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "trl_resume.py"
MAX_STEPS, SAVE_STEPS = 8, 2


def _recipe(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    recipe = {
        "model": {"name_or_path": "builtin:tiny"},
        "dataset": {"name": "test/resume_tiny"},
        "rewards": ["test/parity"],
        "trainer": {
            "output_dir": str(out), "max_steps": MAX_STEPS, "save_steps": SAVE_STEPS, "save_strategy": "steps",
            "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 6,
            "learning_rate": 1.0e-3, "logging_steps": 1, "use_cpu": True, "bf16": False, "seed": 3,
            "report_to": "none", "advantage_estimator": "capo", "lr_scheduler_type": "linear",
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    # 1. The run we kill: sleep after each step so the kill lands between checkpoints.
    killed = _recipe(tmp_path, "killed")
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(killed)], env=_env(CALIBRL_TEST_STEP_SLEEP="0.7"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first_ckpt = out / f"checkpoint-{SAVE_STEPS}"
    deadline = time.time() + 150
    while not (first_ckpt / "trainer_state.json").exists():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "no checkpoint within 150 s"
        time.sleep(0.05)
    time.sleep(0.2)  # let the checkpoint's last files land
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    checkpoints = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert checkpoints and checkpoints[-1] < MAX_STEPS, f"the run finished before the kill: {checkpoints}"
    last = checkpoints[-1]

    # 2. Resume it, 3. run the same recipe uninterrupted, in parallel (independent processes).
    resumed = subprocess.Popen([sys.executable, str(SCRIPT), str(killed), "--resume"],
                               env=_env(CALIBRL_TEST_TAG="resumed"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    reference = _recipe(tmp_path, "reference")
    ref = subprocess.run([sys.executable, str(SCRIPT), str(reference)], env=_env(CALIBRL_TEST_TAG="reference"),
                         capture_output=True, text=True, timeout=240)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    log, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, log.decode()[-3000:]

    result = json.loads((out / "result-resumed.json").read_text())
    assert result["resumed_from"].endswith(f"checkpoint-{last}")
    assert result["global_step"] == MAX_STEPS
    # global_step continued: this process trained only the steps after the checkpoint
    assert result["trained_steps"] == list(range(last + 1, MAX_STEPS + 1))
    state = json.loads((out / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS
    # the optimizer state continued: AdamW's step counter counts every step, before and after the kill
    opt = torch.load(out / f"checkpoint-{MAX_STEPS}" / "optimizer.pt", weights_only=False)
    assert {int(s["step"]) for s in opt["state"].values()} == {MAX_STEPS}

    # optimizer, scheduler, data order and RNG all continued: same final weights as the uninterrupted run
    a, b = _weights(out), _weights(tmp_path / "reference")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=1e-5, msg=f"weights differ at {key}")
    reference_state = json.loads((tmp_path / "reference" / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    reference_losses = [h["loss"] for h in reference_state["log_history"] if "loss" in h]
    assert losses == pytest.approx(reference_losses, rel=1e-5, abs=1e-7)

    # log_history.jsonl: the resumed run dropped the killed run's lines after the checkpoint and rewrote them, so
    # every step is there once, with the uninterrupted run's losses
    lines = [json.loads(line) for line in (out / "log_history.jsonl").read_text().splitlines()]
    reference_lines = [json.loads(line) for line in (tmp_path / "reference" / "log_history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in lines if "loss" in h] == list(range(1, MAX_STEPS + 1))
    assert [h["loss"] for h in lines if "loss" in h] == pytest.approx(
        [h["loss"] for h in reference_lines if "loss" in h], rel=1e-5, abs=1e-7)


# ---------------------------------------------------------------------------------------------------- CAPO frozen mask


def _capo_quantile_trainer(out: Path, max_steps: int):
    """In-process tiny trainer with capo_mask="quantile", a checkpoint every step, recording each step's params."""
    from datasets import Dataset

    from calibrl.models import build_tiny_model
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

    class Recording(CalibratedGRPOTrainer):
        def _calibrl_replace_advantages(self, output):
            result = super()._calibrl_replace_advantages(output)
            self.steps.append((self.last_rollout["params"], self.last_rollout["batch"]))
            return result

    def parity(prompts, completions, **kwargs):
        return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]

    model, tok = build_tiny_model(seed=0)
    args = CalibratedGRPOConfig(
        output_dir=str(out), per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
        max_steps=max_steps, save_strategy="steps", save_steps=1, logging_steps=1, report_to="none", use_cpu=True,
        bf16=False, seed=3, disable_tqdm=True, learning_rate=5e-3, advantage_estimator="capo", capo_mask="quantile")
    trainer = Recording(model=model, reward_funcs=parity, args=args, processing_class=tok,
                        train_dataset=Dataset.from_list([{"prompt": f"{i:02d}+{i % 7}="} for i in range(64)]))
    trainer.steps = []
    return trainer


def test_capo_frozen_quantile_thresholds_are_checkpointed_and_restored(tmp_path):
    import math

    from calibrl.advantages.capo import MASK_SETTING_KEYS, read_mask_states
    from calibrl.trl.trainer import CAPO_MASK_STATE_FILE

    torch.set_num_threads(1)
    out = tmp_path / "run"
    first = _capo_quantile_trainer(out, max_steps=2)
    first.train()
    log_ppl = -first.steps[0][1].ref_logprob_mean
    expected = (math.exp(float(torch.quantile(log_ppl, 0.75))), math.exp(float(torch.quantile(log_ppl, 0.25))))
    for step in (1, 2):
        (entry,) = read_mask_states(str(out / f"checkpoint-{step}"))  # the format verl's checkpoints use too
        assert entry["estimator"] == "capo" and set(entry["settings"]) == set(MASK_SETTING_KEYS)
        saved = entry["state"]
        assert saved["ref_ppl_high_low"] == pytest.approx(list(expected), rel=1e-6)
        assert saved["log_thresholds"] == list(first.capo_quantile_mask.log_thresholds)

    # Thresholds no batch of this run would give: the resumed run must read them, not estimate new ones (planted
    # as an earlier calibrl wrote the file, one bare state: still read)
    planted = dict(saved, log_thresholds=[math.log(7.0), math.log(1.5)])
    (out / "checkpoint-1" / CAPO_MASK_STATE_FILE).write_text(json.dumps(planted))
    resumed = _capo_quantile_trainer(out, max_steps=3)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert resumed.state.global_step == 3 and len(resumed.steps) == 2  # steps 2 and 3
    for params, _ in resumed.steps:
        assert (params["ref_high"], params["ref_low"]) == pytest.approx((7.0, 1.5), rel=1e-12)
    saved = read_mask_states(str(out / "checkpoint-3"))[0]["state"]
    assert saved["ref_ppl_high_low"] == pytest.approx([7.0, 1.5], rel=1e-12)

    # A checkpoint without the file (saved with another mask): estimated again from the first batch after it.
    (out / "checkpoint-2" / CAPO_MASK_STATE_FILE).unlink()
    again = _capo_quantile_trainer(out, max_steps=3)
    again.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    params, batch = again.steps[0]
    assert params["ref_high"] == pytest.approx(math.exp(float(torch.quantile(-batch.ref_logprob_mean, 0.75))))


# ------------------------------------------------------------------------------- resume across epochs, torn saves

EPOCH_PROMPTS, EPOCH_STEPS = 8, 6  # 2 prompts a step: 4 steps an epoch, so step 5 is the first of epoch 1
_TIMING = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def _epoch_recipe(out: Path):
    """A recipe (calibrl train's path) on 8 prompts, saving every step: epochs end at steps 4 and 8."""
    from calibrl.tasks.registry import register_dataset, register_reward
    from calibrl.trl.recipes import parse_recipe

    register_dataset("test/resume_epochs", overwrite=True)(
        lambda split="train", limit=None: __import__("datasets").Dataset.from_list(
            [{"prompt": f"{i:02d}+{i % 7}="} for i in range(EPOCH_PROMPTS)]))
    register_reward("test/resume_parity", overwrite=True)(
        lambda prompts, completions, **kw: [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions])
    return parse_recipe({
        "model": "builtin:tiny", "dataset": "test/resume_epochs", "rewards": ["test/resume_parity"],
        "trainer": {"output_dir": str(out), "max_steps": EPOCH_STEPS, "save_strategy": "steps", "save_steps": 1,
                    "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 6,
                    "learning_rate": 5e-3, "logging_steps": 1, "use_cpu": True, "bf16": False, "seed": 3,
                    "report_to": "none", "advantage_estimator": "capo", "capo_mask": "quantile"}}, "epochs.yaml")


def _steps(log_history: list[dict]) -> dict[int, dict]:
    return {h["step"]: {k: v for k, v in h.items() if k not in _TIMING} for h in log_history if "loss" in h}


@pytest.fixture(scope="module")
def epoch_run(tmp_path_factory):
    """An uninterrupted run of EPOCH_STEPS steps with a checkpoint after every step (trained once per module)."""
    from calibrl.trl.train import train

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("epochs") / "run"
    result = train(_epoch_recipe(out), progress=False)
    return out, result


def _resume_from(epoch_run, tmp_path: Path, step: int, *, tear=None):
    """Copy checkpoints 1..step (+ a torn checkpoint-(step+1) when ``tear`` edits it) and resume with train()."""
    import shutil
    from io import StringIO

    from rich.console import Console

    from calibrl.trl.train import train

    source, _ = epoch_run
    out = tmp_path / "run"
    for k in range(1, step + 1 + (tear is not None)):
        shutil.copytree(source / f"checkpoint-{k}", out / f"checkpoint-{k}")
    if tear is not None:
        tear(out / f"checkpoint-{step + 1}")
    text = StringIO()
    result = train(_epoch_recipe(out), resume=True, progress=False, console=Console(file=text, width=300))
    return result, text.getvalue()


@pytest.mark.parametrize("step", [4, 5], ids=["epoch_boundary", "inside_epoch_1"])
def test_resume_in_a_later_epoch_is_bit_identical(epoch_run, tmp_path, step):
    """Resumed in epoch 1 (at its first step, or inside it), every later step logs exactly what the uninterrupted
    run logged (wall-clock timings aside) and the final weights are equal bit for bit: the sampler replays the
    shuffle of the epoch it resumes in (TRL's sampler alone restarts with epoch 0's order)."""
    from safetensors.torch import load_file

    source, reference = epoch_run
    result, _ = _resume_from(epoch_run, tmp_path, step)
    assert result["resumed_from"].endswith(f"checkpoint-{step}") and result["global_step"] == EPOCH_STEPS
    expected, got = _steps(reference["log_history"]), _steps(result["log_history"])
    assert sorted(got) == list(range(1, EPOCH_STEPS + 1))
    for s in range(step + 1, EPOCH_STEPS + 1):
        assert got[s] == expected[s], f"step {s} differs"
    a, b = load_file(str(source / "model.safetensors")), load_file(str(tmp_path / "run" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def _truncate(name: str, keep: float = 0.5):
    def tear(folder: Path) -> None:
        path = folder / name
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])
    return tear


def _remove(name: str):
    return lambda folder: (folder / name).unlink()


TEARS = [  # (id, how the save was cut off, the file the reason names)
    ("no_trainer_state", _remove("trainer_state.json"), "trainer_state.json"),
    ("trainer_state_cut", _truncate("trainer_state.json"), "trainer_state.json"),
    ("weights_cut", _truncate("model.safetensors"), "model.safetensors"),
    ("weights_header_only", _truncate("model.safetensors", keep=0.001), "model.safetensors"),
    ("optimizer_cut", _truncate("optimizer.pt"), "optimizer.pt"),
    ("scheduler_empty", _truncate("scheduler.pt", keep=0.0), "scheduler.pt"),
    ("rng_cut", _truncate("rng_state.pth", keep=0.9), "rng_state.pth"),
    ("capo_mask_cut", _truncate("calibrl_capo_mask.json"), "calibrl_capo_mask.json"),
    ("no_weights", _remove("model.safetensors"), "weights"),
]


@pytest.mark.parametrize("tear,name", [t[1:] for t in TEARS], ids=[t[0] for t in TEARS])
def test_a_torn_checkpoint_is_passed_over(epoch_run, tmp_path, tear, name):
    """Each way a kill (or a full disk) cuts a save short makes the folder incomplete; the newest complete one is
    found instead, and an intact copy is complete."""
    import shutil

    from calibrl.trl.checkpoints import checkpoint_problem, last_complete_checkpoint

    source, _ = epoch_run
    for k in (2, 3):
        shutil.copytree(source / f"checkpoint-{k}", tmp_path / f"checkpoint-{k}")
    assert checkpoint_problem(tmp_path / "checkpoint-3") is None
    tear(tmp_path / "checkpoint-3")
    problem = checkpoint_problem(tmp_path / "checkpoint-3")
    assert problem is not None and name in problem, problem
    assert last_complete_checkpoint(tmp_path) == (str(tmp_path / "checkpoint-2"),
                                                  [(str(tmp_path / "checkpoint-3"), problem)])


def test_resume_skips_a_torn_checkpoint_and_says_which(epoch_run, tmp_path):
    """calibrl train --resume after a kill during the save of checkpoint-4: it resumes from checkpoint-3, says so,
    and ends with the uninterrupted run's weights."""
    from safetensors.torch import load_file

    source, _ = epoch_run
    result, text = _resume_from(epoch_run, tmp_path, 3, tear=_truncate("optimizer.pt"))
    assert result["resumed_from"].endswith("checkpoint-3") and result["global_step"] == EPOCH_STEPS
    assert "skipping" in text and "checkpoint-4" in text and "optimizer.pt" in text, text
    assert "resuming from" in text and "checkpoint-3 (the last complete checkpoint)" in text, text
    assert "generation block" not in text, text  # TRL default layout: every step ends a block
    a, b = load_file(str(source / "model.safetensors")), load_file(str(tmp_path / "run" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_inside_generation_block_hand_values():
    """TRL generates every steps_per_generation x num_iterations micro-batches: a checkpoint resumes exactly only
    where a block ends (measured: steps_per_generation 2, resumed after step 3, steps 4-6 differ; after 4, none)."""
    from calibrl.trl.checkpoints import inside_generation_block

    def inside(step, ga=1, spg=1, it=1):
        return inside_generation_block(step, gradient_accumulation_steps=ga, steps_per_generation=spg,
                                       num_iterations=it)

    assert not any(inside(s, ga=4, spg=4) for s in range(1, 9))  # TRL's default: steps_per_generation = ga
    assert [inside(s, spg=2) for s in (1, 2, 3, 4)] == [True, False, True, False]
    assert [inside(s, spg=2, it=2) for s in (1, 2, 3, 4)] == [True, True, True, False]
    assert [inside(s, ga=8, spg=16) for s in (1, 2, 3)] == [True, False, True]  # the Qwen2.5-Math recipes' layout
