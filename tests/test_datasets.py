"""Real-benchmark loaders from local files in the hub datasets' own formats (tests/fixtures/, JSONL / JSON /
Parquet); no network."""

import json
from pathlib import Path

import pytest

from calibrl.tasks.datasets import HUB, MATH_INSTRUCTION, decision_prompt, load_table, math_prompt
from calibrl.tasks.registry import available_datasets, get_dataset_loader, get_reward

FIXTURES = Path(__file__).parent / "fixtures"
MATH = ["deepscaler", "math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench"]
DECISION = ["commonsenseqa", "openbookqa"]


def test_all_benchmarks_registered_with_hub_ids():
    names = set(available_datasets())
    for name in MATH + DECISION:
        assert name in names
        assert name in HUB
    assert HUB["deepscaler"][0] == "agentica-org/DeepScaleR-Preview-Dataset"
    assert HUB["math500"][0] == "HuggingFaceH4/MATH-500"
    assert HUB["commonsenseqa"][0] == "tau/commonsense_qa"
    assert HUB["openbookqa"][:2] == ("allenai/openbookqa", "main")


@pytest.mark.parametrize("name", MATH)
def test_math_loaders_map_to_calibrl_fields(name):
    ds = get_dataset_loader(name)(path=FIXTURES / f"{name}.jsonl")
    assert {"prompt", "answer", "benchmark", "prompt_id"} <= set(ds.column_names)
    assert len(ds) >= 2
    assert all(row["benchmark"] == name for row in ds)
    assert len(set(ds["prompt_id"])) == len(ds)
    assert all(row["prompt"].endswith(MATH_INSTRUCTION) for row in ds)
    assert all(isinstance(a, str) and a for a in ds["answer"])


def test_specific_column_mappings():
    deepscaler = get_dataset_loader("deepscaler")(path=FIXTURES / "deepscaler.jsonl")
    assert len(deepscaler) == 3  # the row with an empty answer is dropped
    assert deepscaler["prompt_id"] == ["deepscaler-0", "deepscaler-1", "deepscaler-3"]
    math500 = get_dataset_loader("math500")(path=FIXTURES / "math500.jsonl")
    assert math500[0]["prompt_id"] == "test/prealgebra/1.json"  # unique_id
    amc = get_dataset_loader("amc23")(path=FIXTURES / "amc23.jsonl")
    assert amc["answer"] == ["2", "0.75"]  # float answers as exact strings
    oly = get_dataset_loader("olympiadbench")(path=FIXTURES / "olympiadbench.jsonl")
    assert oly["answer"] == ["2, -2", "120"]  # final_answer list, $ removed
    assert oly[0]["prompt"].startswith("Find all $x$")
    aime = get_dataset_loader("aime24")(path=FIXTURES / "aime24.jsonl")
    assert aime["prompt_id"] == ["60", "61"]


@pytest.mark.parametrize("name", DECISION)
def test_decision_loaders(name):
    ds = get_dataset_loader(name)(path=FIXTURES / f"{name}.jsonl")
    assert {"prompt", "classes", "label", "benchmark", "prompt_id"} <= set(ds.column_names)
    assert len(ds) == 2  # CommonsenseQA's unlabelled row is dropped
    for row in ds:
        assert row["label"] in row["classes"]
        assert row["prompt"].endswith("Answer: ")  # the next token is the decision letter
        for letter in row["classes"]:
            assert f"\n{letter}. " in row["prompt"]
    # the decision reward reads the same columns
    reward = get_reward("decision")
    assert reward(ds["prompt"], [f"Answer: {lab}" for lab in ds["label"]], classes=ds["classes"], label=ds["label"]) == [1.0, 1.0]


