"""What ``calibrl train`` does with an output folder that already holds a run: a fresh run is refused (one line,
exit 2, nothing touched), ``--overwrite`` moves the old run aside, ``--resume`` of a finished run changes no file,
a checkpoint whose weights are not finite (or whose files are damaged in place) is passed over, and a resumed
run's ``train_loss`` is the uninterrupted run's."""

from __future__ import annotations

import hashlib
import json
import shutil
from io import StringIO
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from calibrl.cli import app

STEPS = 4


def _register() -> None:
    """A dataset of 8 prompts and a reward that differs within groups, so every step has a non-zero loss."""
    from datasets import Dataset

    from calibrl.tasks.registry import register_dataset, register_reward

    register_dataset("test/folder_prompts", overwrite=True)(
        lambda split="train", limit=None: Dataset.from_list([{"prompt": f"{i:02d}+{i % 7}="} for i in range(8)]))
    register_reward("test/folder_parity", overwrite=True)(
        lambda prompts, completions, **kw: [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions])


def _recipe_file(folder: Path, out: Path, **trainer) -> Path:
    _register()
    recipe = {
        "model": "builtin:tiny", "dataset": "test/folder_prompts", "rewards": ["test/folder_parity"],
        "trainer": {"output_dir": str(out), "max_steps": STEPS, "save_strategy": "steps", "save_steps": 1,
                    "logging_steps": 2, "per_device_train_batch_size": 8, "num_generations": 4,
                    "max_completion_length": 6, "learning_rate": 5e-3, "use_cpu": True, "bf16": False, "seed": 3,
                    "report_to": "none", "advantage_estimator": "grpo", **trainer},
    }
    path = folder / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _train(recipe_path: Path, **kwargs):
    from rich.console import Console

    from calibrl.trl.train import load_recipe, train

    text = StringIO()
    console = Console(file=text, width=400)
    result = train(load_recipe(recipe_path), progress=False, console=console, result_console=console, **kwargs)
    return result, text.getvalue()


def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """``folder`` and everything under it: (sha256 of a file's bytes, or "folder"; mtime in ns)."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder",
                                         p.stat().st_mtime_ns)
            for p in [folder, *sorted(folder.rglob("*"))]}


def _train_loss(log_history: list[dict]) -> float:
    [value] = [h["train_loss"] for h in log_history if "train_loss" in h]
    return value


def _fill_with_nan(path: Path) -> None:
    """Every floating tensor of a .safetensors file set to NaN in place: the same header and size."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    size = path.stat().st_size
    save_file({k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in tensors.items()},
              str(path), metadata={"format": "pt"})
    assert path.stat().st_size == size


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """An uninterrupted run of STEPS steps, a checkpoint after every step, a log every 2 steps."""
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("finished")
    result, _ = _train(_recipe_file(folder, folder / "run"))
    return folder / "run", result


def _copy_run(finished_run, tmp_path: Path, *, checkpoints=range(1, STEPS + 1), whole: bool = False) -> Path:
    """A copy of the finished run (``whole``), or of its checkpoints ``checkpoints`` alone (a run killed after
    the last of them)."""
    source, _ = finished_run
    out = tmp_path / "run"
    if whole:
        shutil.copytree(source, out)
    else:
        for k in checkpoints:
            shutil.copytree(source / f"checkpoint-{k}", out / f"checkpoint-{k}")
    return out


def _one_line(result) -> str:
    assert "Traceback" not in result.output and (result.exception is None or isinstance(result.exception,
                                                                                        SystemExit)), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


# ------------------------------------------------------------------------------------------- a fresh run: refused

@pytest.mark.parametrize("contents", [["checkpoint-2/", "log_history.jsonl"], ["log_history.jsonl"],
                                      ["model.safetensors", "config.json"]], ids=["checkpoints", "log", "model"])
