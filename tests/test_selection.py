"""Answer selection (majority, weighted, PC, RPC, best-of-N), answer clustering and scaling curves."""

import numpy as np
import pytest

from calibrl import metrics as M
from calibrl import selection as S

# One prompt where every method picks a different answer (worked out by hand):
#   A: 9 distinct paths at p=0.02  -> most votes (majority), weighted 0.18
#   B: 3 IDENTICAL texts at 0.45   -> weighted 1.35 (the largest), but PC counts the text once: 0.45
#   C: 8 distinct paths at 0.15    -> PC 1.20 (the largest PC score); all 8 lie below the mean 0.204 and the
#                                     Weibull mixture puts them in the low component, so RPC prunes them
#   D: 2 distinct paths at 0.55    -> PC 1.10; wins once C is pruned (RPC)
#   E: 1 path at 0.90              -> the single most confident path (best-of-N)
ANS = ["A"] * 9 + ["B"] * 3 + ["C"] * 8 + ["D"] * 2 + ["E"]
PROBS = [0.02] * 9 + [0.45] * 3 + [0.15] * 8 + [0.55] * 2 + [0.9]
TEXTS = [f"a{i}" for i in range(9)] + ["b"] * 3 + [f"c{i}" for i in range(8)] + ["d0", "d1", "e"]
EXPECTED = {"majority": "A", "weighted": "B", "pc": "C", "rpc": "D", "best_of_n": "E"}


def _winner(result, ids):
    return ANS[int(np.flatnonzero(ids == result.answer_ids[0])[0])]


@pytest.mark.parametrize("method", S.METHODS)
def test_each_method_picks_its_own_answer(method):
    ids = S.answer_clusters(ANS, [0] * len(ANS), use_math_verify=False)
    for truth in "ABCDE":
        correct = [a == truth for a in ANS]
        res = S.select(method, ids, correct, [0] * len(ANS), logprob_mean=np.log(PROBS), completions=TEXTS)
        assert _winner(res, ids) == EXPECTED[method]
        assert res.accuracy == float(truth == EXPECTED[method])


def test_pc_without_texts_is_weighted_vote():
    ids = S.answer_clusters(ANS, [0] * len(ANS), use_math_verify=False)
    res = S.perplexity_consistency(ids, [True] * len(ANS), [0] * len(ANS), logprob_mean=np.log(PROBS))
    assert _winner(res, ids) == "B"


def test_rpc_prunes_only_low_paths_below_mean():
    keep = S.rpc_keep_mask([0] * len(ANS), np.log(PROBS))
    assert keep.tolist() == [a not in "AC" for a in ANS]


def _reference_prune(probs):
    """WNJXYK/RPC compute_rpc.py's pruning, transcribed (plain pdf, numerical gradient)."""
    from scipy.optimize import minimize
    from scipy.special import gamma

    def pdf(x, k, lam):
        return (k / lam) * (x / lam) ** (k - 1) * np.exp(-((x / lam) ** k))

    def nll(params, data):
        w1, k1, lam1, k2, lam2 = params
        return -np.sum(np.log(w1 * pdf(data, k1, lam1) + (1 - w1) * pdf(data, k2, lam2)))

    with np.errstate(all="ignore"):
        res = minimize(nll, [0.5, 1.0, 1.0, 1.5, 2.0], args=(probs,),
                       bounds=[(0.2, 0.8), (0.01, None), (0.01, None), (0.01, None), (0.01, None)])
        w1, k1, lam1, k2, lam2 = res.x
        if lam1 * gamma(1 + 1 / k1) < lam2 * gamma(1 + 1 / k2):
            k1, lam1, k2, lam2, w1 = k2, lam2, k1, lam1, 1 - w1
        p1 = w1 * pdf(probs, k1, lam1)
        p2 = (1 - w1) * pdf(probs, k2, lam2)
    return ~((p1 < p2) & (probs < probs.mean()))


