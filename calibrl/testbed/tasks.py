"""Built-in testbed: small tasks generated in code, with known outcome probabilities.

Each task is a seeded ``datasets.Dataset`` (registered under ``testbed/<name>``), a TRL-style reward
(registered under the same name), SFT texts sampled from the TRUE distribution (so the warm start is calibrated
by construction) and the Bayes ceiling (the AUROC of the true success probability). They are small enough for
the 0.2M-parameter char-level Llama of :mod:`calibrl.models` to learn on a CPU in minutes.

``testbed/decision`` (stochastic decision; arXiv 2601.13284's setting in miniature)
    prompt ``abcd=`` (4 digits), completion ``ss:D``: ``ss`` = two-digit digit sum, ``D`` in {``Y``, ``N``}.
    The world draws a label y ~ Bernoulli(p(x)), y = 1 meaning ``Y``, with
    p(x) = [.1, .2, .3, .4, .6, .7, .8, .9][ss mod 8]. Reward = 1 if the digit sum is right AND the decision
    equals a FRESHLY drawn label (every call draws anew, like a noisy real-world outcome), else 0. The
    best-calibrated policy says ``Y`` with probability p(x); the reward-maximising one always picks the majority
    label with confidence 1 (what GRPO learns). Columns: ``prompt``, ``answer`` (the digit sum), ``p_true``
    (p(x)), ``classes`` = ["Y", "N"], ``prompt_id``.

``testbed/stochastic_reasoning`` (sequence confidence is the measure)
    prompt ``abcd?``, completion ``ss;A``: ``ss`` = digit sum (the reasoning, deterministic), ``A`` a digit (the
    answer). The outcome t is random: t = ss mod 10 (the "likely" answer) with probability
    c(x) = [.2, .3, .4, .5, .6, .7, .8, .9][ss mod 8], otherwise one of the other 9 digits uniformly. Reward = 1 if
    the sum is right and A equals a freshly drawn t. Answering A has success probability q(A|x) = c(x) for the
    likely digit and (1 - c(x)) / 9 for any other, so the confidence that can be calibrated is the probability of
    the whole completion (mean token log-prob: the reasoning tokens are certain, the answer token carries it).
    Columns: ``prompt``, ``answer`` (digit sum), ``likely`` (ss mod 10), ``p_true`` (c(x)), ``prompt_id``.

``testbed/verbalized`` (stated confidence: RLCR, arXiv 2507.16806, in miniature; not in the default demo)
    prompt ``abcd!``, completion ``ss;A:k``: ``ss;A`` as in ``stochastic_reasoning`` (same outcome law), then the
    confidence digit ``k``, the stated probability k / 10 that A is right. Reward: RLCR's
    ``1[right] - (k/10 - 1[right])^2`` (:func:`calibrl.tasks.rewards.rlcr_reward`) with ``right`` a FRESH draw
    (sum right and A equal to the drawn t); a missing confidence digit scores ``1[right] - 1``, a malformed
    completion -1 (wrong, no confidence). The warm start states k uniformly at random (an uninformed confidence,
    :func:`sample_true_completion`), so only RL can make it calibrated: the calibrated policy states k = 10 c(x)
    for the likely digit. Columns as ``stochastic_reasoning``.

``testbed/addition`` (deterministic control: RL is expected to help calibration here)
    prompt ``ab+cd+ef=``, completion ``ss+ef=ttt`` where ``ss`` = ab + cd (worked partial sum, written with as many
    digits as it has) and ``ttt`` the total. Reward = 1 iff the final total is right. Columns: ``prompt``,
    ``answer`` (total), ``partial`` (ab + cd), ``prompt_id``.

``testbed/decision_copy`` (the decision copies the reasoning's conclusion: arXiv 2601.13284's diagnosis)
    prompt ``abcd^``, completion ``ss:C>D``: ``ss`` the digit sum, ``C`` in {``Y``, ``N``} the conclusion the
    reasoning states, ``D`` the decision token. Outcome law and reward as ``decision`` (p(x) by ss mod 8; reward =
    sum right and D equal to a fresh draw); the SFT data draw C ~ Bernoulli(p(x)) and copy it, D = C, so the warm
    start's decision token is near-certain whatever it decides (confidence ~1, accuracy p or 1 - p): the
    miscalibration the decision-token term is meant to repair. The decision is the LAST class token (D).
    Columns as ``decision``.

``testbed/scratchpad`` (the papers' regime: deterministic reward, a worked scratchpad; not in the default demo)
    prompt ``abcd#``, completion ``a+b=SS,SS+c=SS,SS+d=SS|SS`` (25 characters): the running digit sum worked out
    in three two-digit steps, then the answer after ``|``. Reward = 1 iff the answer equals the digit sum
    (deterministic, like a math verifier; the steps are not checked). The format tokens (``+ = , |``) are shared
    by every prompt. The SFT teacher makes SYSTEMATIC slips: at each step it writes one more than the right
    running sum with probability e(x) and carries on from what it wrote, so every slip moves the answer up by
    one. e(x) depends on the prompt's first digit a: 0.05 for a in 0-2 (easy), 0.25 for 3-6 (medium), 0.6 for
    7-9 (hard), i.e. the teacher is right with probability (1 - e)^3 = 0.857 / 0.422 / 0.064 and, on hard
    prompts, confidently wrong in a consistent direction (expected accuracy 0.44 over the 10,000 prompts).
    Columns: ``prompt``, ``answer`` (the digit sum, two digits), ``p_true`` (the teacher's success probability
    (1 - e)^3: what the warm start is calibrated to), ``tier`` (easy / medium / hard), ``prompt_id``.

``testbed/scratchpad_unfixable`` (the papers' regime with hard items out of reach; a second pilot)
    ``scratchpad`` with prompts ending in ``%`` and a teacher that slips at EVERY step on hard prompts (first
    digit 7-9; easy and medium as ``scratchpad``), so it is never right there (answer = sum + 3) and a hard group
    of its samples is all wrong: no GRPO gradient. Columns as ``scratchpad``.

``testbed/forms`` (where GCPO and SEED-GRPO can differ; not in the default demo)
    prompt ``abcd~``, completion ``A``: the digit sum written in one of three SURFACE FORMS of one meaning,
    ``12``, ``12.0`` or ``+12`` (:data:`FORMS`; calibrl's answer equivalence, the grader's, counts them as one
    answer: :func:`calibrl.selection.answers.answers_equivalent`). The prompt's first digit a picks its tier
    (:data:`FORMS_TIERS`): ``learnable`` (a in 0-3) deterministic reward, the teacher right with probability 0.5
    and otherwise a NEAR MISS (the sum +-1); ``hard`` (a in 4-6) deterministic reward, the teacher right with
    probability 0.2 and otherwise FAR WRONG (a value 0-36 at least 5 away from the sum, uniformly); ``noise``
    (a in 7-9) the reward is a fresh coin flip (probability 0.5) for any well-formed answer, whatever it says, the
    teacher as on learnable prompts. The teacher picks the surface form uniformly, independently of the value. So
    semantic entropy (clusters of equivalent values) and geometric disagreement (hidden states of different
    strings) part ways: surface forms are disagreement without a difference of meaning, near misses and far-wrong
    values are the same entropy at different distances, and noise groups carry mixed rewards and no signal.
    Columns: ``prompt``, ``answer`` (the digit sum), ``p_true`` (the teacher's success probability), ``tier``,
    ``prompt_id``.

``testbed/abstain`` (calibrated behaviour: declining when likely wrong; not in the default demo)
    ``stochastic_reasoning`` with a third outcome, and items with no right answer. Prompt ``abcd@``, or, for a
    share :data:`ABSTAIN_UNANSWERABLE` of the codes (chosen by each code's own generator), the code with one digit
    hidden, ``ab_d@``: unanswerable. Completion ``ss;A`` (``ss`` the digit sum, of the shown digits on an
    unanswerable prompt; ``A`` the answer digit, outcome law as ``stochastic_reasoning``) or ``ss;?``: "I don't
    know". The best answer succeeds with probability c(x) on an answerable prompt and 0 on an unanswerable one, so
    under the risk threshold t = :data:`ABSTAIN_THRESHOLD` (right 1, wrong -t / (1 - t), declining 0) the
    Bayes-optimal policy is known: answer the likely digit iff c(x) > t, decline otherwise and always on an
    unanswerable prompt. The SFT teacher declines with probability :data:`ABSTAIN_WARM_RATE` whatever the prompt
    and otherwise answers as ``stochastic_reasoning``'s (on an unanswerable prompt as if the hidden digit were 0),
    so the warm start declines at random and only RL can make its declining informed. Rewards
    (:func:`make_reward`'s ``scheme``): ``binary`` (right 1, else 0; a decline on an unanswerable prompt is right,
    as calibrl's binary rewards grade it), ``risk`` (the risk-threshold reward at t), ``ternary`` (TruthRL's +1 / 0
    / -1). Columns: ``prompt``, ``answer`` (sum of the shown digits), ``likely``, ``p_true`` (the best answer's
    success probability: c(x), or 0), ``answerable``, ``prompt_id``.

``testbed/abstain_verbalized`` (``abstain`` with a stated confidence: RLCR's arm)
    prompt ``abcd$`` (or ``ab_d$``), completion ``ss;A:k`` or ``ss;?``: an answer states the confidence digit k
    (k / 10) as ``verbalized``'s. Reward (scheme ``rlcr_risk``, the only one): the risk-threshold reward plus, on an
    answer, RLCR's Brier term -(k/10 - 1[right])^2 (our reading of RLCR trained on the risk-threshold reward).
    The teacher states k uniformly at random. Columns as ``abstain``.

Every reward returns ``None``-free floats; malformed completions get 0 (-1 for ``verbalized``, RLCR's floor).
:func:`true_success_probability` gives, for any completion, the exact probability that the world rewards it (the
noise-free correctness used for the ``oracle`` metrics), and :func:`bayes_auroc` the AUROC a perfectly calibrated
sampler reaches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from calibrl.tasks.registry import register_dataset, register_reward

DECISION_P = (0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9)
STOCHASTIC_C = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
TASKS = ("decision", "stochastic_reasoning", "addition")
RLCR_TASK = "verbalized"  # kept out of TASKS (the default demo's tasks) until it earns a place there
SCRATCHPAD_TASK = "scratchpad"  # the papers' regime (docs/testbed.md's pre-registered study); not in TASKS either
# scratchpad: the teacher's per-step slip probability by the prompt's first digit (easy / medium / hard tiers)
SCRATCHPAD_TIERS = (("easy", range(0, 3), 0.05), ("medium", range(3, 7), 0.25), ("hard", range(7, 10), 0.6))
# scratchpad_unfixable: the same task with hard items out of reach (the teacher slips at every step there)
SCRATCHPAD_UNFIXABLE_TASK = "scratchpad_unfixable"
SCRATCHPAD_UNFIXABLE_TIERS = (("easy", range(0, 3), 0.05), ("medium", range(3, 7), 0.25), ("hard", range(7, 10), 1.0))
# task -> (prompt suffix, tiers)
_SCRATCHPAD_FAMILY = {SCRATCHPAD_TASK: ("#", SCRATCHPAD_TIERS),
                      SCRATCHPAD_UNFIXABLE_TASK: ("%", SCRATCHPAD_UNFIXABLE_TIERS)}
FORMS_TASK = "forms"  # surface forms, near misses, far-wrong values and noise prompts; not in TASKS either
FORMS = ("{v}", "{v}.0", "+{v}")  # three spellings of one value, equivalent for calibrl's grader
# forms: (tier, the prompt's first digits, the teacher's probability of the right value, how it is wrong)
FORMS_TIERS = (("learnable", range(0, 4), 0.5, "near"), ("hard", range(4, 7), 0.2, "far"),
               ("noise", range(7, 10), 0.5, "near"))
FORMS_NOISE_P = 0.5  # success probability of any well-formed answer on a noise prompt
ABSTAIN_TASK = "abstain"  # calibrated behaviour (declining); not in TASKS
ABSTAIN_VERBALIZED_TASK = "abstain_verbalized"  # the same with a stated confidence (RLCR's arm)
_ABSTAIN_FAMILY = {ABSTAIN_TASK: "@", ABSTAIN_VERBALIZED_TASK: "$"}  # task -> prompt suffix
ABSTAIN_TOKEN = "?"  # the answer "I don't know"
HIDDEN_DIGIT = "_"  # the digit an unanswerable prompt hides
ABSTAIN_UNANSWERABLE = 0.25  # share of the codes whose prompt hides a digit
ABSTAIN_WARM_RATE = 0.2  # the SFT teacher declines this often, whatever the prompt
ABSTAIN_THRESHOLD = 0.65  # t of the risk-threshold reward and of the regret: answer iff P(right) > t
ABSTAIN_SCHEMES = {ABSTAIN_TASK: ("binary", "risk", "ternary"), ABSTAIN_VERBALIZED_TASK: ("rlcr_risk",)}
CONFIDENCE_DIGITS = 10  # stated confidence k / CONFIDENCE_DIGITS for the digit k: 0.0, 0.1, ..., 0.9
# Disjoint prompt pools: train prompts come from one seeded stream, held-out eval prompts from another, and eval
# prompts never appear in training (the generators reject them).
_SPLIT_SEED = {"train": 0, "eval": 1, "test": 2}


def _completion(text) -> str:
    """TRL passes completions as str (standard) or [{"role": ..., "content": ...}] (conversational)."""
    if isinstance(text, str):
        return text
    if isinstance(text, list) and text and isinstance(text[-1], dict):
        return str(text[-1].get("content", ""))
    return str(text)


def _digit_sum(prompt: str) -> int:
    return sum(int(ch) for ch in prompt[:4])


def _shown_digit_sum(prompt: str) -> int:
    """The sum of the digits an ``abstain`` prompt shows (all four on an answerable one)."""
    return sum(int(ch) for ch in prompt[:4] if ch != HIDDEN_DIGIT)


def prompt_answerable(prompt: str) -> bool:
    """Whether an ``abstain`` prompt has a right answer (no hidden digit)."""
    return HIDDEN_DIGIT not in prompt[:4]


def best_success_probability(task: str, prompt: str) -> float:
    """The success probability of the best answer to an ``abstain`` (or ``abstain_verbalized``) prompt: c(x) for the
    likely digit with the sum right, 0 when a digit is hidden."""
    if get_task(task).name not in _ABSTAIN_FAMILY:
        raise ValueError(f"best_success_probability: {task!r} is not an abstain task")
    return STOCHASTIC_C[_shown_digit_sum(prompt) % 8] if prompt_answerable(prompt) else 0.0


def _abstain_prompts(n: int, split: str, seed: int, suffix: str) -> list[str]:
    """``_four_digit_prompts`` with a digit hidden in a share :data:`ABSTAIN_UNANSWERABLE` of them: whether and which
    comes from the code's own generator, so a prompt's fate depends on neither ``n`` nor the other prompts."""
    out = []
    for prompt in _four_digit_prompts(n, split, seed, suffix):
        code = prompt[:4]
        rng = np.random.default_rng([int(code), 4_2_1])  # the code's own stream, the same in every split and seed
        if rng.random() < ABSTAIN_UNANSWERABLE:
            at = int(rng.integers(4))
            code = code[:at] + HIDDEN_DIGIT + code[at + 1:]
        out.append(code + suffix)
    return out


# ----------------------------------------------------------------------------------------------------------
# prompt generation


def _four_digit_prompts(n: int, split: str, seed: int, suffix: str) -> list[str]:
    """n distinct 4-digit prompts; the eval split is drawn from the codes the train split of the same seed skips.

    The 10,000 codes are permuted once by ``seed``; train takes from the front, eval/test from the back, so the
    splits never overlap as long as train + eval <= 10,000.
    """
    perm = np.random.default_rng(10_007 + seed).permutation(10_000)
    if split == "train":
        codes = perm[:n]
    elif split == "eval":
        codes = perm[::-1][:n]
    else:  # test: the middle of the permutation
        codes = perm[5000 - n // 2: 5000 - n // 2 + n]
    return [f"{code:04d}{suffix}" for code in codes]


def _addition_prompts(n: int, split: str, seed: int) -> list[str]:
    space = 90 ** 3  # two-digit numbers 10..99
    perm_rng = np.random.default_rng(20_011 + seed)
    # Sample without replacement from a virtual permutation: draw distinct codes, partition by a hash of the code.
    split_of = {"train": 0, "eval": 1, "test": 2}[split]
    out: list[str] = []
    seen: set[int] = set()
    while len(out) < n:
        codes = perm_rng.integers(0, space, size=4 * n)
        for code in codes.tolist():
            # 80% of the space belongs to train, 10% eval, 10% test, decided by a fixed hash of the code
            bucket = (code * 2654435761 % 2**32) % 10
            owner = 0 if bucket < 8 else (1 if bucket == 8 else 2)
            if owner != split_of or code in seen:
                continue
            seen.add(code)
            a, b, c = code // 8100 + 10, (code // 90) % 90 + 10, code % 90 + 10
            out.append(f"{a}+{b}+{c}=")
            if len(out) == n:
                break
    return out


# ----------------------------------------------------------------------------------------------------------
# the three tasks


@dataclass(frozen=True)
class TaskSpec:
    """A testbed task: its name, prompt builder, rewards, true probabilities and SFT sampler."""

    name: str
    max_completion_length: int
    classes: tuple[str, ...] | None  # decision classes (single tokens) for decision-token methods
    stochastic: bool

    @property
    def dataset_name(self) -> str:
        return f"testbed/{self.name}"


DECISION = TaskSpec("decision", 6, ("Y", "N"), True)
STOCHASTIC = TaskSpec("stochastic_reasoning", 6, None, True)
ADDITION = TaskSpec("addition", 11, None, False)
VERBALIZED = TaskSpec(RLCR_TASK, 8, None, True)
SCRATCHPAD = TaskSpec(SCRATCHPAD_TASK, 26, None, False)
SCRATCHPAD_UNFIXABLE = TaskSpec(SCRATCHPAD_UNFIXABLE_TASK, 26, None, False)
DECISION_COPY = TaskSpec("decision_copy", 8, ("Y", "N"), True)
FORMS_SPEC = TaskSpec(FORMS_TASK, 6, None, True)  # stochastic: the noise tier's reward is a fresh draw
ABSTAIN = TaskSpec(ABSTAIN_TASK, 6, None, True)
ABSTAIN_VERBALIZED = TaskSpec(ABSTAIN_VERBALIZED_TASK, 8, None, True)
_ALL_TASKS = (DECISION, STOCHASTIC, ADDITION, VERBALIZED, SCRATCHPAD, DECISION_COPY, FORMS_SPEC,
              SCRATCHPAD_UNFIXABLE, ABSTAIN, ABSTAIN_VERBALIZED)
_BY_NAME = {t.name: t for t in _ALL_TASKS}


def scratchpad_tier(prompt: str, task: str = SCRATCHPAD_TASK) -> tuple[str, float]:
    """(tier name, the teacher's per-step slip probability) of a ``scratchpad`` (or ``scratchpad_unfixable``)
    prompt (its first digit)."""
    first = int(prompt[0])
    for name, digits, slip in _SCRATCHPAD_FAMILY[get_task(task).name][1]:
        if first in digits:
            return name, slip
    raise ValueError(f"not a scratchpad prompt: {prompt!r}")  # pragma: no cover


def forms_tier(prompt: str) -> tuple[str, float, str]:
    """(tier, the teacher's probability of the right value, "near" / "far" errors) of a ``forms`` prompt."""
    first = int(prompt[0])
    for name, digits, right, error in FORMS_TIERS:
        if first in digits:
            return name, right, error
    raise ValueError(f"not a forms prompt: {prompt!r}")  # pragma: no cover


def prompt_tier(task: str, prompt: str) -> str | None:
    """The tier of ``prompt`` on the tasks that have tiers (``scratchpad``, ``forms``), else None."""
    name = get_task(task).name
    if name in _SCRATCHPAD_FAMILY:
        return scratchpad_tier(prompt, name)[0]
    if name == FORMS_TASK:
        return forms_tier(prompt)[0]
    return None


def get_task(name: str) -> TaskSpec:
    key = name.removeprefix("testbed/")
    try:
        return _BY_NAME[key]
    except KeyError:
        raise KeyError(f"unknown testbed task {name!r}; choose from {', '.join(_BY_NAME)}") from None


def build_rows(task: str, n: int, *, split: str = "train", seed: int = 0) -> list[dict]:
    """Rows (dicts) of ``task``: the columns documented in the module docstring."""
    t = get_task(task)
    if t.name in ("decision", "decision_copy"):
        prompts = _four_digit_prompts(n, split, seed, "=" if t.name == "decision" else "^")
        rows = []
        for i, p in enumerate(prompts):
            ss = _digit_sum(p)
            rows.append({"prompt": p, "answer": f"{ss:02d}", "p_true": DECISION_P[ss % 8],
                         "classes": list(DECISION.classes), "prompt_id": i})
        return rows
    if t.name in ("stochastic_reasoning", RLCR_TASK):
        prompts = _four_digit_prompts(n, split, seed, "?" if t.name == "stochastic_reasoning" else "!")
        rows = []
        for i, p in enumerate(prompts):
            ss = _digit_sum(p)
            rows.append({"prompt": p, "answer": f"{ss:02d}", "likely": str(ss % 10), "p_true": STOCHASTIC_C[ss % 8],
                         "prompt_id": i})
        return rows
    if t.name in _ABSTAIN_FAMILY:
        rows = []
        for i, p in enumerate(_abstain_prompts(n, split, seed, _ABSTAIN_FAMILY[t.name])):
            ss = _shown_digit_sum(p)
            rows.append({"prompt": p, "answer": f"{ss:02d}", "likely": str(ss % 10),
                         "p_true": best_success_probability(t.name, p), "answerable": prompt_answerable(p),
                         "prompt_id": i})
        return rows
    if t.name in _SCRATCHPAD_FAMILY:
        rows = []
        for i, p in enumerate(_four_digit_prompts(n, split, seed, _SCRATCHPAD_FAMILY[t.name][0])):
            tier, slip = scratchpad_tier(p, t.name)
            rows.append({"prompt": p, "answer": f"{_digit_sum(p):02d}", "p_true": (1.0 - slip) ** 3, "tier": tier,
                         "prompt_id": i})
        return rows
    if t.name == FORMS_TASK:
        rows = []
        for i, p in enumerate(_four_digit_prompts(n, split, seed, "~")):
            tier, right, _ = forms_tier(p)
            p_true = FORMS_NOISE_P if tier == "noise" else right
            rows.append({"prompt": p, "answer": str(_digit_sum(p)), "p_true": p_true, "tier": tier, "prompt_id": i})
        return rows
    prompts = _addition_prompts(n, split, seed)
    rows = []
    for i, p in enumerate(prompts):
        a, b, c = (int(x) for x in p[:-1].split("+"))
        rows.append({"prompt": p, "answer": str(a + b + c), "partial": str(a + b), "prompt_id": i})
    return rows


def build_dataset(task: str, n: int = 2000, *, split: str = "train", seed: int = 0):
    """The task as a ``datasets.Dataset`` with ``n`` distinct prompts (seeded, disjoint across splits)."""
    from datasets import Dataset

    return Dataset.from_list(build_rows(task, n, split=split, seed=seed))


# ----------------------------------------------------------------------------------------------------------
# parsing, true probabilities and rewards

_DECISION_RE = re.compile(r"^(\d\d):([YN])")
_STOCH_RE = re.compile(r"^(\d\d);(\d)")
_ADD_RE = re.compile(r"^(\d+)\+(\d\d)=(\d+)")
_VERBALIZED_RE = re.compile(r"^(\d\d);(\d)(?::(\d))?")
_DECISION_COPY_RE = re.compile(r"^(\d\d):([YN])>([YN])")
_ABSTAIN_RE = re.compile(r"^(\d\d);([\d?])")
_ABSTAIN_VERBALIZED_RE = re.compile(r"^(\d\d);(?:(\?)|(\d)(?::(\d))?)")
_FORMS_RE = re.compile(r"^(\+?)(\d{1,2})(\.0)?(?![\d.])")
_SCRATCHPAD_RE = re.compile(r"^(\d)\+(\d)=(\d\d),(\d\d)\+(\d)=(\d\d),(\d\d)\+(\d)=(\d\d)\|(\d\d)")


def scratchpad_steps(prompt: str, completion: str) -> list[tuple[int, int, int]] | None:
    """The three written steps ``(left, digit, result)`` of a ``scratchpad`` completion, None if malformed."""
    m = _SCRATCHPAD_RE.match(completion)
    if not m:
        return None
    g = [int(x) for x in m.groups()]
    return [(g[0], g[1], g[2]), (g[3], g[4], g[5]), (g[6], g[7], g[8])]


def parse(task: str, prompt: str, completion: str) -> dict:
    """Parse a completion: ``{"format_ok", "reasoning_ok", "choice"}`` (choice = decision / answer digit / total;
    ``verbalized`` adds ``"confidence"``: k / 10 for the confidence digit k, None when there is none).

    Trailing text after the expected pattern is tolerated (TRL strips EOS; a model that rambles is judged on its
    first answer).
    """
    t = get_task(task)
    completion = _completion(completion)
    if t.name == "decision":
        m = _DECISION_RE.match(completion)
        if not m:
            return {"format_ok": False, "reasoning_ok": False, "choice": None}
        return {"format_ok": True, "reasoning_ok": int(m.group(1)) == _digit_sum(prompt), "choice": m.group(2)}
    if t.name == "decision_copy":
        m = _DECISION_COPY_RE.match(completion)
        if not m:
            return {"format_ok": False, "reasoning_ok": False, "choice": None, "conclusion": None}
        return {"format_ok": True, "reasoning_ok": int(m.group(1)) == _digit_sum(prompt), "choice": m.group(3),
                "conclusion": m.group(2)}
    if t.name == RLCR_TASK:
        m = _VERBALIZED_RE.match(completion)
        if not m:
            return {"format_ok": False, "reasoning_ok": False, "choice": None, "confidence": None}
        confidence = int(m.group(3)) / CONFIDENCE_DIGITS if m.group(3) is not None else None
        return {"format_ok": True, "reasoning_ok": int(m.group(1)) == _digit_sum(prompt), "choice": m.group(2),
                "confidence": confidence}
    if t.name in _ABSTAIN_FAMILY:  # choice: the answer digit, or ABSTAIN_TOKEN; abstained: whether it declined
        verbalized = t.name == ABSTAIN_VERBALIZED_TASK
        m = (_ABSTAIN_VERBALIZED_RE if verbalized else _ABSTAIN_RE).match(completion)
        if not m:
            return {"format_ok": False, "reasoning_ok": False, "choice": None, "abstained": False,
                    **({"confidence": None} if verbalized else {})}
        ok = int(m.group(1)) == _shown_digit_sum(prompt)
        if verbalized:
            choice = ABSTAIN_TOKEN if m.group(2) else m.group(3)
            confidence = int(m.group(4)) / CONFIDENCE_DIGITS if m.group(4) is not None else None
            return {"format_ok": True, "reasoning_ok": ok, "choice": choice, "abstained": choice == ABSTAIN_TOKEN,
                    "confidence": confidence}
        return {"format_ok": True, "reasoning_ok": ok, "choice": m.group(2),
                "abstained": m.group(2) == ABSTAIN_TOKEN}
    if t.name == "stochastic_reasoning":
        m = _STOCH_RE.match(completion)
        if not m:
            return {"format_ok": False, "reasoning_ok": False, "choice": None}
        return {"format_ok": True, "reasoning_ok": int(m.group(1)) == _digit_sum(prompt), "choice": m.group(2)}
    if t.name == FORMS_TASK:  # choice: the value in its canonical spelling; form: 0, 1, 2 (index in FORMS)
        m = _FORMS_RE.match(completion)
        if not m or (m.group(1) and m.group(3)) or (len(m.group(2)) == 2 and m.group(2)[0] == "0"):
            return {"format_ok": False, "reasoning_ok": False, "choice": None, "form": None}
        value = int(m.group(2))
        return {"format_ok": True, "reasoning_ok": value == _digit_sum(prompt), "choice": str(value),
                "form": 2 if m.group(1) else (1 if m.group(3) else 0)}
    if t.name in _SCRATCHPAD_FAMILY:
        m = _SCRATCHPAD_RE.match(completion)
        if not m:
            return {"format_ok": False, "reasoning_ok": False, "choice": None}
        digits = [int(ch) for ch in prompt[:4]]
        steps = scratchpad_steps(prompt, completion)
        running, ok = digits[0], True
        for (left, digit, result), want in zip(steps, digits[1:]):
            ok = ok and left == running and digit == want and result == running + want
            running += want
        ok = ok and steps[0][0] == digits[0] and int(m.group(10)) == steps[2][2]
        return {"format_ok": True, "reasoning_ok": ok, "choice": m.group(10)}
    m = _ADD_RE.match(completion)
    if not m:
        return {"format_ok": False, "reasoning_ok": False, "choice": None}
    a, b, c = (int(x) for x in prompt[:-1].split("+"))
    ok = int(m.group(1)) == a + b and int(m.group(2)) == c
    return {"format_ok": True, "reasoning_ok": ok, "choice": m.group(3)}


def verbalized_confidence_span(text) -> tuple[float | None, int | None]:
    """A confidence reader for ``testbed/verbalized`` (``CalibratedGRPOConfig.stated_confidence_reader=
    "calibrl.testbed.tasks:verbalized_confidence_span"``): (k / 10, the offset of the ``:`` before the digit k) of
    a completion ``ss;A:k``; (None, None) when it states none (as :func:`parse` reads it: ``ss;A``, a ``:`` without a
    digit, a malformed completion). ``"12;3:7"`` -> (0.7, 4)."""
    m = _VERBALIZED_RE.match(_completion(text))
    if not m or m.group(3) is None:
        return None, None
    return int(m.group(3)) / CONFIDENCE_DIGITS, m.start(3) - 1


def true_success_probability(task: str, prompt: str, completion: str) -> float:
    """Exact probability that the world rewards ``completion`` for ``prompt`` (noise-free correctness)."""
    t = get_task(task)
    parsed = parse(task, prompt, completion)
    if not parsed["format_ok"]:
        return 0.0
    if t.name in _ABSTAIN_FAMILY:  # binary grading: declining is right exactly where no answer is
        if parsed["abstained"]:
            return 0.0 if prompt_answerable(prompt) else 1.0
        if not prompt_answerable(prompt) or not parsed["reasoning_ok"]:
            return 0.0
        ss = _shown_digit_sum(prompt)
        c = STOCHASTIC_C[ss % 8]
        return c if int(parsed["choice"]) == ss % 10 else (1.0 - c) / 9.0
    ss = _digit_sum(prompt) if t.name != "addition" else None
    if t.name in _SCRATCHPAD_FAMILY:
        return 1.0 if int(parsed["choice"]) == ss else 0.0
    if t.name == FORMS_TASK:
        if forms_tier(prompt)[0] == "noise":
            return FORMS_NOISE_P
        return 1.0 if parsed["reasoning_ok"] else 0.0
    if t.name in ("decision", "decision_copy"):
        if not parsed["reasoning_ok"]:
            return 0.0
        p = DECISION_P[ss % 8]
        return p if parsed["choice"] == "Y" else 1.0 - p
    if t.name in ("stochastic_reasoning", RLCR_TASK):
        if not parsed["reasoning_ok"]:
            return 0.0
        c = STOCHASTIC_C[ss % 8]
        return c if int(parsed["choice"]) == ss % 10 else (1.0 - c) / 9.0
    a, b, c = (int(x) for x in prompt[:-1].split("+"))
    return 1.0 if parsed["choice"] == str(a + b + c) else 0.0


def make_reward(task: str, seed: int | None = None, *, scheme: str | None = None) -> Callable[..., list[float]]:
    """A TRL reward function for ``task`` with its own random stream for the fresh outcome draws.

    Signature ``fn(prompts, completions, **columns) -> list[float]``. For the stochastic tasks each call draws a
    fresh outcome per completion from the true distribution (``seed`` makes the stream reproducible); the
    addition reward is deterministic. ``verbalized``: RLCR's reward of the drawn outcome and the stated confidence.
    ``scheme``: the abstain tasks' reward (:data:`ABSTAIN_SCHEMES`; default the first: ``binary``, and
    ``rlcr_risk`` for ``abstain_verbalized``); None for every other task.
    """
    t = get_task(task)
    rng = np.random.default_rng(seed)
    if t.name in _ABSTAIN_FAMILY:
        return _abstain_reward(t.name, rng, scheme or ABSTAIN_SCHEMES[t.name][0])
    if scheme is not None:
        raise ValueError(f"reward scheme {scheme!r}: only the abstain tasks have schemes, not {t.name!r}")

    def reward(prompts: Sequence, completions: Sequence, **columns) -> list[float]:
        out = []
        for prompt, completion in zip(prompts, completions):
            prompt = _completion(prompt)
            q = true_success_probability(t.name, prompt, _completion(completion))
            if t.name == RLCR_TASK:
                from calibrl.tasks.rewards import rlcr_reward

                right = bool(rng.random() < q) if q > 0 else False
                stated = parse(t.name, prompt, _completion(completion))["confidence"]
                out.append(rlcr_reward(correct=right, confidence=stated))
            elif t.stochastic:
                out.append(float(rng.random() < q) if q > 0 else 0.0)
            else:
                out.append(q)
        return out

    reward.__name__ = f"testbed_{t.name}"
    reward.__qualname__ = reward.__name__
    return reward


def _abstain_reward(task: str, rng: np.random.Generator, scheme: str) -> Callable[..., list[float]]:
    """The abstain tasks' reward (module docstring) for ``scheme``: each answer's outcome a fresh draw from its
    success probability; the values from :mod:`calibrl.tasks.abstention`'s rewards."""
    from calibrl.tasks.abstention import TERNARY_PRESETS, risk_threshold_reward, ternary_reward
    from calibrl.tasks.rewards import rlcr_reward

    if scheme not in ABSTAIN_SCHEMES[task]:
        raise ValueError(f"{task}: reward scheme {scheme!r}; choose from {', '.join(ABSTAIN_SCHEMES[task])}")
    right_value, abstain_value, wrong_value = TERNARY_PRESETS["truthrl"]

    def reward(prompts: Sequence, completions: Sequence, **columns) -> list[float]:
        out = []
        for prompt, completion in zip(prompts, completions):
            prompt, completion = _completion(prompt), _completion(completion)
            parsed = parse(task, prompt, completion)
            q = true_success_probability(task, prompt, completion)
            drawn = bool(rng.random() < q) if q > 0 else False
            abstained = parsed["abstained"]
            answered_right = drawn and not abstained
            if scheme == "binary":
                out.append(float(drawn))
            elif scheme == "ternary":
                out.append(ternary_reward(answered_right, abstained, right=right_value, abstain=abstain_value,
                                          wrong=wrong_value))
            else:
                value = risk_threshold_reward(answered_right, abstained, threshold=ABSTAIN_THRESHOLD)
                if scheme == "rlcr_risk" and not abstained:  # RLCR's Brier term on the stated confidence
                    value += rlcr_reward(correct=drawn, confidence=parsed.get("confidence")) - float(drawn)
                out.append(float(value))
        return out

    reward.__name__ = f"testbed_{task}_{scheme}"
    reward.__qualname__ = reward.__name__
    return reward


# ----------------------------------------------------------------------------------------------------------
# SFT data from the true distribution and the Bayes ceiling


def sample_true_completion(task: str, row: dict, rng: np.random.Generator) -> str:
    """A completion drawn from the TRUE (calibrated) policy for ``row``."""
    t = get_task(task)
    if t.name == "decision":
        d = "Y" if rng.random() < row["p_true"] else "N"
        return f"{row['answer']}:{d}"
    if t.name == "decision_copy":  # the conclusion is drawn, the decision copies it
        c = "Y" if rng.random() < row["p_true"] else "N"
        return f"{row['answer']}:{c}>{c}"
    if t.name in _ABSTAIN_FAMILY:  # declines at random, else answers as stochastic_reasoning's teacher
        if rng.random() < ABSTAIN_WARM_RATE:
            return f"{row['answer']};{ABSTAIN_TOKEN}"
        likely = int(row["likely"])
        c = STOCHASTIC_C[int(row["answer"]) % 8]
        a = likely if rng.random() < c else int(rng.choice([d for d in range(10) if d != likely]))
        if t.name == ABSTAIN_VERBALIZED_TASK:
            return f"{row['answer']};{a}:{int(rng.integers(CONFIDENCE_DIGITS))}"
        return f"{row['answer']};{a}"
    if t.name in ("stochastic_reasoning", RLCR_TASK):
        likely = int(row["likely"])
        if rng.random() < row["p_true"]:
            a = likely
        else:
            a = int(rng.choice([d for d in range(10) if d != likely]))
        if t.name == RLCR_TASK:  # an uninformed stated confidence: RL has to learn a calibrated one
            return f"{row['answer']};{a}:{int(rng.integers(CONFIDENCE_DIGITS))}"
        return f"{row['answer']};{a}"
    if t.name in _SCRATCHPAD_FAMILY:  # the teacher with systematic +1 slips (module docstring), not the truth
        digits = [int(ch) for ch in row["prompt"][:4]]
        _, slip = scratchpad_tier(row["prompt"], t.name)
        running, parts = digits[0], []
        for digit in digits[1:]:
            result = running + digit + int(rng.random() < slip)
            parts.append(f"{running:02d}+{digit}={result:02d}" if parts else f"{running}+{digit}={result:02d}")
            running = result
        return ",".join(parts) + f"|{running:02d}"
    if t.name == FORMS_TASK:  # the teacher of the module docstring: right, a near miss or far wrong; any form
        ss = _digit_sum(row["prompt"])
        _, right, error = forms_tier(row["prompt"])
        if rng.random() < right:
            value = ss
        elif error == "near":
            value = ss + 1 if (ss == 0 or rng.random() < 0.5) else ss - 1
        else:
            value = int(rng.choice([v for v in range(37) if abs(v - ss) >= 5]))
        return FORMS[int(rng.integers(len(FORMS)))].format(v=value)
    a, b, c = (int(x) for x in row["prompt"][:-1].split("+"))
    return f"{a + b}+{c}={a + b + c}"


def sft_dataset(task: str, n_prompts: int = 5000, *, samples_per_prompt: int = 1, seed: int = 0):
    """Prompt-completion ``datasets.Dataset`` for TRL's SFTTrainer, completions drawn from the true distribution
    (``scratchpad``: from its slipping teacher)."""
    from datasets import Dataset

    rows = build_rows(task, n_prompts, split="train", seed=seed)
    rng = np.random.default_rng(1_000 + seed)
    data = [{"prompt": r["prompt"], "completion": sample_true_completion(task, r, rng)}
            for r in rows for _ in range(samples_per_prompt)]
    return Dataset.from_list(data)


def _answer_options(task: str) -> list[tuple[float, list[float]]]:
    """Per prompt class of a stochastic task: (its share of the 10,000 4-digit codes, the success probability of
    each answer the true sampler can give)."""
    t = get_task(task)
    sums = np.array([sum(int(c) for c in f"{code:04d}") for code in range(10_000)])
    out = []
    for ss in range(37):
        share = float((sums == ss).sum()) / sums.size
        if t.name in ("decision", "decision_copy"):
            p = DECISION_P[ss % 8]
            out.append((share, [p, 1 - p]))
        else:
            c = STOCHASTIC_C[ss % 8]
            out.append((share, [c] + [(1 - c) / 9] * 9))
    return out


def ideal_sampler(task: str, temperature: float) -> tuple[float, float]:
    """(expected accuracy, AUROC of the true success probability) of the ideal sampler at ``temperature``: the
    reasoning always right, answer a drawn with probability proportional to q(a|x)^(1/T), q the true success
    probability (T = 1: the true distribution, the calibrated warm start's target; T -> 0: always the likeliest
    answer). Sharpening raises accuracy and lowers this AUROC: the frontier an RL-sharpened policy is read against
    in the (accuracy, AUROC) plane. ``nan, nan`` for the tasks without it (deterministic, forms)."""
    t = get_task(task)
    if not t.stochastic or t.name == FORMS_TASK or t.name in _ABSTAIN_FAMILY:
        return float("nan"), float("nan")
    scores, pos, neg = [], [], []
    accuracy = 0.0
    for share, qs in _answer_options(task):
        q = np.asarray(qs)
        if temperature <= 0:
            freq = (q == q.max()) / (q == q.max()).sum()
        else:
            w = q ** (1.0 / temperature)
            freq = w / w.sum()
        accuracy += share * float((freq * q).sum())
        scores += q.tolist()
        pos += (share * freq * q).tolist()
        neg += (share * freq * (1 - q)).tolist()
    from calibrl.metrics import weighted_auroc

    # every (prompt class, answer) item once as a positive (weight pos) and once as a negative (weight neg)
    scores = np.array(scores)
    auroc = weighted_auroc(np.r_[scores, scores], np.r_[np.ones(scores.size, bool), np.zeros(scores.size, bool)],
                           np.r_[pos, neg])
    return accuracy, float(auroc)


def bayes_auroc(task: str, *, policy: str = "true") -> float:
    """AUROC ceiling: the AUROC of the true success probability itself, over every prompt (uniform over the 10,000
    4-digit codes) and every answer, weighted by how often ``policy`` gives it.

    ``policy="true"``: answers drawn from the true distribution (the calibrated SFT warm start);
    ``policy="greedy"``: the majority answer always (what reward maximisation converges to; the confidence can
    only rank prompts then). ``nan`` for the deterministic addition task, where the optimum is always right.
    (:func:`ideal_sampler` at T = 1 and T = 0.)
    """
    if policy not in ("true", "greedy"):
        raise ValueError(f"policy must be 'true' or 'greedy', got {policy!r}")
    return ideal_sampler(task, 1.0 if policy == "true" else 0.0)[1]


# ----------------------------------------------------------------------------------------------------------
# registration


def _register(task: TaskSpec) -> None:
    @register_dataset(task.dataset_name, overwrite=True)
    def _loader(split: str = "train", n: int = 2000, seed: int = 0, limit: int | None = None, **_):
        return build_dataset(task.name, n if limit is None else min(n, limit), split=split, seed=seed)

    register_reward(task.dataset_name, overwrite=True)(make_reward(task.name))


for _task in _ALL_TASKS:
    _register(_task)

__all__ = [
    "ABSTAIN", "ABSTAIN_SCHEMES", "ABSTAIN_TASK", "ABSTAIN_THRESHOLD", "ABSTAIN_TOKEN", "ABSTAIN_UNANSWERABLE",
    "ABSTAIN_VERBALIZED", "ABSTAIN_VERBALIZED_TASK", "ABSTAIN_WARM_RATE", "HIDDEN_DIGIT", "best_success_probability",
    "prompt_answerable",
    "ADDITION", "CONFIDENCE_DIGITS", "DECISION", "DECISION_COPY", "FORMS", "FORMS_NOISE_P", "FORMS_SPEC",
    "FORMS_TASK", "FORMS_TIERS", "RLCR_TASK", "SCRATCHPAD", "SCRATCHPAD_TASK", "SCRATCHPAD_TIERS",
    "SCRATCHPAD_UNFIXABLE", "SCRATCHPAD_UNFIXABLE_TASK", "SCRATCHPAD_UNFIXABLE_TIERS", "STOCHASTIC", "TASKS",
    "TaskSpec", "VERBALIZED", "bayes_auroc", "build_dataset", "build_rows", "forms_tier", "get_task",
    "ideal_sampler", "make_reward", "parse", "prompt_tier", "sample_true_completion", "scratchpad_steps",
    "scratchpad_tier", "sft_dataset", "true_success_probability", "verbalized_confidence_span",
]