def test_local_formats_json_parquet_and_directories(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (FIXTURES / "math500.jsonl").read_text().splitlines()]
    (tmp_path / "list.json").write_text(json.dumps(rows))
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": rows}))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    loader = get_dataset_loader("math500")
    expected = loader(path=FIXTURES / "math500.jsonl")
    for file in ("list.json", "wrapped.json", "m.parquet"):
        ds = loader(path=tmp_path / file)
        assert ds["prompt"] == expected["prompt"] and ds["answer"] == expected["answer"]
    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:1]), folder / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[1:]), folder / "part-1.parquet")
    assert loader(path=folder)["answer"] == expected["answer"]
    # commonsense-qa's nested choices survive Parquet
    csqa = [json.loads(line) for line in (FIXTURES / "commonsenseqa.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(csqa), tmp_path / "c.parquet")
    assert get_dataset_loader("commonsenseqa")(path=tmp_path / "c.parquet")["label"] == ["B", "A"]


def test_limit_templates_and_errors(tmp_path):
    loader = get_dataset_loader("math500")
    assert len(loader(path=FIXTURES / "math500.jsonl", limit=1)) == 1
    assert loader(path=FIXTURES / "math500.jsonl", template="none")[0]["prompt"] == "What is $2+3$?"
    chat = loader(path=FIXTURES / "math500.jsonl", template="chat")[0]["prompt"]
    assert chat[0]["role"] == "user" and MATH_INSTRUCTION in chat[0]["content"]
    qwen = loader(path=FIXTURES / "math500.jsonl", template="qwen-math-chat")[0]["prompt"]
    assert qwen.startswith("<|im_start|>system\n" + MATH_INSTRUCTION) and qwen.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="unknown math template"):
        loader(path=FIXTURES / "math500.jsonl", template="fancy")
    with pytest.raises(FileNotFoundError):
        loader(path=tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "x", "answer": "1"}\n{not json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_table(bad)
    reasoning = get_dataset_loader("openbookqa")(path=FIXTURES / "openbookqa.jsonl", template="reasoning")[0]["prompt"]
    assert "Think step by step" in reasoning and 'Answer: <letter>' in reasoning


def test_templates_text():
    assert math_prompt(" 1+1? ") == "1+1?\n" + MATH_INSTRUCTION
    prompt = decision_prompt("Q?", ["x", "y"], ["A", "B"])
    assert prompt == "Question: Q?\nOptions:\nA. x\nB. y\nReply with the letter of the correct option (A or B).\nAnswer: "


def test_hub_failure_message_points_to_local_files(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="--path"):
        get_dataset_loader("aime25")()


def test_verl_export_round_trips_through_verl_compute_score(tmp_path):
    import pyarrow.parquet as pq

    from calibrl.tasks.datasets import _main, to_verl_rows
    from calibrl.tasks.rewards import verl_compute_score

    math_rows = to_verl_rows(get_dataset_loader("aime24")(path=FIXTURES / "aime24.jsonl"))
    assert math_rows[0]["prompt"][0]["role"] == "user" and math_rows[0]["reward_model"]["ground_truth"] == "21"
    assert verl_compute_score(math_rows[0]["data_source"], r"\boxed{21}", "21", math_rows[0]["extra_info"]) == 1.0
    out = tmp_path / "csqa.parquet"
    _main(["commonsenseqa", str(out), "--path", str(FIXTURES / "commonsenseqa.jsonl")])
    rows = pq.read_table(out).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["B", "A"]
    assert all(r["ability"] == "decision" and r["extra_info"]["classes"] == list("ABCDE") for r in rows)
    r = rows[0]
    assert verl_compute_score(r["data_source"], "so... Answer: B", r["reward_model"]["ground_truth"], r["extra_info"]) == 1.0
    assert verl_compute_score(r["data_source"], "so... Answer: C", r["reward_model"]["ground_truth"], r["extra_info"]) == 0.0


def test_load_file_tells_the_task_from_the_fields(tmp_path):
    from calibrl.tasks.datasets import load_file

    math = tmp_path / "mine.jsonl"
    math.write_text(json.dumps({"question": "1+1?", "solution": "so \\boxed{2}."}) + "\n"
                    + json.dumps({"question": "no gold", "solution": "none"}) + "\n")
    ds = load_file(math)
    assert ds["answer"] == ["2"] and ds["benchmark"] == ["mine"] and ds["prompt_id"] == ["mine-0"]
    assert ds["prompt"][0].endswith(MATH_INSTRUCTION)
    ready = tmp_path / "ready.jsonl"
    ready.write_text(json.dumps({"prompt": "Q: 1+1? A:", "answer": 2, "id": "x"}) + "\n")
    assert load_file(ready)[0] == {"prompt": "Q: 1+1? A:", "answer": "2", "benchmark": "ready", "prompt_id": "x"}
    choice = load_file(FIXTURES / "commonsenseqa.jsonl")
    assert choice[0]["classes"] == ["A", "B", "C", "D", "E"] and choice[0]["prompt"].endswith("Answer: ")
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"text": "hello"}) + "\n")
    with pytest.raises(ValueError, match="odd.jsonl: cannot tell the task from the fields \\(text\\)"):
        load_file(odd)


def test_export_command_refuses_an_unknown_dataset_in_one_line(capsys):
    import pytest

    from calibrl.tasks.datasets import _main

    with pytest.raises(SystemExit) as exc:
        _main(["no_such_dataset", "out.parquet"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown dataset 'no_such_dataset'")
