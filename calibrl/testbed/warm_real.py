"""The warm start of the built-in real model: ``builtin:smollm2-135m-warm`` is SmolLM2-135M-Instruct after a short
supervised LoRA fine-tuning on calibrl's ``arithmetic`` task, so that RL starts where the papers' base models start
(right about half the time on held-out problems, with a confidence that still ranks right above wrong), not at the
untrained model's floor (accuracy 0.06 on arithmetic).

What it trains on: the ``train`` split of ``arithmetic`` (levels 1-4 in turn, :mod:`calibrl.tasks.synthetic`), the
prompt rendered with the model's chat template exactly as ``calibrl generate`` renders it, the target the gold
number followed by the end-of-turn token. The loss is the mean cross-entropy over the target tokens only (the
prompt is context, as in TRL's ``SFTTrainer`` with ``completion_only_loss``). The task's answers are bare numbers,
so "the worked answers the tasks can produce" are the answers themselves: no reasoning text is invented.

Settings (:class:`WarmStartConfig`) were chosen on the ``validation`` split only (a pilot of 150 steps, rank 16:
held-out accuracy 0.26 at T = 1, AUROC of exp(mean log-prob) 0.95; docs/realmodel.md, "The warm start"); the
``test`` split, ``calibrl generate``'s default for this task, is not looked at before the build.

Cost: one optimizer step of 8 prompts (about 50 tokens each) is a forward and a backward pass through all 30
layers, about 3.5 s on 2 CPU cores; the default 360 steps take about 21 minutes. The adapter is saved in float16
(about 4.9 MB at rank 8 on the seven linear projections of every layer) and merged into the float32 base by
:func:`calibrl.models.resolve_model` on first use; the figures recorded with it come from the shipped file.

    python -m calibrl.testbed.warm_real --out calibrl/warm/smollm2-135m-warm    # rebuild the shipped adapter
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["WarmStartConfig", "build_warm_adapter", "target_tokens"]

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class WarmStartConfig:
    """One warm start (the defaults build the shipped ``builtin:smollm2-135m-warm``)."""

    base: str = "builtin:smollm2-135m-instruct"  # the model the adapter is trained on
    steps: int = 360  # optimizer steps
    batch: int = 8  # prompts per step, drawn with replacement from the training problems
    learning_rate: float = 1e-3  # peak; linear warm-up over the first 5% of steps, then linear decay to 10%
    lora_r: int = 8
    lora_alpha: int = 16
    targets: tuple[str, ...] = LORA_TARGETS  # every linear projection of every layer
    train_size: int = 5000  # problems of the train split (seed ``seed``) the batches are drawn from
    levels: tuple[int, ...] = (1, 2, 3, 4)
    seed: int = 0  # problems drawn, batch order, LoRA initialisation
    threads: int = 2  # torch threads (the figures of the record were built with this many)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def target_tokens(tokenizer, prompt_messages, answer: str) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids) of one problem: the prompt exactly as ``calibrl generate`` renders and tokenizes it
    (:func:`calibrl.evaluation.backends.render_prompts`, no special tokens added) and the answer followed by the
    tokenizer's end-of-sequence token (SmolLM2's end of turn, where generation stops)."""
    from calibrl.evaluation.backends import render_prompts

    prompt_ids = tokenizer(render_prompts(tokenizer, [prompt_messages])[0], add_special_tokens=False)["input_ids"]
    end = tokenizer.eos_token or ""
    return prompt_ids, tokenizer(answer + end, add_special_tokens=False)["input_ids"]


def build_warm_adapter(out: str | Path, config: WarmStartConfig | None = None, *, progress: bool = True) -> dict:
    """Train the LoRA adapter of ``config`` and save it to ``out`` (peft's ``adapter_config.json`` and
    ``adapter_model.safetensors``, float16) with ``record.json`` (the config, the UTC start and end, the loss
    path). Returns the record. The same config on the same machine gives the same bytes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from calibrl.models import resolve_model
    from calibrl.tasks.synthetic import load_arithmetic

    config = config or WarmStartConfig()
    out = Path(out)
    start = _now()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    path = resolve_model(config.base, quiet=not progress)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                             target_modules=list(config.targets), task_type="CAUSAL_LM"))
    rows = load_arithmetic("train", size=config.train_size, seed=config.seed, levels=config.levels)
    examples = [target_tokens(tokenizer, row["prompt"], row["answer"]) for row in rows]
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    warm = max(1, config.steps // 20)
    losses: list[float] = []
    t0 = time.perf_counter()
    model.train()
    for step in range(config.steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(config.batch)]
        width = max(len(p) + len(a) for p, a in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)  # -100: no loss on the prompt, the padding
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (p, a) in enumerate(batch):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            labels[i, len(p):len(p) + len(a)] = torch.tensor(a)
            mask[i, :len(p) + len(a)] = 1
        scale = min((step + 1) / warm, 1.0 - 0.9 * max(0, step - warm) / max(1, config.steps - warm))
        for group in optim.param_groups:
            group["lr"] = config.learning_rate * scale
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if progress and (step % 20 == 0 or step == config.steps - 1):
            recent = losses[-20:]
            print(f"[warm start] step {step + 1}/{config.steps}: loss {sum(recent) / len(recent):.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)  # peft's model card template: the record below says what this is
    weights = out / "adapter_model.safetensors"
    save_file({k: v.to(torch.float16).contiguous() for k, v in load_file(str(weights)).items()}, str(weights))
    record = {"config": asdict(config), "start": start, "end": _now(), "train_seconds": round(seconds, 1),
              "adapter_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
              "torch": torch.__version__, "loss_by_20_steps": [round(sum(losses[i:i + 20]) / len(losses[i:i + 20]), 4)
                                                               for i in range(0, len(losses), 20)]}
    (out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibrl.testbed.warm_real", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder the adapter and its record are written to")
    defaults = WarmStartConfig()
    for name in ("steps", "batch", "lora_r", "lora_alpha", "train_size", "seed", "threads"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    args = parser.parse_args(argv)
    config = WarmStartConfig(**{k: v for k, v in vars(args).items() if k != "out"})
    record = build_warm_adapter(args.out, config)
    print(json.dumps({k: record[k] for k in ("start", "end", "train_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
