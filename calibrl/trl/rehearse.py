"""``calibrl train RECIPE --rehearse``: a GPU recipe run on the CPU in a minute, before any GPU hour is spent.

The rehearsal changes only what a CPU cannot run or cannot run quickly, prints a note for each change, and then
trains through exactly the path of the real run (:func:`calibrl.trl.train.train`: validation, dataset loaders,
reward functions, TRL's model loading from a folder with the recipe's ``model_init_kwargs``, the frozen
reference, LoRA, gradient checkpointing, CAPO's mask, the calibration callbacks, checkpoint and final save):

* **model**: the recipe's own architecture (its config's ``model_type``: Qwen2, Qwen3, Llama) at tiny width
  (hidden 64, 2 layers, 4 heads) with the REAL vocabulary size and random weights, written to a temporary folder
  that the recipe then names. The architecture comes from a config cached under ``HF_HOME`` when there is one,
  else from :data:`ARCHITECTURES` (the config fields of the models the shipped recipes name), else from the
  built-in model's folder (``builtin:smollm2-135m-instruct``). ``builtin:tiny`` is already CPU-sized: used as is.
* **tokenizer**: the model's own when cached under ``HF_HOME``, else the built-in SmolLM2 tokenizer (a real BPE
  with a chat template, vocabulary 49,152): its ids all lie below the model's vocabulary, so the embedding and the
  logits keep the real size (151,936 for Qwen2.5 and Qwen3) while only the first 49,152 rows are ever read.
* **datasets**: a hub dataset (``deepscaler``, ``aime25``, ``commonsenseqa``, ...) becomes the sample file in the
  same format shipped in ``calibrl/recipes/data/``; local and generated datasets stay; at most 8 training rows
  and 2 evaluation rows are read (the final evaluation of the real run still runs, on those).
* **settings**: ``bf16`` stays when the CPU computes bfloat16 natively (:func:`cpu_supports_bf16`), else float32;
  ``fp16`` becomes float32; ``use_vllm``, ``deepspeed``, ``fsdp``, Liger kernels, flash attention, device maps and
  quantized loading are switched off; batch, group size and completion length shrink (:func:`rehearsal_layout`,
  keeping TRL's divisibility rules and whether generations are reused over several updates); ``max_steps`` is 2,
  every step is logged, ``report_to`` is none, ``output_dir`` is ``runs/rehearse/<recipe>``. Checkpointing and
  evaluation keep the recipe's strategy: with ``save_strategy`` / ``eval_strategy`` ``steps`` transformers saves
  and evaluates at the last step, so a rehearsal writes ``checkpoint-2`` as the real run writes its checkpoints.

Nothing is downloaded: every model, tokenizer and dataset the rehearsal reads is local. API: :func:`rehearse`.
``rehearse(recipe, device="cuda")`` runs the same rehearsal on one GPU instead (bf16 and float16 kept where the GPU
computes them, no ``use_cpu``): the recipe's GPU path (TRL's fused LM head with its Triton fold, CUDA generation,
gradient checkpointing, the estimator and callbacks) at tiny width, still one process and without vLLM.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibrl._files import FolderInUse, folder_lock
from calibrl.trl.progress import quiet_transformers_bars
from calibrl.trl.recipes import RECIPES_DIR, TINY, DatasetSpec, Recipe, RecipeError

__all__ = [
    "ARCHITECTURES", "SAMPLE_DATA", "Rehearsal", "cpu_supports_bf16", "map_dataset", "map_model_settings",
    "map_trainer_settings", "model_config", "rehearsal_layout", "rehearse", "tiny_width",
]

# Config fields (config.json on the hub) of the models the shipped GPU recipes name: the architecture a
# rehearsal instantiates at tiny width when the real config is not cached under HF_HOME.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-Math-1.5B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 4096,
        "max_window_layers": 21, "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen2.5-3B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
        "num_key_value_heads": 2, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 32768,
        "max_window_layers": 36, "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen2.5-7B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 131072,
        "max_window_layers": 28, "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-1.7B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": True,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28, "bos_token_id": 151643,
        "eos_token_id": 151645, "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-8B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": 36, "bos_token_id": 151643,
        "eos_token_id": 151645, "torch_dtype": "bfloat16",
    },
}

# hub dataset name -> the sample file in the same format shipped in calibrl/recipes/data/
_MATH = ("deepscaler", "math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench")
SAMPLE_DATA: dict[str, Path] = {
    **{name: RECIPES_DIR / "data" / "deepscaler.jsonl" for name in _MATH},
    **{name: RECIPES_DIR / "data" / "commonsenseqa.jsonl" for name in ("commonsenseqa", "openbookqa")},
}

STAND_IN_TOKENIZER = "builtin:smollm2-135m-instruct"
TINY_WIDTH = {"hidden": 64, "layers": 2, "heads": 4, "intermediate": 128}
LAYOUT = {"num_generations": 2, "max_completion_length": 8, "calibration_prompts": 2, "calibration_k": 2,
          "train_rows": 8, "eval_rows": 2}
_FLASH = ("flash_attention_2", "flash_attention_3", "kernels-community/flash-attn", "flex_attention")


@dataclass
class Rehearsal:
    """What :func:`rehearse` ran: the mapped recipe, one note per changed setting, the stand-in model and the
    result of :func:`calibrl.trl.train.train` (``global_step``, ``log_history``, ...)."""

    recipe: Recipe  # its model.name_or_path names the stand-in's temporary folder, removed after the run
    notes: list[str] = field(default_factory=list)
    model_class: str | None = None
    vocab_size: int | None = None  # the model config's: the size of the embedding and of the logits
    tokenizer: str | None = None  # where the tokenizer came from
    logits_classes: int | None = None  # measured on the trained model: the last dimension of its logits
    result: dict | None = None


# ------------------------------------------------------------------------------------------------- pure mapping


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX on x86, SVE / BF16 on Arm), so a recipe's
    ``bf16: true`` runs at CPU speed; without it torch emulates bfloat16 and the rehearsal trains in float32.
    ``torch.backends.cpu.get_cpu_capability()`` names the vector ISA torch dispatches to ("AVX512", "SVE256");
    the bfloat16 extensions are asked of ``torch.cpu`` where that torch has the query."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("SVE"):
        return True
    for query in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        probe = getattr(torch.cpu, query, None)
        if probe is not None and probe():
            return True
    return False


def rehearsal_layout(trainer: dict[str, Any], *, num_generations: int = 2) -> dict[str, Any]:
    """The batch layout of a rehearsal step, from the recipe's ``trainer`` section (TRL's field names).

    One prompt per micro-batch: ``per_device_train_batch_size = num_generations`` completions (one group), no
    gradient accumulation. When the recipe reuses a generation round over several optimizer updates
    (``steps_per_generation`` or ``generation_batch_size`` beyond ``per_device * gradient_accumulation_steps``),
    the rehearsal keeps that: ``steps_per_generation = 2`` (one round, two updates); else TRL's default (one
    update per round). TRL requires ``per_device * steps_per_generation`` and the eval batch to be multiples of
    ``num_generations``: both are here. Returns only the layout fields (a value of None unsets a field)."""
    per_device = int(trainer.get("per_device_train_batch_size", 8))
    accumulation = int(trainer.get("gradient_accumulation_steps", 1))
    if trainer.get("generation_batch_size") is not None:
        rounds = int(trainer["generation_batch_size"]) // max(per_device, 1)
    else:
        rounds = int(trainer.get("steps_per_generation") or accumulation)
    reused = rounds > accumulation  # one generation round feeds several optimizer updates
    layout: dict[str, Any] = {
        "num_generations": min(int(trainer.get("num_generations", 8)), num_generations),
        "per_device_train_batch_size": None, "gradient_accumulation_steps": 1,
        "steps_per_generation": 2 if reused else None, "generation_batch_size": None,
    }
    layout["per_device_train_batch_size"] = layout["num_generations"]
    layout["per_device_eval_batch_size"] = layout["num_generations"]
    if trainer.get("num_generations_eval") is not None:
        layout["num_generations_eval"] = layout["num_generations"]
    return layout


def map_trainer_settings(trainer: dict[str, Any], *, name: str, bf16_ok: bool, steps: int = 2,
                         output_dir: str | None = None, device: str = "cpu") -> tuple[dict[str, Any], list[str]]:
    """(the rehearsal's ``trainer`` section, one note per change) for a recipe's ``trainer`` section.

    ``name`` (the recipe's) names the default output folder ``runs/rehearse/<name>``; ``bf16_ok`` is
    :func:`cpu_supports_bf16` (on ``device="cuda"``, whether the GPU computes bfloat16). Settings a CPU runs as
    they are (gradient checkpointing, LoRA, the estimator, learning rate, clipping, ...) are kept; see the module
    docstring for what changes. ``device="cuda"``: one GPU process; bf16 / fp16 stay (bf16 where supported), no
    ``use_cpu``, and vLLM, DeepSpeed, FSDP and Liger are still off."""
    out = dict(trainer)
    notes: list[str] = []

    def put(key: str, value: Any, why: str) -> None:
        old = out.get(key, "<unset>")
        if value is None:
            if key not in out:
                return
            del out[key]
        elif key in out and out[key] == value:
            return
        else:
            out[key] = value
        shown = "<unset>" if value is None else json.dumps(value)
        notes.append(f"trainer.{key}: {json.dumps(old) if old != '<unset>' else old} -> {shown} ({why})")

    gpu = device == "cuda"
    unit = "this GPU" if gpu else "this CPU"
    if out.get("bf16") and not bf16_ok:
        put("bf16", False, f"{unit} has no native bfloat16: float32")
    elif out.get("bf16"):
        notes.append(f"trainer.bf16: true kept ({unit} computes bfloat16 natively)")
    if out.get("fp16") and not gpu:
        put("fp16", False, "float16 mixed precision needs a GPU: float32")
    if out.get("use_vllm"):
        put("use_vllm", False, "a rehearsal generates with transformers" if gpu
            else "vLLM needs a GPU: transformers generation")
    if out.get("deepspeed"):
        put("deepspeed", None, "one GPU process" if gpu else "DeepSpeed needs GPUs: one CPU process")
    if out.get("fsdp"):
        put("fsdp", None, "one GPU process" if gpu else "FSDP needs several devices: one CPU process")
        put("fsdp_config", None, "FSDP is off")
    for key in ("use_liger_kernel", "use_liger_loss"):
        if out.get(key):
            put(key, False, "Liger kernels are off in a rehearsal" if gpu else "Liger kernels need a GPU (Triton)")
    if gpu:
        put("use_cpu", None, "the rehearsal runs on the GPU")
    elif not out.get("use_cpu"):
        put("use_cpu", True, "the rehearsal runs on the CPU")
    layout = rehearsal_layout(out, num_generations=LAYOUT["num_generations"])
    why = {"steps_per_generation": "one generation round feeds 2 updates, as in the recipe",
           "generation_batch_size": "set by steps_per_generation",
           "per_device_eval_batch_size": "one prompt group per evaluation batch"}
    for key, value in layout.items():
        put(key, value, why.get(key, "one prompt group of completions per step"))
    if int(out.get("max_completion_length", 256)) > LAYOUT["max_completion_length"]:
        put("max_completion_length", LAYOUT["max_completion_length"], "a few tokens per completion")
    put("max_steps", steps, f"{steps} optimizer steps")
    put("logging_steps", 1, "every step logged")
    if out.get("report_to") not in (None, "none", [], ["none"]):
        put("report_to", "none", "no tracker")
    put("output_dir", output_dir or str(Path("runs") / "rehearse" / name), "rehearsal output")
    return out, notes


def map_dataset(spec: DatasetSpec | None, section: str) -> tuple[DatasetSpec | None, list[str]]:
    """(the section the rehearsal reads, its note): a hub dataset (no ``path``) becomes the sample file in the
    same format shipped in ``calibrl/recipes/data/`` (:data:`SAMPLE_DATA`); a local or generated one stays."""
    from calibrl.tasks.datasets import HUB

    if spec is None or spec.path is not None or spec.name not in HUB:
        return spec, []
    if spec.name not in SAMPLE_DATA:
        raise RecipeError(f"{section}.name: no sample of the hub dataset {spec.name!r} is shipped; set "
                          f"{section}.path to a local file in its format")
    mapped = dataclasses.replace(spec, path=str(SAMPLE_DATA[spec.name]), options=dict(spec.options),
                                 load_kwargs={})
    return mapped, [f"{section}: hub dataset {spec.name!r} -> {SAMPLE_DATA[spec.name].relative_to(RECIPES_DIR)} "
                    "(shipped sample, same format; no download)"]


def tiny_width(config: dict[str, Any], *, hidden: int = 64, layers: int = 2, heads: int = 4,
               intermediate: int = 128) -> dict[str, Any]:
    """``config`` (a model's config fields) at tiny width: ``hidden`` / ``layers`` / ``heads`` /
    ``intermediate`` replace the width fields, ``head_dim = hidden / heads``, the key-value heads keep the real
    grouping ratio (``heads / (real heads / real kv heads)``, at least 1, dividing ``heads``), per-layer lists
    are cut to ``layers``; everything else (``model_type``, ``vocab_size``, rope settings, norms, tied
    embeddings, special token ids) stays the real model's."""
    out = dict(config)
    real_heads = int(config.get("num_attention_heads", heads))
    real_kv = int(config.get("num_key_value_heads") or real_heads)
    group = max(real_heads // max(real_kv, 1), 1)
    kv = max(heads // group, 1)
    while heads % kv:
        kv -= 1
    out.update(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
               intermediate_size=intermediate, head_dim=hidden // heads)
    if "max_window_layers" in out:
        out["max_window_layers"] = min(int(out["max_window_layers"] or layers), layers)
    if isinstance(out.get("layer_types"), list):
        out["layer_types"] = out["layer_types"][:layers]
    for key in ("_name_or_path", "_model_name_or_path", "name_or_path", "transformers_version", "dtype",
                "torch_dtype", "quantization_config"):
        out.pop(key, None)
    return out


def map_model_settings(spec, *, bf16_ok: bool, device: str = "cpu") -> tuple[str | None, dict[str, Any], list[str]]:
    """(dtype, from_pretrained keyword arguments, notes) of a recipe's model section on the CPU: bfloat16 stays
    when :func:`cpu_supports_bf16` (``bf16_ok``), float16 and unsupported bfloat16 become float32; flash
    attention becomes PyTorch's sdpa; device maps and quantized loading (bitsandbytes) are dropped. On
    ``device="cuda"`` float16 stays and ``bf16_ok`` is the GPU's bfloat16 support."""
    notes: list[str] = []
    dtype = spec.dtype
    unit = "this GPU" if device == "cuda" else "this CPU"
    if (dtype == "float16" and device != "cuda") or (dtype == "bfloat16" and not bf16_ok):
        why = "float16 weights are for GPUs" if dtype == "float16" else f"{unit} has no native bfloat16"
        notes.append(f"model.dtype: {dtype} -> float32 ({why})")
        dtype = "float32"
    elif dtype == "bfloat16":
        notes.append(f"model.dtype: bfloat16 kept ({unit} computes bfloat16 natively)")
    init_kwargs = dict(spec.init_kwargs)
    if init_kwargs.get("attn_implementation") in _FLASH:
        notes.append(f"model.init_kwargs.attn_implementation: {init_kwargs['attn_implementation']} -> sdpa "
                     + ("(a rehearsal uses PyTorch's attention)" if device == "cuda"
                        else "(flash attention needs a GPU)"))
        init_kwargs["attn_implementation"] = "sdpa"
    for key in ("device_map", "load_in_4bit", "load_in_8bit", "quantization_config", "tp_plan"):
        if key in init_kwargs:
            notes.append(f"model.init_kwargs.{key}: {json.dumps(init_kwargs.pop(key), default=str)} -> <unset> "
                         + ("(one GPU, full weights)" if device == "cuda"
                            else "(GPU placement / quantization: full weights on the CPU)"))
    return dtype, init_kwargs, notes


# ------------------------------------------------------------------------------------------------ model, tokenizer


def model_config(name: str) -> tuple[dict[str, Any], str]:
    """(config fields, where they came from) of model ``name``, read without a download: a config cached under
    ``HF_HOME`` (or a local folder), else :data:`ARCHITECTURES`, else the built-in model's converted folder.
    A model none of these knows is a :class:`RecipeError` listing the known names."""
    from calibrl.models import is_builtin, known_builtins, resolve_model

    if is_builtin(name):
        folder = Path(resolve_model(name, quiet=True))
        return json.loads((folder / "config.json").read_text()), f"{name}'s config"
    local = Path(name).expanduser()
    if (local / "config.json").is_file():
        return json.loads((local / "config.json").read_text()), f"{local / 'config.json'}"
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid repo id, or no hub client: fall through to the table
        cached = None
    if isinstance(cached, str) and Path(cached).is_file():
        return json.loads(Path(cached).read_text()), f"cached {name} config"
    if name in ARCHITECTURES:
        return dict(ARCHITECTURES[name]), "calibrl's table of the shipped recipes' models: no cached config"
    known = ", ".join([*ARCHITECTURES, *known_builtins()[1:]])
    raise RecipeError(f"model.name_or_path: {name!r} has no cached config (HF_HOME) and is not one calibrl knows "
                      f"({known}); download its config.json once or point name_or_path at a local folder")


def _stand_in_tokenizer(name: str):
    """(tokenizer, where it came from): ``name``'s own when a local folder or the ``HF_HOME`` cache holds it,
    else the built-in SmolLM2 tokenizer (local files only: no download either way)."""
    from transformers import AutoTokenizer

    from calibrl.models import resolve_model

    if not name.startswith("builtin:"):
        try:
            return AutoTokenizer.from_pretrained(name, local_files_only=True), f"{name} (cached)"
        except Exception:  # noqa: BLE001 - not cached: any failure means "use the stand-in"
            pass
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(STAND_IN_TOKENIZER, quiet=True))
    return tokenizer, STAND_IN_TOKENIZER


def _write_stand_in(recipe: Recipe, folder: Path, notes: list[str]) -> tuple[str, int, str]:
    """Writes the recipe model's architecture at tiny width with random weights and the tokenizer into
    ``folder``. Returns (model class name, vocab size, tokenizer source)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = recipe.model
    real, config_source = model_config(spec.name_or_path)
    fields = tiny_width(real, **TINY_WIDTH)
    tokenizer, tokenizer_source = _stand_in_tokenizer(spec.tokenizer or spec.name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if len(tokenizer) > int(fields["vocab_size"]):
        raise RecipeError(f"model: the tokenizer {tokenizer_source} has {len(tokenizer):,} tokens, more than "
                          f"{spec.name_or_path}'s vocabulary of {int(fields['vocab_size']):,}")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # generation stops at the tokenizer's tokens
        fields[key] = getattr(tokenizer, key)
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with quiet_transformers_bars():  # no "Writing model shards" bar for a 40 MB stand-in
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    vocab = int(config.vocab_size)
    notes.append(f"model.name_or_path: {spec.name_or_path} -> {type(model).__name__} at hidden "
                 f"{TINY_WIDTH['hidden']}, {TINY_WIDTH['layers']} layers, {TINY_WIDTH['heads']} heads, vocabulary "
                 f"{vocab:,}, random weights ({sum(p.numel() for p in model.parameters()):,} parameters; "
                 f"architecture from {config_source})")
    note = f"model.tokenizer: {tokenizer_source}"
    if tokenizer_source == STAND_IN_TOKENIZER and spec.name_or_path != STAND_IN_TOKENIZER:
        note += (f" ({spec.name_or_path}'s is not cached; its {len(tokenizer):,} ids all lie below the model's "
                 f"{vocab:,}, so the logits keep their real size)")
    notes.append(note)
    return type(model).__name__, vocab, tokenizer_source


def _step_callback(console, *, steps: int, rehearsal: Rehearsal, print_steps: bool):
    """A TrainerCallback printing one line per optimizer step (``print_steps``: without the progress bar, which
    prints its own) and measuring, at the end, the trained model's number of logit classes
    (``rehearsal.logits_classes``)."""
    import torch
    from transformers import TrainerCallback

    class RehearsalSteps(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if not print_steps or "loss" not in logs:
                return
            parts = [f"{key} {logs[key]:.4g}" for key in ("loss", "reward", "grad_norm", "learning_rate")
                     if isinstance(logs.get(key), (int, float))]
            console.print(f"rehearsal step {state.global_step}/{steps}: {', '.join(parts)} "
                          f"({time.perf_counter() - self.start:.1f} s)", markup=False, highlight=False,
                          soft_wrap=True)

        def on_train_end(self, args, state, control, model=None, **kwargs):
            if model is None:
                return
            device = next(model.parameters()).device
            with torch.no_grad():
                out = model(input_ids=torch.tensor([[1, 2, 3]], device=device))
            logits = out["logits"] if isinstance(out, dict) else out.logits if hasattr(out, "logits") else out[0]
            rehearsal.logits_classes = int(logits.shape[-1])

    return RehearsalSteps()


# ------------------------------------------------------------------------------------------------------ rehearse


def rehearse(recipe: Recipe, *, overrides: dict | None = None, steps: int = 2, output_dir: str | None = None,
             console=None, progress: bool = True, device: str = "cpu", overwrite: bool = False) -> Rehearsal:
    """Runs ``recipe`` on the CPU for ``steps`` optimizer steps with its GPU-only settings mapped (module
    docstring), printing a note per change, a line per step and a last line saying the rehearsal passed.

    ``overrides`` (trainer fields, e.g. from ``--set``) apply to the recipe before the mapping. ``device="cuda"``
    rehearses on one GPU (module docstring). The default output folder (``runs/rehearse/<recipe>``) holds the
    latest rehearsal only; an ``output_dir`` that holds a run is refused as ``calibrl train`` refuses it, unless
    ``overwrite`` (moved aside). Returns a :class:`Rehearsal`; a recipe that cannot run raises as the
    real run would."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    from rich.console import Console

    console = console or Console()
    try:
        return _rehearse(recipe, overrides=overrides, steps=steps, output_dir=output_dir, console=console,
                         progress=progress, device=device, overwrite=overwrite)
    except RecipeError as exc:
        message = str(exc)
        raise RecipeError(message if message.startswith(recipe.source) else f"{recipe.source}: {message}") from exc


def _rehearse(recipe: Recipe, *, overrides: dict | None, steps: int, output_dir: str | None, console,
              progress: bool, device: str, overwrite: bool) -> Rehearsal:
    from calibrl.trl.recipes import check_trainer_fields

    name = Path(recipe.source).stem

    trainer = {**check_trainer_fields(recipe.trainer, recipe.source),
               **check_trainer_fields(dict(overrides or {}), recipe.source, "overrides")}
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RecipeError("device 'cuda': torch sees no GPU")
        bf16_ok = torch.cuda.is_bf16_supported()
    else:
        bf16_ok = cpu_supports_bf16()
    mapped, notes = map_trainer_settings(trainer, name=name, bf16_ok=bf16_ok, steps=steps, output_dir=output_dir,
                                         device=device)
    # the folder is held from here to the end, the replacement of the last rehearsal included (calibrl train's own
    # lock, which train() takes again, re-entrantly): a second rehearsal into it is refused, not removed under it
    try:
        with folder_lock(mapped["output_dir"], what="calibrl train --rehearse") as stale:
            if stale:
                console.print(stale, markup=False, highlight=False, soft_wrap=True)
            return _rehearse_held(recipe, mapped, notes, name=name, steps=steps, output_dir=output_dir,
                                  console=console, progress=progress, device=device, overwrite=overwrite,
                                  bf16_ok=bf16_ok)
    except FolderInUse as exc:
        raise RecipeError(f"{recipe.source}: {exc}") from None


def _rehearse_held(recipe: Recipe, mapped: dict, notes: list[str], *, name: str, steps: int, output_dir: str | None,
                   console, progress: bool, device: str, overwrite: bool, bf16_ok: bool) -> Rehearsal:
    """The rehearsal, its output folder held (:func:`_rehearse`)."""
    from calibrl.trl.train import train

    rehearsed = copy.deepcopy(recipe)
    rehearsed.trainer = mapped
    for section, rows in (("dataset", LAYOUT["train_rows"]), ("eval_dataset", LAYOUT["eval_rows"]),
                          ("calibration_eval_dataset", None)):
        label = "calibration_eval.dataset" if section.startswith("calibration") else section
        spec, more = map_dataset(getattr(rehearsed, section), label)
        notes += more
        if spec is not None and rows is not None and (spec.limit is None or spec.limit > rows):
            notes.append(f"{label}.limit: {spec.limit} -> {rows} (a few rows are enough for {steps} steps)")
            spec = dataclasses.replace(spec, limit=rows)
        setattr(rehearsed, section, spec)
    if rehearsed.calibration_eval is not None:
        config = rehearsed.calibration_eval
        for key, cap in (("prompts", LAYOUT["calibration_prompts"]), ("k", LAYOUT["calibration_k"])):
            if getattr(config, key) > cap:
                notes.append(f"calibration_eval.{key}: {getattr(config, key)} -> {cap} (a small held-out check)")
                setattr(config, key, cap)
        if config.max_new_tokens is None or config.max_new_tokens > LAYOUT["max_completion_length"]:
            notes.append(f"calibration_eval.max_new_tokens: {config.max_new_tokens} -> "
                         f"{LAYOUT['max_completion_length']} (a few tokens per completion)")
            config.max_new_tokens = LAYOUT["max_completion_length"]
    result = Rehearsal(recipe=rehearsed, notes=notes)
    unit = "the GPU" if device == "cuda" else "the CPU"
    console.print(f"rehearsing {recipe.source} on {unit} ({steps} optimizer steps); changed for {unit}:",
                  markup=False, highlight=False, soft_wrap=True)
    with tempfile.TemporaryDirectory(prefix="calibrl-rehearse-") as folder:
        if recipe.model.name_or_path == TINY:
            notes.append("model.name_or_path: builtin:tiny is CPU-sized already: used as is")
        else:
            dtype, init_kwargs, more = map_model_settings(recipe.model, bf16_ok=bf16_ok, device=device)
            notes += more
            result.model_class, result.vocab_size, result.tokenizer = _write_stand_in(recipe, Path(folder), notes)
            rehearsed.model = dataclasses.replace(recipe.model, name_or_path=folder, tokenizer=None, dtype=dtype,
                                                  init_kwargs=init_kwargs)
        for note in notes:
            console.print(f"  {note}", markup=False, highlight=False, soft_wrap=True)
        if output_dir is None and Path(mapped["output_dir"]).is_dir():  # calibrl's own folder: the last rehearsal
            shutil.rmtree(mapped["output_dir"])
            console.print(f"  (replaced the previous rehearsal in {mapped['output_dir']})", markup=False,
                          highlight=False, soft_wrap=True)
        # without the rich bar, the printed step lines stand in for it: no transformers tqdm bar among them
        with contextlib.nullcontext() if progress else quiet_transformers_bars():
            result.result = train(rehearsed, overwrite=overwrite, overrides={} if progress else {"disable_tqdm": True},
                                  progress=progress, console=console,
                                  callbacks=[_step_callback(console, steps=steps, rehearsal=result,
                                                             print_steps=not progress)])
    done = result.result["global_step"]
    if done != steps:
        raise RuntimeError(f"{recipe.source}: the rehearsal ran {done} optimizer steps, not {steps}")
    classes = f"; logits over {result.logits_classes:,} classes" if result.logits_classes else ""
    console.print(f"rehearsal passed: {name}: {done} optimizer steps through the real training path{classes}; "
                  f"output in {result.result['output_dir']}", markup=False, highlight=False, soft_wrap=True)
    return result
