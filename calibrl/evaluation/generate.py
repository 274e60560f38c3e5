r"""``calibrl generate``: sample N completions per problem, with each completion's confidence, into the JSONL
that ``calibrl eval`` reads.

For every problem of a registered dataset (:mod:`calibrl.tasks.datasets`, hub name or local file) it samples ``n``
completions and writes one row per completion::

    prompt_id, benchmark, sample_index, completion, answer (the extracted final answer: last \boxed{} content or the
    decision letter; null if none), gold, correct, reward, logprob_mean, n_tokens, truncated
    + for decision tasks: decision_prob, class_probs, class_mass, label, classes

* ``logprob_mean``: mean over the completion's tokens (EOS included when the completion ended) of the token's
  log-probability under the SAMPLING distribution, i.e. ``log_softmax(logits / T)`` at temperature ``T``, with
  no top-k / top-p truncation (both are switched off, whatever the model's generation_config says). At
  ``T = 1`` (the papers' setting and the default) this is the model's own mean token log-prob, ``-log PPL``, the
  confidence CAPO ranks; at other temperatures it is the confidence of the distribution the samples came from.
  ``T = 0`` means greedy decoding, and the log-probs are then the model's (``T = 1``) ones.
* ``class_probs`` (decision tasks): at the decision token (the last class letter of the completion, the same
  rule as the ``"decision"`` reward and the trainer's decision term), the probability of each class, summed over
  the class's single-token spellings (``"A"`` and ``" A"``), renormalised over the classes (``class_mass`` is the
  mass before renormalising). Same temperature convention as above. ``decision_prob`` is the entry of the
  decided class. A completion without a class letter is wrong (``answer`` null, ``correct = false``); its
  ``class_probs`` are read where the model put the most probability on the class tokens (its would-be decision)
  and ``decision_prob`` is their largest entry.
* ``correct`` / ``reward``: the registered reward (``"math"``: math-verify on the last ``\boxed{}``;
  ``"decision"``: decision letter vs label); ``correct = reward > 0.5``.

Backends: vLLM when importable and a GPU is present (``SamplingParams(logprobs=1)``, or 20 for decision tasks so
the class tokens' log-probs are returned; a class outside the top 20 counts as probability 0; the engine is
asked for ``logprobs_mode="processed_logprobs"`` so the log-probs are the sampling distribution's, and on vLLM
versions without that option they are the model's raw ones, identical at ``T = 1``), else batched transformers
``generate`` with a logits processor that records the log-prob of each sampled token (transformers applies its
temperature warper after user processors, so the recorder divides by ``T`` itself and the only warper left is
that temperature).

Resumable: rows are appended and flushed (``fsync``) after every batch of problems, and a batch only ever holds
whole problems. On restart the file is read back, a torn last line and the rows of any problem with fewer than
``n`` rows are dropped, and only the missing problems are generated; a killed run loses at most the batch in
flight. The settings are kept next to the output (``<out>.meta.json``); resuming with different settings is an
error (``overwrite=True`` starts afresh). A resumed run draws fresh randomness for the remaining problems.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

logger = logging.getLogger(__name__)

__all__ = ["GenerateConfig", "GenerateError", "generate", "scan_existing", "DECISION_TOP_LOGPROBS"]

DECISION_TOP_LOGPROBS = 20
_META_KEYS = ("model", "dataset", "path", "split", "n", "temperature", "max_new_tokens", "template", "reward", "limit")


class GenerateError(RuntimeError):
    """Bad settings or inputs for ``calibrl generate`` (message says what to change)."""


@dataclass
class GenerateConfig:
    """Settings of one ``calibrl generate`` run (see the module docstring)."""

    model: str
    dataset: str
    out: str | Path
    n: int = 16
    path: str | None = None
    split: str | None = None
    max_new_tokens: int = 1024
    temperature: float = 1.0
    batch_size: int = 8  # problems per batch; each batch samples batch_size * n completions
    limit: int | None = None
    backend: str = "auto"  # auto | vllm | transformers
    seed: int = 0
    dtype: str = "auto"
    device: str | None = None
    template: str | None = None
    reward: str | None = None  # default: "decision" for datasets with classes, else "math"
    overwrite: bool = False
    progress: bool = True
    vllm_kwargs: dict = field(default_factory=dict)

    def meta(self) -> dict:
        d = asdict(self)
        return {k: d[k] for k in _META_KEYS}


# --------------------------------------------------------------------------------------------------- resume


def scan_existing(out: Path, n: int) -> tuple[set[str], int]:
    """Read an existing samples file; keep only problems with ``n`` rows and drop a torn last line.

    Rewrites the file (atomically) when something had to be dropped. Returns (complete prompt ids, rows kept).
    """
    if not out.exists():
        return set(), 0
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    rows: list[tuple[str, str]] = []
    torn = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the write in flight when the run was killed
                torn = True
                continue
            raise GenerateError(f"{out}:{number}: not valid JSON; the file is not a calibrl samples file in progress")
        if "prompt_id" not in row:
            raise GenerateError(f"{out}:{number}: no prompt_id; the file is not a calibrl samples file")
        rows.append((str(row["prompt_id"]), line if line.endswith("\n") else line + "\n"))
    counts: dict[str, int] = {}
    for pid, _ in rows:
        counts[pid] = counts.get(pid, 0) + 1
    complete = {pid for pid, c in counts.items() if c >= n}
    kept = [line for pid, line in rows if pid in complete]
    if torn or len(kept) != len(rows) or any(not line.endswith("\n") for line in lines[-1:]):
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, out)
        dropped = len(rows) - len(kept)
        if dropped or torn:
            logger.warning("%s: dropped %d rows of unfinished problems%s", out, dropped, " and a torn last line" if torn else "")
    return complete, len(kept)


def _meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def _check_meta(config: GenerateConfig, out: Path, resuming: bool) -> None:
    meta_file = _meta_path(out)
    meta = config.meta()
    if resuming and meta_file.exists():
        old = json.loads(meta_file.read_text())
        diff = {k: (old.get(k), meta[k]) for k in _META_KEYS if k != "limit" and old.get(k) != meta[k]}
        if diff:
            described = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise GenerateError(
                f"{out} was started with other settings ({described}); pass overwrite=True (--overwrite) to start "
                "afresh or choose another output file"
            )
    meta_file.write_text(json.dumps(meta, indent=2) + "\n")


# --------------------------------------------------------------------------------------------------- samples


@dataclass
class _Sample:
    """One sampled completion: its token ids (up to and including EOS) and per-token log-probs."""

    ids: list[int]
    logps: list[float]
    ended: bool  # stopped at EOS (else truncated at max_new_tokens)
    class_logps: Any = None  # callable pos -> list[float] (log-prob of each class variant), decision tasks only


def _class_variants(tokenizer, classes: Sequence[str]) -> tuple[list[int], list[int]]:
    """Single-token spellings of each class ("A" and " A"): (token ids, class index of each)."""
    ids, owner = [], []
    for index, cls in enumerate(classes):
        found = False
        for spelling in (cls, " " + cls):
            enc = tokenizer.encode(spelling, add_special_tokens=False)
            if len(enc) == 1 and enc[0] not in ids:
                ids.append(enc[0])
                owner.append(index)
                found = True
        if not found:
            raise GenerateError(
                f"class {cls!r} is not a single token for this tokenizer (neither {cls!r} nor {' ' + cls!r}); "
                "decision tasks need single-token class strings"
            )
    return ids, owner


def _class_mass(sample: _Sample, position: int, owner: list[int], n_classes: int) -> list[float]:
    mass = [0.0] * n_classes
    for lp, cls_index in zip(sample.class_logps(position), owner):
        if lp is not None and math.isfinite(lp):
            mass[cls_index] += math.exp(lp)
    return mass


def _decision_fields(sample: _Sample, text: str, classes: Sequence[str], variants: tuple[list[int], list[int]]):
    """(decision, class_probs, decision_prob, class_mass) of one completion.

    The decision is the text's last standalone class letter (the ``"decision"`` reward's rule). The class
    distribution is read at that letter's own token (the last token spelling the decided class); failing that at
    the last class token; and when the completion has no class token at all, at the position where the model put
    the most probability on class tokens (its would-be decision). ``decision_prob`` is the decided class's entry,
    or the largest entry when there is no decision (such a sample is wrong, so that is confidence in a wrong
    answer). Uniform when no position carries class probability (vLLM: all classes outside the top-k).
    """
    from calibrl.tasks.rewards import extract_decision

    decision, _ = extract_decision(text, classes)
    ids, owner = variants
    id_to_class = dict(zip(ids, owner))
    wanted = classes.index(decision) if decision is not None else None
    n = len(classes)

    def last(condition) -> int:
        for p in range(len(sample.ids) - 1, -1, -1):
            if condition(sample.ids[p]):
                return p
        return -1

    position = last(lambda t: id_to_class.get(t, -1) == wanted) if wanted is not None else -1
    if position < 0:
        position = last(lambda t: t in id_to_class)
    if position < 0 and sample.ids and sample.class_logps is not None:
        position = max(range(len(sample.ids)), key=lambda p: sum(_class_mass(sample, p, owner, n)))
    mass = _class_mass(sample, position, owner, n) if position >= 0 else [0.0] * n
    total = sum(mass)
    probs = [m / total for m in mass] if total > 0 else [1.0 / n] * n
    decision_prob = probs[wanted] if wanted is not None else max(probs)
    return decision, probs, decision_prob, total


# --------------------------------------------------------------------------------------------------- backends


def _render_prompts(tokenizer, prompts: Sequence[Any]) -> list[str]:
    texts = []
    for p in prompts:
        if isinstance(p, str):
            texts.append(p)
        else:
            if getattr(tokenizer, "chat_template", None) is None:
                raise GenerateError("conversational prompts need a tokenizer with a chat template; use a text template")
            texts.append(tokenizer.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True))
    return texts


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    return ids


class _TransformersBackend:
    name = "transformers"

    def __init__(self, model, tokenizer, *, temperature: float, max_new_tokens: int, class_ids: list[int] | None):
        import torch
        from transformers import GenerationConfig, LogitsProcessor

        self.torch = torch
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.class_ids = class_ids
        self.eos = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos), 0)
        greedy = self.temperature <= 0
        # Plain temperature sampling, so logprob_mean is the model's own log p_T. transformers fills every field
        # left None from the model's generation_config.json (Qwen Instruct ships repetition_penalty 1.05, top_k 20,
        # top_p 0.8), so every field that shapes the distribution is set to its neutral value here, and the
        # fields whose mere presence adds a processor (min_p, suppress_tokens, bad_words_ids, ...) are dropped by
        # generating against a bare model generation config (``generate``).
        self.generation_config = GenerationConfig(
            max_new_tokens=int(max_new_tokens),
            do_sample=not greedy,
            temperature=None if greedy else self.temperature,
            top_k=None if greedy else 0,
            top_p=None if greedy else 1.0,
            typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, min_length=0,
            repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
            encoder_no_repeat_ngram_size=0, num_beams=1, renormalize_logits=False, remove_invalid_values=False,
            pad_token_id=pad,
            eos_token_id=sorted(self.eos) or None,
            bos_token_id=getattr(model.generation_config, "bos_token_id", None),
        )
        self._bare_model_config = GenerationConfig(
            pad_token_id=pad, eos_token_id=sorted(self.eos) or None,
            bos_token_id=getattr(model.generation_config, "bos_token_id", None),
        )
        scale = 1.0 if greedy else self.temperature

        class Recorder(LogitsProcessor):
            """Records log p_T(sampled token) one step late (the token is visible in input_ids at the next call)."""

            def __init__(self):
                self.prev = None
                self.token_logps: list = []
                self.class_logps: list = []

            def __call__(self, input_ids, scores):
                if self.prev is not None:
                    self.token_logps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
                logp = torch.log_softmax(scores.float() / scale, dim=-1)
                if class_ids:
                    self.class_logps.append(logp[:, class_ids])
                self.prev = logp
                return scores

        self.Recorder = Recorder

    def generate(self, prompts: Sequence[Any], n: int, seed: int) -> list[list[_Sample]]:
        torch = self.torch
        texts = _render_prompts(self.tokenizer, prompts)
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        device = next(self.model.parameters()).device
        input_ids = enc["input_ids"].to(device).repeat_interleave(n, dim=0)
        attention_mask = enc["attention_mask"].to(device).repeat_interleave(n, dim=0)
        recorder = self.Recorder()
        torch.manual_seed(seed)
        model_config, self.model.generation_config = self.model.generation_config, self._bare_model_config
        try:
            with torch.no_grad():
                sequences = self.model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=self.generation_config,
                    logits_processor=[recorder],
                )
        finally:
            self.model.generation_config = model_config
        completion = sequences[:, input_ids.shape[1]:]
        steps = completion.shape[1]
        if recorder.prev is not None and len(recorder.token_logps) == steps - 1:
            recorder.token_logps.append(recorder.prev.gather(1, completion[:, -1:]).squeeze(1))
        if len(recorder.token_logps) != steps:
            raise GenerateError(f"internal: recorded {len(recorder.token_logps)} log-probs for {steps} generated tokens")
        token_logps = torch.stack(recorder.token_logps, dim=1).cpu() if steps else torch.zeros(len(completion), 0)
        class_logps = torch.stack(recorder.class_logps, dim=1).cpu() if (self.class_ids and steps) else None
        completion = completion.cpu()
        out: list[list[_Sample]] = []
        for i in range(len(prompts)):
            group = []
            for j in range(n):
                r = i * n + j
                ids = completion[r].tolist()
                length, ended = len(ids), False
                for k, t in enumerate(ids):
                    if t in self.eos:
                        length, ended = k + 1, True
                        break
                rows_class = class_logps[r] if class_logps is not None else None
                group.append(_Sample(
                    ids=ids[:length], logps=token_logps[r, :length].tolist(), ended=ended,
                    class_logps=(lambda p, rc=rows_class: rc[p].tolist()) if rows_class is not None else None,
                ))
            out.append(group)
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class _VLLMBackend:
    name = "vllm"

    def __init__(self, model_name: str, *, temperature: float, max_new_tokens: int, class_ids: list[int] | None,
                 seed: int, dtype: str, vllm_kwargs: dict):
        import vllm

        kwargs = dict(model=model_name, seed=seed, dtype=dtype, **vllm_kwargs)
        try:
            self.llm = vllm.LLM(logprobs_mode="processed_logprobs", **kwargs)
        except TypeError:  # vLLM without logprobs_mode: raw log-probs (identical at T = 1)
            if abs(temperature - 1.0) > 1e-6 and temperature > 0:
                logger.warning("this vLLM has no logprobs_mode: log-probs are the model's (T=1), not the sampling "
                               "distribution's at T=%s", temperature)
            self.llm = vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.SamplingParams = vllm.SamplingParams
        self.temperature = float(temperature)
        self.max_new_tokens = int(max_new_tokens)
        self.class_ids = class_ids

    def generate(self, prompts: Sequence[Any], n: int, seed: int) -> list[list[_Sample]]:
        texts = _render_prompts(self.tokenizer, prompts)
        params = self.SamplingParams(
            n=n, temperature=max(self.temperature, 0.0), top_p=1.0, top_k=-1, max_tokens=self.max_new_tokens,
            logprobs=DECISION_TOP_LOGPROBS if self.class_ids else 1, seed=seed,
        )
        requests = [{"prompt_token_ids": self.tokenizer.encode(t, add_special_tokens=False)} for t in texts]
        results = self.llm.generate(requests, params, use_tqdm=False)
        out = []
        for result in results:
            group = []
            for o in result.outputs:
                ids = list(o.token_ids)
                entries = list(o.logprobs or [])
                logps = [float(entries[k][t].logprob) for k, t in enumerate(ids)]
                ended = o.finish_reason == "stop"
                class_ids = self.class_ids

                def class_logps(p, entries=entries, class_ids=class_ids):
                    return [float(entries[p][c].logprob) if c in entries[p] else float("-inf") for c in class_ids]

                group.append(_Sample(ids=ids, logps=logps, ended=ended, class_logps=class_logps if class_ids else None))
            out.append(group)
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _vllm_usable() -> bool:
    try:
        import importlib.util

        import torch

        return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()
    except Exception:
        return False


def _load_hf(config: GenerateConfig):
    import torch

    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if config.model.startswith("builtin:"):
        kind = config.model.split(":", 1)[1]
        if kind != "tiny":
            raise GenerateError(f"unknown builtin model {config.model!r} (only builtin:tiny)")
        from calibrl.testbed.model import TinyModelConfig, build_tiny_model

        # RoPE has no learned positions: a longer context costs nothing and real prompts fit
        model, tokenizer = build_tiny_model(config=TinyModelConfig(max_position_embeddings=4096), seed=config.seed)
        return model.to(device), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if config.dtype == "auto":
        dtype = torch.bfloat16 if (device.startswith("cuda") and torch.cuda.is_bf16_supported()) else torch.float32
    else:
        dtype = getattr(torch, config.dtype)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype)
    return model.to(device), tokenizer


# --------------------------------------------------------------------------------------------------- main loop


def _batches(items: list, size: int) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _seed_for(seed: int, prompt_ids: Sequence[str]) -> int:
    return (seed * 1_000_003 + zlib.crc32(",".join(prompt_ids).encode())) % (2**31 - 1)


def generate(config: GenerateConfig | None = None, *, hf_model=None, hf_tokenizer=None, **kwargs) -> dict:
    """Run ``calibrl generate``; returns a summary dict (problems, samples, accuracy, seconds, samples_per_s, out).

    ``hf_model`` / ``hf_tokenizer``: an already loaded transformers model and tokenizer (forces the transformers
    backend; ``config.model`` then only labels the run). Keyword arguments build a :class:`GenerateConfig` when
    ``config`` is None.
    """
    model, tokenizer = hf_model, hf_tokenizer
    from calibrl.tasks.registry import get_dataset_loader, get_reward
    from calibrl.tasks.rewards import completion_text, last_boxed

    config = config or GenerateConfig(**kwargs)
    if config.n < 1:
        raise GenerateError("n must be >= 1")
    if config.batch_size < 1:
        raise GenerateError("batch_size must be >= 1")
    if config.backend not in ("auto", "vllm", "transformers"):
        raise GenerateError(f"unknown backend {config.backend!r} (auto, vllm or transformers)")
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    loader_kwargs: dict[str, Any] = {"path": config.path, "limit": config.limit}
    if config.split is not None:
        loader_kwargs["split"] = config.split
    if config.template is not None:
        loader_kwargs["template"] = config.template
    dataset = get_dataset_loader(config.dataset)(**loader_kwargs)
    columns = set(dataset.column_names)
    if "prompt" not in columns:
        raise GenerateError(f"dataset {config.dataset!r} has no 'prompt' column")
    decision_task = "classes" in columns
    reward_name = config.reward or ("decision" if decision_task else "math")
    reward_fn = get_reward(reward_name)
    if "prompt_id" not in columns:
        dataset = dataset.add_column("prompt_id", [f"{config.dataset}-{i}" for i in range(len(dataset))])
    problems = dataset.to_list()

    if config.overwrite:
        for p in (out, _meta_path(out)):
            if p.exists():
                p.unlink()
    resuming = out.exists()
    _check_meta(config, out, resuming)
    complete, kept_rows = scan_existing(out, config.n)
    pending = [p for p in problems if str(p["prompt_id"]) not in complete]

    use_vllm = config.backend == "vllm" or (config.backend == "auto" and model is None and _vllm_usable()
                                            and not config.model.startswith("builtin:"))
    backend = None
    started = time.perf_counter()
    generated = 0
    n_correct = 0
    if pending:
        classes0 = list(problems[0]["classes"]) if decision_task else None
        if decision_task and any(list(p["classes"]) != classes0 for p in pending):
            raise GenerateError("all problems of a decision dataset must share one class list (classes column)")
        if use_vllm:
            from transformers import AutoTokenizer

            variants = _class_variants(AutoTokenizer.from_pretrained(config.model), classes0) if decision_task else None
            backend = _VLLMBackend(config.model, temperature=config.temperature, max_new_tokens=config.max_new_tokens,
                                   class_ids=variants[0] if variants else None, seed=config.seed, dtype=config.dtype,
                                   vllm_kwargs=config.vllm_kwargs)
        else:
            if model is None:
                model, tokenizer = _load_hf(config)
            elif tokenizer is None:
                raise GenerateError("pass the tokenizer with the model")
            variants = _class_variants(tokenizer, classes0) if decision_task else None
            backend = _TransformersBackend(model, tokenizer, temperature=config.temperature,
                                           max_new_tokens=config.max_new_tokens,
                                           class_ids=variants[0] if variants else None)
        started = time.perf_counter()  # throughput counts sampling and scoring, not model loading

        from tqdm.auto import tqdm

        bar = tqdm(total=len(problems) * config.n, initial=kept_rows, unit="sample", dynamic_ncols=True,
                   disable=not config.progress, desc=f"generate {config.dataset}")
        with out.open("a", encoding="utf-8") as handle:
            for batch in _batches(pending, config.batch_size):
                pids = [str(p["prompt_id"]) for p in batch]
                groups = backend.generate([p["prompt"] for p in batch], config.n, _seed_for(config.seed, pids))
                lines = []
                for problem, group in zip(batch, groups):
                    texts = [backend.decode(s.ids) for s in group]
                    reward_columns = {k: [problem[k]] * len(group) for k in problem if k not in ("prompt", "completion")}
                    rewards = reward_fn([problem["prompt"]] * len(group), texts, **reward_columns)
                    for index, (sample, text, reward) in enumerate(zip(group, texts, rewards)):
                        reward = 0.0 if reward is None else float(reward)
                        row = {
                            "prompt_id": str(problem["prompt_id"]),
                            "benchmark": problem.get("benchmark", config.dataset),
                            "sample_index": index,
                            "completion": text,
                            "correct": reward > 0.5,
                            "reward": reward,
                            "logprob_mean": (sum(sample.logps) / len(sample.logps)) if sample.logps else 0.0,
                            "n_tokens": len(sample.ids),
                            "truncated": not sample.ended,
                        }
                        if decision_task:
                            classes = list(problem["classes"])
                            decision, probs, decision_prob, mass = _decision_fields(sample, completion_text(text),
                                                                                    classes, variants)
                            row.update(answer=decision, gold=problem.get("label"), decision_prob=decision_prob,
                                       class_probs=probs, class_mass=mass, label=problem.get("label"),
                                       classes=classes)
                        else:
                            row.update(answer=last_boxed(text), gold=problem.get("answer"))
                        n_correct += row["correct"]
                        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
                handle.write("".join(lines))
                handle.flush()
                os.fsync(handle.fileno())
                generated += len(lines)
                bar.update(len(lines))
        bar.close()
    seconds = time.perf_counter() - started
    return {
        "out": str(out),
        "problems": len(problems),
        "problems_skipped": len(problems) - len(pending),
        "samples_written": generated,
        "accuracy_new": (n_correct / generated) if generated else float("nan"),
        "seconds": seconds,  # since the model was loaded
        "samples_per_s": generated / seconds if generated and seconds > 0 else float("nan"),
        "backend": backend.name if backend is not None else None,
    }