def test_rpc_pruning_matches_reference_code():
    rng = np.random.default_rng(0)
    agree = []
    for _ in range(12):
        probs = np.exp(-rng.exponential(0.3, size=16))
        ours = S.rpc_keep_mask(np.zeros(16), np.log(probs))
        agree.append(np.array_equal(ours, _reference_prune(probs)))
    assert np.mean(agree) >= 11 / 12


def test_ties_count_fractionally():
    # two answers with one vote each, one right: expected accuracy of a uniform tie-break is 0.5
    res = S.majority_vote([0, 1], [True, False], [7, 7])
    assert res.correct.tolist() == [0.5]
    res = S.best_of_n([0, 1], [True, False], [7, 7], confidence=[0.3, 0.3])
    assert res.correct.tolist() == [0.5]


def test_missing_answers_form_one_cluster_per_prompt():
    ids = S.answer_clusters([None, None, "3", None], [0, 0, 0, 1], use_math_verify=False)
    assert ids[0] == ids[1] != ids[2] and ids[3] != ids[0]
    res = S.majority_vote(ids, [False, False, True, False], [0, 0, 0, 1])
    assert res.correct.tolist() == [0.0, 0.0]


def test_string_normalisation_without_math_verify():
    ids = S.answer_clusters(["0.50", "0.5", "\\boxed{0.5}", "$0.5$", "1/2", "0.5"], [0, 0, 0, 0, 0, 1],
                            use_math_verify=False)
    assert len(set(ids[:4].tolist())) == 1 and ids[4] != ids[0] and ids[5] != ids[0]


def test_math_verify_merges_equivalent_answers():
    import math_verify  # noqa: F401
    ids = S.answer_clusters(["0.5", "\\frac{1}{2}", "\\dfrac12", "2", "0.5"], [0, 0, 0, 0, 1])
    assert ids[0] == ids[1] == ids[2]
    assert ids[3] != ids[0]
    assert ids[4] != ids[0]  # never merged across prompts


def test_group_answer_ids_cluster_by_the_graders_equivalence_within_groups():
    import math_verify  # noqa: F401
    ids = S.group_answer_ids(["12", "12.0", "\\frac{24}{2}", "13", None, None, "12"], [0, 0, 0, 0, 0, 0, 1])
    assert ids[:4] == [0, 0, 0, 1]  # dense, in order of first appearance
    assert ids[4] == ids[5] == -1  # no answer: the estimator makes each a singleton
    assert ids[6] == 2  # the same answer in another group is another cluster
    with pytest.raises(ValueError, match="group_ids"):
        S.group_answer_ids(["1"], [0, 1])


def _random_groups(n_prompts=30, n=8, seed=0):
    rng = np.random.default_rng(seed)
    pid = np.repeat(np.arange(n_prompts), n)
    ans = rng.integers(0, 3, size=pid.size)
    correct = ans == 0
    lpm = -rng.exponential(0.4, size=pid.size) - 0.2 * (~correct)
    return ans, correct, pid, lpm


@pytest.mark.parametrize("method", ["majority", "weighted", "pc", "best_of_n"])
def test_scaling_curve_endpoints(method):
    ans, correct, pid, lpm = _random_groups()
    curve = S.scaling_curve(method, ans, correct, pid, logprob_mean=lpm, n_draws=3, seed=1)
    assert curve.ns.tolist() == [1, 2, 4, 8]
    assert curve.accuracy[0] == pytest.approx(M.mean_at_k(correct, pid))
    full = S.select(method, ans, correct, pid, logprob_mean=lpm).accuracy
    assert curve.accuracy[-1] == pytest.approx(full) and curve.std[-1] == 0.0


def test_scaling_curve_subsets_are_random_per_draw_and_seeded():
    ans, correct, pid, lpm = _random_groups()
    a = S.scaling_curve("majority", ans, correct, pid, ns=(3,), n_draws=5, seed=3)
    b = S.scaling_curve("majority", ans, correct, pid, ns=(3,), n_draws=5, seed=3)
    assert a.accuracy.tolist() == b.accuracy.tolist() and a.std[0] > 0


