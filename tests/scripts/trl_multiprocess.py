"""Launched by tests/test_multiprocess.py with ``torchrun --nproc_per_node 2``: one CalibratedGRPOTrainer step on
CPU (gloo) where a group of completions is split across the two processes. Each rank saves what its advantage
step saw and produced to OUT/rank{r}.pt; the test checks it against a single-process computation.

``python trl_multiprocess.py OUT [drop_rank1]``: with ``drop_rank1``, rank 1 throws away the log-probs it recorded
during generation, so only that rank cannot use them (as when its padding made them too short)."""

import os
import sys
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

torch.set_num_threads(1)

from datasets import Dataset  # noqa: E402

from calibrl.models import build_tiny_model  # noqa: E402
from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer  # noqa: E402
from calibrl.trl.train import end_process_group  # noqa: E402


def parity_reward(prompts, completions, **kwargs):
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


class Dump(CalibratedGRPOTrainer):
    drop_on_rank1 = False
    n_forward = 0

    def _generate_single_turn(self, *args, **kwargs):
        out = super()._generate_single_turn(*args, **kwargs)
        if self.drop_on_rank1 and self.accelerator.process_index == 1:
            self._calibrl_gen_logps = None
        return out

    def _rollout_forward(self, *args, **kwargs):
        self.n_forward += 1
        return super()._rollout_forward(*args, **kwargs)

    def _calibrl_replace_advantages(self, output):
        out = super()._calibrl_replace_advantages(output)
        rollout = self.last_rollout
        self.dump = {
            "rank": self.accelerator.process_index,
            "world": self.accelerator.num_processes,
            "prompt_ids": output["prompt_ids"].cpu(),
            "prompt_mask": output["prompt_mask"].cpu(),
            "completion_ids": output["completion_ids"].cpu(),
            "completion_mask": output["completion_mask"].cpu(),
            "completions": list(self._calibrl_completions),
            "local_advantages": out["advantages"].cpu(),
            "full_advantages": rollout["advantages"].cpu(),
            "rewards": rollout["batch"].rewards.cpu(),
            "group_ids": rollout["batch"].group_ids.cpu(),
            "logprob_mean": rollout["batch"].logprob_mean.cpu(),
            "ref_logprob_mean": rollout["batch"].ref_logprob_mean.cpu(),
            "params": self.args.estimator_params(),
            "metrics": rollout["metrics"],
            "n_forward": self.n_forward,
        }
        return out


def main(out_dir: str, mode: str = "") -> None:
    model, tok = build_tiny_model(seed=0)
    ds = Dataset.from_list([{"prompt": f"{i:02d}+{i % 7}="} for i in range(48)])
    args = CalibratedGRPOConfig(
        output_dir=os.path.join(out_dir, "run"), per_device_train_batch_size=6, num_generations=4,
        max_completion_length=8, max_steps=1, logging_steps=1, report_to="none", use_cpu=True, ddp_backend="gloo", bf16=False,
        save_strategy="no", seed=0, disable_tqdm=True, learning_rate=1e-3,
        advantage_estimator="capo", capo_mask="quantile",
    )
    trainer = Dump(model=model, reward_funcs=parity_reward, args=args, train_dataset=ds, processing_class=tok)
    trainer.drop_on_rank1 = mode == "drop_rank1"
    trainer.train()
    torch.save(trainer.dump, os.path.join(out_dir, f"rank{trainer.accelerator.process_index}.pt"))
    end_process_group()  # as `calibrl train` ends: without it gloo can abort a rank at exit


if __name__ == "__main__":
    main(*sys.argv[1:3])
