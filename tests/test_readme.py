"""The README's testbed table is the first table that ``studies/testbed.py`` generates into
``docs/results/headline.md`` (the matched-accuracy one): keep them equal; the README stays one page; and every
README python block runs as shown on a CPU (:func:`test_readme_python_block_runs_on_a_cpu` says what it swaps)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


def _first_table(text: str) -> list[str]:
    rows: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return [row for row in rows if row.startswith("| ")]  # without the |---| line


def test_readme_holds_every_row_of_the_generated_matched_accuracy_table():
    headline = _first_table((ROOT / "docs" / "results" / "headline.md").read_text())
    assert len(headline) > 2, "docs/results/headline.md's first table has no rows"
    readme = set(_table_rows((ROOT / "README.md").read_text()))
    assert headline, "docs/results/headline.md has no table"
    missing = [row for row in headline if row not in readme]
    assert not missing, f"README.md lacks these rows of docs/results/headline.md: {missing}"


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert targets
    broken = [t for t in targets if not (ROOT / t).exists()]
    assert not broken, f"README.md links to missing files: {broken}"


def test_readme_is_one_page():
    assert len((ROOT / "README.md").read_text()) <= 12_000


def test_moved_pages_links_resolve():
    for page in ("docs/tour.md", "docs/results/README.md", "docs/benchmarks.md", "docs/layout.md"):
        path = ROOT / page
        targets = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()) if "://" not in t]
        broken = [t for t in targets if not (path.parent / t).exists()]
        assert not broken, f"{page} links to missing files: {broken}"


# ---------------------------------------------------------------------------------------------------- python blocks
# What a CPU test cannot fetch is swapped, and only that: the hub model id becomes a tiny local model saved by
# calibrl.models.save_tiny_model, ``reward_funcs=[...]`` a parity reward, ``train_dataset`` a few prompts, and the
# run happens in a temporary folder; ``trainer.train()`` runs one step with short completions. Everything else (the
# config's arguments, the imports) runs as written, so a config that refuses a CPU fails here.

README = ROOT / "README.md"
HUB_MODELS = ("Qwen/Qwen2.5-Math-1.5B",)


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _parity_reward(prompts, completions, **kwargs):
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


def test_the_readme_has_python_blocks():
    assert len(_python_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_readme_python_block_runs_on_a_cpu(index, tmp_path, monkeypatch):
    from datasets import Dataset

    from calibrl.models import TinyModelConfig, save_tiny_model

    code = _python_blocks()[index]
    for hub_id in HUB_MODELS:
        if hub_id in code:
            tiny = save_tiny_model(tmp_path / "tiny", TinyModelConfig(max_position_embeddings=512))
            code = code.replace(f'"{hub_id}"', repr(str(tiny)))
    code = code.replace("reward_funcs=[...]", "reward_funcs=[_parity_reward]")
    # one short step: the trainer as the README builds it, its run length shortened
    code = code.replace("trainer.train()", "trainer.args.max_steps = 1; trainer.max_completion_length = 4; "
                                           "trainer.train()")
    monkeypatch.chdir(tmp_path)
    namespace = {"_parity_reward": _parity_reward,
                 "train_dataset": Dataset.from_list([{"prompt": f"{i}+{i}="} for i in range(16)])}
    exec(compile(code, f"README.md python block {index + 1}", "exec"), namespace)
