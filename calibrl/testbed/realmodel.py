"""Short LoRA runs of the real built-in model on the CPU, with calibration measured on held-out prompts.

Behind ``calibrl demo --model builtin:smollm2-135m-instruct`` (one method, a few steps: the untrained model's
calibration, then what a short run does to it) and ``studies/realmodel_study.py`` (four methods, equal budgets).

Task (``RealModelRunConfig.dataset``, :data:`REAL_MODEL_TASKS`): ``arithmetic`` (chat template, graded by the
number: what ``builtin:smollm2-135m-warm`` was warm-started on) or, by default, ``multiple_choice``
(:mod:`calibrl.tasks.synthetic`: four lettered options about an arithmetic expression,
``chat-direct`` template, the model answers with the letter), levels 1-2 by default (learnable items and items the
untrained model gets wrong), reward ``decision`` (1 iff the last option letter of the completion is right). Chosen
for the CPU: completions are a few tokens, and every method applies (the decision-token term needs a class
decision). Every run: LoRA r 16 on the attention projections (reference model = the adapter-disabled base), AdamW
at a constant learning rate, T = 1, beta 0, TRL's gradient checkpointing (the same gradients; without it the
activations of 32 sequences x 30 layers took 3 GB: docs/realmodel.md, Memory);
:class:`calibrl.trl.callbacks.CalibrationEvalCallback` evaluates the held-out prompts (validation split) at the
start and every ``eval_every`` steps with the same sampling seed.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from calibrl._files import write_then_rename
from calibrl.metrics import auroc_standard_error
BUILTIN_REAL_MODEL = "builtin:smollm2-135m-instruct"
# CalibratedGRPOConfig fields of each method (CAPO tau 0.6 as the paper; decision-token CE lambda 1 as the testbed)
REAL_MODEL_METHODS: dict[str, dict] = {
    "grpo": {"advantage_estimator": "grpo"},
    "capo": {"advantage_estimator": "capo", "capo_tau": 0.6},
    "capo_mask": {"advantage_estimator": "capo", "capo_tau": 0.6, "capo_mask": "quantile"},
    "grpo_decision": {"advantage_estimator": "grpo", "decision_classes": ["A", "B", "C", "D"],
                      "decision_loss_coef": 1.0, "decision_zero_advantage": True},
}
# dataset -> (template, reward): the reward grades both the training completions and the held-out evaluations
REAL_MODEL_TASKS: dict[str, tuple[str, str]] = {
    "multiple_choice": ("chat-direct", "decision"),
    "arithmetic": ("chat", "number"),
}
REAL_MODEL_LABELS = {"grpo": "GRPO", "capo": "CAPO (tau 0.6)", "capo_mask": "CAPO + frozen mask (tau 0.6)",
                     "grpo_decision": "GRPO + decision CE (lambda 1)"}


@dataclass
class RealModelRunConfig:
    """One LoRA run of a real model (defaults: the study's settings, fixed before its runs)."""

    model: str = BUILTIN_REAL_MODEL
    method: str = "grpo"  # a key of REAL_MODEL_METHODS
    # the task (a key of REAL_MODEL_TASKS): multiple_choice (chat-direct, graded by letter) or arithmetic (chat,
    # graded by the number; what builtin:smollm2-135m-warm was warm-started on)
    dataset: str = "multiple_choice"
    steps: int = 24
    prompts_per_step: int = 4
    num_generations: int = 8
    max_completion_length: int = 8
    learning_rate: float = 3e-4
    levels: tuple[int, ...] = (1, 2)
    train_prompts: int = 2000
    eval_prompts: int = 32
    eval_k: int = 4
    eval_every: int = 6
    eval_split: str = "validation"  # the held-out prompts' split (disjoint from train whatever the seed)
    eval_batch_prompts: int | None = None  # prompts per generate batch of an evaluation; None: all in one batch
    lora_r: int = 16
    seed: int = 0
    threads: int | None = None  # torch threads; None keeps torch's default
    dtype: str = "float32"  # the model's weights (LoRA adapters stay float32): float32, bfloat16, float16, auto
    # where the run computes: "cpu" (TRL's use_cpu) or "cuda" (one GPU, the engine's own placement; matmuls stay
    # strict float32: PyTorch's default leaves TF32 off)
    device: str = "cpu"
    extra: dict = field(default_factory=dict)  # further CalibratedGRPOConfig fields

    def __post_init__(self) -> None:
        from calibrl.models import check_dtype

        if self.eval_split == "train":
            raise ValueError("eval_split: the held-out prompts cannot come from the training split")
        if self.method not in REAL_MODEL_METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose from {', '.join(REAL_MODEL_METHODS)}")
        if self.dataset not in REAL_MODEL_TASKS:
            raise ValueError(f"unknown dataset {self.dataset!r}; choose from {', '.join(REAL_MODEL_TASKS)}")
        if "decision_classes" in REAL_MODEL_METHODS[self.method] and self.dataset != "multiple_choice":
            raise ValueError(f"method {self.method!r} needs a decision token: dataset multiple_choice, not "
                             f"{self.dataset!r}")
        check_dtype(self.dtype)
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {self.device!r}")


RUN_CONFIG_FILE = "run_config.json"


def train_real_model(config: RealModelRunConfig, out: str | Path, *,
                     on_log: Callable[[int, dict], None] | None = None, checkpoints: bool = False,
                     print_fn: Callable[[str], None] = print) -> dict:
    """Train ``config`` into ``out`` (``calibration_eval.json`` from the callback, ``trainer_log.json``) and
    return ``{"records": evaluation records, "log_history": trainer logs, "seconds": wall time, "started_utc",
    "finished_utc" (:func:`calibrl.testbed.runner.utc_now`; of this call, so a resumed run's start is its
    resumption's), ...}``.
    ``on_log(step, logs)`` receives every training log (one per step) and every evaluation, and
    ``{"train_begin": True}`` once the model is loaded, before the first evaluation.

    ``checkpoints``: a run that survives interruptions. At every evaluation point (every ``eval_every`` steps,
    after that step's evaluation) the trainer saves ``checkpoint-<step>`` (the LoRA adapter, AdamW's state, the
    scheduler, the python / numpy / torch RNG states, the step, and so the data position; CAPO's frozen mask
    thresholds), the newest one kept; the evaluations so far are in ``calibration_eval.json`` and
    ``evaluation_samples.json`` (each written then renamed). Called again on the same ``out``, the run resumes from
    the newest COMPLETE checkpoint (a save cut off by a kill is passed over,
    :func:`calibrl.trl.checkpoints.last_complete_checkpoint`), keeps the evaluations up to it and gives the records
    of an uninterrupted run (tests/test_realmodel_resume.py); ``print_fn`` says which checkpoint it resumed from.
    ``out`` remembers its settings (``run_config.json``): resuming under other settings is refused. Without
    ``checkpoints`` (the default) nothing is saved and a rerun starts at step 0. The result's ``seconds`` is this
    call's wall time and ``resumed_from`` the step it resumed from (None for a fresh start)."""
    import torch
    from peft import LoraConfig
    from transformers import TrainerCallback

    from calibrl.logprobs import bound_heap_cache
    from calibrl.tasks.registry import get_dataset_loader, get_reward
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer
    from calibrl.trl.callbacks import CALIBRATION_EVAL_FILE, CalibrationEvalConfig, attach_calibration_eval
    from calibrl.trl.progress import quiet_transformers_bars

    if config.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda': torch sees no GPU")
    if config.threads:
        torch.set_num_threads(config.threads)
    bound_heap_cache()  # freed CPU temporaries go back to the system (docs/realmodel.md, Memory)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = _resume_point(config, out) if checkpoints else None
    loader = get_dataset_loader(config.dataset)
    template, reward = REAL_MODEL_TASKS[config.dataset]
    levels = tuple(config.levels)
    train = loader("train", size=config.train_prompts, seed=0, levels=levels, template=template)
    heldout = loader(config.eval_split, size=config.eval_prompts, seed=0, levels=levels, template=template)
    args = CalibratedGRPOConfig(
        output_dir=str(out), per_device_train_batch_size=config.prompts_per_step * config.num_generations,
        num_generations=config.num_generations, max_completion_length=config.max_completion_length,
        max_steps=config.steps, learning_rate=config.learning_rate, lr_scheduler_type="constant", beta=0.0,
        temperature=1.0, logging_steps=1, report_to="none", use_cpu=config.device == "cpu", seed=config.seed,
        # checkpoints after each evaluation (the callback runs before the save of its step), the newest kept
        **({"save_strategy": "steps", "save_steps": config.eval_every, "save_total_limit": 1} if checkpoints else
           {"save_strategy": "no"}),
        disable_tqdm=True, bf16=False, gradient_checkpointing=True, correctness_reward=reward,
        **{**REAL_MODEL_METHODS[config.method], **config.extra,
           # the base weights in config.dtype; peft keeps the LoRA adapters (and so AdamW's state) in float32
           "model_init_kwargs": {**config.extra.get("model_init_kwargs", {}), "dtype": config.dtype}})
    callbacks = []
    if on_log is not None:
        class Forward(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):  # before the start's evaluation (added later)
                on_log(state.global_step, {"train_begin": True})

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs:
                    on_log(state.global_step, dict(logs))

        callbacks.append(Forward())
    # the caller prints its own lines (on_log): transformers' "Loading weights" / "Writing model shards" bars
    # would cut through them
    quiet = quiet_transformers_bars if on_log is not None else contextlib.nullcontext
    with quiet():
        trainer = CalibratedGRPOTrainer(
            model=config.model, reward_funcs=get_reward(reward), args=args, train_dataset=train,
            callbacks=callbacks,
            peft_config=LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r,
                                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    if on_log is not None:  # the caller prints its own lines: drop transformers' raw log dicts
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    evaluation = attach_calibration_eval(trainer, dataset=heldout, config=CalibrationEvalConfig(
        every=config.eval_every, prompts=config.eval_prompts, k=config.eval_k,
        batch_size=config.eval_batch_prompts or config.eval_prompts,
        seed=0))
    # after the evaluation callback, so it sees each evaluation's rows
    trainer.add_callback(_keep_samples_callback()(evaluation, out / EVALUATION_SAMPLES_FILE))
    from calibrl.testbed.runner import utc_now

    start, started_utc = time.perf_counter(), utc_now()
    if checkpoint is not None:
        print_fn(f"{out}: resuming from {checkpoint.name} (the newest complete checkpoint)")
    with quiet():
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    seconds = time.perf_counter() - start
    records = with_samples(json.loads((out / CALIBRATION_EVAL_FILE).read_text())["records"], out)
    result = {"method": config.method, "label": REAL_MODEL_LABELS[config.method], "settings":
              REAL_MODEL_METHODS[config.method], "config": asdict(config), "seconds": seconds, "started_utc": started_utc,
              "finished_utc": utc_now(), "records": records,
              "log_history": trainer.state.log_history, "finished": True,
              "resumed_from": int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint is not None else None}
    write_then_rename(out / "trainer_log.json", json.dumps(result, indent=1, default=str))
    return result


def write_json_gz(path: str | Path, doc: dict) -> bool:
    """``doc`` as gzip-compressed JSON (no timestamp: equal records give equal bytes), written then renamed, only
    when the bytes differ from the file's: a study's committed raw records. True when written."""
    import gzip
    import io

    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as handle:
        handle.write(json.dumps(doc, separators=(",", ":")).encode())
    data, path = raw.getvalue(), Path(path)
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_then_rename(path, data)
    return True


def _resume_point(config: RealModelRunConfig, out: Path) -> Path | None:
    """The newest complete ``checkpoint-<step>`` of an earlier run of ``config`` in ``out`` (None: start afresh).
    ``out/run_config.json`` holds the settings of the run that made the checkpoints; other settings raise
    ValueError naming the field. Torn checkpoints (a kill while saving) are passed over."""
    from calibrl.trl.checkpoints import last_complete_checkpoint

    saved_path = out / RUN_CONFIG_FILE
    mine = json.loads(json.dumps(asdict(config), default=str))
    found, _torn = last_complete_checkpoint(out)
    if found is not None and saved_path.exists():
        # a field added since the checkpointed run was made reads as its default there (device: "cpu")
        saved = {**json.loads(json.dumps(asdict(RealModelRunConfig()), default=str)),
                 **json.loads(saved_path.read_text())}
        for key in sorted(set(saved) | set(mine)):
            if saved.get(key) != mine.get(key):
                raise ValueError(f"{saved_path}: {key} is {saved.get(key)!r} in the checkpointed run, "
                                 f"{mine.get(key)!r} now; resume with the same settings or use another folder")
    elif found is not None:
        raise ValueError(f"{out}: checkpoints without {RUN_CONFIG_FILE}: not made by this function; use another "
                         "folder")
    write_then_rename(saved_path, json.dumps(mine, indent=1))
    return Path(found) if found is not None else None


EVALUATION_SAMPLES_FILE = "evaluation_samples.json"


def evaluation_samples(rows: list[dict]) -> dict[str, list]:
    """The per-sample arrays of one held-out evaluation (``calibrl generate`` rows): ``prompt_id`` [N] str,
    ``correct`` [N] 0/1, ``logprob_mean`` [N] (confidence = exp of it), and for a decision task ``decision_prob``
    [N] (None where a completion named no class): what a prompt-level bootstrap needs."""
    out = {"prompt_id": [str(r["prompt_id"]) for r in rows], "correct": [int(bool(r["correct"])) for r in rows],
           "logprob_mean": [float(r["logprob_mean"]) for r in rows]}
    if rows and "decision_prob" in rows[0]:
        out["decision_prob"] = [None if r.get("decision_prob") is None else float(r["decision_prob"]) for r in rows]
    return out


def _keep_samples_callback():
    from transformers import TrainerCallback

    class KeepEvaluationSamples(TrainerCallback):
        """After each held-out evaluation of ``evaluation`` (a CalibrationEvalCallback added before this one),
        its rows' per-sample arrays by step, written to ``path`` as they come (``{"evaluations": [{"step",
        "prompt_id", "correct", "logprob_mean"}, ...]}``)."""

        def __init__(self, evaluation, path: Path):
            self.evaluation, self.path = evaluation, Path(path)
            self.kept: dict[int, dict] = {}

        def _keep(self) -> None:
            records, rows = self.evaluation.records, self.evaluation.last_samples
            if not records or not rows or int(records[-1]["step"]) in self.kept:
                return  # no new evaluation (a fresh run starts with none kept: a stale file is overwritten)
            self.kept[int(records[-1]["step"])] = evaluation_samples(rows)
            write_then_rename(self.path, json.dumps({"evaluations": [{"step": s, **v}
                                                                     for s, v in sorted(self.kept.items())]}))

        def on_train_begin(self, args, state, control, **kwargs):
            self.kept = {}
            if state.global_step > 0 and self.path.exists():  # resumed: the evaluations up to the checkpoint
                for e in json.loads(self.path.read_text()).get("evaluations", []):
                    if int(e["step"]) <= state.global_step:
                        self.kept[int(e["step"])] = {k: v for k, v in e.items() if k != "step"}
            self._keep()

        def on_step_end(self, args, state, control, **kwargs):
            self._keep()

    return KeepEvaluationSamples


def with_samples(records: list[dict], run_dir: str | Path) -> list[dict]:
    """``records`` (a run's held-out evaluations) with each one's per-sample arrays under ``"samples"`` when the
    run folder holds them (``evaluation_samples.json``, written by runs since the paired interval); records of older
    runs come back unchanged."""
    path = Path(run_dir) / EVALUATION_SAMPLES_FILE
    if not path.exists():
        return records
    kept = {int(e["step"]): {k: v for k, v in e.items() if k != "step"}
            for e in json.loads(path.read_text())["evaluations"]}
    return [{**r, "samples": kept[int(r["step"])]} if int(r.get("step", -1)) in kept else r for r in records]


REPORT_KEYS = (("accuracy", "accuracy ↑"), ("auroc", "AUROC of mean log-prob ↑"),
               ("auroc_per_prompt", "AUROC per prompt ↑"), ("ece", "ECE ↓"), ("mean_confidence", "mean confidence"),
               ("decision_ece", "decision-letter ECE ↓"))


def records_table(runs: dict[str, list[dict]]) -> str:
    """Markdown: one row per evaluation of each run (``runs``: label -> evaluation records)."""
    from calibrl.metrics.registry import record_value

    lines = ["| method | step | " + " | ".join(title for _, title in REPORT_KEYS) + " |",
             "|---|---:|" + "---:|" * len(REPORT_KEYS)]
    for label, records in runs.items():
        for r in records:
            values = [record_value(r, k) for k, _ in REPORT_KEYS]  # older runs' records: confidence_mean
            cells = [f"{v:.3f}" if isinstance(v, (int, float)) else "" for v in values]
            lines.append(f"| {label} | {r.get('step')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_runs(runs: dict[str, list[dict]], path: str | Path, *, title: str | None = None) -> Path:
    """Held-out accuracy over steps, and AUROC against accuracy (each run's trajectory from its start); ``title``
    names the model and task above both panels. Laid out by matplotlib's constrained layout, so no label runs
    into a title or the legend strip below the panels; every text drawn as written (a model path with ``$``)."""
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from calibrl.evaluation.plots import _save
    from calibrl.evaluation.styles import series_style

    fig = Figure(figsize=(11, 4.4), layout="constrained")
    axes = fig.subplots(1, 2)
    for i, (label, records) in enumerate(runs.items()):
        if not records:
            continue
        style = series_style(label, i)
        marker, style = style.marker, dict(linestyle=style.linestyle, color=style.color)
        acc = np.array([r.get("accuracy", np.nan) for r in records], dtype=float)
        auc = np.array([r.get("auroc", np.nan) for r in records], dtype=float)
        n = np.array([r.get("n_samples") or 0 for r in records], dtype=float)
        # 95% error bars: prompt-level bootstrap where the record kept its samples; otherwise (older runs)
        # binomial for accuracy and Hanley-McNeil for the AUROC, samples treated as independent
        acc_err = 1.96 * np.sqrt(acc * (1 - acc) / np.maximum(n, 1))
        auc_err = 1.96 * np.array([evaluation_auroc_standard_error(r) for r in records])
        acc_err, auc_err = np.vstack([acc_err, acc_err]), np.vstack([auc_err, auc_err])  # [2, E]: below, above
        for j, r in enumerate(records):
            bars = evaluation_error_bars(r)
            if bars is not None:
                acc_err[:, j], auc_err[:, j] = bars
        axes[0].errorbar([r["step"] for r in records], acc, yerr=acc_err, marker=marker, capsize=3, label=label,
                         **style)
        axes[1].errorbar(acc, auc, xerr=acc_err, yerr=auc_err, marker=marker, capsize=3, label=label, **style)
        if np.isfinite(acc[0]) and np.isfinite(auc[0]):  # an AUROC is undefined when every answer is wrong
            axes[1].annotate("start", (acc[0], auc[0]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    # the y labels on two lines: on one, the AUROC's was taller than its panel and ran into the title above
    axes[0].set(xlabel="training step", ylabel="held-out accuracy\n(higher is better)",
                title="Accuracy over training (bars: 95% intervals)")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    axes[1].set(xlabel="held-out accuracy (higher is better)",
                ylabel="AUROC of mean token log-prob\n(higher is better)",
                title="AUROC of sequence confidence against accuracy")
    if title:
        fig.suptitle(title)
    for ax in axes:
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    # one legend for both panels, in its own strip below them (inside the axes it hid points)
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, max(1, len(labels))), frameon=False)
    return _save(fig, path)


def evaluation_error_bars(record: dict, *, n_boot: int = 1000, seed: int = 0):
    """Prompt-level bootstrap 95% error bars of one evaluation record with per-sample arrays (``"samples"``):
    ``((accuracy - low, high - accuracy), (auroc - low, high - auroc))`` from
    :func:`calibrl.metrics.bootstrap_ci` (prompts resampled, their samples kept together); None when the record
    kept no samples (then the plot draws the binomial and Hanley-McNeil bars)."""
    samples = record.get("samples")
    if not samples:
        return None
    import numpy as np

    from calibrl import metrics as M

    correct = np.asarray(samples["correct"], dtype=bool)
    ids = np.asarray(samples["prompt_id"])
    acc = M.bootstrap_ci(lambda correct: float(np.mean(correct)), {"correct": correct}, prompt_ids=ids,
                         n_boot=n_boot, seed=seed)
    auc = M.bootstrap_ci(M.auroc, {"confidence": np.asarray(samples["logprob_mean"], dtype=float),
                                   "correct": correct}, prompt_ids=ids, n_boot=n_boot, seed=seed)
    return (acc.point - acc.low, acc.high - acc.point), (auc.point - auc.low, auc.high - auc.point)


def evaluation_auroc_standard_error(record: dict) -> float:
    """:func:`auroc_standard_error` of one held-out evaluation record (``auroc``, ``accuracy`` x ``n_samples``
    right answers); nan when a field is missing or undefined."""
    import math

    n, acc, auroc = int(record.get("n_samples") or 0), record.get("accuracy"), record.get("auroc")
    if not n or not isinstance(acc, (int, float)) or not isinstance(auroc, (int, float)) or not math.isfinite(acc):
        return float("nan")
    n_pos = round(acc * n)
    return auroc_standard_error(auroc, n_pos, n - n_pos)


def demo_sentences(records: list[dict], *, label: str, steps: int) -> list[str]:
    """What a short run's held-out evaluations show, computed from the first and last record."""
    if len(records) < 2:
        return ["Only the start was evaluated."]
    first, last = records[0], records[-1]
    out = []
    for key, name in (("accuracy", "held-out accuracy"), ("auroc", "AUROC of the mean token log-prob"),
                      ("ece", "ECE")):
        a, b = first.get(key), last.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            out.append(f"{name}: {a:.3f} at the start, {b:.3f} after {label}'s {steps} steps ({b - a:+.3f}).")
    n = int(last.get("n_samples") or 0)
    acc, auroc = last.get("accuracy"), last.get("auroc")
    if n and isinstance(acc, (int, float)) and isinstance(auroc, (int, float)):
        n_pos = round(acc * n)
        se = evaluation_auroc_standard_error(last)
        out.append(f"Resolution: {n} held-out samples ({n_pos} right), so an AUROC is known to about +-{1.96 * se:.2f} "
                   "(95%, Hanley-McNeil); changes smaller than that are noise. A few LoRA steps move a 135M model "
                   "little: the equal-budget study of four methods is docs/results/realmodel.md "
                   "(studies/realmodel_study.py in the calibrl repository).")
    return out


# the sentence under trajectories.png (plot_runs) in the demo's report
TRAJECTORIES_CAPTION = (
    "*Left: held-out accuracy at each evaluation over the training steps; right: the AUROC of the confidence (exp "
    "of the mean token log-prob) against that accuracy, one point per evaluation from the one marked 'start'; the "
    "bars are 95% intervals, so a move that stays inside them is noise.*")


def demo_dataset(model: str) -> str:
    """The task ``calibrl demo --model`` runs for ``model``: ``arithmetic`` for a warm built-in model (what it was
    warm-started on), ``multiple_choice`` for any other."""
    from calibrl.models import WARM_MODELS

    return "arithmetic" if str(model).removeprefix("builtin:") in WARM_MODELS else "multiple_choice"


_TASK_WORDS = {"multiple_choice": "`multiple_choice` (levels {levels}, letter answers, chat template)",
               "arithmetic": "`arithmetic` (levels {levels}, number answers, chat template)"}


def run_real_model_demo(out: str | Path, *, model: str = BUILTIN_REAL_MODEL, method: str = "grpo", steps: int = 6,
                        eval_prompts: int = 32, eval_k: int = 4, dtype: str = "float32", dataset: str | None = None,
                        print_fn: Callable[[str], None] = print) -> Path:
    """``calibrl demo --model``: the model's calibration on held-out prompts of ``dataset`` (default
    :func:`demo_dataset`), a short LoRA run of ``method`` with a line per step, the same evaluation after it; writes
    ``report.md`` and ``trajectories.png`` into ``out`` and returns the report's path. ``dtype``: the base weights'
    (``bfloat16``: steps 1.3-1.8x faster on a CPU with AVX512-BF16, docs/realmodel.md)."""
    from calibrl.models import check_dtype, resolve_model

    check_dtype(dtype)  # before the model resolves: a bad name leaves nothing behind
    dataset = dataset or demo_dataset(model)
    levels = (1, 2, 3, 4) if dataset == "arithmetic" else RealModelRunConfig.levels
    start = time.perf_counter()
    path = resolve_model(model)  # converts a GGUF file once (with progress), then reuses the cached folder
    out = Path(out)  # created only once the model resolves: a bad name leaves nothing behind
    out.mkdir(parents=True, exist_ok=True)
    config = RealModelRunConfig(model=path, method=method, steps=steps, eval_prompts=eval_prompts, eval_k=eval_k,
                                eval_every=max(1, steps), dtype=dtype, dataset=dataset, levels=levels)
    step_times: list[float] = []
    # the callback evaluates a step before TRL logs that step's training line: its line waits for the step's
    held: dict[int, str] = {}
    printed = {"step": 0}  # the last training step whose line is out

    def on_log(step: int, logs: dict) -> None:
        elapsed = time.perf_counter() - start
        if logs.get("train_begin"):  # the model is loaded; the start's evaluation is the next long wait
            print_fn(f"model loaded ({elapsed:.0f} s elapsed); held-out evaluation at step {step}: sampling "
                     f"{eval_prompts} prompts x {eval_k} ...")
        elif "eval_calibration/accuracy" in logs:
            line = (f"held-out evaluation at step {step}: accuracy {logs['eval_calibration/accuracy']:.3f}, "
                    f"AUROC {logs.get('eval_calibration/auroc', float('nan')):.3f}, "
                    f"ECE {logs.get('eval_calibration/ece', float('nan')):.3f} ({elapsed:.0f} s elapsed)")
            if step > printed["step"]:  # that step's training line is not out yet
                held[step] = line
            else:
                print_fn(line)
        elif "reward" in logs:
            step_times.append(elapsed)
            per_step = (step_times[-1] - step_times[0]) / (len(step_times) - 1) if len(step_times) > 1 else None
            eta = f", ETA {per_step * (steps - step):.0f} s + final evaluation" if per_step and step < steps else ""
            print_fn(f"step {step}/{steps}: reward {logs['reward']:.3f}, rollout AUROC "
                     f"{logs.get('calibration/auroc', float('nan')):.3f}, loss {logs.get('loss', float('nan')):.4f} "
                     f"({elapsed:.0f} s elapsed{eta})")
            printed["step"] = step
            for waiting in sorted(k for k in held if k <= step):
                print_fn(held.pop(waiting))

    print_fn(f"{model}: evaluating {eval_prompts} held-out prompts x {eval_k} samples, then {steps} LoRA steps "
             f"of {REAL_MODEL_LABELS[method]} ({config.prompts_per_step} prompts x {config.num_generations} "
             "completions each), then the same evaluation")
    result = train_real_model(config, out / "run", on_log=on_log)
    for waiting in sorted(held):  # an evaluation after the last logged step
        print_fn(held.pop(waiting))
    label = REAL_MODEL_LABELS[method]
    runs = {label: result["records"]}
    figure = plot_runs(runs, out / "trajectories.png",
                       title=f"{model}: {dataset.replace('_', '-')} (held-out {eval_prompts} prompts x {eval_k} "
                             "samples)")
    train_rows = ["| step | reward | rollout AUROC | entropy | loss |", "|---:|---:|---:|---:|---:|"]
    for log in result["log_history"]:
        if "reward" in log:
            cells = [f"{log[k]:.3f}" if isinstance(log.get(k), (int, float)) else "" for k in
                     ("reward", "calibration/auroc", "entropy", "loss")]
            train_rows.append(f"| {log.get('step')} | " + " | ".join(cells) + " |")
    seconds = time.perf_counter() - start
    lines = [
        f"# calibrl demo on a real model: {model}", "",
        f"Setup: `{model}`{'' if dtype == 'float32' else f' (weights in {dtype})'} with LoRA r {config.lora_r} on "
        f"the attention projections, {REAL_MODEL_LABELS[method]}, "
        f"{steps} steps of {config.prompts_per_step} prompts x {config.num_generations} completions (at most "
        f"{config.max_completion_length} tokens, T = 1, lr {config.learning_rate:g}, beta 0) on "
        f"{_TASK_WORDS[dataset].format(levels=', '.join(map(str, config.levels)))}. Held-out evaluation before "
        f"and after: {eval_prompts} validation prompts x {eval_k} samples, the same sampling seed both times. "
        "Confidence = exp(mean token log-prob) of the completion. ↑: higher is better, ↓: lower is better.", "",
        "## What this run shows", "", *[f"- {x}" for x in demo_sentences(result["records"], label=label,
                                                                         steps=steps)], "",
        "## Held-out evaluations", "", records_table(runs), "", f"![trajectories]({figure.name})", "",
        TRAJECTORIES_CAPTION, "",
        "## Training steps (the trainer's own rollouts)", "", *train_rows, "",
        f"Wall time: {seconds:.0f} s.", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report


__all__ = ["BUILTIN_REAL_MODEL", "EVALUATION_SAMPLES_FILE", "REAL_MODEL_LABELS", "REAL_MODEL_METHODS", "RUN_CONFIG_FILE",
           "TRAJECTORIES_CAPTION",
           "RealModelRunConfig", "auroc_standard_error", "demo_sentences", "evaluation_auroc_standard_error",
           "evaluation_error_bars", "evaluation_samples", "plot_runs", "records_table", "run_real_model_demo",
           "train_real_model", "with_samples", "write_json_gz"]
