"""float32 against bfloat16 on the CPU, side by side, on the real built-in model (SmolLM2-135M-Instruct).

Prints three comparisons, each measured within this one run (the machine is shared: read the ratios):

* generation: ``calibrl generate`` on ``arithmetic``, PROMPTS x SAMPLES completions of up to TOKENS new tokens
  (transformers backend, T = 1), with the model loaded in float32 and in bfloat16; REPEATS rounds in the order
  fp32, bf16, bf16, fp32, ... so a drift in the machine's load hits both alike; samples/s of each round;
* one LoRA training step: ``CalibratedGRPOTrainer`` (CAPO, LoRA r 16 on the attention projections, no gradient
  checkpointing, as ``calibrl demo --model``) on ``multiple_choice``, STEP_PROMPTS x GENERATIONS completions of up
  to STEP_TOKENS tokens, STEPS steps, seconds per step, in three set-ups: float32; bfloat16 weights
  (``model_init_kwargs: {dtype: bfloat16}``, i.e. a recipe's ``model.dtype: bfloat16``; peft keeps the adapters
  and so AdamW's state in float32); float32 weights under bfloat16 autocast (``bf16: true``, accelerate's CPU
  autocast);
* the log-prob error: LP_PROMPTS x LP_SAMPLES completions sampled from the float32 model on ``multiple_choice``
  (the demo's task) and on ``arithmetic`` (longer completions), then every completion's tokens scored by a
  teacher-forced forward of the float32 and of the bfloat16 model (``log_softmax`` in float32 of the logits, the
  way ``calibrl generate`` records them): per-token and per-sequence (``logprob_mean``) differences, the AUROC and
  ECE of confidence = exp(logprob_mean) under each, and the bound on the AUROC change: only a (right, wrong) pair
  whose float32 confidences are closer than twice the largest shift can change order, so
  |AUROC_bf16 - AUROC_fp32| <= the fraction of such pairs.

* ``--profile``: where generation's time goes, fp32 and bf16 (one profiled ``calibrl generate`` round each, after a
  warm-up round): torch's self CPU time of the matrix products (``aten::mm``, ``addmm``, ``bmm``, the attention
  kernel) against every other op, and the wall time no op accounts for (Python, the generation loop). bf16 can
  only speed up the matrix products, so ``fp32 wall / (fp32 wall - fp32 matrix time)`` bounds its speed-up
  whatever its matrix products cost (Amdahl's law).

Usage: ``python bench/bf16.py [--threads 1] [--skip generation step logprob] [--profile]``; about 5 minutes on 2
busy cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

BUILTIN = "builtin:smollm2-135m-instruct"


def cpu_line() -> str:
    import torch

    from calibrl.models import cpu_bf16_supported

    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        flags = set()
    named = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return (f"CPU: native bf16 {cpu_bf16_supported()} (flags: {', '.join(named) or 'none'}; torch capability "
            f"{torch.backends.cpu.get_cpu_capability()}); torch {torch.__version__}, {torch.get_num_threads()} "
            "thread(s)")


def load(path: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    return model, tokenizer


# --------------------------------------------------------------------------------------------------- generation


def measure_generation(models: dict, root: Path, *, prompts: int, samples: int, tokens: int, repeats: int) -> dict:
    """dtype -> samples/s of each round (``calibrl generate``, model loading excluded)."""
    from calibrl.evaluation.generate import generate

    order = [d for r in range(repeats) for d in (("float32", "bfloat16") if r % 2 == 0 else ("bfloat16", "float32"))]
    rates: dict[str, list[float]] = {d: [] for d in models}
    for k, dtype in enumerate(order):
        model, tokenizer = models[dtype]
        summary = generate(model=BUILTIN, dataset="arithmetic", out=root / f"gen{k}.jsonl", n=samples,
                           limit=prompts, batch_size=prompts, max_new_tokens=tokens, temperature=1.0,
                           progress=False, overwrite=True, dtype=dtype, hf_model=model, hf_tokenizer=tokenizer)
        rates[dtype].append(summary["samples_per_s"])
        print(f"  round {k + 1}/{len(order)} {dtype}: {summary['samples_written']} samples in "
              f"{summary['seconds']:.1f} s, {summary['samples_per_s']:.2f} samples/s", flush=True)
    return rates


MATRIX_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_attention_math", "aten::_weight_int8pack_mm")


def profile_generation(models: dict, root: Path, *, prompts: int, samples: int, tokens: int) -> dict:
    """dtype -> {"wall", "matrix", "other_ops"} seconds of one profiled generation round (after one unprofiled
    round), from torch.profiler's self CPU times."""
    from torch.profiler import ProfilerActivity, profile

    from calibrl.evaluation.generate import generate

    out = {}
    for k, dtype in enumerate(("float32", "bfloat16")):
        model, tokenizer = models[dtype]
        options = dict(model=BUILTIN, dataset="arithmetic", n=samples, limit=prompts, batch_size=prompts,
                       max_new_tokens=tokens, temperature=1.0, progress=False, overwrite=True, dtype=dtype,
                       hf_model=model, hf_tokenizer=tokenizer)
        generate(out=root / f"warm{k}.jsonl", **options)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            generate(out=root / f"prof{k}.jsonl", **options)
            wall = time.perf_counter() - start
        events = prof.key_averages()
        matrix = sum(e.self_cpu_time_total for e in events if e.key in MATRIX_OPS) / 1e6
        every = sum(e.self_cpu_time_total for e in events) / 1e6
        out[dtype] = {"wall": wall, "matrix": matrix, "other_ops": every - matrix,
                      "top": sorted(((e.self_cpu_time_total / 1e6, e.key) for e in events), reverse=True)[:6]}
    return out


