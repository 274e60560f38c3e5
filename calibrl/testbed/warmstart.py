"""Warm starts for the testbed: SFT of the tiny char-level Llama through TRL's SFTTrainer, cached on disk.

RL needs a policy that already produces the format and mostly-right reasoning. The SFT data are drawn from the
TRUE outcome distribution (:func:`calibrl.testbed.tasks.sft_dataset`), so the warm start is calibrated by
construction and every RL method starts from the same point. SFT accuracy jumps abruptly on these tasks, so the
checkpoint is chosen by periodic evaluation (greedy reasoning accuracy on held-out prompts): the first evaluation
reaching ``target`` is kept (the addition task stops at ~0.5 accuracy on purpose, leaving RL room to improve);
otherwise the best one.

Cache: ``$CALIBRL_CACHE/warmstart/<task>-<hash of config>/`` (default ``~/.cache/calibrl``), holding the model and
tokenizer (``save_pretrained``) and ``warmstart.json`` (config, evaluation history, chosen step). A later run
with the same config reuses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from calibrl.models import TinyModelConfig, build_tiny_model
from calibrl.testbed import tasks as tb

WARMSTART_VERSION = 1  # bump when the procedure changes so stale caches are not reused

# Per task: (steps, target greedy accuracy). Found on the train/eval prompt pools of the testbed, seed 0.
_DEFAULT_TARGET = {"decision": 0.97, "stochastic_reasoning": 0.97, "addition": 0.5, "verbalized": 0.97,
                   # scratchpad: the teacher's greedy answer is right on easy + medium prompts (70%)
                   "scratchpad": 0.68, "decision_copy": 0.97,
                   # scratchpad_unfixable: greedy right on easy + medium (70%), never on hard
                   "scratchpad_unfixable": 0.68,
                   # forms: the teacher's right value is the most likely one on every tier
                   "forms": 0.9,
                   # abstain tasks: the sum of the shown digits written right (an answer or a decline after it)
                   "abstain": 0.97, "abstain_verbalized": 0.97}


@dataclass(frozen=True)
class WarmStartConfig:
    """Everything that determines a warm start (its hash names the cache folder)."""

    task: str
    max_steps: int = 1500
    learning_rate: float = 3e-3
    batch_size: int = 64
    n_prompts: int = 5000
    eval_every: int = 100
    eval_prompts: int = 128
    target: float | None = None  # None: the task default above
    seed: int = 0
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    lr_scheduler: str = "constant_with_warmup"  # any transformers lr_scheduler_type
    warmup_steps: int = 50

    @classmethod
    def for_task(cls, task: str, **settings) -> "WarmStartConfig":
        """The config for ``task``: ``settings`` (``None`` values ignored) with the task's pinned SFT settings
        (``TASK_SFT``) on top. Tasks without pinned settings get exactly ``WarmStartConfig(task=..., **settings)``
        (same cache key as before)."""
        name = tb.get_task(task).name
        given = {k: v for k, v in settings.items() if v is not None}
        return cls(task=name, **{**given, **TASK_SFT.get(name, {})})

    def resolved_target(self) -> float:
        return _DEFAULT_TARGET[tb.get_task(self.task).name] if self.target is None else self.target

    def key(self) -> str:
        fields = dataclasses.asdict(self)
        # fields added later enter the hash only when they differ from their default, so the warm starts cached
        # before they existed keep their keys
        for name, default in _LATER_FIELDS.items():
            if fields[name] == default:
                del fields[name]
        payload = json.dumps({"v": WARMSTART_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


# Per task: SFT settings that replace the defaults (and any --warmstart-steps) in WarmStartConfig.for_task.
# addition: with the defaults (lr 3e-3 constant, batch 64, 5000 prompts) greedy accuracy stayed at 3% after
# 700 steps; a lower, cosine-decayed lr with larger batches of more distinct prompts reaches the 0.5 target.
TASK_SFT: dict[str, dict] = {
    "addition": {"learning_rate": 1e-3, "lr_scheduler": "cosine", "warmup_steps": 100, "batch_size": 128,
                 "n_prompts": 50000, "max_steps": 4000, "eval_every": 50},
}

_LATER_FIELDS = {"lr_scheduler": "constant_with_warmup", "warmup_steps": 50}


def cache_root() -> Path:
    """``$CALIBRL_CACHE`` or ``~/.cache/calibrl``."""
    return Path(os.environ.get("CALIBRL_CACHE") or Path.home() / ".cache" / "calibrl")


def cache_path(config: WarmStartConfig) -> Path:
    return cache_root() / "warmstart" / f"{tb.get_task(config.task).name}-{config.key()}"


@contextlib.contextmanager
def one_torch_thread():
    """Run the block with one torch intra-op thread (faster for the tiny model, and robust when the CPU is
    shared: several OpenMP threads spin-wait badly on an oversubscribed machine); restores the setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------------------------------------
# sampling with exact log-probs (shared with the demo's evaluation)


