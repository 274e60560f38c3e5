"""Tiny char-level models that every real code path accepts like a hub model.

The tokenizer is a ``tokenizers`` WordLevel model over single characters, wrapped as a transformers
``PreTrainedTokenizerFast``; the model is a small ``LlamaForCausalLM`` built from a config. Both save with
``save_pretrained`` so TRL, ``calibrl generate`` and ``calibrl eval`` load them from a local folder exactly as
they load ``Qwen/Qwen2.5-Math-1.5B``. Nothing is downloaded.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARACTERS = tuple(sorted(set(string.printable) - set("\t\r\x0b\x0c")))  # printable ASCII, space and newline


def build_char_tokenizer(characters: tuple[str, ...] = CHARACTERS):
    """A transformers fast tokenizer with one token per character (plus pad, bos, eos, unk).

    Encoding splits the text into single characters; decoding concatenates them (``decoders.Fuse``), so
    ``decode(encode(text)) == text`` for any text over ``characters``. No BOS/EOS are added automatically:
    TRL and the testbed add EOS where a completion ends.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for ch in characters:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        padding_side="left", clean_up_tokenization_spaces=False,
    )
    return tokenizer


@dataclass(frozen=True)
class TinyModelConfig:
    """Size of the tiny Llama (defaults: ~0.2M parameters, trains on a laptop CPU in minutes)."""

    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    max_position_embeddings: int = 128


def build_tiny_model(tokenizer=None, config: TinyModelConfig | None = None, *, seed: int = 0):
    """A freshly initialised tiny ``LlamaForCausalLM`` matching ``tokenizer`` (built if None).

    Returns ``(model, tokenizer)``. The initialisation is deterministic in ``seed``.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else build_char_tokenizer()
    config = config or TinyModelConfig()
    llama_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(llama_config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model, tokenizer


def save_tiny_model(path: str | Path, config: TinyModelConfig | None = None, *, seed: int = 0) -> Path:
    """Build a tiny model and tokenizer and ``save_pretrained`` both into ``path``; returns the path."""
    path = Path(path)
    model, tokenizer = build_tiny_model(config=config, seed=seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