def test_maj_at_k():
    ans, correct, pid, _ = _random_groups()
    assert S.maj_at_k(ans, correct, pid, k=1) == pytest.approx(M.mean_at_k(correct, pid))
    assert S.maj_at_k(ans, correct, pid, k=8) == pytest.approx(S.majority_vote(ans, correct, pid).accuracy)


def test_errors():
    with pytest.raises(ValueError, match="logprob_mean"):
        S.select("pc", [0], [True], [0])
    with pytest.raises(ValueError, match="unknown selection method"):
        S.select("nope", [0], [True], [0])


@pytest.mark.parametrize("method", ["weighted", "pc", "rpc"])
def test_logprob_methods_reject_nan_and_inf(method):
    ans, correct, pid, lpm = _random_groups(n_prompts=3, n=4)
    for bad in (np.nan, -np.inf):
        lpm2 = lpm.copy()
        lpm2[5] = bad
        with pytest.raises(ValueError, match=r"finite logprob_mean on every path; 1 of 12 .*first at index 5"):
            S.select(method, ans, correct, pid, logprob_mean=lpm2)
        with pytest.raises(ValueError, match="finite logprob_mean"):
            S.scaling_curve(method, ans, correct, pid, logprob_mean=lpm2, n_draws=1)


def test_normalize_answer_drops_only_thousands_separators():
    n = S.normalize_answer
    assert n("1,000") == n("1000") == n("\\boxed{1,000}") == n("$1,000$") == "1000.0"
    assert n("-1,234.5") == "-1234.5" and n("12,345,678") == "12345678.0"
    for pair in ("2, 3", "2,3", "2, 300", "1,0000", "(1, 2)"):
        assert n(pair) not in (n("23"), n("2300"), n("10000"), n("12")), pair
    assert n("2, 3") == n("2,3") == "2,3"
    ids = S.answer_clusters(["2, 3", "23", "1,000", "1000"], [0, 0, 0, 0], use_math_verify=False)
    assert ids[0] != ids[1] and ids[2] == ids[3]


def test_scaling_curve_n_draws_reports_draws_used():
    ans, correct, pid, lpm = _random_groups(n_prompts=5, n=4)
    assert S.scaling_curve("majority", ans, correct, pid, n_draws=3).n_draws == 3  # N = 2 is drawn
    assert S.scaling_curve("majority", ans, correct, pid, ns=(1, 4), n_draws=7).n_draws == 1  # all exact
    ans, correct, pid, _ = _random_groups(n_prompts=5, n=2)
    c = S.scaling_curve("majority", ans, correct, pid, n_draws=9)
    assert c.ns.tolist() == [1, 2] and c.n_draws == 1 and c.to_dict()["n_draws"] == 1


# (a, b, equal?) worked out by hand; grading (tasks.rewards.math_equal) and clustering must both give this answer
EQUIVALENCE_TABLE = [
    ("3\\sqrt{2}", "3", False),  # a radical is not its coefficient
    ("3\\sqrt{2}", "2, 3", False),
    ("3", "2, 3", False),  # one answer is not a list containing it
    ("3\\sqrt{2}", "\\sqrt{18}", True),
    ("\\sqrt{2}", "\\sqrt{3}", False),
    ("\\frac{1}{2}", "0.5", True),  # fraction vs decimal
    ("\\dfrac{3}{4}", "3/4", True),
    ("\\frac{1}{3}", "0.333", False),  # a rounded decimal is not the fraction
    ("0.5", "0.50", True),
    ("(1, 2)", "(2, 1)", False),  # ordered tuples
    ("(1,2)", "(1, 2)", True),
    ("\\{1,2\\}", "\\{2,1\\}", True),  # sets
    ("1, 2", "2, 1", True),  # a bare list of answers is unordered (several solutions)
    ("5\\text{ cm}", "5", True),  # units
    ("5\\text{ cm}", "6\\text{ cm}", False),
    ("(0, 1]", "(0, 1)", False),  # intervals: the bracket matters
    ("[0, \\infty)", "[0,\\infty)", True),
    ("(-\\infty, 2)", "x<2", True),  # the same set written as an inequality
    ("\\text{Monday}", "Monday", True),  # text answers
    ("\\text{Monday}", "\\text{Tuesday}", False),
    ("yes", "no", False),
    ("1,000", "1000", True),  # thousands separators
    ("12,345,678", "12345678", True),
    ("2,3", "23", False),  # a pair is not a number
    ("2, 300", "2300", False),
    ("-3", "3", False),  # negative numbers
    ("-3", "- 3", True),
    ("-0.5", "-\\frac{1}{2}", True),
    ("\\pm 2", "2", False),
    ("50\\%", "50", True),  # percent
    ("10\\%", "0.1", True),
    ("x=2", "2", True),
    ("2x+1", "1+2x", True),
]