# --------------------------------------------------------------------------------------------------- LoRA step


def measure_steps(path: str, root: Path, *, setup: str, prompts: int, generations: int, tokens: int,
                  steps: int) -> list[float]:
    """Seconds of each of ``steps`` training steps in set-up ``setup`` (float32 | bf16-weights | fp32-autocast)."""
    from peft import LoraConfig
    from transformers import TrainerCallback

    from calibrl.tasks.registry import get_dataset_loader, get_reward
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

    seconds: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds.append(time.perf_counter() - self.start)

    dtype = "bfloat16" if setup == "bf16-weights" else "float32"
    args = CalibratedGRPOConfig(
        output_dir=str(root / f"train-{setup}"), per_device_train_batch_size=prompts * generations,
        num_generations=generations, max_completion_length=tokens, max_steps=steps, learning_rate=3e-4,
        lr_scheduler_type="constant", beta=0.0, temperature=1.0, advantage_estimator="capo", capo_tau=0.6,
        correctness_reward="decision", logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", seed=0,
        disable_tqdm=True, bf16=setup == "fp32-autocast", gradient_checkpointing=False,
        model_init_kwargs={"dtype": dtype})
    dataset = get_dataset_loader("multiple_choice")("train", size=64, seed=0, levels=(1, 2), template="chat-direct")
    trainer = CalibratedGRPOTrainer(
        model=path, reward_funcs=get_reward("decision"), args=args, train_dataset=dataset, callbacks=[Clock()],
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                               task_type="CAUSAL_LM"))
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    return seconds


# --------------------------------------------------------------------------------------------------- log-probs


def sample_completions(model, tokenizer, *, dataset: str, prompts: int, samples: int, tokens: int, **options):
    """[(prompt ids, completion ids, recorded log-probs, correct)] of ``prompts`` x ``samples`` completions that
    ``calibrl generate``'s transformers backend samples from ``model`` (T = 1), graded by the dataset's reward."""
    from calibrl.evaluation.backends import render_prompts, open_backend
    from calibrl.evaluation.generate import GenerateConfig, load_problems, problem_rows

    config = GenerateConfig(model=BUILTIN, dataset=dataset, out="unused.jsonl", n=samples, limit=prompts,
                            max_new_tokens=tokens, progress=False, **options)
    problems, _, reward_fn, correctness_fn = load_problems(config)
    backend, variants = open_backend(config, model=model, tokenizer=tokenizer,
                                     classes=list(problems[0]["classes"]) if "classes" in problems[0] else None)
    groups = backend.generate([p["prompt"] for p in problems], samples, 0)
    out = []
    for problem, group in zip(problems, groups):
        texts = [backend.decode(s.ids) for s in group]
        rows = problem_rows(problem, group, texts, reward_fn, dataset=dataset, variants=variants,
                             correctness_fn=correctness_fn)
        rendered = render_prompts(tokenizer, [problem["prompt"]])
        prompt_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"][0]
        out += [(prompt_ids, s.ids, s.logps, row["correct"]) for s, row in zip(group, rows) if s.ids]
    return out


def teacher_forced_logps(model, prompt_ids: list[int], completions: list[list[int]]):
    """Per-token log-probs [n, max completion length] (NaN past each end) of ``completions`` after ``prompt_ids``.

    One forward of the prompt followed by each completion, right-padded (a causal model's positions before the
    padding do not see it); ``log_softmax`` in float32 of the model's logits, whatever the model's dtype.
    """
    import torch

    width = max(len(c) for c in completions)
    pad = 0
    ids = torch.tensor([prompt_ids + c + [pad] * (width - len(c)) for c in completions])  # [n, P + width]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, len(prompt_ids) - 1: -1]  # [n, width, V]: predicts the completion
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, len(prompt_ids):, None]).squeeze(-1)
    lengths = torch.tensor([len(c) for c in completions])
    return logp.masked_fill(torch.arange(width)[None, :] >= lengths[:, None], float("nan"))  # [n, width]


