"""Chunked per-token log-probs and memory-budget batching (calibrl.logprobs, calibrl.trl.forward.completion_logps)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from test_trl import _one_torch_thread  # noqa: F401 (autouse fixture: one torch thread)

from calibrl.logprobs import chunked_token_logps, positions_per_chunk, rows_per_forward

pytestmark = pytest.mark.filterwarnings("ignore")


def test_budget_arithmetic_by_hand():
    mib = 2**20
    # SmolLM2: 100-token rows of 49,152 float32 logits are 19,660,800 bytes; 256 MiB holds 13 of them
    assert rows_per_forward(vocab_size=49_152, seq_len=100, budget_bytes=256 * mib) == 13
    assert rows_per_forward(vocab_size=49_152, seq_len=100, budget_bytes=256 * mib, limit=8) == 8
    # Qwen2.5 and a 4,096-token completion: one row's logits (2.5 GB) exceed any such budget: one row
    assert rows_per_forward(vocab_size=151_936, seq_len=4_112, budget_bytes=256 * mib) == 1
    # three [n, V] float32 copies: 151,936 * 4 * 3 = 1,823,232 bytes per position
    assert positions_per_chunk(vocab_size=151_936, budget_bytes=256 * mib) == 147
    assert positions_per_chunk(vocab_size=151_936, budget_bytes=1) == 1
    assert positions_per_chunk(vocab_size=10, budget_bytes=120, copies=3) == 1
    assert positions_per_chunk(vocab_size=10, budget_bytes=240, copies=3) == 2
    with pytest.raises(ValueError, match="vocab_size"):
        rows_per_forward(vocab_size=0, seq_len=3)
    with pytest.raises(ValueError, match="budget_bytes"):
        positions_per_chunk(vocab_size=3, budget_bytes=-1)


@pytest.mark.parametrize("chunk", [1, 3, 7, 10, 11, 50])  # 10 positions: boundaries inside, at and past the end
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logps_equal_the_full_log_softmax_gather(chunk, temperature):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 6, generator=g)
    weight = torch.randn(40, 6, generator=g) * 3

    def project(h):  # a soft-capped head, as Gemma 2's forward post-processes it
        return 2.0 * torch.tanh(h @ weight.T / 2.0)

    targets = torch.randint(0, 40, (10,), generator=g)
    got = chunked_token_logps(hidden, targets, project=project, temperature=temperature, chunk=chunk)
    full = torch.log_softmax(project(hidden) / temperature, dim=-1).gather(1, targets[:, None]).squeeze(1)
    torch.testing.assert_close(got, full, atol=1e-6, rtol=1e-6)
    assert got.dtype == torch.float32 and bool((got < 0).all())


def test_chunked_logps_project_only_a_chunk_at_a_time():
    seen = []
    hidden, targets = torch.randn(10, 4), torch.zeros(10, dtype=torch.long)
    chunked_token_logps(hidden, targets, project=lambda h: seen.append(h.size(0)) or h @ torch.ones(4, 5),
                        chunk=4)
    assert seen == [4, 4, 2]
    with pytest.raises(ValueError, match="hidden must be"):
        chunked_token_logps(hidden, targets[:3], project=lambda h: h, chunk=1)


# ---------------------------------------------------------------------------------------------------- the trainer


def _tiny_trainer(tmp_path, **kw):
    from datasets import Dataset

    from calibrl.models import build_tiny_model
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

    model, tok = build_tiny_model(seed=0)
    args = CalibratedGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                                max_completion_length=8, max_steps=1, report_to="none", use_cpu=True,
                                save_strategy="no", seed=0, disable_tqdm=True, bf16=False, **kw)
    data = Dataset.from_list([{"prompt": f"{i:02d}+{i % 7}="} for i in range(8)])
    trainer = CalibratedGRPOTrainer(model=model, reward_funcs=lambda prompts, completions, **k: [0.0] * len(prompts),
                                    args=args, train_dataset=data, processing_class=tok)
    return trainer, tok


def _output(tok, n=6):
    """A TRL generation output: left-padded prompts, right-padded completions of different lengths."""
    g = torch.Generator().manual_seed(1)
    vocab = len(tok)
    prompt_ids = torch.randint(3, vocab, (n, 5), generator=g)
    prompt_mask = torch.ones(n, 5, dtype=torch.long)
    prompt_mask[0, :2] = 0
    completion_ids = torch.randint(3, vocab, (n, 7), generator=g)
    completion_mask = torch.ones(n, 7, dtype=torch.long)
    for row, length in enumerate([7, 3, 5, 1, 7, 6][:n]):
        completion_mask[row, length:] = 0
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask}


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_budget_batching_gives_the_numbers_of_one_batch_and_of_trl(tmp_path, temperature):
    from calibrl.trl.forward import completion_logps, forward_inputs

    trainer, tok = _tiny_trainer(tmp_path, temperature=temperature)
    trainer.model.eval()
    output = _output(tok)
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    one_row_per_forward = vocab * 12 * 4  # rows_per_forward == 1 and positions_per_chunk == 4 at this budget
    forwards = []
    handle = trainer.model.register_forward_pre_hook(lambda m, a, k: forwards.append(k["input_ids"].size(0)),
                                                     with_kwargs=True)
    small = completion_logps(trainer._policy_forward(), trainer.model, output, budget_bytes=one_row_per_forward)
    assert forwards == [1] * 6
    forwards.clear()
    whole = completion_logps(trainer._policy_forward(), trainer.model, output)
    assert forwards == [6]
    handle.remove()
    torch.testing.assert_close(small, whole, atol=1e-6, rtol=1e-6)
    # TRL 1.16's own helper (its fused LM head), which calibrl's forwards used before
    input_ids, attention_mask, keep, batch_size, _ = forward_inputs(trainer._policy_forward(), output)
    with torch.no_grad():
        trl_logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, keep,
                                                                     batch_size=batch_size)
    torch.testing.assert_close(whole, trl_logps, atol=1e-5, rtol=1e-5)
    # and an independent full log_softmax of the model's own logits, zero off the completion mask
    with torch.no_grad():
        logits = trainer.model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    full = torch.log_softmax(logits[:, -8:-1] / temperature, -1).gather(-1, output["completion_ids"][..., None])
    full = full.squeeze(-1) * output["completion_mask"]
    torch.testing.assert_close(whole, full, atol=1e-5, rtol=1e-5)
    assert bool((whole[output["completion_mask"] == 0] == 0).all())


def test_rollout_forward_keeps_only_the_decision_rows(tmp_path):
    from calibrl.trl import decision as dec
    from calibrl.trl.forward import rollout_forward

    trainer, tok = _tiny_trainer(tmp_path)
    trainer.model.eval()
    output = _output(tok)
    mask = output["completion_mask"]
    positions = torch.tensor([6, 0, 4, -1, 2, 5])
    fwd = rollout_forward(trainer._policy_forward(), output, mask, want_embeddings=True, want_decision=True,
                          decision_positions=positions)
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], 1)
    att = torch.cat([output["prompt_mask"], mask], 1)
    with torch.no_grad():
        hidden = trainer.model(input_ids=ids, attention_mask=att, output_hidden_states=True).hidden_states[-1]
    assert fwd["decision_hidden"].shape == (6, hidden.size(-1))
    torch.testing.assert_close(fwd["decision_hidden"], hidden[torch.arange(6), 5 + positions.clamp(min=0) - 1])
    m = mask.unsqueeze(-1).float()
    torch.testing.assert_close(fwd["embeddings"], (hidden[:, 5:] * m).sum(1) / m.sum(1), atol=1e-6, rtol=1e-6)
    # the decision logits read from the kept rows are those of the whole hidden state
    lm_head = trainer.model.get_output_embeddings()
    torch.testing.assert_close(
        dec.head_logits(fwd["decision_hidden"], lm_head=lm_head, temperature=1.0),
        dec.decision_logits(hidden, prompt_len=5, positions=positions, lm_head=lm_head, temperature=1.0))


def test_fused_head_tile_arithmetic_and_restore():
    from trl.kernels import chunked_logprob

    from calibrl.logprobs import fused_head_tile, fused_head_tile_tokens

    # 256 MiB over 8 float32 tiles of 32,768 columns: 268,435,456 / 1,048,576 = 256 positions
    assert fused_head_tile_tokens(vocab_chunk=32_768, budget_bytes=256 * 2**20) == 256
    assert fused_head_tile_tokens(vocab_chunk=32_768, budget_bytes=1) == 1
    before = chunked_logprob.TOKEN_CHUNK_SIZE
    with fused_head_tile(torch.device("cpu"), budget_bytes=32_768 * 4 * 8 * 5) as tokens:
        assert tokens == 5 and chunked_logprob.TOKEN_CHUNK_SIZE == 5
    assert chunked_logprob.TOKEN_CHUNK_SIZE == before
    with pytest.raises(RuntimeError), fused_head_tile(torch.device("cpu")):
        raise RuntimeError("restored on errors too")
    assert chunked_logprob.TOKEN_CHUNK_SIZE == before


def test_trl_fused_head_gives_the_same_numbers_with_a_small_tile(tmp_path):
    from calibrl.logprobs import fused_head_tile
    from calibrl.trl.forward import forward_inputs

    trainer, tok = _tiny_trainer(tmp_path)
    output = _output(tok)
    input_ids, attention_mask, keep, _, _ = forward_inputs(trainer._policy_forward(), output)

    def logps_and_grad():
        trainer.model.zero_grad()
        logps, entropy, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, keep,
                                                                       compute_entropy=True)
        (logps.sum() + entropy.sum()).backward()
        grads = [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]
        return logps.detach(), entropy.detach(), grads

    whole = logps_and_grad()
    with fused_head_tile(torch.device("cpu"), budget_bytes=32_768 * 4 * 8 * 5):  # 5 positions per tile
        small = logps_and_grad()
    torch.testing.assert_close(small[0], whole[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(small[1], whole[1], atol=1e-6, rtol=1e-6)
    assert len(small[2]) == len(whole[2]) > 0
    for a, b in zip(small[2], whole[2]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


_HEAP_PROBE = """
import ctypes, sys
from calibrl.logprobs import bound_heap_cache
if sys.argv[1] == "bound":
    assert bound_heap_cache()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
def block():
    p = libc.malloc(4 << 20)
    ctypes.memset(p, 1, 4 << 20)
    return p
libc.free(block())  # glibc raises its mmap threshold past 4 MiB after this free
start = rss()
blocks = [block() for _ in range(64)]  # 64 x 4 MiB, touched
for p in blocks[:-1]:  # the last, still live, keeps the heap from shrinking at its top
    libc.free(p)
print((rss() - start) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_bound_heap_cache_returns_freed_blocks():
    """Freed 4 MiB temporaries stay resident under glibc's adaptive thresholds (~256 MiB here) and go back to the
    system once the thresholds are fixed (each block is then an mmap of its own)."""
    kept = {mode: float(subprocess.run([sys.executable, "-c", _HEAP_PROBE, mode], capture_output=True, text=True,
                                       check=True).stdout.split()[-1]) for mode in ("default", "bound")}
    assert kept["default"] > 128, kept
    assert kept["bound"] < 32, kept
