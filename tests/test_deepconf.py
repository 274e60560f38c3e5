"""DeepConf: token confidence, trace signals and the votes weighted / filtered by them (calibrl.selection.deepconf),
checked by hand and against a re-derivation of the authors' analysis rules (tests/deepconf_reference.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import deepconf_reference as ref
from calibrl.logprobs import chunked_token_confidence
from calibrl.selection import scaling_curve, select
from calibrl.selection.deepconf import (SELECTIONS, SIGNALS, filter_top_fraction, token_confidence_from_top_logprobs,
                                        trace_signals)


# ------------------------------------------------------------------------------------------------ token confidence


def test_token_confidence_from_top_logprobs_by_hand():
    # position 1: log-probs -0.5, -1.5 -> C = 1.0; position 2: -0.1, -2.1, -3.1 -> C = 5.3 / 3; no entries -> NaN
    got = token_confidence_from_top_logprobs([[-0.5, -1.5], [-0.1, -2.1, -3.1], []])
    np.testing.assert_allclose(got[:2], [1.0, 5.3 / 3], rtol=1e-15)
    assert np.isnan(got[2])


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_token_confidence_equals_whole_vocabulary_topk(temperature):
    torch.manual_seed(0)
    hidden = torch.randn(13, 8, dtype=torch.float64)
    head = torch.randn(8, 50, dtype=torch.float64)
    want = -(torch.log_softmax(hidden @ head / temperature, -1).topk(5, -1).values.mean(-1))
    got = chunked_token_confidence(hidden, project=lambda h: h @ head, k=5, temperature=temperature, chunk=4)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)


def test_chunked_token_confidence_k_equal_vocab_is_minus_mean_logprob_and_uniform_is_log_v():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, -1.0, 0.5]])
    got = chunked_token_confidence(logits, project=lambda z: z, k=4, chunk=1)
    # uniform over 4 tokens: every log-prob is -log 4; the other row: -mean(log_softmax) over all tokens
    assert got[0].item() == pytest.approx(np.log(4.0), rel=1e-6)
    assert got[1].item() == pytest.approx(-torch.log_softmax(logits[1], -1).mean().item(), rel=1e-6)
    # a peaked distribution is more confident than a flat one
    peaked = chunked_token_confidence(torch.tensor([[9.0, 0.0, 0.0, 0.0]]), project=lambda z: z, k=2, chunk=1)
    flat = chunked_token_confidence(torch.tensor([[0.0, 0.0, 0.0, 0.0]]), project=lambda z: z, k=2, chunk=1)
    assert peaked.item() > flat.item()
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        chunked_token_confidence(logits, project=lambda z: z, k=5, chunk=2)


# ------------------------------------------------------------------------------------------------ trace signals


def test_trace_signals_by_hand():
    confs = np.arange(1.0, 13.0)  # 1 .. 12
    # window 2: means 1.5, 2.5, ..., 11.5 (11 windows, floor(1.1) = 1 lowest -> the min); tail 3: (10+11+12)/3
    np.testing.assert_allclose(trace_signals(confs, window=2, tail=3), [6.5, 11.0, 1.5, 1.5])
    confs = np.arange(1.0, 23.0)  # 21 windows of 2: floor(2.1) = 2 lowest, 1.5 and 2.5
    np.testing.assert_allclose(trace_signals(confs, window=2, tail=30), [11.5, 11.5, 2.0, 1.5])
    # windows of 3 over [5, 1, 1, 1, 5, 5]: 7/3, 1, 7/3, 11/3 (4 windows -> 1 lowest)
    np.testing.assert_allclose(trace_signals([5, 1, 1, 1, 5, 5], window=3, tail=2), [3.0, 5.0, 1.0, 1.0])


def test_trace_signals_short_trace_uses_its_mean_and_nan_positions_are_dropped():
    np.testing.assert_allclose(trace_signals([1.0, 2.0, 6.0], window=4, tail=2), [3.0, 4.0, 3.0, 3.0])
    np.testing.assert_allclose(trace_signals([1.0, np.nan, 2.0, 6.0], window=4, tail=2), [3.0, 4.0, 3.0, 3.0])
    # exactly one window long: one window, its mean
    np.testing.assert_allclose(trace_signals([1.0, 2.0, 6.0], window=3, tail=3), [3.0] * 4)
    assert np.isnan(trace_signals([])).all()
    with pytest.raises(ValueError, match="window"):
        trace_signals([1.0], window=0)


def test_trace_signals_default_lengths_are_2048_tokens():
    confs = np.concatenate([np.full(2048, 1.0), np.full(2048, 3.0)])  # 2049 windows, floor(204.9) = 204 lowest
    mean, tail, bottom, low = trace_signals(confs)
    assert (mean, tail, low) == (2.0, 3.0, 1.0)
    # the lowest 204 windows start at 0 .. 203: mean of 1 + 2 * s / 2048
    assert bottom == pytest.approx(1 + 2 * np.mean(np.arange(204)) / 2048, rel=1e-12)


# ------------------------------------------------------------------------------------------------ selections


def test_filter_top_fraction_numpy_linear_percentile_kept_when_at_least():
    pidx = np.zeros(5, dtype=np.int64)
    sig = np.array([3.0, 1.0, 5.0, 2.0, 4.0])
    # 90th percentile of 1..5: 1 + 0.9 * 4 = 4.6 -> only 5 kept; 10th: 1.4 -> all but 1
    assert filter_top_fraction(sig, pidx, 1, 0.1).tolist() == [False, False, True, False, False]
    assert filter_top_fraction(sig, pidx, 1, 0.9).tolist() == [True, False, True, True, True]
    # ties at the threshold are all kept; NaN neither counted nor kept; prompts of different sizes each their own
    sig = np.array([1.0, 5.0, 5.0, 5.0, np.nan, 2.0, 8.0])
    pidx = np.array([0, 0, 0, 0, 0, 1, 1])
    assert filter_top_fraction(sig, pidx, 2, 0.1).tolist() == [False, True, True, True, False, False, True]


def _signals(values: list[float]) -> np.ndarray:
    """[N, 4] with every signal column equal to ``values`` (the tests pick the column by the method)."""
    return np.repeat(np.asarray(values, dtype=np.float64)[:, None], len(SIGNALS), axis=1)


def test_weighted_vote_by_hand_overrules_majority():
    answers = [0, 0, 1]  # two paths say A (wrong), one very confident path says B (right)
    correct = [False, False, True]
    pids = [7, 7, 7]
    sig = _signals([1.0, 1.5, 3.0])
    assert select("majority", answers, correct, pids).accuracy == 0.0
    for method in ("deepconf_mean", "deepconf_tail", "deepconf_bottom10", "deepconf_min"):
        res = select(method, answers, correct, pids, deepconf_signals=sig)
        assert res.accuracy == 1.0 and res.answer_ids.tolist() == [1]
        assert res.confidence[0] == pytest.approx(3.0 / 5.5)
    # A's total 2.6 now beats B's 2.5
    assert select("deepconf_mean", answers, correct, pids, deepconf_signals=_signals([1.0, 1.6, 2.5])).accuracy == 0


def test_weighted_vote_uses_the_methods_own_signal_column():
    answers, correct, pids = [0, 1], [True, False], [0, 0]
    sig = np.array([[2.0, 1.0, 1.0, 3.0],   # path 0 (right): mean 2, tail 1, bottom 1, min 3
                    [1.0, 2.0, 2.0, 1.0]])  # path 1 (wrong)
    got = {m: select(m, answers, correct, pids, deepconf_signals=sig).accuracy
           for m in ("deepconf_mean", "deepconf_tail", "deepconf_bottom10", "deepconf_min")}
    assert got == {"deepconf_mean": 1.0, "deepconf_tail": 0.0, "deepconf_bottom10": 0.0, "deepconf_min": 1.0}


def test_top10_filter_then_weighted_vote_by_hand():
    # 10 paths: 9 say A (wrong) with tail 1..9, one says B (right) with tail 10: the 90th percentile is 9.1, so only
    # B is kept; with the top 90% (threshold 1.9) A's 2 + ... + 9 = 44 outvotes B's 10
    answers = [0] * 9 + [1]
    correct = [False] * 9 + [True]
    sig = _signals(list(range(1, 11)))
    pids = [0] * 10
    assert select("deepconf_tail", answers, correct, pids, deepconf_signals=sig).accuracy == 0.0
    assert select("deepconf_tail_top10", answers, correct, pids, deepconf_signals=sig).accuracy == 1.0
    assert select("deepconf_bottom10_top10", answers, correct, pids, deepconf_signals=sig).accuracy == 1.0
    res = select("deepconf_tail_top90", answers, correct, pids, deepconf_signals=sig)
    assert res.accuracy == 0.0 and res.confidence[0] == pytest.approx(44 / 54)


def test_deepconf_needs_signals_and_their_shape():
    with pytest.raises(ValueError, match="token confidences"):
        select("deepconf_mean", [0], [True], [0])
    with pytest.raises(ValueError, match=r"\[2, 4\]"):
        select("deepconf_mean", [0, 1], [True, False], [0, 0], deepconf_signals=np.ones((2, 3)))


def test_scaling_curve_of_a_deepconf_method_subsets_the_signals():
    rng = np.random.default_rng(0)
    n_prompts, k = 30, 8
    pids = np.repeat(np.arange(n_prompts), k)
    answers = rng.integers(0, 3, size=pids.size) + 10 * pids
    correct = answers % 10 == 0
    # right answers are more confident: a weighted vote should beat the majority at every N >= 2
    sig = _signals(list(rng.random(pids.size) + 2.0 * correct))
    curve = scaling_curve("deepconf_min", answers, correct, pids, deepconf_signals=sig, n_draws=5)
    majority = scaling_curve("majority", answers, correct, pids, n_draws=5)
    assert curve.ns.tolist() == [1, 2, 4, 8]
    assert curve.accuracy[0] == pytest.approx(correct.mean())
    assert (curve.accuracy[1:] > majority.accuracy[1:]).all()
    full = select("deepconf_min", answers, correct, pids, deepconf_signals=sig).accuracy
    assert curve.accuracy[-1] == pytest.approx(full)


# ------------------------------------------------------------------------------------------------ authors' rules


def _make_traces_file(path, *, n_prompts=12, per_prompt=10, window=64, tail=48, seed=1):
    """A JSONL file of traces with top-k log-probs per position: lengths on both sides of the window."""
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for p in range(n_prompts):
            for s in range(per_prompt):
                length = int(rng.choice([window // 2, window - 1, window, window + 1, 3 * window + 7, 400]))
                level = rng.uniform(0.3, 3.0)
                top = -np.abs(rng.normal(level, 1.0, size=(length, 5)))
                answer = f"{p}-{int(rng.integers(0, 3))}"
                f.write(json.dumps({"prompt_id": p, "answer": answer, "correct": answer.endswith("-0"),
                                    "top_logprobs": top.tolist()}) + "\n")


def test_signals_and_selections_equal_the_authors_rules_on_a_file(tmp_path):
    window, tail = 64, 48
    path = tmp_path / "traces.jsonl"
    _make_traces_file(path, window=window, tail=tail)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    ours = np.stack([trace_signals(token_confidence_from_top_logprobs(r["top_logprobs"]), window=window, tail=tail)
                     for r in rows])
    by_prompt: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_prompt.setdefault(r["prompt_id"], []).append(i)
    answers = np.array([r["answer"] for r in rows])
    _, answer_ids = np.unique(answers, return_inverse=True)
    correct = np.array([r["correct"] for r in rows])
    pids = np.array([r["prompt_id"] for r in rows])
    chosen = {m: select(m, answer_ids, correct, pids, deepconf_signals=ours) for m in SELECTIONS}
    for p, idx in by_prompt.items():
        confs = [ref.token_confidence(rows[i]["top_logprobs"]) for i in idx]
        signals, winners = ref.prompt_selections([rows[i]["answer"] for i in idx], confs, window=window, tail=tail)
        theirs = np.stack([signals[name] for name in SIGNALS], axis=1)
        np.testing.assert_allclose(ours[idx], theirs, rtol=1e-12, atol=0)
        for method, result in chosen.items():
            assert answers[answer_ids == result.answer_ids[p]][0] == winners[method], (p, method)


# ------------------------------------------------------------------------------------------------ reading files


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_calibrl_jsonl_token_confidence_is_reduced_to_signals_with_the_window_options(tmp_path):
    from calibrl.evaluation.samples import DEEPCONF_SOURCES, load_samples

    confs = [5.0, 1.0, 1.0, 1.0, 5.0, 5.0]
    rows = [{"prompt_id": 0, "correct": True, "logprob_mean": -0.1, "token_confidence": confs, "answer": "1"},
            {"prompt_id": 0, "correct": False, "logprob_mean": -0.2, "answer": "2"},
            {"prompt_id": 0, "correct": False, "logprob_mean": -0.3, "token_confidence": [2, None, 4], "answer": "2"}]
    s = load_samples(_write_jsonl(tmp_path / "s.jsonl", rows), deepconf_window=3, deepconf_tail=2)
    np.testing.assert_allclose(s.deepconf_signals[0], [3.0, 5.0, 1.0, 1.0])  # windows 7/3, 1, 7/3, 11/3
    assert np.isnan(s.deepconf_signals[1]).all()
    np.testing.assert_allclose(s.deepconf_signals[2], [3.0, 3.0, 3.0, 3.0])  # the null skipped; shorter than w
    assert s.confidence_sources() == ["logprob_mean", *DEEPCONF_SOURCES]
    assert s.source_mask("deepconf_tail").tolist() == [True, False, True]
    assert s.subset(np.array([False, True, True])).deepconf_signals.shape == (2, 4)
    default = load_samples(tmp_path / "s.jsonl")  # 2,048-token windows: every trace is shorter, all its mean
    np.testing.assert_allclose(default.deepconf_signals[0], [3.0] * 4)


@pytest.mark.parametrize("value, problem", [
    ([1.0, "x"], "entry 1: expected a number"), ([1.0, -0.5], "entry 1: -0.5 is not a finite number >= 0"),
    ("1 2 3", "expected a list of numbers"), ([[1.0], [2.0]], "flat list"), ([True, False], "entry 0: expected a number, got True"),
    ([0.5, True, 0.7], "entry 1: expected a number, got True"), ([2, False, 3], "entry 1: expected a number, got False")])
def test_bad_token_confidence_names_file_line_field_and_entry(tmp_path, value, problem):
    from calibrl.evaluation.samples import SamplesError, load_samples

    rows = [{"prompt_id": 0, "correct": True, "logprob_mean": -0.1},
            {"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "token_confidence": value}]
    with pytest.raises(SamplesError, match=rf"s\.jsonl:2: field 'token_confidence': .*{problem}"):
        load_samples(_write_jsonl(tmp_path / "s.jsonl", rows))


def test_token_confidences_near_the_float_maximum_keep_signals_and_votes_finite(tmp_path):
    """Finite C_i up to 1e308 (no log-probability gives them, a file can hold them): the signals are the exact
    means in units of the largest value, and the votes weigh them without overflowing."""
    from calibrl.evaluation.samples import load_samples
    from calibrl.evaluation.scoring import evaluate_samples
    from calibrl.evaluation.settings import EvalSettings

    huge = [1e308, 1e308, 1.5e308]
    np.testing.assert_allclose(trace_signals(huge, window=2, tail=2),
                               [np.mean(np.array(huge) / 1e308) * 1e308, 1.25e308, 1e308, 1e308], rtol=1e-12)
    rows = [{"prompt_id": p, "correct": k == 0, "answer": str(k), "logprob_mean": -0.5,
             "token_confidence": huge if k == 0 else [1.0, 2.0, 3.0]} for p in range(3) for k in range(4)]
    s = load_samples(_write_jsonl(tmp_path / "s.jsonl", rows))
    assert np.isfinite(s.deepconf_signals).all()
    ids = np.unique(s.answers, return_inverse=True)[1] + 10 * s.prompt_index
    res = evaluate_samples(s, label="x", answer_ids=ids,
                           settings=EvalSettings(methods=("deepconf_mean", "deepconf_tail_top10"), bootstrap=0))
    # the path holding 1e308 wins each prompt's vote (its answer, '0', is the only right one), with a finite share
    assert res.metrics["selection"] == {"deepconf_mean": 1.0, "deepconf_tail_top10": 1.0}


def test_eval_says_on_the_terminal_which_asked_for_methods_did_not_run(tmp_path):
    from typer.testing import CliRunner

    from calibrl.cli import app

    rows = [{"prompt_id": p, "correct": k % 2 == 0, "answer": str(k % 2), "logprob_mean": -0.5 - 0.1 * k}
            for p in range(3) for k in range(4)]
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(_write_jsonl(tmp_path / "s.jsonl", rows)), "--out",
                                      str(tmp_path / "e"), "--bootstrap", "30",
                                      "--methods", "majority,deepconf_mean,deepconf_tail_top10"])
    assert result.exit_code == 0, result.output
    assert "note: s: not run: deepconf_mean, deepconf_tail_top10 (no token_confidence in the input)" in result.output


def test_parquet_float16_token_confidence(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from calibrl.evaluation.samples import load_samples

    confs = np.random.default_rng(0).uniform(0, 4, size=(3, 50)).astype(np.float16)
    table = pa.table({"prompt_id": [0, 0, 1], "correct": [True, False, True], "logprob_mean": [-0.1, -0.2, -0.3],
                      "token_confidence": pa.array([c for c in confs], type=pa.list_(pa.float16()))})
    pq.write_table(table, tmp_path / "s.parquet")
    s = load_samples(tmp_path / "s.parquet", deepconf_window=8, deepconf_tail=5)
    want = np.stack([trace_signals(c.astype(np.float64), window=8, tail=5) for c in confs])
    np.testing.assert_allclose(s.deepconf_signals, want, rtol=1e-12)


def test_openai_chat_top_logprobs_and_vllm_topk_maps_give_token_confidence(tmp_path):
    from calibrl.evaluation.samples import load_samples

    content = [{"token": "a", "logprob": -0.5, "top_logprobs": [{"token": "a", "logprob": -0.5},
                                                                {"token": "b", "logprob": -1.5}]},
               {"token": "c", "logprob": -0.1, "top_logprobs": [{"token": "c", "logprob": -0.1},
                                                                {"token": "d", "logprob": -3.1}]}]
    line = {"id": "r1", "gold": "4", "choices": [{"index": 0, "message": {"content": "\\boxed{4}"},
                                                   "logprobs": {"content": content}}]}
    s = load_samples(_write_jsonl(tmp_path / "chat.jsonl", [line]), format="openai")
    np.testing.assert_allclose(s.deepconf_signals[0], [1.3, 1.3, 1.3, 1.3])  # C = 1.0 and 1.6
    legacy = {"id": "r2", "gold": "4", "choices": [{"index": 0, "text": "\\boxed{4}", "logprobs": {
        "tokens": ["a", "c"], "token_logprobs": [-0.5, -0.1],
        "top_logprobs": [{"a": -0.5, "b": -1.5}, {"c": -0.1, "d": -3.1}]}}]}
    s = load_samples(_write_jsonl(tmp_path / "legacy.jsonl", [legacy]), format="openai")
    np.testing.assert_allclose(s.deepconf_signals[0], [1.3] * 4)
    output = {"index": 0, "text": "\\boxed{4}", "token_ids": [7, 9], "cumulative_logprob": -0.6,
              "logprobs": [{"7": {"logprob": -0.5}, "8": {"logprob": -1.5}},
                           {"9": -0.1, "3": -3.1, "4": -5.2}]}  # C = 1.0 and 2.8
    s = load_samples(_write_jsonl(tmp_path / "v.jsonl", [{"request_id": "q", "gold": "4", "outputs": [output]}]),
                     format="vllm", deepconf_window=2, deepconf_tail=1)
    np.testing.assert_allclose(s.deepconf_signals[0], [1.9, 2.8, 1.9, 1.9])
    plain = {**output, "logprobs": [{"7": -0.5}, {"9": -0.1}]}  # logprobs=0: no alternatives, no confidence
    s = load_samples(_write_jsonl(tmp_path / "p.jsonl", [{"request_id": "q", "gold": "4", "outputs": [plain]}]),
                     format="vllm")
    assert s.deepconf_signals is None


def test_eval_scores_signals_as_ranking_sources_and_runs_the_selections(tmp_path):
    from calibrl.evaluation.samples import load_samples
    from calibrl.evaluation.scoring import evaluate_samples
    from calibrl.evaluation.settings import EvalSettings
    from calibrl.selection import DEEPCONF_METHODS

    rng = np.random.default_rng(3)
    rows = []
    for p in range(20):
        for k in range(6):
            right = bool(rng.random() < 0.5)
            level = 2.0 if right else 1.0  # right paths are more confident
            rows.append({"prompt_id": p, "correct": right, "answer": "1" if right else str(2 + k % 2),
                         "logprob_mean": -0.5, "token_confidence": rng.normal(level, 0.2, size=30).clip(0).tolist()})
    s = load_samples(_write_jsonl(tmp_path / "s.jsonl", rows), deepconf_window=8, deepconf_tail=8)
    res = evaluate_samples(s, label="x", answer_ids=None, settings=EvalSettings(methods=(), bootstrap=0))
    src = res.metrics["confidence_sources"]["deepconf_mean"]
    assert src["auroc"] > 0.9 and src["ece"] is None and src["brier"] is None
    assert "deepconf_mean" not in res.sources  # no reliability curve for a non-probability
    ids = np.unique(s.answers, return_inverse=True)[1] + 10 * s.prompt_index
    res = evaluate_samples(s, label="x", answer_ids=ids,
                           settings=EvalSettings(methods=("majority",) + DEEPCONF_METHODS, scaling_draws=2, bootstrap=0))
    for method in DEEPCONF_METHODS:
        want = select(method, ids, s.correct, s.prompt_index, deepconf_signals=s.deepconf_signals).accuracy
        assert res.metrics["selection"][method] == pytest.approx(want)
        assert method in res.curves
    missing = load_samples(_write_jsonl(tmp_path / "m.jsonl", rows[:-1] + [{**rows[-1], "token_confidence": None}]))
    res = evaluate_samples(missing, label="x", answer_ids=ids,
                           settings=EvalSettings(methods=("majority", "deepconf_min"), scaling_draws=2, bootstrap=0))
    assert "deepconf_min" not in res.metrics["selection"]
    assert res.metrics["selection_skipped"]["deepconf_min"] == "token_confidence missing or empty on 1 of 120 rows"


def test_signals_read_from_a_calibrl_file_equal_the_authors_rules(tmp_path):
    from calibrl.evaluation.samples import load_samples

    window, tail = 64, 48
    source = tmp_path / "traces.jsonl"
    _make_traces_file(source, window=window, tail=tail, seed=5)
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    calibrl_rows = [{"prompt_id": r["prompt_id"], "answer": r["answer"], "correct": r["correct"], "logprob_mean": -1.0,
                     "token_confidence": ref.token_confidence(r["top_logprobs"])} for r in rows]
    s = load_samples(_write_jsonl(tmp_path / "c.jsonl", calibrl_rows), deepconf_window=window, deepconf_tail=tail)
    for i, r in enumerate(rows):
        confs = ref.token_confidence(r["top_logprobs"])
        theirs = [ref.mean_signal(confs), ref.tail_signal(confs, tail), ref.bottom_signal(confs, window),
                  ref.min_signal(confs, window)]
        np.testing.assert_allclose(s.deepconf_signals[i], theirs, rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------------------------ generation


@pytest.mark.parametrize("temperature,at", [(1.0, "raw"), (0.7, "raw"), (0.7, "sampling")])
def test_generate_records_token_confidence_as_the_authors_read_it(temperature, at):
    """C_i as the authors compute it from vLLM's returned log-probs (deepconf_reference.compute_confidence over
    vllm_returned_entries: the top k, and the sampled token when outside them), of the model's own distribution by
    default (vLLM's raw log-probs), of the sampling one with "sampling"; the online stop reads the top k alone
    before the token is drawn (the authors' processor)."""
    from calibrl.evaluation.backends import _TransformersBackend
    from calibrl.models import TinyModelConfig, build_tiny_model

    model, tokenizer = build_tiny_model(config=TinyModelConfig(max_position_embeddings=512), seed=0)
    backend = _TransformersBackend(model, tokenizer, temperature=temperature, max_new_tokens=10, class_ids=None,
                                   confidence_k=5, confidence_temperature=at)
    prompts = ["What is 2+3?", "Hi"]  # different lengths: left padding must not shift anything
    outside = 0
    for prompt, group in zip(prompts, backend.generate(prompts, 2, seed=1)):
        for sample in group:
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([prompt_ids + sample.ids])).logits[0, len(prompt_ids) - 1:-1]
            logp = torch.log_softmax(logits.double() / (temperature if at == "sampling" else 1.0), -1)
            entries = [ref.vllm_returned_entries(logp[i].tolist(), token, 5) for i, token in enumerate(sample.ids)]
            outside += sum(len(e) == 6 for e in entries)
            want = ref.compute_confidence(entries, decimals=None)
            assert len(sample.token_confidence) == len(sample.ids)
            np.testing.assert_allclose(sample.token_confidence, want, atol=1e-4, rtol=1e-4)
            sampled_logp = torch.log_softmax(logits.double() / temperature, -1)
            np.testing.assert_allclose(sample.logps, [float(sampled_logp[i, t]) for i, t in enumerate(sample.ids)],
                                       atol=1e-4)  # logprob_mean stays the sampling distribution's
    assert outside > 0  # the tiny model's flat distributions often sample outside the top 5: the k + 1 case ran
    off = _TransformersBackend(model, tokenizer, temperature=1.0, max_new_tokens=4, class_ids=None)
    assert off.generate(["Hi"], 1, seed=1)[0][0].token_confidence is None


@pytest.mark.parametrize("returned", [5, 20])
def test_vllm_path_averages_what_vllm_returns_as_the_authors_do(returned):
    """vLLM's per-position maps for logprobs=k hold the top k and the sampled token when outside them (and 20
    entries for a decision task's classes): C_i is minus the mean of the top k and that sampled token, as
    deepconf_reference.compute_confidence over vllm_returned_entries."""
    from types import SimpleNamespace

    from calibrl.evaluation.backends import _returned_confidence

    rng = np.random.default_rng(returned)
    k, vocab, entries, ids, want = 5, 40, [], [], []
    for position in range(30):
        logp = torch.log_softmax(torch.tensor(rng.normal(size=vocab) * 2.0), -1).tolist()
        sampled = int(rng.integers(0, vocab))  # often outside the top 5
        order = sorted(range(vocab), key=lambda t: -logp[t])[:returned]
        entry = {t: SimpleNamespace(logprob=logp[t]) for t in order}
        entry[sampled] = SimpleNamespace(logprob=logp[sampled])
        entries.append(entry)
        ids.append(sampled)
        want.append(ref.vllm_returned_entries(logp, sampled, k))
    got = _returned_confidence(entries, ids, k)
    np.testing.assert_allclose(got, ref.compute_confidence(want, decimals=None), rtol=1e-12)
    assert sum(len(w) == k + 1 for w in want) > 10  # the sampled token outside the top k, often
    assert _returned_confidence(entries, ids, 0) is None


def test_generate_rows_carry_token_confidence_that_eval_reads(tmp_path):
    from pathlib import Path

    from calibrl.evaluation.generate import generate
    from calibrl.evaluation.samples import load_samples
    from calibrl.models import TinyModelConfig, save_tiny_model

    fixtures = Path(__file__).parent / "fixtures"
    model_dir = save_tiny_model(tmp_path / "model", TinyModelConfig(max_position_embeddings=512))
    out = tmp_path / "s.jsonl"
    generate(model=str(model_dir), dataset="deepscaler", path=str(fixtures / "deepscaler.jsonl"), n=2, limit=2,
             max_new_tokens=6, template="none", progress=False, out=out, backend="transformers",
             token_confidence_k=3)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(len(r["token_confidence"]) == r["n_tokens"] and min(r["token_confidence"]) >= 0 for r in rows)
    assert json.loads((tmp_path / "s.jsonl.meta.json").read_text())["token_confidence_k"] == 3
    s = load_samples(out, deepconf_window=4, deepconf_tail=2)
    want = np.stack([trace_signals(r["token_confidence"], window=4, tail=2) for r in rows])
    np.testing.assert_allclose(s.deepconf_signals, want, rtol=1e-12)


# ------------------------------------------------------------------------------------------------ online


class _ScriptedBackend:
    """Returns the given samples in order, recording each call's count and thresholds."""

    def __init__(self, samples):
        self.samples, self.calls = list(samples), []

    def generate(self, prompts, n, seed, *, stop_below=None, window=2048, on_token=None):
        self.calls.append((len(prompts), n, stop_below))
        return [[self.samples.pop(0) for _ in range(n)] for _ in prompts]


def _sample(confs, *, stopped=False):
    from calibrl.evaluation.backends import _Sample

    return _Sample(ids=list(range(len(confs))), logps=[0.0] * len(confs), ended=not stopped,
                   token_confidence=list(confs), stopped_early=stopped)


def _rows_of(answers):
    answers = iter(answers)
    return lambda problem, group: [{"answer": next(answers), "correct": False} for _ in group]


def test_online_threshold_is_the_warmup_percentile():
    from calibrl.selection.deepconf import online_threshold

    assert online_threshold([1.0, 2.0, 3.0, 4.0, 5.0], 0.1) == pytest.approx(4.6)  # percentile 90
    assert online_threshold([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == pytest.approx(1.4)  # percentile 10
    assert online_threshold([np.nan], 0.1) == -np.inf


def test_online_stops_a_problem_at_consensus_and_counts_only_confident_traces():
    from calibrl.evaluation.deepconf_online import OnlineSettings, sample_online

    # window 2: warm-up lowest windows 5.0 and 3.0; keep 0.5 -> threshold 4.0; only the first votes (A: share 1)
    backend = _ScriptedBackend([_sample([5, 5, 5]), _sample([3, 3, 6])])
    settings = OnlineSettings(warmup=2, keep_fraction=0.5, consensus=0.95, window=2)
    rows = sample_online(backend, [{"prompt": "p"}], n=6, seed=0, settings=settings, rows_of=_rows_of("AB"))[0]
    assert len(backend.calls) == 1 and len(rows) == 2
    assert [r["deepconf_voted"] for r in rows] == [True, False]
    assert all(r["deepconf_threshold"] == 4.0 and r["deepconf_traces"] == 2 and r["deepconf_consensus"] == 1.0
               for r in rows)
    # no consensus: B (5) against A (5); a stopped trace saying B does not vote; a finished one saying A does
    backend = _ScriptedBackend([_sample([5, 5]), _sample([5, 5]), _sample([1, 1], stopped=True), _sample([6, 6]),
                                _sample([9, 9])])
    settings = OnlineSettings(warmup=2, keep_fraction=1.0, consensus=0.6, window=2)
    rows = sample_online(backend, [{"prompt": "p"}], n=5, seed=0, settings=settings, rows_of=_rows_of("ABBAA"))[0]
    # after the warm-up 5 : 5 (0.5); the stopped B adds nothing; A's 6 makes 11 : 5 (0.6875 >= 0.6): stop at 4
    assert [c[1] for c in backend.calls] == [2, 1, 1] and backend.calls[1][2] == [5.0]
    assert [r["stop_reason"] for r in rows] == ["eos", "eos", "deepconf_confidence", "eos"]
    assert [r["deepconf_voted"] for r in rows] == [True, True, False, True]
    assert [r["sample_index"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["deepconf_consensus"] == pytest.approx(11 / 16)


def test_online_by_default_spends_the_whole_budget_and_votes_as_the_authors_code():
    """No consensus rule (the authors' wrapper gives every problem its budget, in one call); the vote takes every
    trace, warm-up or final, whose lowest window (a short trace: its mean) is >= the threshold, with that weight:
    deepconf_reference.online_vote on the same traces."""
    from calibrl.evaluation.deepconf_online import OnlineSettings, sample_online

    rng = np.random.default_rng(5)
    traces = [rng.uniform(0.5, 4.0, size=int(rng.integers(1, 9))).round(4).tolist() for _ in range(12)]
    stopped = [False] * 4 + [bool(x) for x in rng.integers(0, 2, size=8)]
    answers = "AABABBACCABA"
    backend = _ScriptedBackend([_sample(c, stopped=s) for c, s in zip(traces, stopped)])
    settings = OnlineSettings(warmup=4, keep_fraction=0.5, window=3)
    rows = sample_online(backend, [{"prompt": "p"}], n=12, seed=0, settings=settings, rows_of=_rows_of(answers))[0]
    assert [c[1] for c in backend.calls] == [4, 8]  # the warm-up, then the rest at once
    lows = [min(ref.compute_least_grouped(ref.compute_confidence([[-x] for x in c]), 3)) for c in traces]
    bar = ref.online_threshold(lows[:4], 50)
    assert rows[0]["deepconf_threshold"] == pytest.approx(bar)
    voters, weights = ref.online_vote(list(zip(answers[:4], lows[:4])), list(zip(answers[4:], lows[4:])), bar)
    assert [r["answer"] for r in rows if r["deepconf_voted"]] == voters
    assert [r["deepconf_lowest"] for r in rows if r["deepconf_voted"]] == pytest.approx(weights, abs=1e-12)
    assert [r["deepconf_lowest"] for r in rows] == pytest.approx(lows, abs=1e-12)
    short = [i for i, c in enumerate(traces) if len(c) < 3 and not stopped[i]]
    assert short and any(not rows[i]["deepconf_voted"] for i in short)  # a short trace below the bar: dropped


def test_lowest_window_is_the_authors_rounded_value_and_exact_without_rounding():
    from calibrl.evaluation.deepconf_online import lowest_window

    rng = np.random.default_rng(7)
    for length in (1, 2, 5, 17, 40, 300):
        confs = rng.uniform(0, 6, size=length)
        for window in (1, 2, 4, 16, 64):  # even windows: means of 3-decimal values land on halves
            rounded = ref.compute_least_grouped(ref.compute_confidence([[-x] for x in confs]), window)
            assert lowest_window(confs, window) == pytest.approx(min(rounded), abs=1e-12)
            assert lowest_window(confs, window, None) == pytest.approx(trace_signals(confs, window=window)[3])
    assert np.isnan(lowest_window([], 4))


def test_online_generation_stops_traces_at_the_first_window_below_the_threshold():
    """The stop reads each step's top-k confidence before its token is drawn, of the model's own logits (the
    authors' processor: deepconf_reference.processor_confidence), from the window-th token on; the recorded C_i
    stay what vLLM's returned entries give."""
    from calibrl.evaluation.backends import _TransformersBackend
    from calibrl.models import TinyModelConfig, build_tiny_model

    model, tokenizer = build_tiny_model(config=TinyModelConfig(max_position_embeddings=512), seed=0)
    backend = _TransformersBackend(model, tokenizer, temperature=0.8, max_new_tokens=12, class_ids=None,
                                   confidence_k=4)
    prompts = ["What is 2+3?", "Hi"]

    def stop_windows(prompt, sample):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids + sample.ids])).logits[0, len(prompt_ids) - 1:-1].double()
        return np.convolve([ref.processor_confidence(row.tolist(), 4) for row in logits], np.ones(3) / 3, "valid")

    free = backend.generate(prompts, 4, seed=3)
    threshold = float(np.median(np.concatenate([stop_windows(p, x) for p, g in zip(prompts, free) for x in g])))
    stopped = 0
    for prompt, group in zip(prompts, backend.generate(prompts, 6, seed=4, stop_below=[threshold] * 2, window=3)):
        for sample in group:
            windows = stop_windows(prompt, sample)
            if sample.stopped_early:
                stopped += 1
                assert windows[-1] < threshold + 1e-5 and (windows[:-1] >= threshold - 1e-5).all()
            else:
                assert (windows >= threshold - 1e-5).all()
    assert stopped > 0


def test_online_file_rows_say_what_the_vote_did(tmp_path):
    from pathlib import Path

    from calibrl.evaluation.deepconf_online import OnlineSettings, lowest_window
    from calibrl.evaluation.generate import generate, scan_existing
    from calibrl.models import TinyModelConfig, save_tiny_model

    fixtures = Path(__file__).parent / "fixtures"
    model_dir = save_tiny_model(tmp_path / "model", TinyModelConfig(max_position_embeddings=512))
    out = tmp_path / "s.jsonl"
    settings = OnlineSettings(warmup=3, keep_fraction=0.9, window=3)
    generate(model=str(model_dir), dataset="deepscaler", path=str(fixtures / "deepscaler.jsonl"), n=7, limit=2,
             max_new_tokens=12, template="none", progress=False, out=out, backend="transformers",
             deepconf_online=settings)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for r in rows:  # the file's C_i are rounded to 4 decimals, the vote's to 3: equal within their rounding
        assert r["deepconf_lowest"] == pytest.approx(lowest_window(r["token_confidence"], 3), abs=1.001e-3)
        assert r["deepconf_voted"] == (r["answer"] is not None and r["deepconf_lowest"] >= r["deepconf_threshold"])
    assert {r["deepconf_traces"] for r in rows} == {7}  # the whole budget
    assert scan_existing(out, 7)[1] == len(rows)


def test_resume_counts_a_problem_stopped_at_consensus_as_done(tmp_path):
    from calibrl.evaluation.generate import scan_existing

    out = tmp_path / "s.jsonl"
    rows = [{"prompt_id": "a", "deepconf_traces": 2}] * 2 + [{"prompt_id": "b", "deepconf_traces": 3}] * 2
    _write_jsonl(out, rows)
    complete, kept = scan_existing(out, 8)
    assert complete == {"a"} and kept == 2  # b was cut short by a kill: its 2 of 3 rows are dropped


def test_eval_of_an_online_file_votes_like_the_sampler_and_counts_every_token(tmp_path):
    from calibrl.evaluation.samples import load_samples
    from calibrl.evaluation.scoring import evaluate_samples
    from calibrl.evaluation.settings import EvalSettings

    # prompt 0: A (voted, lowest window 2) against B (voted, 3) and B stopped (not voted, 9): B wins, right
    # prompt 1: A voted (1) alone; B (0.5) not voted: A wins, wrong
    def row(p, answer, confs, voted, right):
        return {"prompt_id": p, "answer": answer, "correct": right, "logprob_mean": -1.0, "n_tokens": len(confs),
                "token_confidence": confs, "deepconf_voted": voted}
    rows = [row(0, "A", [2, 2], True, False), row(0, "B", [3, 3, 3], True, True), row(0, "A", [9, 9], False, False),
            row(1, "A", [1, 1], True, False), row(1, "B", [0.5] * 4, False, True)]
    s = load_samples(_write_jsonl(tmp_path / "o.jsonl", rows), deepconf_window=2)
    ids = np.unique(s.answers, return_inverse=True)[1] + 10 * s.prompt_index
    res = evaluate_samples(s, label="o", answer_ids=ids,
                           settings=EvalSettings(methods=("majority", "deepconf_min"), scaling_draws=2, bootstrap=0))
    assert res.metrics["selection"]["deepconf_online"] == 0.5
    assert res.metrics["selection"]["deepconf_min"] == 0.0  # every path voting: A's 2 + 9 beats B's 3; A's 1 B's 0.5
    assert res.metrics["selection_tokens_per_prompt"] == pytest.approx((7 + 6) / 2)
    assert res.metrics["scaling"]["majority"]["tokens"] == pytest.approx([2.6, 5.2])  # N x 13 / 5


def test_parquet_null_lists_and_nulls_inside_a_list(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from calibrl.evaluation.samples import load_samples

    table = pa.table({"prompt_id": [0, 0, 1], "correct": [True, False, True], "logprob_mean": [-0.1, -0.2, -0.3],
                      "token_confidence": pa.array([[1.0, 3.0], None, [2.0, None, 4.0]],
                                                   type=pa.list_(pa.float16()))})
    pq.write_table(table, tmp_path / "s.parquet")
    s = load_samples(tmp_path / "s.parquet", deepconf_window=2, deepconf_tail=1)
    np.testing.assert_allclose(s.deepconf_signals[0], [2.0, 3.0, 2.0, 2.0])
    assert np.isnan(s.deepconf_signals[1]).all()
    np.testing.assert_allclose(s.deepconf_signals[2], [3.0, 4.0, 3.0, 3.0])  # the null position skipped


def test_repeated_rows_without_completion_compare_their_token_confidence(tmp_path):
    from calibrl.evaluation.samples import SamplesError, load_samples

    row = {"prompt_id": 0, "sample_index": 0, "correct": True, "logprob_mean": -0.1, "token_confidence": [1.0, 2.0]}
    s = load_samples(_write_jsonl(tmp_path / "same.jsonl", [row, dict(row)]))
    assert len(s) == 1 and s.skipped == {"repeated sample": 1}
    with pytest.raises(SamplesError, match="sample_index"):
        load_samples(_write_jsonl(tmp_path / "other.jsonl", [row, {**row, "token_confidence": [1.0, 2.5]}]))


def test_cli_eval_with_deepconf_methods_and_window_options(tmp_path):
    from typer.testing import CliRunner

    from calibrl.cli import app

    rng = np.random.default_rng(0)
    rows = [{"prompt_id": p, "answer": str(a), "correct": bool(a == 0), "logprob_mean": -0.5, "n_tokens": 12,
             "token_confidence": (rng.random(12) + (a == 0)).round(4).tolist()}
            for p in range(6) for a in rng.integers(0, 3, size=4)]
    path = _write_jsonl(tmp_path / "s.jsonl", rows)
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(path), "--out", str(tmp_path / "r"), "--bootstrap", "0",
                                      "--no-math-verify", "--methods", "majority,deepconf_min,deepconf_tail_top10",
                                      "--deepconf-window", "4", "--deepconf-tail", "3"])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())["results"]["overall"]["s"]
    assert set(metrics["selection"]) == {"majority", "deepconf_min", "deepconf_tail_top10"}
    assert metrics["confidence_sources"]["deepconf_bottom10"]["ece"] is None
    assert metrics["selection_tokens_per_prompt"] == 48.0
    report = (tmp_path / "r" / "report.md").read_text()
    assert "DeepConf: top 10% by tail confidence" in report and "Tokens spent per prompt" in report
    bad = CliRunner().invoke(app, ["eval", "--no-figures", str(path), "--out", str(tmp_path / "r2"), "--methods", "deepconf_nope"])
    assert bad.exit_code == 2 and "deepconf_nope" in bad.output


