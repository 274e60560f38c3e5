"""The dtype option (``--dtype`` of generate and demo, a recipe's ``model.dtype``): it reaches the loaded model,
an unknown name is refused in one line before anything loads, and bfloat16 log-probs stay within the stated
tolerance of float32's."""

import json
from pathlib import Path

import pytest
import torch

from calibrl.models import BF16_LOGPROB_TOLERANCE, DTYPES, check_dtype, cpu_bf16_supported, resolve_dtype
from calibrl.models import TinyModelConfig, build_tiny_model, save_tiny_model

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TinyModelConfig(max_position_embeddings=512))


def test_dtype_names_and_auto():
    assert [resolve_dtype(n) for n in ("float32", "bfloat16", "float16")] == [torch.float32, torch.bfloat16,
                                                                              torch.float16]
    assert resolve_dtype("auto", device="cpu") is torch.float32  # the CPU default stays float32
    for bad in ("bf16", "float", "int8", None):
        with pytest.raises(ValueError) as info:
            check_dtype(bad, field="model.dtype")
        message = str(info.value)
        assert "\n" not in message and "model.dtype" in message and repr(bad) in message
        assert all(name in message for name in DTYPES)


def test_cpu_bf16_detection_matches_cpuinfo():
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else None
    if flags is None:
        pytest.skip("no /proc/cpuinfo")
    assert cpu_bf16_supported() == bool({"avx512_bf16", "amx_bf16"} & flags)


# ---------------------------------------------------------------------------------------------- generate


def test_generate_dtype_reaches_the_model(tiny_dir, tmp_path):
    from calibrl.evaluation.backends import open_backend
    from calibrl.evaluation.generate import GenerateConfig, generate

    def loaded(model, dtype):
        config = GenerateConfig(model=model, dataset="math500", out=tmp_path / "x.jsonl", dtype=dtype)
        backend, _ = open_backend(config)
        return {p.dtype for p in backend.model.parameters()}

    for model in (str(tiny_dir), "builtin:tiny"):
        assert loaded(model, "auto") == {torch.float32}  # the default: nothing changes on the CPU
        assert loaded(model, "bfloat16") == {torch.bfloat16}
        assert loaded(model, "float32") == {torch.float32}

    out = tmp_path / "bf16.jsonl"
    summary = generate(model=str(tiny_dir), dataset="math500", path=str(FIXTURES / "math500.jsonl"), n=2, limit=2,
                       max_new_tokens=6, template="none", progress=False, out=out, dtype="bfloat16")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["samples_written"] == 4 and all(r["logprob_mean"] < 0 for r in rows)
    assert json.loads((tmp_path / "bf16.jsonl.meta.json").read_text())["dtype"] == "bfloat16"


def test_generate_refuses_to_resume_in_another_dtype(tiny_dir, tmp_path):
    from calibrl.evaluation.generate import GenerateError, generate

    kw = dict(model=str(tiny_dir), dataset="math500", path=str(FIXTURES / "math500.jsonl"), n=1, max_new_tokens=4,
              template="none", progress=False, out=tmp_path / "s.jsonl")
    generate(limit=1, **kw)
    with pytest.raises(GenerateError, match=r"dtype: 'auto' -> 'bfloat16'"):
        generate(limit=2, dtype="bfloat16", **kw)