@pytest.mark.parametrize("a,b,equal", EQUIVALENCE_TABLE)
def test_grading_and_clustering_agree_with_the_hand_worked_table(a, b, equal):
    from calibrl.selection.answers import answers_equivalent
    from calibrl.tasks.rewards import math_equal

    assert math_equal(a, b) is equal and math_equal(b, a) is equal
    ids = S.answer_clusters([a, b, b, a], [0, 0, 1, 1])
    assert bool(ids[0] == ids[1]) is equal and bool(ids[2] == ids[3]) is equal
    assert answers_equivalent(a, b) is equal


def test_clusters_follow_grading_not_a_looser_parse():
    ids = S.answer_clusters(["3\\sqrt{2}", "3", "2, 3", "\\sqrt{18}"], [0, 0, 0, 0])
    assert ids[0] != ids[1] and ids[0] != ids[2] and ids[1] != ids[2] and ids[0] == ids[3]


def test_literal_shortcut_gives_math_verify_s_verdict():
    from calibrl.selection.answers import _literal_square, _literals_equal, _verify_pair

    # hand-worked signed squares: (3/6)^2 = 1/4, -(1/2)^2, (3 sqrt 2)^2 = 18
    assert _literal_square("\\frac{3}{6}") == _literal_square("\\dfrac{1}{2}") == 0.25
    assert _literal_square("-\\tfrac{1}{2}") == -0.25 and _literal_square("3\\sqrt{2}") == 18
    assert _literal_square("\\frac{1}{0}") is None and _literal_square("1.5") is None
    assert _literals_equal("2\\sqrt{2}", "\\sqrt{8}") is True and _literals_equal("2\\sqrt{4}", "4") is True
    assert _literals_equal("3\\sqrt{2}", "\\sqrt{17}") is False
    assert _literals_equal("-\\frac{1}{2}", "\\frac{1}{2}") is False
    assert _literals_equal("1.5", "\\frac{3}{2}") is None and _literals_equal("\\pi", "\\pi") is None
    rng = np.random.default_rng(7)

    def draw() -> str:
        sign, kind, a, b = "-" * int(rng.uniform() < 0.2), int(rng.integers(0, 3)), *rng.integers(0, 9, 2).tolist()
        return sign + [f"{a}", f"\\frac{{{a}}}{{{b + 1}}}", f"{a or ''}\\sqrt{{{b}}}"][kind]

    def equal_pair() -> tuple[str, str]:  # one value written two ways: a fraction scaled, a square taken in
        a, b, k = rng.integers(1, 9, 3).tolist()
        return [(f"\\frac{{{a}}}{{{b}}}", f"\\frac{{{k * a}}}{{{k * b}}}"),
                (f"{k}\\sqrt{{{b}}}", f"\\sqrt{{{k * k * b}}}")][int(rng.integers(0, 2))]

    verdicts = {True: 0, False: 0}
    for i in range(80):
        a, b = sorted(equal_pair() if i % 4 == 0 else (draw(), draw()))
        if a != b:
            shortcut = _literals_equal(a, b)  # every drawn string is a literal: the shortcut decides
            verdicts[shortcut] += 1
            assert _verify_pair(a, b, None) is shortcut, (a, b)  # math-verify's own verdict, parsed
    assert verdicts[True] >= 20 and verdicts[False] >= 30
    rows = [draw() for _ in range(200)]
    pids = rng.integers(0, 20, 200)
    fast = S.answer_clusters(rows, pids)
    from unittest import mock

    with mock.patch("calibrl.selection.answers._literals_equal", return_value=None):
        slow = S.answer_clusters(rows, pids)
    np.testing.assert_array_equal(fast, slow)


