"""Self-certainty as a confidence: recorded per row by ``calibrl generate`` (transformers backend, chunked over each
step's rows) and read by ``calibrl eval`` as a ranking-only confidence source (calibrl.self_certainty holds the math;
tests/test_self_certainty.py checks it against a direct KL and the authors' formula)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------------ generation


@pytest.mark.parametrize("temperature, chunk", [(1.0, 4), (0.7, 1), (0.0, 5)])
def test_generate_records_the_self_certainty_of_a_full_logits_forward(tmp_path, monkeypatch, temperature, chunk):
    """Each row's self_certainty equals completion_self_certainty of the model's whole logits over prompt +
    completion (by hand here) at the sampling temperature (1 when greedy); the backend projects at most ``chunk``
    of a step's 6 rows at a time (4 and 5 split them unevenly)."""
    import calibrl.logprobs
    import calibrl.self_certainty as sc
    from calibrl.evaluation.backends import _TransformersBackend
    from calibrl.evaluation.generate import generate
    from calibrl.models import TinyModelConfig, build_tiny_model

    widths = []
    whole = sc.token_self_certainty

    def recording(logits, **kwargs):
        widths.append(logits.shape[0])
        return whole(logits, **kwargs)

    monkeypatch.setattr(calibrl.logprobs, "positions_per_chunk", lambda **_kw: chunk)
    monkeypatch.setattr(sc, "token_self_certainty", recording)
    sampled = []  # (prompt, sample) in the order generate writes the rows
    original = _TransformersBackend.generate

    def keep(self, prompts, n, seed, **kwargs):
        groups = original(self, prompts, n, seed, **kwargs)
        sampled.extend((p, s) for p, group in zip(prompts, groups) for s in group)
        return groups

    monkeypatch.setattr(_TransformersBackend, "generate", keep)
    model, tokenizer = build_tiny_model(config=TinyModelConfig(max_position_embeddings=512), seed=0)
    out = tmp_path / "s.jsonl"
    generate(model="tiny", dataset="deepscaler", path=str(FIXTURES / "deepscaler.jsonl"), n=3, limit=2,
             batch_size=2, max_new_tokens=9, template="none", temperature=temperature, progress=False, out=out,
             token_confidence_k=0, hf_model=model, hf_tokenizer=tokenizer)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(sampled) == 6
    assert max(widths) == chunk and sum(widths) == 6 * max(r["n_tokens"] for r in rows)  # every step, in chunks
    scale = temperature if temperature > 0 else 1.0
    for row, (prompt, sample) in zip(rows, sampled):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids + sample.ids])).logits[:, len(prompt_ids) - 1:-1]  # [1, T, V]
        per_token = (torch.logsumexp(logits / scale, -1) - (logits / scale).mean(-1)
                     - torch.log(torch.tensor(float(logits.shape[-1]))))  # KL(U || p_T), written out
        want = sc.completion_self_certainty(per_token, torch.ones_like(per_token, dtype=torch.bool))
        assert row["n_tokens"] == len(sample.ids)
        assert row["self_certainty"] == pytest.approx(float(want), rel=1e-5, abs=1e-6)
        assert row["self_certainty"] > 0
    assert json.loads((tmp_path / "s.jsonl.meta.json").read_text())["self_certainty"] is None


def test_no_self_certainty_leaves_the_field_out_and_vllm_refuses_it(tmp_path):
    from calibrl.evaluation.generate import GenerateError, generate
    from calibrl.models import TinyModelConfig, build_tiny_model

    model, tokenizer = build_tiny_model(config=TinyModelConfig(max_position_embeddings=512), seed=0)
    out = tmp_path / "s.jsonl"
    common = dict(dataset="deepscaler", path=str(FIXTURES / "deepscaler.jsonl"), n=2, limit=1, max_new_tokens=4,
                  template="none", progress=False)
    generate(model="tiny", out=out, self_certainty=False, hf_model=model, hf_tokenizer=tokenizer, **common)
    assert all("self_certainty" not in json.loads(line) for line in out.read_text().splitlines())
    with pytest.raises(GenerateError, match=r"self_certainty: False -> None"):  # resuming with it on would mix
        generate(model="tiny", out=out, hf_model=model, hf_tokenizer=tokenizer, **common)
    with pytest.raises(GenerateError, match=r"vLLM returns only its top-k log-probs"):
        generate(model="builtin:tiny", out=tmp_path / "v.jsonl", backend="vllm", self_certainty=True, **common)
    assert not (tmp_path / "v.jsonl").exists()