def auroc_change_bound(confidence, correct, *, shift: float) -> float:
    """Largest |AUROC change| when every confidence moves by at most ``shift``.

    AUROC = P(c_right > c_wrong) over (right, wrong) pairs (ties 1/2); a pair can change order only when its two
    confidences are within 2 * shift of each other, so the change is at most the fraction of such pairs.
    confidence [n] float, correct [n] bool -> float in [0, 1] (nan without both classes).
    """
    import numpy as np

    c = np.asarray(confidence, dtype=np.float64)
    y = np.asarray(correct, dtype=bool)
    right, wrong = c[y], c[~y]
    if not len(right) or not len(wrong):
        return float("nan")
    return float((np.abs(right[:, None] - wrong[None, :]) <= 2 * shift).mean())


def measure_logprobs(models: dict, *, dataset: str, prompts: int, samples: int, tokens: int, **options) -> dict:
    import numpy as np
    import torch

    from calibrl.metrics.calibration import auroc, ece

    fp32, tokenizer = models["float32"]
    torch.manual_seed(0)
    drawn = sample_completions(fp32, tokenizer, dataset=dataset, prompts=prompts, samples=samples, tokens=tokens,
                               **options)
    by_prompt: dict[tuple, list] = {}
    for prompt_ids, ids, logps, correct in drawn:
        by_prompt.setdefault(tuple(prompt_ids), []).append((ids, logps, correct))
    token = {"float32": [], "bfloat16": []}
    means = {"float32": [], "bfloat16": []}
    recorded, labels = [], []
    for prompt_ids, group in by_prompt.items():
        for dtype in token:
            lp = teacher_forced_logps(models[dtype][0], list(prompt_ids), [g[0] for g in group]).numpy()
            for row, (ids, _, _) in zip(lp, group):
                token[dtype].append(row[: len(ids)])
                means[dtype].append(float(np.mean(row[: len(ids)])))
        recorded += [float(np.mean(g[1])) for g in group]
        labels += [bool(g[2]) for g in group]
    tok_diff = np.abs(np.concatenate(token["bfloat16"]) - np.concatenate(token["float32"]))
    m32, m16 = np.asarray(means["float32"]), np.asarray(means["bfloat16"])
    seq_diff = np.abs(m16 - m32)
    c32, c16 = np.exp(m32), np.exp(m16)
    y = np.asarray(labels)
    both = 0 < y.sum() < len(y)
    return {
        "sequences": len(m32), "tokens": int(tok_diff.size), "accuracy": float(y.mean()),
        "recorded_vs_forward_fp32": float(np.max(np.abs(np.asarray(recorded) - m32))),
        "token_max": float(tok_diff.max()), "token_mean": float(tok_diff.mean()),
        "token_p99": float(np.quantile(tok_diff, 0.99)),
        "seq_max": float(seq_diff.max()), "seq_mean": float(seq_diff.mean()),
        "confidence_max": float(np.max(np.abs(c16 - c32))),
        "auroc": (auroc(c32, y), auroc(c16, y)) if both else (float("nan"),) * 2,
        "ece": (ece(c32, y), ece(c16, y)),
        "auroc_bound": auroc_change_bound(c32, y, shift=float(np.max(np.abs(c16 - c32)))),
    }


