"""Launched by tests/test_resume.py: ``python trl_resume.py RECIPE.yaml [--resume]``.

Registers a tiny local dataset and reward, then runs ``calibrl.trl.train.train`` on the recipe (the code path of
``calibrl train``). With CALIBRL_TEST_STEP_SLEEP set, sleeps that many seconds after every optimizer step so the
test can SIGKILL the run between checkpoints. Writes OUT/result-<tag>.json with the final global step and the
global steps this process trained."""

import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

torch.set_num_threads(1)

from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from calibrl.tasks.registry import register_dataset, register_reward  # noqa: E402
from calibrl.trl.train import load_recipe, train  # noqa: E402


@register_dataset("test/resume_tiny", overwrite=True)
def _dataset(split: str = "train", limit=None, **_):
    return Dataset.from_list([{"prompt": f"{i:02d}+{i % 7}="} for i in range(64)])


@register_reward("test/parity", overwrite=True)
def parity(prompts, completions, **kwargs):
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


class StepRecorder(TrainerCallback):
    """Records the global step after every optimizer step this process runs; optionally sleeps there."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)
        if self.seconds:
            time.sleep(self.seconds)


def main() -> None:
    recipe = load_recipe(sys.argv[1])
    resume = "--resume" in sys.argv
    sleep = float(os.environ.get("CALIBRL_TEST_STEP_SLEEP", "0"))
    recorder = StepRecorder(sleep)
    result = train(recipe, resume=resume, progress=False, callbacks=[recorder])
    tag = os.environ.get("CALIBRL_TEST_TAG", "run")
    steps = recorder.steps
    with open(os.path.join(recipe.trainer["output_dir"], f"result-{tag}.json"), "w") as f:
        json.dump({"global_step": result["global_step"], "resumed_from": result["resumed_from"], "trained_steps": steps}, f)


if __name__ == "__main__":
    main()
