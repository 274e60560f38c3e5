"""Peak memory of calibrl's trainer step and held-out callback against TRL's stock GRPO step, and of the real-model
demo and training recipe.

    python bench/memory.py                  # step + callback on a tiny model with Qwen2.5's vocabulary (minutes)
    python bench/memory.py --before         # the same, calibrl's forwards through TRL's helper (the code before)
    python bench/memory.py --demo --train   # also `calibrl demo --model builtin:smollm2-135m-instruct --quick` and
                                            # `calibrl train smollm2_cpu_capo --max-steps 2` (several minutes each)

The step figures: a random Qwen2 model (vocabulary 151,936, hidden size 64, 2 layers; float32) and ONE batch of
PROMPTS prompts x GENERATIONS completions of COMPLETION tokens each (fixed random token ids, no end of sequence:
TRL's ``_generate_single_turn`` is replaced by this batch in both trainers, so both train on the same tokens). Each
measurement runs in a child process that samples its own resident memory (RSS) every 5 ms, each sample charged to
the phase running (calibrl's extra forwards, the loss's forward, backward + optimizer, the callback). Figures are
peaks above the child's RSS once model and batch are built, before the trainer is: the weights are not counted,
calibrl's reference copy of the model (CAPO's mask) is.

* ``TRL stock step``: ``trl.GRPOTrainer``, one optimizer step.
* ``calibrl step``: ``CalibratedGRPOTrainer`` with everything that runs a forward of its own: ``capo`` with the
  frozen reference-perplexity mask (a no-grad forward of the reference), decision classes with the decision-token
  loss (the decision rows of the loss pass, and a no-grad forward of the policy for the decision telemetry, which
  also gives the log-probs the estimator reads, as nothing was recorded during generation).
* ``calibrl callback``: :func:`calibrl.trl.callbacks.sample_completions` (the held-out calibration callback's
  sampling and log-prob reading), CALLBACK_PROMPTS prompts x CALLBACK_K samples of up to COMPLETION new tokens.

The figure of merit: calibrl's extra memory (its step's peak minus TRL's; the callback's peak) as a ratio to TRL's
step peak. ``--before`` runs calibrl's no-grad forwards through TRL 1.16's ``_get_per_token_logps_and_entropies``
as the code did before :func:`calibrl.trl.forward.completion_logps` (the fused head's tile is still calibrl's
on the CPU: :func:`calibrl.logprobs.fused_head_tile`).
The real-model figures are the peak RSS of the whole process tree of the CLI command (bench/test_memory.py's
sampler), one torch thread.

``--device cuda`` measures the same three on a GPU: each phase's peak of ``torch.cuda.max_memory_allocated`` (the
counter is reset as a phase begins) above the allocation once model and batch are on the device, TRL's fused LM
head in its own tiles with its Triton fold (calibrl shrinks the tile only where Triton is missing).
``--dtype bfloat16`` loads the model in bf16 (TRL's ``cast_lm_head_to_fp32`` left at its default).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

VOCAB = 151_936  # Qwen2.5's vocabulary
PROMPT = 16
COMPLETION = 4_096
PROMPTS, GENERATIONS = 1, 2
CALLBACK_PROMPTS, CALLBACK_K = 1, 2
CLASSES = ["A", "B", "C", "D"]
DEVICE = "cpu"  # --device
DTYPE = "float32"  # --dtype
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------------------------------- sampling


class PhaseSampler:
    """Samples this process's RSS every 5 ms in a thread; ``peaks[phase]`` is the largest RSS seen while ``phase``
    was the current one (:meth:`enter`)."""

    def __init__(self):
        self.phase = "setup"
        self.peaks: dict[str, int] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm", encoding="utf-8") as f:
            return int(f.read().split()[1]) * PAGE_BYTES

    def _record(self) -> None:
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), self.rss())

    def _loop(self) -> None:
        while not self._stop:
            self._record()
            time.sleep(0.005)

    def enter(self, phase: str) -> None:
        self._record()
        self.phase = phase
        self._record()

    def wrap(self, owner, name: str, phase: str, after: str) -> None:
        """Charge the calls of ``owner.name`` to ``phase``, what follows them to ``after``."""
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            self.enter(phase)
            try:
                return original(*args, **kwargs)
            finally:
                self.enter(after)

        setattr(owner, name, wrapped)


class CudaPhaseSampler(PhaseSampler):
    """:class:`PhaseSampler` for GPU memory: ``peaks[phase]`` is the largest ``torch.cuda.max_memory_allocated``
    while ``phase`` ran (the peak counter is reset when a phase begins); no sampling thread is needed."""

    def __init__(self):
        self.phase = "setup"
        self.peaks = {}

    @staticmethod
    def rss() -> int:  # the allocation now (the base of the figures)
        import torch

        return torch.cuda.memory_allocated()

    def _record(self) -> None:
        import torch

        torch.cuda.synchronize()
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), torch.cuda.max_memory_allocated())

    def enter(self, phase: str) -> None:
        import torch

        self._record()
        self.phase = phase
        torch.cuda.reset_peak_memory_stats()
        self._record()


def _sampler() -> PhaseSampler:
    return CudaPhaseSampler() if DEVICE == "cuda" else PhaseSampler()


# ---------------------------------------------------------------------------------------------------- the setup


def _tokenizer():
    """A word-level tokenizer with VOCAB tokens (specials, the class letters, then fillers)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + CLASSES)}
    for i in range(len(vocab), VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", padding_side="left")


def _model():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * COMPLETION,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = Qwen2ForCausalLM(config).to(device=DEVICE, dtype=getattr(torch, DTYPE))
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 2
    return model


def _prompts() -> list[dict]:
    return [{"prompt": " ".join(f"w{100 + 7 * i + j}" for j in range(PROMPT)), "prompt_id": f"p{i}"}
            for i in range(PROMPTS)]


def _fixed_completions():
    """[PROMPTS * GENERATIONS] completions of COMPLETION random token ids (no special token, some class letters)."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(len(CLASSES) + 4, VOCAB, (PROMPTS * GENERATIONS, COMPLETION), generator=g)
    ids[:, COMPLETION // 2] = torch.arange(PROMPTS * GENERATIONS) % len(CLASSES) + 4  # a decision letter mid-way
    return ids.tolist()


def reward(prompts, completions, **kwargs):
    """1 for every other completion: mixed groups, so every estimator has something to do."""
    return [float(i % 2) for i in range(len(completions))]


def _args(cls, out: str, **extra):
    return cls(output_dir=out, per_device_train_batch_size=PROMPTS * GENERATIONS, num_generations=GENERATIONS,
               max_completion_length=COMPLETION, max_steps=1, logging_steps=1, report_to="none",
               use_cpu=DEVICE == "cpu", save_strategy="no", seed=0, disable_tqdm=True, bf16=DTYPE == "bfloat16",
               beta=0.0, **extra)


def _dataset():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": p["prompt"]} for p in _prompts()])


def _serve_fixed_batch(trainer_cls) -> None:
    completions = _fixed_completions()

    def generate(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return [list(c) for c in completions[: len(prompt_ids)]], None

    trainer_cls._generate_single_turn = generate


# ---------------------------------------------------------------------------------------------------- children


def child_step(kind: str, before: bool) -> dict:
    import torch
    import trl

    torch.set_num_threads(1)
    sampler = _sampler()
    model, tok = _model(), _tokenizer()
    with tempfile.TemporaryDirectory() as out:
        if kind == "trl":
            _serve_fixed_batch(trl.GRPOTrainer)
            cls, args = trl.GRPOTrainer, _args(trl.GRPOConfig, out)
        else:
            from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer
            from calibrl.trl import forward, rollout

            _serve_fixed_batch(CalibratedGRPOTrainer)
            if before:  # calibrl's forwards through TRL's helper, as before completion_logps
                forward.completion_logps = lambda *a, **k: None
            sampler.wrap(rollout, "collect_rollout", "calibrl forwards", "generation + scoring")
            import calibrl.trl.trainer as trainer_module

            trainer_module.collect_rollout = rollout.collect_rollout
            cls = CalibratedGRPOTrainer
            args = _args(CalibratedGRPOConfig, out, advantage_estimator="capo", capo_mask="quantile",
                         decision_classes=CLASSES, decision_loss_coef=1.0)
        sampler.wrap(trl.GRPOTrainer, "_compute_loss", "loss forward", "backward + optimizer")
        sampler.enter("trainer init")
        base = sampler.rss()
        trainer = cls(model=model, reward_funcs=reward, args=args, train_dataset=_dataset(), processing_class=tok)
        sampler.enter("generation + scoring")
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        sampler.enter("done")
    return {"base": base, "peaks": sampler.peaks, "seconds": seconds}


def child_callback() -> dict:
    import torch

    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer
    from calibrl.trl.callbacks import CalibrationEvalConfig, sample_completions

    torch.set_num_threads(1)
    sampler = _sampler()
    model, tok = _model(), _tokenizer()
    with tempfile.TemporaryDirectory() as out:
        trainer = CalibratedGRPOTrainer(model=model, reward_funcs=reward, args=_args(CalibratedGRPOConfig, out),
                                        train_dataset=_dataset(), processing_class=tok)
        problems = _prompts()[:CALLBACK_PROMPTS]
        config = CalibrationEvalConfig(prompts=CALLBACK_PROMPTS, k=CALLBACK_K, batch_size=CALLBACK_PROMPTS,
                                       max_new_tokens=COMPLETION)
        sampler.enter("before callback")
        base = sampler.rss()
        sampler.enter("callback")
        start = time.perf_counter()
        rows = sample_completions(trainer, problems, config=config)
        seconds = time.perf_counter() - start
        sampler.enter("done")
    return {"base": base, "peaks": sampler.peaks, "seconds": seconds,
            "tokens": sum(r["n_tokens"] for r in rows), "rows": len(rows)}


def _run_child(name: str, *extra: str) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--tokens", str(COMPLETION), "--device", DEVICE, "--dtype",
           DTYPE, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"child {name} failed with status {done.returncode}")
    return json.loads(lines[-1][len("RESULT "):])


def _command_peak(cmd: list[str]) -> tuple[int, float, int]:
    """(peak RSS of the process tree, seconds, exit status) of a command (bench/test_memory.py's sampler)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_memory import tree_rss_bytes

    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_bytes(proc.pid))
        time.sleep(0.02)
    return peak, time.perf_counter() - start, proc.returncode


# ---------------------------------------------------------------------------------------------------- report


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _above(result: dict, phases: list[str] | None = None) -> int:
    peaks = result["peaks"]
    keys = phases or list(peaks)
    return max(peaks.get(k, 0) for k in keys) - result["base"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--before", action="store_true", help="calibrl's forwards through TRL's helper")
    parser.add_argument("--demo", action="store_true", help="also the real-model demo --quick")
    parser.add_argument("--train", action="store_true", help="also calibrl train smollm2_cpu_capo --max-steps 2")
    parser.add_argument("--skip-step", action="store_true", help="leave out the step and callback figures")
    parser.add_argument("--tokens", type=int, default=COMPLETION, help="completion length (default 4096)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: GPU memory (torch.cuda.max_memory_allocated) instead of RSS")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the model's dtype")
    parser.add_argument("--skip-callback", action="store_true",
                        help="leave out the callback (it samples every token one by one: slow at long lengths)")
    args = parser.parse_args(argv)
    globals().update(COMPLETION=args.tokens, DEVICE=args.device, DTYPE=args.dtype)
    if args.child:
        result = child_callback() if args.child == "callback" else child_step(args.child, args.before)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    if not args.skip_step:
        what = "peak GPU allocation" if DEVICE == "cuda" else "peak RSS"
        print(f"tiny Qwen2 (vocabulary {VOCAB:,}, hidden 64, 2 layers, {DTYPE}, {DEVICE}); batch {PROMPTS} prompts "
              f"x {GENERATIONS} completions x {COMPLETION:,} tokens; {what} above the model and batch"
              + (" [--before: calibrl's forwards through TRL's helper]" if args.before else ""))
        trl_step = _run_child("trl")
        ours = _run_child("calibrl", *(["--before"] if args.before else []))
        callback = None if args.skip_callback else _run_child("callback")
        trl_peak = _above(trl_step)
        print(f"  TRL stock GRPO step                 {_gb(trl_peak):>9}  ({trl_step['seconds']:.0f} s)")
        for phase in ("loss forward", "backward + optimizer"):
            print(f"    {phase:33s} {_gb(_above(trl_step, [phase])):>9}")
        our_peak = _above(ours)
        print(f"  calibrl step (capo + mask + decision) {_gb(our_peak):>9}  ({ours['seconds']:.0f} s)")
        for phase in ("calibrl forwards", "loss forward", "backward + optimizer"):
            print(f"    {phase:33s} {_gb(_above(ours, [phase])):>9}")
        cb_peak = None if callback is None else _above(callback, ["callback"])
        if callback is not None:
            print(f"  calibrl callback ({callback['rows']} samples, {callback['tokens']:,} tokens) {_gb(cb_peak):>9}"
                  f"  ({callback['seconds']:.0f} s)")
        print(f"  calibrl's extra memory / TRL's step: step {(our_peak - trl_peak) / trl_peak:+.2f}, "
              f"its own forwards {_above(ours, ['calibrl forwards']) / trl_peak:.2f}"
              + ("" if cb_peak is None else f", callback {cb_peak / trl_peak:.2f}"))
    with tempfile.TemporaryDirectory() as tmp:
        if args.demo:
            peak, seconds, status = _command_peak(
                [sys.executable, "-m", "calibrl", "demo", "--model", "builtin:smollm2-135m-instruct", "--quick",
                 "--out", str(Path(tmp) / "demo")])
            print(f"calibrl demo --model builtin:smollm2-135m-instruct --quick: peak {_gb(peak)}, {seconds:.0f} s, "
                  f"exit status {status}")
        if args.train:
            peak, seconds, status = _command_peak(
                [sys.executable, "-m", "calibrl", "train", "smollm2_cpu_capo", "--max-steps", "2", "--output-dir",
                 str(Path(tmp) / "train")])
            print(f"calibrl train smollm2_cpu_capo --max-steps 2: peak {_gb(peak)}, {seconds:.0f} s, "
                  f"exit status {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