def test_answer_cluster_ids_are_numbered_in_the_order_of_prompt_then_normal_form():
    """The first stage's ids are the ranks of the strings f"{prompt index}\\x02{form}" (the prompt's digits as text,
    so prompt 10 comes before prompt 2), computed without building those strings: the ranks of np.unique over
    them, on random answers of 40 prompts (the later merging visits a prompt's answers in this order)."""
    from calibrl.selection.answers import answer_clusters, normalize_answer

    rng = np.random.default_rng(21)
    pool = ["1", "01", "\\frac{1}{2}", "0.5", "x", "X", "é", None, "", " 2 ", "2", "-3", "a b", "ab"]
    for _ in range(20):
        n = int(rng.integers(1, 300))
        pid = rng.integers(0, 40, n).astype(str)  # "10" < "2" as strings, 2 < 10 as dense indices
        answers = np.array([pool[i] for i in rng.integers(0, len(pool), n)], dtype=object)
        dense = np.unique(pid, return_inverse=True)[1].reshape(-1)
        forms = ["\x00none" if a is None else "\x01" + normalize_answer(a) for a in answers]
        keys = np.array([f"{p}\x02{f}" for p, f in zip(dense.tolist(), forms)], dtype=str)
        expected = np.unique(keys, return_inverse=True)[1].reshape(-1)
        np.testing.assert_array_equal(answer_clusters(answers, pid, use_math_verify=False), expected)