def test_a_fresh_run_into_a_folder_holding_a_run_is_refused(tmp_path, monkeypatch, contents):
    import calibrl.trl.train as training

    out = tmp_path / "run"
    for name in contents:
        if name.endswith("/"):
            (out / name).mkdir(parents=True)
            (out / name / "trainer_state.json").write_text('{"global_step": 2}')
        else:
            out.mkdir(exist_ok=True)
            (out / name).write_text('{"step": 1, "loss": 0.5}\n' * 3)
    before = _snapshot(out)
    monkeypatch.setattr(training, "_load_model", lambda *a, **k: pytest.fail("a model was built"))
    result = CliRunner().invoke(app, ["train", str(_recipe_file(tmp_path, out))])
    assert result.exit_code == 2, result.output
    line = _one_line(result)
    assert str(out) in line and "--resume" in line and "--overwrite" in line, line
    assert _snapshot(out) == before


def test_an_empty_folder_or_one_without_a_run_is_not_refused(tmp_path):
    from calibrl.trl.checkpoints import run_contents

    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("my notes")
    assert run_contents(tmp_path / "empty") == [] and run_contents(tmp_path / "notes") == []
    assert run_contents(tmp_path / "absent") == []


def test_overwrite_moves_the_old_run_aside_and_resume_with_it_is_refused(finished_run, tmp_path):
    out = _copy_run(finished_run, tmp_path, whole=True)
    before = _snapshot(out)
    recipe = _recipe_file(tmp_path, out, max_steps=1, logging_steps=1)
    both = CliRunner().invoke(app, ["train", str(recipe), "--resume", "--overwrite"])
    assert both.exit_code == 2 and "--overwrite" in _one_line(both)
    result, text = _train(recipe, overwrite=True)
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert f"moved the earlier run in {out} to {aside}" in text, text
    assert _snapshot(aside) == before  # the old run, untouched, beside the new one
    assert result["global_step"] == 1 and (out / "model.safetensors").is_file()
    assert [json.loads(line)["step"] for line in (out / "log_history.jsonl").read_text().splitlines()] == [1, 1]


# ------------------------------------------------------------------------------------ --resume of a finished run

@pytest.mark.parametrize("damage", [None, "nan_last_checkpoint"])
def test_resume_of_a_finished_run_changes_no_file(finished_run, tmp_path, damage):
    """Also when its last checkpoint was damaged in place (NaN weights, same size): the good final model stays."""
    out = _copy_run(finished_run, tmp_path, whole=True)
    if damage:
        _fill_with_nan(out / f"checkpoint-{STEPS}" / "model.safetensors")
    before = _snapshot(out)
    result = CliRunner().invoke(app, ["train", str(_recipe_file(tmp_path, out)), "--resume"])
    assert result.exit_code == 0, result.output
    assert "has finished" in result.output and "no file changed" in result.output, result.output
    if damage:
        assert f"skipping {out / f'checkpoint-{STEPS}'}" in result.output and "NaN" in result.output, result.output
    assert _snapshot(out) == before


def test_resume_passes_over_a_checkpoint_with_nan_weights(finished_run, tmp_path):
    """A run killed after its checkpoint-2 was written with NaN weights (sizes intact): resumed from
    checkpoint-1, the NaN checkpoint is never promoted to the final model, and the run ends as the uninterrupted
    one did."""
    from safetensors.torch import load_file

    source, _ = finished_run
    out = _copy_run(finished_run, tmp_path, checkpoints=(1, 2))
    _fill_with_nan(out / "checkpoint-2" / "model.safetensors")
    result, text = _train(_recipe_file(tmp_path, out), resume=True)
    assert result["resumed_from"] == str(out / "checkpoint-1"), text
    assert "skipping" in text and "checkpoint-2" in text and "NaN" in text, text
    final, reference = load_file(str(out / "model.safetensors")), load_file(str(source / "model.safetensors"))
    assert all(torch.equal(final[k], reference[k]) for k in reference)


@pytest.mark.parametrize("damage,named", [
    ("nan_weights", "NaN"), ("optimizer_byte_flipped", "optimizer.pt"), ("step_not_an_integer", "global_step")])
