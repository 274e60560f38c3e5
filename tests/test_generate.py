"""``calibrl generate`` on the tiny model and local dataset files: log-probs of the sampling distribution,
decision class probabilities, resumability, the CLI, and the vLLM result conversion (stubbed vLLM)."""

import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from calibrl.evaluation.backends import decision_fields, _Sample, _TransformersBackend
from calibrl.evaluation.generate import GenerateError, generate, scan_existing
from calibrl.models import TinyModelConfig, build_tiny_model, save_tiny_model
from calibrl.tasks.registry import get_dataset_loader

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TinyModelConfig(max_position_embeddings=512))


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(config=TinyModelConfig(max_position_embeddings=512), seed=0)


def _reference_logps(model, tokenizer, prompt, ids, temperature):
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1]
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.0])
def test_recorded_logprobs_are_the_sampling_distribution(tiny, temperature):
    model, tokenizer = tiny
    backend = _TransformersBackend(model, tokenizer, temperature=temperature, max_new_tokens=10, class_ids=None)
    prompts = ["What is 2+3?", "Hi"]  # different lengths: left padding must not shift anything
    groups = backend.generate(prompts, 3, seed=1)
    assert [len(g) for g in groups] == [3, 3]
    for prompt, group in zip(prompts, groups):
        for sample in group:
            expected = _reference_logps(model, tokenizer, prompt, sample.ids, temperature)
            assert torch.allclose(torch.tensor(sample.logps), expected, atol=1e-4)
            if sample.ended:
                assert sample.ids[-1] == tokenizer.eos_token_id


def test_generate_math_rows_and_resume(tiny_dir, tmp_path):
    out = tmp_path / "samples.jsonl"
    kw = dict(model=str(tiny_dir), dataset="deepscaler", path=str(FIXTURES / "deepscaler.jsonl"), n=3,
              max_new_tokens=8, template="none", batch_size=2, progress=False, out=out)
    first = generate(limit=2, **kw)
    assert first["samples_written"] == 6 and first["backend"] == "transformers"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == ["deepscaler-0"] * 3 + ["deepscaler-1"] * 3
    for r in rows:
        assert {"prompt_id", "benchmark", "completion", "answer", "correct", "reward", "logprob_mean", "n_tokens"} <= set(r)
        assert r["benchmark"] == "deepscaler" and r["logprob_mean"] <= 0 and r["n_tokens"] >= 1
        assert r["correct"] == (r["reward"] > 0.5)
    assert json.loads((tmp_path / "samples.jsonl.meta.json").read_text())["n"] == 3

    # a rerun skips finished problems and only adds the new one
    before = out.read_text()
    again = generate(**kw)
    assert again["problems_skipped"] == 2 and again["samples_written"] == 3
    assert out.read_text().startswith(before)

    # a killed run: torn last line and an unfinished problem -> dropped, regenerated
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-2]) + lines[-2][:15])
    resumed = generate(**kw)
    assert resumed["problems_skipped"] == 2 and resumed["samples_written"] == 3
    final = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(final) == 9 and sorted({r["prompt_id"] for r in final}) == ["deepscaler-0", "deepscaler-1", "deepscaler-3"]

    # other settings on the same file: refused, unless overwrite
    with pytest.raises(GenerateError, match="other settings"):
        generate(**{**kw, "n": 4})
    fresh = generate(**{**kw, "n": 2, "overwrite": True})
    assert fresh["samples_written"] == 6


def test_samples_load_in_calibrl_eval_format(tiny_dir, tmp_path):
    import calibrl.evaluation.samples as samples_module
    out = tmp_path / "s.jsonl"
    generate(model=str(tiny_dir), dataset="aime25", path=str(FIXTURES / "aime25.jsonl"), n=2, max_new_tokens=6,
             template="none", progress=False, out=out)
    samples = samples_module.load_samples(out)
    assert len(samples.correct) == 4 and samples.confidence_kind == "logprob_mean"


def _bias_towards(model, tokenizer, letters, amount=12.0):
    """Make the tiny model strongly prefer some letters (a forward hook on the output layer)."""
    bias = torch.zeros(len(tokenizer))
    for letter in letters:
        bias[tokenizer.convert_tokens_to_ids(letter)] = amount
    return model.lm_head.register_forward_hook(lambda module, inputs, output: output + bias)


