"""How ``calibrl generate`` samples: the transformers and vLLM backends, and what is read off each completion.

A backend turns a batch of prompts into ``n`` :class:`_Sample` records per prompt (token ids up to and including
EOS, the log-probability of each sampled token, and for decision tasks a reader of the class tokens' log-probs at
any position); :func:`decision_fields` reads a decision task's class distribution off such a record.
:func:`open_backend` picks and builds the backend for a run. The row format these records end up in is described
in :mod:`calibrl.evaluation.generate`.

Backends: vLLM when importable and a GPU is present (``SamplingParams(logprobs=1)``, or 20 for decision tasks so
the class tokens' log-probs are returned, or ``token_confidence_k`` when larger, for DeepConf's token confidence; a
class outside the top 20 counts as probability 0; the engine is asked for ``logprobs_mode="processed_logprobs"`` so
the log-probs are the sampling distribution's, or ``"raw_logprobs"`` when DeepConf's token confidence is read raw,
the default, which then holds for ``logprob_mean`` too; on vLLM versions without that option they are the model's
raw ones, identical at ``T = 1``), else batched transformers ``generate`` with a logits processor that records the
log-prob of each sampled token (transformers applies its temperature warper after user processors, so the
recorder divides by ``T`` itself and the only warper left is that temperature), and DeepConf's token confidence of
the model's own distribution (or the sampling one) as vLLM would return it (:meth:`Recorder.confidence_of`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from calibrl.evaluation.generate import GenerateConfig

logger = logging.getLogger(__name__)

__all__ = ["DECISION_TOP_LOGPROBS", "VLLM_NO_SELF_CERTAINTY", "GenerateError", "decision_fields", "open_backend",
           "render_prompts"]

DECISION_TOP_LOGPROBS = 20
# vLLM hands back the top-k log-probs of each step; self-certainty reads the whole next-token distribution
VLLM_NO_SELF_CERTAINTY = ("--self-certainty needs each step's whole next-token distribution and vLLM returns only "
                          "its top-k log-probs: use --backend transformers, or --no-self-certainty")


class GenerateError(RuntimeError):
    """Bad settings or inputs for ``calibrl generate`` (message says what to change)."""


# --------------------------------------------------------------------------------------------------- samples


@dataclass
class _Sample:
    """One sampled completion: its token ids (up to and including EOS) and per-token log-probs."""

    ids: list[int]
    logps: list[float]
    ended: bool  # stopped at EOS (else truncated at max_new_tokens)
    class_logps: Any = None  # callable pos -> list[float] (log-prob of each class variant), decision tasks only
    # DeepConf's C_i per token (minus the mean of the top-k log-probs at each step); None when not recorded
    token_confidence: list[float] | None = None
    # INTUITOR's self-certainty: the mean over the completion's tokens of KL(U || p_T); None when not recorded
    self_certainty: float | None = None
    stopped_early: bool = False  # stopped by DeepConf's online rule (its window confidence fell below the threshold)


def _decision_variants(tokenizer, classes: Sequence[str]) -> tuple[list[int], list[int]]:
    """:func:`calibrl.tasks.rewards.class_token_variants`, its ``ValueError`` reported as a :class:`GenerateError`."""
    from calibrl.tasks.rewards import class_token_variants

    try:
        return class_token_variants(tokenizer, classes)
    except ValueError as exc:
        raise GenerateError(str(exc)) from None


def _class_mass(sample: _Sample, position: int, owner: list[int], n_classes: int) -> list[float]:
    mass = [0.0] * n_classes
    for lp, cls_index in zip(sample.class_logps(position), owner):
        if lp is not None and math.isfinite(lp):
            mass[cls_index] += math.exp(lp)
    return mass


def decision_fields(sample: _Sample, text: str, classes: Sequence[str], variants: tuple[list[int], list[int]]):
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


def render_prompts(tokenizer, prompts: Sequence[Any]) -> list[str]:
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

    def __init__(self, model, tokenizer, *, temperature: float, max_new_tokens: int, class_ids: list[int] | None,
                 confidence_k: int = 0, self_certainty: bool = False, confidence_temperature: str = "raw"):
        import torch
        from transformers import GenerationConfig, LogitsProcessor

        from calibrl.logprobs import chunked_token_confidence, confidence_with_sampled, positions_per_chunk
        from calibrl.self_certainty import chunked_token_self_certainty

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
        # DeepConf's C_i: by default from the model's own distribution (T = 1), as the authors read it (vLLM's raw
        # log-probs; their early-stop processor sees the logits before the temperature); "sampling": at T
        conf_scale = scale if confidence_temperature == "sampling" else 1.0

        class Recorder(LogitsProcessor):
            """Records log p_T(sampled token) one step late (the token is visible in input_ids at the next call).

            DeepConf's confidence is recorded in two forms: ``stop_confidences`` [B] per step, C_i of the top k
            before the token is drawn (what the authors' early-stop processor reads), and ``confidences``, C_i of
            the entries vLLM would return for the step (the top k, and the sampled token when it is not among
            them: what the authors' ``compute_confidence`` averages), completed once the token is known
            (:meth:`confidence_of`)."""

            def __init__(self, on_token=None):
                self.on_token = on_token
                self.prev = None
                self.token_logps: list = []
                self.class_logps: list = []
                self.stop_confidences: list = []  # [B] C_i of the top k, per step (confidence_k > 0)
                self.confidences: list = []  # [B] C_i of the returned entries, per step, completed one step late
                self._parts: list = []  # per step: (top-k ids, logsumexp(z / conf_scale), logsumexp(z / T))
                self.certainties: list = []  # [B] KL(U || p_T) of this step, per step (self_certainty)

            def confidence_of(self, step: int, token) -> None:
                """Completes step ``step``'s C_i with its sampled tokens ``token`` [B, 1] (idempotent)."""
                if step < len(self.confidences):
                    return
                top_ids, lse_conf, lse_sample = self._parts[step]
                logp = self.prev.gather(1, token).squeeze(1)  # log p_T of the sampled token
                if conf_scale != scale:  # its log-probability under the confidence's distribution, z / conf_scale
                    logp = (scale / conf_scale) * (logp + lse_sample) - lse_conf
                self.confidences.append(confidence_with_sampled(self.stop_confidences[step], top_ids,
                                                                token.squeeze(1), logp, k=confidence_k))
                self._parts[step] = None  # no longer needed

            def __call__(self, input_ids, scores):
                if self.prev is not None:
                    self.token_logps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
                    if confidence_k:
                        self.confidence_of(len(self.token_logps) - 1, input_ids[:, -1:])
                if confidence_k:  # DeepConf's token confidence, rows in chunks
                    conf, top_ids, lse_conf = chunked_token_confidence(
                        scores, project=lambda z: z, k=confidence_k, temperature=conf_scale,
                        chunk=positions_per_chunk(vocab_size=scores.size(-1)), return_parts=True)
                    self.stop_confidences.append(conf)
                    lse_sample = (torch.logsumexp(scores.float() / scale, dim=-1) if conf_scale != scale else None)
                    self._parts.append((top_ids, lse_conf, lse_sample))
                if self_certainty:  # INTUITOR's self-certainty of the sampling distribution, rows in chunks
                    self.certainties.append(chunked_token_self_certainty(
                        scores, project=lambda z: z, temperature=scale,
                        chunk=positions_per_chunk(vocab_size=scores.size(-1))))
                if self.on_token is not None:
                    self.on_token(len(self.token_logps) + 1)
                logp = torch.log_softmax(scores.float() / scale, dim=-1)
                if class_ids:
                    self.class_logps.append(logp[:, class_ids])
                self.prev = logp
                return scores

        self.Recorder = Recorder
        self.confidence_k = confidence_k
        self.self_certainty = self_certainty

    def _window_stop(self, recorder, thresholds, window: int):
        """A stopping criterion for DeepConf's online rule: a row stops once its last ``window`` token confidences
        (of the top k, read before each token is drawn, as the authors' processor reads them) average below its
        ``thresholds`` entry ([rows] float64; -inf: never). Rows are checked from their
        ``window``-th token on (a full window, as the offline lowest-window signal counts). ``stop_step`` [rows]:
        the step at which each row stopped (-1: not stopped)."""
        from transformers import StoppingCriteria

        torch = self.torch

        class WindowStop(StoppingCriteria):
            def __init__(self):
                self.cumulative = [torch.zeros(len(thresholds), dtype=torch.float64)]  # per step, running sums
                self.stop_step = torch.full((len(thresholds),), -1, dtype=torch.long)

            def __call__(self, input_ids, scores, **kwargs):
                step = len(self.cumulative) - 1  # the step whose token was just sampled
                # the top-k C_i read before the token was drawn: what the authors' early-stop processor sums
                self.cumulative.append(self.cumulative[-1] + recorder.stop_confidences[step].double().cpu())
                if step + 1 >= window:
                    mean = (self.cumulative[-1] - self.cumulative[-1 - window]) / window
                    new = (mean < thresholds) & (self.stop_step < 0)
                    self.stop_step[new] = step
                    self.cumulative[-1 - window] = None  # no longer needed: memory stays O(window x rows)
                return (self.stop_step >= 0).to(input_ids.device)

        return WindowStop()

    def generate(self, prompts: Sequence[Any], n: int, seed: int, *, stop_below: Sequence[float] | None = None,
                 window: int = 2048, on_token: Callable[[int], None] | None = None) -> list[list[_Sample]]:
        """``n`` samples of each prompt; ``stop_below`` (one threshold per prompt, needs ``confidence_k``): DeepConf's
        online early stop of a sample whose ``window``-token confidence falls below its prompt's threshold;
        ``on_token(k)`` is called at every token step k (progress)."""
        torch = self.torch
        texts = render_prompts(self.tokenizer, prompts)
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        device = next(self.model.parameters()).device
        input_ids = enc["input_ids"].to(device).repeat_interleave(n, dim=0)
        attention_mask = enc["attention_mask"].to(device).repeat_interleave(n, dim=0)
        recorder = self.Recorder(on_token)
        criteria = []
        if stop_below is not None:
            if not self.confidence_k:
                raise GenerateError("DeepConf's online stop needs token confidences (token_confidence_k >= 1)")
            thresholds = torch.tensor([float(t) for t in stop_below], dtype=torch.float64).repeat_interleave(n)
            criteria = [self._window_stop(recorder, thresholds, int(window))]
        torch.manual_seed(seed)
        model_config, self.model.generation_config = self.model.generation_config, self._bare_model_config
        try:
            with torch.no_grad():
                sequences = self.model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=self.generation_config,
                    logits_processor=[recorder], **({"stopping_criteria": criteria} if criteria else {}),
                )
        finally:
            self.model.generation_config = model_config
        completion = sequences[:, input_ids.shape[1]:]
        steps = completion.shape[1]
        if recorder.prev is not None and len(recorder.token_logps) == steps - 1:
            recorder.token_logps.append(recorder.prev.gather(1, completion[:, -1:]).squeeze(1))
            if self.confidence_k:
                recorder.confidence_of(steps - 1, completion[:, -1:])
        if len(recorder.token_logps) != steps:
            raise GenerateError(f"internal: recorded {len(recorder.token_logps)} log-probs for {steps} generated tokens")
        token_logps = torch.stack(recorder.token_logps, dim=1).cpu() if steps else torch.zeros(len(completion), 0)
        class_logps = torch.stack(recorder.class_logps, dim=1).cpu() if (self.class_ids and steps) else None
        confidences = torch.stack(recorder.confidences, dim=1).cpu() if recorder.confidences else None
        certainties = torch.stack(recorder.certainties, dim=1).cpu() if recorder.certainties else None  # [B, T]
        completion = completion.cpu()
        lengths = []
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
                stopped = bool(criteria) and 0 <= int(criteria[0].stop_step[r]) < length
                if stopped:  # stopped by the window rule before any EOS: its tokens up to the stopping one
                    length, ended = int(criteria[0].stop_step[r]) + 1, False
                lengths.append(length)
                rows_class = class_logps[r] if class_logps is not None else None
                group.append(_Sample(
                    ids=ids[:length], logps=token_logps[r, :length].tolist(), ended=ended,
                    class_logps=(lambda p, rc=rows_class: rc[p].tolist()) if rows_class is not None else None,
                    token_confidence=confidences[r, :length].tolist() if confidences is not None else None,
                    stopped_early=stopped,
                ))
            out.append(group)
        if certainties is not None:  # each completion's mean over its own tokens (EOS included, as logprob_mean)
            from calibrl.self_certainty import completion_self_certainty

            mask = torch.arange(steps).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # [B, T]
            for sample, value in zip((s for group in out for s in group),
                                     completion_self_certainty(certainties, mask).tolist()):
                sample.self_certainty = value
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _returned_confidence(entries: list, ids: list[int], k: int) -> list[float] | None:
    """DeepConf's C_i from vLLM's per-position maps ``{token id: Logprob}``, as the authors compute it
    (``deepconf/utils.py`` ``compute_confidence``: minus the mean of every entry vLLM returns for ``logprobs=k``):
    the k most probable tokens, and the sampled token too when it is not among them (k + 1 entries). The maps may
    hold more than k entries (20 for a decision task's classes): only those k, and the sampled one, count."""
    if not k:
        return None
    from calibrl.selection.deepconf import token_confidence_from_top_logprobs

    def returned(entry: dict, sampled: int) -> list[float]:
        top = sorted(entry.items(), key=lambda kv: -float(kv[1].logprob))[:k]
        values = [float(v.logprob) for _, v in top]
        if sampled in entry and sampled not in {t for t, _ in top}:
            values.append(float(entry[sampled].logprob))
        return values

    return token_confidence_from_top_logprobs(returned(entry, t) for entry, t in zip(entries, ids)).tolist()


class _VLLMBackend:
    name = "vllm"

    def __init__(self, model_name: str, *, temperature: float, max_new_tokens: int, class_ids: list[int] | None,
                 seed: int, dtype: str, vllm_kwargs: dict, confidence_k: int = 0, confidence_temperature: str = "raw"):
        import vllm

        kwargs = dict(model=model_name, seed=seed, dtype=dtype, **vllm_kwargs)
        # vLLM returns one kind of log-probs for the whole run. DeepConf's C_i is read from the raw ones by default
        # (the authors'); away from T = 1 that makes logprob_mean the model's own too, not the sampling
        # distribution's (transformers records both); --token-confidence-at sampling keeps the sampling one
        sampling_t = 0 < temperature and abs(temperature - 1.0) > 1e-6
        mode = "raw_logprobs" if confidence_k and confidence_temperature == "raw" else "processed_logprobs"
        if sampling_t and mode == "raw_logprobs":
            logger.warning("vLLM at T=%s with token confidences read raw (the DeepConf authors' reading): "
                           "logprob_mean is the model's own log-probability (T=1) too; --token-confidence-at "
                           "sampling reads both at T", temperature)
        try:
            self.llm = vllm.LLM(logprobs_mode=mode, **kwargs)
        except TypeError:  # vLLM without logprobs_mode: raw log-probs (identical at T = 1)
            if sampling_t:
                logger.warning("this vLLM has no logprobs_mode: log-probs are the model's (T=1), not the sampling "
                               "distribution's at T=%s", temperature)
            self.llm = vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.SamplingParams = vllm.SamplingParams
        self.temperature = float(temperature)
        self.max_new_tokens = int(max_new_tokens)
        self.class_ids = class_ids
        self.confidence_k = int(confidence_k)

    def generate(self, prompts: Sequence[Any], n: int, seed: int,
                 on_token: Callable[[int], None] | None = None) -> list[list[_Sample]]:
        """``n`` samples of each prompt (``on_token``: accepted for the common signature, not called)."""
        texts = render_prompts(self.tokenizer, prompts)
        params = self.SamplingParams(
            n=n, temperature=max(self.temperature, 0.0), top_p=1.0, top_k=-1, max_tokens=self.max_new_tokens,
            logprobs=max(DECISION_TOP_LOGPROBS if self.class_ids else 1, self.confidence_k), seed=seed,
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

                group.append(_Sample(ids=ids, logps=logps, ended=ended, class_logps=class_logps if class_ids else None,
                                     token_confidence=_returned_confidence(entries, ids, self.confidence_k)))
            out.append(group)
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


# --------------------------------------------------------------------------------------------------- loading


def _vllm_usable() -> bool:
    try:
        import importlib.util

        import torch

        return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()
    except Exception:
        return False


def _load_hf(config: GenerateConfig):
    import torch

    from calibrl.models import resolve_dtype

    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if config.model.startswith("builtin:"):
        kind = config.model.split(":", 1)[1]
        if kind != "tiny":
            from calibrl.models import known_builtins

            raise GenerateError(f"unknown builtin model {config.model!r} ({', '.join(known_builtins())})")
        from calibrl.models import TinyModelConfig, build_tiny_model

        # RoPE has no learned positions: a longer context costs nothing and real prompts fit
        model, tokenizer = build_tiny_model(config=TinyModelConfig(max_position_embeddings=4096), seed=config.seed)
        if config.dtype != "auto":  # built in float32; an explicit dtype casts it (auto keeps float32)
            model = model.to(resolve_dtype(config.dtype, device=device))
        return model.to(device), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = resolve_dtype(config.dtype, device=device)  # auto: bfloat16 on a bf16 GPU, float32 elsewhere
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype)
    return model.to(device), tokenizer


def open_backend(config: GenerateConfig, *, model=None, tokenizer=None, classes: Sequence[str] | None = None):
    """The backend for a run and the class token variants (None unless ``classes``, a decision task's classes).

    vLLM when ``config.backend`` says so, or on ``auto`` when vLLM is usable, no model was passed in and the model
    is not a builtin; else transformers, with ``model`` / ``tokenizer`` when given (loaded from ``config.model``
    otherwise). A GGUF file or a GGUF-backed or warm builtin (``builtin:smollm2-135m-instruct``, ``-warm``) is loaded from its converted folder
    (:func:`calibrl.models.resolve_model`); the run keeps the name it was given. A config without
    ``max_new_tokens`` gets the budget :func:`calibrl.evaluation.generate.generate` would give it.
    """
    if config.max_new_tokens is None:
        from calibrl.evaluation.generate import resolve_max_new_tokens

        config = resolve_max_new_tokens(config)
    if model is None:
        from pathlib import Path

        from calibrl.models import hub_problem, resolve_model

        config = dataclasses.replace(config, model=resolve_model(config.model))
        if not Path(config.model).expanduser().exists() and not config.model.startswith("builtin:"):
            problem = hub_problem(config.model)  # a hub id that cannot be had: one line now, not minutes of retries
            if problem:
                raise GenerateError(f"--model {problem}")
    use_vllm = config.backend == "vllm" or (config.backend == "auto" and model is None and _vllm_usable()
                                            and not config.model.startswith("builtin:")
                                            and config.deepconf_online is None  # online stop: transformers only
                                            and config.self_certainty is not True)  # so is self-certainty
    decision_task = classes is not None
    if use_vllm:
        if config.self_certainty:
            raise GenerateError(VLLM_NO_SELF_CERTAINTY)
        from transformers import AutoTokenizer

        variants = _decision_variants(AutoTokenizer.from_pretrained(config.model), classes) if decision_task else None
        backend = _VLLMBackend(config.model, temperature=config.temperature, max_new_tokens=config.max_new_tokens,
                               class_ids=variants[0] if variants else None, seed=config.seed, dtype=config.dtype,
                               vllm_kwargs=config.vllm_kwargs, confidence_k=config.token_confidence_k,
                               confidence_temperature=config.token_confidence_at)
    else:
        if model is None:
            model, tokenizer = _load_hf(config)
        elif tokenizer is None:
            raise GenerateError("pass the tokenizer with the model")
        variants = _decision_variants(tokenizer, classes) if decision_task else None
        backend = _TransformersBackend(model, tokenizer, temperature=config.temperature,
                                       max_new_tokens=config.max_new_tokens,
                                       class_ids=variants[0] if variants else None,
                                       confidence_k=config.token_confidence_k,
                                       self_certainty=config.self_certainty is not False,  # None: on here
                                       confidence_temperature=config.token_confidence_at)
    return backend, variants