def test_damage_that_keeps_the_sizes_makes_a_checkpoint_not_loadable(finished_run, tmp_path, damage, named):
    from calibrl.trl.checkpoints import checkpoint_problem

    folder = _copy_run(finished_run, tmp_path, checkpoints=(2,)) / "checkpoint-2"
    check = {} if damage == "step_not_an_integer" else {"loadable": True}  # a header-level check sees that one
    assert checkpoint_problem(folder, **check) is None
    if damage == "nan_weights":
        _fill_with_nan(folder / "model.safetensors")
    elif damage == "optimizer_byte_flipped":
        raw = bytearray((folder / "optimizer.pt").read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        (folder / "optimizer.pt").write_bytes(bytes(raw))
    else:
        state = json.loads((folder / "trainer_state.json").read_text())
        (folder / "trainer_state.json").write_text(json.dumps(dict(state, global_step="2")))
    problem = checkpoint_problem(folder, **check)
    assert problem is not None and named in problem, problem


# --------------------------------------------------------------------------------------- train_loss after resume

@pytest.mark.parametrize("step", [2, 3], ids=["at_a_logging_step", "between_logging_steps"])
def test_resumed_train_loss_is_the_uninterrupted_runs(finished_run, tmp_path, step):
    """transformers averages train_loss over the steps of the resumed call only; calibrl keeps the loss sums in
    the checkpoint. Resumed after step 3 (logging every 2 steps), the loss of step 3 is carried too, so the
    step-4 log and train_loss are both the uninterrupted run's, bit for bit."""
    _, reference = finished_run
    out = _copy_run(finished_run, tmp_path, checkpoints=range(1, step + 1))
    result, _ = _train(_recipe_file(tmp_path, out), resume=True)
    assert result["resumed_from"] == str(out / f"checkpoint-{step}")
    assert _train_loss(result["log_history"]) == _train_loss(reference["log_history"]) != 0.0
    losses = {h["step"]: h["loss"] for h in result["log_history"] if "loss" in h}
    assert losses == {h["step"]: h["loss"] for h in reference["log_history"] if "loss" in h}
    ends = [json.loads(line) for line in (out / "log_history.jsonl").read_text().splitlines()]
    assert [h["train_loss"] for h in ends if "train_loss" in h] == [_train_loss(reference["log_history"])]


def test_a_checkpoint_without_the_kept_sums_falls_back_to_the_logged_losses(finished_run, tmp_path):
    """A checkpoint written before calibrl kept the loss sums: train_loss is rebuilt from the logged losses (each
    times the steps it averages), equal up to rounding, and the resumed run saves its own checkpoints again."""
    _, reference = finished_run
    out = _copy_run(finished_run, tmp_path, checkpoints=(1, 2))
    state_path = out / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    del state["stateful_callbacks"]["CalibrlTrainLoss"]
    state_path.write_text(json.dumps(state))
    result, _ = _train(_recipe_file(tmp_path, out), resume=True)
    assert result["global_step"] == STEPS and (out / f"checkpoint-{STEPS}" / "trainer_state.json").is_file()
    assert _train_loss(result["log_history"]) == pytest.approx(_train_loss(reference["log_history"]), rel=1e-6)


# ------------------------------------------------------------------------------------ one command per run folder

def _hold_lock(folder: Path):
    """Another process holding ``folder``'s lock (what a running ``calibrl train`` into it holds)."""
    import subprocess
    import sys

    code = ("import sys, time\nfrom calibrl._files import folder_lock\nlock = folder_lock(sys.argv[1])\n"
            "lock.__enter__()\nprint('held', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("mode", [[], ["--resume"], ["--overwrite"], ["--rehearse"]])
def test_a_second_command_into_a_folder_in_use_is_refused_in_one_line(finished_run, tmp_path, monkeypatch, mode):
    """Whatever the mode, while another process holds the folder: one line naming it and its holder, exit 2,
    nothing loaded, no file of the folder changed (nor moved aside)."""
    import calibrl.trl.train as training

    out = _copy_run(finished_run, tmp_path, whole=True)
    before = _snapshot(out)
    holder = _hold_lock(out)
    try:
        monkeypatch.setattr(training, "_load_model", lambda *a, **k: pytest.fail("a model was built"))
        extra = ["--output-dir", str(out)] if mode == ["--rehearse"] else []
        result = CliRunner().invoke(app, ["train", str(_recipe_file(tmp_path, out)), *mode, *extra])
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 2, result.output
    line = _one_line(result)
    assert f"{out} is in use by another" in line and f"process {holder.pid}" in line, line
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("run")) == ["run", "run.yaml"]


def test_a_lock_left_by_a_killed_run_is_said_and_taken_over_then_released(tmp_path):
    """A process killed while it held the folder leaves its lock file behind (the kernel drops the lock itself):
    the next run says whose it was, runs, and removes the file when it ends."""
    from calibrl._files import lock_path

    out = tmp_path / "run"
    holder = _hold_lock(out)
    holder.kill()
    holder.wait()
    assert f'"pid": {holder.pid}' in lock_path(out).read_text()
    result, text = _train(_recipe_file(tmp_path, out, max_steps=1, logging_steps=1))
    assert result["global_step"] == 1
    assert f"was locked by process {holder.pid}" in text and "ended without releasing it" in text, text
    assert not lock_path(out).exists()


def test_the_lock_is_reentrant_in_one_process_and_exclusive_between_processes(tmp_path):
    from calibrl._files import FolderInUse, folder_lock, lock_path

    out = tmp_path / "x"
    with folder_lock(out) as stale:
        assert stale is None and lock_path(out).is_file()
        with folder_lock(out):  # a rehearsal's lock covers the train() inside it
            pass
        assert lock_path(out).is_file()  # still held by the outer block
    assert not lock_path(out).exists()
    holder = _hold_lock(out)
    try:
        with pytest.raises(FolderInUse, match=f"process {holder.pid}"):
            with folder_lock(out):
                pass
    finally:
        holder.kill()
        holder.wait()


# --------------------------------------------------------------------------- a checkpoint that resume cannot use

@pytest.mark.parametrize("damage,named", [
    ("no_optimizer", "optimizer.pt is missing"), ("no_scheduler", "scheduler.pt is missing"),
    ("no_rng_state", "rng_state.pth is missing"), ("step_of_another_folder", "says step 1, not the 2"),
    ("log_history_not_a_list", "log_history is not a list")])
def test_resume_skips_a_checkpoint_missing_what_resume_reads_with_the_reason(finished_run, tmp_path, damage,
                                                                              named):
    """What people delete to save space, or a state copied from another checkpoint: skipped, named, and the run
    resumed from the checkpoint before it ends where the uninterrupted run ended."""
    from safetensors.torch import load_file

    from calibrl.trl.checkpoints import checkpoint_problem

    source, _ = finished_run
    out = _copy_run(finished_run, tmp_path, checkpoints=(1, 2))
    folder = out / "checkpoint-2"
    state_path = folder / "trainer_state.json"
    if damage.startswith("no_"):
        (folder / {"no_optimizer": "optimizer.pt", "no_scheduler": "scheduler.pt",
                   "no_rng_state": "rng_state.pth"}[damage]).unlink()
    elif damage == "step_of_another_folder":
        shutil.copy(out / "checkpoint-1" / "trainer_state.json", state_path)
    else:
        state_path.write_text(json.dumps(dict(json.loads(state_path.read_text()), log_history="x")))
    assert named in checkpoint_problem(folder)
    result, text = _train(_recipe_file(tmp_path, out), resume=True)
    assert f"skipping {folder}: " in text and named in text, text
    assert result["resumed_from"] == str(out / "checkpoint-1") and result["global_step"] == STEPS
    final, reference = load_file(str(out / "model.safetensors")), load_file(str(source / "model.safetensors"))
    assert all(torch.equal(final[k], reference[k]) for k in reference)


def test_resume_with_nothing_usable_moves_the_earlier_run_aside(finished_run, tmp_path):
    """Every checkpoint unusable and no final model: the earlier run is moved aside whole, as --overwrite moves
    it, and the run starts from scratch (never written over in place)."""
    out = _copy_run(finished_run, tmp_path, checkpoints=(1, 2))
    for k in (1, 2):
        (out / f"checkpoint-{k}" / "optimizer.pt").unlink()
    (out / "log_history.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    before = _snapshot(out)
    result, text = _train(_recipe_file(tmp_path, out, max_steps=1, logging_steps=1), resume=True)
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert f"nothing in {out} to continue from" in text and f"moved the earlier run to {aside}" in text, text
    assert "checkpoint-2: optimizer.pt is missing" in text, text
    assert _snapshot(aside) == before
    assert result["resumed_from"] is None and result["global_step"] == 1
    assert [json.loads(line)["step"] for line in (out / "log_history.jsonl").read_text().splitlines()] == [1, 1]


def test_overwrite_refusals_come_before_the_old_run_is_moved(finished_run, tmp_path):
    """A dataset smaller than one generation batch is refused before --overwrite moves anything."""
    out = _copy_run(finished_run, tmp_path, whole=True)
    before = _snapshot(out)
    recipe = _recipe_file(tmp_path, out)
    data = yaml.safe_load(recipe.read_text())
    data["dataset"] = {"name": "test/folder_prompts", "limit": 1}
    recipe.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["train", str(recipe), "--overwrite"])
    assert result.exit_code == 2 and "fewer than the 2 distinct prompts" in _one_line(result), result.output
    assert _snapshot(out) == before and not any(p.name.startswith("run.replaced-") for p in tmp_path.iterdir())


# -------------------------------------------------------------------------------- a user's plugin that misbehaves

_BAD_ESTIMATOR = '''
import torch
from calibrl import register_estimator

calls = 0


@register_estimator("test_bad_at_call_2", inputs=(), overwrite=True)
def bad(batch, *, what: str = "nan"):
    global calls
    calls += 1
    advantages = batch.rewards - batch.rewards.mean()
    if calls < 2:
        return advantages
    if what == "raise":
        raise KeyError("no such column")
    advantages[1] = float(what)
    return advantages
'''


@pytest.mark.parametrize("what,said", [("nan", "returned nan for 1 of 8 rows (row 1)"),
                                       ("inf", "returned inf for 1 of 8 rows (row 1)"),
                                       ("raise", "KeyError('no such column')")])
def test_an_estimator_that_goes_wrong_at_step_2_stops_the_run_in_one_line(tmp_path, monkeypatch, what, said):
    """The estimator, the step and what was wrong, in one line (exit 1); checkpoint-1 kept for --resume."""
    (tmp_path / "bad_estimator.py").write_text(_BAD_ESTIMATOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "bad_estimator", raising=False)
    out = tmp_path / "run"
    recipe = _recipe_file(tmp_path, out, advantage_estimator="test_bad_at_call_2", advantage_params={"what": what})
    data = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**data, "plugins": ["bad_estimator"]}))
    result = CliRunner().invoke(app, ["train", str(recipe)])
    assert result.exit_code == 1, result.output
    line = result.output.strip().splitlines()[-1]
    assert "Traceback" not in result.output, result.output
    assert line.startswith("error: advantage estimator 'test_bad_at_call_2' at step 2 (training): "), line
    assert said in line and f"its last checkpoint {out / 'checkpoint-1'} kept" in line, line
    assert (out / "checkpoint-1" / "trainer_state.json").is_file() and not (out / "model.safetensors").exists()


@pytest.mark.parametrize("body,said", [("import sys\nsys.exit(3)\n", "called sys.exit(3) while it was imported"),
                                       ("raise KeyboardInterrupt\n", "was interrupted while it was imported")])
def test_a_plugin_that_exits_at_import_is_one_line(tmp_path, monkeypatch, body, said):
    (tmp_path / "exiting_plugin.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "exiting_plugin", raising=False)
    recipe = _recipe_file(tmp_path, tmp_path / "run")
    data = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**data, "plugins": ["exiting_plugin"]}))
    result = CliRunner().invoke(app, ["train", str(recipe)])
    assert result.exit_code == 2, result.output
    line = _one_line(result)
    assert "plugins: 'exiting_plugin' " + said in line, line