# --------------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="generation rounds per dtype")
    parser.add_argument("--step-prompts", type=int, default=2)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--step-tokens", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--lp-prompts", type=int, default=16)
    parser.add_argument("--lp-samples", type=int, default=4)
    parser.add_argument("--setups", nargs="*", default=["float32", "bf16-weights", "fp32-autocast"],
                        choices=["float32", "bf16-weights", "fp32-autocast"])
    parser.add_argument("--skip", nargs="*", default=[], choices=["generation", "step", "logprob"])
    parser.add_argument("--profile", action="store_true", help="also: where generation's time goes (torch.profiler)")
    options = parser.parse_args()
    import torch

    from calibrl.models import BF16_LOGPROB_TOLERANCE, resolve_model

    torch.set_num_threads(options.threads)
    print(cpu_line())
    print(f"load average before: {os.getloadavg()}")
    path = resolve_model(BUILTIN, quiet=True)
    models = {dtype: load(path, dtype) for dtype in ("float32", "bfloat16")}
    with tempfile.TemporaryDirectory(prefix="calibrl-bf16-") as tmp:
        root = Path(tmp)
        if "generation" not in options.skip:
            print(f"generation: calibrl generate on arithmetic, {options.prompts} prompts x {options.samples} "
                  f"samples x <= {options.tokens} tokens, T = 1", flush=True)
            rates = measure_generation(models, root, prompts=options.prompts, samples=options.samples,
                                       tokens=options.tokens, repeats=options.repeats)
            med = {d: statistics.median(r) for d, r in rates.items()}
            print(f"generation, samples/s (median of {options.repeats}): float32 {med['float32']:.2f} | bfloat16 "
                  f"{med['bfloat16']:.2f} | bf16 / fp32 {med['bfloat16'] / med['float32']:.2f}x", flush=True)
        if options.profile:
            prof = profile_generation(models, root, prompts=options.prompts, samples=options.samples,
                                      tokens=options.tokens)
            for dtype, r in prof.items():
                untracked = r["wall"] - r["matrix"] - r["other_ops"]
                print(f"profile, {dtype}: wall {r['wall']:.2f} s = matrix products {r['matrix']:.2f} s "
                      f"({r['matrix'] / r['wall']:.0%}) + other ops {r['other_ops']:.2f} s + outside ops "
                      f"{untracked:.2f} s; largest self times: "
                      + ", ".join(f"{k} {t:.2f} s" for t, k in r["top"]), flush=True)
            f32, b16 = prof["float32"], prof["bfloat16"]
            print(f"profile: bf16 made the matrix products {f32['matrix'] / b16['matrix']:.2f}x faster and the rest "
                  f"{(f32['wall'] - f32['matrix']) / (b16['wall'] - b16['matrix']):.2f}x; wall {f32['wall'] / b16['wall']:.2f}x."
                  f" Bound on bf16's speed-up if the rest stays as in fp32 (matrix products free): "
                  f"{f32['wall'] / (f32['wall'] - f32['matrix']):.2f}x", flush=True)
        if "logprob" not in options.skip:
            for dataset, tokens, extra in (("multiple_choice", 8, {"split": "validation", "template": "chat-direct"}),
                                           ("arithmetic", options.tokens, {})):
                r = measure_logprobs(models, dataset=dataset, prompts=options.lp_prompts, samples=options.lp_samples,
                                     tokens=tokens, **extra)
                print(f"log-prob error, bf16 vs fp32 forward on {dataset} ({r['sequences']} completions sampled "
                      f"from fp32, {r['tokens']} tokens, <= {tokens} each, accuracy {r['accuracy']:.3f}):\n"
                      f"  per token |diff|: max {r['token_max']:.4f}, 99th percentile {r['token_p99']:.4f}, "
                      f"mean {r['token_mean']:.4f}\n"
                      f"  logprob_mean |diff|: max {r['seq_max']:.4f} (tolerance {BF16_LOGPROB_TOLERANCE}: "
                      f"{'within' if r['seq_max'] <= BF16_LOGPROB_TOLERANCE else 'EXCEEDED'}), mean "
                      f"{r['seq_mean']:.4f}; confidence "
                      f"exp(logprob_mean) |diff| max {r['confidence_max']:.4f}\n"
                      f"  AUROC fp32 {r['auroc'][0]:.4f} bf16 {r['auroc'][1]:.4f} (|change| <= "
                      f"{r['auroc_bound']:.4f}, the share of right/wrong pairs that can swap); ECE fp32 "
                      f"{r['ece'][0]:.4f} bf16 {r['ece'][1]:.4f}\n"
                      f"  (check: fp32 log-probs recorded during sampling vs the fp32 forward, max "
                      f"{r['recorded_vs_forward_fp32']:.2e} on logprob_mean)", flush=True)
        if "step" not in options.skip:
            print(f"LoRA step: CAPO, r 16 on q/k/v/o_proj, {options.step_prompts} prompts x {options.generations} "
                  f"completions x <= {options.step_tokens} tokens on multiple_choice, {options.steps} steps each",
                  flush=True)
            per_step = {}
            for setup in options.setups:
                try:
                    seconds = measure_steps(path, root, setup=setup, prompts=options.step_prompts,
                                            generations=options.generations, tokens=options.step_tokens,
                                            steps=options.steps)
                except Exception as exc:  # noqa: BLE001 - a set-up that does not run is itself the finding
                    print(f"  {setup}: failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
                    continue
                per_step[setup] = statistics.median(seconds)
                print(f"  {setup}: " + ", ".join(f"{s:.1f}" for s in seconds) + " s per step", flush=True)
            if "float32" in per_step:
                base = per_step["float32"]
                print("LoRA step, s (median): " + " | ".join(
                    f"{k} {v:.1f} ({base / v:.2f}x)" for k, v in per_step.items()), flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
