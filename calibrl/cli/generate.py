"""``calibrl generate``: N sampled completions per problem with their confidence, as JSONL for ``calibrl eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from calibrl.cli.app import app, require_extra


@app.command("generate", short_help="Sample N completions per problem with their confidence (JSONL).")
def generate_command(
    ctx: typer.Context,
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
    unanswerable: Optional[float] = typer.Option(None, "--unanswerable", min=0.0, max=1.0, help="The share of unanswerable items (arithmetic: an operand missing; multiple_choice: no option right), each prompt then offering \"I don't know\"; rows get answerable. A file marks its own with a field answerable: false."),
    reward: Optional[str] = typer.Option(None, "--reward", help="Registered reward (default: math, or decision for multiple-choice datasets)."),
    confidence_prompt: bool = typer.Option(False, "--confidence-prompt", help="Ask for a stated confidence after the answer, <confidence>0.8</confidence> (RLCR's format); rows get verbalized_confidence."),
    backend: str = typer.Option("auto", "--backend", help="auto (vLLM if installed and a GPU is present), vllm or transformers."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (each batch's seed is derived from it and the batch's problems)."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16 on a GPU, float32 on the CPU), bfloat16, float16 or float32. bfloat16 on a CPU with AVX512-BF16: faster (docs/realmodel.md), logprob_mean within 0.15 nats of float32's (mean 0.015)."),
    device: Optional[str] = typer.Option(None, "--device", help="transformers backend device (default: cuda if available)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing OUT (and its settings) instead of resuming it."),
    token_confidence_k: int = typer.Option(20, "--token-confidence-k", min=0, help="Record each token's DeepConf confidence (minus the mean of its top-k log-probs, and of the sampled token's when it is not among them, as vLLM returns them) with this k, as token_confidence per row; 0: not recorded."),
    token_confidence_at: str = typer.Option("raw", "--token-confidence-at", help="The distribution DeepConf's token confidence is read from: raw (the model's own, T = 1, as the DeepConf authors read it) or sampling (at --temperature; the same at T = 1)."),
    self_certainty: Optional[bool] = typer.Option(None, "--self-certainty/--no-self-certainty", help="Record INTUITOR's self-certainty (mean over the completion's tokens of KL(uniform || next-token distribution) at the sampling temperature) as self_certainty per row. Default: on with the transformers backend; vLLM cannot (it returns only top-k log-probs), so --self-certainty is refused there."),
    deepconf_online: bool = typer.Option(False, "--deepconf-online", help="DeepConf's online sampling as the authors' code runs it (transformers backend): warm-up traces set a threshold, a trace whose window confidence falls below it stops, traces whose lowest window is at or above it vote; --n is the budget, spent whole unless --deepconf-consensus."),
    deepconf_warmup: int = typer.Option(16, "--deepconf-warmup", min=1, help="--deepconf-online: warm-up traces per problem."),
    deepconf_keep: float = typer.Option(0.1, "--deepconf-keep", help="--deepconf-online: the threshold is the warm-up's (1 - KEEP) quantile of lowest window confidence (0.1: DeepConf-low, 0.9: DeepConf-high)."),
    deepconf_consensus: Optional[float] = typer.Option(None, "--deepconf-consensus", help="--deepconf-online: the paper's Algorithm 2, not the authors' code: stop sampling a problem once its leading answer holds this share of the vote (the paper: 0.95). Default: every problem gets its whole budget."),
    deepconf_window: int = typer.Option(2048, "--deepconf-window", min=1, help="--deepconf-online: tokens of the sliding window (a trace shorter than it votes by its mean and is never stopped)."),
    deepconf_round: int = typer.Option(1, "--deepconf-round", min=1, help="--deepconf-online with --deepconf-consensus: traces per problem between consensus checks (1: the paper's)."),
    deepconf_exact_windows: bool = typer.Option(False, "--deepconf-exact-windows", help="--deepconf-online: window means not rounded to 3 decimals (the authors' code rounds them)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Sample N completions per problem and record each one's answer, correctness and confidence.

    Output rows: prompt_id, benchmark, completion, answer, correct, reward, logprob_mean, n_tokens, self_certainty, token_confidence (+ decision_prob,
    class_probs, label, classes for multiple-choice datasets). A rerun resumes: finished problems are skipped.
    """
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, soft_wrap=True)  # a message is one line, also when piped
    if not deepconf_online:  # an online setting without the online mode would be ignored: say so instead
        given = [f"--{name.replace('_', '-')}" for name in ("deepconf_warmup", "deepconf_keep", "deepconf_consensus",
                                                             "deepconf_window", "deepconf_round",
                                                             "deepconf_exact_windows")
                 if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"]  # typer's own click
        if given:
            what = "a DeepConf online setting" if len(given) == 1 else "DeepConf online settings"
            console.print(f"[red]error:[/red] {', '.join(given)}: {what}, used only with --deepconf-online",
                          highlight=False)
            raise typer.Exit(code=2)
    if deepconf_round != 1 and deepconf_consensus is None:
        console.print("[red]error:[/red] --deepconf-round is the number of traces between consensus checks; it needs "
                      "--deepconf-consensus", highlight=False)
        raise typer.Exit(code=2)
    require_extra("generate", "generate")
    from calibrl.evaluation.deepconf_online import OnlineSettings
    from calibrl.evaluation.generate import GenerateConfig, GenerateError, generate
    from calibrl.trl.progress import quiet_transformers_bars

    config = GenerateConfig(
        model=model, dataset=dataset, out=out, n=n, path=path, split=split, max_new_tokens=max_new_tokens,
        temperature=temperature, batch_size=batch_size, limit=limit, template=template, reward=reward,
        unanswerable=unanswerable, confidence_prompt=confidence_prompt, token_confidence_k=token_confidence_k,
        token_confidence_at=token_confidence_at, self_certainty=self_certainty,
        deepconf_online=OnlineSettings(warmup=deepconf_warmup, keep_fraction=deepconf_keep,
                                       consensus=deepconf_consensus, window=deepconf_window,
                                       round_size=deepconf_round,
                                       round_decimals=None if deepconf_exact_windows else 3)
        if deepconf_online else None,
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
            f"({summary['samples_per_s']:.1f} samples/s, accuracy (mean@k, as calibrl eval) {summary['accuracy_new']:.3f}); "
            f"{summary['problems_skipped']} of {summary['problems']} problems were already done"
        )
    else:
        console.print(f"nothing to do: all {summary['problems']} problems are in {summary['out']}")
    online = summary.get("deepconf_online")
    if online and online["traces"]:
        console.print(f"DeepConf online: {online['stopped']} of {online['traces']} traces stopped early by the "
                      f"window rule, {online['voted']} voted (window {deepconf_window} tokens)", highlight=False)
    console.print(f"next: calibrl eval {summary['out']} --out <report dir>")
