"""Fixtures shared by several test files."""

from __future__ import annotations

import pytest

# The heaviest test files first. make test's two workers (pytest-xdist, --dist loadfile) take whole files in
# collection order, so a long file collected last keeps one worker busy while the other has nothing left; the
# alphabet put most of these at the end. Their order: each file's time in a full run (pytest --durations,
# 2026-11-29), longest first; the other files keep pytest's order after them.
HEAVIEST_FIRST = (
    "test_realmodel.py", "test_rehearse.py", "test_eval_cli.py", "test_demo.py", "test_resume.py",
    "test_packaging.py", "test_multiprocess.py", "test_realmodel_study_records.py", "test_protocol.py",
    "test_realmodel_resume.py", "test_deepconf_realmodel_study.py", "test_eval_report.py", "test_inspect.py",
    "test_lm_eval_plugin.py", "test_selection.py",
    "test_paired_bootstrap.py", "test_realmodel_demo.py", "test_eval_scale.py", "test_eval_paths.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: within a file, as written


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory) -> str:
    """The tiny char-level model saved as a folder (so it loads through ``from_pretrained``, as a user's model
    does), with a chat template added: the multiple-choice task's prompts are conversational."""
    from transformers import AutoTokenizer

    from calibrl.models import save_tiny_model

    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}A: {% endif %}")
    tokenizer.save_pretrained(path)
    return str(path)
