"""The GPU paths on one CUDA GPU, checked and measured in one run (a few minutes on an H100/H200):

    python bench/gpu_check.py --out runs/gpu_check [--tokenizer FOLDER] [--quick]

1. ``logprobs``: :func:`calibrl.logprobs.chunked_token_logps` on the GPU against a whole-vocabulary ``log_softmax``
   in float64 (a random Qwen2 head with Qwen2.5's vocabulary, 151,936; 2 x 4,096 positions), float32 and bfloat16
   hidden states: the largest error and the peak GPU allocation of each way.
2. ``memory``: ``bench/memory.py --device cuda`` (TRL's stock GRPO step, calibrl's step with ``capo`` + mask +
   decision loss, and the held-out callback's sampling) at 4,096-token completions; the two steps also at 16,384.
3. ``rehearse``: every shipped GPU recipe through :func:`calibrl.trl.rehearse.rehearse` with ``device="cuda"``
   (its architecture at tiny width with the real vocabulary, bf16 as the recipe says, TRL's fused LM head with its
   Triton fold, CUDA generation, the estimator and callbacks; one process, no vLLM). A random model earns no
   reward, so the recipe's reward is replaced by one that scores every other completion 1 (every group mixed:
   the estimator, the mask and the loss get something to do).
4. ``generate``: ``calibrl generate --device cuda --dtype bfloat16`` of a random tiny Qwen2 (the tokenizer of
   ``--tokenizer``) on 64 generated arithmetic problems x 8 samples of up to 256 tokens, then ``calibrl eval`` of
   its output: samples per second, and every row written.
5. ``vllm``: whether vLLM imports (its backend of ``calibrl generate`` needs it).

Every section runs even when an earlier one fails; the last lines are a table of what passed, and
``<out>/gpu_check.json`` holds every figure. Without a GPU the script says so and exits 2; ``--device cpu`` runs
its own code on the CPU at small sizes (a dry run of the script, no figure of the GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 151_936
DEVICE = "cuda"  # --device cpu: a dry run of this script
RECIPES = ["capo_qwen2.5-math-1.5b_deepscaler", "grpo_qwen2.5-math-1.5b_deepscaler",
           "decision_qwen3-1.7b_commonsenseqa"]


def environment() -> dict:
    import torch
    import transformers
    import trl

    if DEVICE == "cpu":
        return {"gpu": None, "torch": torch.__version__, "transformers": transformers.__version__,
                "trl": trl.__version__}
    props = torch.cuda.get_device_properties(0)
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"gpu": torch.cuda.get_device_name(0), "memory_gib": round(props.total_memory / 2**30, 1),
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "trl": trl.__version__, "triton": triton_version, "bf16": torch.cuda.is_bf16_supported()}


def check_logprobs(*, positions: int = 8_192, hidden_size: int = 1_536) -> dict:
    """Chunked against whole-vocabulary log-probs on the GPU, float32 and bfloat16 hidden states."""
    import torch

    from calibrl.logprobs import chunked_token_logps, positions_per_chunk

    torch.manual_seed(0)
    head = torch.nn.Linear(hidden_size, VOCAB, bias=False, device=DEVICE)
    torch.nn.init.normal_(head.weight, std=hidden_size ** -0.5)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        hidden = torch.randn(positions, hidden_size, device=DEVICE)
        targets = torch.randint(0, VOCAB, (positions,), device=DEVICE)
        weight = head.weight.to(dtype)
        with torch.no_grad():
            reference = torch.log_softmax((hidden.to(dtype).double() @ weight.double().T), -1)
            reference = reference.gather(-1, targets[:, None])[:, 0].float()
            _reset()
            base = _allocated()
            start = time.perf_counter()
            chunked = chunked_token_logps(hidden.to(dtype), targets, project=lambda h: h @ weight.T,
                                          chunk=positions_per_chunk(vocab_size=VOCAB))
            _sync()
            chunked_s = time.perf_counter() - start
            chunked_peak = _peak() - base
            _reset()
            start = time.perf_counter()
            full = torch.log_softmax((hidden.to(dtype) @ weight.T).float(), -1).gather(-1, targets[:, None])[:, 0]
            _sync()
            full_s = time.perf_counter() - start
            full_peak = _peak() - base
        name = str(dtype).removeprefix("torch.")
        out[name] = {"max_abs_error_chunked": float((chunked - reference).abs().max()),
                     "max_abs_error_full": float((full - reference).abs().max()),
                     "chunked_vs_full": float((chunked - full).abs().max()),
                     "peak_gb_chunked": chunked_peak / 1e9, "peak_gb_full": full_peak / 1e9,
                     "seconds_chunked": chunked_s, "seconds_full": full_s}
        print(f"  logprobs {name}: chunked max error {out[name]['max_abs_error_chunked']:.2e} (full "
              f"{out[name]['max_abs_error_full']:.2e}), peak {chunked_peak / 1e9:.2f} GB vs {full_peak / 1e9:.2f} GB "
              f"for the whole [{positions} x {VOCAB}] logits", flush=True)
    # chunking may change a matrix product's tiling (a bf16 logit can round the other way): it passes when it is
    # no further from the float64 reference than the whole-vocabulary way, up to a factor 2
    out["passed"] = all(out[k]["max_abs_error_chunked"] <= 2 * out[k]["max_abs_error_full"] + 1e-5
                        for k in ("float32", "bfloat16"))
    return out


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _reset() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _allocated() -> int:
    import torch

    return torch.cuda.memory_allocated() if DEVICE == "cuda" else 0


def _peak() -> int:
    import torch

    return torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0


def check_memory(*, tokens: list[int]) -> dict:
    out = {}
    for n in tokens:
        cmd = [sys.executable, str(ROOT / "bench" / "memory.py"), "--device", DEVICE, "--tokens", str(n),
               *(["--skip-callback"] if n > 4_096 else [])]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        print(done.stdout, end="", flush=True)
        if done.returncode:
            print(done.stderr[-3000:], flush=True)
        out[str(n)] = {"status": done.returncode, "stdout": done.stdout, "seconds": time.perf_counter() - start}
    out["passed"] = all(v["status"] == 0 for v in out.values() if isinstance(v, dict))
    return out


def check_rehearse(*, tokenizer: str | None, output: Path) -> dict:
    import io

    from rich.console import Console

    from calibrl.trl.recipes import load_recipe
    from calibrl.trl.rehearse import rehearse

    from calibrl.tasks.registry import register_reward
    from calibrl.trl.recipes import RewardSpec

    @register_reward("gpu_check_alternate", overwrite=True)
    def alternate(prompts, completions, **columns) -> list[float]:
        return [float(i % 2) for i in range(len(completions))]

    out = {}
    for name in RECIPES:
        buffer = io.StringIO()
        start = time.perf_counter()
        try:
            recipe = load_recipe(name)
            recipe.rewards = [RewardSpec("gpu_check_alternate")]
            if tokenizer:
                recipe.model.tokenizer = tokenizer
            result = rehearse(recipe, device=DEVICE, output_dir=str(output / "rehearse" / name),
                              console=Console(file=buffer, width=200), progress=False)
            logs = [json.loads(line) for line in (output / "rehearse" / name / "log_history.jsonl").read_text()
                    .splitlines()]
            losses = [row for row in logs if "loss" in row]
            out[name] = {"passed": bool(losses) and all(float(row.get("grad_norm", 0)) > 0 for row in losses),
                         "model_class": result.model_class, "vocab": result.vocab_size,
                         "logits_classes": result.logits_classes, "seconds": time.perf_counter() - start,
                         "steps": losses}
        except Exception:  # noqa: BLE001 - the report says what failed; the next recipe still runs
            out[name] = {"passed": False, "error": traceback.format_exc()[-3000:]}
        out[name]["log"] = buffer.getvalue()[-4000:]
        print(f"  rehearse {name}: {'passed' if out[name]['passed'] else 'FAILED'}", flush=True)
        print("    " + "\n    ".join(buffer.getvalue().strip().splitlines()[-6:]), flush=True)
        if not out[name]["passed"]:
            print(out[name]["error"], flush=True)
    out["passed"] = all(v["passed"] for v in out.values() if isinstance(v, dict))
    return out


def _tiny_model(folder: Path, tokenizer: str | None) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from calibrl.models import resolve_model

    tok = AutoTokenizer.from_pretrained(tokenizer or resolve_model("builtin:smollm2-135m-instruct", quiet=True))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)


def check_generate(*, tokenizer: str | None, output: Path) -> dict:
    folder = output / "tiny_qwen2"
    _tiny_model(folder, tokenizer)
    samples = output / "generate" / "samples.jsonl"
    samples.parent.mkdir(parents=True, exist_ok=True)
    problems = 64 if DEVICE == "cuda" else 4
    cmd = [sys.executable, "-m", "calibrl", "generate", "--model", str(folder), "--dataset", "arithmetic", "--out",
           str(samples), "--n", "8", "--max-new-tokens", "256" if DEVICE == "cuda" else "16", "--batch-size", "8",
           "--limit", str(problems), "--device", DEVICE, "--dtype", "bfloat16" if DEVICE == "cuda" else "float32",
           "--overwrite"]
    start = time.perf_counter()
    gen = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in samples.read_text().splitlines()] if samples.is_file() else []
    tokens = sum(int(r.get("n_tokens") or 0) for r in rows)
    ev = subprocess.run([sys.executable, "-m", "calibrl", "eval", str(samples), "--out", str(output / "eval"),
                         "--bootstrap", "100"], capture_output=True, text=True, cwd=ROOT)
    out = {"generate_status": gen.returncode, "rows": len(rows), "tokens": tokens, "seconds": seconds,
           "eval_status": ev.returncode, "eval_files": sorted(p.name for p in (output / "eval").glob("*"))
           if (output / "eval").is_dir() else [],
           "stderr": (gen.stderr[-2000:] + "\n" + ev.stderr[-2000:]).strip()}
    out["passed"] = gen.returncode == 0 and ev.returncode == 0 and len(rows) == problems * 8
    print(f"  generate: {len(rows)} samples, {tokens:,} tokens in {seconds:.1f} s (with start-up), status "
          f"{gen.returncode}; eval status {ev.returncode}: {out['eval_files']}", flush=True)
    if not out["passed"]:
        print(out["stderr"], flush=True)
    return out


def check_vllm() -> dict:
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means the backend cannot run here
        return {"passed": False, "importable": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"passed": True, "importable": True, "version": vllm.__version__}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_check"))
    parser.add_argument("--tokenizer", default=None, help="a local tokenizer folder (default: the built-in one's)")
    parser.add_argument("--quick", action="store_true", help="memory at 4,096 tokens only")
    parser.add_argument("--only", default="logprobs,memory,rehearse,generate,vllm")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a dry run of this script's own code at small sizes")
    args = parser.parse_args(argv)
    globals()["DEVICE"] = args.device
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"environment": environment()}
    print(json.dumps(report["environment"]), flush=True)
    checks = {
        "logprobs": lambda: check_logprobs(**({} if DEVICE == "cuda" else {"positions": 512, "hidden_size": 64})),
        "memory": lambda: check_memory(tokens=[4_096] if args.quick else [4_096, 16_384]) if DEVICE == "cuda"
        else check_memory(tokens=[64]),
        "rehearse": lambda: check_rehearse(tokenizer=args.tokenizer, output=args.out),
        "generate": lambda: check_generate(tokenizer=args.tokenizer, output=args.out),
        "vllm": check_vllm,
    }
    for name in args.only.split(","):
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        try:
            report[name] = checks[name]()
        except Exception:  # noqa: BLE001 - one broken section must not hide the others
            report[name] = {"passed": False, "error": traceback.format_exc()[-3000:]}
            print(report[name]["error"], flush=True)
        report[name]["section_seconds"] = time.perf_counter() - start
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print("\nsection    passed  seconds")
    for name in args.only.split(","):
        print(f"{name:10s} {str(report[name].get('passed')):6s} {report[name]['section_seconds']:8.1f}")
    return 0 if all(report[n].get("passed") for n in args.only.split(",") if n != "vllm") else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv[1:]))