def test_decision_class_probs_at_the_decision_token(tiny, tmp_path):
    model, tokenizer = tiny
    handle = _bias_towards(model, tokenizer, ["B", "C"])
    try:
        out = tmp_path / "d.jsonl"
        summary = generate(model="tiny", dataset="commonsenseqa", path=str(FIXTURES / "commonsenseqa.jsonl"), n=6,
                           max_new_tokens=1, progress=False, out=out, hf_model=model, hf_tokenizer=tokenizer)
        assert summary["samples_written"] == 12
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        dataset = get_dataset_loader("commonsenseqa")(path=FIXTURES / "commonsenseqa.jsonl")
        prompts = {r["prompt_id"]: r["prompt"] for r in dataset}
        for r in rows:
            assert r["classes"] == ["A", "B", "C", "D", "E"] and r["label"] in r["classes"]
            assert r["answer"] in ("B", "C") and r["completion"] == r["answer"]
            assert r["correct"] == (r["answer"] == r["label"])
            assert abs(sum(r["class_probs"]) - 1) < 1e-6
            assert r["decision_prob"] == pytest.approx(r["class_probs"][r["classes"].index(r["answer"])])
            # the recorded distribution is the model's next-token distribution after the prompt
            ids = tokenizer(prompts[r["prompt_id"]], add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                probs = torch.softmax(model(torch.tensor([ids])).logits[0, -1], -1)
            class_ids = [tokenizer.convert_tokens_to_ids(c) for c in r["classes"]]
            expected = probs[class_ids] / probs[class_ids].sum()
            assert torch.allclose(torch.tensor(r["class_probs"]), expected, atol=1e-4)
            assert r["class_mass"] == pytest.approx(probs[class_ids].sum().item(), abs=1e-4)
        import calibrl.evaluation.samples as samples_module
        loaded = samples_module.load_samples(out, confidence="class_probs")
        assert len(loaded.correct) == 12
    finally:
        handle.remove()


def test_decision_fields_rules():
    classes = ["A", "B", "C"]
    variants = ([10, 11, 12], [0, 1, 2])
    table = {0: [0.0, -1.0, -2.0], 2: [-3.0, -0.1, -3.0]}
    sample = _Sample(ids=[10, 5, 11], logps=[0.0, 0.0, 0.0], ended=False, class_logps=lambda p: table.get(p, [0.0] * 3))
    decision, probs, prob, mass = decision_fields(sample, "A x B", classes, variants)
    assert decision == "B" and probs.index(max(probs)) == 1 and prob == probs[1]  # the LAST class token (pos 2)
    # text "B" but spelt inside another token: the last class token is used
    decision, probs, prob, mass = decision_fields(sample, "xB", classes, variants)
    assert decision is None and probs.index(max(probs)) == 1 and prob == max(probs)
    # no class token at all: the position with the most class probability (here position 0, mass ~1.5)
    plain = _Sample(ids=[5, 6, 7], logps=[0.0] * 3, ended=False, class_logps=lambda p: table.get(p, [-9.0] * 3))
    decision, probs, prob, mass = decision_fields(plain, "nothing", classes, variants)
    assert decision is None and probs.index(max(probs)) == 0 and prob == max(probs)
    assert mass == pytest.approx(sum(math.exp(x) for x in table[0]))
    # no class probability anywhere (vLLM top-k without the classes): uniform
    empty = _Sample(ids=[5], logps=[0.0], ended=False, class_logps=lambda p: [float("-inf")] * 3)
    assert decision_fields(empty, "nothing", classes, variants)[1:] == ([1 / 3] * 3, 1 / 3, 0.0)


def test_cli_generate_and_bad_dataset(tiny_dir, tmp_path):
    from typer.testing import CliRunner

    from calibrl.cli import app

    out = tmp_path / "cli.jsonl"
    args = ["generate", "--model", str(tiny_dir), "--dataset", "math500", "--path", str(FIXTURES / "math500.jsonl"),
            "--n", "2", "--max-new-tokens", "4", "--template", "none", "--out", str(out), "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 4
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and "nothing to do" in result.output
    bad = CliRunner().invoke(app, ["generate", "--model", str(tiny_dir), "--dataset", "nope", "--out", str(out)])
    assert bad.exit_code == 2 and "unknown dataset" in bad.output


def test_vllm_backend_conversion_with_a_stub(monkeypatch, tiny_dir, tmp_path):
    """The vLLM path's result handling, with a stand-in ``vllm`` module (vLLM itself needs a GPU)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    seen = {}

    class Logprob:
        def __init__(self, logprob):
            self.logprob = logprob

    class LLM:
        def __init__(self, model, seed, dtype, logprobs_mode=None, **kwargs):
            seen["logprobs_mode"] = logprobs_mode

        def get_tokenizer(self):
            return tokenizer

        def generate(self, requests, params, use_tqdm=False):
            seen["params"] = params
            outputs = []
            for _ in requests:
                ids = tokenizer.encode(r"\boxed{5}", add_special_tokens=False) + [tokenizer.eos_token_id]
                logprobs = [{t: Logprob(-0.5)} for t in ids]
                completion = types.SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason="stop")
                outputs.append(types.SimpleNamespace(outputs=[completion] * params.n))
            return outputs

    class SamplingParams:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    stub = types.ModuleType("vllm")
    stub.LLM, stub.SamplingParams = LLM, SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", stub)
    out = tmp_path / "v.jsonl"
    summary = generate(model=str(tiny_dir), dataset="math500", path=str(FIXTURES / "math500.jsonl"), n=2,
                       max_new_tokens=16, template="none", backend="vllm", progress=False, out=out)
    # token confidences read raw by default, as the DeepConf authors read vLLM's log-probs
    assert summary["backend"] == "vllm" and seen["logprobs_mode"] == "raw_logprobs"
    # logprobs=20: DeepConf's token confidence (token_confidence_k, default 20) needs each step's top 20
    assert seen["params"].logprobs == 20 and seen["params"].top_p == 1.0 and seen["params"].temperature == 1.0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["correct"] for r in rows] == [True, True, False, False]  # gold 5, then 4
    assert all(r["logprob_mean"] == pytest.approx(-0.5) and r["answer"] == "5" and not r["truncated"] for r in rows)
    assert all(r["token_confidence"] == [0.5] * len(r["token_confidence"]) for r in rows)  # one entry returned
    for i, options in enumerate(({"token_confidence_at": "sampling"}, {"token_confidence_k": 0})):  # sampling's
        generate(model=str(tiny_dir), dataset="math500", path=str(FIXTURES / "math500.jsonl"), n=2, max_new_tokens=16,
                 template="none", backend="vllm", progress=False, out=tmp_path / f"{i}.jsonl", **options)
        assert seen["logprobs_mode"] == "processed_logprobs", options


def test_scan_existing_rejects_foreign_files(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\n')
    with pytest.raises(GenerateError, match="prompt_id"):
        scan_existing(f, 2)
    f.write_text("garbage\n{}\n")
    with pytest.raises(GenerateError, match="x.jsonl:1"):
        scan_existing(f, 2)


def test_logprob_mean_ignores_the_models_sampling_settings(tmp_path):
    """A generation_config.json with a repetition penalty, top-k, min-p, no-repeat n-grams and suppressed tokens
    (Qwen Instruct ships repetition_penalty 1.05): generate still samples from the model's own distribution at T,
    so logprob_mean equals the mean token log-prob of a plain forward pass."""
    model, tokenizer = build_tiny_model(config=TinyModelConfig(max_position_embeddings=512), seed=1)
    gc = model.generation_config
    gc.repetition_penalty, gc.do_sample, gc.top_k, gc.top_p, gc.min_p = 5.0, True, 3, 0.5, 0.2
    gc.no_repeat_ngram_size, gc.suppress_tokens = 2, [tokenizer.convert_tokens_to_ids("a")]
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    out = tmp_path / "s.jsonl"
    generate(model=str(tmp_path / "m"), dataset="deepscaler", path=str(FIXTURES / "deepscaler.jsonl"), n=4,
             max_new_tokens=12, template="none", progress=False, out=out, backend="transformers")
    prompts = {r["prompt_id"]: r["prompt"] for r in
               get_dataset_loader("deepscaler")(path=str(FIXTURES / "deepscaler.jsonl"), template="none")}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    checked = 0
    for r in rows:
        ids = tokenizer(r["completion"], add_special_tokens=False)["input_ids"]
        if len(ids) != r["n_tokens"]:  # a special token (EOS, unk) was dropped from the text: ids not recoverable
            continue
        checked += 1
        expected = _reference_logps(model.eval(), tokenizer, prompts[r["prompt_id"]], ids, 1.0).mean().item()
        assert r["logprob_mean"] == pytest.approx(expected, abs=1e-4)
    assert checked >= 6


def _fast(tiny_dir, out, **extra):
    """generate() keyword arguments for a quick run on the tiny model."""
    return dict(model=str(tiny_dir), n=2, max_new_tokens=4, template="none", batch_size=4, progress=False, out=out,
                backend="transformers", **extra)


def test_refuses_an_existing_samples_file_it_did_not_write(tiny_dir, tmp_path):
    out = tmp_path / "other.jsonl"
    foreign = "".join(json.dumps({"prompt_id": f"p{i // 5}", "sample_index": i % 5, "correct": True}) + "\n"
                      for i in range(12))  # another run's output: 5 samples per problem, last problem unfinished
    out.write_text(foreign)
    kw = _fast(tiny_dir, out, dataset="deepscaler", path=str(FIXTURES / "deepscaler.jsonl"))
    with pytest.raises(GenerateError, match=r"other\.jsonl.*--overwrite"):
        generate(**kw)
    assert out.read_text() == foreign and not (tmp_path / "other.jsonl.meta.json").exists()
    with pytest.raises((OSError, ValueError, GenerateError)):  # --overwrite, but no such model: the file stays
        generate(**{**kw, "overwrite": True, "model": str(tmp_path / "no-such-model")})
    assert out.read_text() == foreign and not (tmp_path / "other.jsonl.meta.json").exists()

    from typer.testing import CliRunner

    from calibrl.cli import app

    args = ["generate", "--model", str(tiny_dir), "--dataset", "deepscaler", "--path", str(FIXTURES / "deepscaler.jsonl"),
            "--n", "2", "--max-new-tokens", "4", "--template", "none", "--out", str(out), "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "other.jsonl" in result.output and out.read_text() == foreign
    result = CliRunner().invoke(app, args + ["--overwrite"])
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 6  # 3 problems with a gold answer x 2


def _repeated_ids_file(tmp_path) -> Path:
    rows = [{"problem": f"What is {i}+{i}?", "answer": str(2 * i), "unique_id": uid}
            for i, uid in enumerate(["a", "b", "a", "c", "b"])]  # no repeat among the first two
    path = tmp_path / "repeated.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prompt_ids_do_not_depend_on_the_limit(tmp_path):
    path = _repeated_ids_file(tmp_path)
    loader = get_dataset_loader("math500")
    full = loader(path=path)["prompt_id"]
    assert len(set(full)) == 5
    for limit in (1, 2, 3, 4):
        assert loader(path=path, limit=limit)["prompt_id"] == full[:limit]


def test_resume_with_a_larger_limit_never_duplicates_problems(tiny_dir, tmp_path):
    out = tmp_path / "s.jsonl"
    kw = _fast(tiny_dir, out, dataset="math500", path=str(_repeated_ids_file(tmp_path)))
    generate(limit=2, **kw)
    summary = generate(**kw)  # raising the limit appends the remaining problems
    assert summary["problems_skipped"] == 2 and summary["samples_written"] == 6
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = get_dataset_loader("math500")(path=kw["path"])["prompt_id"]
    assert len(rows) == 10 and sorted({r["prompt_id"] for r in rows}) == sorted(expected)
    with pytest.raises(GenerateError, match=r"n: 2 -> 3.*max_new_tokens: 4 -> 5"):
        generate(**{**kw, "n": 3, "max_new_tokens": 5})


def test_bad_outputs_and_settings_leave_nothing_behind(tiny_dir, tmp_path):
    kw = _fast(tiny_dir, tmp_path / "s.jsonl", dataset="deepscaler", path=str(FIXTURES / "deepscaler.jsonl"))
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(GenerateError, match="folder.*is a folder"):
        generate(**{**kw, "out": folder})
    assert not (tmp_path / "folder.meta.json").exists()
    for field, value in (("temperature", -1.0), ("temperature", float("nan")), ("max_new_tokens", 0), ("limit", 0)):
        with pytest.raises(GenerateError, match=field):
            generate(**{**kw, field: value})
    with pytest.raises((OSError, ValueError, GenerateError)):  # the model cannot be loaded
        generate(**{**kw, "model": str(tmp_path / "no-such-model")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]  # no stray samples or .meta.json


def test_dataset_given_as_a_file(tiny_dir, tmp_path):
    out = tmp_path / "s.jsonl"
    generate(**_fast(tiny_dir, out, dataset=str(FIXTURES / "math500.jsonl")))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * 2 and {r["benchmark"] for r in rows} == {"math500"}
    assert rows[0]["prompt_id"] == "test/prealgebra/1.json" and rows[0]["gold"] == "5"
    out2 = tmp_path / "d.jsonl"
    generate(**{**_fast(tiny_dir, out2, dataset=str(FIXTURES / "commonsenseqa.jsonl")), "template": "direct"})
    rows = [json.loads(line) for line in out2.read_text().splitlines()]
    assert rows[0]["classes"] == ["A", "B", "C", "D", "E"] and rows[0]["label"] == "B"
    with pytest.raises(GenerateError, match="--dataset NAME --path FILE"):
        generate(**_fast(tiny_dir, tmp_path / "x.jsonl", dataset="nope"))
    with pytest.raises(GenerateError, match="does not exist"):
        generate(**_fast(tiny_dir, tmp_path / "x.jsonl", dataset=str(tmp_path / "missing.jsonl")))


class _ScriptedBackend:
    """A backend that records the prompts it is given and 'samples' fixed texts, in order, for every prompt."""

    name = "scripted"

    def __init__(self, texts):
        self.texts, self.prompts = list(texts), []

    def generate(self, prompts, n, seed):
        self.prompts.extend(prompts)
        return [[_Sample(ids=[i % len(self.texts)], logps=[-0.5], ended=True) for i in range(n)] for _ in prompts]

    def decode(self, ids):
        return self.texts[ids[0]]


def test_confidence_prompt_and_verbalized_confidence(monkeypatch, tiny_dir, tmp_path):
    import calibrl.evaluation.generate as generate_module
    from calibrl.tasks.verbalized import CONFIDENCE_INSTRUCTION

    texts = [r"\boxed{5} <confidence>0.9</confidence>", r"\boxed{4} <confidence>.2</confidence>", r"\boxed{5}",
             r"\boxed{5} <confidence>90%</confidence>"]
    backend = _ScriptedBackend(texts)
    monkeypatch.setattr(generate_module, "open_backend", lambda config, **kw: (backend, None))
    out = tmp_path / "c.jsonl"
    kw = dict(model="scripted", dataset="math500", path=str(FIXTURES / "math500.jsonl"), n=4, template="none",
              progress=False, out=out)
    generate(confidence_prompt=True, reward="rlcr", **kw)
    assert backend.prompts and all(p.endswith("\n" + CONFIDENCE_INSTRUCTION) for p in backend.prompts)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["verbalized_confidence"] for r in rows[:4]] == [0.9, 0.2, None, None]
    # reward: RLCR's value; correct: the math grading (gold 5 for the first problem, 4 for the second)
    assert [r["correct"] for r in rows[:8]] == [True, False, True, True, False, True, False, False]
    assert [r["reward"] for r in rows[:4]] == pytest.approx([0.99, -0.04, 0.0, 0.0])
    assert [r["reward"] for r in rows[4:8]] == pytest.approx([-0.81, 1 - 0.64, -1.0, -1.0])
    # a stated confidence is recorded without the prompt option too; the option is a setting of the run
    with pytest.raises(GenerateError, match="confidence_prompt: True -> False"):
        generate(reward="rlcr", **kw)
    backend.prompts.clear()
    plain = tmp_path / "p.jsonl"
    generate(**{**kw, "out": plain})
    assert backend.prompts and not any(CONFIDENCE_INSTRUCTION in p for p in backend.prompts)
    rows = [json.loads(line) for line in plain.read_text().splitlines()]
    assert [r["verbalized_confidence"] for r in rows[:4]] == [0.9, 0.2, None, None]
    assert [r["reward"] for r in rows[:4]] == [1.0, 0.0, 1.0, 1.0]  # the math reward


def test_files_written_before_the_confidence_prompt_setting_still_resume(tiny_dir, tmp_path):
    out = tmp_path / "s.jsonl"
    kw = _fast(tiny_dir, out, dataset="math500", path=str(FIXTURES / "math500.jsonl"))
    generate(limit=1, **kw)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["verbalized_confidence"] is None for r in rows)  # the tiny model states none
    meta_file = tmp_path / "s.jsonl.meta.json"
    meta = json.loads(meta_file.read_text())
    assert meta["confidence_prompt"] is False
    del meta["confidence_prompt"]  # as an older calibrl wrote it
    meta_file.write_text(json.dumps(meta))
    assert generate(**kw)["problems_skipped"] == 1
    with pytest.raises(GenerateError, match="confidence_prompt: False -> True"):
        generate(**{**kw, "confidence_prompt": True})


def test_cli_confidence_prompt(tiny_dir, tmp_path):
    from typer.testing import CliRunner

    from calibrl.cli import app

    out = tmp_path / "s.jsonl"
    args = ["generate", "--model", str(tiny_dir), "--dataset", "math500", "--path", str(FIXTURES / "math500.jsonl"),
            "--n", "1", "--limit", "1", "--max-new-tokens", "2", "--template", "none", "--out", str(out), "--quiet",
            "--confidence-prompt"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "s.jsonl.meta.json").read_text())["confidence_prompt"] is True


def test_a_stated_confidence_is_never_graded_as_the_answer(monkeypatch, tmp_path):
    """arithmetic's final-number grader would read the "0.8" of the tag; rlcr takes the dataset's own grader."""
    import calibrl.evaluation.generate as generate_module

    gold = get_dataset_loader("arithmetic")(limit=1)[0]["answer"]
    texts = [f"It is {gold}. <confidence>0.8</confidence>", f"It is {int(gold) + 1}. <confidence>0.3</confidence>"]
    backend = _ScriptedBackend(texts)
    monkeypatch.setattr(generate_module, "open_backend", lambda config, **kw: (backend, None))
    kw = dict(model="scripted", dataset="arithmetic", limit=1, n=2, progress=False, confidence_prompt=True)
    generate(out=tmp_path / "a.jsonl", **kw)
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    expected = [(gold, True, 1.0), (str(int(gold) + 1), False, 0.0)]
    assert [(r["answer"], r["correct"], r["reward"]) for r in rows] == expected
    generate(out=tmp_path / "r.jsonl", reward="rlcr", **kw)
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in rows] == [True, False]
    assert [r["reward"] for r in rows] == pytest.approx([1 - 0.04, -0.09])


def test_cli_errors_are_one_line_naming_the_bad_input(tmp_path):
    """A missing local model folder is named as such (not the hub client's "Repo id must use alphanumeric chars"),
    a malformed dataset row names its file and row, and no message is wrapped at 80 columns when piped."""
    from typer.testing import CliRunner

    from calibrl.cli import app

    bad_rows = tmp_path / "bad_choices.jsonl"
    bad_rows.write_text(json.dumps({"question": "2+2?", "choices": "four", "answerKey": "A"}) + "\n")
    out = str(tmp_path / "deep" / ("x" * 60) / "s.jsonl")
    cases = {
        ("-m", str(tmp_path / "nomodel"), "-d", "arithmetic"): ("no such local folder", str(tmp_path / "nomodel")),
        ("-m", "builtin:tiny", "-d", str(bad_rows)): (f"{bad_rows}: row 1:", "'choices' is str"),
    }
    for args, expected in cases.items():
        result = CliRunner().invoke(app, ["generate", *args, "--out", out, "--limit", "1", "--n", "1"])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), result.output
        assert all(part in lines[0] for part in expected), result.output
        assert "Repo id" not in lines[0]
    assert not (tmp_path / "deep").exists()  # nothing written


def test_max_new_tokens_defaults_to_the_dataset_budget_and_a_resume_keeps_the_run_s(tiny_dir, tmp_path):
    """arithmetic registers 64 new tokens (a number answers it), the reasoning benchmarks keep 1,024; a resume
    without the flag keeps the budget the run was started with instead of refusing it as a changed setting."""
    from calibrl.evaluation.generate import DEFAULT_MAX_NEW_TOKENS, GenerateConfig, resolve_max_new_tokens

    assert resolve_max_new_tokens(GenerateConfig(model="m", dataset="arithmetic", out=tmp_path / "a")).max_new_tokens == 64
    assert resolve_max_new_tokens(GenerateConfig(model="m", dataset="multiple_choice", out=tmp_path / "a")).max_new_tokens == 64
    assert resolve_max_new_tokens(GenerateConfig(model="m", dataset="math500", out=tmp_path / "a")).max_new_tokens \
        == DEFAULT_MAX_NEW_TOKENS == 1024
    out = tmp_path / "s.jsonl"
    kw = {**_fast(tiny_dir, out, dataset="arithmetic", limit=2), "template": "text"}
    generate(**{**kw, "max_new_tokens": 3})
    assert json.loads((tmp_path / "s.jsonl.meta.json").read_text())["max_new_tokens"] == 3
    resumed = generate(**{**kw, "limit": 3, "max_new_tokens": None})  # no flag: the run's 3, one more problem
    assert resumed["samples_written"] == 2 and resumed["problems_skipped"] == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["n_tokens"] <= 3 for r in rows)


def test_progress_moves_at_every_token_step(tiny):
    """The transformers backend reports each token step of a batch, so a long batch's bar still moves."""
    model, tok = tiny
    backend = _TransformersBackend(model, tok, temperature=1.0, max_new_tokens=5, class_ids=None)
    steps = []
    groups = backend.generate(["1+1="], 2, seed=0, on_token=steps.append)
    longest = max(len(s.ids) for g in groups for s in g)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= longest >= 1


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "unreachable"])
def test_a_hub_model_that_cannot_be_had_is_one_line_at_once(tmp_path, monkeypatch, offline):
    """Not cached, and the hub offline or its host refusing connections: one line naming the model and why, before
    anything loads (not a minute of the hub client's retry lines)."""
    from huggingface_hub import constants
    from typer.testing import CliRunner

    from calibrl.cli import app

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    result = CliRunner().invoke(app, ["generate", "--model", "calibrl-test/not-cached-model", "--dataset", "arithmetic",
                                      "--limit", "1", "--n", "1", "--out", str(tmp_path / "s.jsonl")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "calibrl-test/not-cached-model is not in the local hub cache" in lines[0], lines
    assert ("HF_HUB_OFFLINE" if offline else "127.0.0.1 cannot be reached") in lines[0]
    assert not (tmp_path / "s.jsonl").exists()


def test_token_steps_redraw_the_bar_without_restarting_its_rate_clock():
    """The bar's rate (and so its ETA) counts the whole time a batch took, not the time since its last token
    step: redrawing with update(0) between batches gave an ETA of seconds with minutes left."""
    import io
    import time

    from tqdm.auto import tqdm

    from calibrl.evaluation.generate import token_progress

    bar = tqdm(total=100, file=io.StringIO(), mininterval=0, smoothing=0.3)
    on_token = token_progress(bar, 64, every=0)
    start = time.monotonic()
    for step in range(4):
        time.sleep(0.1)
        on_token(step)
    bar.update(4)  # the batch's 4 samples, 0.4 s after the start
    elapsed = time.monotonic() - start
    assert "batch token 3/64" in bar.format_dict["postfix"]
    assert bar.format_dict["rate"] == pytest.approx(4 / elapsed, rel=0.2)  # restarted at each token: 4 / 0.1
    bar.close()
