"""``calibrl train RECIPE --rehearse``: every shipped recipe runs 2 optimizer steps on the CPU through the real
training path, with its own architecture at tiny width and real vocabulary, the shipped sample data, each
GPU-only setting mapped with a note, and no network access at all."""

import io
import json
import re
import socket
from pathlib import Path

import pytest
from rich.console import Console

from calibrl.trl.recipes import shipped_recipes

RECIPES = sorted(shipped_recipes())
# the embedding and logit size of the real checkpoints: 151,936 for Qwen2.5 up to 3B and Qwen3, 152,064 for Qwen2.5-7B
QWEN_VOCABS = {151936, 152064}


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No hub, an empty HF_HOME, and every TCP connection recorded and refused (the list must stay empty)."""
    attempts = []
    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            attempts.append(address)
            raise OSError(f"network disabled in this test: {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    return attempts


def _expected_notes(recipe, *, bf16_ok: bool) -> list[str]:
    """The note prefixes a recipe's GPU-only settings must produce, read off the recipe itself."""
    from calibrl.tasks.datasets import HUB

    t = recipe.trainer
    expected = []
    if t.get("use_vllm"):
        expected.append("trainer.use_vllm: true -> false")
    if t.get("bf16"):
        expected.append("trainer.bf16: true kept" if bf16_ok else "trainer.bf16: true -> false")
    if t.get("fp16"):
        expected.append("trainer.fp16: true -> false")
    for key in ("deepspeed", "fsdp"):
        if t.get(key):
            expected.append(f"trainer.{key}:")
    if t.get("num_generations", 8) > 2:
        expected.append(f"trainer.num_generations: {t.get('num_generations', '<unset>')} -> 2")
    if t.get("max_completion_length", 256) > 8:
        expected.append("trainer.max_completion_length:")
    if t.get("max_steps") != 2:
        expected.append("trainer.max_steps:")
    if recipe.model.dtype == "bfloat16":
        expected.append("model.dtype: bfloat16 kept" if bf16_ok else "model.dtype: bfloat16 -> float32")
    for section, spec in (("dataset", recipe.dataset), ("eval_dataset", recipe.eval_dataset)):
        if spec is not None and spec.path is None and spec.name in HUB:
            expected.append(f"{section}: hub dataset {spec.name!r} -> data/")
    if recipe.model.name_or_path != "builtin:tiny":
        expected.append(f"model.name_or_path: {recipe.model.name_or_path} -> ")
    return expected


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_every_shipped_recipe_rehearses_on_the_cpu(name, tmp_path, offline, capfd):
    from calibrl.trl.rehearse import ARCHITECTURES, cpu_supports_bf16, rehearse
    from calibrl.trl.train import load_recipe

    recipe = load_recipe(name)
    out = io.StringIO()
    rehearsal = rehearse(recipe, output_dir=str(tmp_path / "run"), progress=False,
                         console=Console(file=out, width=200))
    printed = out.getvalue()

    # two optimizer steps, each logged, through the real train(): state, log file and checkpoint agree
    assert rehearsal.result["global_step"] == 2
    losses = [entry for entry in rehearsal.result["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in losses] == [1, 2]
    lines = [json.loads(line) for line in (tmp_path / "run" / "log_history.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == [1, 2]
    if rehearsal.recipe.trainer.get("save_strategy", "steps") == "steps":
        state = json.loads((tmp_path / "run" / "checkpoint-2" / "trainer_state.json").read_text())
        assert state["global_step"] == 2

    # one note per mapped setting, all printed, then a line per step and the verdict
    for prefix in _expected_notes(recipe, bf16_ok=cpu_supports_bf16()):
        assert any(note.startswith(prefix) for note in rehearsal.notes), (prefix, rehearsal.notes)
    for note in rehearsal.notes:
        assert note in printed
    assert "rehearsal step 1/2:" in printed and "rehearsal step 2/2:" in printed
    assert printed.rstrip().splitlines()[-1].startswith("rehearsal passed")
    # and the Trainer's tqdm bar (no description) is not drawn among the step lines (the once-per-machine
    # conversion of a GGUF tokenizer source, in a fresh cache, may still show its own bars)
    assert not re.search(r"(^|\r)\s*\d+%\|", capfd.readouterr().err, flags=re.MULTILINE)

    # the mapped run is CPU-only and small, whatever the recipe asked for
    mapped = rehearsal.recipe.trainer
    assert mapped["use_cpu"] is True and not mapped.get("use_vllm") and not mapped.get("deepspeed")
    assert mapped["max_steps"] == 2 and mapped.get("max_completion_length", 256) <= 8
    for spec in (rehearsal.recipe.dataset, rehearsal.recipe.eval_dataset):
        assert spec is None or spec.path is None or Path(spec.path).is_file()

    # the recipe's own architecture with its real vocabulary: the trained model's logits have that many classes
    if recipe.model.name_or_path in ARCHITECTURES:
        real = ARCHITECTURES[recipe.model.name_or_path]
        assert rehearsal.model_class == real["architectures"][0]
        assert rehearsal.vocab_size == rehearsal.logits_classes == real["vocab_size"] and real["vocab_size"] in QWEN_VOCABS
    elif recipe.model.name_or_path.startswith("builtin:smollm2"):
        assert rehearsal.model_class == "LlamaForCausalLM" and rehearsal.logits_classes == 49152
    assert rehearsal.logits_classes is not None

    # nothing downloaded: no connection was even tried, and the empty HF_HOME holds no hub files
    assert offline == []
    hub = tmp_path / "hf_home" / "hub"
    assert not hub.exists() or not [p for p in hub.rglob("*") if p.is_file()]


def test_gpu_only_settings_map_to_the_cpu_with_a_note_each():
    from calibrl.trl.rehearse import map_trainer_settings

    trainer = {"bf16": True, "fp16": False, "use_vllm": True, "deepspeed": "ds_zero2.json", "fsdp": "full_shard",
               "fsdp_config": {"x": 1}, "use_liger_kernel": True, "per_device_train_batch_size": 8,
               "gradient_accumulation_steps": 8, "steps_per_generation": 16, "num_generations": 8,
               "max_completion_length": 3072, "report_to": "wandb", "activation_checkpointing": True,
               "learning_rate": 1e-6}
    mapped, notes = map_trainer_settings(trainer, name="r", bf16_ok=False)
    assert mapped["bf16"] is False and mapped["use_vllm"] is False and mapped["use_liger_kernel"] is False
    assert "deepspeed" not in mapped and "fsdp" not in mapped and "fsdp_config" not in mapped
    assert mapped["report_to"] == "none" and mapped["output_dir"] == str(Path("runs") / "rehearse" / "r")
    # settings a CPU runs are kept untouched
    assert mapped["activation_checkpointing"] is True and mapped["learning_rate"] == 1e-6
    keys = [note.split(":", 1)[0] for note in notes]
    for key in ("bf16", "use_vllm", "deepspeed", "fsdp", "use_liger_kernel", "report_to", "max_completion_length",
                "num_generations", "max_steps"):
        assert keys.count(f"trainer.{key}") == 1, (key, notes)
    assert not any(k in keys for k in ("trainer.fp16", "trainer.activation_checkpointing",
                                       "trainer.learning_rate"))
    # a CPU with native bfloat16 keeps bf16, and says so
    kept, kept_notes = map_trainer_settings(trainer, name="r", bf16_ok=True)
    assert kept["bf16"] is True and [n for n in kept_notes if n.startswith("trainer.bf16")] == [
        "trainer.bf16: true kept (this CPU computes bfloat16 natively)"]
    assert map_trainer_settings({"fp16": True}, name="r", bf16_ok=True)[0]["fp16"] is False


def test_a_gpu_rehearsal_keeps_the_precision_and_drops_use_cpu():
    from calibrl.trl.recipes import ModelSpec
    from calibrl.trl.rehearse import map_model_settings, map_trainer_settings

    trainer = {"bf16": True, "use_vllm": True, "deepspeed": "ds.json", "use_cpu": True, "num_generations": 8,
               "per_device_train_batch_size": 8, "max_completion_length": 3072}
    mapped, notes = map_trainer_settings(trainer, name="r", bf16_ok=True, device="cuda")
    assert "use_cpu" not in mapped and mapped["bf16"] is True and mapped["use_vllm"] is False
    assert "deepspeed" not in mapped and mapped["max_completion_length"] == 8
    assert "trainer.bf16: true kept (this GPU computes bfloat16 natively)" in notes
    assert any(n.startswith("trainer.use_cpu: true -> <unset>") for n in notes)
    # float16 is a GPU's to keep; bfloat16 falls back on a GPU without it
    assert map_trainer_settings({"fp16": True}, name="r", bf16_ok=False, device="cuda")[0]["fp16"] is True
    assert map_trainer_settings({"bf16": True}, name="r", bf16_ok=False, device="cuda")[0]["bf16"] is False
    assert map_model_settings(ModelSpec("m", dtype="float16"), bf16_ok=True, device="cuda")[0] == "float16"
    assert map_model_settings(ModelSpec("m", dtype="bfloat16"), bf16_ok=False, device="cuda")[1:] == (
        {}, ["model.dtype: bfloat16 -> float32 (this GPU has no native bfloat16)"])


def test_a_gpu_rehearsal_without_a_gpu_is_refused(monkeypatch):
    import torch

    from calibrl.trl.recipes import RecipeError, load_recipe
    from calibrl.trl.rehearse import rehearse

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = load_recipe(RECIPES[0])
    with pytest.raises(RecipeError, match="torch sees no GPU"):
        rehearse(recipe, device="cuda", console=Console(file=io.StringIO()))
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        rehearse(recipe, device="tpu")


def test_model_dtype_and_attention_map_to_the_cpu():
    from calibrl.trl.recipes import ModelSpec
    from calibrl.trl.rehearse import map_model_settings

    spec = ModelSpec("Qwen/Qwen3-1.7B", dtype="bfloat16",
                     init_kwargs={"attn_implementation": "flash_attention_2", "device_map": "auto"})
    dtype, init_kwargs, notes = map_model_settings(spec, bf16_ok=False)
    assert dtype == "float32" and init_kwargs == {"attn_implementation": "sdpa"} and len(notes) == 3
    assert notes[0] == "model.dtype: bfloat16 -> float32 (this CPU has no native bfloat16)"
    assert map_model_settings(spec, bf16_ok=True)[0] == "bfloat16"
    assert map_model_settings(ModelSpec("m", dtype="float16"), bf16_ok=True)[0] == "float32"


@pytest.mark.parametrize("name", RECIPES)
def test_rehearsal_layout_keeps_trls_divisibility_and_generation_reuse(name):
    from calibrl.trl.rehearse import rehearsal_layout
    from calibrl.trl.train import load_recipe

    trainer = load_recipe(name).trainer
    layout = rehearsal_layout(trainer, num_generations=2)
    g = layout["num_generations"]
    rounds = layout["steps_per_generation"] or layout["gradient_accumulation_steps"]
    assert (layout["per_device_train_batch_size"] * rounds) % g == 0
    assert layout["per_device_eval_batch_size"] % g == 0
    recipe_rounds = trainer.get("steps_per_generation") or trainer.get("gradient_accumulation_steps", 1)
    reused = recipe_rounds > trainer.get("gradient_accumulation_steps", 1)
    assert (layout["steps_per_generation"] == 2) == reused  # CAPO / GRPO twins: one generation, two updates


def test_tiny_width_keeps_the_architecture_and_the_vocabulary():
    from transformers import AutoConfig

    from calibrl.trl.rehearse import ARCHITECTURES, tiny_width

    for name, real in ARCHITECTURES.items():
        small = tiny_width(real, hidden=64, layers=2, heads=4, intermediate=128)
        assert small["vocab_size"] == real["vocab_size"] in QWEN_VOCABS
        assert small["model_type"] == real["model_type"] and small["tie_word_embeddings"] == real["tie_word_embeddings"]
        assert small["head_dim"] * small["num_attention_heads"] == 64
        assert small["num_attention_heads"] % small["num_key_value_heads"] == 0
        fields = dict(small)
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        assert config.rope_parameters["rope_theta"] == real["rope_theta"], name
    # grouped-query ratio: Qwen3-1.7B has 16 heads over 8 kv heads (2 per group): 4 heads -> 2 kv heads
    assert tiny_width(ARCHITECTURES["Qwen/Qwen3-1.7B"], heads=4)["num_key_value_heads"] == 2
    assert tiny_width(ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"], heads=4)["num_key_value_heads"] == 1


def test_a_local_config_is_read_before_the_table(tmp_path):
    from calibrl.trl.recipes import RecipeError
    from calibrl.trl.rehearse import model_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 1234}))
    fields, source = model_config(str(tmp_path))
    assert fields["vocab_size"] == 1234 and str(tmp_path) in source
    assert model_config("Qwen/Qwen3-1.7B")[0]["vocab_size"] == 151936
    with pytest.raises(RecipeError, match="no-such/model"):
        model_config("no-such/model")


def test_hub_datasets_become_the_shipped_samples_of_the_same_format():
    from calibrl.tasks.registry import get_dataset_loader
    from calibrl.trl.recipes import DatasetSpec
    from calibrl.trl.rehearse import map_dataset

    aime, notes = map_dataset(DatasetSpec(name="aime25", options={"template": "qwen-math"}), "eval_dataset")
    assert Path(aime.path).name == "deepscaler.jsonl" and len(notes) == 1
    rows = get_dataset_loader("aime25")(path=aime.path, template="qwen-math")
    assert len(rows) >= 1 and set(rows[0]) >= {"prompt", "answer"}
    local = DatasetSpec(name="deepscaler", path="mine.jsonl")
    assert map_dataset(local, "dataset") == (local, [])


@pytest.mark.slow
def test_cli_rehearse(tmp_path, offline):
    from typer.testing import CliRunner

    from calibrl.cli import app

    result = CliRunner().invoke(app, ["train", "tiny_cpu", "--rehearse", "--output-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "rehearsal passed" in result.output and (tmp_path / "run" / "log_history.jsonl").is_file()
    bad = CliRunner().invoke(app, ["train", "tiny_cpu", "--rehearse", "--resume"])
    assert bad.exit_code == 2 and "--resume" in bad.output


@pytest.mark.slow
def test_a_cpu_without_bfloat16_rehearses_in_float32(tmp_path, offline, monkeypatch):
    import calibrl.trl.rehearse as rehearse_module
    from calibrl.trl.train import load_recipe

    monkeypatch.setattr(rehearse_module, "cpu_supports_bf16", lambda: False)
    rehearsal = rehearse_module.rehearse(load_recipe("grpo_qwen2.5-math-1.5b_deepscaler"),
                                         output_dir=str(tmp_path / "run"), progress=False,
                                         console=Console(file=io.StringIO(), width=200))
    assert rehearsal.result["global_step"] == 2
    assert "trainer.bf16: true -> false (this CPU has no native bfloat16: float32)" in rehearsal.notes
    assert "model.dtype: bfloat16 -> float32 (this CPU has no native bfloat16)" in rehearsal.notes
    assert rehearsal.recipe.trainer["bf16"] is False and rehearsal.recipe.model.dtype == "float32"
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["dtype"] == "float32" and config["vocab_size"] == 151936  # Qwen2.5-Math-1.5B's
    assert offline == []


def test_cpu_bf16_detection_agrees_with_the_kernels_cpu_flags():
    import platform

    from calibrl.trl.rehearse import cpu_supports_bf16

    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() not in ("x86_64", "AMD64") or not cpuinfo.is_file():
        pytest.skip("reads the x86 CPU flags of Linux")
    flags = set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    assert cpu_supports_bf16() == bool({"avx512_bf16", "amx_bf16", "amx_tile"} & flags)


def test_a_cached_hub_config_and_tokenizer_are_used(tmp_path, monkeypatch):
    """A config and tokenizer in the hub cache (as a past download leaves them) win over the table and the
    built-in tokenizer; read with local files only."""
    import huggingface_hub.constants as hub_constants
    from transformers import AutoTokenizer

    from calibrl.models import resolve_model
    from calibrl.trl.rehearse import ARCHITECTURES, _stand_in_tokenizer, model_config

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-1.7B" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    cached = {**ARCHITECTURES["Qwen/Qwen3-1.7B"], "vocab_size": 151_700}  # distinguishable from the table's
    (snapshot / "config.json").write_text(json.dumps(cached))
    AutoTokenizer.from_pretrained(resolve_model("builtin:smollm2-135m-instruct", quiet=True)).save_pretrained(snapshot)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    fields, source = model_config("Qwen/Qwen3-1.7B")
    assert fields["vocab_size"] == 151_700 and source.startswith("cached")
    tokenizer, where = _stand_in_tokenizer("Qwen/Qwen3-1.7B")
    assert where == "Qwen/Qwen3-1.7B (cached)" and len(tokenizer) == 49152