def test_literal_answers_are_clustered_without_importing_math_verify():
    import subprocess
    import sys

    code = ("import sys; from calibrl.selection import answer_clusters; "
            "ids = answer_clusters(['12', '\\\\frac{4}{2}', '2', '-3\\\\sqrt{8}', '-6\\\\sqrt{2}', "
            "'\\\\frac{8}{4}'], [0] * 6); "
            "print(ids.tolist(), 'math_verify' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[-1] == "False"  # no pair needed math-verify's parse: not imported (about a second)
    ids = [int(x.strip("[],")) for x in out[:-1]]
    assert ids[1] == ids[2] == ids[5] and ids[3] == ids[4] and len({ids[0], ids[1], ids[3]}) == 3
    pi = S.answer_clusters(["\\pi", "\\frac{22}{7}", "\\pi"], [0, 0, 0])  # parsed: pi is no literal
    assert pi[0] == pi[2] != pi[1]


def test_confidence_weighted_vote_lets_a_few_confident_paths_outvote_many_unconfident_ones():
    # prompt 0: A has 4 paths at confidence 0.1 (score 0.4), B 2 paths at 0.9 (1.8): B wins, majority picks A
    # prompt 1: A has 3 paths at 0.7 (2.1), B 2 paths at 0.9 (1.8): the scores add up, A wins (best-of-N: B)
    answers = ["A"] * 4 + ["B"] * 2 + ["A"] * 3 + ["B"] * 2
    prompts = [0] * 6 + [1] * 5
    confidence = [0.1] * 4 + [0.9] * 2 + [0.7] * 3 + [0.9] * 2
    ids = S.answer_clusters(answers, prompts, use_math_verify=False)
    b_right = [a == "B" for a in answers]
    res = S.voting.confidence_weighted_vote(ids, b_right, prompts, confidence=confidence)
    assert res.method == "confidence_weighted"
    assert res.correct.tolist() == [1.0, 0.0]
    assert res.confidence == pytest.approx([1.8 / 2.2, 2.1 / 3.9])
    assert S.majority_vote(ids, b_right, prompts).correct.tolist() == [0.0, 0.0]
    assert S.best_of_n(ids, b_right, prompts, confidence=confidence).correct.tolist() == [1.0, 1.0]
    # equal confidences: exactly the majority vote
    flat = S.voting.confidence_weighted_vote(ids, b_right, prompts, confidence=[0.5] * len(answers))
    assert flat.correct.tolist() == S.majority_vote(ids, b_right, prompts).correct.tolist()


def test_confidence_weighted_vote_missing_and_bad_confidences():
    ids = np.array([0, 0, 1])
    # the two unstated confidences add nothing: the single stated path wins
    res = S.voting.confidence_weighted_vote(ids, [False, False, True], [0, 0, 0], confidence=[None, np.nan, 0.2])
    assert res.correct.tolist() == [1.0] and res.confidence.tolist() == [1.0]
    # none stated at all: a tie of both answers, scored as a uniform tie-break
    res = S.voting.confidence_weighted_vote(ids, [False, False, True], [0, 0, 0], confidence=[None] * 3)
    assert res.correct.tolist() == [0.5]
    with pytest.raises(ValueError, match="path 1 has 1.5"):
        S.voting.confidence_weighted_vote(ids, [True] * 3, [0] * 3, confidence=[0.5, 1.5, 0.2])
    with pytest.raises(ValueError, match="needs confidence"):
        S.voting.confidence_weighted_vote(ids, [True] * 3, [0] * 3)
    with pytest.raises(ValueError, match="2 entries for 3"):
        S.voting.confidence_weighted_vote(ids, [True] * 3, [0] * 3, confidence=[0.5, 0.5])


# ------------------------------------------------------------------------------ identical texts, by digest


def _reference_text_ids(texts):
    """Ids by text equality, the grouping PC / RPC count once: a missing text equals no other path's."""
    first: dict[str, int] = {}
    return [len(first) + 10**6 + i if t is None else first.setdefault(t, len(first)) for i, t in enumerate(texts)]


def _same_partition(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return bool(((a[:, None] == a[None, :]) == (b[:, None] == b[None, :])).all())


def test_text_ids_from_digests_group_exactly_the_identical_texts():
    from calibrl.selection.voting import _text_ids, digest_ids, text_digest

    rng = np.random.default_rng(0)
    pool = ["", "a", "a ", "A", "é", "e\u0301", "\ud800", "字" * 3, "x" * 5000, "x" * 4999 + "y", None]
    texts = [pool[i] for i in rng.integers(0, len(pool), 300)]
    ids = _text_ids(texts, len(texts))
    assert ids.dtype == np.int64 and _same_partition(ids, _reference_text_ids(texts))
    missing = np.array([t is None for t in texts])
    assert len(set(ids[missing].tolist())) == missing.sum()  # every missing text is its own
    assert not set(ids[missing].tolist()) & set(ids[~missing].tolist())
    # the same ids from digests gathered as rows are read
    digests = b"".join(bytes(16) if t is None else text_digest(t) for t in texts)
    np.testing.assert_array_equal(digest_ids(digests, missing), ids)
    assert sorted(set(ids[~missing].tolist())) == list(range(len({t for t in texts if t is not None})))  # dense
    assert len(text_digest("a")) == 16 and text_digest("a") != text_digest("a ")


def test_text_ids_do_not_build_an_array_as_wide_as_the_longest_text():
    """20 paths, one 2-million-character text: ids from digests allocate about that text once (its UTF-8), not
    20 x 2e6 x 4 bytes of fixed-width array."""
    import tracemalloc

    from calibrl.selection.voting import _text_ids

    texts = ["short"] * 19 + ["z" * 2_000_000]
    tracemalloc.start()
    try:
        ids = _text_ids(texts, len(texts))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(set(ids.tolist())) == 2
    assert peak < 4_000_000


def test_first_occurrence_keeps_the_first_path_of_each_prompt_answer_text():
    from calibrl.selection.voting import _first_occurrence

    rng = np.random.default_rng(1)
    n = 500
    pidx, answers = rng.integers(0, 7, n), rng.integers(0, 4, n) * 1000
    one_repeat = rng.permutation(n) * 3
    one_repeat[17] = one_repeat[400]
    # few texts; every text distinct (the shortcut: all kept); all distinct but one repeated (pruned where it
    # repeats a prompt's and answer's text)
    for texts in (rng.integers(0, 5, n), rng.permutation(n) * 3, one_repeat):
        keep = _first_occurrence(pidx, answers, texts)
        seen, expected = set(), []
        for key in zip(pidx.tolist(), answers.tolist(), texts.tolist()):
            expected.append(key not in seen)
            seen.add(key)
        assert keep.tolist() == expected
    pidx[400], answers[400] = pidx[17], answers[17]  # the repeated text now in one (prompt, answer): dropped once
    keep = _first_occurrence(pidx, answers, one_repeat)
    assert keep.sum() == n - 1 and not keep[max(17, 400)]


def test_dense_is_numpy_unique_with_inverse():
    from calibrl.selection.voting import _dense

    rng = np.random.default_rng(11)
    cases = [rng.integers(0, 2 * n + 1, n).astype(dt) for n in (1, 7, 300) for dt in (np.int64, np.int32, np.uint16)]
    cases += [np.array([5, -1, 5, 0]), np.array([10 ** 9, 3, 3]), np.array(["b", "a", "b"]), np.array([0.5, 0.5, 2.0])]
    for values in cases:  # the bincount path (small whole numbers) and the sorted one (the rest) agree with numpy
        uniq, inverse = _dense(values)
        ref_uniq, ref_inverse = np.unique(values, return_inverse=True)
        assert uniq.dtype == ref_uniq.dtype and np.array_equal(uniq, ref_uniq)
        assert inverse.dtype == np.int64 and np.array_equal(inverse, ref_inverse.reshape(-1))


def test_scaling_curves_share_their_draws_and_keep_n_paths_per_prompt():
    from calibrl.selection import scaling

    rng = np.random.default_rng(5)
    pid = np.repeat(np.arange(50), 8)
    answers = rng.integers(0, 3, pid.size) + 10 * pid
    correct = answers % 10 == 0
    scaling._MASKS.clear()
    alone = S.scaling_curve("majority", answers, correct, pid, n_draws=4, seed=3)
    p = np.asarray(pid, dtype=np.int64)
    masks = scaling._subset_masks(p, np.bincount(p), [1, 2, 4, 8], 4, 3)
    assert [len(m) for m in masks] == [0, 4, 4, 1]  # N = 1 exact, N = 8 the whole group once
    for n, draws in zip([2, 4, 8], masks[1:]):
        kept = [np.unpackbits(m, count=pid.size).astype(bool) for m in draws]
        assert all((np.bincount(pid[k], minlength=50) == n).all() for k in kept)
        assert n == 8 or len({k.tobytes() for k in kept}) == len(kept)  # the draws differ from each other
    S.scaling_curve("best_of_n", answers, correct, pid, confidence=rng.uniform(size=pid.size), n_draws=4, seed=3)
    again = S.scaling_curve("majority", answers, correct, pid, n_draws=4, seed=3)  # the draws read back
    assert np.array_equal(again.accuracy, alone.accuracy) and np.array_equal(again.std, alone.std)
    other = scaling._subset_masks(p, np.bincount(p), [1, 2, 4, 8], 4, 4)
    assert other[1][0].tobytes() != masks[1][0].tobytes()  # another seed, other draws
