"""Fixtures shared by several test files."""

from __future__ import annotations

import pytest


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