def test_cli_no_self_certainty_and_vllm_refusal(tmp_path):
    from typer.testing import CliRunner

    from calibrl.cli import app

    args = ["generate", "--model", "builtin:tiny", "--dataset", "deepscaler", "--path",
            str(FIXTURES / "deepscaler.jsonl"), "--n", "1", "--limit", "1", "--max-new-tokens", "3",
            "--template", "none", "--quiet"]
    result = CliRunner().invoke(app, args + ["--out", str(tmp_path / "v.jsonl"), "--backend", "vllm",
                                             "--self-certainty"])
    assert result.exit_code == 2 and "top-k log-probs" in result.output
    result = CliRunner().invoke(app, args + ["--out", str(tmp_path / "s.jsonl"), "--no-self-certainty"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "s.jsonl.meta.json").read_text())["self_certainty"] is False


# ------------------------------------------------------------------------------------------------ eval


def _rows(n_prompts=6, n=8, seed=0):
    """Rows whose self_certainty tends to be higher on correct ones (a source AUROC can tell from 0.5)."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        for i in range(n):
            correct = bool(rng.random() < 0.5)
            rows.append({"prompt_id": f"p{p}", "sample_index": i, "correct": correct,
                         "logprob_mean": float(-rng.uniform(0.1, 1.0)),
                         "self_certainty": float(rng.gamma(2.0, 1.0) + (0.8 if correct else 0.0))})
    return rows


def test_eval_scores_self_certainty_as_a_ranking_source_equal_to_sklearn(tmp_path):
    from sklearn.metrics import roc_auc_score

    from calibrl.evaluation.samples import load_samples
    from calibrl.evaluation.scoring import evaluate_samples
    from calibrl.evaluation.settings import EvalSettings
    from calibrl.metrics.registry import confidence_source

    rows = _rows()
    for r in rows[::7]:  # rows without it are excluded from the source and counted
        del r["self_certainty"]
    s = load_samples(_write_jsonl(tmp_path / "s.jsonl", rows))
    assert s.confidence_kind == "logprob_mean"  # never the main confidence
    assert s.confidence_sources() == ["logprob_mean", "self_certainty"]
    have = [r for r in rows if "self_certainty" in r]
    np.testing.assert_array_equal(s.self_certainty[s.source_mask("self_certainty")],
                                  [r["self_certainty"] for r in have])
    res = evaluate_samples(s, label="x", answer_ids=None, settings=EvalSettings(methods=(), bootstrap=0))
    src = res.metrics["confidence_sources"]["self_certainty"]
    want = roc_auc_score([r["correct"] for r in have], [r["self_certainty"] for r in have])
    assert src["auroc"] == pytest.approx(want, abs=1e-12) and src["auroc"] > 0.6
    assert src["n"] == len(have) and src["n_excluded"] == len(rows) - len(have)
    assert src["ece"] is None and src["brier"] is None and src["smooth_ece"] is None
    assert src["prr"] is not None and src["aurc"] is not None
    assert "self_certainty" not in res.sources  # no reliability curve for a score that is no probability
    assert confidence_source("self_certainty").probability is False
    sub = s.subset(s.source_mask("self_certainty"))
    assert sub.confidence_sources() == ["logprob_mean", "self_certainty"] and len(sub) == len(have)


def test_eval_reads_self_certainty_from_parquet_and_trl_and_verl_logs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from calibrl.evaluation.samples import load_samples

    rows = _rows(n_prompts=2, n=3)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "s.parquet")
    s = load_samples(tmp_path / "s.parquet")
    np.testing.assert_array_equal(s.self_certainty, [r["self_certainty"] for r in rows])
    trl = pa.table({"step": [1, 1, 1], "prompt": ["a", "a", "b"], "completion": ["\\boxed{1}", "x", "\\boxed{2}"],
                    "math": [1.0, 0.0, 1.0], "logprob_mean": [-0.1, -0.2, -0.3],
                    "self_certainty": [2.0, float("nan"), 0.5], "advantage": [0.0, 0.0, 0.0]})
    (tmp_path / "trl").mkdir()
    pq.write_table(trl, tmp_path / "trl" / "completions_00001.parquet")
    s = load_samples(tmp_path / "trl", format="trl")
    np.testing.assert_array_equal(s.self_certainty, [2.0, np.nan, 0.5])  # NaN: not known, excluded
    assert s.reward.tolist() == [1.0, 0.0, 1.0]  # the new column does not pass for a reward column
    verl = [{"input": "q", "output": "\\boxed{1}", "score": 1.0, "self_certainty": 1.5, "step": 2},
            {"input": "q", "output": "\\boxed{3}", "score": 0.0, "self_certainty": 0.25, "step": 2}]
    with pytest.warns(UserWarning, match="accuracy and answer selection only, and the ranking sources self_certainty"):
        s = load_samples(_write_jsonl(tmp_path / "v.jsonl", verl), format="verl")
    assert s.self_certainty.tolist() == [1.5, 0.25] and s.confidence_sources() == ["self_certainty"]


@pytest.mark.parametrize("value, problem", [
    (-0.5, r"out of range: -0\.5 < 0"), ("high", "expected a number, got str 'high'"),
    (True, "expected a number, got bool True"), ([1.0], "expected a number, got list"),
    (float("inf"), "must be finite")])
def test_bad_self_certainty_names_file_line_and_field(tmp_path, value, problem):
    from calibrl.evaluation.samples import SamplesError, load_samples

    rows = _rows(n_prompts=1, n=3)
    rows[2]["self_certainty"] = value
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json writes inf as Infinity, read back as inf
    with pytest.raises(SamplesError, match=rf"^s\.jsonl:3: field 'self_certainty': {problem}"):
        load_samples(path)


def test_repeated_rows_differing_in_self_certainty_are_refused(tmp_path):
    from calibrl.evaluation.samples import SamplesError, load_samples

    row = {"prompt_id": "p", "sample_index": 0, "correct": True, "logprob_mean": -0.1, "completion": "x",
           "self_certainty": 1.0}
    with pytest.raises(SamplesError, match=r"s\.jsonl:2: .*repeats s\.jsonl:1 with a different self_certainty"):
        load_samples(_write_jsonl(tmp_path / "s.jsonl", [row, {**row, "self_certainty": 2.0}]))
    assert len(load_samples(_write_jsonl(tmp_path / "t.jsonl", [row, row]))) == 1


def test_asking_for_self_certainty_as_the_main_confidence_says_it_only_ranks(tmp_path):
    from calibrl.evaluation.samples import SamplesError, load_samples

    with pytest.raises(SamplesError, match="self_certainty only ranks"):
        load_samples(_write_jsonl(tmp_path / "s.jsonl", _rows(n_prompts=1, n=2)), confidence="self_certainty")


def test_eval_report_lists_self_certainty_in_the_which_confidence_table(tmp_path):
    from typer.testing import CliRunner

    from calibrl.cli import app

    rows = _rows(n_prompts=5, n=4)
    for r in rows:
        r["answer"] = "1" if r["correct"] else "2"
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(_write_jsonl(tmp_path / "s.jsonl", rows)), "--out",
                                      str(tmp_path / "report"), "--methods", "", "--bootstrap", "30"])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "report" / "report.md").read_text().splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("Which confidence to trust")):]
    row = next(line for line in table if line.startswith("| `self_certainty` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] and cells[2] and cells[3:6] == ["", "", ""]  # AUROC and PRR; no smooth ECE, ECE, Brier
    metrics = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert "self_certainty" in json.dumps(metrics)