def test_generate_cli_refuses_an_unknown_dtype_in_one_line(tiny_dir, tmp_path):
    from typer.testing import CliRunner

    from calibrl.cli import app

    out = tmp_path / "cli.jsonl"
    result = CliRunner().invoke(app, ["generate", "--model", str(tiny_dir), "--dataset", "math500", "--path",
                                      str(FIXTURES / "math500.jsonl"), "--out", str(out), "--dtype", "bf16"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "unknown dtype 'bf16'" in lines[0] and "bfloat16" in lines[0]
    assert not out.exists()  # refused before anything loads or is written


# ---------------------------------------------------------------------------------------------- recipe


def _recipe(model_section: dict):
    from calibrl.trl.recipes import parse_recipe

    return parse_recipe({
        "model": model_section,
        "dataset": {"name": "deepscaler", "path": str(ROOT / "calibrl/recipes/data/deepscaler.jsonl"),
                    "template": "none", "limit": 4},
        "rewards": ["math"],
        "trainer": {"per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 4,
                    "max_steps": 1, "use_cpu": True, "bf16": False, "report_to": "none", "save_strategy": "no",
                    "gradient_checkpointing": False, "learning_rate": 1e-3},
    }, source="recipe.yaml")


def test_recipe_dtype_reaches_the_model_and_trains(tiny_dir, tmp_path):
    from calibrl.trl.train import build_trainer

    peft = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    trainer = build_trainer(_recipe({"name_or_path": str(tiny_dir), "dtype": "bfloat16", "peft": peft}),
                            overrides={"output_dir": str(tmp_path / "out")})
    base = {p.dtype for n, p in trainer.model.named_parameters() if "lora_" not in n}
    adapters = {p.dtype for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert base == {torch.bfloat16}
    assert adapters == {torch.float32}  # peft keeps the trained weights (and AdamW's state) in float32
    trainer.train()  # a step of sampling, scoring and backward through the bf16 base
    assert trainer.state.global_step == 1
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters() if p.requires_grad)

    default = build_trainer(_recipe({"name_or_path": str(tiny_dir)}), overrides={"output_dir": str(tmp_path / "d")})
    assert {p.dtype for p in default.model.parameters()} == {torch.float32}


def test_recipe_refuses_an_unknown_dtype():
    from calibrl.trl.recipes import RecipeError

    with pytest.raises(RecipeError) as info:
        _recipe({"name_or_path": "some/model", "dtype": "bf16"})
    assert "\n" not in str(info.value) and "recipe.yaml" in str(info.value) and "model.dtype" in str(info.value)


# ---------------------------------------------------------------------------------------------- demo


def test_demo_dtype_reaches_the_trainer(monkeypatch, tmp_path):
    import calibrl.trl
    from calibrl.testbed.realmodel import RealModelRunConfig, train_real_model

    seen = {}

    class Stop(Exception):
        pass

    class Recorder:
        def __init__(self, *, args, **kwargs):
            seen["model_init_kwargs"] = args.model_init_kwargs
            raise Stop

    monkeypatch.setattr(calibrl.trl, "CalibratedGRPOTrainer", Recorder)
    for dtype in ("bfloat16", "float32"):
        with pytest.raises(Stop):
            train_real_model(RealModelRunConfig(model="unused", dtype=dtype, train_prompts=8, eval_prompts=4),
                             tmp_path / dtype)
        assert seen["model_init_kwargs"]["dtype"] == dtype
    with pytest.raises(ValueError, match="unknown dtype 'bf16'"):
        RealModelRunConfig(dtype="bf16")


def test_demo_cli_dtype(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import calibrl.testbed.realmodel as realmodel
    from calibrl.cli import app

    calls = {}

    def fake_demo(out, **kwargs):
        calls.update(kwargs)
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "report.md").write_text("# r\n\n## What this run shows\n\n- fine\n\n## Held-out evaluations\n")
        return Path(out) / "report.md"

    monkeypatch.setattr(realmodel, "run_real_model_demo", fake_demo)
    ok = CliRunner().invoke(app, ["demo", "--model", "builtin:smollm2-135m-instruct", "--dtype", "bfloat16",
                                  "--out", str(tmp_path / "d")])
    assert ok.exit_code == 0, ok.output
    assert calls["dtype"] == "bfloat16"
    bad = CliRunner().invoke(app, ["demo", "--model", "builtin:smollm2-135m-instruct", "--dtype", "bf16",
                                   "--out", str(tmp_path / "e")])
    assert bad.exit_code == 2 and "unknown dtype 'bf16'" in bad.output and not (tmp_path / "e").exists()
    tiny = CliRunner().invoke(app, ["demo", "--dtype", "bfloat16", "--out", str(tmp_path / "f")])
    assert tiny.exit_code == 2 and "--model" in tiny.output and not (tmp_path / "f").exists()


# ---------------------------------------------------------------------------------------------- log-probs


def _sequence_logprob_means(model, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Mean token log-prob of each row's tokens after ``prompt_len`` (log_softmax in float32). ids [B, L] -> [B]."""
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, prompt_len - 1: -1]  # [B, L - P, V]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)
    return logp.mean(dim=1)


def test_bf16_logprob_error_within_the_stated_tolerance():
    # a tiny model made about as peaked as a trained LM: lm_head x 5 gives logits of std ~1 and sampled
    # completions with a mean token log-prob between about -2.3 and -0.3 (random init alone is near-uniform)
    model, _ = build_tiny_model(config=TinyModelConfig(max_position_embeddings=128), seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)
    model.eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (32, 48), generator=g)  # [B, L]: 16 prompt + 32 sampled
    with torch.no_grad():  # completions sampled from the float32 model at T = 1
        for position in range(16, 48):
            probs = torch.softmax(model(input_ids=ids[:, :position]).logits[:, -1].float(), dim=-1)
            ids[:, position] = torch.multinomial(probs, 1, generator=g).squeeze(1)
    fp32 = _sequence_logprob_means(model, ids, 16)
    bf16_model, _ = build_tiny_model(config=TinyModelConfig(max_position_embeddings=128), seed=3)
    bf16_model.load_state_dict(model.state_dict())
    bf16 = _sequence_logprob_means(bf16_model.to(torch.bfloat16).eval(), ids, 16)
    error = (bf16 - fp32).abs()
    assert fp32.min() > -5 and fp32.max() < -0.05  # the regime of real completions, not a near-uniform toy
    assert error.max() > 1e-4  # bfloat16 really ran: float32 twice agrees to ~1e-6
    assert error.max() <= BF16_LOGPROB_TOLERANCE
