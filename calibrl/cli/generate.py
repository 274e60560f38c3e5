"""``calibrl generate``: N sampled completions per problem with their confidence, as JSONL for ``calibrl eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from calibrl.cli.app import app, require_extra


@app.command("generate", short_help="Sample N completions per problem with their confidence (JSONL).")
def generate_command(
    model: str = typer.Option(..., "--model", "-m", help="Hub id or local folder of a causal LM, a .gguf file, builtin:smollm2-135m-instruct or builtin:tiny."),
    dataset: str = typer.Option(..., "--dataset", "-d", help="Registered dataset name (math500, aime24, commonsenseqa, ...) or a local .jsonl/.json/.parquet file (task told by its fields)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL (resumed if an earlier calibrl generate wrote it; any other existing file is refused without --overwrite)."),
    n: int = typer.Option(16, "--n", help="Completions per problem."),
    path: Optional[str] = typer.Option(None, "--path", help="Local JSON/JSONL/Parquet file in the hub dataset's format."),
    split: Optional[str] = typer.Option(None, "--split", help="Dataset split (default: the dataset's usual eval split)."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Maximum completion length in tokens (default: the dataset's, 64 for arithmetic and multiple_choice, 1024 for the others; on resume the run's)."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature (0 = greedy). Log-probs are the sampling distribution's."),
    batch_size: int = typer.Option(8, "--batch-size", help="Problems per batch (each batch samples batch-size x n completions)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first LIMIT problems (may be raised on resume: more problems are appended)."),
    template: Optional[str] = typer.Option(None, "--template", help="Prompt template (math: qwen-math, qwen-math-chat, chat, none; decisions: direct, reasoning, chat; the generated multiple_choice task also chat-direct, its direct instruction as a chat message)."),
    reward: Optional[str] = typer.Option(None, "--reward", help="Registered reward (default: math, or decision for multiple-choice datasets)."),
    confidence_prompt: bool = typer.Option(False, "--confidence-prompt", help="Ask for a stated confidence after the answer, <confidence>0.8</confidence> (RLCR's format); rows get verbalized_confidence."),
    backend: str = typer.Option("auto", "--backend", help="auto (vLLM if installed and a GPU is present), vllm or transformers."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (each batch's seed is derived from it and the batch's problems)."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16 on a GPU, float32 on the CPU), bfloat16, float16 or float32. bfloat16 on a CPU with AVX512-BF16: faster (docs/realmodel.md), logprob_mean within 0.15 nats of float32's (mean 0.015)."),
    device: Optional[str] = typer.Option(None, "--device", help="transformers backend device (default: cuda if available)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing OUT (and its settings) instead of resuming it."),
    token_confidence_k: int = typer.Option(20, "--token-confidence-k", min=0, help="Record each token's DeepConf confidence (minus the mean of its top-k log-probs) with this k, as token_confidence per row; 0: not recorded."),
    self_certainty: Optional[bool] = typer.Option(None, "--self-certainty/--no-self-certainty", help="Record INTUITOR's self-certainty (mean over the completion's tokens of KL(uniform || next-token distribution) at the sampling temperature) as self_certainty per row. Default: on with the transformers backend; vLLM cannot (it returns only top-k log-probs), so --self-certainty is refused there."),
    deepconf_online: bool = typer.Option(False, "--deepconf-online", help="DeepConf's online sampling (transformers backend): warm-up traces set a threshold, a trace whose window confidence falls below it stops, a problem stops once its confidence-weighted vote reaches --deepconf-consensus; --n is the budget."),
    deepconf_warmup: int = typer.Option(16, "--deepconf-warmup", min=1, help="--deepconf-online: warm-up traces per problem."),
    deepconf_keep: float = typer.Option(0.1, "--deepconf-keep", help="--deepconf-online: the threshold is the warm-up's (1 - KEEP) quantile of lowest window confidence (0.1: DeepConf-low, 0.9: DeepConf-high)."),
    deepconf_consensus: float = typer.Option(0.95, "--deepconf-consensus", help="--deepconf-online: stop sampling a problem once its leading answer holds this share of the vote."),
    deepconf_window: int = typer.Option(2048, "--deepconf-window", min=1, help="--deepconf-online: tokens of the sliding window."),
    deepconf_round: int = typer.Option(1, "--deepconf-round", min=1, help="--deepconf-online: traces per problem between consensus checks (1: the paper's)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Sample N completions per problem and record each one's answer, correctness and confidence.

    Output rows: prompt_id, benchmark, completion, answer, correct, reward, logprob_mean, n_tokens, self_certainty, token_confidence (+ decision_prob,
    class_probs, label, classes for multiple-choice datasets). A rerun resumes: finished problems are skipped.
    """
    from rich.console import Console
    from rich.markup import escape

    require_extra("generate", "generate")
    from calibrl.evaluation.deepconf_online import OnlineSettings
    from calibrl.evaluation.generate import GenerateConfig, GenerateError, generate
    from calibrl.trl.progress import quiet_transformers_bars

    console = Console(stderr=True, soft_wrap=True)  # a message is one line, also when piped
    config = GenerateConfig(
        model=model, dataset=dataset, out=out, n=n, path=path, split=split, max_new_tokens=max_new_tokens,
        temperature=temperature, batch_size=batch_size, limit=limit, template=template, reward=reward,
        confidence_prompt=confidence_prompt, token_confidence_k=token_confidence_k, self_certainty=self_certainty,
        deepconf_online=OnlineSettings(warmup=deepconf_warmup, keep_fraction=deepconf_keep,
                                       consensus=deepconf_consensus, window=deepconf_window,
                                       round_size=deepconf_round) if deepconf_online else None,
        backend=backend, seed=seed, dtype=dtype, device=device, overwrite=overwrite, progress=not quiet,
    )
    try:
        with quiet_transformers_bars():  # calibrl draws its own bar; transformers' "Loading weights" is noise
            summary = generate(config)
    except (GenerateError, OSError, ValueError, KeyError, RuntimeError) as exc:
        console.print(f"[red]error:[/red] {escape(' '.join(str(exc).split()))}", highlight=False)
        raise typer.Exit(code=2) from None
    if summary["samples_written"]:
        console.print(
            f"wrote {summary['samples_written']} samples to {summary['out']} with {summary['backend']} "
            f"({summary['samples_per_s']:.1f} samples/s, accuracy {summary['accuracy_new']:.3f}); "
            f"{summary['problems_skipped']} of {summary['problems']} problems were already done"
        )
    else:
        console.print(f"nothing to do: all {summary['problems']} problems are in {summary['out']}")
    console.print(f"next: calibrl eval {summary['out']} --out <report dir>")