def test_parquet_arrays_read_in_small_batches_and_slices_match_their_rows(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from calibrl.evaluation.readers import base
    from calibrl.evaluation.samples import load_samples

    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 40, size=23)
    confs = [rng.uniform(0, 4, size=k).astype(np.float16) for k in lengths]
    table = pa.table({"prompt_id": list(range(23)), "correct": [True] * 23, "logprob_mean": [-0.1] * 23,
                      "token_confidence": pa.array([c.tolist() if i != 5 else None for i, c in enumerate(confs)],
                                                   type=pa.list_(pa.float16()))})
    pq.write_table(table, tmp_path / "s.parquet", row_group_size=7)
    monkeypatch.setattr(base, "_PARQUET_BATCH_BYTES", 200)  # a few rows per batch
    monkeypatch.setattr(base, "_PARQUET_CHUNK_BYTES", 100)  # and a few per slice of a batch
    assert base._batch_rows(pq.ParquetFile(tmp_path / "s.parquet").metadata) < 23
    s = load_samples(tmp_path / "s.parquet", deepconf_window=4, deepconf_tail=3)
    for i, c in enumerate(confs):
        want = np.full(4, np.nan) if i == 5 else trace_signals(c.astype(np.float64), window=4, tail=3)
        np.testing.assert_allclose(s.deepconf_signals[i], want, rtol=1e-12)


