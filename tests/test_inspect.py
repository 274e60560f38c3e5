"""calibrl.inspect inside a real Inspect AI evaluation: inspect_ai.eval on a small task, Inspect's mock model
returning outputs with log-probabilities, the figures read from Inspect's own log and compared with
``calibrl eval`` on the same samples."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("inspect_ai")

from inspect_ai import Task  # noqa: E402
from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.dataset import Sample  # noqa: E402
from inspect_ai.log import read_eval_log  # noqa: E402
from inspect_ai.model import (  # noqa: E402
    ChatCompletionChoice,
    ChatMessageAssistant,
    GenerateConfig,
    Logprob,
    Logprobs,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.scorer import match  # noqa: E402
from inspect_ai.solver import generate  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from calibrl import metrics as M  # noqa: E402
from calibrl.cli import app  # noqa: E402
from calibrl.inspect import CONFIDENCE_KEY, FIGURES, SCORE_KEY, confidence_scorer  # noqa: E402

N = 40


def _plan(seed: int = 0) -> dict[str, tuple[str, list[float] | None]]:
    """question -> (the model's answer, its tokens' log-probabilities): right answers are surer on average, so the
    figures are neither 0 nor 1."""
    rng = np.random.default_rng(seed)
    plan = {}
    for i in range(N):
        right = bool(rng.random() < 0.6)
        answer = str(i) if right else str(i + 1)  # never ends with str(i): match() says wrong
        lps = (-rng.exponential(0.15 if right else 0.5, size=int(rng.integers(2, 6)))).tolist()
        plan[f"What is {i} + 0?"] = (answer, lps)
    return plan


def _model(plan, no_logprobs=()):
    def respond(messages, tools, tool_choice, config):
        question = messages[-1].text
        answer, lps = plan[question]
        logprobs = None if question in no_logprobs or lps is None else Logprobs(
            content=[Logprob(token=f"t{k}", logprob=lp) for k, lp in enumerate(lps)])
        return ModelOutput(model="mockllm/model", completion=answer, choices=[ChatCompletionChoice(
            message=ChatMessageAssistant(content=answer, model="mockllm/model"), stop_reason="stop",
            logprobs=logprobs)],
            # given, so the mock model does not count tokens (its count needs a tokenizer download)
            usage=ModelUsage(input_tokens=8, output_tokens=len(lps or [0]), total_tokens=8 + len(lps or [0])))

    return get_model("mockllm/model", custom_outputs=respond, config=GenerateConfig(logprobs=True))


def _task(plan, **scorer_args):
    samples = [Sample(input=q, target=str(i), id=f"s{i:02d}") for i, q in enumerate(plan)]
    return Task(dataset=samples, solver=generate(), scorer=confidence_scorer(match(), **scorer_args))


def _run(tmp_path, task, model):
    (log,) = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    return read_eval_log(log.location)  # what Inspect wrote, read back


def _metrics(log) -> dict:
    """The scorer's metrics in the log: Inspect keeps its reduced ones (accuracy, stderr) and calibrl's, which
    take every epoch's score, in two entries of the scorer's name."""
    out = {}
    for entry in log.results.scores:
        assert entry.scorer == "confidence_scorer"
        out.update({name: m.value for name, m in entry.metrics.items()})
    return out


def test_inspect_reports_calibrls_figures_equal_to_calibrl_eval(tmp_path):
    plan = _plan()
    log = _run(tmp_path, _task(plan), _model(plan))
    metrics = _metrics(log)
    assert {"accuracy", "stderr", *FIGURES, "no_confidence"} <= set(metrics)
    assert metrics["no_confidence"] == 0

    # each sample's verdict is match()'s and its confidence the exp of its mean token log-probability
    rows = []
    for sample in log.samples:
        score = sample.scores["confidence_scorer"]
        answer, lps = plan[sample.input]
        assert score.value == ("C" if answer == sample.target else "I")
        assert score.metadata[SCORE_KEY] == pytest.approx(sum(lps) / len(lps), abs=1e-15)
        assert score.metadata[CONFIDENCE_KEY] == pytest.approx(math.exp(sum(lps) / len(lps)), rel=1e-15)
        rows.append({"prompt_id": sample.id, "correct": score.value == "C",
                     "logprob_mean": score.metadata[SCORE_KEY]})
    right = np.array([r["correct"] for r in rows])
    assert 0.3 < right.mean() < 0.9
    assert metrics["accuracy"] == pytest.approx(right.mean())

    # calibrl eval on the same samples: the same numbers
    src = tmp_path / "samples.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["eval", str(src), "--out", str(out), "--no-figures"])
    assert res.exit_code == 0, res.output
    ours = json.loads((out / "metrics.json").read_text())["results"]["overall"]["samples"]
    for name in FIGURES:
        # to the last digit: the ids sort in the order Inspect scores the samples, as calibrl eval orders them, so
        # both add the bins' sums in one order (in another order they differ in the 16th digit)
        assert metrics[name] == ours[name], name
    # and against the library directly: a wrong direction or a missing term would show here
    conf = np.exp([r["logprob_mean"] for r in rows])
    assert metrics["ece"] == pytest.approx(M.ece(conf, right, n_bins=10))
    assert metrics["brier"] == pytest.approx(np.mean((conf - right) ** 2))
    assert metrics["auroc"] == pytest.approx(M.auroc(conf, right))
    assert metrics["auroc"] > 0.6  # right answers were drawn surer


def test_samples_without_log_probs_are_counted_and_left_out(tmp_path, caplog):
    plan = _plan(seed=1)
    missing = list(plan)[:3]
    log = _run(tmp_path, _task(plan), _model(plan, no_logprobs=set(missing)))
    metrics = _metrics(log)
    assert metrics["no_confidence"] == 3
    kept = [s.scores["confidence_scorer"] for s in log.samples if s.input not in missing]
    assert all(s.metadata[CONFIDENCE_KEY] is not None for s in kept)
    conf = np.array([s.metadata[CONFIDENCE_KEY] for s in kept])
    right = np.array([s.value == "C" for s in kept])
    assert metrics["brier"] == pytest.approx(np.mean((conf - right) ** 2))
    assert metrics["accuracy"] == pytest.approx(np.mean([s.scores["confidence_scorer"].value == "C"
                                                         for s in log.samples]))  # Inspect's: every sample


def test_stated_and_user_confidences(tmp_path):
    plan = {f"q{i}": (f"{i % 3}<confidence>{0.2 + 0.15 * (i % 5)}</confidence>" if i != 4 else "1", None)
            for i in range(12)}
    samples = [Sample(input=q, target=str(i % 3 if i % 2 else 9), id=i) for i, q in enumerate(plan)]

    def run(confidence):
        task = Task(dataset=samples, solver=generate(), scorer=confidence_scorer(match(location="begin"),
                                                                                  confidence=confidence))
        return _run(tmp_path, task, _model(plan))

    stated = run("stated")
    scores = {s.id: s.scores["confidence_scorer"] for s in stated.samples}
    assert scores[4].metadata[CONFIDENCE_KEY] is None  # no tag: counted, not guessed
    assert scores[3].metadata[CONFIDENCE_KEY] == pytest.approx(0.65)
    metrics = _metrics(stated)
    assert metrics["no_confidence"] == 1
    kept = [s for i, s in scores.items() if i != 4]
    conf = np.array([s.metadata[CONFIDENCE_KEY] for s in kept])
    right = np.array([s.value == "C" for s in kept])
    assert metrics["ece"] == pytest.approx(M.ece(conf, right, n_bins=10))

    async def half(state):  # a user's function, async
        return 0.5

    constant = _metrics(run(half))
    rate = np.mean([s.value == "C" for s in scores.values()])
    assert constant["ece"] == pytest.approx(abs(0.5 - rate))  # one bin holds every sample
    assert constant["auroc"] == pytest.approx(0.5)  # all tied


def test_a_confidence_outside_zero_one_names_the_sample(tmp_path):
    plan = _plan()
    task = Task(dataset=[Sample(input=next(iter(plan)), target="0", id="only")], solver=generate(),
                scorer=confidence_scorer(match(), confidence=lambda state: 1.5))
    (log,) = inspect_eval(task, model=_model(plan), log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "error"
    assert "returned 1.5 for sample" in log.error.message and "only" in log.error.message
    with pytest.raises(ValueError, match="unknown confidence 'perplexity'"):
        confidence_scorer(match(), confidence="perplexity")


def test_a_null_ranking_score_ranks_by_the_confidence():
    """A user's scorer may write ``calibrl_score: None``: the figures then rank by the confidence, as when the key
    is absent (hand-checked AUROC: the two right samples above the two wrong ones but one tie, 3.5 / 4)."""
    from inspect_ai.scorer import SampleScore, Score

    from calibrl.inspect import auroc

    conf, right = [0.9, 0.6, 0.6, 0.2], [1, 1, 0, 0]

    def scores(with_key: bool) -> list:
        return [SampleScore(score=Score(value=y, metadata={CONFIDENCE_KEY: c, **({SCORE_KEY: None} if with_key
                                                                                   else {})}), sample_id=i)
                for i, (c, y) in enumerate(zip(conf, right))]

    assert auroc()(scores(True)) == auroc()(scores(False)) == pytest.approx(3.5 / 4)


def test_inspect_score_rescoring_a_log_by_name_on_its_command_line(tmp_path):
    """The entry point: in a fresh process Inspect resolves calibrl/confidence_scorer and calibrl/<figure> by
    name; ``inspect score`` rescoring a log of plain match() gives the figures of the run scored in process."""
    import os
    import subprocess
    import sys
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="inspect_ai") if ep.name == "calibrl"]
    assert ep.value == "calibrl.inspect"
    plan = _plan(seed=2)
    scored = _metrics(_run(tmp_path / "a", _task(plan), _model(plan)))
    samples = [Sample(input=q, target=str(i), id=f"s{i:02d}") for i, q in enumerate(plan)]
    plain = _run(tmp_path / "b", Task(dataset=samples, solver=generate(), scorer=match()), _model(plan))
    rescored = tmp_path / "rescored.eval"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # calibrl as installed, not this checkout
    cli = [str(__import__("pathlib").Path(sys.executable).parent / "inspect"), "score", plain.location,
           "--scorer", "calibrl/confidence_scorer", "-S", "base=match", "-S", "confidence=logprob_mean",
           "--action", "overwrite", "--output-file", str(rescored), "--display", "none"]
    run = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    again = _metrics(read_eval_log(str(rescored)))
    for name in FIGURES:
        assert again[name] == pytest.approx(scored[name], rel=1e-12), name