@torch.no_grad()
def sample_completions(model, tokenizer, prompts: list[str], *, n: int = 1, max_new_tokens: int = 12,
                       greedy: bool = False, temperature: float = 1.0, class_token_ids: list[int] | None = None,
                       seed: int | None = None, batch_size: int = 512) -> dict:
    """Sample ``n`` completions per prompt and score them exactly under ``model`` at temperature 1.

    Returns a dict of lists/arrays, one entry per completion (prompt-major order): ``prompt``, ``prompt_index``,
    ``completion`` (text without EOS), ``logprob_mean`` (mean token log-prob over the completion tokens including
    the EOS when emitted), ``n_tokens``, and with ``class_token_ids`` also ``class_probs`` [M, C] (the class-token
    distribution renormalised over the classes at the LAST class-token position, nan when none) — the
    decision-token confidence of arXiv 2601.13284.
    Log-probs come from a separate forward pass, so they are the model's own distribution (not top-k-filtered
    generation scores).
    """
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu")
    if seed is not None:
        gen.manual_seed(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    expanded = [p for p in prompts for _ in range(n)]
    out = {"prompt": expanded, "prompt_index": np.repeat(np.arange(len(prompts)), n), "completion": [],
           "logprob_mean": [], "n_tokens": []}
    class_probs = []
    for start in range(0, len(expanded), batch_size):
        chunk = expanded[start:start + batch_size]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        ids, attn = enc.input_ids, enc.attention_mask
        plen = ids.shape[1]
        done = torch.zeros(len(chunk), dtype=torch.bool, device=device)
        past = None
        cur_ids, cur_attn = ids, attn
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        cur_pos = position_ids
        new_tokens = []
        for _ in range(max_new_tokens):
            res = model(input_ids=cur_ids, attention_mask=cur_attn, position_ids=cur_pos, past_key_values=past,
                        use_cache=True)
            past = res.past_key_values
            logits = res.logits[:, -1, :].float()
            if greedy:
                tok = logits.argmax(-1)
            else:
                probs = torch.softmax(logits / temperature, -1)
                tok = torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(device)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            new_tokens.append(tok)
            done = done | (tok == eos)
            cur_ids = tok[:, None]
            cur_attn = torch.cat([cur_attn, (~done | (tok == eos)).long()[:, None]], dim=1)
            cur_pos = cur_pos[:, -1:] + 1
            if bool(done.all()):
                break
        comp = torch.stack(new_tokens, dim=1)  # [B, L]
        # completion mask: tokens up to and including the first EOS
        is_eos = comp == eos
        after = (is_eos.cumsum(1) - is_eos.long()) > 0
        cmask = ~after & (comp != pad)
        full = torch.cat([ids, comp], dim=1)
        full_attn = torch.cat([attn, cmask.long()], dim=1)
        pos = (full_attn.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=full, attention_mask=full_attn, position_ids=pos).logits.float()
        logp = torch.log_softmax(logits[:, plen - 1:-1, :], -1)  # predicts comp tokens
        tok_lp = logp.gather(-1, comp.clamp(min=0)[..., None]).squeeze(-1)
        m = cmask.float()
        lpm = (tok_lp * m).sum(1) / m.sum(1).clamp(min=1)
        out["logprob_mean"].extend(lpm.tolist())
        out["n_tokens"].extend(cmask.sum(1).tolist())
        for row, mask_row in zip(comp.tolist(), cmask.tolist()):
            toks = [t for t, keep in zip(row, mask_row) if keep and t != eos]
            out["completion"].append(tokenizer.decode(toks))
        if class_token_ids is not None:
            cls = torch.tensor(class_token_ids, device=device)
            is_cls = (comp[..., None] == cls).any(-1) & cmask  # [B, L]
            idx = torch.arange(comp.shape[1], device=device).expand_as(comp)
            last = torch.where(is_cls, idx, torch.full_like(idx, -1)).max(1).values  # [B]
            sel = logp[torch.arange(len(chunk)), last.clamp(min=0)]  # [B, V] log-probs at that position
            cp = torch.softmax(sel[:, cls], -1)
            cp[last < 0] = float("nan")
            class_probs.append(cp.cpu().numpy())
    out["logprob_mean"] = np.asarray(out["logprob_mean"], dtype=float)
    out["n_tokens"] = np.asarray(out["n_tokens"], dtype=int)
    if class_token_ids is not None:
        out["class_probs"] = np.concatenate(class_probs) if class_probs else np.zeros((0, len(class_token_ids)))
    return out


def greedy_accuracy(model, tokenizer, task: str, prompts: list[str]) -> float:
    """Fraction of prompts whose greedy completion has the right format and reasoning (and, for the
    deterministic addition task, the right answer)."""
    t = tb.get_task(task)
    res = sample_completions(model, tokenizer, prompts, greedy=True, max_new_tokens=t.max_completion_length)
    ok = [tb.parse(t.name, p, c)["reasoning_ok"] for p, c in zip(res["prompt"], res["completion"])]
    if not t.stochastic:
        ok = [tb.true_success_probability(t.name, p, c) > 0.5 for p, c in zip(res["prompt"], res["completion"])]
    return float(np.mean(ok))


# ----------------------------------------------------------------------------------------------------------
# SFT


def _train_sft(config: WarmStartConfig, out_dir: Path, log: Callable[[str], None] | None = None,
               progress: Callable[[dict], None] | None = None) -> dict:
    import datasets
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    task = tb.get_task(config.task)
    model, tokenizer = build_tiny_model(config=config.model, seed=config.seed)
    train = tb.sft_dataset(task.name, config.n_prompts, seed=config.seed)
    eval_prompts = [r["prompt"] for r in tb.build_rows(task.name, config.eval_prompts, split="eval",
                                                       seed=config.seed)]
    target = config.resolved_target()
    history: list[dict] = []
    best = {"acc": -1.0, "step": 0, "state": None}

    report_every = max(1, config.max_steps // 100)  # progress messages: about 100 per run, plus one per evaluation

    class EvalAndChoose(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % config.eval_every and state.global_step != config.max_steps:
                if progress and state.global_step % report_every == 0:
                    progress({"task": task.name, "step": state.global_step, "total": config.max_steps})
                return
            was_training = model.training
            acc = greedy_accuracy(model, tokenizer, task.name, eval_prompts)
            model.train(was_training)
            history.append({"step": state.global_step, "accuracy": acc})
            if log:
                log(f"SFT {task.name} step {state.global_step}: greedy accuracy {acc:.3f}")
            if acc > best["acc"]:
                best.update(acc=acc, step=state.global_step,
                            state={k: v.detach().clone() for k, v in model.state_dict().items()})
            if acc >= target:
                best.update(acc=acc, step=state.global_step,
                            state={k: v.detach().clone() for k, v in model.state_dict().items()})
                control.should_training_stop = True
            if progress:
                # total is the step limit: the run stops earlier when an evaluation reaches the target
                progress({"task": task.name, "step": state.global_step,
                          "total": state.global_step if control.should_training_stop else config.max_steps,
                          "note": f"greedy accuracy {acc:.2f} (stops early at {target:.2f})"})

    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(
            output_dir=tmp, max_steps=config.max_steps, per_device_train_batch_size=config.batch_size,
            learning_rate=config.learning_rate, lr_scheduler_type=config.lr_scheduler, warmup_steps=config.warmup_steps,
            logging_steps=10_000, save_strategy="no", report_to="none", use_cpu=True, seed=config.seed,
            max_length=48, completion_only_loss=True, dataloader_num_workers=0, disable_tqdm=True,
            bf16=False, fp16=False, weight_decay=0.0,
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer,
                             callbacks=[EvalAndChoose()])
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
        trainer.train()
    model.load_state_dict(best["state"])
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"chosen_step": best["step"], "chosen_accuracy": best["acc"], "target": target, "history": history}


def warm_start(task: str, config: WarmStartConfig | None = None, *, force: bool = False,
               log: Callable[[str], None] | None = None, progress: Callable[[dict], None] | None = None) -> Path:
    """Path of the warm-start model folder for ``task`` (trained now, or reused from the cache).

    Processes that need the same warm start at once train it once (a lock beside the cache folder; the others
    wait and find it). ``progress`` (training only) receives ``{"task", "step", "total"[, "note"]}`` about 100
    times per run and at every evaluation (``note``: its greedy accuracy); ``total`` is the step limit until the
    run stops at its target.

    The folder loads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``; its
    ``warmstart.json`` records the config, the evaluation history and the chosen step.
    """
    config = config or WarmStartConfig.for_task(task)
    path = cache_path(config)
    if (path / "warmstart.json").exists() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    from calibrl._files import cache_entry_lock

    # processes that need the same warm start at once (a study's workers, test workers) train it once: the others
    # wait for the lock and find it
    with cache_entry_lock(path):
        if (path / "warmstart.json").exists() and not force:
            return path
        return _train_into(task, config, path, log, progress)


def _train_into(task: str, config: WarmStartConfig, path: Path, log, progress) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        t0 = time.perf_counter()
        with one_torch_thread():
            info = _train_sft(config, tmp, log, progress)
        info.update(config=dataclasses.asdict(config), seconds=round(time.perf_counter() - t0, 1),
                    key=config.key())
        (tmp / "warmstart.json").write_text(json.dumps(info, indent=2))
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)  # atomic: a concurrent reader sees either nothing or a complete folder
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def load_warm_start(path: str | Path):
    """``(model, tokenizer)`` from a warm-start folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def warm_start_info(path: str | Path) -> dict:
    return json.loads((Path(path) / "warmstart.json").read_text())


__all__ = ["TASK_SFT", "WarmStartConfig", "cache_path", "cache_root", "greedy_accuracy", "load_warm_start",
           "sample_completions", "warm_start", "warm_start_info"]