def test_cli_generate_deepconf_online_and_its_refusals(tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from calibrl.cli import app
    from calibrl.models import TinyModelConfig, save_tiny_model

    fixtures = Path(__file__).parent / "fixtures"
    model_dir = save_tiny_model(tmp_path / "model", TinyModelConfig(max_position_embeddings=512))
    out = tmp_path / "o.jsonl"
    args = ["generate", "--model", str(model_dir), "--dataset", "deepscaler", "--path",
            str(fixtures / "deepscaler.jsonl"), "--limit", "1", "--n", "3", "--max-new-tokens", "6", "--template",
            "none", "--quiet", "--out", str(out), "--deepconf-online", "--deepconf-warmup", "2",
            "--deepconf-window", "3", "--deepconf-keep", "0.5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["deepconf_phase"] for r in rows][:2] == ["warmup", "warmup"] and 2 <= len(rows) <= 3
    meta = json.loads((tmp_path / "o.jsonl.meta.json").read_text())["deepconf_online"]
    assert meta == {"warmup": 2, "keep_fraction": 0.5, "consensus": None, "window": 3, "round_size": 1,
                    "round_decimals": 3}
    plain = args[:args.index("--deepconf-online")]  # the same run without the online mode
    for extra, problem in ((["--deepconf-window", "16"], "--deepconf-window: a DeepConf online setting, used only "
                                                         "with --deepconf-online"),
                           (["--deepconf-keep", "0.9", "--deepconf-exact-windows"],
                            "--deepconf-keep, --deepconf-exact-windows: DeepConf online settings")):
        refused = CliRunner().invoke(app, plain + extra + ["--overwrite"])
        assert refused.exit_code == 2 and problem in " ".join(refused.output.split()), refused.output
    refused = CliRunner().invoke(app, args + ["--deepconf-round", "4", "--overwrite"])
    assert refused.exit_code == 2 and "needs --deepconf-consensus" in " ".join(refused.output.split())
    for extra, problem in ((["--backend", "vllm"], "transformers backend only"),
                           (["--token-confidence-k", "0"], "token_confidence_k >= 1"),
                           (["--deepconf-warmup", "5"], "between 1 and n = 3")):
        bad = CliRunner().invoke(app, args + extra + ["--overwrite"])
        assert bad.exit_code == 2 and problem in bad.output, bad.output


def test_the_report_says_why_the_four_signals_agree_when_no_trace_fills_a_window(tmp_path):
    from typer.testing import CliRunner

    from calibrl.cli import app

    rng = np.random.default_rng(4)
    rows = [{"prompt_id": p, "correct": bool(rng.random() < 0.5), "answer": str(k % 3), "logprob_mean": -0.5,
             "token_confidence": rng.uniform(0, 3, size=30).tolist()} for p in range(10) for k in range(4)]
    path = str(_write_jsonl(tmp_path / "s.jsonl", rows))
    for out, extra, said in (("short", [], True), ("window", ["--deepconf-window", "8", "--deepconf-tail", "8"], False)):
        result = CliRunner().invoke(app, ["eval", "--no-figures", path, "--out", str(tmp_path / out), "--methods", "",
                                          "--bootstrap", "30", *extra])
        assert result.exit_code == 0, result.output
        text = " ".join((tmp_path / out / "report.md").read_text().split())
        assert ("the four DeepConf signals are equal on every row" in text) is said
