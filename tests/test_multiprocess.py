"""Two CPU processes (torchrun, gloo): a group split across ranks gets the same advantages as in one process.

The launched script (tests/scripts/trl_multiprocess.py) runs one CalibratedGRPOTrainer step with CAPO and the
quantile reference mask: 2 ranks x 6 completions, groups of 4, so the middle group has 2 completions on each rank.
Here, in one process, we recompute every input from scratch (rewards from the decoded completions, mean token
log-probs with a plain forward of the same initial model) and compute CAPO on the whole batch. With
``drop_rank1`` only rank 1's log-probs recorded during generation are unusable: both ranks must then run the
forward (one decision for all ranks; a forward on one rank only would hang FSDP / ZeRO-3).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from calibrl import RolloutBatch, compute_advantages

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "trl_multiprocess.py"


def _torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    if exe.exists():
        return [str(exe)]
    if shutil.which("torchrun"):
        return ["torchrun"]
    return [sys.executable, "-m", "torch.distributed.run"]


def _lpm(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    with torch.no_grad():
        ids = torch.cat([prompt_ids, completion_ids], 1)
        att = torch.cat([prompt_mask, completion_mask], 1)
        logits = model(input_ids=ids, attention_mask=att).logits.float()
        p, c = prompt_ids.size(1), completion_ids.size(1)
        logp = torch.log_softmax(logits[:, p - 1 : p + c - 1], -1)
        tok = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        m = completion_mask.float()
        return (tok * m).sum(1) / m.sum(1).clamp(min=1)


@pytest.mark.parametrize("mode", ["recorded", "drop_rank1"])
def test_two_processes_match_one_process(tmp_path, mode):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [*_torchrun(), "--standalone", "--nproc_per_node", "2", str(SCRIPT), str(tmp_path), mode]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dumps = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [d["world"] for d in dumps] == [2, 2]  # really two processes (not a silent single-process run)
    # recorded log-probs on both ranks: no forward; unusable on one rank: the forward on both
    assert [d["n_forward"] for d in dumps] == ([0, 0] if mode == "recorded" else [1, 1])

    # Every rank computed on the same gathered batch, and the local slices tile it in rank order.
    for key in ("rewards", "group_ids", "logprob_mean", "ref_logprob_mean", "full_advantages"):
        torch.testing.assert_close(dumps[0][key], dumps[1][key])
    full = dumps[0]["full_advantages"]
    torch.testing.assert_close(torch.cat([d["local_advantages"] for d in dumps]), full)
    n_local = len(dumps[0]["local_advantages"])
    assert n_local == 6 and dumps[0]["group_ids"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]

    # One process, independent inputs: rewards from the decoded completions, log-probs from a plain forward
    # of the initial model (= policy and reference at step 1).
    from calibrl.models import build_tiny_model

    def parity_reward(prompts, completions, **kwargs):  # the script's reward
        return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]

    model, _ = build_tiny_model(seed=0)
    model.eval()
    rewards = torch.tensor([r for d in dumps for r in parity_reward(None, d["completions"])])
    lpm = torch.cat([
        _lpm(model, d["prompt_ids"], d["prompt_mask"], d["completion_ids"], d["completion_mask"]) for d in dumps
    ])
    torch.testing.assert_close(dumps[0]["rewards"], rewards)
    torch.testing.assert_close(dumps[0]["logprob_mean"], lpm, atol=1e-5, rtol=1e-5)
    batch = RolloutBatch(rewards=rewards, group_ids=torch.arange(12) // 4, logprob_mean=lpm, ref_logprob_mean=lpm)
    single = compute_advantages(batch, "capo", **dumps[0]["params"])
    torch.testing.assert_close(full, single, atol=1e-5, rtol=1e-5)

    # the split group (ids 4..7: two samples on each rank) has mixed outcomes in this seed, so the check bites
    split = rewards[4:8]
    assert 0 < split.sum() < 4, "seed no longer gives a mixed split group; change the seed"
    assert full[4:8].abs().sum() > 0
