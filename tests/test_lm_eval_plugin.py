"""calibrl.lm_eval inside a real lm-evaluation-harness run: a tiny random model made here, a local multiple-choice
file, the calibrated task written by ``python -m calibrl.lm_eval``, lm-eval's own results table read, and
``calibrl eval`` on the same run's ``--log_samples`` file giving the same numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from calibrl import metrics as M  # noqa: E402
from calibrl.cli import app  # noqa: E402
from calibrl.lm_eval import FIGURES, main, write_task_files  # noqa: E402

TASK_YAML = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}} ="
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: brier_score
    aggregation: brier_score
    higher_is_better: false
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm_eval_task")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(48):
        a, b = int(rng.integers(0, 9)), int(rng.integers(0, 9))
        options = sorted({a + b, a + b + 1, abs(a - b) + 2, a * b + 3} | {a + b + 4})[:4]
        rng.shuffle(options)
        rows.append({"question": f"{a}+{b}", "choices": [str(o) for o in options],
                     "label": [str(o) for o in options].index(str(a + b))})
    data = folder / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "tiny_mc.yaml").write_text(TASK_YAML.format(data=data))
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from calibrl.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_lm") / "model", seed=3)


def _evaluate(model_dir, include, tasks, out):
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    tracker = EvaluationTracker(output_path=str(out))
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32", tasks=tasks,
                                      # lm-eval's own thousands of tasks are not indexed: 15 s saved
                                      task_manager=TaskManager(include_path=[str(p) for p in include],
                                                               include_defaults=False),
                                      device="cpu", batch_size=16, log_samples=True, bootstrap_iters=0,
                                      evaluation_tracker=tracker)
    tracker.save_results_aggregated(results=results, samples=results["samples"])
    for name in tasks:
        tracker.save_results_samples(task_name=name, samples=results["samples"][name])
    return results


def test_a_calibrated_task_reports_calibrls_figures_equal_to_calibrl_eval(task_dir, model_dir, tmp_path, capsys):
    calibrated = tmp_path / "calibrated"
    assert main([str(task_dir / "tiny_mc.yaml"), "--out", str(calibrated)]) == 0
    assert "--tasks tiny_mc_calibrl" in capsys.readouterr().out
    results = _evaluate(model_dir, [task_dir, calibrated], ["tiny_mc_calibrl"], tmp_path / "out")
    table = results["results"]["tiny_mc_calibrl"]
    for name in FIGURES:
        assert isinstance(table[f"{name},none"], float), name
    assert results["higher_is_better"]["tiny_mc_calibrl"]["auroc"] is True
    assert results["higher_is_better"]["tiny_mc_calibrl"]["ece"] is False

    # the confidence, by hand: the softmax of the options' summed log-likelihoods, at the chosen option
    samples = results["samples"]["tiny_mc_calibrl"]
    conf, right = [], []
    for s in samples:
        lls = [float(r[0][0]) for r in s["resps"]]
        top = int(np.argmax(lls))
        conf.append(math.exp(lls[top]) / sum(math.exp(v) for v in lls))
        right.append(top == s["target"] if isinstance(s["target"], int) else top == int(s["target"]))
    conf, right = np.array(conf), np.array(right)
    assert table["acc,none"] == pytest.approx(right.mean())  # the chosen option is lm-eval's acc prediction
    assert table["ece,none"] == pytest.approx(M.ece(conf, right, n_bins=10), rel=1e-9)
    assert table["brier,none"] == pytest.approx(np.mean((conf - right) ** 2), rel=1e-9)
    assert table["auroc,none"] == pytest.approx(M.auroc(conf, right), rel=1e-9)
    # lm-eval's own multi-class Brier is a different figure, and is still there
    assert table["brier_score,none"] != pytest.approx(table["brier,none"])

    # calibrl eval on the samples file lm-eval wrote: the same numbers
    (samples_file,) = (tmp_path / "out").rglob("samples_tiny_mc_calibrl_*.jsonl")
    report = tmp_path / "report"
    res = CliRunner().invoke(app, ["eval", str(samples_file), "--format", "lm-eval", "--out", str(report),
                                   "--no-figures"])
    assert res.exit_code == 0, res.output
    (ours,) = json.loads((report / "metrics.json").read_text())["results"]["overall"].values()
    for name in FIGURES:
        assert table[f"{name},none"] == ours[name], name


def test_write_task_files_finds_a_task_by_name_and_refuses_what_it_cannot_calibrate(task_dir, tmp_path):
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    (by_name,) = write_task_files(["tiny_mc"], tmp_path / "x", task_manager=manager)
    assert by_name.name == "tiny_mc_calibrl.yaml"
    assert f"include: {(task_dir / 'tiny_mc.yaml').resolve()}" in by_name.read_text()
    with pytest.raises(SystemExit, match="knows no task 'no_such_task'"):
        write_task_files(["no_such_task"], tmp_path / "x", task_manager=manager)
    out = tmp_path / "y"
    (first,) = write_task_files([str(task_dir / "tiny_mc.yaml")], out)
    assert write_task_files([str(task_dir / "tiny_mc.yaml")], out) == [first]  # the same file again: kept
    first.write_text("task: mine\n")
    with pytest.raises(SystemExit, match="exists with other content"):
        write_task_files([str(task_dir / "tiny_mc.yaml")], out)
    assert first.read_text() == "task: mine\n"  # the user's file is not replaced


def test_a_generation_task_is_refused_by_name(tmp_path):
    from calibrl.lm_eval import CalibratedTask

    config = {"task": "gen", "dataset_path": "json", "output_type": "generate_until",
              "dataset_kwargs": {"data_files": {"test": str(tmp_path / "d.jsonl")}}, "test_split": "test",
              "doc_to_text": "{{q}}", "doc_to_target": "{{a}}"}
    (tmp_path / "d.jsonl").write_text(json.dumps({"q": "1+1", "a": "2"}) + "\n")
    with pytest.raises(ValueError, match="task 'gen' has output_type 'generate_until'"):
        CalibratedTask(config=config)


def test_calibrated_turns_a_built_task_into_one_that_scores_the_chosen_options_probability(task_dir):
    """The Python form, by hand: one document's item is (the chosen option's softmax probability, right)."""
    from lm_eval.tasks import TaskManager

    from calibrl.lm_eval import CalibratedTask, calibrated

    (task,) = TaskManager(include_path=str(task_dir), include_defaults=False).load(["tiny_mc"])["tasks"].values()
    twin = calibrated(task)
    assert isinstance(twin, CalibratedTask) and twin.config.task == "tiny_mc"
    doc = next(iter(twin.test_docs()))
    label = doc["label"]
    lls = [-4.0] * 4
    lls[label] = -1.0  # the target is the surest option
    lls[(label + 1) % 4] = -1.5
    out = twin.process_results(doc, [(v, False) for v in lls])
    expected = math.exp(-1.0) / (math.exp(-1.0) + math.exp(-1.5) + 2 * math.exp(-4.0))
    assert out["acc"] == 1.0 and "likelihood" not in out  # the task's own metrics, nothing added but calibrl's
    for name in FIGURES:
        assert out[name][0] == pytest.approx(expected, rel=1e-15) and out[name][1] is True
    lls[(label + 2) % 4] = 0.0  # now a wrong option is chosen
    conf, right = twin.process_results(doc, [(v, False) for v in lls])["ece"]
    assert right is False and conf == pytest.approx(1 / (1 + math.exp(-1.0) + math.exp(-1.5) + math.exp(-4.0)))
    # two documents in two bins, by hand: ECE = the mean of |confidence - right|
    items = [(0.95, True), (0.35, False)]
    assert twin.aggregation()["ece"](items) == pytest.approx((0.05 + 0.35) / 2)
    assert twin.aggregation()["brier"](items) == pytest.approx((0.05 ** 2 + 0.35 ** 2) / 2)
    assert twin.aggregation()["auroc"](items) == pytest.approx(1.0)
    assert twin.higher_is_better()["auroc"] is True and twin.higher_is_better()["ece"] is False
